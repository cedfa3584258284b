"""Token files another stack wrote (Megatron, datatrove, Nanoset, Cerebras HDF5), read in place as a finished cache.

``TokenFilesCache`` offers what datasets read of a ``TokenCache`` (rows, their bounds, token ranges, loss spans) over
``sources.token_file_base.TokenFile``s laid end to end, so that such a source mixes, packs and loads like any cache without
re-tokenizing or copying: every read is a slice of a memory map. Plans a packed dataset makes are kept at
``location``, a directory of the config's cache_dir, since the token files' own directory may not be writable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tokenmix.cache.ledger import fingerprint_of
from tokenmix.sources.token_file_base import TokenFile

READ_UNIT = 1 << 62
"""Ranges are never cut for this reader's sake: a range that crosses from one file into the next is joined here."""
SPAN_BLOCK_TOKENS = 1 << 26
"""Loss values are turned into spans this many tokens (whole rows) at a time, so the scratch memory stays bounded."""


class TokenFilesCache:
    """The documents of token files, in the order given, as a finished read-only cache."""

    def __init__(self, files: list[TokenFile], location: str, identity: dict[str, Any]):
        """``location``: where packing plans over these files are kept; ``identity``: what the config declares for them
        (tokenizer, vocabulary, kind), to which the files' own sizes and times are added in the fingerprint."""
        if not files:
            raise ValueError(f"{location}: a token-file source needs at least one file")
        self.files = files
        self.location = location
        self.identity = identity
        self.fingerprint = fingerprint_of({**identity, "files": [f.identity() for f in files]})
        sizes = np.array([len(f.tokens) for f in files], np.int64)
        self._file_starts = np.concatenate([[0], np.cumsum(sizes)])
        self._bounds = np.concatenate([[0], *(f.ends + s for f, s in zip(files, self._file_starts[:-1].tolist()))]).astype(np.int64)
        self._dtype = np.result_type(*(f.tokens.dtype for f in files))
        masked = [f.loss is not None for f in files]
        if any(masked) and not all(masked):
            missing = next(f.path for f in files if f.loss is None)
            raise ValueError(f"{missing}: has no loss file while other files of the source do; give every file of a source a "
                             ".loss file, or none")
        self.has_loss_spans = all(masked)

    def __repr__(self) -> str:
        return f"TokenFilesCache({len(self.files)} files from {self.files[0].path!r})"

    def __reduce__(self) -> tuple[type[TokenFilesCache], tuple[list[TokenFile], str, dict[str, Any]]]:
        """Pickled (to a loader's reader process): its files, which map themselves again; the bounds are derived anew."""
        return TokenFilesCache, (self.files, self.location, self.identity)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def stats(self) -> dict[str, Any] | None:
        """What the files say of themselves, per file."""
        return {"files": [{"path": f.path, "documents": len(f.ends), "tokens": len(f.tokens), **f.info} for f in self.files]}

    def file_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each file's tokens begin in the joint stream, and how many it holds."""
        return self._file_starts[:-1].copy(), np.diff(self._file_starts)

    def num_rows(self) -> int:
        return len(self._bounds) - 1

    def num_tokens(self) -> int:
        return int(self._bounds[-1])

    def is_finished(self) -> bool:
        return True

    def wait_for_rows(self, n: int, timeout: float | None = None) -> int:
        return self.num_rows()

    def wait_until_finished(self, timeout: float | None = None) -> int:
        return self.num_rows()

    def row_bounds(self, start: int, stop: int) -> np.ndarray:
        self._check_rows(start, stop)
        return self._bounds[start : stop + 1].copy()

    def committed_row_ends(self, start: int) -> np.ndarray:
        return self.row_ends(start, self.num_rows())

    def row_ends(self, start: int, stop: int) -> np.ndarray:
        self._check_rows(start, stop)
        return self._bounds[start + 1 : stop + 1].copy()

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start`` to ``stop - 1`` of the files' joint stream (copied out of the maps)."""
        return np.concatenate([np.asarray(p, self._dtype) for p in self._pieces(start, stop)]) if stop > start else np.empty(0, self._dtype)

    @property
    def chunk_tokens(self) -> int:
        return READ_UNIT

    @property
    def read_unit(self) -> int:
        return READ_UNIT

    def caches_blocks(self, committed_tokens: int) -> bool:
        """Never: the page cache already holds what was read, and a slice of a map costs what it returns."""
        return False

    def read_ranges(self, begin: np.ndarray, size: np.ndarray, committed_tokens: int) -> Callable[[], list[np.ndarray]]:
        """Token ranges ``[begin, begin + size)`` as views of the maps (a range across two files is joined)."""
        first = np.searchsorted(self._file_starts, begin, side="right") - 1
        whole = begin + size <= self._file_starts[first + 1]
        views = [self.files[f].tokens[b - s : b - s + m] if w else self.read_tokens(b, b + m)
                 for f, s, b, m, w in zip(first.tolist(), self._file_starts[first].tolist(), begin.tolist(), size.tolist(), whole.tolist())]
        return lambda: views

    def loss_spans(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per run of trained tokens inside a row of ``start`` to ``stop - 1``: the row, and the run's ``[begin, end)`` in it."""
        if not self.has_loss_spans:
            raise ValueError(f"{self!r}: these token files have no loss values (every token is trained on)")
        self._check_rows(start, stop)
        found = [self._spans_of(a, b) for a, b in _row_blocks(self._bounds, start, stop)]
        if not found:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        return tuple(np.concatenate(parts) for parts in zip(*found))  # type: ignore[return-value]

    def _spans_of(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = int(self._bounds[start]), int(self._bounds[stop])
        if hi == lo:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        trained = np.concatenate([np.asarray(self.files[f].loss[a:b]) for f, a, b in self._file_slices(lo, hi)]).astype(bool)
        starts, ends = self._bounds[start:stop] - lo, self._bounds[start + 1 : stop + 1] - lo
        row_start = np.zeros(hi - lo, bool)
        row_start[starts[starts < hi - lo]] = True  # an empty last row starts at the end
        opens = trained & (row_start | ~np.concatenate([[False], trained[:-1]]))
        row_end = np.zeros(hi - lo, bool)
        row_end[ends[ends > 0] - 1] = True
        closes = trained & (row_end | ~np.concatenate([trained[1:], [False]]))
        begins, ends = np.flatnonzero(opens) + lo, np.flatnonzero(closes) + lo + 1
        rows = np.searchsorted(self._bounds, begins, side="right") - 1
        return rows.astype(np.int64), begins - self._bounds[rows], ends - self._bounds[rows]

    def get_rows(self, rows: Sequence[int]) -> list[np.ndarray]:
        """The tokens of each of ``rows``."""
        out = []
        for r in rows:
            self._check_rows(int(r), int(r) + 1)
            out.append(self.read_tokens(int(self._bounds[r]), int(self._bounds[r + 1])))
        return out

    def __getitem__(self, row: int) -> np.ndarray:
        return self.get_rows([row])[0]

    def _file_slices(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """``(file, begin, end)`` within each file that tokens ``[start, stop)`` of the joint stream cover."""
        first = int(np.searchsorted(self._file_starts, start, side="right")) - 1
        out = []
        f = first
        while start < stop:
            base, end = int(self._file_starts[f]), int(self._file_starts[f + 1])
            take = min(stop, end)
            if take > start:
                out.append((f, start - base, take - base))
            start = take
            f += 1
        return out

    def _pieces(self, start: int, stop: int) -> list[np.ndarray]:
        return [self.files[f].tokens[a:b] for f, a, b in self._file_slices(start, stop)]

    def _check_rows(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.num_rows():
            raise IndexError(f"{self!r}: rows [{start}, {stop}) are outside its {self.num_rows()} rows")


def _row_blocks(bounds: np.ndarray, start: int, stop: int) -> list[tuple[int, int]]:
    """Rows ``start`` to ``stop - 1`` in consecutive blocks of about ``SPAN_BLOCK_TOKENS`` tokens (at least one row each)."""
    blocks = []
    while start < stop:
        end = int(np.searchsorted(bounds, bounds[start] + SPAN_BLOCK_TOKENS, side="right")) - 1
        end = min(max(end, start + 1), stop)
        blocks.append((start, end))
        start = end
    return blocks
