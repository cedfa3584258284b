"""A cache viewed as one token stream cut into examples of ``seq_len`` tokens (Levanter's layout).

Example i is tokens ``[i * seq_len, (i + 1) * seq_len)`` of the stream; a trailing partial example is
dropped. Changing ``seq_len`` needs no re-tokenizing. Document boundaries come from the cache's
offsets (not from EOS tokens), so segment ids are exact whatever the format. The stream is either the
whole cache (and grows while it builds) or a fixed subset of its documents (held-out validation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices


class TokenSeqDataset(Dataset):
    """Fixed-length examples over a cache's documents, with loss masks and per-document segment ids."""

    def __init__(self, cache: TokenCache, seq_len: int, source_id: int = 0, documents: np.ndarray | None = None):
        """``documents``: sorted row numbers to keep (the cache must be finished); None keeps every row."""
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {seq_len}")
        self.cache = cache
        self.seq_len = seq_len
        self.source_id = source_id
        self._bounds = np.zeros(1, np.int64)
        self._finished = False
        self._subset = documents is not None
        self._refresh()
        if self._subset:
            if not self._finished:
                raise ValueError(f"{cache.location}: a document subset needs a finished cache")
            self._use_subset(np.asarray(documents, np.int64))
        else:
            self._run_stream = np.zeros(1, np.int64)
            self._run_tokens = np.zeros(1, np.int64)

    def __repr__(self) -> str:
        return f"TokenSeqDataset({self.cache.location!r}, seq_len={self.seq_len})"

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

    def _refresh(self) -> None:
        if self._finished:
            return
        finished = self.cache.is_finished()
        rows = self.cache.num_rows()
        known = len(self._bounds) - 1
        if rows > known:
            self._bounds = np.concatenate([self._bounds, self.cache.row_ends(known, rows)])
        self._finished = finished and rows == len(self._bounds) - 1

    def _use_subset(self, docs: np.ndarray) -> None:
        rows = len(self._bounds) - 1
        if docs.size and (docs.min() < 0 or docs.max() >= rows or np.any(np.diff(docs) <= 0)):
            raise ValueError(f"{self.cache.location}: document subset must be sorted unique rows below {rows}")
        lengths = self._bounds[docs + 1] - self._bounds[docs]
        self._doc_starts = np.concatenate([[0], np.cumsum(lengths)])
        # runs of consecutive kept rows are contiguous in the cache: one read each
        run_first = np.flatnonzero(np.concatenate([[True], np.diff(docs) != 1])) if docs.size else np.zeros(0, np.int64)
        self._run_stream = self._doc_starts[run_first]
        self._run_tokens = self._bounds[docs[run_first]]
        self._stream_tokens = int(self._doc_starts[-1])

    def _stream_len(self) -> int:
        return self._stream_tokens if self._subset else int(self._bounds[-1])

    def _doc_starts_now(self) -> np.ndarray:
        return self._doc_starts if self._subset else self._bounds

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        self._refresh()
        return self._stream_len() // self.seq_len

    def final_len(self) -> int | None:
        self._refresh()
        return self._stream_len() // self.seq_len if self._finished else None

    def num_documents(self) -> int:
        """Documents in the stream (so far)."""
        return len(self._doc_starts_now()) - 1

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        n, length = len(idx), self.seq_len
        if n and int(idx.max()) >= self.current_len():
            raise IndexError(f"{self!r}: example {int(idx.max())} is beyond the {self.current_len()} examples available")
        starts = idx * length
        spans, owners = self._spans(starts, starts + length)
        finish = self.cache.read_spans(spans, int(self._bounds[-1]))
        segment_ids, loss_mask = self._segments(starts)

        def assemble() -> TokenBatch:
            tokens = np.empty((n, length), np.int32)
            flat = tokens.reshape(-1)
            for (w, offset), piece in zip(owners, finish()):
                flat[w * length + offset : w * length + offset + len(piece)] = piece
            return TokenBatch(tokens, loss_mask, segment_ids, np.full(n, self.source_id, np.int32))

        return Pending(assemble)

    def _spans(self, starts: np.ndarray, stops: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Cache token ranges for stream ranges, and (example, offset in example) for each."""
        spans, owners = [], []
        run_stream, run_tokens = self._run_stream, self._run_tokens
        first_runs = np.searchsorted(run_stream, starts, side="right") - 1
        for w, (a, b, r) in enumerate(zip(starts.tolist(), stops.tolist(), first_runs.tolist())):
            pos = a
            while pos < b:
                run_end = int(run_stream[r + 1]) if r + 1 < len(run_stream) else b
                stop = min(b, run_end)
                begin = int(run_tokens[r]) + pos - int(run_stream[r])
                spans.append((begin, begin + stop - pos))
                owners.append((w, pos - a))
                pos, r = stop, r + 1
        return spans, owners

    def _segments(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Segment ids (documents numbered from 0 in each example) and the loss mask."""
        n, length = len(starts), self.seq_len
        doc_starts = self._doc_starts_now()
        lo = np.searchsorted(doc_starts, starts, side="right")
        hi = np.searchsorted(doc_starts, starts + length, side="left")
        counts = hi - lo
        marks = np.zeros((n, length), np.int32)
        if counts.sum():
            example = np.repeat(np.arange(n), counts)
            within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            marks[example, doc_starts[lo[example] + within] - starts[example]] = 1
        segment_ids = np.cumsum(marks, axis=1, dtype=np.int32)
        loss_mask = np.zeros((n, length), bool)
        loss_mask[:, :-1] = segment_ids[:, 1:] == segment_ids[:, :-1]
        return segment_ids, loss_mask
