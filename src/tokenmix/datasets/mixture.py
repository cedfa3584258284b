"""MixtureDataset: exact, lazy, deterministic mixing of sources by weight, with weight schedules.

Index i falls in a stage of the weight schedule and, inside it, in a block of ``block_size`` examples.
Each block holds exactly the per-source counts ``BlockAllocator`` gives (within 1 of the exact share
after any whole number of blocks, no positive weight rounded away) in a seeded order, so mapping an
index to (source, draw number) needs one block's counts, not a per-example array. A source's draws
continue across stages, so a change of weights neither skips nor repeats examples. The stages are the
weight log, which ``append_stage`` grows while the mixture is read (an update placed at ``next_boundary``
past what was read ahead): the mixture is then the one built with the whole log at once. Each source is
read through its own ``EpochedDataset``, keyed by the seed and the source's name: reordering the
sources changes nothing and renaming one leaves the others' orders alone.

A log may hold many stages (an online algorithm appends one per update), so a stage costs nothing until it is
used: its weights are checked and its ``BlockAllocator`` built when a read or a count first reaches it (a bounded
number kept), and the draws each source has made before it (its base counts) are found by walking forward from
the nearest stage whose base counts are known (every ``_BASE_EVERY``-th stage's are kept once found).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices
from tokenmix.datasets.deferred import DeferredDataset, open_together
from tokenmix.datasets.epochs import UNBOUNDED, EpochedDataset
from tokenmix.datasets.mixture_layout import BlockAllocator, short_decimals, whole_block_counts
from tokenmix.datasets.permutation import FeistelPermutation, derive_key, permute_many
from tokenmix.datasets.settings import (
    STOP_STRATEGIES,
    Shuffle,
    StopStrategy,
    Weights,
    WeightSchedule,
    check_stage,
    schedule_stages,
    stage_name,
)

logger = logging.getLogger(__name__)

_SLOW_WALK_STEPS = 10**7  # about 13 s of walking at most: worth a warning
_STAGES_KEPT = 64
"""Stages whose allocators (and base counts, beyond every ``_BASE_EVERY``-th) a mixture keeps."""
_BASE_EVERY = 64


def _short(number: float | int | Fraction) -> str:
    """A number in three significant digits, integers too large for a float included."""
    return format(Decimal(number), ".3g") if isinstance(number, int) else f"{float(number):.3g}"

@dataclass(frozen=True)
class SourceUsage:
    """What a mixture has drawn from one source up to some index."""

    examples: int
    tokens: int
    epoch: int
    """The epoch the source's next example comes from."""
    epochs_completed: float


class MixtureDataset(Dataset):
    """Examples drawn from named sources in exact proportions, per block of ``block_size``."""

    def __init__(
        self,
        datasets: Mapping[str, Dataset],
        weights: WeightSchedule,
        *,
        block_size: int = 2048,
        seed: int = 0,
        shuffle: Shuffle = True,
        stop_strategy: StopStrategy = "restart",
    ):
        if not datasets:
            raise ValueError("a mixture needs at least one source")
        if stop_strategy not in STOP_STRATEGIES:
            raise ValueError(f"stop_strategy must be one of {STOP_STRATEGIES}, got {stop_strategy!r}")
        self.names = list(datasets)
        """Source names; a source's id (``TokenBatch.source_ids``) is its position here."""
        lengths = {name: ds.tokens_per_example for name, ds in datasets.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"the sources of a mixture need one example length (seq_len), got {lengths}")
        self.tokens_per_example = next(iter(lengths.values()))
        self.block_size = block_size
        self.seed = seed
        self.stop_strategy = stop_strategy
        self._datasets = dict(datasets)
        self._shuffle = shuffle
        self.stages: list[tuple[int, Weights]] = schedule_stages(weights)
        """The weight log: ``(start_index, weights)`` stages, the first at 0; ``append_stage`` adds to it. A stage holds
        the mapping given until a read first reaches it, then its own copy (a long log costs no copy until read)."""
        self._staged = not isinstance(weights, Mapping)
        self._canon = sorted(self.names)
        position = {name: i for i, name in enumerate(self.names)}
        self._ids = np.array([position[n] for n in self._canon], np.int32)
        self._stage_starts = [start for start, _ in self.stages]
        self._start_buffer = np.array(self._stage_starts, np.int64)
        """The starts as an array, with room to grow: its first ``len(_stage_starts)`` entries are the log's."""
        self._lock = threading.RLock()  # a loader's prefetch thread reads while the trainer appends
        self._allocators: OrderedDict[int, BlockAllocator] = OrderedDict()
        self._bases: dict[int, np.ndarray] = {0: np.zeros(len(self._canon), np.int64)}
        """Each source's draws before a stage: every ``_BASE_EVERY``-th stage's once found, and the recent ones."""
        self._recent_bases: OrderedDict[int, np.ndarray] = OrderedDict()
        self._warned: set[int] = set()
        self._checked: set[int] = set()
        """The stages whose weights are checked (``_weights``)."""
        self._copied: set[int] = set()
        """The stages a read has reached, whose weights the log holds as its own copy."""
        self._weighted: set[int] = set()
        """The sources (canonical numbers) some stage used so far weighs."""
        self._sources: dict[int, EpochedDataset] = {}
        """Their epoch-shuffled views, made when first drawn from."""
        self._scanned = 0
        """Stages whose weighted sources ``_weighted`` holds for certain (those before are all scanned)."""
        self._all_final = False
        """Whether every source's order was final when last looked at (it stays so until a stage adds a source)."""
        self._length: tuple[int, int] | None = None
        """The length under a stop strategy, and how many stages it was found with."""
        self._allocator(0)  # a mixture of one stage is checked whole at once

    def __repr__(self) -> str:
        return f"MixtureDataset({self.names}, stop_strategy={self.stop_strategy!r})"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]
        state["_allocators"] = OrderedDict()  # rebuilt where read: a pickle sent to reader processes stays small
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def append_stage(self, start: int, weights: Weights) -> None:
        """Draw by ``weights`` from index ``start`` on: a stage appended to the weight log while the mixture is in use.

        Every index before ``start`` keeps its example, and each source's draws go on from where the indices before
        ``start`` leave them, so nothing is skipped or repeated: the mixture is the one built with the whole log at once.
        ``start`` must come after the last stage's start; an update decided during a run goes at ``next_boundary`` of an
        index past what the loader may have read ahead, so that no batch already read changes. It costs the check of
        ``weights``, whatever the length of the log.
        """
        last = self._stage_starts[-1]
        if start <= last:
            raise ValueError(f"train_weights: stage starts must increase, got index {last} then {start}")
        check_stage(weights, self.names, stage_name(start, True))
        final = self._end()
        if final is not None and start >= final:
            raise ValueError(f"a stage from index {start} would never be read: the mixture ends at index {final} ({self.stop_strategy})")
        if self.stop_strategy == "all_exhausted":  # refused now: in the log, it would fail every read, of earlier indices too
            self._refuse_unread(weights, self._consumed(start), self._source_lengths())
        with self._lock:
            n = len(self._stage_starts)
            if n == len(self._start_buffer):
                grown = np.empty(2 * n, np.int64)
                grown[:n] = self._start_buffer
                self._start_buffer = grown
            self._start_buffer[n] = start
            self.stages.append((int(start), dict(weights)))
            # a reader in another thread finds the new stage only once its start is listed, after all it needs
            self._stage_starts.append(int(start))

    def next_boundary(self, index: int) -> int:
        """The first block boundary of the last stage at or after ``index``, and after that stage's start: where an
        update that may not change the examples before ``index`` takes effect with whole, exact blocks."""
        start = self._stage_starts[-1]
        return start + max(1, -(-(int(index) - start) // self.block_size)) * self.block_size

    def _starts(self) -> np.ndarray:
        """The stage starts, as an array."""
        n = len(self._stage_starts)
        return self._start_buffer[:n]

    def _allocator(self, stage: int) -> BlockAllocator:
        """The block counts of ``stage``: its weights are checked, and its sources readied, when it is first used."""
        with self._lock:
            alloc = self._allocators.get(stage)
            if alloc is not None:
                self._allocators.move_to_end(stage)
                return alloc
            start, weights = self.stages[stage][0], self._weights(stage)
            alloc = BlockAllocator([weights.get(n, 0.0) for n in self._canon], self.block_size)
            if alloc.worst_walk > _SLOW_WALK_STEPS and stage not in self._warned:
                self._warned.add(stage)
                name = self._canon[alloc.slowest_tiny]
                logger.warning(
                    "mixture stage from index %d: source %r (weight %s) gets one example every %s blocks of %d, so a read "
                    "of a block far from those read before walks the layout over up to that many blocks, %.3g steps a "
                    "block (a million steps take about a second). Raise that weight or drop the source to make random "
                    "access cheap.",
                    start, name, _short(weights[name]), _short(alloc.memory), self.block_size,
                    Fraction(alloc.worst_walk, alloc.memory),
                )
            self._allocators[stage] = alloc
            if len(self._allocators) > _STAGES_KEPT:
                self._allocators.popitem(last=False)
            return alloc

    def _weights(self, stage: int) -> Weights:
        """The weights of ``stage``, checked and their sources noted as weighted when the stage is first used."""
        with self._lock:
            start, weights = self.stages[stage]
            if stage not in self._checked:
                check_stage(weights, self.names, stage_name(start, self._staged or stage > 0))
                if len(self._weighted) < len(self._canon):
                    added = {c for c, name in enumerate(self._canon) if weights.get(name, 0.0) > 0} - self._weighted
                    if added:
                        self._weighted |= added
                        self._all_final = False
                self._checked.add(stage)
            return weights

    def _source(self, c: int) -> EpochedDataset:
        """The epoch-shuffled view of source ``c`` (canonical number), keyed by the seed and its name."""
        source = self._sources.get(c)
        if source is None:
            name = self._canon[c]
            source = self._sources.setdefault(c, EpochedDataset(self._datasets[name], derive_key(self.seed, "source", name), self._shuffle))
        return source

    def _all_sources(self) -> dict[int, EpochedDataset]:
        """Every source some stage weighs (each stage's weights checked)."""
        with self._lock:
            for stage in range(self._scanned, len(self._stage_starts)):
                self._weights(stage)
                self._scanned = stage + 1
            return {c: self._source(c) for c in sorted(self._weighted)}

    def _base(self, stage: int) -> np.ndarray:
        """Each source's draws before ``stage`` starts: the nearest stage at or before it whose base counts are known,
        plus what every stage between draws over its whole span."""
        with self._lock:
            known = stage
            while known not in self._bases and known not in self._recent_bases:
                known -= 1
            base = self._bases.get(known)
            if base is None:
                base = self._recent_bases[known]
                self._recent_bases.move_to_end(known)
            first = known
            while first < stage:  # up to each multiple of _BASE_EVERY, whose base counts are kept
                last = min(stage, (first // _BASE_EVERY + 1) * _BASE_EVERY)
                base = base + self._spans(first, last).sum(axis=0)
                if last % _BASE_EVERY == 0:
                    self._bases[last] = base
                first = last
            if stage not in self._bases:
                self._recent_bases[stage] = base
                if len(self._recent_bases) > _STAGES_KEPT:
                    self._recent_bases.popitem(last=False)
            return base

    def _spans(self, first: int, last: int) -> np.ndarray:
        """What each stage from ``first`` to ``last`` (not included) draws over its whole span, a row a stage: in closed
        form, all at once, for stages of whole blocks whose weighted sources all get an example a block or more, and
        through the stage's allocator for the others."""
        starts = self._starts()[first : last + 1]
        lengths = np.diff(starts)
        blocks, rest = np.divmod(lengths, self.block_size)
        rows = [self._weights(s) for s in range(first, last)]
        units = short_decimals([w.get(n, 0.0) for w in rows for n in self._canon])
        if units is None:
            out, ok = np.zeros((len(rows), len(self._canon)), np.int64), np.zeros(len(rows), bool)
        else:
            out, ok = whole_block_counts(np.reshape(units, (len(rows), len(self._canon))), blocks, self.block_size)
        for r in np.flatnonzero(~ok | (rest > 0)).tolist():
            out[r] = self._drawn_in(first + r, int(lengths[r]))
        return out

    @lru_cache(maxsize=256)  # noqa: B019 - the cache lives as long as the dataset, which is intended
    def _block(self, stage: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Counts before the block; for each position in it, its source and that source's draw rank.

        The block's positions are dealt to sources in a seeded order; ranks follow position order, so a
        source's draws rise with the index.
        """
        if stage not in self._copied:  # what an evicted stage is rebuilt from, whatever the caller's dict becomes
            with self._lock:
                self.stages[stage] = (self.stages[stage][0], dict(self._weights(stage)))
                self._copied.add(stage)
        alloc = self._allocator(stage)
        before = alloc.counts_after(block)
        cum = np.cumsum(alloc.counts_after(block + 1) - before)
        slots = FeistelPermutation(self.block_size, derive_key(self.seed, "layout", stage, block))(np.arange(self.block_size))
        source = np.searchsorted(cum, slots, side="right")
        by_source = np.argsort(source, kind="stable")
        rank = np.empty(self.block_size, np.int64)
        rank[by_source] = np.arange(self.block_size) - np.concatenate([[0], cum[:-1]])[source[by_source]]
        return before, source, rank

    def _drawn_in(self, stage: int, local: int) -> np.ndarray:
        """Each source's draws in ``stage`` before its ``local``-th index."""
        block, rest = divmod(local, self.block_size)
        counts = self._allocator(stage).counts_after(block)
        if rest:
            _, source, _ = self._block(stage, block)
            counts = counts + np.bincount(source[:rest], minlength=len(self._canon))
        return counts

    def source(self, name: str) -> EpochedDataset:
        """The epoch-shuffled view a source is drawn through (only sources with a positive weight)."""
        c = self._canon.index(name)
        if c not in self._weighted and c not in self._all_sources():
            raise KeyError(f"source {name!r} has weight 0 in every stage and is never drawn")
        self._open([c])
        return self._source(c)

    def opened_sources(self) -> list[str]:
        """The sources opened so far: a source given as a ``DeferredDataset`` opens when a batch first draws from it."""
        return [self._canon[c] for c, src in self._sources.items() if not isinstance(src.base, DeferredDataset) or src.base.is_open]

    def _open(self, sources: list[int]) -> None:
        """Open the sources numbered ``sources`` (canonical) that are not open yet, together, and read each through what
        it opened to from then on."""
        drawn = [self._source(c) for c in sources]
        open_together(src.base for src in drawn)
        for src in drawn:
            if isinstance(src.base, DeferredDataset):
                src.base = src.base.dataset

    def consumed(self, num_examples: int) -> dict[str, int]:
        """How many examples of each source the first ``num_examples`` indices draw."""
        return dict(zip(self._canon, self._consumed(num_examples).tolist()))

    def _consumed(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"num_examples must be >= 0, got {n}")
        starts = self._starts()
        stage = int(np.searchsorted(starts, n, side="right")) - 1
        return self._base(stage) + self._drawn_in(stage, n - int(starts[stage]))

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each index: the source id, and which draw from that source it is (0-based)."""
        canon, draws = self._locate(as_indices(indices))
        return self._ids[canon], draws

    def _locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        canon = np.empty(len(idx), np.int64)
        draws = np.empty(len(idx), np.int64)
        for s, b, members, pos in self._by_block(idx):
            before, source, rank = self._block(s, b)
            src = source[pos]
            canon[members] = src
            draws[members] = self._base(s)[src] + before[src] + rank[pos]
        return canon, draws

    def _by_block(self, idx: np.ndarray) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """The indices grouped by (stage, block): each group's members and positions in the block."""
        starts = self._starts()
        if len(idx):  # the usual batch lies in one block: one group, found from its ends
            lo, hi = int(idx.min()), int(idx.max())
            s = int(np.searchsorted(starts, lo, side="right")) - 1
            b, offset = divmod(lo - int(starts[s]), self.block_size)
            if hi - lo < self.block_size - offset and (s + 1 == len(starts) or hi < starts[s + 1]):
                yield s, b, np.arange(len(idx)), idx - (int(starts[s]) + b * self.block_size)
                return
        stage = np.searchsorted(starts, idx, side="right") - 1
        block, pos = np.divmod(idx - starts[stage], self.block_size)
        for s in np.unique(stage).tolist():
            in_stage = stage == s
            for b in np.unique(block[in_stage]).tolist():
                members = np.flatnonzero(in_stage & (block == b))
                yield s, b, members, pos[members]

    @lru_cache(maxsize=64)  # noqa: B019 - the cache lives as long as the dataset, which is intended
    def _block_examples(self, stage: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        """For each position of a block: its source and that source's example index (sources' orders final).

        Resolving a whole block at once costs about what resolving one batch of it does, and the
        batches that follow in the same block then cost a lookup.
        """
        before, source, rank = self._block(stage, block)
        draws = self._base(stage)[source] + before[source] + rank
        examples = np.empty(self.block_size, np.int64)
        by_source = np.argsort(source, kind="stable")
        perms: list[FeistelPermutation] = []
        which, positions, within = [], [], []
        for members in np.split(by_source, np.flatnonzero(np.diff(source[by_source])) + 1):
            src = self._source(int(source[members[0]]))
            plan = src.permutation_of(draws[members])
            if plan is None:
                examples[members] = src.examples(draws[members])
            else:  # the full shuffles of all sources below are applied in one pass
                which.append(np.full(len(members), len(perms)))
                perms.append(plan[0])
                positions.append(members)
                within.append(plan[1])
        if perms:
            examples[np.concatenate(positions)] = permute_many(perms, np.concatenate(which), np.concatenate(within))
        return source, examples

    def _examples(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each index: the canonical source number, and the example index within that source."""
        canon = np.empty(len(idx), np.int64)
        examples = np.empty(len(idx), np.int64)
        if not self._all_final:
            self._all_final = all(self._source(c).has_final_order() for c in tuple(self._weighted))
        if self._all_final:
            for s, b, members, pos in self._by_block(idx):
                source, block_examples = self._block_examples(s, b)
                canon[members] = source[pos]
                examples[members] = block_examples[pos]
            return canon, examples
        canon, draws = self._locate(idx)
        drawn = np.unique(canon).tolist()
        self._open(drawn)  # only the sources this batch draws from, at once
        for c in drawn:
            members = canon == c
            examples[members] = self._source(c).examples(draws[members])
        return canon, examples

    def is_finite(self) -> bool:
        return self.stop_strategy != "restart"

    def final_len(self) -> int | None:
        """Under a stop strategy, the length once every source's length is known (None while a source's cache builds:
        found without waiting, so that a loader waits for it polling its stop); None under ``restart``."""
        if self.stop_strategy == "restart":
            return None
        stages = len(self._stage_starts)
        if self._length is None or self._length[0] != stages:  # a stage appended since (in another thread, maybe) moves the end
            if not self._lengths_known():
                return None
            self._length = (stages, self._stop_length())
        return self._length[1]

    def current_len(self) -> int:
        return UNBOUNDED if self.stop_strategy == "restart" else self.final_len() or 0

    def _end(self) -> int | None:
        """``final_len``, waiting under a stop strategy for the sources whose caches still build."""
        final = self.final_len()
        if final is None and self.stop_strategy != "restart":
            final = self.wait_until_final(why=f"stop_strategy {self.stop_strategy!r} needs every source's length")
        return final

    def _lengths_known(self) -> bool:
        """Whether every source some stage weighs has its final length."""
        sources = self._all_sources()
        self._open(list(sources))
        return all(ds.base.final_len() is not None for ds in sources.values())

    def _source_lengths(self) -> dict[int, int]:
        why = f"stop_strategy {self.stop_strategy!r} needs every source's length"
        sources = self._all_sources()
        self._open(list(sources))
        return {c: ds.length(why) for c, ds in sources.items()}

    def _stop_length(self) -> int:
        lengths = self._source_lengths()
        cs = np.array(list(lengths))
        sizes = np.array([lengths[c] for c in cs])
        if self.stop_strategy == "first_exhausted":
            def done(n: int) -> bool:  # some source would need a draw past its end
                return bool(np.any(self._consumed(n)[cs] > sizes))
        else:
            stage = len(self._stage_starts) - 1
            self._refuse_unread(self.stages[stage][1], self._base(stage), lengths)

            def done(n: int) -> bool:  # every source has been drawn through once
                return bool(np.all(self._consumed(n)[cs] >= sizes))

        if done(0):  # all_exhausted over sources that are all empty
            return 0
        hi = max(1, int(self._stage_starts[-1]) + self.block_size)
        while not done(hi):
            hi *= 2
        lo = 0  # invariant: not done(lo), done(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if done(mid) else (mid, hi)
        return lo if self.stop_strategy == "first_exhausted" else hi

    def _refuse_unread(self, last: Weights, drawn: np.ndarray, lengths: dict[int, int]) -> None:
        """Under ``all_exhausted``, refuse a last stage that weighs 0 a source not read through by its start (``drawn``
        before it): the mixture would never end."""
        for c, size in lengths.items():
            if last.get(self._canon[c], 0.0) == 0 and drawn[c] < size:
                raise ValueError(
                    f"stop_strategy 'all_exhausted': source {self._canon[c]!r} has weight 0 in the last stage and only "
                    f"{int(drawn[c])} of its {int(size)} examples are drawn before it, so the mixture would never end: give it a "
                    "weight above 0 in that stage, start the stage once the source is read through, or use stop_strategy "
                    "first_exhausted or restart"
                )

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        final = self._end()
        if final is not None and idx.size and int(idx.max()) >= final:
            raise IndexError(f"{self!r}: index {int(idx.max())} is beyond its {final} examples ({self.stop_strategy})")
        canon, examples = self._examples(idx)
        out = TokenBatch.empty(len(idx), self.tokens_per_example)
        finishers = []
        by_source = np.argsort(canon, kind="stable")  # each source's rows, ascending, one after the other
        ends = np.cumsum(np.bincount(canon)).tolist()
        for c, (begin, end) in enumerate(zip([0, *ends[:-1]], ends)):
            if end > begin:
                rows = by_source[begin:end]
                finishers.append(self._source(c).base.read_into(examples[rows], out, rows))

        def assemble() -> TokenBatch:
            for finish in finishers:
                finish()
            out.source_ids[:] = self._ids[canon]
            return out

        return Pending(assemble)

    def epoch_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The epoch of its source each index's example comes from."""
        canon, draws = self._locate(as_indices(indices))
        out = np.zeros(len(draws), np.int64)
        for c in np.unique(canon).tolist():
            members = canon == c
            out[members] = self._source(c).epoch_of(draws[members])
        return out

    def usage(self, num_examples: int) -> dict[str, SourceUsage]:
        """Per source: examples and tokens drawn by the first ``num_examples`` indices, and its epoch."""
        counts = self._consumed(num_examples)
        out = {}
        for c, name in enumerate(self._canon):
            drawn = int(counts[c])
            if c not in self._weighted:
                out[name] = SourceUsage(0, 0, 0, 0.0)
                continue
            ds = self._source(c)
            n = ds.length("usage needs the source's length")
            epoch, completed = (drawn // n, drawn / n) if n else (0, 0.0)  # an empty source has no epoch to complete
            out[name] = SourceUsage(drawn, drawn * ds.tokens_per_example, epoch, completed)
        return {name: out[name] for name in self.names}
