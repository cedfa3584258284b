"""The seam between the cache builder and a distributed engine: a cluster executor runs shard tasks.

``ClusterExecutor`` is what the builder drives (Ray's and Dask's implement it in ``executor_ray`` and
``executor_dask``); ``import_extra`` imports an engine that is an optional extra, or says how to install it.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol


class MissingExtraError(ImportError):
    """The chosen executor's engine is not installed."""


def import_extra(module: str, extra: str) -> ModuleType:
    """Import an optional engine, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"build.executor.type {extra!r} needs the {module!r} package, which is not installed here: "
            f"pip install 'tokenmix[{extra}]' (and the same on every machine of the cluster)"
        ) from e


class TaskFuture(Protocol):
    """A task running on a cluster."""

    def done(self) -> bool:
        """Whether the task has finished, well or not."""
        ...

    def result(self) -> Any:
        """The task's return value; raises if the task (or the worker running it) failed."""
        ...

    def cancel(self) -> Any:
        """Give up on the task (best effort: one already running may run on)."""
        ...


class ClusterExecutor(abc.ABC):
    """Runs tasks on a distributed engine; used by the builder as a context manager."""

    name: str = "cluster"
    """The engine's name, for logs and errors."""

    def __init__(self, max_retries: int, max_in_flight: int | None):
        self.max_retries = max_retries
        self.max_in_flight = max_in_flight

    @abc.abstractmethod
    def parallelism(self) -> int:
        """How many tasks the cluster runs at once now (its CPU slots)."""

    @abc.abstractmethod
    def share(self, value: Any) -> Any:
        """Store ``value`` once in the cluster; the handle returned, given to ``submit`` as an argument,
        arrives in the task as the value (so a tokenizer definition is not shipped with every task)."""

    @abc.abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> TaskFuture:
        """Run ``fn(*args)`` on a worker, one CPU slot, no retry by the engine (the builder retries)."""

    @abc.abstractmethod
    def finished(self, futures: list[TaskFuture], timeout: float) -> list[TaskFuture]:
        """Those of ``futures`` that have finished, waiting up to ``timeout`` seconds for one when none has
        (one call for all of them, not one per future: the driver may watch thousands)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect, and stop whatever this executor started (a local Ray or Dask cluster)."""

    def in_flight_limit(self) -> int:
        """Shards handed to the cluster ahead of the one being committed: ``max_in_flight``, else twice its slots."""
        return self.max_in_flight or max(2, 2 * self.parallelism())

    def __enter__(self) -> ClusterExecutor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
