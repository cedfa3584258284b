"""The Dask executor: tasks on a ``distributed`` cluster, one worker thread each.

Dask is imported here only, when ``executor.type: dask`` is chosen. Every worker needs tokenmix
installed and must reach the run's inputs and outputs. Tasks are submitted without Dask retries; the
caller resubmits a failed task itself. A worker that dies mid-task is also counted by the scheduler's
``distributed.scheduler.allowed-failures`` (default 3) before the task fails: the ``LocalCluster``
started here sets it to 0, so that ``executor.max_retries`` alone decides.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from tokenmix.execution.extras import import_extra
from tokenmix.execution.task_executor import TaskExecutor, TaskFuture

logger = logging.getLogger(__name__)


class DaskExecutor(TaskExecutor):
    """Connects to a Dask scheduler (or starts a ``LocalCluster``) and runs tasks on it."""

    name = "dask"

    def __init__(self, address: str | None, num_workers: int | None, max_retries: int, max_in_flight: int | None):
        super().__init__(max_retries, max_in_flight)
        import_extra("dask", "dask")
        distributed = self._distributed = import_extra("distributed", "dask")
        import dask

        self._cluster = None
        if address is None:
            with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
                self._cluster = distributed.LocalCluster(
                    n_workers=num_workers or os.cpu_count() or 1, threads_per_worker=1, processes=True, dashboard_address=None,
                )
            self._client = distributed.Client(self._cluster)
        else:
            try:
                self._client = distributed.Client(address)
            except OSError as e:  # distributed raises OSError (TimeoutError) when no scheduler answers
                raise ConnectionError(f"could not connect to the Dask scheduler at {address} (executor.address): {e}") from e
        self._shared: dict[str, list[Any]] = {}
        """Key of a handle ``share`` gave -> [the future holding the value now, the value]: a value lost with every
        worker that held it is scattered again."""
        logger.info("dask: %d worker threads at %s", self.parallelism(), self._client.scheduler.address)

    def parallelism(self) -> int:
        return sum(int(w.get("nthreads", 1)) for w in self._client.scheduler_info()["workers"].values())

    def share(self, value: Any) -> Any:
        future = self._scatter(value)
        self._shared[future.key] = [future, value]
        return future

    def _scatter(self, value: Any) -> Any:
        return self._client.scatter(value, broadcast=True, hash=False)

    def _live(self, arg: Any) -> Any:
        """A shared handle as a future that still holds its value."""
        key = getattr(arg, "key", None)
        entry = self._shared.get(key) if isinstance(key, str) else None
        if entry is None:
            return arg
        if entry[0].status != "finished":
            logger.warning("dask: a shared value was lost with its workers; scattering it again")
            entry[0] = self._scatter(entry[1])
        return entry[0]

    def submit(self, fn: Callable[..., Any], *args: Any) -> TaskFuture:
        return self._client.submit(fn, *[self._live(a) for a in args], pure=False, retries=0)

    def finished(self, futures: list[TaskFuture], timeout: float) -> list[TaskFuture]:
        if futures and not any(f.done() for f in futures):
            try:
                self._distributed.wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
        return [f for f in futures if f.done()]

    def close(self) -> None:
        self._shared.clear()
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
