"""Preference pairs as examples: a chosen and a rejected conversation side by side, ``2 x seq_len`` tokens a row.

A ``preference_chat`` cache holds each pair as two consecutive documents, chosen first. Example ``i`` is documents
``2i`` and ``2i + 1``, each padded to ``seq_len`` (one document an example): columns ``[0, seq_len)`` hold the chosen
conversation, ``[seq_len, 2 seq_len)`` the rejected one, which is Levanter's ``DpoExample(chosen, rejected)`` laid in one
row. The rejected half's segment id is 1, so the two halves never attend to each other; the loss mask is each
conversation's own (position ``t`` learns token ``t + 1`` where that token is an assistant token, as Levanter's
``roll(assistant_mask, -1)`` gives). A conversation longer than ``seq_len`` is an error naming the example, as
Levanter's ``slice_strategy: raise``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices


class PreferencePairs(Dataset):
    """Pairs of one-document examples (``sides``, ``seq_len`` wide, read from ``cache``) as rows of ``2 x seq_len``."""

    def __init__(self, sides: Dataset, cache: TokenCache):
        self.sides = sides
        self.cache = cache
        self.seq_len = sides.tokens_per_example
        self.tokens_per_example = 2 * self.seq_len

    def __repr__(self) -> str:
        return f"PreferencePairs({self.cache.location}, seq_len={self.seq_len})"

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.sides.current_len() // 2

    def final_len(self) -> int | None:
        n = self.sides.final_len()
        return None if n is None else n // 2

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        self._check_lengths(idx)
        pending = self.sides.read(np.stack([2 * idx, 2 * idx + 1], axis=1).reshape(-1))

        def assemble() -> TokenBatch:
            sides = pending.result()
            segment_ids = sides.segment_ids.copy()
            segment_ids[1::2][segment_ids[1::2] >= 0] = 1
            width = self.tokens_per_example
            return TokenBatch(sides.tokens.reshape(-1, width), sides.loss_mask.reshape(-1, width), segment_ids.reshape(-1, width),
                              sides.source_ids[0::2].copy())

        return Pending(assemble)

    def _check_lengths(self, idx: np.ndarray) -> None:
        if not len(idx):
            return
        low, high = 2 * int(idx.min()), 2 * int(idx.max()) + 2
        lengths = np.diff(self.cache.row_bounds(low, high))
        for side in (0, 1):
            sizes = lengths[2 * idx + side - low]
            if (sizes > self.seq_len).any():
                at = int(np.argmax(sizes > self.seq_len))
                raise ValueError(f"{self.cache.location}: preference pair {int(idx[at])}: its {('chosen', 'rejected')[side]} "
                                 f"conversation has {int(sizes[at])} tokens, more than seq_len {self.seq_len} (slice_strategy: "
                                 "raise, as Levanter's DPO data); train with a longer seq_len or drop the long pairs from the data")
