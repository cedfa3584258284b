"""Cache statistics (``stats.json``), in the spirit of Cerebras' ``data_params.json``.

Counts come from the ledger, so they are exact across interrupted and resumed builds; document
length percentiles come from the committed offsets. ``loss_valid_tokens`` counts the positions trained
on inside documents (a position predicts the next token of its own document, and that token is a
loss target of the format), ``masked_tokens`` the rest; so for a format without loss masks every
document contributes its length minus one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenmix.cache.ledger import CacheLedger, ShardProgress, skipped_totals
from tokenmix.cache.store import JaggedArray

STATS_FILE = "stats.json"
ALREADY_BUILT = "already_built"
"""Set (True) in the statistics a build returns for a cache that was finished before it: nothing was built, and
``build`` is the record of the build that made the cache. Never stored in ``stats.json``."""
_PERCENTILES = (1, 10, 50, 90, 99)
_OFFSETS_BLOCK = 1 << 22


def document_lengths(array: JaggedArray, rows: int) -> np.ndarray:
    """Token count of every committed row, read block by block."""
    parts = []
    for start in range(0, rows, _OFFSETS_BLOCK):
        stop = min(rows, start + _OFFSETS_BLOCK)
        parts.append(np.diff(array.row_bounds(start, stop)))
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def length_percentiles(lengths: np.ndarray) -> list[float]:
    """``np.percentile(lengths, _PERCENTILES)`` (its linear interpolation, to the bit) of a non-empty array: numpy's own
    picks the elements to partition with ``np.unique``, whose first call imports ``numpy.ma``, 20 ms at the end of a
    cold build."""
    last = len(lengths) - 1
    at = last * (np.asarray(_PERCENTILES) / 100)
    below = np.floor(at).astype(np.intp)
    above = np.minimum(below + 1, last)
    ordered = np.partition(lengths, sorted({*below.tolist(), *above.tolist()}))
    low, high, t = ordered[below], ordered[above], at - below
    step = high - low
    return np.where(t >= 0.5, high - step * (1 - t), low + step * t).tolist()


def compute_stats(ledger: CacheLedger, array: JaggedArray, build_seconds: float, resumed_rows: int) -> dict[str, Any]:
    """The statistics document for a finished cache."""
    built_tokens = ledger.tokens - (int(array.row_bounds(resumed_rows - 1, resumed_rows)[-1]) if resumed_rows else 0)
    build = {
        "seconds": round(build_seconds, 3),
        "resumed_at_row": resumed_rows,
        "tokens_this_run": built_tokens,
        "tokens_per_second": round(built_tokens / build_seconds, 1) if build_seconds > 0 else None,
    }
    return stats_document(ledger.identity, ledger.fingerprint, ledger.shards, document_lengths(array, ledger.rows), build)


def stats_document(identity: dict[str, Any], fingerprint: str, shards: Sequence[ShardProgress], lengths: np.ndarray,
                   build: dict[str, Any]) -> dict[str, Any]:
    """The statistics of the documents read from ``shards`` (their ledger accounts), of token counts ``lengths`` in
    order, of a cache of ``identity`` (whose fingerprint is ``fingerprint``): a cache's, or one source's of a pack
    (``cache/packs.py``)."""
    tokens = int(lengths.sum())
    skipped = skipped_totals(shards)
    length_stats: dict[str, float] = {}
    if len(lengths):
        length_stats = {"min": int(lengths.min()), "mean": float(lengths.mean()), "max": int(lengths.max())}
        for p, v in zip(_PERCENTILES, length_percentiles(lengths)):
            length_stats[f"p{p}"] = v
    loss_valid = sum(s.loss_tokens for s in shards) if identity.get("loss_spans") else tokens - len(lengths)
    return {
        "fingerprint": fingerprint,
        "tokenizer_fingerprint": identity.get("tokenizer_fingerprint"),
        "documents": len(lengths),
        "tokens": tokens,
        "loss_valid_tokens": loss_valid,
        "masked_tokens": tokens - loss_valid,
        "records": sum(s.records for s in shards),
        "skipped_records": sum(skipped.values()),
        "skipped_by_reason": skipped,
        "raw_chars": sum(s.chars for s in shards),
        "raw_bytes": sum(s.utf8_bytes for s in shards),
        "processed_shards": sum(1 for s in shards if s.error is None),
        "discarded_shards": sum(1 for s in shards if s.error is not None),
        "document_length_tokens": length_stats,
        "shards": {
            s.name: {
                "records": s.records,
                "documents": s.rows,
                "tokens": s.tokens,
                "skipped": dict(sorted(s.skipped.items())),
                **({"error": s.error} if s.error else {}),
            }
            for s in shards
        },
        "build": build,
    }
