"""A process-wide, byte-bounded LRU of decompressed token chunks.

Where a cache fits in it, reads go through blocks of at least 2^18 tokens (``reader.BLOCK_TOKENS``) kept
decompressed, so repeated and nearby reads are a memory copy; where it does not, reads are exact and this
cache is not used (``TokenCache.caches_blocks``). Caches claim room in it as they are read, first come first
served, so that the sources of a mixture that together exceed it do not evict each other's blocks on every
batch. Committed tokens never change, so a cached block stays valid while a reader holds its cache; a block read
while the cache was still building is kept with the prefix that was committed then. When the last reader of a cache
goes, its blocks go too: a cache deleted and built again at that location is not the one they came from.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

DEFAULT_BYTES = int(os.environ.get("TOKENMIX_CHUNK_CACHE_BYTES", str(32 << 20)))


class ChunkCache:
    """LRU of ``(location, chunk index) -> tokens`` bounded by total bytes."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES):
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._claims: dict[str, tuple[int, set[int]]] = {}
        """location -> (bytes it claimed, the readers holding the claim)"""
        self._claimed = 0
        """The bytes of every claim: a cache refused room asks again at each read, hundreds of times a batch for a
        mixture of many sources, so this is kept rather than summed per claim."""
        self._lock = threading.RLock()
        """Re-entrant: a reader's finalizer ``release``s its claims, and the garbage collector may run it inside ``claim``
        or ``put`` on the thread that holds the lock."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to a reader process), the process-wide cache stands for that process's own, another for an empty one
        of its size: what is cached is memory of the process that holds it."""
        return (_shared, ()) if self is SHARED else (ChunkCache, (self.max_bytes,))

    def claim(self, location: str, nbytes: int, holder: int) -> bool:
        """Whether the blocks of the cache at ``location``, ``nbytes`` of tokens so far, are kept here: yes while they
        fit beside those of the caches that claimed room before it (a cache that outgrows its room loses it).
        ``holder`` names the reader asking; the room is given back when every holder of it has ``release``d it."""
        with self._lock:
            size, holders = self._claims.pop(location, (0, set()))
            self._claimed -= size
            if 0 < nbytes <= self.max_bytes - self._claimed:
                self._claims[location] = (max(size, nbytes), holders | {holder})
                self._claimed += max(size, nbytes)
                return True
            return False

    def release(self, location: str, holder: int) -> None:
        """``holder`` no longer reads ``location``. Once no reader holds it, its room and its blocks go: a cache built
        again there (deleted, say, to build afresh) is another cache, whose tokens those blocks are not."""
        with self._lock:
            size, holders = self._claims.get(location, (0, set()))
            holders.discard(holder)
            if holders:
                return
            if self._claims.pop(location, None) is not None:
                self._claimed -= size
            for key in [key for key in self._chunks if key[0] == location]:
                self._bytes -= self._chunks.pop(key).nbytes

    def get(self, location: str, wanted: dict[int, int]) -> dict[int, np.ndarray]:
        """The cached chunks of ``location`` among ``wanted`` (chunk -> tokens it must hold), in one lookup."""
        found = {}
        chunks = self._chunks
        with self._lock:
            for c, need in wanted.items():
                key = (location, c)
                chunk = chunks.get(key)
                if chunk is not None and len(chunk) >= need:
                    chunks.move_to_end(key)
                    found[c] = chunk
        return found

    def put(self, key: tuple[str, int], chunk: np.ndarray) -> None:
        with self._lock:
            old = self._chunks.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if chunk.nbytes > self.max_bytes:
                return
            self._chunks[key] = chunk
            self._bytes += chunk.nbytes
            while self._bytes > self.max_bytes:
                _, evicted = self._chunks.popitem(last=False)
                self._bytes -= evicted.nbytes


SHARED = ChunkCache()


def _shared() -> ChunkCache:
    return SHARED
