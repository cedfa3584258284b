"""A cache viewed as one token stream cut into examples of ``seq_len`` tokens (Levanter's layout).

Example i is tokens ``[i * seq_len, (i + 1) * seq_len)`` of the stream; a trailing partial example is
dropped (with ``token_runs``, the stream is some ranges of the cache laid end to end). With a ``stride`` below
``seq_len`` examples overlap: Megatron's and Nanoset's samples are
``seq_len + 1`` tokens read every ``seq_len`` (inputs and shifted labels from one read), which is
``TokenSeqDataset(cache, seq_len + 1, stride=seq_len)``. Changing ``seq_len`` needs no re-tokenizing. Document boundaries come from the cache's
offsets (not from EOS tokens), so segment ids are exact whatever the format. The stream is either the
whole cache (and grows while it builds) or a fixed subset of its documents (held-out validation).
Where the cache stores loss spans (supervised, chat), position i is trained on only when token i + 1
is one the format trains on, as well as being in the same document.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.base import DirectDataset, TokenBatch
from tokenmix.datasets.cache_ranges import checked_subset, copy_ranges, split_at_chunks, trained_positions
from tokenmix.datasets.documents import CacheDocuments
from tokenmix.datasets.segments import expand_counts, window_cuts


class TokenSeqDataset(DirectDataset):
    """Fixed-length examples over a cache's documents, with loss masks and per-document segment ids."""

    def __init__(self, cache: TokenCache, seq_len: int, source_id: int = 0, documents: np.ndarray | None = None,
                 stride: int | None = None, token_runs: tuple[np.ndarray, np.ndarray] | None = None):
        """``documents``: sorted row numbers to keep (the cache must be finished); None keeps every row.
        ``stride``: tokens from one example's start to the next (``seq_len`` when None: no overlap).
        ``token_runs``: instead of documents, ``(begins, lengths)`` of sorted, disjoint ranges of the token stream that
        make the stream, each beginning a document (a finished cache): datatrove's windows, which stay inside a file."""
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {seq_len}")
        stride = seq_len if stride is None else stride
        if not 1 <= stride <= seq_len:
            raise ValueError(f"stride must be between 1 and seq_len ({seq_len}), got {stride}")
        self.cache = cache
        self.seq_len = seq_len
        self.stride = stride
        self.source_id = source_id
        self._docs = CacheDocuments(cache)
        self._subset = documents is not None or token_runs is not None
        if documents is not None and token_runs is not None:
            raise ValueError(f"{cache.location}: give documents or token_runs, not both")
        if documents is not None:
            self._use_subset(checked_subset(self._docs, documents))
        elif token_runs is not None:
            self._use_runs(*token_runs)
        else:
            self._run_stream = np.zeros(1, np.int64)
            self._run_tokens = np.zeros(1, np.int64)

    def __repr__(self) -> str:
        stride = "" if self.stride == self.seq_len else f", stride={self.stride}"
        return f"TokenSeqDataset({self.cache.location!r}, seq_len={self.seq_len}{stride})"

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

    @property
    def _bounds(self) -> np.ndarray:
        return self._docs.bounds

    def _use_subset(self, docs: np.ndarray) -> None:
        lengths = self._bounds[docs + 1] - self._bounds[docs]
        self._doc_starts = np.concatenate([[0], np.cumsum(lengths)])
        # runs of consecutive kept rows are contiguous in the cache: one read each
        run_first = np.flatnonzero(np.concatenate([[True], np.diff(docs) != 1])) if docs.size else np.zeros(0, np.int64)
        self._run_stream = self._doc_starts[run_first]
        self._run_tokens = self._bounds[docs[run_first]]
        self._stream_tokens = int(self._doc_starts[-1])

    def _use_runs(self, begins: np.ndarray, lengths: np.ndarray) -> None:
        begins, lengths = np.asarray(begins, np.int64), np.asarray(lengths, np.int64)
        ends = begins + lengths
        if not self._docs.finished or np.any(lengths < 0) or np.any(begins[1:] < ends[:-1]) or (len(ends) and ends[-1] > self._bounds[-1]):
            raise ValueError(f"{self.cache.location}: token runs must be sorted, disjoint ranges of a finished cache's "
                             f"{int(self._bounds[-1])} tokens")
        self._run_tokens = begins
        self._run_stream = np.cumsum(lengths) - lengths
        self._stream_tokens = int(lengths.sum())
        starts = self._bounds[:-1]
        first = np.searchsorted(starts, begins, side="left")
        group, k = expand_counts(np.searchsorted(starts, ends, side="left") - first)
        inside = starts[first[group] + k] - begins[group] + self._run_stream[group]
        self._doc_starts = np.unique(np.concatenate([self._run_stream, inside, [self._stream_tokens]]))

    def _stream_len(self) -> int:
        return self._stream_tokens if self._subset else int(self._bounds[-1])

    def _doc_starts_now(self) -> np.ndarray:
        return self._doc_starts if self._subset else self._bounds

    def is_finite(self) -> bool:
        return True

    def _examples_in(self, tokens: int) -> int:
        return (tokens - self.seq_len) // self.stride + 1 if tokens >= self.seq_len else 0

    def current_len(self) -> int:
        self._docs.refresh()
        return self._examples_in(self._stream_len())

    def final_len(self) -> int | None:
        self._docs.refresh()
        return self._examples_in(self._stream_len()) if self._docs.finished else None

    def num_documents(self) -> int:
        """Documents in the stream (so far)."""
        return len(self._doc_starts_now()) - 1

    def _write(self, idx: np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        length = self.seq_len
        starts = idx * self.stride
        owner, offset, begin, size = self._pieces(starts, starts + length)
        read = copy_ranges(self.cache, begin, size, rows[owner] * length + offset, out, int(self._bounds[-1]))
        trained = trained_positions(self._docs, (len(idx), length), owner * length + offset, begin, size)  # position i learns token i + 1
        out.add_documents(rows, *window_cuts(starts, length, self._doc_starts_now()), trained)
        out.source_ids[rows] = self.source_id

        def finish() -> None:
            read()
            out.settle_documents()

        return finish

    def _pieces(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Split stream ranges into pieces contiguous in the cache and inside one stored chunk.

        Returns, per piece: the range it belongs to, its offset in that range, its first token in the
        cache, and its length.
        """
        size = self.cache.chunk_tokens
        if not self._subset and not np.any(starts // size - (stops - 1) // size):  # the usual case: one piece each
            return np.arange(len(starts)), np.zeros(len(starts), np.int64), starts, stops - starts
        run_stream, run_tokens = self._run_stream, self._run_tokens
        run_ends = np.append(run_stream[1:], np.iinfo(np.int64).max)
        first = np.searchsorted(run_stream, starts, side="right") - 1
        last = np.searchsorted(run_stream, stops, side="left") - 1
        owner, k = expand_counts(last - first + 1)
        run = first[owner] + k
        lo = np.maximum(starts[owner], run_stream[run])
        hi = np.minimum(stops[owner], run_ends[run])
        begin = run_tokens[run] + lo - run_stream[run]
        offset = lo - starts[owner]
        sub, piece_begin, piece_size = split_at_chunks(begin, hi - lo, size)
        return owner[sub], offset[sub] + piece_begin - begin[sub], piece_begin, piece_size
