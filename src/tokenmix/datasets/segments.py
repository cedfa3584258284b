"""Segment ids and loss masks of fixed-length windows over a stream of documents: pure index math.

A window ``[start, start + length)`` of a token stream whose documents begin at ``doc_starts`` numbers
its documents from 0 (segment ids, so attention can be masked per document) and trains position ``i``
to predict token ``i + 1`` only when both lie in the same document (the loss mask). Built from the
document starts inside each window, not from a per-token scan.
"""

from __future__ import annotations

import numpy as np


def document_segments(starts: np.ndarray, length: int, doc_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids (int32) and loss mask (bool), each ``(len(starts), length)``, for the windows at ``starts``.

    ``doc_starts`` is the sorted stream positions where documents begin.
    """
    starts = np.asarray(starts, np.int64)
    n = len(starts)
    lo = np.searchsorted(doc_starts, starts, side="right")
    hi = np.searchsorted(doc_starts, starts + length, side="left")
    counts = hi - lo
    total = int(counts.sum())
    loss_mask = np.ones((n, length), bool)
    loss_mask[:, -1] = False
    if total == 0:
        return np.zeros((n, length), np.int32), loss_mask
    before = np.cumsum(counts) - counts
    row, k = expand_counts(counts)
    cuts = row * length + (doc_starts[lo[row] + k] - starts[row])  # flat positions where a document begins
    loss_mask.reshape(-1)[cuts - 1] = False
    # runs of equal segment id in row-major order: each row's start, then its cuts
    run_starts = np.empty(n + total, np.int64)
    run_ids = np.empty(n + total, np.int32)
    row_runs = np.arange(n) + before
    run_starts[row_runs] = np.arange(n) * length
    run_ids[row_runs] = 0
    cut_runs = np.arange(total) + row + 1
    run_starts[cut_runs] = cuts
    run_ids[cut_runs] = k + 1
    run_lengths = np.diff(run_starts, append=n * length)
    return np.repeat(run_ids, run_lengths).reshape(n, length), loss_mask


def expand_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ``counts[i]`` items in each group ``i``: every item's group, and its number within the group."""
    group = np.repeat(np.arange(len(counts)), counts)
    return group, np.arange(len(group)) - (np.cumsum(counts) - counts)[group]
