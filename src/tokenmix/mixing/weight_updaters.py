"""Online weight algorithms: each ``update_every`` steps a ``WeightUpdater`` reads the per-source statistics of the
steps since its last update and returns the mixture's next weights.

Every algorithm's output goes through ``floored``: at least ``adaptive.floor`` per source, in whole multiples of
1 / ``WEIGHT_QUANTUM`` that sum to 1 exactly. An updater's state (``state()``, ``restore``) is JSON, kept in every
checkpoint, so a resumed run decides what the uninterrupted one decides. Both algorithms are pure numpy on the sums the
training step reduced over the mesh, so every host computes the same weights without talking to the others.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenmix.config.adaptive import WEIGHT_QUANTUM, AdaptiveMixing
from tokenmix.mixing.source_stats import SourceStats


def floored(weights: np.ndarray, floor_units: int) -> np.ndarray:
    """``weights`` (>= 0, summing to 1) mixed with the floor, in units of 1 / WEIGHT_QUANTUM summing to WEIGHT_QUANTUM:
    ``floor_units`` each, and the rest shared by ``weights`` (largest remainder)."""
    rest = WEIGHT_QUANTUM - floor_units * len(weights)
    share = np.asarray(weights, np.float64) / np.sum(weights) * rest
    units = np.floor(share).astype(np.int64)
    order = np.lexsort((np.arange(len(share)), -(share - units)))  # largest remainder first, ties by position
    units[order[: rest - int(units.sum())]] += 1
    return units + floor_units


class WeightUpdater(ABC):
    """An online weight algorithm over the mixture's sources (``names``, sorted by name).

    Sorted as the mixture's layout sorts them, so that the order a config lists its sources in changes no decision: the
    floor's largest remainders break ties by position, and sums in another order may round otherwise."""

    def __init__(self, config: AdaptiveMixing, names: Sequence[str]):
        config.check_sources(list(names))
        self.config = config
        self.names = tuple(sorted(names))
        self._listed = tuple(names)
        """The order a state saved without names (before they were saved) holds its sources in."""
        self.updates = 0

    def update(self, stats: SourceStats) -> dict[str, float]:
        """The next weights, from the statistics of the steps since the last update (its sources in any order); refuses
        statistics that are not finite numbers, from which no weight can be decided."""
        broken = [n for n, s, t in zip(stats.names, stats.loss_sums, stats.tokens) if not (math.isfinite(s) and math.isfinite(t))]
        if broken:
            raise ValueError(f"adaptive ({self.config.algorithm}): the training loss of {broken} over the steps since the last "
                             f"update is not a finite number ({stats.mean_losses()}), so no weights can be decided from it: the "
                             "model diverged. Resume from an earlier checkpoint with a lower trainer.learning_rate")
        self.updates += 1
        units = floored(self._propose(stats.in_order(self.names)), self.config.floor_units())
        return {name: int(u) / WEIGHT_QUANTUM for name, u in zip(self.names, units)}

    @abstractmethod
    def _propose(self, stats: SourceStats) -> np.ndarray:
        """The algorithm's own distribution over the sources (before the floor)."""

    def state(self) -> dict[str, Any]:
        """What a resume needs to go on deciding as the uninterrupted run would (JSON)."""
        return {"updates": self.updates, "names": list(self.names)}

    def restore(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])

    def _saved(self, state: dict[str, Any], key: str) -> np.ndarray:
        """The per-source values ``state[key]``, in ``names`` order, whatever order the state lists its sources in."""
        saved = list(state.get("names", self._listed))
        return np.asarray(state[key], np.float64)[[saved.index(name) for name in self.names]]


class OdmUpdater(WeightUpdater):
    """ODM (Albalak, Pan, Raffel, Wang 2023, arXiv:2312.02406): EXP3 over the sources, the training loss as reward.

    At update t (from 1), with K sources: exploration ``eps_t = min(1/K, sqrt(ln K / (K t)))``; each source's reward
    estimate ``R_i <- alpha R_i + (1 - alpha) L_i`` (``alpha``: ``odm_smoothing``; ``L_i`` its mean training loss over
    the window); the policy ``pi_i = (1 - K eps_t) softmax(eps_{t-1} R)_i + eps_t``. ODM samples one source per batch
    and so divides the observed loss by the chance of observing it (``L / pi_i``); here every batch holds every source
    with a positive weight, each is observed at every update, and the estimate takes the loss itself. A source absent
    from the window keeps its estimate. High-loss sources gain weight: the paper's premise is that they have the most
    left to learn (a source of pure noise, too)."""

    def __init__(self, config: AdaptiveMixing, names: Sequence[str]):
        super().__init__(config, names)
        self.rewards = np.zeros(len(names))

    def _exploration(self, t: int) -> float:
        k = len(self.names)
        return min(1 / k, math.sqrt(math.log(k) / (k * t))) if t > 0 and k > 1 else 1 / k

    def _propose(self, stats: SourceStats) -> np.ndarray:
        t = self.updates
        seen = stats.tokens > 0
        alpha = self.config.odm_smoothing
        losses = np.where(seen, stats.loss_sums / np.maximum(stats.tokens, 1), 0.0)
        self.rewards = np.where(seen, alpha * self.rewards + (1 - alpha) * losses, self.rewards)
        k = len(self.names)
        logits = self._exploration(t - 1) * self.rewards
        soft = np.exp(logits - logits.max())
        eps = self._exploration(t)
        return (1 - k * eps) * soft / soft.sum() + eps

    def state(self) -> dict[str, Any]:
        return {**super().state(), "rewards": self.rewards.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self.rewards = self._saved(state, "rewards")


class DoReMiUpdater(WeightUpdater):
    """DoReMi's online form (Xie et al. 2023, arXiv:2305.10429, Algorithm 1): exponentiated gradient on the excess loss.

    A source's excess loss is its training loss over a reference model's. Per update: ``lambda_i = max(L_i - ref_i, 0)``
    (``L_i`` the mean training loss over the window, ``ref_i`` the reference run's last validation loss of the source,
    from ``reference_metrics``); ``a_i <- a_i exp(eta lambda_i)`` normalized (``eta``: ``doremi_step_size``), then
    ``(1 - c) a + c / K`` (``c``: ``doremi_smoothing``). DoReMi moves weight to sources the model can still learn more of
    than it has; a source the reference learns no better (noise) has no excess loss and loses weight. ``a`` starts at the
    weights in effect when the updater starts (the first stage's, in a new run)."""

    def __init__(self, config: AdaptiveMixing, names: Sequence[str], initial: dict[str, float]):
        super().__init__(config, names)
        self.reference = reference_losses(config.reference_metrics or "", self.names)
        start = np.array([initial.get(n, 0.0) for n in self.names], np.float64)
        self.alpha = start / start.sum()

    def _propose(self, stats: SourceStats) -> np.ndarray:
        seen = stats.tokens > 0
        losses = np.where(seen, stats.loss_sums / np.maximum(stats.tokens, 1), self.reference)
        excess = np.maximum(losses - self.reference, 0.0)
        raised = np.log(np.maximum(self.alpha, 1e-300)) + self.config.doremi_step_size * excess
        alpha = np.exp(raised - raised.max())
        c = self.config.doremi_smoothing
        self.alpha = (1 - c) * alpha / alpha.sum() + c / len(self.names)
        return self.alpha

    def state(self) -> dict[str, Any]:
        return {**super().state(), "alpha": self.alpha.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self.alpha = self._saved(state, "alpha")


def reference_losses(path: str, names: Sequence[str]) -> np.ndarray:
    """Per source in ``names``, its validation loss at the last evaluation of the run whose ``metrics.jsonl`` is ``path``."""
    last: dict[str, float] | None = None
    try:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if record.get("kind") == "eval":
                    last = record["loss"]
    except OSError as e:
        raise ValueError(f"adaptive.reference_metrics: cannot read {path} ({e}); give the metrics.jsonl of a reference run") from None
    if last is None:
        raise ValueError(f"adaptive.reference_metrics: {path} holds no evaluation; train the reference run until it evaluates")
    missing = [n for n in names if n not in last]
    if missing:
        raise ValueError(f"adaptive.reference_metrics: {path}'s last evaluation has no loss for {missing} (it has {sorted(last)}); "
                         "the reference run must evaluate every training source")
    return np.array([float(last[n]) for n in names])


def make_updater(config: AdaptiveMixing, names: Sequence[str], initial: dict[str, float]) -> WeightUpdater:
    """The updater ``config.algorithm`` names, over ``names``, starting from the weights in effect ``initial``."""
    if config.algorithm == "odm":
        return OdmUpdater(config, names)
    return DoReMiUpdater(config, names, initial)
