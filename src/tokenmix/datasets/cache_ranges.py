"""Reading ranges of a cache's token stream into a batch: what every dataset over a cache does.

Ranges are cut where chunk-cache blocks end, every read of a batch is issued at once (whole blocks through the
chunk cache where it can hold the cache, else the exact ranges), and each range is copied straight into the
batch; loss masks follow the loss spans a masking format stored; a subset of documents (held-out validation) is
checked once, when a dataset takes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.base import TokenBatch
from tokenmix.datasets.documents import CacheDocuments
from tokenmix.datasets.segments import expand_counts


def checked_subset(docs: CacheDocuments, documents: np.ndarray | list[int]) -> np.ndarray:
    """``documents`` as sorted unique int64 rows of a finished cache, or ``ValueError`` naming the cache."""
    location = docs.cache.location
    if not docs.finished:
        raise ValueError(f"{location}: a document subset needs a finished cache")
    subset = np.asarray(documents, np.int64)
    if subset.size and (subset.min() < 0 or subset.max() >= docs.rows or np.any(np.diff(subset) <= 0)):
        raise ValueError(f"{location}: document subset must be sorted unique rows below {docs.rows}")
    return subset


def keep_targets(docs: CacheDocuments, loss_mask: np.ndarray, dest: np.ndarray, begin: np.ndarray, size: np.ndarray) -> None:
    """Clear ``loss_mask`` where the token predicted is not one the format trains on (formats that store loss spans).

    Range ``r`` is ``size[r]`` positions of the batch from flat position ``dest[r]``, predicting the cache
    tokens from ``begin[r] + 1``; positions outside every range are left as they are.
    """
    trained = trained_positions(docs, loss_mask.shape, dest, begin, size)
    if trained is not None:
        loss_mask &= trained


def trained_positions(docs: CacheDocuments, shape: tuple[int, ...], dest: np.ndarray, begin: np.ndarray,
                      size: np.ndarray) -> np.ndarray | None:
    """Of an array of ``shape`` positions, those that predict a token the format trains on (``keep_targets``' ranges),
    or None where the format trains on every token (no loss spans)."""
    targets = docs.targets(begin + 1, size)
    if targets is None:
        return None
    group, within = expand_counts(size)
    trained = np.zeros(math.prod(shape), bool)
    trained[dest[group] + within] = targets
    return trained.reshape(shape)


def split_at_chunks(begin: np.ndarray, size: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut cache token ranges ``[begin, begin + size)`` where stored chunks of ``chunk`` tokens end.

    Returns, per piece: the range it comes from, its first token, and its length.
    """
    end = begin + size
    if np.array_equal((end - 1) // chunk, begin // chunk):  # the usual case: no range crosses a chunk
        return np.arange(len(begin)), begin, size
    sub, k = expand_counts((end - 1) // chunk - begin // chunk + 1)
    piece_begin = np.maximum(begin[sub], (begin[sub] // chunk + k) * chunk)
    piece_end = np.minimum(end[sub], (begin[sub] // chunk + k + 1) * chunk)
    return sub, piece_begin, piece_end - piece_begin


def copy_ranges(cache: TokenCache, begin: np.ndarray, size: np.ndarray, dest: np.ndarray, out: TokenBatch, committed: int) -> Callable[[], None]:
    """Start reading cache token ranges, each inside one block (``cache.chunk_tokens``); the returned function waits and
    copies range ``r`` to ``out.tokens`` (flat) at ``dest[r]``.

    Where the chunk cache can hold the cache, whole blocks are read (all missing ones at once) through it and each range
    is copied straight from its block; otherwise each range is read exactly (``TokenCache.read_ranges``), so that a
    corpus far larger than the chunk cache costs what it reads, not a block per range.
    """
    if not cache.caches_blocks(committed):
        sub, piece_begin, piece_size = split_at_chunks(begin, size, cache.read_unit)
        where, sizes = (dest[sub] + piece_begin - begin[sub]).tolist(), piece_size.tolist()
        reads = cache.read_ranges(piece_begin, piece_size, committed)

        def finish_exact() -> None:
            flat = out.tokens.reshape(-1)
            for w, m, tokens in zip(where, sizes, reads()):
                flat[w : w + m] = tokens

        return finish_exact
    where, sizes = dest.tolist(), size.tolist()
    chunk_tokens = cache.chunk_tokens
    chunk = begin // chunk_tokens
    chunk_ids = chunk.tolist()
    chunks = cache.read_chunks(sorted(set(chunk_ids)), committed)
    within = (begin - chunk * chunk_tokens).tolist()

    def finish() -> None:
        have = chunks()
        flat = out.tokens.reshape(-1)
        for w, c, a, m in zip(where, chunk_ids, within, sizes):
            flat[w : w + m] = have[c][a : a + m]

    return finish
