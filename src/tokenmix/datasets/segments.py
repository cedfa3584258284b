"""Segment ids and loss masks of fixed-length windows over a stream of documents: pure index math.

A window ``[start, start + length)`` of a token stream whose documents begin at ``doc_starts`` numbers
its documents from 0 (segment ids, so attention can be masked per document) and trains position ``i``
to predict token ``i + 1`` only when both lie in the same document (the loss mask). Built from the
document starts inside each window, found by binary search, not from a per-token scan.
"""

from __future__ import annotations

import numpy as np


def document_segments(starts: np.ndarray, length: int, doc_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids (int32) and loss mask (bool), each ``(len(starts), length)``, for the windows at ``starts``.

    ``doc_starts`` is the sorted stream positions where documents begin.
    """
    starts = np.asarray(starts, np.int64)
    n = len(starts)
    first = np.searchsorted(doc_starts, starts, side="right")
    counts = np.searchsorted(doc_starts, starts + length, side="left") - first
    segment_ids = np.zeros((n, length), np.int32)
    loss_mask = np.ones((n, length), bool)
    loss_mask[:, -1] = False
    total = int(counts.sum())
    if total:
        ends = np.cumsum(counts)
        row = np.repeat(np.arange(n), counts)
        # the document starts inside row r are doc_starts[first[r] : first[r] + counts[r]]
        inside = np.arange(total) + np.repeat(first - (ends - counts), counts)
        cuts = doc_starts[inside] - starts[row] + row * length
        loss_mask.ravel()[cuts - 1] = False
        segment_ids.ravel()[cuts] = 1
        np.cumsum(segment_ids, axis=1, out=segment_ids)
    return segment_ids, loss_mask
