"""Whether an input shard still holds the records a cache read from it: their digest against the one the ledger keeps."""

from __future__ import annotations

from tokenmix.cache.ledger import ShardProgress
from tokenmix.sources.shards import DIGEST_MASK, RawChunk, Shard, ShardReadError


def records_unchanged(shard: Shard, progress: ShardProgress, chunk_bytes: int) -> bool:
    """Whether the shard's first ``progress.position`` records have the digest the ledger holds (and, for a shard read
    to its end, whether it still ends there). False where the ledger keeps no digest (caches made before digests)."""
    if progress.digest is None:
        return False
    whole = progress.finished and progress.error is None  # it was read to its end, so it must still end there
    digest, end = 0, 0
    try:
        for chunk in shard.read(0, chunk_bytes):
            end = chunk.start + len(chunk.records)
            read = RawChunk(chunk.start, chunk.records[: max(0, progress.position - chunk.start)])
            digest = (digest + read.digest()) & DIGEST_MASK
            if end >= progress.position and not whole or end > progress.position:
                break
    except ShardReadError as e:
        end = e.position
    return digest == progress.digest and (end == progress.position if whole else end >= progress.position)
