"""Tokenized caches on tensorstore: the builder (local pool, Ray, Dask), the reader, the ledger that
records what made a cache, and what is kept beside it (statistics, packing plans).
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.cache.builder import BadInputError, BuildOptions, CacheBuilder, ShardTaskError
    from tokenmix.cache.chunk_cache import ChunkCache
    from tokenmix.cache.cluster import ClusterExecutor, MissingExtraError
    from tokenmix.cache.executor import DaskExecutorConfig, ExecutorConfig, LocalExecutorConfig, RayExecutorConfig
    from tokenmix.cache.ledger import CacheLedger, CacheMismatchError, ShardListMismatchError
    from tokenmix.cache.plans import stored_plans
    from tokenmix.cache.pool import EncoderPool
    from tokenmix.cache.reader import CacheNotFoundError, TokenCache

__all__ = [
    "BadInputError",
    "BuildOptions",
    "CacheBuilder",
    "CacheLedger",
    "CacheMismatchError",
    "CacheNotFoundError",
    "ChunkCache",
    "ClusterExecutor",
    "DaskExecutorConfig",
    "EncoderPool",
    "ExecutorConfig",
    "LocalExecutorConfig",
    "MissingExtraError",
    "RayExecutorConfig",
    "ShardListMismatchError",
    "ShardTaskError",
    "TokenCache",
    "stored_plans",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
