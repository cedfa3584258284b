"""Worker processes on this machine: a pool whose workers exit when this process dies, and ``LocalExecutor``, the
``TaskExecutor`` over it.

The pool starts its workers with ``spawn``, not ``fork``: a driver runs tensorstore (and in training, JAX) threads,
whose locks a forked child would inherit held. Every worker first watches its parent (``tokenmix._parent_death``), so a
driver killed without cleanup (SIGKILL, the OOM killer) leaves no worker behind, even one in the middle of a task, and
the ``multiprocessing`` resource tracker exits once the last of them has. Ctrl-C, which reaches every process of the
command's group, ends a worker as the signal ends any process (no traceback of its own); the driver reports it.

A spawned worker imports the main script again, so a pool started from a script's top level outside ``if __name__ ==
"__main__":`` (``main_guard.py``) would run the script again in every worker. There a pool whose driver runs no such
threads (``LocalExecutor``: a curation's driver only lists, decides and waits) forks its workers instead, and any other
pool refuses to start, in one line that names the script's line and what to do.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any

from tokenmix._parent_death import exit_when_parent_dies
from tokenmix.execution.main_guard import unguarded_main_line
from tokenmix.execution.task_executor import TaskExecutor, TaskFuture

logger = logging.getLogger(__name__)


def worker_process_pool(workers: int, initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = (),
                        fork_when_unguarded: bool = False) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that exit when this process dies; each runs ``initializer(*initargs)``
    as it starts. Called from a script's top level outside ``if __name__ == "__main__":``, the workers are forked
    instead when ``fork_when_unguarded`` (a driver with no threads that a fork would leave holding locks), and otherwise
    a ``RuntimeError`` says where and what to do, before any worker starts."""
    method = "spawn"
    unguarded = unguarded_main_line()
    if unguarded is not None:
        path, line = unguarded
        if not fork_when_unguarded or "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError(f"{path}, line {line}: starts worker processes outside `if __name__ == \"__main__\":`, and each one would "
                               "run the script again; put the script's work under that guard, or use no worker processes (num_workers=0)")
        logger.info("%s, line %d: outside `if __name__ == \"__main__\":`, so the worker processes are forked from this one (spawned ones "
                    "would run the script again)", path, line)
        method = "fork"
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                                  initializer=_start_worker, initargs=(os.getpid(), initializer, initargs))


def _start_worker(parent_pid: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    # Ctrl-C reaches every process of the command's group: a worker ends as the signal ends a process, without the
    # KeyboardInterrupt traceback Python would print; the driver says in one line what to do
    signal.signal(signal.SIGINT, signal.SIG_DFL)
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
    this process, one at a time. From a script with no ``if __name__ == "__main__":`` guard the workers are forked."""

    name = "local"

    def __init__(self, num_workers: int | None):
        super().__init__(max_retries=0, max_in_flight=None)
        self.workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        self._pool = worker_process_pool(self.workers, fork_when_unguarded=True) if self.workers > 0 else None

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
