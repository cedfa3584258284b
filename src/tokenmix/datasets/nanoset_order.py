"""Nanotron's sample order (Nanoset, BlendedNanoset, data stages), as the trainer at commit e3190be3 reads it.

A stage from example index ``start`` (Nanotron step ``start / batch + 1``) reads its own blend at the same index: the
trainer builds a later stage's dataloader with the samples consumed so far, so it skips that many of the new stage's
samples. In a stage, position ``i`` goes to a source by Megatron's greedy blending (``greedy_blend.py``; a stage of one
source is a plain Nanoset, the same order), and that source's draw ``d`` reads example ``shuffle[d mod L]`` of its train
part of ``L`` examples, where ``shuffle`` is ``numpy.random.RandomState(seed).shuffle`` of ``arange(L)`` (int32) with the
stage's seed: Nanoset's shuffle index, which repeats that permutation, and BlendedNanoset's wrap at a dataset's size (a
whole number of repeats) both come to this.

Nanotron materializes the repeated shuffle index (``int(N / L) + 1`` copies) and both blending arrays (16 bytes a
sample) on disk. Here only one permutation per (``L``, seed) is held (4 bytes per example of the train part: that
permutation is numpy's Fisher-Yates, which has no random access), and the blend is resolved per block.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch, as_indices
from tokenmix.datasets.greedy_blend import GreedyBlend

logger = logging.getLogger(__name__)


def nanoset_shuffle(length: int, seed: int) -> np.ndarray:
    """Nanoset's permutation of a train part of ``length`` examples for ``seed``."""
    order = np.arange(length, dtype=np.int32)
    np.random.RandomState(seed).shuffle(order)
    return order


def normalized(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum in float64, as Nanotron normalizes a ``data_path`` mapping."""
    w = np.asarray(weights, np.float64)
    return (w / np.sum(w)).tolist()


@dataclass(frozen=True)
class NanotronStage:
    """One data stage: from example ``start``, a blend of ``sources`` (names, in the stage's order) by ``weights``,
    shuffled with ``seed``."""

    start: int
    sources: tuple[str, ...]
    weights: tuple[float, ...]
    seed: int


class NanosetOrderDataset(Dataset):
    """Examples of ``datasets`` (each source's train part) in Nanotron's order over ``stages``; ``length`` is
    Nanotron's ``train_steps x global batch`` (None: no end)."""

    def __init__(self, datasets: Mapping[str, Dataset], stages: Sequence[NanotronStage], length: int | None):
        if not stages or stages[0].start != 0:
            raise ValueError("Nanotron's first data stage starts at the first example")
        if any(b.start <= a.start for a, b in zip(stages, stages[1:])):
            raise ValueError(f"data stage starts must increase, got {[s.start for s in stages]}")
        self.names = list(datasets)
        """Source names; a source's id (``TokenBatch.source_ids``) is its position here."""
        widths = {ds.tokens_per_example for ds in datasets.values()}
        if len(widths) != 1:
            raise ValueError(f"the sources need one example length, got {widths}")
        self.tokens_per_example = widths.pop()
        self._datasets = dict(datasets)
        self._length = length
        self._stages = list(stages)
        self._starts = np.array([s.start for s in stages], np.int64)
        self._blends: list[GreedyBlend] = []
        self._orders: list[list[np.ndarray]] = []
        shuffles: dict[tuple[int, int], np.ndarray] = {}
        began = time.perf_counter()
        for stage in stages:
            missing = [n for n in stage.sources if n not in datasets]
            if missing:
                raise ValueError(f"data stage from example {stage.start}: unknown source(s) {missing}")
            if not np.isclose(sum(normalized(stage.weights)), 1.0) or min(stage.weights) < 0:
                raise ValueError(f"data stage from example {stage.start}: weights {list(stage.weights)} must be >= 0 with a positive sum")
            orders = []
            for name in stage.sources:
                size = len(datasets[name])
                if size == 0:
                    raise ValueError(f"source {name!r} has no training example to shuffle (data stage from example {stage.start})")
                if (size, stage.seed) not in shuffles:
                    shuffles[size, stage.seed] = nanoset_shuffle(size, stage.seed)
                orders.append(shuffles[size, stage.seed])
            self._orders.append(orders)
            self._blends.append(GreedyBlend(normalized(stage.weights)))
        logger.info("Nanotron order: %d shuffle(s) of %d examples in all (%.1f MiB) made in %.2f s", len(shuffles),
                    sum(size for size, _ in shuffles), sum(o.nbytes for o in shuffles.values()) / 2**20, time.perf_counter() - began)
        self.stages = [(s.start, dict(zip(s.sources, s.weights))) for s in stages]
        """``[(start_index, {source: weight}), ...]``, as ``MixtureDataset.stages``."""

    def __repr__(self) -> str:
        return f"NanosetOrderDataset({self.names}, {len(self._stages)} stage(s), length={self._length})"

    def is_finite(self) -> bool:
        return self._length is not None

    def current_len(self) -> int:
        return self._length if self._length is not None else np.iinfo(np.int64).max

    def final_len(self) -> int | None:
        return self._length

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per index, its source's id (position in ``names``) and the example of that source's train part it reads."""
        idx = as_indices(indices)
        if self._length is not None and idx.size and int(idx.max()) >= self._length:
            raise IndexError(f"{self!r}: index {int(idx.max())} is beyond its {self._length} examples (train_steps x batch)")
        sources = np.empty(len(idx), np.int64)
        examples = np.empty(len(idx), np.int64)
        stage_of = np.searchsorted(self._starts, idx, side="right") - 1
        for s in np.unique(stage_of).tolist():
            here = np.flatnonzero(stage_of == s)
            picked, draws = self._blends[s].locate(idx[here])
            for k, name in enumerate(self._stages[s].sources):
                mine = picked == k
                order = self._orders[s][k]
                sources[here[mine]] = self.names.index(name)
                examples[here[mine]] = order[draws[mine] % len(order)]
        return sources, examples

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        sources, examples = self.locate(idx)
        out = TokenBatch.empty(len(idx), self.tokens_per_example)
        finishers = []
        for c in np.unique(sources).tolist():
            rows = np.flatnonzero(sources == c)
            finishers.append(self._datasets[self.names[c]].read_into(examples[rows], out, rows))

        def assemble() -> TokenBatch:
            for finish in finishers:
                finish()
            out.source_ids[:] = sources
            return out

        return Pending(assemble)
