"""A run's weight log: the training mixture's stages of weights as records, in its checkpoints and in ``weights.jsonl``
beside it, and the stages a hand reweight at a resume appends.

A batch is a function of the config, the seed, the step and this log: a resume draws by the log its checkpoint
recorded (``LMMixtureDatasetConfig.train_set(weight_log=...)``), whatever ``train_weights`` now says, so the steps
already trained keep their batches and every source's draws go on where they stopped. A record holds the stage's
start (an example index, what the mixture reads) and, for people, the step whose batch holds that index, who set it
(``config``, ``resume`` or an online algorithm) and the step at which it was decided. ``weights.jsonl`` is rewritten
whole (under a temporary name, then renamed) from the log a run holds, so after a kill it is the log of the checkpoint
the run resumed from plus what the resumed run appended.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tokenmix.datasets.mixture import MixtureDataset
from tokenmix.loader.batch_schedule import BatchSchedule

logger = logging.getLogger(__name__)

WEIGHT_LOG = "weights.jsonl"


@dataclass(frozen=True)
class LoggedStage:
    """One stage of the weight log: from example index ``start`` (in the batch of ``step``) the mixture draws by
    ``weights``; ``by`` set it, deciding at step ``decided_at_step`` (None: before the run)."""

    start: int
    step: int
    weights: dict[str, float]
    by: str
    decided_at_step: int | None = None


def config_log(train_set: MixtureDataset, schedule: BatchSchedule) -> list[LoggedStage]:
    """The log a run starts with: the stages ``train_weights`` gives."""
    return [LoggedStage(start, schedule.steps_within(start), dict(weights), "config") for start, weights in train_set.stages]


def as_records(log: Sequence[LoggedStage]) -> list[dict[str, Any]]:
    """The log as JSON objects (a checkpoint's ``weight_log``, the lines of ``weights.jsonl``)."""
    return [asdict(stage) for stage in log]


def from_records(records: Sequence[Mapping[str, Any]], where: str) -> list[LoggedStage]:
    """The log ``records`` hold; ``where`` names the file they come from in the error a malformed record raises."""
    try:
        return [LoggedStage(int(r["start"]), int(r["step"]), {str(k): float(v) for k, v in r["weights"].items()}, str(r["by"]),
                            None if r.get("decided_at_step") is None else int(r["decided_at_step"])) for r in records]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{where}: the weight log's stages need start, step, weights and by ({type(e).__name__}: {e})") from None


def stages(log: Sequence[LoggedStage]) -> list[tuple[int, dict[str, float]]]:
    """The log as the ``(start_index, weights)`` stages a mixture draws by."""
    return [(stage.start, dict(stage.weights)) for stage in log]


def reweight_at_resume(log: Sequence[LoggedStage], wanted: Sequence[tuple[int, Mapping[str, float]]], schedule: BatchSchedule,
                       step: int) -> list[LoggedStage]:
    """``log`` with the stages ``wanted`` (the config's, starts in example indices) gives from ``step`` on appended: the
    stage in effect at ``step`` from that step's first example, the later ones at their own starts.

    Stages of the log starting at or after that example were set but never drawn from (a later ``train_weights`` stage,
    an online update waiting for its boundary): the hand reweight replaces them, and the log names them as dropped."""
    at = schedule.offset(step)
    kept = [stage for stage in log if stage.start < at]
    if len(kept) < len(log):
        logger.warning("resume at step %d reweights by hand: dropping the logged stage(s) from example %d on, never drawn "
                       "from: %s", step, at, as_records(log[len(kept):]))
    current = max((i for i, (start, _) in enumerate(wanted) if start <= at), default=0)
    appended = [(at, dict(wanted[current][1]))] + [(start, dict(w)) for start, w in wanted[current + 1:]]
    out = kept + [LoggedStage(start, schedule.steps_within(start), weights, "resume", step) for start, weights in appended]
    logger.warning("resume at step %d: the mixture draws by the new train_weights from example %d on (%s); each source's "
                   "draws go on where they stopped", step, at, as_records(out[len(kept):]))
    return out


def write_log(run_dir: str, log: Sequence[LoggedStage]) -> str:
    """Write ``log`` as ``<run_dir>/weights.jsonl``, one stage a line, replacing the file in one rename."""
    path = os.path.join(run_dir, WEIGHT_LOG)
    partial = path + ".partial"
    with open(partial, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in as_records(log))
    os.replace(partial, path)
    return path


def read_log(run_dir: str) -> list[LoggedStage]:
    """The weight log in ``<run_dir>/weights.jsonl``."""
    return read_log_file(os.path.join(run_dir, WEIGHT_LOG))


def read_log_file(path: str) -> list[LoggedStage]:
    """The weight log in the JSON-lines file ``path`` (a run's ``weights.jsonl``); refused, naming the line, where its
    stages do not start at example 0 and go on in increasing order (a file edited by hand: lines reordered, the first
    removed), which no run draws by."""
    records, numbers = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                records += [json.loads(line)] if line.strip() else []
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {number}: not a JSON record ({e}); a weight log holds one JSON object a line "
                                 "(a run's weights.jsonl)") from None
            numbers += [number] if line.strip() else []
    log = from_records(records, path)
    fix = ("as the run wrote them; restore the file (a resumed run rewrites it from its checkpoint's log, "
           "<run>/checkpoints/step-<N>/checkpoint.json's weight_log)")
    if log and log[0].start != 0:
        raise ValueError(f"{path}, line {numbers[0]}: the first stage starts at example {log[0].start}, not 0: a weight log's "
                         f"stages start at example 0 and increase, {fix}")
    for number, before, stage in zip(numbers[1:], log, log[1:]):
        if stage.start <= before.start:
            raise ValueError(f"{path}, line {number}: the stage starts at example {stage.start}, not after the line before's "
                             f"{before.start}: a weight log's stages start at example 0 and increase, {fix}")
    return log
