"""``adaptive:``, next to ``train_weights``: an online algorithm that changes the mixture's weights during a run from the
per-source training losses (``mixing/weight_updaters.py``), appending each update to the run's weight log."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ALGORITHMS = ("odm", "doremi")
WEIGHT_QUANTUM = 10_000
"""Weights an algorithm sets are whole multiples of 1 / WEIGHT_QUANTUM: short decimals, so the mixture layout of every
stage has a short period and cheap random access (``mixture_layout.py``), and they read back from JSON exactly."""


@dataclass(frozen=True)
class AdaptiveMixing:
    """An online weight algorithm and when its updates apply. ``train_weights`` is the first stage."""

    algorithm: Literal["odm", "doremi"]
    """odm: Albalak et al. 2023, "Efficient Online Data Mixing For Language Model Pre-Training" (EXP3, the training loss
    as reward). doremi: Xie et al. 2023, "DoReMi: Optimizing Data Mixtures Speeds Up Language Model Pretraining", its
    online form (exponentiated gradient on the excess loss over a reference run)."""
    update_every: int = 10
    """Steps between updates; each update reads the per-source statistics of the steps since the last."""
    delay: int | None = None
    """Steps after its decision from which an update may apply (at the first mixture block starting there or later); at
    least what the loader may have read ahead (``trainer.prefetch + 2``), which is also what None means."""
    floor: float = 0.01
    """No source's weight ever goes below this (0: an algorithm may starve a source)."""
    odm_smoothing: float = 0.9
    """ODM's alpha: the reward estimate keeps this share of its old value at each update."""
    doremi_step_size: float = 1.0
    """DoReMi's eta: the exponentiated-gradient step on the excess losses."""
    doremi_smoothing: float = 1e-3
    """DoReMi's c: the share of the uniform distribution mixed into each update."""
    reference_metrics: str | None = None
    """doremi: the ``metrics.jsonl`` of a reference run on these sources; its last evaluation's per-source validation
    losses are the reference losses."""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"adaptive.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if not isinstance(self.update_every, int) or self.update_every < 1:
            raise ValueError(f"adaptive.update_every must be a number of steps >= 1, got {self.update_every!r}")
        if self.delay is not None and (not isinstance(self.delay, int) or self.delay < 1):
            raise ValueError(f"adaptive.delay must be a number of steps >= 1 (or unset: the loader's read-ahead), got {self.delay!r}")
        if not 0 <= self.floor < 1:
            raise ValueError(f"adaptive.floor must be a weight in [0, 1), got {self.floor!r}")
        if not 0 <= self.odm_smoothing < 1:
            raise ValueError(f"adaptive.odm_smoothing (ODM's alpha) must be in [0, 1), got {self.odm_smoothing!r}")
        if not self.doremi_step_size > 0 or not 0 <= self.doremi_smoothing <= 1:
            raise ValueError(f"adaptive.doremi_step_size must be > 0 and adaptive.doremi_smoothing in [0, 1], got "
                             f"{self.doremi_step_size!r} and {self.doremi_smoothing!r}")
        if self.algorithm == "doremi" and not self.reference_metrics:
            raise ValueError("adaptive.algorithm doremi needs adaptive.reference_metrics: the metrics.jsonl of a reference run on "
                             "these sources (train one with fixed train_weights first)")

    def floor_units(self) -> int:
        """The floor in units of 1 / WEIGHT_QUANTUM, rounded up."""
        return math.ceil(round(self.floor * WEIGHT_QUANTUM, 6))

    def check_sources(self, names: list[str]) -> None:
        """Refuse a floor that the sources cannot all get (``floor x sources > 1``)."""
        if self.floor_units() * len(names) > WEIGHT_QUANTUM:
            raise ValueError(f"adaptive.floor {self.floor} for each of {len(names)} sources adds up to more than 1; lower it to at "
                             f"most {1 / len(names):.4g}")
