"""The index math of curation (blend counts and copies, scatter buckets and orders), property-tested: no I/O."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix.curate import blend, scatter

weights_st = st.lists(st.floats(min_value=0.0, max_value=50.0, allow_nan=False), min_size=1, max_size=6).filter(lambda w: sum(w) > 0)


@given(st.integers(0, 10**7), weights_st)
def test_blend_counts_are_the_exact_ceiling_of_each_share(target, weights):
    counts = blend.blend_counts(target, weights)
    total = sum(Fraction(w) for w in weights)
    for count, w in zip(counts, weights, strict=True):
        share = target * Fraction(w) / total
        assert count == math.ceil(share) and count - 1 < share <= count
    assert target <= sum(counts) < target + len(weights)


def test_blend_counts_match_nemo_curators_worked_example():
    assert blend.blend_counts(1000, [5.0, 2.0, 1.0]) == [625, 250, 125]
    with pytest.raises(ValueError, match="all 0"):
        blend.blend_counts(10, [0.0, 0.0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=4), st.lists(st.integers(0, 200), min_size=4, max_size=4),
       st.one_of(st.none(), st.integers(0, 2**31)), st.data())
def test_blend_copies_fill_each_sources_range_exactly_whatever_the_shard_cuts(counts, wanted, seed, data):
    wanted = wanted[:len(counts)]
    plans = blend.plan_sources(counts, wanted, seed)
    positions = []
    for count, want, plan in zip(counts, wanted, plans, strict=True):
        cuts = sorted(data.draw(st.lists(st.integers(0, count), max_size=4)))
        bounds = [0, *cuts, count]
        copies = Counter()
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            rows, index = blend.emitted_indices(plan, lo, hi - lo)
            assert len(rows) == len(index)
            copies.update((rows + lo).tolist())
            positions += index.tolist()
        assert sum(copies.values()) == want
        rounds, extra = divmod(want, count)
        assert set(copies.values()) <= {rounds, rounds + 1} - ({0} if rounds == 0 else set())
        assert sum(1 for c in copies.values() if c == rounds + 1) == extra
        if seed is None:
            assert all(copies[r] == rounds + (1 if r < extra else 0) for r in range(count))
    assert sorted(positions) == list(range(sum(wanted)))


def test_a_source_with_nothing_left_cannot_be_asked_for_records():
    with pytest.raises(ValueError, match="weight 0"):
        blend.plan_sources([0], [3], None)


@given(st.integers(1, 5000), st.integers(1, 64))
def test_ordered_buckets_are_contiguous_and_balanced(total, partitions):
    buckets = scatter.ordered_buckets(np.arange(total), total, partitions)
    assert (np.diff(buckets) >= 0).all() and buckets.min() >= 0 and buckets.max() < partitions
    sizes = np.bincount(buckets, minlength=partitions)
    assert sizes.max() - sizes.min() <= 1


@given(st.integers(0, 2**40), st.integers(1, 97))
def test_shuffled_buckets_are_seeded_and_in_range(seed, buckets):
    indices = np.arange(3000)
    first = scatter.shuffled_buckets(indices, seed, buckets)
    assert (first == scatter.shuffled_buckets(indices, seed, buckets)).all()
    assert first.min() >= 0 and first.max() < buckets


def test_shuffled_buckets_are_uniform():
    counts = np.bincount(scatter.shuffled_buckets(np.arange(200_000), 11, 16), minlength=16)
    expected = 200_000 / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 40.0  # 15 degrees of freedom: p < 0.001 above 37.7


@given(st.integers(1, 40), st.integers(1, 8))
def test_every_bucket_belongs_to_exactly_one_partition(partitions, per):
    buckets = partitions * per
    owned = [b for p in range(partitions) for b in scatter.buckets_of_partition(p, partitions, buckets)]
    assert sorted(owned) == list(range(buckets))


@given(st.lists(st.integers(0, 10**9), unique=True, max_size=300), st.one_of(st.none(), st.integers(0, 2**31)), st.integers(0, 1000))
def test_a_bucket_order_is_a_permutation_independent_of_how_records_arrived(indices, seed, bucket):
    arr = np.array(indices, dtype=np.int64)
    order = scatter.bucket_order(arr, seed, bucket)
    assert sorted(order.tolist()) == list(range(len(arr)))
    shuffled = np.random.default_rng(0).permutation(len(arr))
    assert (arr[shuffled][scatter.bucket_order(arr[shuffled], seed, bucket)] == arr[order]).all()
    if seed is None:
        assert (np.diff(arr[order]) > 0).all()


@given(st.integers(0, 10**12), st.integers(1, 64), st.integers(1, 10**9))
def test_bucket_count_keeps_buckets_within_the_buffer(total_bytes, partitions, buffer):
    buckets = scatter.bucket_count(total_bytes, partitions, buffer)
    assert buckets % partitions == 0 and buckets >= partitions
    assert total_bytes / buckets <= buffer or buckets == partitions
    assert buckets == partitions or total_bytes / (buckets - partitions) > buffer
