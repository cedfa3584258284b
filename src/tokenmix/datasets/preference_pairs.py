"""Preference pairs as examples: a chosen and a rejected conversation side by side, ``2 x seq_len`` tokens a row.

A ``preference_chat`` cache holds each pair as two consecutive documents, chosen first. Example ``i`` is documents
``2i`` and ``2i + 1``, each padded to ``seq_len`` (one document an example): columns ``[0, seq_len)`` hold the chosen
conversation, ``[seq_len, 2 seq_len)`` the rejected one, which is Levanter's ``DpoExample(chosen, rejected)`` laid in one
row, token for token what marin's ``PreferencePairDataset`` makes (tests/data/levanter/preference_marin.npz):

- padding is token 0, whatever the tokenizer's pad (Levanter's ``GreedyPrepackedDataset`` pads with zeros);
- the loss mask of each half is Levanter's ``roll(assistant_mask, -1)`` with the half's last position off: position
  ``t`` learns token ``t + 1`` where that token is an assistant token. Without ``mask_user_turns`` (a cache without
  loss spans) Levanter gives no mask, so every position of the half but its last is trained on, padding included;
- the rejected half's segment id is 1, so the two halves never attend to each other (Levanter keeps them apart as two
  examples); padding's is -1.

A conversation longer than ``seq_len`` is an error naming the pair when the dataset is made, as Levanter's
``slice_strategy: raise`` refuses the whole dataset then; pairs committed later (a cache still building) are checked as
they are read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenmix.cache.reader import TokenCache
from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices

LEVANTER_PAD_ID = 0
"""The token Levanter pads a preference pair's sides with."""
CHECK_ROWS = 1 << 20
"""Rows whose lengths are read at a time when the dataset is made (bounds its memory on a large cache)."""


class PreferencePairs(Dataset):
    """Pairs of one-document examples (``sides``, ``seq_len`` wide, read from ``cache``) as rows of ``2 x seq_len``."""

    def __init__(self, sides: Dataset, cache: TokenCache):
        self.sides = sides
        self.cache = cache
        self.seq_len = sides.tokens_per_example
        self.tokens_per_example = 2 * self.seq_len
        self._checked_rows = cache.num_rows() // 2 * 2
        for start in range(0, self._checked_rows, CHECK_ROWS):
            self._check_lengths(np.arange(start // 2, min(start + CHECK_ROWS, self._checked_rows) // 2))

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
        self._check_lengths(idx[2 * idx >= self._checked_rows])
        pending = self.sides.read(np.stack([2 * idx, 2 * idx + 1], axis=1).reshape(-1))

        def assemble() -> TokenBatch:
            sides = pending.result()
            padding = sides.segment_ids < 0
            sides.tokens[padding] = LEVANTER_PAD_ID
            if not self.cache.has_loss_spans:
                sides.loss_mask[:, :-1] = True
                sides.loss_mask[:, -1] = False
            segment_ids = sides.segment_ids.copy()
            segment_ids[1::2][~padding[1::2]] = 1
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
