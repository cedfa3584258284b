"""One process of the two-process loader test (tests/test_loader.py launches two of these).

    python tests/loader_worker.py PROCESS_ID PORT CONFIG_PATH OUT_DIR [fail]

with XLA_FLAGS=--xla_force_host_platform_device_count=4 in its environment (the test sets it), so each
process has 4 CPU devices; together they form 8. For every mesh case it streams a few steps,
records the example indices of each ``dataset.read`` it made and the fingerprints, gathers the global
batch (``process_allgather``) and writes everything to OUT_DIR for the test to compare with a
single-process run; then it appends ``LOG_STAGE`` to a mixture it iterates, and records the fingerprints and the log.
With ``fail``, process 1's reads of step ``FAILED_STEP`` fail instead, and each process records the steps it took and
the ``LoaderError`` that ended its iteration.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
from helpers import SEQ_LEN, CountingDataset, FailingDataset
from jax.experimental import multihost_utils

from tokenmix import DataLoader, LoaderError, load_data_config

MESH_CASES = {
    "data8": ((8,), ("data",), {"batch": "data"}),
    "data4_model2": ((4, 2), ("data", "model"), {"batch": "data"}),
    "replica_data_pos_model": ((2, 2, 2), ("replica", "data", "model"), {"batch": ("replica", "data"), "position": "model"}),
    "batch_within_process": ((2, 4), ("replica", "data"), {"batch": "data"}),
}
BATCH = 16
STEPS = 3
LOG_STAGE = {"linux_doc": 0.1, "webster": 0.9}
"""A weight stage each process appends while it iterates, as every host of an online-mixing run does."""
FAILED_STEP = 2


def main() -> None:
    process_id, port, config_path, out_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60)
    assert jax.process_count() == 2 and jax.local_device_count() == 4 and jax.device_count() == 8
    train = load_data_config(config_path, []).train_set(SEQ_LEN)
    if sys.argv[5:] == ["fail"]:
        fail_on_one_process(train, process_id, out_dir)
        return
    report: dict[str, dict] = {}
    for name, (shape, axes, mapping) in MESH_CASES.items():
        dataset = CountingDataset(train)
        mesh = jax.make_mesh(shape, axes)
        gathered: dict[str, list[np.ndarray]] = {"tokens": [], "loss_mask": [], "segment_ids": [], "source_ids": []}
        fingerprints = []
        with DataLoader(dataset, BATCH, mesh, mapping, fingerprint=True, prefetch=2) as loader:
            for sb in loader:
                fingerprints.append(sb.fingerprint)
                for field, array in sb.batch.arrays().items():
                    gathered[field].append(np.asarray(multihost_utils.process_allgather(array, tiled=True)))
                if sb.step == STEPS - 1:
                    break
        np.savez(os.path.join(out_dir, f"{name}-{process_id}.npz"), **{k: np.stack(v) for k, v in gathered.items()})
        report[name] = {"fingerprints": fingerprints, "reads": [r.tolist() for r in dataset.reads]}
    grown = load_data_config(config_path, []).train_set(SEQ_LEN)  # every host appends the same stage at the same step
    with DataLoader(grown, BATCH, jax.make_mesh((8,), ("data",)), {"batch": "data"}, fingerprint=True, prefetch=2) as loader:
        it = iter(loader)
        fingerprints = [next(it).fingerprint]
        start = grown.next_boundary(BATCH * (2 + loader.steps_read_ahead()))
        loader.append_stage(start, LOG_STAGE)
        fingerprints += [next(it).fingerprint for _ in range(start // BATCH + 4 - 1)]
    report["log"] = {"fingerprints": fingerprints, "stages": grown.stages}
    with open(os.path.join(out_dir, f"report-{process_id}.json"), "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()


def fail_on_one_process(train, process_id: int, out_dir: str) -> None:
    """Process 1's reads of step FAILED_STEP fail; both record the steps they took and the error that ended them."""
    lo = FAILED_STEP * BATCH if process_id == 1 else 0
    dataset = FailingDataset(train, lo, lo + BATCH if process_id == 1 else 0)
    steps: list[int] = []
    error = None
    with DataLoader(dataset, BATCH, jax.make_mesh((8,), ("data",)), {"batch": "data"}, fingerprint=True, prefetch=2) as loader:
        try:
            for sb, _ in zip(loader, range(FAILED_STEP + 2)):
                steps.append(sb.step)
        except LoaderError as e:
            error = {"step": e.step, "message": str(e)}
    with open(os.path.join(out_dir, f"fail-{process_id}.json"), "w") as f:
        json.dump({"steps": steps, "error": error}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
