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
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Literal

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices
from tokenmix.datasets.deferred import DeferredDataset, open_together
from tokenmix.datasets.epochs import UNBOUNDED, EpochedDataset
from tokenmix.datasets.mixture_layout import BlockAllocator, is_weight
from tokenmix.datasets.order import Shuffle
from tokenmix.datasets.permutation import FeistelPermutation, derive_key, permute_many

logger = logging.getLogger(__name__)

_SLOW_WALK_STEPS = 10**7  # about 13 s of walking at most: worth a warning


def _short(number: float | int | Fraction) -> str:
    """A number in three significant digits, integers too large for a float included."""
    return format(Decimal(number), ".3g") if isinstance(number, int) else f"{float(number):.3g}"

StopStrategy = Literal["restart", "first_exhausted", "all_exhausted"]
STOP_STRATEGIES = ("restart", "first_exhausted", "all_exhausted")

Weights = Mapping[str, float]
WeightSchedule = Weights | Sequence[tuple[int, Weights]]
"""A dict of weights, or ``[(start_index, weights), ...]`` stages starting at index 0."""


@dataclass(frozen=True)
class SourceUsage:
    """What a mixture has drawn from one source up to some index."""

    examples: int
    tokens: int
    epoch: int
    """The epoch the source's next example comes from."""
    epochs_completed: float


def normalize_schedule(weights: WeightSchedule, names: Sequence[str], *, unit: str = "index") -> list[tuple[int, dict[str, float]]]:
    """Check a weight schedule against the source names and return it as a list of stages.

    ``unit`` is what the stage starts count (``index``: examples, or ``step`` in a config), for the messages.
    """
    staged = not isinstance(weights, Mapping)
    stages = [(0, dict(weights))] if isinstance(weights, Mapping) else [(int(s), dict(w)) for s, w in weights]
    if not stages:
        raise ValueError("train_weights: at least one stage is needed")
    if stages[0][0] != 0:
        raise ValueError(f"train_weights: the first stage must start at {unit} 0, not {stages[0][0]}")
    for (a, _), (b, _) in zip(stages, stages[1:]):
        if b <= a:
            raise ValueError(f"train_weights: stage starts must increase, got {unit} {a} then {b}")
    known = set(names)
    for start, stage in stages:
        check_stage(stage, names, f"train_weights (the stage from {unit} {start})" if staged else "train_weights", known)
    return stages


def check_stage(stage: Mapping[str, float], names: Sequence[str], where: str, known: set[str] | None = None) -> None:
    """Refuse a stage's weights that name an unknown source, are not finite numbers >= 0, or are all 0; ``where`` names
    the stage in the message."""
    unknown = sorted(set(stage) - (known if known is not None else set(names)))
    if unknown:
        raise ValueError(f"{where}: unknown source(s) {unknown}; the sources are {sorted(names)}")
    for name, value in stage.items():
        if not is_weight(value):
            raise ValueError(f"{where}: source {name!r} has weight {value!r}; give it a finite number >= 0 (0 leaves it out)")
    if sum(stage.values()) <= 0:
        raise ValueError(f"{where}: at least one weight must be positive")


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
        lengths = {name: ds.tokens_per_example for name, ds in datasets.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"the sources of a mixture need one example length (seq_len), got {lengths}")
        self.tokens_per_example = next(iter(lengths.values()))
        """Source names; a source's id (``TokenBatch.source_ids``) is its position here."""
        self.block_size = block_size
        self.seed = seed
        self.stop_strategy = stop_strategy
        self._datasets = dict(datasets)
        self._shuffle = shuffle
        self.stages: list[tuple[int, dict[str, float]]] = []
        """The weight log: ``(start_index, weights)`` stages, the first at 0; ``append_stage`` adds to it."""
        self._canon = sorted(self.names)
        self._ids = np.array([self.names.index(n) for n in self._canon], np.int32)
        self._starts = np.zeros(0, np.int64)
        self._stage_starts: list[int] = []
        self._allocators: list[BlockAllocator] = []
        self._bases: list[np.ndarray] = []
        self._sources: dict[int, EpochedDataset] = {}
        self._all_final = False
        """Whether every source's order was final when last looked at (it stays so until a stage adds a source)."""
        self._length: tuple[int, int] | None = None
        """The length under a stop strategy, and how many stages it was found with."""
        for start, stage in normalize_schedule(weights, self.names):
            self._add_stage(start, stage)

    def __repr__(self) -> str:
        return f"MixtureDataset({self.names}, stop_strategy={self.stop_strategy!r})"

    def append_stage(self, start: int, weights: Weights) -> None:
        """Draw by ``weights`` from index ``start`` on: a stage appended to the weight log while the mixture is in use.

        Every index before ``start`` keeps its example, and each source's draws go on from where the indices before
        ``start`` leave them, so nothing is skipped or repeated: the mixture is the one built with the whole log at once.
        ``start`` must come after the last stage's start; an update decided during a run goes at ``next_boundary`` of an
        index past what the loader may have read ahead, so that no batch already read changes.
        """
        last = self._stage_starts[-1]
        if start <= last:
            raise ValueError(f"train_weights: stage starts must increase, got index {last} then {start}")
        check_stage(weights, self.names, f"train_weights (the stage from index {start})")
        final = self.final_len()
        if final is not None and start >= final:
            raise ValueError(f"a stage from index {start} would never be read: the mixture ends at index {final} ({self.stop_strategy})")
        self._add_stage(int(start), dict(weights))

    def next_boundary(self, index: int) -> int:
        """The first block boundary of the last stage at or after ``index``, and after that stage's start: where an
        update that may not change the examples before ``index`` takes effect with whole, exact blocks."""
        start = self._stage_starts[-1]
        return start + max(1, -(-(int(index) - start) // self.block_size)) * self.block_size

    def _add_stage(self, start: int, weights: dict[str, float]) -> None:
        alloc = BlockAllocator([weights.get(n, 0.0) for n in self._canon], self.block_size)
        if alloc.worst_walk > _SLOW_WALK_STEPS:
            name = self._canon[alloc.slowest_tiny]
            logger.warning(
                "mixture stage from index %d: source %r (weight %s) gets one example every %s blocks of %d, so a read "
                "of a block far from those read before walks the layout over up to that many blocks, %.3g steps a "
                "block (a million steps take about a second). Raise that weight or drop the source to make random "
                "access cheap.",
                start, name, _short(weights[name]), _short(alloc.memory), self.block_size,
                Fraction(alloc.worst_walk, alloc.memory),
            )
        for c, name in enumerate(self._canon):
            if weights.get(name, 0.0) > 0 and c not in self._sources:
                self._sources[c] = EpochedDataset(self._datasets[name], derive_key(self.seed, "source", name), self._shuffle)
                self._all_final = False
        base = self._consumed_in_stage(len(self.stages) - 1, start - self._stage_starts[-1]) if self.stages else np.zeros(len(self._canon), np.int64)
        # a reader in another thread finds the new stage only once its start is listed, after all it needs
        self._bases.append(base)
        self._allocators.append(alloc)
        self.stages.append((start, weights))
        self._starts = np.array([*self._stage_starts, start], np.int64)
        self._stage_starts = [*self._stage_starts, start]

    @lru_cache(maxsize=256)  # noqa: B019 - the cache lives as long as the dataset, which is intended
    def _block(self, stage: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Counts before the block; for each position in it, its source and that source's draw rank.

        The block's positions are dealt to sources in a seeded order; ranks follow position order, so a
        source's draws rise with the index.
        """
        alloc = self._allocators[stage]
        before = alloc.counts_after(block)
        cum = np.cumsum(alloc.counts_after(block + 1) - before)
        slots = FeistelPermutation(self.block_size, derive_key(self.seed, "layout", stage, block))(np.arange(self.block_size))
        source = np.searchsorted(cum, slots, side="right")
        by_source = np.argsort(source, kind="stable")
        rank = np.empty(self.block_size, np.int64)
        rank[by_source] = np.arange(self.block_size) - np.concatenate([[0], cum[:-1]])[source[by_source]]
        return before, source, rank

    def _consumed_in_stage(self, stage: int, local: int) -> np.ndarray:
        block, rest = divmod(local, self.block_size)
        counts = self._bases[stage] + self._allocators[stage].counts_after(block)
        if rest:
            _, source, _ = self._block(stage, block)
            counts = counts + np.bincount(source[:rest], minlength=len(self._canon))
        return counts

    def source(self, name: str) -> EpochedDataset:
        """The epoch-shuffled view a source is drawn through (only sources with a positive weight)."""
        c = self._canon.index(name)
        if c not in self._sources:
            raise KeyError(f"source {name!r} has weight 0 in every stage and is never drawn")
        self._open([c])
        return self._sources[c]

    def opened_sources(self) -> list[str]:
        """The sources opened so far: a source given as a ``DeferredDataset`` opens when a batch first draws from it."""
        return [self._canon[c] for c, src in self._sources.items() if not isinstance(src.base, DeferredDataset) or src.base.is_open]

    def _open(self, sources: list[int]) -> None:
        """Open the sources numbered ``sources`` (canonical) that are not open yet, together, and read each through what
        it opened to from then on."""
        drawn = [self._sources[c] for c in sources]
        open_together(src.base for src in drawn)
        for src in drawn:
            if isinstance(src.base, DeferredDataset):
                src.base = src.base.dataset

    def consumed(self, num_examples: int) -> dict[str, int]:
        """How many examples of each source the first ``num_examples`` indices draw."""
        return dict(zip(self._canon, self._consumed(num_examples).tolist()))

    def _consumed(self, n: int) -> np.ndarray:
        stage = int(np.searchsorted(self._starts, n, side="right")) - 1
        return self._consumed_in_stage(stage, n - int(self._starts[stage]))

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
            draws[members] = self._bases[s][src] + before[src] + rank[pos]
        return canon, draws

    def _by_block(self, idx: np.ndarray) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """The indices grouped by (stage, block): each group's members and positions in the block."""
        if len(idx):  # the usual batch lies in one block: one group, found from its ends
            lo, hi = int(idx.min()), int(idx.max())
            s = bisect.bisect_right(self._stage_starts, lo) - 1
            b, offset = divmod(lo - self._stage_starts[s], self.block_size)
            if hi - lo < self.block_size - offset and bisect.bisect_right(self._stage_starts, hi) - 1 == s:
                yield s, b, np.arange(len(idx)), idx - (self._stage_starts[s] + b * self.block_size)
                return
        stage = np.searchsorted(self._starts, idx, side="right") - 1
        block, pos = np.divmod(idx - self._starts[stage], self.block_size)
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
        draws = self._bases[stage][source] + before[source] + rank
        examples = np.empty(self.block_size, np.int64)
        by_source = np.argsort(source, kind="stable")
        perms: list[FeistelPermutation] = []
        which, positions, within = [], [], []
        for members in np.split(by_source, np.flatnonzero(np.diff(source[by_source])) + 1):
            src = self._sources[int(source[members[0]])]
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
            self._all_final = all(src.has_final_order() for src in self._sources.values())
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
            examples[members] = self._sources[c].examples(draws[members])
        return canon, examples

    def is_finite(self) -> bool:
        return self.stop_strategy != "restart"

    def final_len(self) -> int | None:
        if self.stop_strategy == "restart":
            return None
        stages = len(self._stage_starts)
        if self._length is None or self._length[0] != stages:  # a stage appended since (in another thread, maybe) moves the end
            self._length = (stages, self._stop_length())
        return self._length[1]

    def current_len(self) -> int:
        return UNBOUNDED if self.stop_strategy == "restart" else self.final_len()

    def _source_lengths(self) -> dict[int, int]:
        why = f"stop_strategy {self.stop_strategy!r} needs every source's length"
        self._open(list(self._sources))
        return {c: ds.length(why) for c, ds in self._sources.items()}

    def _stop_length(self) -> int:
        lengths = self._source_lengths()
        cs = np.array(list(lengths))
        sizes = np.array([lengths[c] for c in cs])
        if self.stop_strategy == "first_exhausted":
            def done(n: int) -> bool:  # some source would need a draw past its end
                return bool(np.any(self._consumed(n)[cs] > sizes))
        else:
            last = self.stages[-1][1]
            at_last = self._bases[-1]
            for c, size in zip(cs, sizes):
                if last.get(self._canon[c], 0.0) == 0 and at_last[c] < size:
                    raise ValueError(
                        f"stop_strategy 'all_exhausted': source {self._canon[c]!r} has weight 0 in the last stage and only "
                        f"{int(at_last[c])} of its {int(size)} examples are drawn before it, so the mixture would never end"
                    )

            def done(n: int) -> bool:  # every source has been drawn through once
                return bool(np.all(self._consumed(n)[cs] >= sizes))

        hi = max(1, int(self._starts[-1]) + self.block_size)
        while not done(hi):
            hi *= 2
        lo = 0  # invariant: not done(lo), done(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if done(mid) else (mid, hi)
        return lo if self.stop_strategy == "first_exhausted" else hi

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        final = self.final_len()
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
                finishers.append(self._sources[c].base.read_into(examples[rows], out, rows))

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
            out[members] = self._sources[c].epoch_of(draws[members])
        return out

    def usage(self, num_examples: int) -> dict[str, SourceUsage]:
        """Per source: examples and tokens drawn by the first ``num_examples`` indices, and its epoch."""
        counts = self._consumed(num_examples)
        out = {}
        for c, name in enumerate(self._canon):
            drawn = int(counts[c])
            if c not in self._sources:
                out[name] = SourceUsage(0, 0, 0, 0.0)
                continue
            ds = self._sources[c]
            n = ds.length("usage needs the source's length")
            out[name] = SourceUsage(drawn, drawn * ds.tokens_per_example, drawn // n, drawn / n)
        return {name: out[name] for name in self.names}
