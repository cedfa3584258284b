"""One training process for tests/test_train_checkpoints.py, killed at a chosen point of a checkpoint's save:

    python tests/train_worker.py CONFIG_PATH AFTER_STEP KIND N [--trainer.field VALUE ...]

trains the run CONFIG_PATH describes and, once step AFTER_STEP's line is in the run's metrics.jsonl, SIGKILLs itself
just before its N-th change to the run directory of kind KIND, as a machine failing at that instant would: ``write``
counts the files it opens for writing, ``any`` counts those and every rename, removal, directory made or tree removed.
The changes are seen through Python's audit hooks, so the code under test is run as it is. Exits 0 if it finishes first;
N 0 never kills (a process of a run of several that writes nothing: tests/test_online_mixing.py). The overrides after
N (e.g. ``--trainer.process_id 1``) make it one of the processes of such a run, joined as the launch joins them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any

from tokenmix.train.config import load_train_config
from tokenmix.train.loop import METRICS, train
from tokenmix.train.processes import join_processes

CHANGES = {"open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree"}
WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def logged(metrics: str, step: int) -> bool:
    """Whether the run has logged its training of ``step``."""
    if not os.path.exists(metrics):
        return False
    with open(metrics) as f:
        return any(r["kind"] == "train" and r["step"] == step for r in map(json.loads, f))


def kill_before(run_dir: str, after_step: int, kind: str, n: int) -> None:
    """Install the audit hook that SIGKILLs this process before its ``n``-th change of ``kind`` in ``run_dir`` once
    ``after_step`` is logged."""
    metrics = os.path.join(run_dir, METRICS)
    state = {"armed": False, "seen": 0, "inside": False}

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in CHANGES or state["inside"] or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        target = os.path.abspath(os.fsdecode(args[0]))
        if not target.startswith(run_dir + os.sep) or target == metrics:
            return
        if event == "open" and not args[2] & WRITING or kind == "write" and event != "open":
            return
        state["inside"] = True  # reading metrics.jsonl is an audited open too
        try:
            state["armed"] = state["armed"] or logged(metrics, after_step)
        finally:
            state["inside"] = False
        if state["armed"]:
            state["seen"] += 1
            if state["seen"] == n:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = load_train_config(sys.argv[1], sys.argv[5:])
    join_processes(config.trainer)
    kill_before(os.path.abspath(config.trainer.checkpoint_dir), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    train(config)
