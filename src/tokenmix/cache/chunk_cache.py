"""A process-wide, byte-bounded LRU of decompressed token chunks.

Caches store tokens in compressed chunks of 2^18 tokens, so a random read of one 2048-token example
costs a whole chunk's decompression. Keeping recently used chunks decompressed makes repeated and
nearby reads a memory copy. Committed tokens never change, so a cached chunk stays valid; a chunk
read while the cache was still building is kept with the prefix that was committed then.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

DEFAULT_BYTES = int(os.environ.get("TOKENMIX_CHUNK_CACHE_BYTES", str(1 << 30)))


class ChunkCache:
    """LRU of ``(location, chunk index) -> tokens`` bounded by total bytes."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES):
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, location: str, wanted: dict[int, int]) -> dict[int, np.ndarray]:
        """The cached chunks of ``location`` among ``wanted`` (chunk -> tokens it must hold), in one lookup."""
        found = {}
        with self._lock:
            for c, need in wanted.items():
                chunk = self._chunks.get((location, c))
                if chunk is not None and len(chunk) >= need:
                    self._chunks.move_to_end((location, c))
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
