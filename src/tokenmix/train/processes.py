"""The processes of one training run: joining them (``jax.distributed``), which one writes the run's files, values of
arrays that span them, and waiting for all of them.

Every process trains on the same global arrays and computes the same losses, statistics and weight updates; process 0
alone writes what the run leaves on disk (checkpoints, ``metrics.jsonl``, ``weights.jsonl``, pictures), so that no two
processes write one file. The run directory must be the same directory for every process (a shared filesystem), since
every process reads the checkpoint it resumes from.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from tokenmix.train.config import TrainerConfig

JOIN_TIMEOUT_S = 300
"""How long a process waits for the others to join (``jax.distributed.initialize``'s default)."""


def join_processes(trainer: TrainerConfig) -> None:
    """Join the run's ``trainer.num_processes`` processes through the coordinator at ``trainer.coordinator_address``
    (nothing for a run of one process). Before JAX starts its backend: collectives between CPU processes go through
    gloo."""
    if trainer.coordinator_address is None:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(trainer.coordinator_address, trainer.num_processes, trainer.process_id,
                               initialization_timeout=JOIN_TIMEOUT_S)


def check_processes(trainer: TrainerConfig) -> None:
    """Refuse a run whose JAX processes are not the ``trainer.num_processes`` its config names."""
    if jax.process_count() != trainer.num_processes:
        raise ValueError(f"trainer.num_processes is {trainer.num_processes}, but JAX runs {jax.process_count()} process(es): "
                         "start each process through tokenmix.train.launch (or call join_processes(config.trainer) before "
                         "train), with trainer.coordinator_address and trainer.process_id set")


def is_writer() -> bool:
    """Whether this process writes the run's files (process 0)."""
    return jax.process_index() == 0


def global_value(array: jax.Array) -> np.ndarray:
    """The whole of ``array`` on this host, however it is laid out over the processes. Every process must call it for the
    same array when the array spans processes and is not replicated (it gathers it then)."""
    if array.is_fully_addressable or array.is_fully_replicated:
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def wait_for_all(name: str) -> None:
    """Return once every process of the run has reached the point ``name``."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
