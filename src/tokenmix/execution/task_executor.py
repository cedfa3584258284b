"""The seam between a run and the engine its tasks run on: a ``TaskExecutor`` runs tasks on worker processes.

A task is a plain function of picklable arguments. The local process pool (``process_pool``), Ray
(``ray_executor``) and Dask (``dask_executor``) implement ``TaskExecutor``; a cache build's shard tasks and a curation's
tasks are driven through it alike, so neither knows which engine runs them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Protocol


class TaskFuture(Protocol):
    """A task running on an engine."""

    def done(self) -> bool:
        """Whether the task has finished, well or not."""
        ...

    def result(self) -> Any:
        """The task's return value; raises if the task (or the worker running it) failed."""
        ...

    def cancel(self) -> Any:
        """Give up on the task (best effort: one already running may run on)."""
        ...


class TaskExecutor(abc.ABC):
    """Runs tasks on an engine's worker processes; used as a context manager by whoever opened it."""

    name: str = "executor"
    """The engine's name, for logs and errors."""

    def __init__(self, max_retries: int, max_in_flight: int | None):
        self.max_retries = max_retries
        self.max_in_flight = max_in_flight

    @abc.abstractmethod
    def parallelism(self) -> int:
        """How many tasks the engine runs at once now (its CPU slots)."""

    @abc.abstractmethod
    def share(self, value: Any) -> Any:
        """Store ``value`` once in the engine; the handle returned, given to ``submit`` as an argument,
        arrives in the task as the value (so a tokenizer definition is not shipped with every task)."""

    @abc.abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> TaskFuture:
        """Run ``fn(*args)`` on a worker, one CPU slot, no retry by the engine (the caller retries)."""

    @abc.abstractmethod
    def finished(self, futures: list[TaskFuture], timeout: float) -> list[TaskFuture]:
        """Those of ``futures`` that have finished, waiting up to ``timeout`` seconds for one when none has
        (one call for all of them, not one per future: the driver may watch thousands)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect, and stop whatever this executor started (worker processes, a local Ray or Dask cluster)."""

    def in_flight_limit(self) -> int:
        """Tasks handed to the engine ahead of the first one not yet taken back: ``max_in_flight``, else twice its slots."""
        return self.max_in_flight or max(2, 2 * self.parallelism())

    def __enter__(self) -> TaskExecutor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
