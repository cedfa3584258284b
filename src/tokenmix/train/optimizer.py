"""The optimizer a run trains with, AdamW whose learning rate warms up then decays by a cosine to 0 at
``trainer.num_train_steps``, and the named fields that determine it, which every checkpoint records and a resume
compares.

The schedule is a function of the step and of ``num_train_steps``, ``learning_rate`` and ``warmup_steps``: a resume
with any of them changed trains its steps at another learning rate than the run was on (a longer ``num_train_steps``
stretches the cosine again, and the rate at the resumed step jumps), and one with another ``weight_decay`` decays the
weights otherwise. Such a resume is refused naming each change, unless ``trainer.allow_optimizer_change``; then the
change is logged, recorded in the checkpoints that follow (``optimizer_changes``), and the new settings apply from the
resumed step (the schedule is evaluated at the step the optimizer state restores, so the run goes on along the new
schedule at that step).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import optax

from tokenmix.train.config import TrainerConfig

logger = logging.getLogger(__name__)

SCHEDULE_FIELDS = ("num_train_steps", "learning_rate", "warmup_steps")
"""The trainer fields the learning rate schedule is made of."""
OPTIMIZER_FIELDS = (*SCHEDULE_FIELDS, "weight_decay")
"""The trainer fields that determine the optimizer's updates (the rest: cadences, prefetch, workers, ... do not)."""
ADAM = {"b1": 0.9, "b2": 0.999, "eps": 1e-8}
"""AdamW's moments (optax's defaults, given here so that a checkpoint records them and another version changing them is
refused as a change)."""
ALLOW_FLAG = "--trainer.allow_optimizer_change true"


class OptimizerChangedError(ValueError):
    """A resume would train with other optimizer settings than the checkpoint it resumes from."""


def learning_rate_schedule(trainer: TrainerConfig) -> optax.Schedule:
    """The learning rate by step: rising linearly from 0 over ``warmup_steps`` to ``learning_rate``, then decaying by a
    cosine to 0 at ``num_train_steps``."""
    return optax.warmup_cosine_decay_schedule(0.0, trainer.learning_rate, trainer.warmup_steps, _decay_end(trainer))


def _decay_end(trainer: TrainerConfig) -> int:
    """The step at which the learning rate has decayed to 0: ``num_train_steps``, or the step after the warmup where the
    run is no longer than its warmup (optax needs a decay of at least one step)."""
    return max(trainer.num_train_steps, trainer.warmup_steps + 1)


def make_optimizer(trainer: TrainerConfig) -> optax.GradientTransformation:
    """AdamW on ``learning_rate_schedule`` with ``trainer.weight_decay``."""
    return optax.adamw(learning_rate_schedule(trainer), weight_decay=trainer.weight_decay, **ADAM)


def applied_learning_rate(trainer: TrainerConfig, opt_state: Any) -> jax.Array:
    """The learning rate the next update of ``opt_state`` applies: the schedule at the step count the state holds (the
    restored one, after a resume)."""
    counts = [s.count for s in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
              if isinstance(s, optax.ScaleByScheduleState)]
    return learning_rate_schedule(trainer)(counts[0])


def optimizer_identity(trainer: TrainerConfig) -> dict[str, Any]:
    """The named fields that determine the optimizer and its schedule, as a checkpoint records them."""
    return {**{f"trainer.{name}": getattr(trainer, name) for name in OPTIMIZER_FIELDS},
            "optimizer": "adamw, warmup_cosine_decay_schedule from 0 to 0", **{f"optimizer.{k}": v for k, v in ADAM.items()}}


def accept_optimizer_change(changes: dict[str, list[Any]], trainer: TrainerConfig, step: int, where: str) -> None:
    """Refuse to resume from checkpoint ``where`` at ``step`` with the optimizer settings ``changes`` names
    (``[recorded, current]``), naming each change, what it does to the learning rate from ``step``, and the fixes,
    unless ``trainer.allow_optimizer_change``; then log it."""
    if not changes:
        return
    lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())
    effect = _effect(changes, trainer, step)
    if not trainer.allow_optimizer_change:
        raise OptimizerChangedError(
            f"{where} was trained up to step {step} with other optimizer settings than this config gives (checkpoint -> "
            f"config):\n{lines}\n{effect}Restore the checkpoint's values to resume the run as it was going; or pass "
            f"{ALLOW_FLAG} (trainer.allow_optimizer_change: true) to train from step {step} with this config's settings (the "
            "change is logged and recorded in the checkpoints); or use another trainer.checkpoint_dir to start a new run")
    logger.warning("resuming %s at step %d with changed optimizer settings (trainer.allow_optimizer_change; checkpoint -> "
                   "config):\n%s\n%s", where, step, lines, effect.rstrip())


def _effect(changes: dict[str, list[Any]], trainer: TrainerConfig, step: int) -> str:
    """What the changed settings do to the training from ``step``, in words."""
    recorded = {name: changes[f"trainer.{name}"][0] for name in OPTIMIZER_FIELDS if f"trainer.{name}" in changes}
    words = ""
    if any(name in recorded for name in SCHEDULE_FIELDS):
        before = dataclasses.replace(trainer, **recorded)
        was, now = (float(learning_rate_schedule(t)(step)) for t in (before, trainer))
        words += (f"The learning rate from step {step} follows this config's schedule: at step {step} it is {now:.6g} where "
                  f"the checkpoint's schedule gives {was:.6g}, ")
        end = _decay_end(trainer)
        if "num_train_steps" in recorded:
            words += (f"and the cosine decay is stretched again over steps {trainer.warmup_steps} to {end} (it reaches 0 at step "
                      f"{end} instead of step {_decay_end(before)}); the steps before {step} "
                      "are not trained again.\n")
        else:
            words += f"decaying to 0 at step {end}.\n"
    if "weight_decay" in recorded:
        words += f"The weights decay by {trainer.weight_decay} from step {step} (by {recorded['weight_decay']} before).\n"
    return words
