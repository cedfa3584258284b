"""Where a curation pipeline's tasks run: a process pool on this machine, or the cache builder's Ray and Dask executors.

A task is one input shard (or one output partition), a plain function of plain arguments; its output is written under
its own name, so the engine runs the same tasks, in any order, on all three and gets the same bytes. ``run_tasks``
submits a phase's tasks, keeps at most a few per worker in flight, retries a task that failed for a reason other than
its input (a lost worker, storage) up to ``max_retries`` times, and reports each result as it arrives.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import Any

from tokenmix._parent_death import exit_when_parent_dies
from tokenmix.cache.cluster import ClusterExecutor, TaskFuture
from tokenmix.cache.executor import ExecutorConfig, LocalExecutorConfig
from tokenmix.curate.shard_io import CurationInputError

logger = logging.getLogger(__name__)


class ProcessPoolExecutor(ClusterExecutor):
    """Tasks in worker processes on this machine (``num_workers`` of them, one per core when unset); 0 runs them in
    this process, one at a time. A worker exits when this process dies, even in the middle of a task
    (``exit_when_parent_dies``), and the ``multiprocessing`` resource tracker exits once the last of them has."""

    name = "local"

    def __init__(self, num_workers: int | None):
        super().__init__(max_retries=0, max_in_flight=None)
        self.workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        self._pool = (concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                             initializer=exit_when_parent_dies, initargs=(os.getpid(),))
                      if self.workers > 0 else None)

    def parallelism(self) -> int:
        return max(1, self.workers)

    def share(self, value: Any) -> Any:
        return value

    def submit(self, fn: Callable[..., Any], *args: Any) -> TaskFuture:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except Exception as e:  # reported through the future, as a worker's failure would be
            future.set_exception(e)
        return future

    def finished(self, futures: list[TaskFuture], timeout: float) -> list[TaskFuture]:
        if futures and not any(f.done() for f in futures):
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)  # type: ignore[arg-type]
        return [f for f in futures if f.done()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def open_executor(config: ExecutorConfig, num_workers: int | None) -> ClusterExecutor:
    """The executor ``config`` names: the local process pool, or Ray's or Dask's."""
    if isinstance(config, LocalExecutorConfig):
        return ProcessPoolExecutor(num_workers)
    executor = config.open(num_workers)
    assert isinstance(executor, ClusterExecutor)
    return executor


def run_tasks(executor: ClusterExecutor, fn: Callable[[Any], Any], tasks: list[Any]) -> Iterator[tuple[int, Any]]:
    """Run ``fn(task)`` for every task, yielding ``(task index, result)`` as results arrive."""
    limit = executor.in_flight_limit()
    pending = list(range(len(tasks)))[::-1]
    tries = dict.fromkeys(range(len(tasks)), 0)
    running: dict[Any, int] = {}
    try:
        while pending or running:
            while pending and len(running) < limit:
                index = pending.pop()
                running[executor.submit(fn, tasks[index])] = index
            for future in executor.finished(list(running), timeout=1.0):
                index = running.pop(future)
                try:
                    result = future.result()
                except CurationInputError:
                    raise
                except Exception as e:
                    tries[index] += 1
                    if tries[index] > executor.max_retries:
                        raise
                    logger.warning("%s: task %d failed (%s: %s); trying again (%d of %d)", executor.name, index, type(e).__name__, e,
                                   tries[index], executor.max_retries)
                    pending.append(index)
                    continue
                yield index, result
    finally:
        for future in running:
            future.cancel()
