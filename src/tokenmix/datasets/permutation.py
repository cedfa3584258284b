"""Keyed pseudo-random permutations of [0, n) as pure functions (no per-element arrays).

A balanced Feistel network permutes [0, 4^h) for the smallest h with 4^h >= n; cycle-walking (re-apply
until the value lands below n) restricts it to a bijection on [0, n) for any n up to 2^63. Since 4^h < 4n,
fewer than 4 rounds of walking are needed on average. Everything is vectorized over numpy uint64.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

_ROUNDS = 6
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


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective avalanche on uint64."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """A bijection on [0, n) keyed by ``key``; ``perm(i)`` and ``perm.inverse(j)`` take scalars or arrays."""

    def __init__(self, n: int, key: int):
        if not 1 <= n <= MAX_LENGTH:
            raise ValueError(f"permutation length must be in [1, 2^63], got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._half = (bits + 1) // 2
        self._half_mask = np.uint64((1 << self._half) - 1)
        self._round_keys = [np.uint64(derive_key(key, r) & 0xFFFFFFFFFFFFFFFF) for r in range(_ROUNDS)]

    def _round(self, x: np.ndarray, r: int) -> np.ndarray:
        return _mix(x ^ self._round_keys[r]) & self._half_mask

    def _forward_once(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self._half)
        left, right = x >> h, x & self._half_mask
        for r in range(_ROUNDS):
            left, right = right, left ^ self._round(right, r)
        return (left << h) | right

    def _inverse_once(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self._half)
        left, right = x >> h, x & self._half_mask
        for r in reversed(range(_ROUNDS)):
            left, right = right ^ self._round(left, r), left
        return (left << h) | right

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
