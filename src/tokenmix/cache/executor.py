"""Where a cache build's work runs: the local process pool, or a Ray or Dask cluster.

``build.executor`` picks the engine (a draccus choice type, ``executor: {type: ray, address: ...}``
in YAML, ``--build.executor.type ray`` on the command line). The builder sees two kinds of executor:

- ``local`` opens an ``EncoderPool``: the driver reads the shards, and threads of the driver
  (``fastokens``) or worker processes on this machine (``tokenizers``) tokenize chunks of them,
  handing the tokens back to the driver (``pool.py``).
- ``ray`` and ``dask`` open a ``ClusterExecutor``: each task takes a whole shard, reads it on the
  worker and leaves its tokens in the cache's staging area; the driver appends staged shards to the
  cache in listed order and alone commits the ledger (``shard_task.py``, ``builder.py``).

Ray and Dask are optional extras, imported only when chosen. Nothing here changes a cache's bytes:
the same input builds the same cache through every executor.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

import draccus

if TYPE_CHECKING:
    from tokenmix.cache.cluster import ClusterExecutor
    from tokenmix.cache.pool import EncoderPool


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
    """Threads or worker processes on this machine (``build.num_workers`` of them) tokenize chunks the driver reads.

    Threads of the driver where the text is encoded by ``fastokens``, worker processes where by ``tokenizers``.
    """

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
