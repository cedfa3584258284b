"""The Ray executor: tasks as Ray tasks of one CPU each.

Ray is imported here only, when ``executor.type: ray`` is chosen. Every machine of the cluster needs
tokenmix installed (the tasks import it) and must reach the run's inputs and outputs (a cache build's
shards and cache location). Ray's own task retries are off (``max_retries=0``): the caller resubmits a
failed task itself, so ``executor.max_retries`` counts every failure the same way on every engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from tokenmix.execution.extras import import_extra
from tokenmix.execution.task_executor import TaskExecutor, TaskFuture

logger = logging.getLogger(__name__)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class _RayFuture:
    """An ``ObjectRef`` seen as a ``TaskFuture``."""

    def __init__(self, ray: Any, ref: Any):
        self._ray = ray
        self._ref = ref

    def done(self) -> bool:
        ready, _ = self._ray.wait([self._ref], timeout=0)
        return bool(ready)

    def result(self) -> Any:
        return self._ray.get(self._ref)

    def cancel(self) -> None:
        self._ray.cancel(self._ref)


class RayExecutor(TaskExecutor):
    """Connects to a Ray cluster (or starts one on this machine) and runs tasks on it."""

    name = "ray"

    def __init__(self, address: str | None, num_workers: int | None, max_retries: int, max_in_flight: int | None):
        super().__init__(max_retries, max_in_flight)
        ray = self._ray = import_extra("ray", "ray")
        self._connected_here = False
        if ray.is_initialized():
            if address is not None:
                logger.warning("this process is already connected to Ray; executor.address %s is not used", address)
        else:
            address = address or os.environ.get("RAY_ADDRESS")
            try:
                if address:
                    ray.init(address=address)
                else:
                    ray.init(num_cpus=num_workers, include_dashboard=False)
            except ConnectionError as e:
                raise ConnectionError(f"could not connect to Ray at {address} (executor.address or RAY_ADDRESS): {e}") from e
            self._connected_here = True
        self._task = ray.remote(num_cpus=1, max_retries=0)(_call)
        logger.info("ray: %d CPU slots in the cluster", self.parallelism())

    def parallelism(self) -> int:
        return int(self._ray.cluster_resources().get("CPU", 0))

    def share(self, value: Any) -> Any:
        return self._ray.put(value)

    def submit(self, fn: Callable[..., Any], *args: Any) -> TaskFuture:
        return _RayFuture(self._ray, self._task.remote(fn, *args))

    def finished(self, futures: list[TaskFuture], timeout: float) -> list[TaskFuture]:
        by_ref = {f._ref: f for f in futures if isinstance(f, _RayFuture)}
        refs = list(by_ref)
        if not refs:
            return []
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
        if ready:
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return [by_ref[r] for r in ready]

    def close(self) -> None:
        if self._connected_here:
            self._ray.shutdown()
            self._connected_here = False
