"""Keyed pseudo-random permutations of [0, n) as pure functions (no per-element arrays).

An unbalanced Feistel network permutes [0, 2^b) for the smallest b with 2^b >= n (the two halves are
b // 2 and b - b // 2 bits and swap sizes each round); cycle-walking (re-apply until the value lands
below n) restricts it to a bijection on [0, n) for any n up to 2^63. Since 2^b < 2n, fewer than 2
passes are needed on average. Everything is vectorized over numpy uint64.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np

_ROUNDS = 4
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
MAX_LENGTH = 2**63


def derive_key(*parts: int | str) -> int:
    """A 64-bit key from a tuple of ints and strings (stable across runs, platforms and Python versions)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else int(part).to_bytes(16, "little", signed=True)
        h.update(struct.pack("<cI", b"s" if isinstance(part, str) else b"i", len(data)))
        h.update(data)
    return int.from_bytes(h.digest(), "little")


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S = np.uint64(31)


def _mix(x: np.ndarray) -> np.ndarray:
    """A multiply-xorshift avalanche on uint64 (the Feistel round function need not be invertible)."""
    x = x * _M1
    x ^= x >> _S
    x *= _M2
    return x ^ (x >> _S)


class FeistelPermutation:
    """A bijection on [0, n) keyed by ``key``; ``perm(i)`` and ``perm.inverse(j)`` take scalars or arrays."""

    def __init__(self, n: int, key: int):
        if not 1 <= n <= MAX_LENGTH:
            raise ValueError(f"permutation length must be in [1, 2^63], got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        # the halves' sizes before each round: (left, right), swapping after every round
        sizes = [(bits // 2, bits - bits // 2)]
        for _ in range(_ROUNDS - 1):
            sizes.append(sizes[-1][::-1])
        self._sizes = [(np.uint64(a), np.uint64(b), np.uint64((1 << a) - 1), np.uint64((1 << b) - 1)) for a, b in sizes]
        """Per round: left bits, right bits, left mask, right mask."""
        self._round_keys = [np.uint64(derive_key(key, r)) for r in range(_ROUNDS)]
        self._table = np.array([[*sizes, k] for sizes, k in zip(self._sizes, self._round_keys)], np.uint64)
        """Per round: left bits, right bits, left mask, right mask, round key (for ``permute_many``)."""

    def _forward_once(self, x: np.ndarray) -> np.ndarray:
        for (left_bits, right_bits, left_mask, right_mask), k in zip(self._sizes, self._round_keys):
            left, right = x >> right_bits, x & right_mask
            # (left, right) -> (right, left ^ F(right)): the new right half has the old left's size
            x = (right << left_bits) | (left ^ (_mix(right ^ k) & left_mask))
        return x

    def _inverse_once(self, x: np.ndarray) -> np.ndarray:
        for (left_bits, right_bits, left_mask, _), k in zip(reversed(self._sizes), reversed(self._round_keys)):
            right, mixed = x >> left_bits, x & left_mask
            x = ((mixed ^ (_mix(right ^ k) & left_mask)) << right_bits) | right
        return x

    def _walk(self, x: np.ndarray, step) -> np.ndarray:
        with np.errstate(over="ignore"):
            out = step(x)
            n = np.uint64(self.n)
            outside = out >= n
            while outside.any():
                out[outside] = step(out[outside])
                outside = out >= n
        return out

    def _apply(self, i, step):
        arr = np.asarray(i)
        if arr.size and (arr.min() < 0 or arr.max() >= self.n):
            raise IndexError(f"permutation of length {self.n}: index out of range")
        out = self._walk(arr.astype(np.uint64).reshape(-1), step).astype(np.int64).reshape(arr.shape)
        return int(out) if np.ndim(i) == 0 else out

    def __call__(self, i):
        """Where position ``i`` goes."""
        return self._apply(i, self._forward_once)

    def inverse(self, j):
        """The position that goes to ``j``."""
        return self._apply(j, self._inverse_once)


def permute_many(perms: Sequence[FeistelPermutation], which: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``perms[which[i]](x[i])`` for each ``i``: many permutations (each of its own length and key) applied in one
    vectorized pass, so that resolving a block of a mixture of a thousand sources costs one pass, not one per source."""
    which = np.asarray(which, np.int64)
    x = np.asarray(x, np.int64)
    n = np.array([p.n for p in perms], np.uint64)[which]
    if x.size and (x.min() < 0 or np.any(x.astype(np.uint64) >= n)):
        raise IndexError("permute_many: an index is out of range of its permutation")
    rounds = np.stack([p._table for p in perms])[which] if perms else np.empty((0, _ROUNDS, 5), np.uint64)

    def forward(values: np.ndarray, params: np.ndarray) -> np.ndarray:
        for r in range(_ROUNDS):
            left_bits, right_bits, left_mask, right_mask, key = params[:, r].T
            left, right = values >> right_bits, values & right_mask
            values = (right << left_bits) | (left ^ (_mix(right ^ key) & left_mask))
        return values

    with np.errstate(over="ignore"):
        out = forward(x.astype(np.uint64), rounds)
        outside = np.flatnonzero(out >= n)
        while outside.size:  # cycle-walking, each value in its own permutation's domain
            out[outside] = forward(out[outside], rounds[outside])
            outside = outside[out[outside] >= n[outside]]
    return out.astype(np.int64)
