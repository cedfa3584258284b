"""A dataset read through epochs, each in a fresh seeded order (Levanter repeats one order; we do not)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices
from tokenmix.datasets.order import SourceOrder, needs_length, resolvable
from tokenmix.datasets.permutation import FeistelPermutation
from tokenmix.datasets.settings import Shuffle, check_shuffle

UNBOUNDED = 2**62
"""The length reported by datasets that never end."""


class EpochedDataset(Dataset):
    """Draw k of ``base`` is example ``order(k)``: epoch ``k // len(base)``, permuted per epoch.

    With ``epochs=None`` it never ends. A full shuffle waits for the base's final length; unshuffled and
    era-shuffled reads of the first epoch proceed on the prefix a still-building cache has committed.
    """

    def __init__(self, base: Dataset, key: int, shuffle: Shuffle = True, epochs: int | None = None):
        check_shuffle(shuffle, repr(base))
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.base = base
        self.key = key
        self.shuffle = shuffle
        self.epochs = epochs
        self._final_order: SourceOrder | None = None

    def __repr__(self) -> str:
        return f"EpochedDataset({self.base!r}, shuffle={self.shuffle}, epochs={self.epochs})"

    @property
    def tokens_per_example(self) -> int:
        return self.base.tokens_per_example

    def is_finite(self) -> bool:
        return self.epochs is not None

    def final_len(self) -> int | None:
        n = self.base.final_len()
        if n is None or self.epochs is None:
            return None
        return n * self.epochs

    def current_len(self) -> int:
        n = self.base.final_len()
        if n is not None:
            return UNBOUNDED if self.epochs is None else n * self.epochs
        return resolvable(self.shuffle, self.base.current_len())

    def length(self, why: str = "") -> int:
        """Examples per epoch, waiting for the base to finish if it has not."""
        n = self.base.final_len()
        return n if n is not None else self.base.wait_until_final(why=why)

    def order_for(self, draws: np.ndarray) -> SourceOrder:
        """The order that resolves ``draws``, waiting for data where needed."""
        if self._final_order is not None:
            return self._final_order
        n = self.base.final_len()
        if n is None and needs_length(self.shuffle):
            n = self.length("a full or block shuffle needs the source's length")
        if n is None:
            provisional = SourceOrder(None, self.key, self.shuffle)
            need = provisional.needed_length(draws)
            if self.base.wait_for_len(need, why=f"examples up to {need} are asked for") >= need and self.base.final_len() is None:
                return provisional
            n = self.length()
        if n == 0:
            raise IndexError(f"{self.base!r} is empty: it has no example of {self.tokens_per_example} tokens to draw; give its "
                             "source weight 0, or give it data that fills an example (more documents, or a shorter seq_len)")
        self._final_order = SourceOrder(n, self.key, self.shuffle)
        return self._final_order

    def epoch_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The epoch each draw belongs to (needs the final length)."""
        return as_indices(indices) // self.length("epochs need the source's length")

    def examples(self, draws: Sequence[int] | np.ndarray) -> np.ndarray:
        """The base's example index for each draw."""
        idx = as_indices(draws)
        final = self.final_len()
        if final is not None and idx.size and int(idx.max()) >= final:
            raise IndexError(f"{self!r}: draw {int(idx.max())} is beyond its {final} examples")
        return self.order_for(idx)(idx) if idx.size else idx

    def permutation_of(self, draws: np.ndarray) -> tuple[FeistelPermutation, np.ndarray] | None:
        """``examples(draws)`` as one permutation and its positions, where the final order makes them that
        (``SourceOrder.permutation``) and no epoch bound applies: for a caller resolving many sources at once."""
        if self._final_order is None or self.epochs is not None:
            return None
        return self._final_order.permutation(draws)

    def has_final_order(self) -> bool:
        """Whether draws resolve without waiting or asking the cache (its final order is known)."""
        return self._final_order is not None

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        return self.base.read(self.examples(indices))

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        return self.base.read_into(self.examples(indices), out, rows)
