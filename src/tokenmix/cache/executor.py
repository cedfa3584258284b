"""Where a cache build's work runs: the local process pool, or a Ray or Dask cluster.

``build.executor`` picks the engine (a draccus choice type, ``executor: {type: ray, address: ...}``
in YAML, ``--build.executor.type ray`` on the command line). The builder sees two kinds of executor:

- ``local`` opens an ``EncoderPool``: the driver reads the shards and worker processes on this
  machine tokenize chunks of them, handing the tokens back to the driver (``pool.py``).
- ``ray`` and ``dask`` open a ``ClusterExecutor``: each task takes a whole shard, reads it on the
  worker and leaves its tokens in the cache's staging area; the driver appends staged shards to the
  cache in listed order and alone commits the ledger (``shard_task.py``, ``builder.py``).

Ray and Dask are optional extras, imported only when chosen. Nothing here changes a cache's bytes:
the same input builds the same cache through every executor.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import draccus

if TYPE_CHECKING:
    from tokenmix.cache.pool import EncoderPool


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


@dataclass(frozen=True)
class ExecutorConfig(draccus.ChoiceRegistry):
    """Where the tokenizing runs (``build.executor``): ``local`` (default), ``ray`` or ``dask``."""

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "local"

    @abc.abstractmethod
    def open(self, num_workers: int | None) -> EncoderPool | ClusterExecutor:
        """Start (or connect to) the engine; ``num_workers`` is ``build.num_workers``."""


@ExecutorConfig.register_subclass("local")
@dataclass(frozen=True)
class LocalExecutorConfig(ExecutorConfig):
    """Worker processes on this machine (``build.num_workers`` of them) tokenize chunks the driver reads."""

    def open(self, num_workers: int | None) -> EncoderPool:
        from tokenmix.cache.pool import EncoderPool

        return EncoderPool(num_workers)


@dataclass(frozen=True)
class ClusterExecutorConfig(ExecutorConfig):
    """What Ray and Dask executors share."""

    address: str | None = None
    """The cluster to connect to; unset starts one on this machine with ``build.num_workers`` workers (see each engine)."""
    max_retries: int = 3
    """Times a shard task is resubmitted after it failed (its worker died, storage failed) before the build fails."""
    max_in_flight: int | None = None
    """Shard tasks submitted ahead of the shard being committed; unset: twice the cluster's CPU slots when the
    build starts. Bounds the staging area (at most this many shards' tokens wait there)."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"build.executor.max_retries must be 0 or more, got {self.max_retries}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"build.executor.max_in_flight must be at least 1 (or unset), got {self.max_in_flight}")


@ExecutorConfig.register_subclass("ray")
@dataclass(frozen=True)
class RayExecutorConfig(ClusterExecutorConfig):
    """Shard tasks on Ray (``pip install 'tokenmix[ray]'``).

    ``address``: ``auto``, ``host:6379`` or ``ray://host:10001``. Unset: the Ray this process is
    already connected to, else ``RAY_ADDRESS`` if set, else a new local Ray with ``build.num_workers``
    CPUs (all cores when unset).
    """

    def open(self, num_workers: int | None) -> ClusterExecutor:
        from tokenmix.cache.executor_ray import RayExecutor

        return RayExecutor(self.address, num_workers, self.max_retries, self.max_in_flight)


@ExecutorConfig.register_subclass("dask")
@dataclass(frozen=True)
class DaskExecutorConfig(ClusterExecutorConfig):
    """Shard tasks on Dask distributed (``pip install 'tokenmix[dask]'``).

    ``address``: a scheduler, ``tcp://host:8786``. Unset: a ``LocalCluster`` of ``build.num_workers``
    single-threaded worker processes (one per core when unset).
    """

    def open(self, num_workers: int | None) -> ClusterExecutor:
        from tokenmix.cache.executor_dask import DaskExecutor

        return DaskExecutor(self.address, num_workers, self.max_retries, self.max_in_flight)
