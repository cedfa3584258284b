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
    loss_mask = np.ones((n, length), bool)
    loss_mask[:, -1] = False
    total = int(counts.sum())
    if not total:
        return np.zeros((n, length), np.int32), loss_mask
    before = np.cumsum(counts) - counts
    row = np.repeat(np.arange(n), counts)
    within = np.arange(total) - before[row]
    # the document starts inside row r are doc_starts[first[r] : first[r] + counts[r]]
    cuts = doc_starts[first[row] + within] - starts[row] + row * length
    loss_mask.ravel()[cuts - 1] = False
    # runs of one segment id, in flat order: each row opens one (id 0), each document start inside it the next
    run_start = np.empty(n + total, np.int64)
    run_id = np.empty(n + total, np.int32)
    row_slot = np.arange(n) + before
    cut_slot = np.arange(total) + row + 1
    run_start[row_slot], run_id[row_slot] = np.arange(n) * length, 0
    run_start[cut_slot], run_id[cut_slot] = cuts, within + 1
    return np.repeat(run_id, np.diff(np.append(run_start, n * length))).reshape(n, length), loss_mask


def expand_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ``counts[i]`` items in each group ``i``: every item's group, and its number within the group."""
    counts = np.asarray(counts, np.int64)
    group = np.repeat(np.arange(len(counts)), counts)
    return group, np.arange(len(group)) - (np.cumsum(counts) - counts)[group]


def in_spans(starts: np.ndarray, lengths: np.ndarray, span_starts: np.ndarray, span_ends: np.ndarray) -> np.ndarray:
    """Whether each position of the ranges ``[starts[r], starts[r] + lengths[r])`` lies in a span, flat (range after range).

    Spans ``[span_starts[j], span_ends[j])`` are sorted and disjoint (they may touch). Built from the
    spans that meet each range, found by binary search: one +1/-1 mark per span and a cumulative sum,
    not a per-position search.
    """
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0 or len(span_starts) == 0:
        return np.zeros(total, bool)
    base = np.cumsum(lengths) - lengths
    first = np.searchsorted(span_ends, starts, side="right")
    stop = np.searchsorted(span_starts, starts + lengths, side="left")
    group, k = expand_counts(np.maximum(stop - first, 0))
    span = first[group] + k
    lo = np.maximum(span_starts[span], starts[group]) - starts[group] + base[group]
    hi = np.minimum(span_ends[span], starts[group] + lengths[group]) - starts[group] + base[group]
    marks = np.bincount(lo, minlength=total + 1) - np.bincount(hi, minlength=total + 1)
    return np.cumsum(marks[:total]) > 0


def span_coverage(begins: np.ndarray, ends: np.ndarray, span_starts: np.ndarray, span_ends: np.ndarray) -> np.ndarray:
    """How many positions of each range ``[begins[r], ends[r])`` lie in the sorted, disjoint spans."""
    if len(span_starts) == 0:
        return np.zeros(len(begins), np.int64)
    sizes = span_ends - span_starts
    done = np.concatenate([[0], np.cumsum(sizes)])

    def covered_below(x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(span_starts, x, side="right")
        last = np.maximum(j - 1, 0)
        return np.where(j > 0, done[last] + np.clip(x - span_starts[last], 0, sizes[last]), 0)

    return covered_below(np.asarray(ends, np.int64)) - covered_below(np.asarray(begins, np.int64))


def segment_positions(segment_ids: np.ndarray) -> np.ndarray:
    """Each token's position within its segment (a run of equal ids along the last axis), from 0."""
    ids = np.asarray(segment_ids)
    flat = ids.reshape(-1, ids.shape[-1])
    n, length = flat.shape
    starts = np.ones((n, length), bool)
    starts[:, 1:] = flat[:, 1:] != flat[:, :-1]
    index = np.broadcast_to(np.arange(length), (n, length))
    run_start = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    return (index - run_start).astype(np.int32).reshape(ids.shape)
