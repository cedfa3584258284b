"""The order a source's examples are read in, across epochs: pure index math, no I/O.

The k-th example drawn from a source of ``length`` examples belongs to epoch ``k // length``; inside an
epoch it is either read in place, through a full permutation, through permutations of consecutive
eras of ``era_length`` examples (useful while a cache is still growing), or through a block shuffle
(``block_shuffle.py``). Each epoch (and each era) has
its own key, so every epoch is read in a fresh order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tokenmix.datasets.block_shuffle import block_shuffled
from tokenmix.datasets.permutation import FeistelPermutation, derive_key
from tokenmix.datasets.settings import BlockShuffle, Shuffle, check_shuffle


def needs_length(shuffle: Shuffle) -> bool:
    """Whether the order can only be known with the source's final length (a full or block shuffle)."""
    return shuffle is True or isinstance(shuffle, BlockShuffle)


def resolvable(shuffle: Shuffle, have: int) -> int:
    """How many positions of a still-growing source's order can be resolved with ``have`` examples."""
    if shuffle is False:
        return have
    return 0 if needs_length(shuffle) else have // shuffle * shuffle  # type: ignore[operator]


@dataclass(frozen=True)
class SourceOrder:
    """Maps the k-th draw from a source to (epoch, example index)."""

    length: int | None
    """Examples per epoch; None while unknown (only epoch 0 of an unshuffled or era-shuffled source)."""
    key: int
    shuffle: Shuffle = True

    def __post_init__(self) -> None:
        check_shuffle(self.shuffle, "source order")
        if self.length is None and needs_length(self.shuffle):
            raise ValueError("a full or block shuffle needs the source's final length")
        if self.length is not None and self.length < 1:
            raise ValueError(f"a source needs at least one example, got length {self.length}")

    def epoch(self, k: np.ndarray) -> np.ndarray:
        """The epoch each draw ``k`` falls in."""
        k = np.asarray(k, np.int64)
        return np.zeros_like(k) if self.length is None else k // self.length

    def needed_length(self, k: np.ndarray) -> int:
        """How many examples must exist before draws ``k`` can be resolved without the final length."""
        k = np.asarray(k, np.int64)
        if k.size == 0:
            return 0
        top = int(k.max()) + 1
        if isinstance(self.shuffle, bool | BlockShuffle):
            return top
        return -(-top // self.shuffle) * self.shuffle

    def permutation(self, k: np.ndarray) -> tuple[FeistelPermutation, np.ndarray] | None:
        """Where draws ``k`` are positions of one full permutation (a full shuffle, all in one epoch): that permutation
        and the positions, for a caller that applies many sources' at once (``permute_many``); else None."""
        if self.shuffle is not True or self.length is None or not len(k):
            return None
        epoch, within = np.divmod(np.asarray(k, np.int64), self.length)
        if epoch.min() != epoch.max():
            return None
        return _permutation(self.length, self.key, int(epoch[0]), 0), within

    def __call__(self, k: np.ndarray) -> np.ndarray:
        """The example index of each draw ``k``."""
        k = np.asarray(k, np.int64)
        if self.length is None:
            epoch, within = np.zeros_like(k), k
        else:
            epoch, within = np.divmod(k, self.length)
        if self.shuffle is False:
            return within.copy()
        if isinstance(self.shuffle, BlockShuffle):
            out = np.empty_like(within)
            for e in np.unique(epoch).tolist():
                members = epoch == e
                out[members] = block_shuffled(within[members], self.length, self.shuffle, derive_key(self.key, "epoch", e))  # type: ignore[arg-type]
            return out
        era_len = self.length if self.shuffle is True else self.shuffle
        era, offset = np.divmod(within, era_len)
        if self.shuffle is True and (epoch.size == 0 or epoch.min() == epoch.max()):
            e = int(epoch.flat[0]) if epoch.size else 0
            return _permutation(self.length, self.key, e, 0)(within)
        out = np.empty_like(k)
        groups = np.stack([epoch.ravel(), era.ravel()], axis=1)
        uniq, inverse = np.unique(groups, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        flat_offset, flat_out = offset.ravel(), out.reshape(-1)
        for g, (e, r) in enumerate(uniq):
            members = inverse == g
            start = int(r) * era_len
            size = era_len if self.length is None else min(era_len, self.length - start)
            flat_out[members] = start + _permutation(size, self.key, int(e), int(r))(flat_offset[members])
        return out


@lru_cache(maxsize=1024)
def _permutation(size: int, key: int, epoch: int, era: int) -> FeistelPermutation:
    return FeistelPermutation(size, derive_key(key, "epoch", epoch, "era", era))
