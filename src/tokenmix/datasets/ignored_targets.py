"""Examples that are not trained to predict one token id: Levanter's ``ignore_token_id``.

Levanter builds each example's loss mask with ``LmExample.causal(tokens, ignore_id=...)``: position ``i`` is not
trained on when token ``i + 1`` is ``ignore_id`` (padding written into the data, a placeholder id). ``IgnoredTargets``
applies the same rule to a dataset's batches, on top of the mask the dataset already made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices


class IgnoredTargets(Dataset):
    """``base``, with no loss where the next token is ``ignore_id``."""

    def __init__(self, base: Dataset, ignore_id: int):
        self.base = base
        self.ignore_id = ignore_id
        self.tokens_per_example = base.tokens_per_example

    def __repr__(self) -> str:
        return f"IgnoredTargets({self.base!r}, {self.ignore_id})"

    def is_finite(self) -> bool:
        return self.base.is_finite()

    def current_len(self) -> int:
        return self.base.current_len()

    def final_len(self) -> int | None:
        return self.base.final_len()

    def _clear(self, batch: TokenBatch, rows: np.ndarray | slice) -> None:
        batch.loss_mask[rows, :-1] &= batch.tokens[rows, 1:] != self.ignore_id

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        pending = self.base.read(as_indices(indices))

        def finish() -> TokenBatch:
            batch = pending.result()
            self._clear(batch, slice(None))
            return batch

        return Pending(finish)

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        finish = self.base.read_into(as_indices(indices), out, rows)

        def then_clear() -> None:
            finish()
            self._clear(out, rows)

        return then_clear
