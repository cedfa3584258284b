"""Batch-size schedule math (pure integers, hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix import BatchSchedule


@st.composite
def schedules(draw: st.DrawFn) -> BatchSchedule:
    gaps = draw(st.lists(st.integers(1, 40), max_size=5))
    sizes = draw(st.lists(st.integers(1, 64), min_size=len(gaps) + 1, max_size=len(gaps) + 1))
    starts = [0]
    for gap in gaps:
        starts.append(starts[-1] + gap)
    return BatchSchedule(tuple(zip(starts, sizes)))


@settings(max_examples=200, deadline=None)
@given(schedules(), st.integers(0, 300))
def test_offsets_are_the_batch_sizes_of_earlier_steps_summed(schedule, step):
    assert schedule.offset(step + 1) - schedule.offset(step) == schedule.batch_size(step)
    assert schedule.offset(step) == sum(schedule.batch_size(t) for t in range(step))
    assert schedule.batch_size(step) == [size for start, size in schedule.stages if start <= step][-1]


@settings(max_examples=200, deadline=None)
@given(schedules(), st.integers(0, 20_000))
def test_steps_within_counts_whole_batches(schedule, num_examples):
    k = schedule.steps_within(num_examples)
    assert schedule.offset(k) <= num_examples < schedule.offset(k + 1)


def test_far_steps_are_closed_form():
    schedule = BatchSchedule.of([[0, 32], [1000, 64], [5000, 128]])  # lists, as YAML gives them
    step = 10**15
    assert schedule.offset(step) == 1000 * 32 + 4000 * 64 + (step - 5000) * 128
    assert schedule.steps_within(schedule.offset(step) + 127) == step
    assert BatchSchedule.of(64).offset(step) == 64 * step


@pytest.mark.parametrize(
    "spec, message",
    [
        ([], "at least one"),
        ([(1, 8)], "first stage must start at step 0"),
        ([(0, 8), (5, 16), (5, 32)], "must increase, got 5 then 5"),
        ([(0, 8), (3, 0)], r"stage 1 \(from step 3\) has batch size 0"),
        ([(0, 8.0)], "stage 0 must be a pair of ints"),
        (0, "batch size 0"),
        ("64", "expected an int or a list"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        BatchSchedule.of(spec)
    assert str(info.value).startswith("batch_size")


def test_negative_steps_are_refused():
    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
        BatchSchedule.of(8).offset(-1)


def test_numpy_integer_steps_are_steps():
    ramp = BatchSchedule.of([(0, 8), (10, 16)])
    assert ramp.offset(np.int64(12)) == ramp.offset(12) == 80 + 32 and isinstance(ramp.offset(np.int32(12)), int)
    assert ramp.batch_size(np.uint8(10)) == 16
    with pytest.raises(ValueError, match="step must be an int"):
        ramp.offset(1.0)
