"""Where a run's tasks run: the executor configs (``build.executor`` of a cache build, ``executor`` of a curation).

A draccus choice type: ``executor: {type: ray, address: ...}`` in YAML, ``--build.executor.type ray`` (a cache build)
or ``--executor.type dask`` (a curation) on the command line. Each config opens a ``TaskExecutor``:

- ``local`` a ``LocalExecutor``, worker processes on this machine (``process_pool.py``). A cache build opens its own
  encoding pool for ``local`` instead (``tokenmix.cache.encoding``): the driver reads the shards, and threads of the
  driver (``fastokens``) or worker processes (``tokenizers``) tokenize chunks of them.
- ``ray`` and ``dask`` a cluster's executor (``ray_executor.py``, ``dask_executor.py``): a cache build's task takes a
  whole shard and a curation's a shard or a partition.

Ray and Dask are optional extras, imported only when chosen. Nothing here changes what a run writes: the same input
gives the same bytes through every executor.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

import draccus

if TYPE_CHECKING:
    from tokenmix.execution.task_executor import TaskExecutor


@dataclass(frozen=True)
class ExecutorConfig(draccus.ChoiceRegistry):
    """Where the tasks run (``build.executor``, a curation's ``executor``): ``local`` (default), ``ray`` or ``dask``."""

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "local"

    @abc.abstractmethod
    def open(self, num_workers: int | None) -> TaskExecutor:
        """Start (or connect to) the engine; ``num_workers`` is the run's (``build.num_workers`` in a cache build)."""


@ExecutorConfig.register_subclass("local")
@dataclass(frozen=True)
class LocalExecutorConfig(ExecutorConfig):
    """Worker processes on this machine (``num_workers`` of them); a cache build encodes ``fastokens`` in threads instead.

    A curation's tasks run in the worker processes. A cache build's driver reads the shards, and worker processes
    (``tokenizers``) or threads of the driver (``fastokens``, which spreads each batch over the cores itself) tokenize
    chunks of them.
    """

    def open(self, num_workers: int | None) -> TaskExecutor:
        from tokenmix.execution.process_pool import LocalExecutor

        return LocalExecutor(num_workers)


@dataclass(frozen=True)
class ClusterExecutorConfig(ExecutorConfig):
    """What Ray and Dask executors share."""

    address: str | None = None
    """The cluster to connect to; unset starts one on this machine with ``num_workers`` workers (see each engine)."""
    max_retries: int = 3
    """Times a task is resubmitted after it failed (its worker died, storage failed) before the run fails."""
    max_in_flight: int | None = None
    """Tasks handed to the cluster ahead of the first one not yet taken back; unset: twice the cluster's CPU slots when
    the run starts. In a cache build this bounds the staging area (at most this many shards' tokens wait there)."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"executor.max_retries must be 0 or more, got {self.max_retries}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"executor.max_in_flight must be at least 1 (or unset), got {self.max_in_flight}")


@ExecutorConfig.register_subclass("ray")
@dataclass(frozen=True)
class RayExecutorConfig(ClusterExecutorConfig):
    """Tasks on Ray (``pip install 'tokenmix[ray]'``).

    ``address``: ``auto``, ``host:6379`` or ``ray://host:10001``. Unset: the Ray this process is
    already connected to, else ``RAY_ADDRESS`` if set, else a new local Ray with ``num_workers``
    CPUs (all cores when unset).
    """

    def open(self, num_workers: int | None) -> TaskExecutor:
        from tokenmix.execution.ray_executor import RayExecutor

        return RayExecutor(self.address, num_workers, self.max_retries, self.max_in_flight)


@ExecutorConfig.register_subclass("dask")
@dataclass(frozen=True)
class DaskExecutorConfig(ClusterExecutorConfig):
    """Tasks on Dask distributed (``pip install 'tokenmix[dask]'``).

    ``address``: a scheduler, ``tcp://host:8786``. Unset: a ``LocalCluster`` of ``num_workers``
    single-threaded worker processes (one per core when unset).
    """

    def open(self, num_workers: int | None) -> TaskExecutor:
        from tokenmix.execution.dask_executor import DaskExecutor

        return DaskExecutor(self.address, num_workers, self.max_retries, self.max_in_flight)
