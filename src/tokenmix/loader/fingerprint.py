"""Batch fingerprints: a short hash of a global batch's content that any topology computes the same.

Definition (version 2):

* a row's digest is XXH3-128 (seed 0) over ``b"tokenmix-row2"`` and then the row's ``tokens`` (int32,
  little-endian), ``loss_mask`` (one byte per position, 0/1), ``segment_ids`` (int32, little-endian)
  and ``source_id`` (int32, little-endian), in that order;
* the batch fingerprint is the hex of XXH3-128 over ``b"tokenmix-batch2"``, the batch shape (rows,
  positions as two little-endian int64) and every row digest in global row order.

The fingerprint proves two runs saw the same data; it guards against accidents, not adversaries, so
a fast non-cryptographic 128-bit hash does (XXH3 hashes a 64 x 2048 batch in ~0.05 ms, blake2b in
~1 ms). Hashing per row first is what makes it cheap on many hosts: each process hashes only the
rows it read, and only the 16-byte row digests travel (the loader gathers them across processes); the
result does not depend on how rows were split between devices or processes.
"""

from __future__ import annotations

import numpy as np
import xxhash

from tokenmix.datasets.base import TokenBatch

DIGEST_BYTES = 16
_ROW_PREFIX = b"tokenmix-row2"
_BATCH_PREFIX = b"tokenmix-batch2"


def row_digests(batch: TokenBatch) -> np.ndarray:
    """One 16-byte digest per row of ``batch``: a ``(rows, 16)`` uint8 array."""
    tokens = np.ascontiguousarray(batch.tokens, dtype="<i4")
    mask = np.ascontiguousarray(batch.loss_mask, dtype=np.uint8)
    segments = np.ascontiguousarray(batch.segment_ids, dtype="<i4")
    sources = np.ascontiguousarray(batch.source_ids, dtype="<i4")
    out = np.empty((len(tokens), DIGEST_BYTES), np.uint8)
    for r in range(len(tokens)):
        h = xxhash.xxh3_128(_ROW_PREFIX)
        h.update(tokens[r])
        h.update(mask[r])
        h.update(segments[r])
        h.update(sources[r : r + 1])
        out[r] = np.frombuffer(h.digest(), np.uint8)
    return out


def combine(digests: np.ndarray, seq_len: int) -> str:
    """The batch fingerprint from every row's digest, in global row order (``digests``: ``(rows, 16)`` uint8)."""
    digests = np.ascontiguousarray(digests, np.uint8)
    if digests.ndim != 2 or digests.shape[1] != DIGEST_BYTES:
        raise ValueError(f"row digests must be a (rows, {DIGEST_BYTES}) uint8 array, got shape {digests.shape}")
    h = xxhash.xxh3_128(_BATCH_PREFIX)
    h.update(np.array([len(digests), seq_len], "<i8").tobytes())
    h.update(digests)
    return h.hexdigest()


def batch_fingerprint(batch: TokenBatch) -> str:
    """The fingerprint of a whole batch held in one place (what the loader computes from its shards)."""
    return combine(row_digests(batch), batch.tokens.shape[1])
