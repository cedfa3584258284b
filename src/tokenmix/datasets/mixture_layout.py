"""Exact per-block source counts for a weighted mixture: pure integer arithmetic, no I/O.

The index space is cut into blocks of ``block_size`` examples. ``counts_after(k)`` gives, for every
source, how many of the first ``k`` blocks' examples it owns. Three properties hold for every ``k``:

* the counts sum to ``k * block_size`` (blocks are full);
* each count is the floor or the ceiling of ``k * block_size * weight`` (within 1 of exact; a positive
  weight, however small, is never rounded away);
* counts never decrease from one block to the next (each block holds a non-negative number of
  examples of each source).

Sources with ``block_size * weight >= 1`` ("large") advance at least one example per block, so any
rounding of their targets is monotone and they are rounded in closed form (largest remainder). The
"tiny" sources, which get less than one example per block on average, share a group quota rounded in
closed form; the group's slots are handed out earliest-deadline-first, where a tiny source's j-th
example may not come before the block its target passes j - 1 and must come by the block its target
reaches j. EDF meets every such deadline (a Hall-condition argument, see docs/design/datasets.md), so
the tiny sources stay within 1 too.

EDF forgets: started ``memory = max ceil(1 / (block_size * weight))`` blocks back (over the tiny
sources) from *any* valid state (every count the floor or ceiling of its target, summing to the
group's slots), it reaches the same state as the walk from block 0. Proof sketch: both walks release
the same examples and serve one per slot, so their pending sets differ by two equal-sized sets: D1,
pending only in the true walk, and D2, pending only in the other (at the start, one job per source at
most, released before it). Each slot, a walk serves its pending example with the earliest (deadline,
source), a strict order since a source's deadlines rise (which is also why the walk need only hold
each source's next example); when the two serve different examples, an example enters D1 (or D2) only
if it comes before every example of D2 (or D1), so the latest deadline d in D1 and D2 never increases.
The true walk meets every deadline, so after block d nothing due by d is pending in it: D1 is empty,
and so is D2. Every example in D1 or D2 at the start is due within ``memory`` blocks of it. So
``counts_after(k)`` walks from a closed-form guess at ``k - memory`` (or from a remembered state, if
nearer): one step per tiny-source example in at most ``memory`` blocks, however far ``k`` is (and
``memory`` never exceeds ``period``). ``tests/test_index_math.py`` checks this against the walk from
block 0.

At every multiple of ``period`` blocks all targets are whole numbers, so every count equals its target
exactly and the walk starts afresh: the layout is periodic, and ``counts_after(k)`` only ever walks
inside one period. Weights written as short decimals (``1e-5``, ``0.3``) have short periods.
"""

from __future__ import annotations

import heapq
import math
import numbers
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from decimal import Decimal
from fractions import Fraction

import numpy as np

from tokenmix.datasets.settings import is_weight

_CHECKPOINT_EVERY = 4096
_STATES_KEPT = 256
_SHORT_DECIMAL_MAX = 2**40
NUMPY_FROM = 32
"""Sources from which a stage's weights are read and its large sources counted in numpy: below, Python's numbers
cost less than numpy's per-call overhead."""


def exact_ratios(weights: Sequence[float | int | Fraction]) -> tuple[list[int], int]:
    """Weights as integers over their exact sum: ``weights[i] / sum(weights) == numerators[i] / total``.

    A float (numpy's too) is taken as the shortest decimal that prints as it (``1e-5`` is 1/100000, not the
    nearest binary fraction): that is the number the user wrote, and decimal weights give the layout a short
    period (see ``BlockAllocator.period``).
    """
    numerators = short_decimals(weights) if len(weights) >= NUMPY_FROM else None
    if numerators is None:
        if not all(is_weight(w) for w in weights):
            raise ValueError(f"mixture weights must be finite numbers >= 0, got {list(weights)}")
        ratios = [(w.numerator, w.denominator) if isinstance(w, numbers.Rational) else Decimal(repr(float(w))).as_integer_ratio()
                  for w in weights]
        common = math.lcm(*(d for _, d in ratios))
        numerators = [n * (common // d) for n, d in ratios]
    total = sum(numerators)
    if total <= 0:
        raise ValueError("mixture weights must have a positive sum")
    return numerators, total


def short_decimals(weights: Sequence[float | int | Fraction]) -> list[int] | None:
    """The weights times the least power of ten up to 10^9 that makes every one a whole number, when there is one and
    the weights are plain numbers (what an online algorithm sets: multiples of 1e-4); else None.

    The same ratios as the shortest decimals: a float ``w`` with ``u / 10^d == w`` exactly (``u`` a whole number up
    to 2^40) prints as ``u / 10^d``, since a shorter decimal that rounds to ``w`` would lie within ``ulp(w) < 10^-(d+1)``
    of it, closer than two decimals of at most as many digits can be.
    """
    values = np.asarray(weights)
    if values.dtype.kind not in "fiu" or values.ndim != 1 or not len(values):
        return None
    values = values.astype(np.float64)
    if not (np.all(values >= 0) and np.all(values <= _SHORT_DECIMAL_MAX)):  # False for nan
        return None
    for digits in range(10):
        scaled = np.rint(values * 10.0**digits)
        if np.all(scaled <= 2**40) and np.array_equal(scaled / 10.0**digits, values):
            return scaled.astype(np.int64).tolist()
    return None


class BlockAllocator:
    """Cumulative per-source example counts at block boundaries for one set of weights."""

    def __init__(self, weights: Sequence[float | int | Fraction], block_size: int):
        if block_size < 1:
            raise ValueError(f"mixture_block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        numerators, total = exact_ratios(weights)
        self.num_sources = len(numerators)
        # every rate n_i B / T as an integer numerator over one common denominator, the least: T / gcd(T, B gcd(n))
        common = math.gcd(total, block_size * math.gcd(*numerators))
        self._den = total // common
        self._num = [n * block_size // common for n in numerators]
        self._large = [i for i, p in enumerate(self._num) if p >= self._den]
        self._tiny = [i for i, p in enumerate(self._num) if 0 < p < self._den]
        self._tiny_num = sum(self._num[i] for i in self._tiny)
        fits = len(self._large) >= NUMPY_FROM and self._den < 2**62 and all(self._num[i] < 2**62 for i in self._large)
        self._large_num = np.array([self._num[i] for i in self._large], np.int64) if fits else None
        """The large sources' rates as int64 (None when few, or where they do not fit): their counts in numpy while
        ``k`` times the largest stays below 2^62."""
        self._large_num_max = max((self._num[i] for i in self._large), default=0)
        self.period = self._den // math.gcd(self._den, *self._num)
        """Blocks after which every target is a whole number: the layout repeats with this period."""
        self._period_counts = [self.period * p // self._den for p in self._num]
        self.memory = max((-(-self._den // self._num[i]) for i in self._tiny), default=0)
        """Blocks of history that decide the tiny sources' counts (``ceil(1 / rate)`` of the slowest tiny
        source): random access walks at most this far."""
        self._checkpoint_every = max(_CHECKPOINT_EVERY, self.tiny_slots(self.memory) // 64)
        self._tiny_states: OrderedDict[int, np.ndarray] = OrderedDict()  # true states by slot, an LRU
        self._tiny_lock = threading.Lock()  # a loader's prefetch thread and the caller may both ask

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_tiny_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._tiny_lock = threading.Lock()

    @property
    def weights(self) -> list[Fraction]:
        """The weights normalised to sum to 1, exactly."""
        return [Fraction(n, self._den * self.block_size) for n in self._num]

    @property
    def slowest_tiny(self) -> int | None:
        """The source with the longest window between examples (it sets ``memory``), if any is tiny."""
        return min(self._tiny, key=lambda i: (self._num[i], i)) if self._tiny else None

    @property
    def worst_walk(self) -> int:
        """EDF steps a read of a block far from those read before may take: the tiny group's examples
        in ``memory`` blocks (``memory`` never exceeds ``period``)."""
        return self.tiny_slots(self.memory)

    def target(self, k: int) -> list[Fraction]:
        """The exact (fractional) number of examples each source is owed after ``k`` blocks."""
        return [Fraction(k * p, self._den) for p in self._num]

    def tiny_slots(self, k: int) -> int:
        """Examples the tiny sources own together after ``k`` blocks."""
        if not self._large:
            return k * self.block_size
        return (2 * k * self._tiny_num + self._den) // (2 * self._den)

    def counts_after(self, k: int) -> np.ndarray:
        """Examples of each source in the first ``k`` blocks (int64, one per source)."""
        if k < 0:
            raise ValueError(f"block {k} < 0")
        periods, k = divmod(k, self.period)
        if periods:
            return np.array([periods * c for c in self._period_counts], np.int64) + self.counts_after(k)
        counts = np.zeros(self.num_sources, np.int64)
        tiny_total = self.tiny_slots(k)
        if self._tiny:
            with self._tiny_lock:
                counts[self._tiny] = self._tiny_counts(k)
        if self._large and self._large_num is not None and k * self._large_num_max < 2**62:
            targets = k * self._large_num
            floors, rems = np.divmod(targets, self._den)
            extra = k * self.block_size - tiny_total - int(floors.sum())
            floors[np.lexsort((np.arange(len(rems)), -rems))[:extra]] += 1  # largest remainders, ties by position
            counts[self._large] = floors
        elif self._large:
            den = self._den
            floors, rems = zip(*(divmod(k * self._num[i], den) for i in self._large))
            floors = list(floors)
            extra = k * self.block_size - tiny_total - sum(floors)
            for j in sorted(range(len(rems)), key=lambda j: (-rems[j], j))[:extra]:
                floors[j] += 1
            counts[self._large] = floors
        return counts

    def block_counts(self, k: int) -> np.ndarray:
        """Examples of each source inside block ``k`` (0-based)."""
        return self.counts_after(k + 1) - self.counts_after(k)

    def _tiny_counts(self, k: int) -> list[int]:
        """The tiny sources' counts after ``k`` blocks (``k`` inside one period)."""
        slots = self.tiny_slots(k)
        states = self._tiny_states
        done = max((s for s in states if s <= slots), default=0)
        start_block = k - self.memory
        if start_block > 0 and done < self.tiny_slots(start_block):
            # Any valid state ``memory`` blocks back walks into the true one (see the module doc),
            # so far blocks start from a closed-form guess instead of from the last state we know.
            return self._walk(self.tiny_slots(start_block), self._guess(start_block), slots, exact=False)
        if done:
            states.move_to_end(done)
        return self._walk(done, states[done].tolist() if done else [0] * len(self._tiny), slots, exact=True)

    def _guess(self, k: int) -> list[int]:
        """A valid state after ``k`` blocks: every count the floor or the ceiling of its target, summing
        to the group's slots, the ceilings going to the sources whose next example is due soonest."""
        den = self._den
        nums = [self._num[i] for i in self._tiny]
        counts = [k * p // den for p in nums]
        open_ = sorted((-((-(c + 1) * den) // p), t) for t, (c, p) in enumerate(zip(counts, nums)) if k * p % den)
        for _, t in open_[: self.tiny_slots(k) - sum(counts)]:
            counts[t] += 1
        return counts

    def _walk(self, done: int, counts: list[int], slots: int, exact: bool) -> list[int]:
        """Hand out the tiny group's slots ``done + 1 .. slots`` earliest-deadline-first from ``counts``.

        ``exact`` says that ``counts`` is the true state after ``done`` slots: only then are deadlines
        checked and states remembered (a walk from a guess is only right once it has run ``memory``
        blocks, which is where it stops).
        """
        den = self._den
        nums = [self._num[i] for i in self._tiny]
        # job j of tiny source t: held from the first block with k*rate > j-1 (release) and
        # owed by the first block with k*rate >= j (deadline)
        waiting = [((counts[t] * den) // p + 1, t) for t, p in enumerate(nums)]
        heapq.heapify(waiting)
        ready: list[tuple[int, int]] = []
        block = block_end = -1
        for slot in range(done + 1, slots + 1):
            if slot > block_end:
                block = self._slot_block(slot)
                block_end = self.tiny_slots(block)
            while waiting and waiting[0][0] <= block:
                _, t = heapq.heappop(waiting)
                heapq.heappush(ready, (-((-(counts[t] + 1) * den) // nums[t]), t))
            deadline, t = heapq.heappop(ready)
            if exact and deadline < block:
                raise AssertionError(f"mixture layout: tiny source {t} missed its deadline {deadline} at block {block}")
            counts[t] += 1
            heapq.heappush(waiting, ((counts[t] * den) // nums[t] + 1, t))
            if exact and slot % self._checkpoint_every == 0:
                self._remember(slot, counts)
        self._remember(slots, counts)
        return counts

    def _remember(self, slots: int, counts: list[int]) -> None:
        self._tiny_states[slots] = np.array(counts, np.int64)
        self._tiny_states.move_to_end(slots)
        if len(self._tiny_states) > _STATES_KEPT:
            self._tiny_states.popitem(last=False)

    def _slot_block(self, slot: int) -> int:
        """The first block after which the tiny group owns at least ``slot`` examples."""
        if not self._large:
            return -(-slot // self.block_size)
        # floor(k*rate + 1/2) >= slot  <=>  k >= (2*slot - 1) / (2*rate)
        return max(0, -((-(2 * slot - 1) * self._den) // (2 * self._tiny_num)))


def whole_block_counts(units: np.ndarray, blocks: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``BlockAllocator.counts_after`` of many stages at once, where it has a closed form: per row (a stage's weights as
    whole numbers ``units``, one column a source), each source's examples in the row's first ``blocks`` blocks, and
    whether the row's counts hold. They hold where every weighted source gets at least one example a block (no tiny
    source, so no earliest-deadline walk: floors, then one more for the largest remainders, ties by position) and the
    targets fit int64; other rows are left to their allocators."""
    units = np.asarray(units, np.int64)
    blocks = np.asarray(blocks, np.int64)
    total = units.sum(axis=1)
    largest = units.max(axis=1, initial=0).astype(np.float64)
    ok = (largest * block_size < 2**61) & (blocks.astype(np.float64) * block_size * largest < 2**61) & (total > 0)
    ok &= np.all((units == 0) | (block_size * units >= total[:, None]), axis=1)
    units, blocks, total = np.where(ok[:, None], units, 0), np.where(ok, blocks, 0), np.where(ok, total, 1)
    floors, rems = np.divmod(blocks[:, None] * block_size * units, total[:, None])
    extra = blocks * block_size - floors.sum(axis=1)
    positions = np.broadcast_to(np.arange(units.shape[1]), units.shape)
    order = np.lexsort((positions, -rems), axis=-1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, positions, axis=1)
    return floors + (rank < extra[:, None]), ok


def allocator_for(weights: Mapping[str, float], names: Sequence[str], block_size: int) -> BlockAllocator:
    """A ``BlockAllocator`` over ``names`` (weights missing from the mapping are 0)."""
    return BlockAllocator([weights.get(n, 0.0) for n in names], block_size)
