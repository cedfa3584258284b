"""Cutting a cache's documents into Cerebras samples, as modelzoo's ``create_hdf5_dataset.py`` (Release_2.1.1,
``hdf5_preprocessing``) cuts them, and counting what became of them.

A sample is ``[3, max_seq_length]``: its input ids, loss mask and labels. LMData and FIM cut windows of up to
``max_seq_length + 1`` tokens starting every ``max_seq_length`` tokens (so a window starts on the last token of the one
before), over the stream of all documents (packed) or over each document alone; each window of fewer than
``min_sequence_len`` tokens is skipped, and each window kept may be cut short by ``short_seq_prob`` (one draw of Python's
``random.Random(seed)`` a window). Summarization takes each document whole (inputs: all its tokens, EOS included;
labels: the tokens after them), skipping those longer than ``max_seq_length`` or shorter than ``min_sequence_len``. The
cache is read ``batch_tokens`` at a time, so memory is bounded whatever its size.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

import numpy as np

from tokenmix.export.hdf5_fim import FimRearranger
from tokenmix.export.hdf5_options import Hdf5ExportOptions
from tokenmix.export.streaming import TokenSource, span_mask

COUNTS = ("too_short", "too_long", "single_token_tails", "short_seq_tokens_dropped", "last_window_tokens_dropped")
"""What the cutter counts besides the samples: windows or examples under ``min_sequence_len``, Summarization examples
over ``max_seq_length``, unpacked documents' last windows of one token (already the label before them), tokens cut off
by ``short_seq_prob``, and the tokens of the packed stream's final partial window left unwritten."""


class SampleCutter:
    """One export's walk over the cache: the windows of the stream that become samples, their samples, and the counts
    of what was skipped or dropped."""

    def __init__(self, cache: TokenSource, options: Hdf5ExportOptions, pad_id: int, fim: FimRearranger | None = None):
        self.cache = cache
        self.options = options
        self.msl = options.max_seq_length
        self.pad = np.asarray(pad_id, options.data_dtype)
        self.fim = fim
        self.rows = cache.num_rows()
        self.stream_start = int(cache.row_bounds(0, 1)[0]) if self.rows else 0
        self.stream_end = int(cache.row_bounds(self.rows - 1, self.rows)[-1]) if self.rows else 0
        self.position = self.stream_start
        """How far into the token stream the samples handed out reach (for the progress bar)."""
        self.window_rows = max(1, options.batch_tokens // 16)
        """Rows whose bounds are read at once (8 bytes each: half a byte per token of a batch)."""
        self.batch_samples = max(1, options.batch_tokens // options.max_seq_length)
        self.counts = dict.fromkeys(COUNTS, 0)
        self._rng = random.Random(options.seed)

    def samples(self) -> Iterator[np.ndarray]:
        """Batches of ``[k, 3, max_seq_length]`` samples, in order."""
        if self.options.mode == "summarization":
            return self._summarization()
        return self._packed() if self.options.pack_sequences else self._unpacked()

    @property
    def discarded(self) -> int:
        """Cerebras's ``discarded_files``: windows and examples skipped, and unpacked documents' one-token tails."""
        return self.counts["too_short"] + self.counts["too_long"] + self.counts["single_token_tails"]

    def _take(self, n: int) -> int:
        """How many tokens of a window of ``n`` become its sample: 0 (too short, skipped), ``n``, or fewer when
        ``short_seq_prob`` cuts it (a count drawn from ``[2, max_seq_length - 1]``)."""
        if n < self.options.min_sequence_len:
            self.counts["too_short"] += 1
            return 0
        if self.options.short_seq_prob and self._rng.random() < self.options.short_seq_prob:
            take = min(n, self._rng.randint(2, self.msl - 1))
            if not self.options.short_seq_carry:
                self.counts["short_seq_tokens_dropped"] += n - take
            return take
        return n

    def _cut(self, size: int, final: bool, count_tails: bool) -> tuple[list[int], list[int], int]:
        """The windows of ``size`` tokens, in order: their starts and token counts, and where the first window not cut
        begins. Without ``final`` only whole windows are cut (the rest waits for more tokens); with it the last window
        takes what is left, and a last window of one token is dropped (counted where ``count_tails``)."""
        full = self.msl + 1
        carry = self.options.short_seq_carry
        starts: list[int] = []
        lengths: list[int] = []
        pos = 0
        while True:
            n = min(full, size - pos)
            if n < full and not final:
                break
            if n < 2:
                if n == 1 and count_tails:
                    self.counts["single_token_tails"] += 1
                break
            take = self._take(n)
            if take:
                starts.append(pos)
                lengths.append(take)
            if carry and 0 < take < n:
                pos += take - 1
            elif carry and final and take == n and pos + n >= size:  # the window took what was left
                break
            else:
                pos += self.msl
        return starts, lengths, min(pos, size)

    def _packed(self) -> Iterator[np.ndarray]:
        """The documents as one stream, cut whatever the document boundaries; its final partial window is written only
        with ``keep_last_window``."""
        carry = np.empty(0, self.cache.dtype)
        for begin in range(self.stream_start, self.stream_end, self.options.batch_tokens):
            end = min(begin + self.options.batch_tokens, self.stream_end)
            stream = np.concatenate([carry, np.asarray(self.cache.read_tokens(begin, end))])
            starts, lengths, rest = self._cut(len(stream), final=False, count_tails=False)
            self.position = end
            yield from self._emit(stream, np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
            carry = stream[rest:]
        if self.options.keep_last_window:
            starts, lengths, _ = self._cut(len(carry), final=True, count_tails=False)
            yield from self._emit(carry, np.asarray(starts, np.int64), np.asarray(lengths, np.int64))
        else:
            self.counts["last_window_tokens_dropped"] = len(carry)

    def _unpacked(self) -> Iterator[np.ndarray]:
        """Each document cut alone."""
        for _, bounds in self._row_windows():
            starts: list[int] = []
            lengths: list[int] = []
            for begin, size in zip(bounds[:-1].tolist(), np.diff(bounds).tolist()):
                doc_starts, doc_lengths, _ = self._cut(size, final=True, count_tails=True)
                starts.extend(begin + s for s in doc_starts)
                lengths.extend(doc_lengths)
            yield from self._read_pieces(np.asarray(starts, np.int64), np.asarray(lengths, np.int64))

    def _summarization(self) -> Iterator[np.ndarray]:
        """One sample per document of ``min_sequence_len`` to ``max_seq_length`` tokens, trained where its loss spans
        say."""
        for start, bounds in self._row_windows():
            sizes = np.diff(bounds)
            too_long = sizes > self.msl
            too_short = ~too_long & (sizes < self.options.min_sequence_len)
            self.counts["too_long"] += int(too_long.sum())
            self.counts["too_short"] += int(too_short.sum())
            keep = ~(too_long | too_short)
            rows, begins, ends = self.cache.loss_spans(start, start + len(sizes))
            row = rows - start
            trained = functools.partial(_trained_between, bounds[row] + begins, bounds[row] + ends)
            yield from self._read_pieces(bounds[:-1][keep], sizes[keep], trained)

    def _row_windows(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each window of rows: its first row and its ``rows + 1`` token bounds."""
        for start in range(0, self.rows, self.window_rows):
            yield start, self.cache.row_bounds(start, min(start + self.window_rows, self.rows))

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
            samples = self._assemble(tokens, starts[i : i + self.batch_samples], lengths[i : i + self.batch_samples], trained)
            if self.fim is not None:
                samples = np.stack([self.fim.rearrange(sample) for sample in samples]) if len(samples) else samples
            yield samples

    def _assemble(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, trained: np.ndarray | None) -> np.ndarray:
        """``[k, 3, max_seq_length]``: per piece its inputs, mask and labels (the inputs shifted by one), padded. LMData's
        inputs are all the piece's tokens but the last; Summarization's are all of them, the EOS that ends the document
        included (its label is padding). Trained positions are those with a label, or with ``trained`` (per token of
        ``tokens``) those whose label is trained on."""
        positions = np.arange(self.msl)
        labelled = positions < (lengths - 1)[:, None]
        inputs = positions < lengths[:, None] if self.options.mode == "summarization" else labelled
        at = starts[:, None] + positions
        mask = labelled if trained is None else labelled & trained.take(at + 1, mode="clip")
        samples = np.empty((len(starts), 3, self.msl), self.options.data_dtype)
        samples[:, 0] = np.where(inputs, tokens.take(at, mode="clip"), self.pad)
        samples[:, 1] = mask != self.options.inverted_mask
        samples[:, 2] = np.where(labelled, tokens.take(at + 1, mode="clip"), self.pad)
        return samples


def _trained_between(span_begins: np.ndarray, span_ends: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Per token of ``[begin, end)`` of the stream, whether it lies in one of the spans (sorted, disjoint, in stream
    positions)."""
    lo, hi = np.searchsorted(span_ends, begin, side="right"), np.searchsorted(span_begins, end, side="left")
    return span_mask(np.clip(span_begins[lo:hi], begin, end) - begin, np.clip(span_ends[lo:hi], begin, end) - begin, end - begin)

