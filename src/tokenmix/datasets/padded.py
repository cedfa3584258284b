"""A finished dataset padded to whole batches: its examples, then examples that weigh nothing in a loss, up to a multiple
of the batch size.

An evaluation reads every example of a validation set in batches of one shape (the mesh splits each batch evenly over
its data axis); the examples that do not fill a last batch would otherwise go unread, and a set smaller than one batch
would not be read at all. Levanter's ``DataLoader(pad_final_batch=True)`` pads the same way, with all-zero examples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tokenmix.datasets.base import Dataset, DirectDataset, Pending, TokenBatch, as_indices

PADDING_ID = -1
"""The segment and source id of a padding example: padding after packed documents has segment id -1 already, and a
per-source sum (``jax.ops.segment_sum``) drops an id outside its sources."""


class PaddedDataset(DirectDataset):
    """``base``'s examples, then padding examples up to the next multiple of ``multiple``: tokens 0, no position trained
    (``loss_mask`` false, so no loss and no token counted), segment and source id ``PADDING_ID``. ``examples`` is how
    many of the examples are ``base``'s."""

    def __init__(self, base: Dataset, multiple: int):
        if multiple < 1:
            raise ValueError(f"{base!r}: padding to a multiple of {multiple} examples; give a batch size of at least 1")
        n = base.final_len()
        if n is None:
            n = base.wait_until_final(why="padding it to whole batches needs its length")
        self.base = base
        self.examples = n
        self.padded_len = -(-n // multiple) * multiple
        self.tokens_per_example = base.tokens_per_example

    def __repr__(self) -> str:
        return f"PaddedDataset({self.base!r}, {self.padded_len})"

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.padded_len

    def final_len(self) -> int:
        return self.padded_len

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        if len(idx) and int(idx.max()) < self.examples:  # real examples only: as ``base`` reads them
            return self.base.read(idx)
        return super().read(idx)

    def _write(self, idx: np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        real = idx < self.examples
        padding = rows[~real]
        out.tokens[padding] = 0
        out.loss_mask[padding] = False
        out.segment_ids[padding] = PADDING_ID
        out.source_ids[padding] = PADDING_ID
        return self.base.read_into(idx[real], out, rows[real]) if real.any() else lambda: None
