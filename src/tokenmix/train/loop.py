"""The training launch: build the caches if missing, train the tiny model on the loader's sharded batches, evaluate
every source's validation set, checkpoint, and resume exactly where a run stopped.

A checkpoint holds the parameters, the optimizer state, the step and the data the run trained on (``checkpoint.py``,
``data_identity.py``); the loader resumes with ``iter_from_step`` (no batch before it is read or replayed), so a run
stopped at step k and resumed sees the very batches an uninterrupted run sees (their fingerprints are logged to prove
it, and the resume checks that step k - 1's batch is still the one the checkpoint recorded). The mixture draws by the
run's weight log (``weight_log.py``), which checkpoints and ``weights.jsonl`` hold, and which new ``train_weights`` at a
resume extend from the resume step. ``metrics.jsonl`` in the
run directory gets one line per step and per evaluation; ``train.png`` draws them (``plots.py``). A run of several
processes (``processes.py``) trains the same global arrays in each, decides the same updates from the same reduced
statistics, and writes its files from process 0 alone.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tokenmix.config.caches import build_caches, open_cache
from tokenmix.datasets.base import Dataset
from tokenmix.datasets.mixture import MixtureDataset
from tokenmix.datasets.padded import PaddedDataset
from tokenmix.loader.batch import StepBatch
from tokenmix.loader.batch_schedule import BatchSchedule
from tokenmix.loader.loader import DataLoader
from tokenmix.loader.sharding import BatchLayout
from tokenmix.mixing.source_stats import SourceStats
from tokenmix.train.checkpoint import RECORD_FILE, Checkpoint, latest_checkpoint, load_state, save_checkpoint
from tokenmix.train.config import TrainerConfig, TrainLmConfig
from tokenmix.train.data_identity import accept_data_change, caches_identity, changed_fields, data_identity
from tokenmix.train.model import TinyLM, loss_and_count, per_source, row_losses, shard_params
from tokenmix.train.online_mixing import OnlineMixing
from tokenmix.train.optimizer import accept_optimizer_change, applied_learning_rate, make_optimizer, optimizer_identity
from tokenmix.train.processes import check_processes, global_value, is_writer, wait_for_all
from tokenmix.train.weight_log import LoggedStage, as_records, config_log, from_records, reweight_at_resume, stages, write_log

logger = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
BATCH_MAPPING = {"batch": "data"}
"""Training and evaluation batches are split over the mesh's data axis."""
BATCH_CHANGED = ("Every field the checkpoint records is the same, so the caches' contents, or the way tokenmix orders the "
                 "data (another version), changed since")

_eval_loss = eqx.filter_jit(loss_and_count)
"""Compiled once per process (per batch shape), not at every evaluation."""


@dataclass
class TrainResult:
    """What a run did: the steps it trained (from where it started), its last training loss (None when it had none to
    train), the last validation loss per source, each step's fingerprint, the final parameters, and the share of step
    time spent waiting for data."""

    first_step: int
    steps: int
    final_loss: float | None
    validation: dict[str, float]
    fingerprints: dict[int, str | None]
    model: TinyLM
    data_wait_share: float


def make_mesh(config: TrainLmConfig) -> Mesh:
    """The ``(data, model)`` mesh the trainer asks for, over this machine's devices (-1: the devices left)."""
    devices = jax.devices()
    sizes = dict(config.trainer.mesh)
    model = sizes.get("model", 1)
    data = sizes.get("data", -1)
    if data == -1:
        data = len(devices) // model
    if data * model > len(devices) or data < 1 or model < 1:
        raise ValueError(f"trainer.mesh {sizes} needs {data * model} devices; this machine has {len(devices)} "
                         "(set trainer.cpu_devices on a machine without accelerators)")
    # a plain Mesh: its axes are automatic, so XLA places the model's intermediate values itself
    return Mesh(np.array(devices[: data * model]).reshape(data, model), ("data", "model"))


def train(config: TrainLmConfig, stop_after: int | None = None) -> TrainResult:
    """Run (or resume) the training launch ``config`` describes; ``stop_after`` stops once this run has trained that
    many steps (a job given a time slice), checkpointing there, so that a later run resumes from it."""
    trainer, data = config.trainer, config.data
    check_processes(trainer)
    run_dir = trainer.checkpoint_dir
    os.makedirs(run_dir, exist_ok=True)
    checkpoint = latest_checkpoint(run_dir)
    finished = checkpoint is not None and checkpoint.step >= trainer.num_train_steps
    identity = data_identity(config)
    optimizer_settings = optimizer_identity(trainer)
    changes: dict[str, list[Any]] = {}
    optimizer_history: list[dict[str, Any]] = []
    if checkpoint is not None:  # before the caches are built: a config listing other shards must not extend them
        changes = changed_fields(checkpoint.record["data"], identity)
        accept_data_change(changes, checkpoint.step, checkpoint.path, trainer.allow_data_change)
        if not finished:  # a finished run trains no step with the settings it is given
            optimizer_history = _resumed_optimizer_history(checkpoint, optimizer_settings, trainer)
    if is_writer():  # one builder at a time; the others then find the caches built (or build their own on local disks)
        build_caches(data, progress=False)
    wait_for_all("caches built")
    if not is_writer():
        build_caches(data, progress=False)
    mesh = make_mesh(config)
    _check_batch_sizes(config, mesh)
    schedule = BatchSchedule.of(trainer.train_batch_size)
    # a finished run trains no step to reweight: its weights.jsonl stays its checkpoint's log
    weight_log = _resumed_weight_log(config, checkpoint, {} if finished else changes, schedule)
    train_set = data.train_set(trainer.seq_len, weight_log=None if weight_log is None else stages(weight_log))
    if weight_log is None and isinstance(train_set, MixtureDataset):
        weight_log = config_log(train_set, schedule)
    if weight_log is not None and is_writer():
        write_log(run_dir, weight_log)
    vocab = int(open_cache(data, train_set.names[0]).identity["vocab_size"])
    model = shard_params(TinyLM.init(config.model, vocab, jax.random.PRNGKey(trainer.seed)), mesh)
    optimizer = make_optimizer(trainer)
    opt_state = _replicate_unplaced(optimizer.init(eqx.filter(model, eqx.is_array)), mesh)
    caches = caches_identity(config, train_set.names)
    start = 0
    if checkpoint is not None:
        start = checkpoint.step
        cache_changes = changed_fields(checkpoint.record["caches"], caches)
        accept_data_change(cache_changes, start, checkpoint.path, trainer.allow_data_change)
        changes.update(cache_changes)
        model, opt_state = load_state(checkpoint, (model, opt_state))
        if finished:
            logger.info("%s has trained %d steps, all that trainer.num_train_steps (%d) asks for: nothing to train; raise "
                        "trainer.num_train_steps to train further (with trainer.allow_optimizer_change: it stretches the "
                        "learning rate's decay again)", run_dir, start, trainer.num_train_steps)
            return TrainResult(start, 0, None, {}, {}, model, 0.0)
        logger.info("resuming %s at step %d", run_dir, start)
    shardings = jax.tree_util.tree_map(lambda a: a.sharding, (model, opt_state))

    num_sources = len(train_set.names)

    @eqx.filter_jit
    def step_fn(model: TinyLM, opt_state: Any, batch: dict[str, jax.Array]) -> tuple[TinyLM, Any, jax.Array, jax.Array, jax.Array]:
        """One optimizer step; its loss, per source the summed loss and the tokens trained on (``SourceStats``), and the
        learning rate it applied."""
        def loss_fn(m: TinyLM) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            rows, counts = row_losses(m, batch["tokens"], batch["loss_mask"], batch["segment_ids"], batch["positions"])
            return jnp.sum(rows) / jnp.maximum(jnp.sum(counts), 1.0), (rows, counts)

        (loss, (rows, counts)), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model)
        learning_rate = applied_learning_rate(trainer, opt_state)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        # laid out as they came in, so that the next step's inputs are those this step was compiled for (XLA's own choice
        # of output layouts, written differently, made step 1 compile again)
        model, opt_state = jax.lax.with_sharding_constraint((eqx.apply_updates(model, updates), opt_state), shardings)
        by_source = jnp.stack([per_source(jax.lax.stop_gradient(rows), batch["source_ids"], num_sources),
                               per_source(counts, batch["source_ids"], num_sources)])
        return model, opt_state, loss, by_source, learning_rate

    mixing = OnlineMixing.start(config, train_set, weight_log, checkpoint) if data.adaptive is not None else None
    eval_size = trainer.eval_batch_size or trainer.first_batch_size()
    validation = evaluated_sets(data.validation_sets(trainer.seq_len), train_set.names)
    fingerprints: dict[int, str | None] = {}
    wait = busy = 0.0
    loss: float | None = None
    last_eval: dict[str, float] = {}
    with DataLoader(train_set, trainer.train_batch_size, mesh, BATCH_MAPPING, prefetch=trainer.prefetch, fingerprint=trainer.fingerprint,
                    positions=True, workers=trainer.loader_workers, read_timeout_s=trainer.loader_read_timeout_s) as loader, \
            open(_whole_lines(os.path.join(run_dir, METRICS)) if is_writer() else os.devnull, "a") as log:
        if checkpoint is not None and not changes and trainer.fingerprint:  # changed fields change the batches too
            changes = _last_batch_change(loader, checkpoint)
            accept_data_change(changes, start, checkpoint.path, trainer.allow_data_change, cause=BATCH_CHANGED)
        history = (checkpoint.record["data_changes"] if checkpoint else []) + ([{"step": start, "changed": changes}] if changes else [])
        iterator = loader.iter_from_step(start)
        step = start
        end = trainer.num_train_steps if stop_after is None else min(trainer.num_train_steps, start + stop_after)
        while step < end:
            began = time.perf_counter()
            step_batch = next(iterator)
            fetched = time.perf_counter()
            model, opt_state, loss, by_source, learning_rate = step_fn(model, opt_state, step_batch.batch.arrays())
            loss = float(loss)  # waits for the step: what the step cost, apart from waiting for data
            stats = SourceStats.of(train_set.names, global_value(by_source))
            if mixing is not None and (stage := mixing.observe(step, stats)) is not None:
                loader.append_stage(stage.start, stage.weights)
                weight_log.append(stage)  # type: ignore[union-attr]
                if is_writer():
                    write_log(run_dir, weight_log)  # type: ignore[arg-type]
                _write(log, {"kind": "weights", **as_records([stage])[0]})
            done = time.perf_counter()
            if step > start:  # the first step compiles
                wait += fetched - began
                busy += done - began
            fingerprints[step] = step_batch.fingerprint
            counts = np.bincount(global_value(step_batch.batch.source_ids.array), minlength=len(train_set.names))
            _write(log, {"kind": "train", "step": step, "loss": loss, "learning_rate": float(learning_rate), "examples": step_batch.size,
                         "seconds": done - began,
                         "data_wait_s": fetched - began, "fingerprint": step_batch.fingerprint,
                         "sources": {n: int(c) for n, c in zip(train_set.names, counts)}, **stats.as_record()})
            if (step + 1) % trainer.steps_per_eval == 0 or step + 1 == trainer.num_train_steps:
                last_eval = evaluate(model, validation, eval_size, trainer.max_eval_batches, mesh)
                _write(log, {"kind": "eval", "step": step, "loss": last_eval})
                logger.info("step %d: train loss %.3f, validation %s", step, loss, {k: round(v, 3) for k, v in last_eval.items()})
            step += 1
            if step % trainer.steps_per_checkpoint == 0 or step == end:
                save_checkpoint(run_dir, step, (model, opt_state), {"data": identity, "caches": caches, "data_changes": history, "last_batch":
                                {"step": step - 1, "fingerprint": fingerprints[step - 1]},
                                "weight_log": None if weight_log is None else as_records(weight_log),
                                "optimizer": optimizer_settings, "optimizer_changes": optimizer_history,
                                "mixing": None if mixing is None else mixing.state()}, trainer.keep_checkpoints)
    share = wait / busy if busy else 0.0
    if end > start:
        logger.info("trained steps %d to %d; waiting for data took %.2f%% of step time", start, end - 1, 100 * share)
    return TrainResult(start, end - start, loss, last_eval, fingerprints, model, share)


def evaluated_sets(validation: dict[str, Dataset], training: list[str]) -> dict[str, Dataset]:
    """The validation sets a run evaluates: those holding at least one example. Each training source left out (no
    validation set, or an empty one) is named in the log once, with the reason and the fix."""
    for name in training:
        if name not in validation:
            logger.warning("source %s has no validation set (no validation_urls, and no num_validation_sequences to hold "
                           "documents out of training): it is not evaluated", name)
    empty = [name for name, dataset in validation.items() if len(dataset) == 0]
    for name in empty:
        logger.warning("the validation set of %s holds no examples (its documents are shorter than one example, or there are "
                       "none): it is not evaluated; give it validation documents of at least one example", name)
    return {name: dataset for name, dataset in validation.items() if name not in empty}


def evaluation_batches(dataset: Dataset, batch_size: int, max_batches: int | None, mesh: Mesh) -> Iterator[StepBatch]:
    """The batches that evaluate ``dataset``: the first ``max_batches`` (None: every one), the last padded to
    ``batch_size`` with examples that weigh nothing (``PaddedDataset``), so that every example is evaluated, a set
    smaller than one batch included, as Levanter's ``pad_final_batch`` does. No batch past those is read."""
    padded = PaddedDataset(dataset, batch_size)
    steps = len(padded) // batch_size
    with DataLoader(padded, batch_size, mesh, BATCH_MAPPING, prefetch=0, positions=True) as loader:
        yield from itertools.islice(loader, steps if max_batches is None else min(steps, max_batches))


def evaluate(model: TinyLM, validation: dict[str, Dataset], batch_size: int, max_batches: int | None, mesh: Mesh) -> dict[str, float]:
    """Per source, the mean next-token loss over every trained token of its ``evaluation_batches`` (token-weighted: a
    batch counts by its tokens, not as one batch among others, so the padded last one weighs what its examples do)."""
    out = {}
    for name, dataset in validation.items():
        total = count = 0.0
        for step_batch in evaluation_batches(dataset, batch_size, max_batches, mesh):
            b = step_batch.batch.arrays()
            t, c = _eval_loss(model, b["tokens"], b["loss_mask"], b["segment_ids"], b["positions"])
            total, count = total + float(t), count + float(c)
        out[name] = total / max(count, 1.0)
    return out


def _check_batch_sizes(config: TrainLmConfig, mesh: Mesh) -> None:
    """Refuse, before any step, a training or evaluation batch size the mesh does not split, naming the trainer's field:
    the loader refused a training one naming only ``batch_size``, and an evaluation one at the first evaluation, after
    the steps before it were trained (and, past the last checkpoint, lost)."""
    trainer = config.trainer
    sizes = [("trainer.train_batch_size", size) for _, size in BatchSchedule.of(trainer.train_batch_size).stages]
    sizes += [("trainer.eval_batch_size", trainer.eval_batch_size)] if trainer.eval_batch_size is not None else []
    for name, size in sizes:
        try:
            BatchLayout(mesh, BATCH_MAPPING, size, trainer.seq_len)
        except ValueError as e:
            raise ValueError(f"{name} {size} does not fit trainer.mesh {dict(mesh.shape)}: {e}") from None


def _replicate_unplaced(state: Any, mesh: Mesh) -> Any:
    """``state`` with every array not laid out on ``mesh`` yet (the optimizer's step counts) replicated over it, so that
    every array a step takes in is laid out as the step lays out what it gives back."""
    replicated = NamedSharding(mesh, P())
    return jax.tree_util.tree_map(lambda a: a if isinstance(a.sharding, NamedSharding) else jax.device_put(a, replicated), state)


def _whole_lines(path: str) -> str:
    """``path``, its last line cut off first where it does not end in a newline (a machine that stopped mid-write left it
    torn, or padded with zero bytes): the lines appended next would follow it on the same line, and no reader could
    parse it. The cut is logged."""
    if not os.path.exists(path):
        return path
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        while end and b"\n" not in tail:
            start = max(0, end - 65536)
            f.seek(start)
            tail = f.read(end - start) + tail
            end = start
        if tail and not tail.endswith(b"\n"):
            keep = end + tail.rfind(b"\n") + 1
            torn = tail[tail.rfind(b"\n") + 1:]
            logger.warning("%s: cutting off its last line, which a stop mid-write left unfinished (%d bytes: %r)", path, len(torn),
                           torn[:80])
            f.truncate(keep)
    return path


def _write(log, record: dict[str, Any]) -> None:
    log.write(json.dumps(record) + "\n")
    log.flush()


def _resumed_weight_log(config: TrainLmConfig, checkpoint: Checkpoint | None, changes: dict[str, list[Any]],
                        schedule: BatchSchedule) -> list[LoggedStage] | None:
    """The weight log a resume draws by: its checkpoint's, with the new ``train_weights`` appended from the resume step
    when they changed (a hand reweight, already allowed). None for a new run, and where the checkpoint keeps no log
    (Nanotron's order, or a run from before the log), which then draws by ``train_weights``."""
    recorded = None if checkpoint is None else checkpoint.record.get("weight_log")
    if recorded is None:
        return None
    log = from_records(recorded, os.path.join(checkpoint.path, RECORD_FILE))  # type: ignore[union-attr]
    if any(name == "data.train_weights" or name.startswith("data.train_weights.") for name in changes):
        return reweight_at_resume(log, config.data.weight_schedule(), schedule, checkpoint.step)  # type: ignore[union-attr]
    return log


def _resumed_optimizer_history(checkpoint: Checkpoint, settings: dict[str, Any], trainer: TrainerConfig) -> list[dict[str, Any]]:
    """The checkpoint's history of optimizer changes, with this resume's (``[recorded, current]`` per field) once allowed.
    A checkpoint written before they were recorded cannot show its settings: it resumes with the config's, logged, and
    the change recorded from None (not recorded), so that every resume after it is checked."""
    if "optimizer" not in checkpoint.record:
        logger.warning("%s records no optimizer settings (it was written before tokenmix recorded them), so they cannot be "
                       "checked: resuming at step %d with this config's (%s). If the run was started with others, restore them "
                       "before it trains further; the checkpoints from here on record these", checkpoint.path, checkpoint.step,
                       ", ".join(f"{k} {v!r}" for k, v in settings.items()))
        return [{"step": checkpoint.step, "changed": {k: [None, v] for k, v in settings.items()}}]
    changes = changed_fields(checkpoint.record["optimizer"], settings)
    accept_optimizer_change(changes, trainer, checkpoint.step, checkpoint.path)
    return checkpoint.record["optimizer_changes"] + ([{"step": checkpoint.step, "changed": changes}] if changes else [])


def _last_batch_change(loader: DataLoader, checkpoint: Checkpoint) -> dict[str, list[Any]]:
    """The fingerprint of the last batch the checkpoint trained on, recorded and read now, where the two differ
    (nothing where the checkpoint's run kept no fingerprints)."""
    last = checkpoint.record["last_batch"]
    if last["fingerprint"] is None:
        return {}
    now = loader.batch(last["step"]).fingerprint
    return {} if now == last["fingerprint"] else {f"fingerprint of the batch of step {last['step']}": [last["fingerprint"], now]}
