"""Offline blending: how many records each source gives, and which records are repeated. Pure index math, no I/O.

As NeMo Curator's ``blend_datasets(target_size, datasets, weights)``: weights are normalized and source ``i`` gives
exactly ``ceil(target_size * w_i)`` records (so the blend may hold a few more than ``target_size``). A source with
fewer records is repeated whole as often as fits, and the rest of its quota comes from a part of it; a source with
more gives a part. Which part: its first records (NeMo's rule), or, with a seed, a uniform sample without replacement,
so that a cut never favours the first shards.

A blended record keeps its place in its source; its copies are numbered in rounds: every record of the source once,
then again, ..., then the extra part. ``emitted_indices`` places each copy in the blended sequence, source after
source, which is the order the output takes unless it is shuffled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


def blend_counts(target_size: int, weights: list[float]) -> list[int]:
    """Records each source gives: ``ceil(target_size * w_i / sum(w))``, computed exactly (no float rounding)."""
    if target_size < 0:
        raise ValueError(f"blend.target_size must be >= 0, got {target_size}")
    if any(w < 0 or not math.isfinite(w) for w in weights):
        raise ValueError(f"blend.weights must be finite and >= 0, got {weights}")
    total = sum(Fraction(w) for w in weights)
    if total == 0:
        raise ValueError("blend.weights are all 0; give at least one source a positive weight")
    return [math.ceil(target_size * Fraction(w) / total) for w in weights]


@dataclass(frozen=True)
class SourcePlan:
    """What one source gives the blend: ``rounds`` whole copies of its ``count`` records, then ``extra`` (sorted
    record indices) once more; ``base`` is where its records start in the blended sequence."""

    count: int
    wanted: int
    rounds: int
    extra: np.ndarray
    base: int


def plan_sources(counts: list[int], wanted: list[int], seed: int | None) -> list[SourcePlan]:
    """The plan of every source, given how many records each has and how many the blend wants of it."""
    plans = []
    base = 0
    for index, (count, want) in enumerate(zip(counts, wanted, strict=True)):
        if count == 0 and want > 0:
            raise ValueError(f"source {index} has no records left to blend but its weight asks for {want}; give it weight 0 or check its filters")
        rounds, rest = divmod(want, count) if count else (0, 0)
        if seed is None:
            extra = np.arange(rest, dtype=np.int64)
        else:
            extra = np.sort(np.random.default_rng([seed, index]).choice(count, rest, replace=False)).astype(np.int64)
        plans.append(SourcePlan(count, want, rounds, extra, base))
        base += want
    return plans


def emitted_indices(plan: SourcePlan, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For records ``first .. first+n-1`` of a source: which of them are emitted (row offsets from ``first``, a row
    repeated once per copy) and where each copy lands in the blended sequence."""
    rows = np.arange(n, dtype=np.int64)
    ids = rows + first
    out_rows = [np.tile(rows, plan.rounds)]
    out_index = [plan.base + r * plan.count + ids for r in range(plan.rounds)]
    lo, hi = np.searchsorted(plan.extra, [first, first + n])
    if hi > lo:
        picked = plan.extra[lo:hi]
        out_rows.append(picked - first)
        out_index.append(plan.base + plan.rounds * plan.count + np.arange(lo, hi, dtype=np.int64))
    return np.concatenate(out_rows) if out_rows else rows[:0], np.concatenate(out_index) if out_index else rows[:0]
