"""Batch-size schedules: how many examples each training step takes, and where its rows start.

A schedule is a constant batch size or a ramp ``[(start_step, batch_size), ...]``. Step ``s`` reads the
global example indices ``offset(s) .. offset(s) + batch_size(s) - 1``; ``offset`` sums the batch sizes
of every earlier step in closed form per stage (O(log #stages), never O(step)), so resuming at any step
is immediate and a ramp neither skips nor repeats an example.
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchSchedule:
    """Batch sizes by step: stage ``i`` runs from ``stages[i][0]`` (a step) with batch size ``stages[i][1]``.

    The first stage starts at step 0, starts increase strictly, and every batch size is a positive int.
    """

    stages: tuple[tuple[int, int], ...]
    _starts: list[int] = field(init=False, repr=False, compare=False)
    _offsets: list[int] = field(init=False, repr=False, compare=False)
    """The global example index at which each stage starts."""

    def __post_init__(self) -> None:
        stages = tuple(self.stages)
        if not stages:
            raise ValueError("batch_size: a schedule needs at least one (start_step, batch_size) stage")
        for i, stage in enumerate(stages):
            if len(stage) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in stage):
                raise ValueError(f"batch_size: stage {i} must be a pair of ints (start_step, batch_size), got {stage!r}")
            if stage[1] <= 0:
                raise ValueError(f"batch_size: stage {i} (from step {stage[0]}) has batch size {stage[1]}; batch sizes must be positive")
        if stages[0][0] != 0:
            raise ValueError(f"batch_size: the first stage must start at step 0, not {stages[0][0]}")
        for (a, _), (b, _) in zip(stages, stages[1:]):
            if b <= a:
                raise ValueError(f"batch_size: stage start steps must increase, got {a} then {b}")
        object.__setattr__(self, "stages", stages)
        starts = [s for s, _ in stages]
        offsets = [0]
        for (start, size), nxt in zip(stages, starts[1:]):
            offsets.append(offsets[-1] + (nxt - start) * size)
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_offsets", offsets)

    @staticmethod
    def constant(batch_size: int) -> BatchSchedule:
        """Every step takes ``batch_size`` examples."""
        return BatchSchedule(((0, batch_size),))

    @staticmethod
    def of(spec: BatchSizeSpec) -> BatchSchedule:
        """A schedule from an int (constant), a schedule, or ``[(start_step, batch_size), ...]`` (a ramp)."""
        if isinstance(spec, BatchSchedule):
            return spec
        if isinstance(spec, int) and not isinstance(spec, bool):
            return BatchSchedule.constant(spec)
        if isinstance(spec, str | bytes) or not isinstance(spec, Sequence):
            raise ValueError(f"batch_size: expected an int or a list of (start_step, batch_size) pairs, got {spec!r}")
        return BatchSchedule(tuple(tuple(stage) for stage in spec))

    def _stage(self, step: int) -> int:
        if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        return bisect.bisect_right(self._starts, int(step)) - 1

    def batch_size(self, step: int) -> int:
        """The number of examples step ``step`` takes."""
        return self.stages[self._stage(step)][1]

    def offset(self, step: int) -> int:
        """The global example index of step ``step``'s first row: the batch sizes of steps 0..step-1 summed."""
        i = self._stage(step)
        start, size = self.stages[i]
        return self._offsets[i] + (int(step) - start) * size

    def steps_within(self, num_examples: int) -> int:
        """How many whole steps fit in the first ``num_examples`` examples (a finite dataset's last full batch)."""
        if num_examples < 0:
            raise ValueError(f"num_examples must be >= 0, got {num_examples}")
        i = bisect.bisect_right(self._offsets, num_examples) - 1
        start, size = self.stages[i]
        return start + (num_examples - self._offsets[i]) // size

    def max_batch_size(self) -> int:
        """The largest batch size any step takes."""
        return max(size for _, size in self.stages)


BatchSizeSpec = int | BatchSchedule | Sequence[tuple[int, int]]
"""What ``DataLoader`` accepts as a batch size: a constant, a schedule, or ``[(start_step, batch_size), ...]``."""
