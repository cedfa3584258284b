"""Megatron's greedy blending, as Nanotron's BlendedNanoset applies it, found a block of positions at a time (pure).

Position ``i`` goes to the dataset whose error ``w * max(i, 1) - drawn`` is largest (the first on ties), in float64
exactly as the stacks compute it; the dataset's draw number is how many it had before. The stacks materialize both
arrays for the whole run in one Python (Nanotron) or C++ (Megatron) loop. Here a block of ``BLOCK`` positions is
resolved when read, from the per-dataset counts at its start, which are kept for every block resolved so far (``m``
int64 a block).

The loop is sequential, but checking a guessed sequence is not: given a guess for a window, its counts before each
position are one cumulative sum, and the window is right up to the first position where the argmax of the errors those
counts give differs from the guess (everything before it was computed from true counts, so it is true; at it, the
argmax is the true choice). The guess is the sequence one period earlier: weights that are fractions with a common
denominator ``P`` repeat every ``P`` positions (YAML weights such as 0.7 / 0.3 give small ``P``), and the check catches
every place where float rounding breaks the repetition. Weights without a period up to ``MAX_PERIOD`` are walked one
position at a time (about 1 us each).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from math import lcm

import numpy as np

BLOCK = 1 << 16
"""Positions resolved together; the counts at each resolved block's start are kept."""
MAX_PERIOD = 1 << 16
"""Longest period used as the guess; the first ``2 * period`` positions are walked one at a time to make it."""
_WINDOW_CELLS = 1 << 20
"""Positions x datasets checked in one numpy pass (bounds the memory of a check)."""
_KEPT_BLOCKS = 8


def greedy_walk(weights: Sequence[float], counts: list[int], start: int, stop: int) -> np.ndarray:
    """The datasets chosen for positions ``start .. stop - 1``, one position at a time from ``counts`` (updated)."""
    chosen = np.empty(stop - start, np.int64)
    m = len(weights)
    for i in range(start, stop):
        t = i if i else 1.0
        best, top = 0, weights[0] * t - counts[0]
        for k in range(1, m):
            error = weights[k] * t - counts[k]
            if error > top:
                best, top = k, error
        chosen[i - start] = best
        counts[best] += 1
    return chosen


def blend_period(weights: Sequence[float]) -> int | None:
    """The common denominator of the weights read as short fractions, or None when it exceeds ``MAX_PERIOD``."""
    period = 1
    for w in weights:
        period = lcm(period, Fraction(w).limit_denominator(MAX_PERIOD).denominator)
        if period > MAX_PERIOD:
            return None
    return period


class GreedyBlend:
    """BlendedNanoset's ``dataset_index`` and ``dataset_sample_index`` (before the wrap at a dataset's size) for any
    positions, from normalized float64 ``weights`` in the order the stack lists its datasets."""

    def __init__(self, weights: Sequence[float]):
        if not weights:
            raise ValueError("a blend needs at least one dataset")
        self.weights = [float(w) for w in weights]
        self._w = np.asarray(self.weights, np.float64)
        self._starts: dict[int, np.ndarray] = {0: np.zeros(len(self.weights), np.int64)}
        self._blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self._guess: tuple[np.ndarray, int] | None = None

    def __repr__(self) -> str:
        return f"GreedyBlend({self.weights})"

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position, the dataset it goes to and that dataset's draw number (how many it had before)."""
        positions = np.asarray(positions, np.int64)
        if len(self.weights) == 1:
            return np.zeros(len(positions), np.int64), positions.copy()
        datasets = np.empty(len(positions), np.int64)
        draws = np.empty(len(positions), np.int64)
        blocks = positions // BLOCK
        for b in np.unique(blocks).tolist():
            here = np.flatnonzero(blocks == b)
            ids, numbers = self._block(b)
            offsets = positions[here] - b * BLOCK
            datasets[here], draws[here] = ids[offsets], numbers[offsets]
        return datasets, draws

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            cached = self._blocks.get(b)
            if cached is not None:
                self._blocks.move_to_end(b)
                return cached
            known = max(k for k in self._starts if k <= b)
            for k in range(known, b + 1):
                counts = self._starts[k]
                ids = self._resolve(k * BLOCK, (k + 1) * BLOCK, counts)
                onehot_counts = np.bincount(ids, minlength=len(self.weights))
                self._starts[k + 1] = counts + onehot_counts
            numbers = self._draw_numbers(ids, self._starts[b])
            self._blocks[b] = (ids, numbers)
            if len(self._blocks) > _KEPT_BLOCKS:
                self._blocks.popitem(last=False)
            return ids, numbers

    def _draw_numbers(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        onehot = np.zeros((len(ids), len(self.weights)), np.int64)
        onehot[np.arange(len(ids)), ids] = 1
        before = np.cumsum(onehot, axis=0) - onehot
        return counts[ids] + before[np.arange(len(ids)), ids]

    def _make_guess(self) -> tuple[np.ndarray, int] | None:
        period = blend_period(self.weights)
        if period is None:
            return None
        prefix = greedy_walk(self.weights, [0] * len(self.weights), 0, 2 * period)
        return prefix, period

    def _guess_for(self, start: int, stop: int) -> np.ndarray | None:
        if self._guess is None:
            self._guess = self._make_guess() or (np.zeros(0, np.int64), 0)
        prefix, period = self._guess
        if not period:
            return None
        positions = np.arange(start, stop)
        folded = np.where(positions < 2 * period, positions, period + (positions - 2 * period) % period)
        return prefix[folded]

    def _resolve(self, start: int, stop: int, counts: np.ndarray) -> np.ndarray:
        """The datasets chosen for positions ``start .. stop - 1`` from the counts at ``start``."""
        counts = counts.copy()
        if self._guess_for(0, 0) is None:
            return greedy_walk(self.weights, counts.tolist(), start, stop)
        out = np.empty(stop - start, np.int64)
        widest = max(64, _WINDOW_CELLS // len(self.weights))
        window, at = 1024, start
        while at < stop:
            end = min(stop, at + window)
            guess = self._guess_for(at, end)
            assert guess is not None
            onehot = np.zeros((end - at, len(self.weights)), np.int64)
            onehot[np.arange(end - at), guess] = 1
            before = counts + np.cumsum(onehot, axis=0) - onehot
            times = np.maximum(np.arange(at, end), 1).astype(np.float64)
            true = np.argmax(self._w[None, :] * times[:, None] - before, axis=1)
            wrong = np.flatnonzero(true != guess)
            good = end - at if not wrong.size else int(wrong[0]) + 1
            out[at - start : at - start + good] = true[:good]
            counts += np.bincount(true[:good], minlength=len(self.weights))
            at += good
            window = min(widest, window * 2) if not wrong.size else max(64, window // 4)
        return out
