"""Cutting a cache's documents into Cerebras samples, as Cerebras cuts them, and counting what became of them.

A sample is ``[3, max_seq_length]``: its input ids, loss mask and labels, from a piece of ``max_seq_length + 1`` tokens
(fewer when padded) of the stream; each piece starts on the token the one before ends with, so no label is lost.
LMData packs the kept documents into one stream or cuts each alone; Summarization takes one document a sample, trained
where its loss spans say. The cache is read ``batch_tokens`` at a time, so memory is bounded whatever its size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tokenmix.export.hdf5_options import Hdf5ExportOptions
from tokenmix.export.streaming import TokenSource, span_mask


class SampleCutter:
    """One export's walk over the cache: where the pieces of the stream that become samples lie, their samples, and
    the counts for the statistics."""

    def __init__(self, cache: TokenSource, options: Hdf5ExportOptions, pad_id: int):
        self.cache = cache
        self.options = options
        self.msl = options.max_seq_length
        self.pad = np.asarray(pad_id, options.data_dtype)
        self.lengths = _PieceLengths(options.max_seq_length, options.short_seq_prob, options.seed)
        self.rows = cache.num_rows()
        self.stream_start = int(cache.row_bounds(0, 1)[0]) if self.rows else 0
        self.stream_end = int(cache.row_bounds(self.rows - 1, self.rows)[-1]) if self.rows else 0
        self.position = self.stream_start
        """How far into the token stream the samples handed out reach (for the progress bar)."""
        self.window_rows = max(1, options.batch_tokens // 16)
        """Rows whose bounds are read at once (8 bytes each: half a byte per token of a batch)."""
        self.batch_samples = max(1, options.batch_tokens // options.max_seq_length)
        self.counts = dict.fromkeys(("num_sequences", "non_pad_tokens", "loss_valid_tokens", "processed_documents", "discarded_documents",
                                     "truncated_documents", "no_loss_documents", "remainder_tokens_dropped"), 0)

    def samples(self) -> Iterator[np.ndarray]:
        """Batches of ``[k, 3, max_seq_length]`` samples, in order."""
        if self.options.mode == "summarization":
            return self._summarization()
        return self._packed() if self.options.pack_sequences else self._unpacked()

    def statistics(self, n_files: int) -> dict[str, Any]:
        """Cerebras's ``h5_dataset_stats`` and the export's own counts.

        ``num_sequences`` (= ``n_examples``): samples written; ``num_tokens``: their positions; ``non_pad_tokens``: the
        positions holding a token of the source (counted by position, so an EOS whose id is the pad id counts);
        ``num_pad_tokens``: the others; ``loss_valid_tokens``: the positions trained on; ``num_masked_tokens``: the others;
        ``source_documents``, ``source_tokens``: what the cache held; ``processed_documents``: the documents exported;
        ``discarded_documents``: those skipped as shorter than ``min_sequence_len``; ``truncated_documents``
        (summarization): those cut at ``max_seq_length + 1`` tokens; ``no_loss_documents`` (summarization): those
        skipped because truncation left no token to train on; ``remainder_tokens_dropped``: labels of the final partial
        sample not written (``write_remainder`` false); ``n_files``."""
        counts = self.counts
        n = counts["num_sequences"]
        return {
            "num_sequences": n,
            "n_examples": n,
            "num_tokens": n * self.msl,
            "non_pad_tokens": counts["non_pad_tokens"],
            "num_pad_tokens": n * self.msl - counts["non_pad_tokens"],
            "loss_valid_tokens": counts["loss_valid_tokens"],
            "num_masked_tokens": n * self.msl - counts["loss_valid_tokens"],
            "source_documents": self.rows,
            "source_tokens": self.stream_end - self.stream_start,
            "processed_documents": counts["processed_documents"],
            "discarded_documents": counts["discarded_documents"],
            "truncated_documents": counts["truncated_documents"],
            "no_loss_documents": counts["no_loss_documents"],
            "remainder_tokens_dropped": counts["remainder_tokens_dropped"],
            "n_files": n_files,
        }

    def _windows(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each window of rows: its first row and its ``rows + 1`` token bounds."""
        for start in range(0, self.rows, self.window_rows):
            yield start, self.cache.row_bounds(start, min(start + self.window_rows, self.rows))

    def _long_enough(self, sizes: np.ndarray, least: int) -> np.ndarray:
        """Which documents have at least ``least`` tokens; the others are counted as discarded."""
        keep = sizes >= least
        self.counts["discarded_documents"] += int(len(keep) - keep.sum())
        return keep

    def _packed(self) -> Iterator[np.ndarray]:
        """The kept documents as one stream, cut whatever the document boundaries into pieces that overlap by one
        token (as Cerebras cuts it: a piece starts on the token the one before ends with, so no label is lost)."""
        carry = np.empty(0, self.cache.dtype)
        for _, bounds in self._windows():
            keep = self._long_enough(np.diff(bounds), self.options.min_sequence_len)
            self.counts["processed_documents"] += int(keep.sum())
            for begin in range(int(bounds[0]), int(bounds[-1]), self.options.batch_tokens):
                end = min(begin + self.options.batch_tokens, int(bounds[-1]))
                stream = np.concatenate([carry, self._kept_tokens(bounds, keep, begin, end)])
                lengths = self.lengths.fitting(len(stream))
                advance = lengths - 1
                self.position = end
                yield from self._emit(stream, np.cumsum(advance) - advance, lengths)
                carry = stream[int(advance.sum()):]
        if self.options.write_remainder and len(carry) >= 2:
            yield from self._emit(carry, np.zeros(1, np.int64), np.array([len(carry)]))
        else:  # the first token left was the last label written
            self.counts["remainder_tokens_dropped"] = max(len(carry) - 1, 0)

    def _kept_tokens(self, bounds: np.ndarray, keep: np.ndarray, begin: int, end: int) -> np.ndarray:
        """The tokens in ``[begin, end)`` of the stream that belong to kept rows (``keep``, per row of ``bounds``)."""
        first = int(np.searchsorted(bounds, begin, side="right")) - 1
        last = int(np.searchsorted(bounds, end, side="left"))
        kept = keep[first:last]
        if not kept.any():
            return np.empty(0, self.cache.dtype)
        tokens = np.asarray(self.cache.read_tokens(begin, end))
        if kept.all():
            return tokens
        inside = np.minimum(bounds[first + 1 : last + 1], end) - np.maximum(bounds[first:last], begin)
        return tokens[np.repeat(kept, inside)]

    def _unpacked(self) -> Iterator[np.ndarray]:
        """Each kept document cut on its own into pieces that overlap by one token."""
        for _, bounds in self._windows():
            sizes = np.diff(bounds)
            keep = self._long_enough(sizes, max(self.options.min_sequence_len, 2))
            self.counts["processed_documents"] += int(keep.sum())
            steps = sizes[keep] - 1
            counts, drawn = self.lengths.cover(steps)
            document = np.repeat(np.arange(len(steps)), counts)
            advance = drawn - 1
            before = np.cumsum(advance) - advance
            offset = before - before[np.cumsum(counts) - counts][document]
            lengths = np.minimum(advance, steps[document] - offset) + 1
            yield from self._read_pieces(bounds[:-1][keep][document] + offset, lengths)

    def _summarization(self) -> Iterator[np.ndarray]:
        """One piece per kept document: its first ``max_seq_length + 1`` tokens, trained where its loss spans say."""
        least = max(self.options.min_sequence_len, 2)
        for start, bounds in self._windows():
            sizes = np.diff(bounds)
            lengths = np.minimum(sizes, self.msl + 1)
            rows, begins, ends = self.cache.loss_spans(start, start + len(sizes))
            row = rows - start
            trained_labels = np.bincount(row, np.maximum(np.minimum(ends, lengths[row]) - np.maximum(begins, 1), 0), len(sizes))
            keep = self._long_enough(sizes, least)
            no_loss = keep & (trained_labels == 0)  # truncation cut off every trained token: nothing to learn from
            keep &= ~no_loss
            self.counts["no_loss_documents"] += int(no_loss.sum())
            self.counts["processed_documents"] += int(keep.sum())
            self.counts["truncated_documents"] += int((keep & (sizes > self.msl + 1)).sum())
            trained = functools.partial(_trained_between, bounds[row] + begins, bounds[row] + ends)
            yield from self._read_pieces(bounds[:-1][keep], lengths[keep], trained)

    def _read_pieces(self, starts: np.ndarray, lengths: np.ndarray, trained: Callable[[int, int], np.ndarray] | None = None) -> Iterator[np.ndarray]:
        """The samples of the stream's pieces ``[starts, starts + lengths)`` (in stream order), reading at most
        ``batch_tokens`` at once (one piece, at most ``max_seq_length + 1`` tokens, when a piece alone spans more)."""
        ends = starts + lengths
        i = 0
        while i < len(starts):
            begin = int(starts[i])
            j = max(i + 1, int(np.searchsorted(ends, begin + self.options.batch_tokens, side="right")))
            end = int(ends[j - 1])
            tokens = np.asarray(self.cache.read_tokens(begin, end))
            self.position = end
            yield from self._emit(tokens, starts[i:j] - begin, lengths[i:j], None if trained is None else trained(begin, end))
            i = j

    def _emit(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, trained: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """The samples of the pieces ``[starts, starts + lengths)`` of ``tokens``, ``batch_samples`` at a time."""
        for i in range(0, len(starts), self.batch_samples):
            yield self._assemble(tokens, starts[i : i + self.batch_samples], lengths[i : i + self.batch_samples], trained)

    def _assemble(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, trained: np.ndarray | None) -> np.ndarray:
        """``[k, 3, max_seq_length]``: per piece its inputs (all tokens but the last), mask and labels (all but the
        first), padded. Trained positions are the real ones, or with ``trained`` (per token of ``tokens``) those
        whose label is trained on."""
        positions = np.arange(self.msl)
        real = positions < (lengths - 1)[:, None]
        at = starts[:, None] + positions
        mask = real if trained is None else real & trained.take(at + 1, mode="clip")
        samples = np.empty((len(starts), 3, self.msl), self.options.data_dtype)
        samples[:, 0] = np.where(real, tokens.take(at, mode="clip"), self.pad)
        samples[:, 1] = mask != self.options.inverted_mask
        samples[:, 2] = np.where(real, tokens.take(at + 1, mode="clip"), self.pad)
        self.counts["num_sequences"] += len(starts)
        self.counts["non_pad_tokens"] += int((lengths - 1).sum())
        self.counts["loss_valid_tokens"] += int(mask.sum())
        return samples


class _PieceLengths:
    """Tokens each sample takes, in sample order: ``max_seq_length + 1``, or with probability ``short_seq_prob`` a count
    drawn uniformly from ``[2, max_seq_length]``. Drawn in fixed blocks from one generator, so the sequence depends on
    the seed alone, never on how the export is batched."""

    _BLOCK = 8192

    def __init__(self, max_seq_length: int, short_seq_prob: float, seed: int):
        self._full = max_seq_length + 1
        self._prob = short_seq_prob
        self._rng = np.random.default_rng(seed)
        self._ahead = np.empty(0, np.int64)

    def _peek(self, n: int) -> np.ndarray:
        """The next ``n`` lengths, left in place."""
        if not self._prob:
            return np.full(n, self._full, np.int64)
        while len(self._ahead) < n:
            short = self._rng.random(self._BLOCK) < self._prob
            drawn = self._rng.integers(2, self._full, self._BLOCK)
            self._ahead = np.concatenate([self._ahead, np.where(short, drawn, self._full)])
        return self._ahead[:n]

    def _take(self, n: int) -> np.ndarray:
        taken = self._peek(n)
        self._ahead = self._ahead[n:]
        return taken

    def fitting(self, tokens: int) -> np.ndarray:
        """The next lengths of pieces that fit in ``tokens``, each piece starting on the last token of the one before
        (a piece of ``m`` tokens advances ``m - 1``); taken."""
        n = tokens // (self._full - 1) + 1
        while True:
            reach = np.cumsum(self._peek(n) - 1)
            if reach[-1] >= tokens:
                return self._take(int(np.searchsorted(reach, tokens - 1, side="right")))
            n *= 2

    def cover(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For documents of ``steps + 1`` tokens cut into pieces that overlap by one token (a piece of ``m`` tokens
        advances ``m - 1``): how many of the next lengths each document takes, and those lengths, taken (a document's
        last piece is cut short where the document ends)."""
        if not self._prob:
            counts = -(-steps // (self._full - 1))
            return counts, np.full(int(counts.sum()), self._full, np.int64)
        counts = np.empty(len(steps), np.int64)
        reach = np.cumsum(self._peek(len(steps) + 16) - 1)
        taken = base = 0
        for document, need in enumerate(steps.tolist()):  # where a document ends depends on where the one before did
            while reach[-1] < base + need:
                reach = np.cumsum(self._peek(2 * len(reach)) - 1)
            last = int(np.searchsorted(reach, base + need))
            counts[document] = last + 1 - taken
            taken, base = last + 1, int(reach[last])
        return counts, self._take(taken)


def _trained_between(span_begins: np.ndarray, span_ends: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Per token of ``[begin, end)`` of the stream, whether it lies in one of the spans (sorted, disjoint, in stream
    positions)."""
    lo, hi = np.searchsorted(span_ends, begin, side="right"), np.searchsorted(span_begins, end, side="left")
    return span_mask(np.clip(span_begins[lo:hi], begin, end) - begin, np.clip(span_ends[lo:hi], begin, end) - begin, end - begin)
