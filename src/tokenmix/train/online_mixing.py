"""Online mixing in a training run: per-source statistics gathered step by step, a ``WeightUpdater`` asked every
``adaptive.update_every`` steps, and each update appended to the mixture and its weight log at a deterministic
boundary.

An update decided after step s applies from the first block of the mixture's last stage that starts at or after step
``s + delay``'s first example. ``delay`` is at least what the loader may have read ahead when the update is decided
(the prefetch queue, the step the prefetch thread is reading, and the step just trained: ``trainer.prefetch + 2``), so
no batch already read changes; every host decides the same from the same reduced statistics, and a resumed run,
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
from tokenmix.train.checkpoint import Checkpoint
from tokenmix.train.config import TrainLmConfig
from tokenmix.train.source_stats import SourceStats
from tokenmix.train.weight_log import LoggedStage
from tokenmix.train.weight_updaters import WeightUpdater, make_updater

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
        than the loader's read-ahead and reader processes (which hold a copy of the mixture an update would not reach)."""
        adaptive, trainer = config.data.adaptive, config.trainer
        assert adaptive is not None
        ahead = trainer.prefetch + 2
        if trainer.loader_workers:
            raise ValueError(f"adaptive mixing appends its updates to the mixture this process reads, and the "
                             f"{trainer.loader_workers} reader process(es) of trainer.loader_workers read their own copy: set "
                             "trainer.loader_workers: 0 (the prefetch thread reads ahead instead)")
        delay = ahead if adaptive.delay is None else adaptive.delay
        if delay < ahead:
            raise ValueError(f"adaptive.delay {delay} is less than the {ahead} steps the loader may have read ahead when an update "
                             f"is decided (trainer.prefetch {trainer.prefetch} + 2): an update would change batches already read. "
                             f"Set adaptive.delay to at least {ahead}, or leave it unset")
        names = list(train_set.names)
        updater = make_updater(adaptive, names, log[0].weights)
        zero = np.zeros(len(names))
        mixing = OnlineMixing(adaptive, updater, SourceStats(tuple(names), zero, zero), train_set, BatchSchedule.of(trainer.train_batch_size), delay)
        saved = None if checkpoint is None else checkpoint.record.get("mixing")
        if saved is not None:
            updater.restore(saved["updater"])
            mixing.window = SourceStats(tuple(names), np.asarray(saved["window"]["loss_sums"]), np.asarray(saved["window"]["tokens"]))
        return mixing

    def observe(self, step: int, stats: SourceStats) -> LoggedStage | None:
        """Add step ``step``'s statistics; at the end of a window, the stage the update appends to the mixture."""
        self.window = self.window + stats
        if (step + 1) % self.config.update_every:
            return None
        weights = self.updater.update(self.window)
        self.window = SourceStats(self.window.names, np.zeros_like(self.window.tokens), np.zeros_like(self.window.tokens))
        start = self.train_set.next_boundary(self.schedule.offset(step + self.delay))
        self.train_set.append_stage(start, weights)
        logger.info("step %d: %s sets the weights %s from example %d (step %d)", step, self.config.algorithm, weights, start,
                    self.schedule.steps_within(start))
        return LoggedStage(start, self.schedule.steps_within(start), weights, self.config.algorithm, step)

    def state(self) -> dict[str, Any]:
        """The updater's state and the statistics of the window under way (a checkpoint's ``mixing``)."""
        return {"updater": self.updater.state(),
                "window": {"loss_sums": self.window.loss_sums.tolist(), "tokens": self.window.tokens.tolist()}}
