"""A run's checkpoints: one directory per step, ``<run>/checkpoints/step-<N>/``, holding the parameters and optimizer
state (``state.eqx``) and a record (``checkpoint.json``: the step, the state file's size and digest, the data the run
trained on and its caches, the fingerprint of its last batch).

A checkpoint is written whole under a temporary name (``.step-<N>.partial``), flushed to disk, and renamed into place
in one step, so a kill at any instant leaves the step's checkpoint whole or absent, never parameters of one step
under another step's number. Older ones are removed the same way round (renamed aside, then deleted), keeping the
newest ``keep``. A run resumes from the newest checkpoint in place; what a kill left half-written or half-deleted is
removed then. One that is in place but does not load (its files changed afterwards) is refused by name, never
skipped for an older one silently: the error names the older checkpoint to resume from once it is moved aside.

A run of several processes gathers every array (``process_allgather``) and process 0 alone writes the checkpoint, the
others waiting until it is in place; the file holds whole arrays, so any number of processes and devices resumes it
(each process reads it, and places its own part of every array).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from tokenmix._file_digest import file_digest
from tokenmix.train.processes import global_value, is_writer, wait_for_all

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.eqx"
RECORD_FILE = "checkpoint.json"
LEGACY_FILES = ("checkpoint.eqx", "checkpoint.json")
"""The layout before checkpoints were directories: parameters and step side by side in the run directory."""

_STEP = re.compile(r"step-(\d+)")
_LEFT_BY_A_KILL = re.compile(r"\.step-\d+\.(partial|deleting)")


class CheckpointError(ValueError):
    """A run directory's checkpoint cannot be resumed from; the message names it and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint in place: its step, directory and record."""

    step: int
    path: str
    record: dict[str, Any]


def save_checkpoint(run_dir: str, step: int, state: Any, record: dict[str, Any], keep: int) -> str:
    """Write ``state`` (a pytree of arrays) and ``record`` (JSON) as the checkpoint of ``step``, atomically, then remove
    all but the newest ``keep`` checkpoints; returns the checkpoint's directory. Every process of the run calls it (its
    arrays are gathered from all of them); process 0 writes, and each returns once the checkpoint is in place."""
    root = os.path.join(run_dir, CHECKPOINTS)
    final = os.path.join(root, f"step-{step}")
    whole = jax.tree_util.tree_map(lambda a: global_value(a) if isinstance(a, jax.Array) and not a.is_fully_addressable else a, state)
    if is_writer():
        _write(root, final, step, whole, record, keep)
    wait_for_all(f"checkpoint step-{step} in place")
    return final


def _write(root: str, final: str, step: int, state: Any, record: dict[str, Any], keep: int) -> None:
    """Write the checkpoint of ``step`` under ``.step-<N>.partial``, rename it to ``final``, remove the oldest beyond
    ``keep``."""
    os.makedirs(root, exist_ok=True)
    partial = os.path.join(root, f".step-{step}.partial")
    os.mkdir(partial)
    state_path = os.path.join(partial, STATE_FILE)
    with open(state_path, "xb") as f:
        eqx.tree_serialise_leaves(f, state)
        f.flush()
        os.fsync(f.fileno())
    size, digest = file_digest(state_path)
    with open(os.path.join(partial, RECORD_FILE), "x") as f:
        json.dump({**record, "step": step, "state": {"file": STATE_FILE, "bytes": size, "xxh3_128": digest}}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(partial)
    os.rename(partial, final)
    _fsync_dir(root)
    for old in sorted(_steps(root), reverse=True)[keep:]:
        aside = os.path.join(root, f".step-{old}.deleting")
        os.rename(os.path.join(root, f"step-{old}"), aside)
        shutil.rmtree(aside)


def latest_checkpoint(run_dir: str) -> Checkpoint | None:
    """The newest checkpoint in place in ``run_dir`` (None without one), its state file checked against its record.
    Removes what an interrupted save or removal left behind (process 0 does; the others pass it by). Raises
    ``CheckpointError`` for a checkpoint in the old layout, and for a newest checkpoint that does not load (naming the one
    before it)."""
    legacy = [name for name in LEGACY_FILES if os.path.lexists(os.path.join(run_dir, name))]
    if legacy:
        raise CheckpointError(
            f"{run_dir} holds a checkpoint in the layout before checkpoints were directories ({' and '.join(legacy)}): it "
            "cannot show that its parameters belong to its step (a kill between its two writes left them apart) nor which "
            f"data trained it, so it is not resumed. Start a new run: another trainer.checkpoint_dir, or delete {' and '.join(legacy)}")
    root = os.path.join(run_dir, CHECKPOINTS)
    if not os.path.isdir(root):
        return None
    for name in sorted(os.listdir(root)) if is_writer() else ():
        if _LEFT_BY_A_KILL.fullmatch(name):
            logger.warning("removing %s: a checkpoint save or removal was interrupted there", os.path.join(root, name))
            shutil.rmtree(os.path.join(root, name))
    steps = sorted(_steps(root), reverse=True)
    if not steps:
        return None
    path = os.path.join(root, f"step-{steps[0]}")
    try:
        return _read(path, steps[0])
    except (OSError, ValueError, KeyError, TypeError) as e:
        if len(steps) > 1:
            fix = f"move it out of {root} (or delete it) to resume from step-{steps[1]}, the checkpoint before it"
        else:
            fix = "it is the only checkpoint: delete it, or use another trainer.checkpoint_dir, to start the run again"
        raise CheckpointError(f"checkpoint {path} cannot be resumed from: {e}. It was complete when it was renamed into "
                              f"place, so its files were changed or damaged since; {fix}") from None


def load_state(checkpoint: Checkpoint, like: Any) -> Any:
    """The checkpoint's state, laid out and placed as ``like`` (parameters back on their mesh)."""
    path = os.path.join(checkpoint.path, STATE_FILE)
    try:
        state = eqx.tree_deserialise_leaves(path, like)
    except Exception as e:  # equinox and numpy raise several kinds for a state of another shape
        raise CheckpointError(f"{path} does not hold this run's parameters and optimizer state ({type(e).__name__}: {e}); "
                              "was the model or trainer config changed? Restore it, or use another trainer.checkpoint_dir") from None

    def place(new: Any, old: Any) -> Any:  # parameters go back to their mesh; the optimizer's scalars stay uncommitted
        sharding = getattr(old, "sharding", None)
        if not isinstance(sharding, NamedSharding):
            return jnp.asarray(new)
        if sharding.is_fully_addressable:
            return jax.device_put(new, sharding)
        host = np.asarray(new)  # each process places its own devices' parts
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree_util.tree_map(place, state, like)


def _read(path: str, step: int) -> Checkpoint:
    """A checkpoint's record, checked: its step is its directory's, and its state file has the recorded size and digest."""
    with open(os.path.join(path, RECORD_FILE)) as f:
        record = json.load(f)
    missing = {"step", "state", "data", "caches", "data_changes", "last_batch"} - set(record)
    if missing:
        raise ValueError(f"{RECORD_FILE} lacks {sorted(missing)}")
    if record["step"] != step:
        raise ValueError(f"{RECORD_FILE} says step {record['step']}")
    size, digest = file_digest(os.path.join(path, record["state"]["file"]))
    expected = record["state"]
    if (size, digest) != (expected["bytes"], expected["xxh3_128"]):
        raise ValueError(f"{STATE_FILE} has {size:,} bytes of digest {digest}; {RECORD_FILE} recorded {expected['bytes']:,} "
                         f"bytes of digest {expected['xxh3_128']}")
    return Checkpoint(step, path, record)


def _steps(root: str) -> list[int]:
    return [int(m.group(1)) for m in map(_STEP.fullmatch, os.listdir(root)) if m]


def _fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` durable (a rename or a new file in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
