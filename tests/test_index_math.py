"""Pure index math under hypothesis: the PRP, exact block counts, per-source orders, mixture layout."""

from __future__ import annotations

import copy
import hashlib
import heapq
import math
import pickle
import re
import tracemalloc
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tokenmix import Dataset, MixtureDataset, TokenBatch
from tokenmix.datasets import FeistelPermutation, Pending, SourceOrder
from tokenmix.datasets.base import as_indices
from tokenmix.datasets.block_shuffle import block_shuffled
from tokenmix.datasets.mixture import SourceUsage
from tokenmix.datasets.mixture_layout import _STATES_KEPT, NUMPY_FROM, BlockAllocator, exact_ratios, short_decimals, whole_block_counts
from tokenmix.datasets.segments import document_segments, window_cuts
from tokenmix.datasets.settings import BlockShuffle

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RangeDataset(Dataset):
    """n examples whose single token is their own index: lets tests see which example was read."""

    def __init__(self, n: int):
        self.n = n
        self.reads: list[np.ndarray] = []

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.n

    def final_len(self) -> int | None:
        return self.n

    tokens_per_example = 1

    def read(self, indices):
        idx = as_indices(indices)
        assert idx.size == 0 or idx.max() < self.n
        self.reads.append(idx)
        k = len(idx)
        tokens = idx.reshape(k, 1).astype(np.int32)
        return Pending(lambda: TokenBatch(tokens, np.zeros((k, 1), bool), np.zeros((k, 1), np.int32), np.zeros(k, np.int32)))


@SETTINGS
@given(n=st.integers(1, 5000), key=st.integers(0, 2**64 - 1))
def test_feistel_is_a_bijection_on_small_ranges(n, key):
    out = FeistelPermutation(n, key)(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))


@SETTINGS
@given(n=st.integers(1, 2**63), key=st.integers(0, 2**64 - 1), data=st.data())
def test_feistel_inverts_and_stays_in_range_up_to_2_to_the_63(n, key, data):
    xs = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50)), dtype=np.int64)
    perm = FeistelPermutation(n, key)
    ys = perm(xs)
    assert ys.min() >= 0 and ys.max() < n
    assert np.array_equal(perm.inverse(ys), xs)
    assert len(set(ys.tolist())) == len(set(xs.tolist()))


@SETTINGS
@given(sizes=st.lists(st.tuples(st.integers(1, 2**63), st.integers(0, 2**64 - 1)), min_size=1, max_size=12), data=st.data())
def test_many_permutations_applied_in_one_pass_equal_each_applied_alone(sizes, data):
    """A mixture resolves the full shuffles of all the sources of a block in one pass (``permute_many``)."""
    from tokenmix.datasets.permutation import permute_many

    perms = [FeistelPermutation(n, key) for n, key in sizes]
    which = np.array(data.draw(st.lists(st.integers(0, len(perms) - 1), min_size=1, max_size=60)), np.int64)
    xs = np.array([data.draw(st.integers(0, perms[w].n - 1)) for w in which.tolist()], np.int64)
    assert permute_many(perms, which, xs).tolist() == [perms[w](x) for w, x in zip(which.tolist(), xs.tolist())]


def test_feistel_keys_give_different_orders():
    orders = {tuple(FeistelPermutation(1000, key)(np.arange(1000)).tolist()) for key in range(20)}
    assert len(orders) == 20
    assert tuple(range(1000)) not in orders


weights_st = st.lists(st.one_of(st.just(0.0), st.just(1e-5), st.floats(1e-6, 1.0), st.integers(1, 10**6)), min_size=1, max_size=12).filter(
    lambda ws: sum(ws) > 0
)


def check_allocator(weights, block_size, blocks):
    alloc = BlockAllocator(weights, block_size)
    prev = np.zeros(len(weights), np.int64)
    for k in range(blocks + 1):
        counts = alloc.counts_after(k)
        assert counts.sum() == k * block_size
        targets = alloc.target(k)
        assert all(abs(int(c) - t) < 1 for c, t in zip(counts, targets)), (k, counts, [float(t) for t in targets])
        assert np.all(counts >= prev)
        prev = counts
    return alloc


@SETTINGS
@given(weights=weights_st, block_size=st.sampled_from([1, 2, 3, 7, 16, 64, 2048]), blocks=st.integers(1, 300))
def test_block_counts_are_exact_within_one_and_monotone(weights, block_size, blocks):
    check_allocator(weights, block_size, blocks)


@SETTINGS
@given(n_tiny=st.integers(1, 40), n_big=st.integers(0, 3), blocks=st.integers(100, 600))
def test_many_tiny_weights_are_never_rounded_away(n_tiny, n_big, blocks):
    weights = [1e-5] * n_tiny + [1.0] * n_big + [0.3]
    alloc = check_allocator(weights, 2048, blocks)
    total = alloc.counts_after(blocks)
    for i in range(n_tiny):  # 1e-5 of 2048 is 0.02 examples per block: one every 50 blocks
        assert total[i] >= blocks * 2048 * alloc.weights[i] - 1 + 1e-9
        assert total[i] >= 1 if blocks * 2048 * alloc.weights[i] >= 1 else True


@SETTINGS
@given(nums=st.lists(st.integers(0, 12), min_size=1, max_size=6).filter(lambda ns: sum(ns) > 0), den=st.integers(1, 40),
       block_size=st.sampled_from([1, 2, 3, 5, 8]))
def test_the_layout_repeats_with_its_period_and_stays_exact_across_periods(nums, den, block_size):
    weights = [Fraction(n, den) for n in nums]
    alloc = check_allocator(weights, block_size, 0)
    assert alloc.period <= 40 * 12 * 6
    check_allocator(weights, block_size, 3 * alloc.period + 2)
    period_counts = alloc.counts_after(alloc.period)
    assert [Fraction(int(c)) for c in period_counts] == alloc.target(alloc.period)


def test_tiny_decimal_weights_resolve_far_blocks_exactly():
    """Two 1e-5 sources at B=2048: the period is 3125 blocks, so block 5,000,000 needs no long walk."""
    alloc = BlockAllocator([1e-5, 1e-5, 0.99998], 2048)
    assert alloc.period == 3125
    for k in (5_000_000, 5_000_001, 10**12 + 7):
        before, after = alloc.counts_after(k), alloc.counts_after(k + 1)
        assert after.sum() - before.sum() == 2048 and np.all(after >= before)
        assert all(abs(int(c) - t) < 1 for c, t in zip(after, alloc.target(k + 1)))


def edf_walk_from_block_zero(alloc: BlockAllocator, blocks: list[int]) -> dict[int, list[int]]:
    """The tiny sources' counts after each of ``blocks``, handing out every tiny slot from block 0
    earliest-deadline-first: the definition the allocator's random access must agree with."""
    rates = [w * alloc.block_size for w in alloc.weights]
    tiny = [i for i, r in enumerate(rates) if 0 < r < 1]
    tiny_rate = sum(rates[i] for i in tiny)
    has_large = any(r >= 1 for r in rates)

    def group_slots(k):  # the group's total: its target rounded half up, or all of each block
        return math.floor(k * tiny_rate + Fraction(1, 2)) if has_large else k * alloc.block_size

    counts = [0] * len(tiny)
    pending: list[tuple[int, int]] = []  # (deadline, source) of each released job not yet served
    released = [0] * len(tiny)
    out = {}
    for k in range(1, max(blocks) + 1):
        for t, i in enumerate(tiny):
            while Fraction(k) * rates[i] > released[t]:  # job j is released once the target passes j - 1
                released[t] += 1
                heapq.heappush(pending, (math.ceil(released[t] / rates[i]), t))
        for _ in range(group_slots(k) - group_slots(k - 1)):
            deadline, t = heapq.heappop(pending)
            assert deadline >= k
            counts[t] += 1
        if k in blocks:
            out[k] = list(counts)
    return out


tiny_rate_st = st.builds(Fraction, st.integers(1, 30), st.integers(31, 120))


@settings(SETTINGS, max_examples=200)
@given(tiny=st.lists(tiny_rate_st, min_size=2, max_size=12), large=st.lists(st.integers(1, 4), max_size=3),
       block_size=st.sampled_from([1, 2, 3, 8]), data=st.data())
def test_random_access_to_far_blocks_matches_the_walk_from_block_zero(tiny, large, block_size, data):
    """Far blocks start from a guessed state ``memory`` blocks back; they must land on the true state."""
    alloc = BlockAllocator(tiny + large, block_size)
    if not alloc.memory:
        return
    blocks = data.draw(st.lists(st.integers(alloc.memory + 1, 6 * alloc.memory + 10), min_size=1, max_size=4, unique=True))
    truth = edf_walk_from_block_zero(alloc, blocks)
    tiny_ids = [i for i, w in enumerate(alloc.weights) if 0 < w * block_size < 1]
    for k in blocks:  # in the drawn (random) order, on one allocator
        assert alloc.counts_after(k)[tiny_ids].tolist() == truth[k], k


def test_a_wrong_guess_still_lands_on_the_true_state():
    weights = [Fraction(4, 55), Fraction(3, 76), Fraction(9, 59), Fraction(27, 50), Fraction(35, 48), Fraction(37, 60)]
    blocks = [79, 80, 94, 103, 104]
    truth = edf_walk_from_block_zero(BlockAllocator(weights, 1), blocks + [k - 55 for k in blocks])
    for k in blocks:
        alloc = BlockAllocator(weights, 1)
        assert alloc.memory == 55
        assert alloc._guess(k - 55) != truth[k - 55]  # the walk starts from a state that is not the true one
        assert alloc.counts_after(k).tolist() == truth[k]


class _WalkLog(BlockAllocator):
    """A ``BlockAllocator`` that notes the slots each earliest-deadline walk hands out (the work a read costs, counted),
    and refuses, before it starts, a walk longer than ``memory`` blocks (give or take the rounding of the group's
    slots): random access never needs one."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.walked: list[int] = []

    def _walk(self, done: int, counts: list[int], slots: int, exact: bool) -> list[int]:
        self.walked.append(slots - done)
        assert slots - done <= self.worst_walk + 1, f"a walk of {slots - done} slots, from slot {done}; worst_walk is {self.worst_walk}"
        return super()._walk(done, counts, slots, exact)


def test_random_access_keeps_a_bounded_number_of_states():
    alloc = _WalkLog((10.0 ** np.random.default_rng(1).uniform(-5, -1, 300)).tolist(), 2048)
    for k in range(0, 3000, 7):
        alloc.counts_after(k)
    assert len(alloc._tiny_states) <= _STATES_KEPT
    alloc.walked.clear()
    far = alloc.counts_after(10**15)
    assert len(alloc.walked) == 1  # one walk of at most `memory` blocks, not 10**15
    assert far.sum() == 10**15 * 2048
    assert all(abs(int(c) - t) < 1 for c, t in zip(far, alloc.target(10**15)))


def test_reads_inside_a_walked_region_start_from_a_nearby_state():
    alloc = BlockAllocator([0.3, 0.7, 5e-9] + [1e-4] * 100, 2048)
    alloc.counts_after(alloc.memory - 1)  # one walk from block 0, checkpointed on the way
    for k in np.random.default_rng(0).integers(1, alloc.memory - 1, 20).tolist():
        slots = alloc.tiny_slots(k)
        nearest = max(s for s in alloc._tiny_states if s <= slots)
        assert slots - nearest <= alloc._checkpoint_every
        alloc.counts_after(k)


def test_a_used_allocator_and_mixture_pickle_and_copy():
    alloc = BlockAllocator([0.5, 0.5 - 2e-4, 1e-4, 1e-4], 2048)
    before = alloc.counts_after(12345)
    again = pickle.loads(pickle.dumps(alloc))
    assert np.array_equal(again.counts_after(12345), before) and np.array_equal(copy.deepcopy(alloc).counts_after(999), alloc.counts_after(999))
    mix = MixtureDataset({"a": RangeDataset(100), "b": RangeDataset(100)}, {"a": 0.9999, "b": 1e-4})
    assert np.array_equal(pickle.loads(pickle.dumps(mix)).locate(np.arange(5000))[0], mix.locate(np.arange(5000))[0])


def test_a_weight_too_small_for_cheap_random_access_is_named(caplog):
    sources = {name: RangeDataset(1000) for name in ("web", "code", "rare", "tiny")}
    with caplog.at_level("WARNING", logger="tokenmix.datasets.mixture"):
        MixtureDataset(sources, {"web": 0.6, "code": 0.4, "rare": 1e-5, "tiny": 1e-5})
        assert not caplog.records
        MixtureDataset(sources, {"web": 0.6, "code": 0.4, "rare": 0.0003, "tiny": 3.3e-17}, block_size=2048)
    assert "'tiny' (weight 3.3e-17)" in caplog.text and "Raise that weight" in caplog.text


def test_levanter_truncation_case_keeps_the_small_source():
    alloc = check_allocator([1e-5, 1 - 1e-5], 2048, 1000)
    assert alloc.counts_after(1000)[0] in (20, 21)  # 1000 * 2048 * 1e-5 = 20.48; Levanter's floor per block gives 0


@SETTINGS
@given(n=st.integers(1, 300), key=st.integers(0, 2**32), shuffle=st.one_of(st.booleans(), st.integers(1, 50)), epochs=st.integers(1, 4))
def test_each_epoch_reads_every_example_once_in_a_fresh_order(n, key, shuffle, epochs):
    order = SourceOrder(n, key, shuffle)
    per_epoch = [order(np.arange(e * n, (e + 1) * n)) for e in range(epochs)]
    for e, got in enumerate(per_epoch):
        assert np.array_equal(np.sort(got), np.arange(n))
        assert np.all(order.epoch(np.arange(e * n, (e + 1) * n)) == e)
        if isinstance(shuffle, int) and not isinstance(shuffle, bool):
            assert np.array_equal(got // shuffle, np.arange(n) // shuffle)  # eras stay in place
    if shuffle is True and n >= 8 and epochs >= 2:
        assert not np.array_equal(per_epoch[0], per_epoch[1])
    if shuffle is False:
        assert all(np.array_equal(p, np.arange(n)) for p in per_epoch)


def mixture(sizes, weights, **kw):
    return MixtureDataset({name: RangeDataset(n) for name, n in sizes.items()}, weights, **kw)


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), -0.5, float("-inf"), np.float64("inf")])
def test_a_weight_that_is_not_a_finite_number_at_least_0_is_refused_naming_source_stage_and_value(weight):
    with pytest.raises(ValueError, match=re.escape(f"train_weights: source 'b' has weight {weight!r}; give it a finite number >= 0")):
        mixture({"a": 10, "b": 10}, {"a": 1.0, "b": weight})
    staged = mixture({"a": 10, "b": 10}, [(0, {"a": 1.0, "b": 1.0}), (64, {"a": 1.0, "b": weight})], block_size=16)
    staged.get_batch(np.arange(64))  # a later stage is checked when a read first reaches it
    with pytest.raises(ValueError, match=re.escape(f"train_weights (the stage from index 64): source 'b' has weight {weight!r}")):
        staged.get_batch(np.arange(60, 68))
    with pytest.raises(ValueError, match="mixture weights must be finite numbers >= 0"):
        BlockAllocator([1.0, weight], 16)


def test_numpy_weights_are_the_numbers_they_print_as():
    assert BlockAllocator([np.float64(0.3), np.float32(0.5), np.int64(2)], 10).weights == [Fraction(3, 28), Fraction(5, 28), Fraction(20, 28)]
    as_numpy, as_python = (mixture({"a": 10, "b": 10}, {"a": kind(0.3), "b": kind(0.7)}) for kind in (np.float64, float))
    assert np.array_equal(as_numpy.locate(np.arange(5000))[0], as_python.locate(np.arange(5000))[0])


schedule_st = st.lists(st.dictionaries(st.sampled_from("abc"), st.one_of(st.just(1e-5), st.floats(0.0, 1.0)), min_size=1), min_size=1, max_size=3)


@SETTINGS
@given(stage_weights=schedule_st, gaps=st.lists(st.integers(1, 700), min_size=2, max_size=2), block=st.sampled_from([4, 32, 100]),
       seed=st.integers(0, 100), n=st.integers(50, 1500))
def test_sources_are_drawn_in_order_without_gaps_or_repeats_across_stages(stage_weights, gaps, block, seed, n):
    stage_weights = [w for w in stage_weights if sum(w.values()) > 0] or [{"a": 1.0}]
    starts = [0] + list(np.cumsum(gaps[: len(stage_weights) - 1]))
    schedule = list(zip(starts, stage_weights))
    mix = mixture({"a": 37, "b": 5, "c": 200}, schedule, block_size=block, seed=seed)
    ids, draws = mix.locate(np.arange(n))
    for sid, name in enumerate(mix.names):
        got = draws[ids == sid]
        assert np.array_equal(got, np.arange(len(got))), name  # every draw once, in order
        assert mix.consumed(n)[name] == len(got)
    for j, (start, weights) in enumerate(schedule):  # inside a stage, whole blocks are exact
        end = schedule[j + 1][0] if j + 1 < len(schedule) else n
        whole = (min(end, n) - start) // block
        if whole <= 0:
            continue
        span_ids = ids[start : start + whole * block]
        total = sum(weights.values())
        for sid, name in enumerate(mix.names):
            expected = whole * block * weights.get(name, 0.0) / total
            assert abs(int(np.sum(span_ids == sid)) - expected) < 1 + 1e-9


def test_examples_come_from_each_source_in_its_permuted_order_without_repeats():
    sizes = {"a": 50, "b": 120, "c": 7}
    mix = mixture(sizes, {"a": 0.5, "b": 0.3, "c": 0.2}, block_size=16, seed=3)
    batch = mix.get_batch(np.arange(1000))
    for sid, name in enumerate(mix.names):
        seen = batch.tokens[batch.source_ids == sid, 0]
        n = sizes[name]
        epochs = [seen[e * n : (e + 1) * n] for e in range(len(seen) // n)]
        assert len(epochs) >= 2
        for e in epochs:
            assert np.array_equal(np.sort(e), np.arange(n))
        assert not np.array_equal(epochs[0], epochs[1])
    assert set(np.unique(mix.epoch_of(np.arange(1000))).tolist()) >= {0, 1, 2}


def test_same_seed_same_examples_and_different_seed_different():
    def draw(seed):
        return mixture({"a": 500, "b": 900}, {"a": 0.4, "b": 0.6}, seed=seed, block_size=64).get_batch(np.arange(300))

    one, again, other = draw(1), draw(1), draw(2)
    assert np.array_equal(one.tokens, again.tokens) and np.array_equal(one.source_ids, again.source_ids)
    assert not np.array_equal(one.tokens, other.tokens)


@SETTINGS
@given(seed=st.integers(0, 50), block=st.sampled_from([8, 64, 100]), start=st.integers(0, 5000), size=st.integers(1, 300))
def test_whole_block_resolution_matches_resolving_each_index(seed, block, start, size):
    """Reads resolve whole blocks once every source's order is final: the examples must be the ones
    the per-index path (locate, then each source's order) gives."""
    mix = mixture({"a": 37, "b": 5, "c": 200}, [(0, {"a": 0.5, "b": 0.2, "c": 0.3}), (700, {"a": 1e-3, "c": 1.0})], block_size=block, seed=seed)
    idx = np.arange(start, start + size)
    cold = mix.get_batch(idx)  # the sources' orders are not known yet: per-index path
    for name in mix.names:
        mix.source(name).examples([0])
    assert all(mix.source(name).has_final_order() for name in mix.names)
    warm = mix.get_batch(idx)  # whole blocks
    ids, draws = mix.locate(idx)
    expected = np.empty(size, np.int64)
    for sid, name in enumerate(mix.names):
        mine = ids == sid
        if mine.any():
            expected[mine] = mix.source(name).examples(draws[mine])
    for batch in (cold, warm):
        assert np.array_equal(batch.source_ids, ids) and np.array_equal(batch.tokens[:, 0], expected)


def per_source_reads(mix, name, n):
    batch = mix.get_batch(np.arange(n))
    return batch.tokens[batch.source_ids == mix.names.index(name), 0]


def test_reordering_sources_changes_nothing_and_renaming_one_leaves_the_others():
    weights = {"web": 0.5, "code": 0.3, "books": 0.2}
    sizes = {"web": 400, "code": 300, "books": 200}
    base = mixture(sizes, weights, seed=5, block_size=32)
    reordered = mixture(dict(reversed(list(sizes.items()))), dict(reversed(list(weights.items()))), seed=5, block_size=32)
    for name in sizes:
        assert np.array_equal(per_source_reads(base, name, 2000), per_source_reads(reordered, name, 2000))
    renamed = mixture({"web": 400, "code": 300, "novels": 200}, {"web": 0.5, "code": 0.3, "novels": 0.2}, seed=5, block_size=32)
    for name in ("web", "code"):
        a, b = per_source_reads(base, name, 2000), per_source_reads(renamed, name, 2000)
        k = min(len(a), len(b))
        assert k > 500 and np.array_equal(a[:k], b[:k])


@pytest.mark.parametrize("strategy", ["first_exhausted", "all_exhausted"])
def test_stop_strategies_end_where_a_source_or_every_source_runs_out(strategy):
    sizes = {"a": 100, "b": 1000, "c": 30}
    mix = mixture(sizes, {"a": 0.2, "b": 0.7, "c": 0.1}, block_size=16, stop_strategy=strategy)
    n = len(mix)
    at, after = mix.consumed(n), mix.consumed(n + 1)
    if strategy == "first_exhausted":
        assert all(at[k] <= sizes[k] for k in sizes) and any(after[k] > sizes[k] for k in sizes)
    else:
        before = mix.consumed(n - 1)
        assert all(at[k] >= sizes[k] for k in sizes) and any(before[k] < sizes[k] for k in sizes)
    with pytest.raises(IndexError):
        mix.get_batch([n])
    assert len(mix.get_batch([n - 1])) == 1


def test_all_exhausted_refuses_a_source_dropped_before_it_is_read_through():
    mix = mixture({"a": 100, "b": 100}, [(0, {"a": 1.0, "b": 1.0}), (40, {"a": 1.0})], block_size=8, stop_strategy="all_exhausted")
    with pytest.raises(ValueError, match="'b' has weight 0 in the last stage .*never end: give it a weight above 0 in that stage"):
        len(mix)


def test_all_exhausted_over_sources_that_are_all_empty_has_no_example():
    mix = mixture({"a": 0, "b": 0}, {"a": 1.0, "b": 2.0}, block_size=8, stop_strategy="all_exhausted")
    assert len(mix) == 0
    with pytest.raises(IndexError, match="beyond its 0 examples"):
        mix.get_batch([0])


def test_all_exhausted_refuses_appending_a_stage_that_drops_a_source_before_it_is_read_through_and_reads_on_unchanged():
    mix = mixture({"a": 100, "b": 100}, {"a": 1.0, "b": 1.0}, block_size=8, stop_strategy="all_exhausted")
    before, n = mix.get_batch(np.arange(64)).tokens, len(mix)
    with pytest.raises(ValueError, match="'b' has weight 0 in the last stage and only 20 of its 100 examples are drawn before it, so the mixture "
                       "would never end: .* use stop_strategy first_exhausted or restart"):
        mix.append_stage(40, {"a": 1.0})
    assert len(mix.stages) == 1 and len(mix) == n
    assert np.array_equal(mix.get_batch(np.arange(64)).tokens, before)
    mix.append_stage(48, {"a": 1.0, "b": 3.0})  # a stage that reads b through is taken
    assert len(mix.stages) == 2 and mix.consumed(len(mix))["b"] >= 100


def test_usage_reports_examples_tokens_and_epochs():
    mix = mixture({"a": 10, "b": 1000}, {"a": 0.5, "b": 0.5}, block_size=10)
    usage = mix.usage(100)
    assert usage["a"].examples == 50 and usage["a"].epoch == 5 and usage["a"].tokens == 50
    assert usage["b"].examples == 50 and usage["b"].epoch == 0 and usage["b"].epochs_completed == 0.05


@pytest.mark.timeout(60)  # the count used to walk back from stage -1 forever
@pytest.mark.parametrize("count", ["consumed", "usage"])
def test_a_negative_number_of_examples_is_refused_naming_it(count):
    mix = mixture({"a": 10, "b": 10}, [(0, {"a": 1.0, "b": 1.0}), (16, {"a": 1.0})], block_size=8)
    with pytest.raises(ValueError, match="num_examples must be >= 0, got -1"):
        getattr(mix, count)(-1)
    assert mix.consumed(0) == {"a": 0, "b": 0}


def test_drawing_from_an_empty_source_names_it_and_the_fix():
    mix = mixture({"a": 0, "b": 10}, {"a": 1.0, "b": 1.0}, block_size=4)
    with pytest.raises(IndexError, match=r"RangeDataset.* is empty: it has no example of 1 tokens to draw; give its source weight 0"):
        mix.get_batch(np.arange(8))


def test_usage_of_an_empty_source_is_zero_examples_and_epochs():
    mix = mixture({"a": 0, "b": 10}, {"a": 1.0, "b": 1.0}, block_size=4, stop_strategy="first_exhausted")
    assert len(mix) == 0
    usage = mix.usage(0)
    assert usage["a"] == SourceUsage(0, 0, 0, 0.0) and usage["b"] == SourceUsage(0, 0, 0, 0.0)


def test_a_thousand_huge_sources_start_in_constant_memory():
    sizes = {f"source{i:04d}": 10**10 for i in range(1000)}
    rng = np.random.default_rng(0)
    weights = dict(zip(sizes, (rng.random(1000) + 0.5).tolist()))
    datasets = {name: RangeDataset(n) for name, n in sizes.items()}
    tracemalloc.start()
    try:
        mix = MixtureDataset(datasets, weights)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a few KiB a source (its name, weight and rates; 0.4 MiB traced in all here), where an array over a source's
    # examples would take 80 GB: the benchmark reports the time it takes
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB traced"
    ids, draws = mix.locate(np.arange(10**12, 10**12 + 4096))
    assert len(np.unique(ids)) > 500 and draws.max() < 10**10


@SETTINGS
@given(data=st.data(), length=st.integers(2, 40), total=st.integers(1, 400))
def test_document_segments_match_a_per_token_count(data, length, total):
    doc_starts = np.unique(np.array([0] + data.draw(st.lists(st.integers(0, total - 1), max_size=60)), np.int64))
    starts = np.array(data.draw(st.lists(st.integers(0, max(0, total - length)), max_size=10)), np.int64)
    segment_ids, loss_mask = document_segments(starts, length, doc_starts)
    assert segment_ids.shape == loss_mask.shape == (len(starts), length)
    for row, start in enumerate(starts):
        doc = np.searchsorted(doc_starts, np.arange(start, start + length), side="right")
        assert np.array_equal(segment_ids[row], doc - doc[0])
        assert np.array_equal(loss_mask[row], np.append(doc[1:] == doc[:-1], False))


@SETTINGS
@given(data=st.data(), length=st.integers(2, 30), n=st.integers(1, 12))
def test_documents_added_by_several_readers_settle_as_each_would_alone(data, length, n):
    """Rows of one batch added by several readers (disjoint rows, some rows left to others) are filled in one pass
    exactly as ``document_segments`` fills each reader's windows, a reader's ``trained`` mask is applied to its rows,
    and rows nobody added are untouched."""
    total = 200
    batch = TokenBatch.empty(n, length)
    batch.segment_ids[...] = 7
    batch.loss_mask[...] = True
    owner = np.array(data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n)))  # -1: a row nobody adds
    want_ids, want_mask = batch.segment_ids.copy(), batch.loss_mask.copy()
    for reader in range(3):
        rows = np.flatnonzero(owner == reader)
        if not len(rows):
            continue
        doc_starts = np.unique(np.array([0] + data.draw(st.lists(st.integers(0, total - 1), max_size=40)), np.int64))
        starts = np.array(data.draw(st.lists(st.integers(0, total - length), min_size=len(rows), max_size=len(rows))), np.int64)
        trained = None if reader == 0 else np.array(data.draw(st.lists(st.booleans(), min_size=len(rows) * length,
                                                                        max_size=len(rows) * length))).reshape(len(rows), length)
        batch.add_documents(rows, *window_cuts(starts, length, doc_starts), trained)
        ids, mask = document_segments(starts, length, doc_starts)
        want_ids[rows], want_mask[rows] = ids, mask if trained is None else mask & trained
    batch.settle_documents()
    assert np.array_equal(batch.segment_ids, want_ids)
    assert np.array_equal(batch.loss_mask, want_mask)


@SETTINGS
@given(start=st.integers(0, 10**6), count=st.integers(1, 300), block=st.sampled_from([16, 64, 256]))
def test_a_batch_inside_one_block_locates_as_the_general_grouping_does(start, count, block):
    """Indices inside one block take a shortcut; adding a far index forces the grouping by stage and block."""
    mix = MixtureDataset({"a": RangeDataset(10**9), "b": RangeDataset(10**9), "c": RangeDataset(10**9)},
                         [(0, {"a": 0.5, "b": 0.3, "c": 0.2}), (4096, {"a": 0.1, "b": 0.1, "c": 0.8})], block_size=block)
    idx = np.arange(start, start + count)
    far = np.append(idx, start + 10**7)
    ids, draws = mix.locate(idx)
    all_ids, all_draws = mix.locate(far)
    assert np.array_equal(ids, all_ids[:-1]) and np.array_equal(draws, all_draws[:-1])


@given(st.integers(1, 3000), st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**32))
@settings(max_examples=100, deadline=None)
def test_block_shuffle_is_a_bijection_that_reads_whole_blocks_per_window_and_keeps_the_tail_last(length, block, window, key):
    shape = BlockShuffle(block, window)
    order = block_shuffled(np.arange(length), length, shape, key)
    assert sorted(order.tolist()) == list(range(length))
    full, tail = divmod(length, block)
    in_body = order < full * block
    windows = np.arange(length)[in_body] // (block * window)
    _, counts = np.unique(np.stack([windows, order[in_body] // block]), axis=1, return_counts=True)
    assert (counts == block).all()  # each window reads whole full blocks, nothing split
    if tail:
        assert sorted(order[full * block :].tolist()) == list(range(full * block, length))
    again = block_shuffled(np.arange(length)[::-1], length, shape, key)
    assert np.array_equal(again, order[::-1])  # a per-index function: any subset of positions, any order


weights_st = st.dictionaries(st.sampled_from("abc"), st.one_of(st.just(1e-3), st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])), min_size=1)


@SETTINGS
@given(first=weights_st, later=st.lists(weights_st, min_size=1, max_size=3), block=st.sampled_from([4, 32, 100]), seed=st.integers(0, 100),
       after=st.lists(st.integers(0, 400), min_size=3, max_size=3), n=st.integers(200, 1500))
def test_a_stage_appended_after_reads_keeps_them_and_draws_on_without_gaps_or_repeats(first, later, block, seed, after, n):
    """The weight log grown while the mixture is read is the mixture built with the whole log: a batch is a pure
    function of (seed, index, log), and every source's draws run 0, 1, 2, ... across the appended stages."""
    later = [w for w in later if sum(w.values()) > 0] or [{"b": 1.0}]
    first = first if sum(first.values()) > 0 else {"a": 1.0}
    sizes = {"a": 37, "b": 5, "c": 200}
    grown = mixture(sizes, first, block_size=block, seed=seed)
    read = 0
    for weights, gap in zip(later, after):
        before = grown.get_batch(np.arange(read + gap + 1))  # what a loader read ahead up to index read + gap
        start = grown.next_boundary(read + gap + 1)
        assert (start - grown.stages[-1][0]) % block == 0 and start > grown.stages[-1][0] and start >= read + gap + 1
        grown.append_stage(start, weights)
        again = grown.get_batch(np.arange(read + gap + 1))
        assert np.array_equal(before.tokens, again.tokens) and np.array_equal(before.source_ids, again.source_ids)
        read = start
    whole = mixture(sizes, grown.stages, block_size=block, seed=seed)
    end = max(n, read + block)
    ids, draws = grown.locate(np.arange(end))
    assert np.array_equal(ids, whole.locate(np.arange(end))[0]) and np.array_equal(draws, whole.locate(np.arange(end))[1])
    assert np.array_equal(grown.get_batch(np.arange(end)).tokens, whole.get_batch(np.arange(end)).tokens)
    for sid, name in enumerate(grown.names):
        got = draws[ids == sid]
        assert np.array_equal(got, np.arange(len(got))), name


def test_next_boundary_is_the_first_block_start_of_the_last_stage_after_it_and_at_or_after_the_index():
    mix = mixture({"a": 10, "b": 10}, [(0, {"a": 1.0}), (70, {"b": 1.0})], block_size=16)
    assert [mix.next_boundary(i) for i in (0, 70, 71, 86, 87, 102, 103)] == [86, 86, 86, 86, 102, 102, 118]


def test_an_appended_stage_is_refused_when_it_is_not_after_the_last_names_an_unknown_source_or_is_never_read():
    mix = mixture({"a": 10, "b": 10}, [(0, {"a": 1.0}), (64, {"b": 1.0})], block_size=16)
    with pytest.raises(ValueError, match="stage starts must increase, got index 64 then 64"):
        mix.append_stage(64, {"a": 1.0})
    with pytest.raises(ValueError, match=re.escape("train_weights (the stage from index 80): unknown source(s) ['z']; the sources are ['a', 'b']")):
        mix.append_stage(80, {"z": 1.0})
    assert len(mix.stages) == 2
    finite = mixture({"a": 10, "b": 10}, {"a": 1.0, "b": 1.0}, block_size=4, stop_strategy="first_exhausted")
    with pytest.raises(ValueError, match="a stage from index 20 would never be read: the mixture ends at index 20"):
        finite.append_stage(20, {"a": 1.0})
    finite.append_stage(12, {"b": 1.0})
    assert len(finite) == 16  # b has 10 examples: 6 in the first 12 indices, then 4 more


def test_a_source_first_weighted_by_an_appended_stage_starts_at_its_first_draw():
    mix = mixture({"a": 10, "b": 10}, {"a": 1.0}, block_size=8)
    mix.append_stage(16, {"a": 1.0, "b": 1.0})
    ids, draws = mix.locate(np.arange(32))
    b = mix.names.index("b")
    assert not np.any(ids[:16] == b) and draws[ids == b].tolist() == list(range(8))
    batch = mix.get_batch(np.arange(16, 32))
    assert len(set(batch.tokens[batch.source_ids == b, 0].tolist())) == 8  # its first epoch: no example twice


def long_log(stages: int, seed: int, names: str = "abcd") -> tuple[list[tuple[int, dict[str, float]]], int]:
    """``stages`` stages of weights from {0, 1e-3, 0.1, 0.25, 0.5, 1}, each 1 to 59 indices long (most stages start
    inside a block of the one before), and the last stage's start."""
    rng = np.random.default_rng(seed)
    log, start = [], 0
    for _ in range(stages):
        weights = {n: float(rng.choice([0.0, 1e-3, 0.1, 0.25, 0.5, 1.0])) for n in names}
        if sum(weights.values()) == 0:
            weights[names[0]] = 1.0
        log.append((start, weights))
        start += int(rng.integers(1, 60))
    return log, start


def test_a_long_log_read_in_any_order_gives_the_layout_of_every_stage_built_at_once():
    """300 stages, more than a mixture keeps built: reads that start far into the log, in a scrambled order, give
    the draws the mixture gave when it built every stage and its base counts at construction (the digests are that
    code's, commit 0cdd5e1)."""
    log, last = long_log(300, 38)
    sizes = {"a": 37, "b": 5, "c": 200, "d": 1000}
    end = last + 100
    chunks = np.array_split(np.arange(end), 97)
    scrambled = mixture(sizes, log, block_size=16, seed=7)
    ids, draws = np.empty(end, np.int64), np.empty(end, np.int64)
    for k in [96, *np.random.default_rng(1).permutation(96).tolist()]:
        ids[chunks[k]], draws[chunks[k]] = scrambled.locate(chunks[k])
    assert hashlib.sha256(ids.tobytes() + draws.tobytes()).hexdigest() == "fc18d1fa3ccba61f61dd5ed6e74b50a6123d3b5fafe222e6d9608e31ff905706"
    batch = mixture(sizes, log, block_size=16, seed=7).get_batch(np.arange(end))
    assert hashlib.sha256(batch.tokens.tobytes() + batch.source_ids.tobytes()).hexdigest() == (
        "ca4b6a2d05abd9c00047d305684a3acc5ef264a8569c04113b412c7dc6ee2ac6")


def test_a_long_log_of_whole_blocks_counted_in_closed_form_gives_the_layout_of_every_stage_built_at_once():
    """300 stages of whole blocks over 3 sources that each get an example a block or more (an online run's log): their
    base counts come from ``whole_block_counts``, all at once; the digest is the eager code's (commit 0cdd5e1)."""
    rng = np.random.default_rng(39)
    log, start = [], 0
    for _ in range(300):
        log.append((start, {n: int(rng.integers(1, 10**4)) / 10**4 for n in "abc"}))
        start += 16 * int(rng.integers(1, 5))
    mix = mixture({"a": 37, "b": 5, "c": 200}, log, block_size=16, seed=7)
    ids, draws = mix.locate(np.arange(start + 100))
    assert hashlib.sha256(ids.astype(np.int64).tobytes() + draws.tobytes()).hexdigest() == (
        "e49387003963c0f0f456f0d457a0e08a0d850d29068fcff97c6c18a98b492781")


@SETTINGS
@given(rows=st.lists(st.lists(st.integers(0, 10**4), min_size=1, max_size=6), min_size=1, max_size=8),
       block=st.sampled_from([1, 16, 2048]), data=st.data())
def test_whole_block_counts_are_the_allocators_counts_and_hold_wherever_no_source_is_tiny(rows, block, data):
    width = max(len(r) for r in rows)
    units = np.array([[*r, *[0] * (width - len(r))] for r in rows])
    units[units.sum(axis=1) == 0, 0] = 1
    blocks = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=len(units), max_size=len(units))))
    counts, ok = whole_block_counts(units, blocks, block)
    for row, k, got, holds in zip(units.tolist(), blocks.tolist(), counts.tolist(), ok.tolist()):
        assert holds == all(u == 0 or block * u >= sum(row) for u in row)
        if holds:
            assert got == BlockAllocator([u / 10**4 for u in row], block).counts_after(k).tolist()


@settings(SETTINGS, max_examples=20)
@given(stages=st.integers(60, 200), log_seed=st.integers(0, 10**6), block=st.sampled_from([4, 16, 50]), seed=st.integers(0, 100),
       order_seed=st.integers(0, 10**6))
def test_reads_of_a_long_log_in_any_order_draw_every_sources_examples_in_order_once(stages, log_seed, block, seed, order_seed):
    log, last = long_log(stages, log_seed, "abc")
    sizes = {"a": 37, "b": 5, "c": 200}
    end = last + block
    in_order = mixture(sizes, log, block_size=block, seed=seed)
    ids, draws = in_order.locate(np.arange(end))
    for sid, name in enumerate(in_order.names):
        got = draws[ids == sid]
        assert np.array_equal(got, np.arange(len(got))), name
    assert in_order.consumed(end) == {name: int(np.sum(ids == sid)) for sid, name in enumerate(in_order.names)}
    scrambled = mixture(sizes, log, block_size=block, seed=seed)
    chunks = np.array_split(np.arange(end), 40)
    for k in np.random.default_rng(order_seed).permutation(len(chunks)).tolist():
        got_ids, got_draws = scrambled.locate(chunks[k])
        assert np.array_equal(got_ids, ids[chunks[k]]) and np.array_equal(got_draws, draws[chunks[k]])


def test_a_mixture_built_from_a_long_log_over_many_sources_costs_little_until_read():
    """1,000 stages over 1,000 sources: construction keeps the log as given, and a stage is built only when read (the
    mixture that built every stage at construction traced 141 MiB here)."""
    names = [f"s{i:04d}" for i in range(1000)]
    sources = {n: RangeDataset(10**6) for n in names}
    rng = np.random.default_rng(0)
    distinct = [{n: int(u) / 10_000 for n, u in zip(names, rng.integers(1, 20, len(names)))} for _ in range(3)]
    log = [(i * 2048, distinct[i % 3]) for i in range(1000)]
    tracemalloc.start()
    try:
        mix = MixtureDataset(sources, log)
        built, _ = tracemalloc.get_traced_memory()
        mix.append_stage(1000 * 2048, distinct[0])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB traced"
    assert built < 2 * 2**20, f"{built / 2**20:.1f} MiB held"
    ids, draws = mix.locate(np.arange(2048))
    assert sorted(mix.names[i] for i in ids) == sorted(n for n, k in mix.consumed(2048).items() for _ in range(k))
    assert np.array_equal(np.sort(draws[ids == ids[0]]), np.arange(np.sum(ids == ids[0])))


def decimal_ratios(weights) -> list[Fraction]:
    """Each weight's share, the weights read as the decimals they print as."""
    exact = [Fraction(w) if isinstance(w, (int, Fraction)) else Fraction(Decimal(repr(float(w)))) for w in weights]
    return [w / sum(exact) for w in exact]


plain_weight_st = st.one_of(
    st.builds(lambda u, d: u / 10**d, st.integers(0, 10**7), st.integers(0, 9)),
    st.floats(0.0, 1e13, allow_nan=False),
    st.integers(0, 2**45),
)


@SETTINGS
@given(weights=st.lists(plain_weight_st, min_size=1, max_size=8), many=st.integers(0, 60), block=st.sampled_from([1, 7, 64, 2048]))
def test_plain_weights_read_in_numpy_are_the_decimals_they_print_as(weights, many, block):
    """``exact_ratios`` reads the floats and integers up to 2^40 of a stage of many sources in numpy
    (``short_decimals``): the ratios must be those of the decimals Python prints, as the per-weight ``Decimal``
    reading gives."""
    weights = (weights * (1 + many // len(weights)))[: max(many, 1)]
    if sum(weights) == 0:
        weights = [*weights, 1]
    short = short_decimals(weights)
    if short is not None:
        assert [Fraction(n, sum(short)) for n in short] == decimal_ratios(weights)
    numerators, total = exact_ratios(weights)
    assert [Fraction(n, total) for n in numerators] == decimal_ratios(weights)
    assert BlockAllocator(weights, block).weights == decimal_ratios(weights)


@settings(SETTINGS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # most draws are small sources
@given(weights=st.lists(st.one_of(st.just(1e-3), st.integers(0, 10**4).map(lambda u: u / 10**4), st.integers(0, 5)), min_size=NUMPY_FROM,
                        max_size=80),
       block=st.sampled_from([100, 2048, 10**4]), ks=st.lists(st.integers(0, 10**6), min_size=1, max_size=5))
def test_large_sources_counted_in_numpy_match_the_counts_in_python_integers(weights, block, ks):
    weights = [*weights, 1]
    fast = BlockAllocator(weights, block)
    assume(fast._large_num is not None)  # at least NUMPY_FROM sources of one example a block or more
    slow = copy.deepcopy(fast)
    slow._large_num = None  # the Python-integer path, which rates beyond int64 take
    for k in ks:
        assert fast.counts_after(k).tolist() == slow.counts_after(k).tolist()


def test_a_stage_keeps_the_weights_it_was_first_read_with_when_the_callers_dict_changes_later():
    """The log holds the caller's mappings until a stage is used, then its own copy: a stage's allocator rebuilt after
    more stages than the mixture keeps were read draws by the same weights."""
    log = [(16 * i, {"a": 1.0, "b": float(i % 3)}) for i in range(150)]
    mix = mixture({"a": 37, "b": 5}, log, block_size=16)
    first = mix.locate(np.arange(16))
    log[0][1]["b"] = 5.0
    mix.locate(np.arange(16, 16 * 150))  # every other stage: the first one's allocator is dropped
    assert all(np.array_equal(a, b) for a, b in zip(mix.locate(np.arange(16)), first))
    assert mix.stages[0][1] == {"a": 1.0, "b": 0.0}
