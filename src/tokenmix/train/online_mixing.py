"""Online mixing in a training run: per-source statistics gathered step by step, a ``WeightUpdater`` asked every
``adaptive.update_every`` steps, and each update appended to the mixture and its weight log at a deterministic
boundary.

An update decided after step s applies from the first block of the mixture's last stage that starts at or after step
``s + delay``'s first example. ``delay`` is at least what the loader may have read ahead when the update is decided
(the step after it, ``DataLoader.steps_read_ahead``: the prefetch queue, the step its thread is reading, and each reader
process's slots), so no batch already read changes; every host decides the same from the same reduced statistics, and a resumed run,
restoring the updater's state and the statistics of its unfinished window from the checkpoint, decides as the
uninterrupted run did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenmix.config.adaptive import AdaptiveMixing
from tokenmix.datasets.mixture import MixtureDataset
from tokenmix.loader.batch_schedule import BatchSchedule
from tokenmix.loader.loader import steps_read_ahead
from tokenmix.mixing.source_stats import SourceStats
from tokenmix.mixing.weight_updaters import WeightUpdater, make_updater
from tokenmix.train.checkpoint import Checkpoint
from tokenmix.train.config import TrainLmConfig
from tokenmix.train.data_identity import ALLOW_FLAG
from tokenmix.train.weight_log import LoggedStage

logger = logging.getLogger(__name__)


@dataclass
class OnlineMixing:
    """The run's updater, the statistics since its last update, and where its updates go."""

    config: AdaptiveMixing
    updater: WeightUpdater
    window: SourceStats
    train_set: MixtureDataset
    schedule: BatchSchedule
    delay: int

    @staticmethod
    def start(config: TrainLmConfig, train_set: MixtureDataset, log: list[LoggedStage], checkpoint: Checkpoint | None) -> OnlineMixing:
        """The run's online mixing, its state restored from ``checkpoint`` when it has one; refuses a ``delay`` shorter
        than the loader's read-ahead."""
        adaptive, trainer = config.data.adaptive, config.trainer
        assert adaptive is not None
        ahead = 1 + steps_read_ahead(trainer.prefetch, trainer.loader_workers, 0)
        saved = None if checkpoint is None else checkpoint.record.get("mixing")
        recorded = None if saved is None else saved.get("delay")
        delay = adaptive.delay if adaptive.delay is not None else ahead if recorded is None else int(recorded)
        if adaptive.delay is None and recorded is not None and delay < ahead:
            raise ValueError(f"{checkpoint.path}: adaptive.delay is unset, and the run so far applied each update {delay} steps "  # type: ignore[union-attr]
                             f"after deciding it (its loader's read-ahead then); trainer.prefetch {trainer.prefetch} and "
                             f"trainer.loader_workers {trainer.loader_workers} now read {ahead} steps ahead, so the updates "
                             f"would change batches already read. Go back to settings that read at most {delay} steps ahead, "
                             f"or set adaptive.delay to at least {ahead} with {ALLOW_FLAG} (the updates from this resume on "
                             "then start later than in the run so far)")
        if delay < ahead:
            raise ValueError(f"adaptive.delay {delay} is less than the {ahead} steps the loader may have read ahead when an update "
                             f"is decided (the step after it, trainer.prefetch {trainer.prefetch} + 1, and trainer.loader_workers "
                             f"{trainer.loader_workers} x the prefetch): an update would change batches already read. Set "
                             f"adaptive.delay to at least {ahead}, or leave it unset")
        names = list(train_set.names)
        updater = make_updater(adaptive, names, log[-1].weights)
        zero = np.zeros(len(names))
        mixing = OnlineMixing(adaptive, updater, SourceStats(tuple(names), zero, zero), train_set, BatchSchedule.of(trainer.train_batch_size), delay)
        if saved is not None and saved.get("algorithm") != adaptive.algorithm:
            logger.warning("%s: its online mixing was %s, now %s (allowed as a data change): %s starts afresh from the log's "
                           "weights so far", checkpoint.path, saved.get("algorithm"), adaptive.algorithm, adaptive.algorithm)  # type: ignore[union-attr]
        elif saved is not None and sorted(saved["window"].get("names", names)) != sorted(names):
            logger.warning("%s: its online mixing was over the sources %s, now %s (allowed as a data change): %s starts afresh "
                           "from the log's weights so far", checkpoint.path, sorted(saved["window"]["names"]), sorted(names),  # type: ignore[union-attr]
                           adaptive.algorithm)
        elif saved is not None:
            updater.restore(saved["updater"])
            window = saved["window"]
            mixing.window = SourceStats(tuple(window.get("names", names)), np.asarray(window["loss_sums"], np.float64),
                                        np.asarray(window["tokens"], np.float64)).in_order(names)
        return mixing

    def observe(self, step: int, stats: SourceStats) -> LoggedStage | None:
        """Add step ``step``'s statistics; at the end of a window, the stage the update sets, for the caller to append to
        the loader's mixture (``DataLoader.append_stage``) and to the log."""
        self.window = self.window + stats
        if (step + 1) % self.config.update_every:
            return None
        weights = self.updater.update(self.window)
        self.window = SourceStats(self.window.names, np.zeros_like(self.window.tokens), np.zeros_like(self.window.tokens))
        start = self.train_set.next_boundary(self.schedule.offset(step + self.delay))
        end = self.train_set.final_len()
        if end is not None and start >= end:
            logger.info("step %d: %s's weights %s would start at example %d, but the mixture ends at %d (%s): not applied",
                        step, self.config.algorithm, weights, start, end, self.train_set.stop_strategy)
            return None
        logger.info("step %d: %s sets the weights %s from example %d (step %d)", step, self.config.algorithm, weights, start,
                    self.schedule.steps_within(start))
        return LoggedStage(start, self.schedule.steps_within(start), weights, self.config.algorithm, step)

    def state(self) -> dict[str, Any]:
        """The updater's state and the statistics of the window under way (a checkpoint's ``mixing``)."""
        return {"algorithm": self.config.algorithm, "delay": self.delay, "updater": self.updater.state(),
                "window": {"names": list(self.window.names), "loss_sums": self.window.loss_sums.tolist(),
                           "tokens": self.window.tokens.tolist()}}
