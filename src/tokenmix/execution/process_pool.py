"""Worker processes on this machine: a pool whose workers exit when this process dies, and ``LocalExecutor``, the
``TaskExecutor`` over it.

The pool starts its workers with ``spawn``, not ``fork``: a driver runs tensorstore (and in training, JAX) threads,
whose locks a forked child would inherit held. Every worker first watches its parent (``tokenmix._parent_death``), so a
driver killed without cleanup (SIGKILL, the OOM killer) leaves no worker behind, even one in the middle of a task, and
the ``multiprocessing`` resource tracker exits once the last of them has.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from tokenmix._parent_death import exit_when_parent_dies
from tokenmix.execution.task_executor import TaskExecutor, TaskFuture


def spawn_process_pool(workers: int, initializer: Callable[..., None] | None = None,
                       initargs: tuple[Any, ...] = ()) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that exit when this process dies; each runs ``initializer(*initargs)``
    as it starts."""
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_start_worker, initargs=(os.getpid(), initializer, initargs))


def _start_worker(parent_pid: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    exit_when_parent_dies(parent_pid)
    if initializer is not None:
        initializer(*initargs)


def run_here(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """``fn(*args)`` run now in this thread, as a finished future: its result, or the exception it raised, which
    ``result()`` raises as a worker's failure would be."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    try:
        future.set_result(fn(*args))
    except Exception as e:
        future.set_exception(e)
    return future


class LocalExecutor(TaskExecutor):
    """Tasks in worker processes on this machine (``num_workers`` of them, one per core when unset); 0 runs them in
    this process, one at a time."""

    name = "local"

    def __init__(self, num_workers: int | None):
        super().__init__(max_retries=0, max_in_flight=None)
        self.workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        self._pool = spawn_process_pool(self.workers) if self.workers > 0 else None

    def parallelism(self) -> int:
        return max(1, self.workers)

    def share(self, value: Any) -> Any:
        return value

    def submit(self, fn: Callable[..., Any], *args: Any) -> TaskFuture:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        return run_here(fn, *args)

    def finished(self, futures: list[TaskFuture], timeout: float) -> list[TaskFuture]:
        if futures and not any(f.done() for f in futures):
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)  # type: ignore[arg-type]
        return [f for f in futures if f.done()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
