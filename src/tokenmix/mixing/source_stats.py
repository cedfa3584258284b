"""Per-source training statistics of one step: each source's summed loss and the tokens it was trained on, as the
step computed them from the batch's source ids and loss mask. They feed an online mixture's weight updates and the
run's metrics (``source_loss``: the mean loss per trained token, ``source_tokens``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SourceStats:
    """Per source (in mixture order): summed training loss and trained tokens of one step (or of several, added)."""

    names: tuple[str, ...]
    loss_sums: np.ndarray
    tokens: np.ndarray

    @staticmethod
    def of(names: Sequence[str], by_source: np.ndarray) -> SourceStats:
        """From the step's ``(2, sources)`` array: loss sums, then token counts."""
        return SourceStats(tuple(names), np.asarray(by_source[0], np.float64), np.asarray(by_source[1], np.float64))

    def __add__(self, other: SourceStats) -> SourceStats:
        return SourceStats(self.names, self.loss_sums + other.loss_sums, self.tokens + other.tokens)

    def in_order(self, names: Sequence[str]) -> SourceStats:
        """The same statistics over ``names``, the same sources in another order."""
        order = [self.names.index(name) for name in names]
        return SourceStats(tuple(names), self.loss_sums[order], self.tokens[order])

    def mean_losses(self) -> dict[str, float | None]:
        """Per source, its mean loss per trained token (None for a source not trained on)."""
        return {n: float(s / t) if t > 0 else None for n, s, t in zip(self.names, self.loss_sums, self.tokens)}

    def as_record(self) -> dict[str, Any]:
        """The fields a step's line of ``metrics.jsonl`` gets."""
        return {"source_loss": self.mean_losses(), "source_tokens": {n: int(t) for n, t in zip(self.names, self.tokens)}}
