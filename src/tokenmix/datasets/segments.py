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
    segment_ids = np.empty((len(starts), length), np.int32)
    loss_mask = np.empty((len(starts), length), bool)
    fill_documents(segment_ids, loss_mask, *window_cuts(starts, length, doc_starts))
    return segment_ids, loss_mask


def window_cuts(starts: np.ndarray, length: int, doc_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where documents begin strictly inside the windows ``[start, start + length)``: per such document start, its
    window and its offset in that window (from 1 to ``length - 1``).

    ``doc_starts`` is the sorted stream positions where documents begin.
    """
    starts = np.asarray(starts, np.int64)
    first = np.searchsorted(doc_starts, starts, side="right")
    counts = np.searchsorted(doc_starts, starts + length, side="left") - first
    window, k = expand_counts(counts)  # the document starts inside window w are doc_starts[first[w] : first[w] + counts[w]]
    return window, doc_starts[first[window] + k] - starts[window]


def fill_documents(segment_ids: np.ndarray, loss_mask: np.ndarray, cut_row: np.ndarray, cut_offset: np.ndarray) -> None:
    """Fill ``(n, length)`` segment ids and loss masks, in place, for rows whose documents begin at the cuts.

    Cut ``k`` is a document beginning at offset ``cut_offset[k]`` (1 to ``length - 1``) of row ``cut_row[k]``, in any
    order; a row's first token is always in its segment 0. Position ``i`` is trained on when token ``i + 1`` is in the
    same row and document.
    """
    n, length = segment_ids.shape
    loss_mask[...] = True
    loss_mask[:, -1] = False
    loss_mask[cut_row, cut_offset - 1] = False
    flat_cuts = np.asarray(cut_row, np.int64) * length + cut_offset
    # runs of one segment id in flat order: each row opens one (id 0), each cut the next in its row
    run_start = np.sort(np.concatenate([np.arange(n, dtype=np.int64) * length, flat_cuts]))
    run = np.arange(len(run_start))
    run_id = run - np.maximum.accumulate(np.where(run_start % length == 0, run, 0))
    segment_ids[...] = np.repeat(run_id.astype(np.int32), np.diff(run_start, append=n * length)).reshape(n, length)


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
