"""A source cut down to some of its examples: chosen at random (Levanter's simulated epoching and ``max_train_batches``), or a
contiguous range of them (one part of a ``split``).

Levanter shuffles each source and keeps the first ``k`` examples of that order, so that a short experiment sees a
source as small as a long run would relative to its budget (and so repeats it as often). ``ExampleSubset`` keeps
``k`` examples the same way: the first ``k`` of a keyed permutation of the source, so the subset is a uniform
random sample, stable for a key, and a mixture shuffles and epochs over it like any source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices
from tokenmix.datasets.permutation import FeistelPermutation


class ExampleSubset(Dataset):
    """``count`` examples of a finished ``base``: example ``i`` is ``base[perm(i)]`` for a permutation keyed by ``key``."""

    def __init__(self, base: Dataset, count: int, key: int):
        n = base.final_len()
        if n is None:
            n = base.wait_until_final(why="keeping a subset of its examples needs its length")
        if not 0 < count <= n:
            raise ValueError(f"{base!r}: cannot keep {count} of its {n} examples; keep between 1 and {n}")
        self.base = base
        self.count = count
        self.tokens_per_example = base.tokens_per_example
        self._perm = FeistelPermutation(n, key)

    def __repr__(self) -> str:
        return f"ExampleSubset({self.base!r}, {self.count})"

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.count

    def final_len(self) -> int:
        return self.count

    def _base_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        idx = as_indices(indices)
        if idx.size and idx.max() >= self.count:
            raise IndexError(f"{self!r}: example {int(idx.max())} is beyond its {self.count} examples")
        return np.asarray(self._perm(idx), np.int64)

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        return self.base.read(self._base_indices(indices))

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        return self.base.read_into(self._base_indices(indices), out, rows)


class ExampleRange(Dataset):
    """Examples ``start`` to ``stop - 1`` of a finished ``base``, in order: one contiguous part of a split source."""

    def __init__(self, base: Dataset, start: int, stop: int):
        n = base.final_len()
        if n is None:
            n = base.wait_until_final(why="cutting it into train, validation and test needs its length")
        if not 0 <= start <= stop <= n:
            raise ValueError(f"{base!r}: examples [{start}, {stop}) are outside its {n} examples")
        self.base = base
        self.start = start
        self.stop = stop
        self.tokens_per_example = base.tokens_per_example

    def __repr__(self) -> str:
        return f"ExampleRange({self.base!r}, {self.start}, {self.stop})"

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.stop - self.start

    def final_len(self) -> int:
        return self.stop - self.start

    def _base_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        idx = as_indices(indices)
        if idx.size and idx.max() >= self.stop - self.start:
            raise IndexError(f"{self!r}: example {int(idx.max())} is beyond its {self.stop - self.start} examples")
        return idx + self.start

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        return self.base.read(self._base_indices(indices))

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        return self.base.read_into(self._base_indices(indices), out, rows)
