"""Tokenized caches on tensorstore: the builder (its encoding pool on this machine, or shard tasks on Ray or Dask through
``tokenmix.execution``), the reader, the ledger that records what made a cache, and what is kept beside it (statistics,
packing plans).
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.cache.appending import BadInputError
    from tokenmix.cache.builder import CacheBuilder
    from tokenmix.cache.chunk_cache import ChunkCache
    from tokenmix.cache.cluster_build import ShardTaskError
    from tokenmix.cache.encoding import EncoderPool
    from tokenmix.cache.ledger import CacheLedger, CacheMismatchError, ShardChangedError, ShardListMismatchError
    from tokenmix.cache.lock import BuildLock, CacheLockedError, LockLostError, build_lock
    from tokenmix.cache.options import BuildOptions
    from tokenmix.cache.packed_source import PackedSourceCache, open_pack
    from tokenmix.cache.plans import stored_plans
    from tokenmix.cache.reader import CacheNotFoundError, TokenCache
    from tokenmix.cache.store import CacheWriteError
    from tokenmix.cache.token_files_cache import TokenFilesCache

__all__ = [
    "BadInputError",
    "BuildLock",
    "BuildOptions",
    "CacheBuilder",
    "CacheLedger",
    "CacheLockedError",
    "CacheMismatchError",
    "CacheNotFoundError",
    "CacheWriteError",
    "ChunkCache",
    "EncoderPool",
    "LockLostError",
    "PackedSourceCache",
    "ShardChangedError",
    "ShardListMismatchError",
    "ShardTaskError",
    "TokenCache",
    "TokenFilesCache",
    "build_lock",
    "open_pack",
    "stored_plans",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
