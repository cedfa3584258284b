"""What a dataset keeps in memory about a cache's committed documents, growing with the cache.

Where every document begins and ends in the cache's token stream (8 bytes a document), and, for a
cache whose format masks the loss, the token ranges trained on as absolute positions (16 bytes a
span). Both are read once and extended as the cache grows; datasets derive segment ids and loss masks
from them by index math.
"""

from __future__ import annotations

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.segments import in_spans, span_coverage


class CacheDocuments:
    """The committed documents of a cache: token bounds per row and, where stored, loss spans."""

    def __init__(self, cache: TokenCache):
        self.cache = cache
        self.bounds = np.zeros(1, np.int64)
        """``bounds[i]`` is where row ``i`` begins in the token stream, ``bounds[rows]`` where the last one ends."""
        self.finished = False
        self.masked = cache.has_loss_spans
        """Whether only the tokens inside ``span_starts``/``span_ends`` are trained on (else every token is)."""
        self.span_starts = np.empty(0, np.int64)
        self.span_ends = np.empty(0, np.int64)
        self.refresh()

    def __reduce__(self) -> tuple[type[CacheDocuments], tuple[TokenCache]]:
        """Pickled (to a loader's reader process), the documents are read again from the cache, not copied."""
        return CacheDocuments, (self.cache,)

    @property
    def rows(self) -> int:
        return len(self.bounds) - 1

    def refresh(self) -> None:
        """Take in rows committed since the last look; after the build finished, nothing more to do."""
        if self.finished:
            return
        finished = self.cache.is_finished()
        known = self.rows
        ends = self.cache.committed_row_ends(known)
        rows = known + len(ends)
        if rows > known:
            bounds = np.concatenate([self.bounds, ends])
            if self.masked:  # spans before bounds: a reader that sees a row sees its spans
                row, begin, end = self.cache.loss_spans(known, rows)
                self.span_starts = np.concatenate([self.span_starts, bounds[row] + begin])
                self.span_ends = np.concatenate([self.span_ends, bounds[row] + end])
            self.bounds = bounds
        self.finished = finished and rows == self.rows

    def targets(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
        """Whether each token of the cache ranges ``[starts[r], starts[r] + lengths[r])`` is a loss target, flat;
        None when every token is (no loss spans)."""
        return in_spans(starts, lengths, self.span_starts, self.span_ends) if self.masked else None

    def target_counts(self, begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """How many loss-target tokens each cache range ``[begins[r], ends[r])`` holds."""
        if not self.masked:
            return np.asarray(ends, np.int64) - np.asarray(begins, np.int64)
        return span_coverage(begins, ends, self.span_starts, self.span_ends)
