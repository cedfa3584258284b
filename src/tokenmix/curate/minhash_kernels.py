"""Compiled (numba) kernels of MinHash's arithmetic modulo ``p = 2**61 - 1``: the shingle hashes of a group of pieces
and each piece's minimum under every permutation. ``minhash`` defines the values; these compute them at several
times the speed of the equivalent numpy array operations, which allocate an array per step (measured in
docs/benchmarks.md). Every function is compiled once and cached on disk (``cache=True``)."""

from __future__ import annotations

import numba
import numpy as np

_U64 = np.uint64
_P = _U64((1 << 61) - 1)
_M29, _M30, _M31, _M32 = (_U64((1 << bits) - 1) for bits in (29, 30, 31, 32))
_ONE = _U64(1)
_ALL_ONES = _U64((1 << 64) - 1)


@numba.njit(cache=True, inline="always")
def _mulmod(x: np.uint64, y: np.uint64) -> np.uint64:
    """``x * y % p`` for ``x`` below ``2**62`` and ``y`` below ``2**61``, in 31-bit pieces (``2**62 = 2`` mod ``p``)."""
    x0, x1, y0, y1 = x & _M31, x >> _U64(31), y & _M31, y >> _U64(31)
    middle = x0 * y1 + x1 * y0
    value = x0 * y0 + ((x1 * y1) << _ONE) + (middle >> _U64(30)) + ((middle & _M30) << _U64(31))
    value = (value & _P) + (value >> _U64(61))
    return value - _P if value >= _P else value


@numba.njit(cache=True, inline="always")
def _fmix64(value: np.uint64) -> np.uint64:
    """MurmurHash3's 64-bit finalizer (arithmetic mod ``2**64``)."""
    value ^= value >> _U64(33)
    value *= _U64(0xFF51AFD7ED558CCD)
    value ^= value >> _U64(33)
    value *= _U64(0xC4CEB9FE1A85EC53)
    return value ^ (value >> _U64(33))


@numba.njit(cache=True)
def powers(base: int, count: int) -> np.ndarray:
    """``base**e % p`` for ``e`` in ``range(count)`` (uint64)."""
    out = np.empty(count, dtype=np.uint64)
    value = _ONE
    factor = _U64(base)
    for e in range(count):
        out[e] = value
        value = _mulmod(value, factor)
    return out


@numba.njit(cache=True)
def shingle_hashes(code_points: np.ndarray, begin: np.ndarray, end: np.ndarray, inverse: np.ndarray, powers: np.ndarray) -> np.ndarray:
    """``fmix64(poly(s)) >> 3`` of the substrings ``s = code_points[begin:end]``, ``inverse`` and ``powers`` holding
    ``BASE**-j`` and ``BASE**j`` mod ``p`` for every position.

    With ``t_j = (c_j + 1) * BASE**-j`` (kept below ``2**62``, not reduced), ``poly = BASE**(end - 1) * sum(t[begin:end])``,
    the sums being differences of prefix sums of the low 32 and the high 30 bits of ``t`` (which cannot overflow)."""
    low = np.empty(len(code_points) + 1, dtype=np.uint64)
    high = np.empty(len(code_points) + 1, dtype=np.uint64)
    low[0] = high[0] = 0
    for j in range(len(code_points)):
        digit = _U64(code_points[j]) + _ONE
        top = digit * (inverse[j] >> _U64(32))
        term = digit * (inverse[j] & _M32) + ((top & _M29) << _U64(32)) + (top >> _U64(29))
        low[j + 1] = low[j] + (term & _M32)
        high[j + 1] = high[j] + (term >> _U64(32))
    out = np.empty(len(begin), dtype=np.uint64)
    for i in range(len(begin)):
        lo, hi = low[end[i]] - low[begin[i]], high[end[i]] - high[begin[i]]
        total = (lo & _P) + (lo >> _U64(61)) + ((hi & _M29) << _U64(32)) + (hi >> _U64(29))
        out[i] = _fmix64(_mulmod(total, powers[end[i] - 1])) >> _U64(3)
    return out


@numba.njit(cache=True)
def piece_minima(hashes: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[pieces, len(a)]``: for each piece (shingles ``hashes[offsets[i]:offsets[i + 1]]``) and permutation,
    ``min((a * x + b) % p)``.

    The loop over permutations is innermost so that it runs in SIMD lanes with no reduction across lanes. With
    ``x = x1 * 2**31 + x0`` and ``a = a1 * 2**31 + a0``, ``a * x = 2 * a1 * x1 + (a0 * x1 + a1 * x0) * 2**31 + a0 * x0``
    (mod ``p``), each part below ``2**62``; one fold (``2**61 = 1``) of their sum plus ``b`` leaves a value ``v`` in
    ``[0, p + 5]``, and ``min(v, v - p)`` (unsigned, so ``v - p`` wraps when ``v < p``) is its residue."""
    count = len(a)
    a0, a1 = a & _M31, a >> _U64(31)
    a1_twice = a1 << _ONE
    out = np.empty((len(offsets) - 1, count), dtype=np.uint64)
    best = np.empty(count, dtype=np.uint64)
    for piece in range(len(offsets) - 1):
        best[:] = _ALL_ONES
        for i in range(offsets[piece], offsets[piece + 1]):
            x0, x1 = hashes[i] & _M31, hashes[i] >> _U64(31)
            for k in range(count):
                middle = a0[k] * x1 + a1[k] * x0
                value = a0[k] * x0 + a1_twice[k] * x1 + (middle >> _U64(30)) + ((middle & _M30) << _U64(31)) + b[k]
                value = (value & _P) + (value >> _U64(61))
                best[k] = min(best[k], min(value, value - _P))
        out[piece] = best
    return out
