"""Training checkpoints (issue 34): a checkpoint is one directory renamed into place, so a training process SIGKILLed
at any point of a save resumes from a whole checkpoint and ends exactly as an uninterrupted run does; a checkpoint
records the data its run trained on, and a resume on other data is refused field by field (or, allowed, logged); a
damaged checkpoint, and one in the old layout, is refused by name."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from helpers import REPO, write_train_config

from tokenmix.train.checkpoint import CheckpointError
from tokenmix.train.config import load_train_config
from tokenmix.train.data_identity import DataChangedError
from tokenmix.train.loop import TrainResult, train
from tokenmix.train.optimizer import OptimizerChangedError
from tokenmix.train.plots import read_metrics

TRAINER = {"num_train_steps": 6, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 1, "model": 1}, "learning_rate": 0.01,
           "warmup_steps": 2, "steps_per_eval": 6, "max_eval_batches": 1, "steps_per_checkpoint": 2, "keep_checkpoints": 1}
"""Checkpoints at steps 2, 4 and 6, each save removing the one before it: a kill in a save finds one whole checkpoint."""
MODEL = {"hidden_dim": 32, "num_layers": 1, "num_heads": 2, "max_position": 64}
WORKER = REPO / "tests" / "train_worker.py"


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> Path:
    """One set of caches for every run of this module (they are built by the first)."""
    return tmp_path_factory.mktemp("caches")


@pytest.fixture(scope="module")
def whole(tmp_path_factory, caches) -> TrainResult:
    """The run uninterrupted: what every interrupted one must end as."""
    return train(load_train_config(write_train_config(tmp_path_factory.mktemp("whole"), "run", TRAINER, MODEL, caches)))


def _kill(config_path: str, after_step: int, kind: str, n: int) -> subprocess.CompletedProcess:
    """Train in a process of its own, SIGKILLed before its ``n``-th change of ``kind`` to the run directory after
    step ``after_step`` (``tests/train_worker.py``)."""
    return subprocess.run([sys.executable, str(WORKER), config_path, str(after_step), kind, str(n)], capture_output=True, text=True,
                          timeout=600)


def _assert_same_run(resumed: TrainResult, whole: TrainResult) -> None:
    assert resumed.final_loss == whole.final_loss
    for a, b in zip(jax.tree_util.tree_leaves(resumed.model), jax.tree_util.tree_leaves(whole.model), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_process_killed_between_the_writes_of_a_checkpoint_resumes_from_a_whole_one_and_ends_as_an_uninterrupted_run(
        tmp_path, caches, whole):
    path = write_train_config(tmp_path, "run", TRAINER, MODEL, caches)
    killed = _kill(path, 3, "write", 2)  # in the save of step 4: its parameters written, its step not yet
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = train(load_train_config(path))
    assert resumed.first_step == 2  # the newest whole checkpoint; the half-written one of step 4 is not one
    _assert_same_run(resumed, whole)
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["step-6"]  # the partial one removed


@pytest.mark.slow
def test_a_process_killed_before_any_change_a_save_makes_resumes_to_the_uninterrupted_run(tmp_path, caches, whole):
    resumed_from = []
    for n in range(1, 20):
        path = write_train_config(tmp_path, f"kill-{n}", TRAINER, MODEL, caches)
        killed = _kill(path, 3, "any", n)  # the n-th file, rename, removal or directory of the save of step 4 (or after it)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        after_the_save = 4 in [r["step"] for r in read_metrics(str(tmp_path / f"kill-{n}"))[0]]
        resumed = train(load_train_config(path))
        _assert_same_run(resumed, whole)
        resumed_from.append(resumed.first_step)
        if after_the_save:
            break  # every change the save of step 4 makes has been interrupted
    else:
        pytest.fail("the save of step 4 never ended")
    assert resumed_from[0] == 2 and resumed_from[-2:] == [4, 4] and len(resumed_from) >= 4


def test_a_resume_on_another_seed_other_weights_or_shards_is_refused_by_name_and_goes_on_logged_when_allowed(tmp_path, caches, caplog):
    train(load_train_config(write_train_config(tmp_path, "run", TRAINER, MODEL, caches)), stop_after=2)
    seed = write_train_config(tmp_path, "run", TRAINER, MODEL, caches, "seed", seed=1)
    with pytest.raises(DataChangedError, match=r"(?s)step-2 was trained up to step 2 on other data .*\n  data.seed: 0 -> 1\n.*"
                                               r"--trainer.allow_data_change true"):
        train(load_train_config(seed))
    weights = write_train_config(tmp_path, "run", TRAINER, MODEL, caches, "weights",
                                 train_weights={"linux_doc": 0.2, "python_doc": 0.3, "webster": 0.5})
    with pytest.raises(DataChangedError) as refused:
        train(load_train_config(weights))
    assert "\n  data.train_weights.linux_doc: 0.5 -> 0.2\n  data.train_weights.webster: 0.2 -> 0.5\n" in str(refused.value)
    assert "python_doc" not in str(refused.value)
    ledger = caches / "linux_doc" / "train" / "ledger.json"
    shards = [s["name"] for s in json.loads(ledger.read_text())["shards"]]
    more = write_train_config(tmp_path, "run", TRAINER, MODEL, caches, "more")
    doc = yaml.safe_load(open(more))
    doc["data"]["configs"]["linux_doc"]["train_urls"].append(str(REPO / "data" / "demo" / "linux_doc" / "validation.jsonl.zst"))
    open(more, "w").write(yaml.safe_dump(doc))
    with pytest.raises(DataChangedError, match=r"\n  data.configs.linux_doc.train_urls: \[.*\] -> \[.*validation.jsonl.zst'\]\n"):
        train(load_train_config(more))
    assert [s["name"] for s in json.loads(ledger.read_text())["shards"]] == shards  # refused before the cache was extended
    batch = write_train_config(tmp_path, "run", {**TRAINER, "train_batch_size": 4}, MODEL, caches, "batch")
    with pytest.raises(DataChangedError, match=r"(?s)data.batch_size: 8 -> 4\n.*trainer.train_batch_size: 8 -> 4"):
        train(load_train_config(batch))
    with caplog.at_level(logging.WARNING, "tokenmix.train"):
        allowed = train(load_train_config(seed, ["--trainer.allow_data_change", "true"]), stop_after=2)
    assert allowed.first_step == 2
    assert "resuming" in caplog.text and "on changed data (trainer.allow_data_change" in caplog.text and "data.seed: 0 -> 1" in caplog.text
    again = train(load_train_config(seed), stop_after=0)  # the checkpoints after the change record the new data
    assert again.first_step == 4
    record = json.loads((tmp_path / "run" / "checkpoints" / "step-4" / "checkpoint.json").read_text())
    assert record["data_changes"] == [{"step": 2, "changed": {"data.seed": [0, 1]}}]


def test_a_resume_on_caches_or_a_batch_other_than_the_recorded_ones_is_refused_though_every_config_field_is_equal(tmp_path, caches):
    path = write_train_config(tmp_path, "run", TRAINER, MODEL, caches)
    train(load_train_config(path), stop_after=2)
    record_path = tmp_path / "run" / "checkpoints" / "step-2" / "checkpoint.json"
    record = json.loads(record_path.read_text())
    rows = record["caches"]["caches.webster.rows"]
    record_path.write_text(json.dumps({**record, "caches": {**record["caches"], "caches.webster.rows": rows - 1}}))
    with pytest.raises(DataChangedError, match=rf"\n  caches.webster.rows: {rows - 1} -> {rows}\nResuming"):
        train(load_train_config(path))
    recorded = record["last_batch"]["fingerprint"]
    record["last_batch"]["fingerprint"] = "0" * 32  # as if step 1's batch had been another
    record_path.write_text(json.dumps(record))
    with pytest.raises(DataChangedError, match=rf"fingerprint of the batch of step 1: '0{{32}}' -> '{recorded}'\nEvery field the "
                                               r"checkpoint records is the same"):
        train(load_train_config(path))


def test_a_damaged_checkpoint_is_refused_naming_it_and_the_one_before_it(tmp_path, caches):
    path = write_train_config(tmp_path, "run", TRAINER, MODEL, caches)
    train(load_train_config(path, ["--trainer.keep_checkpoints", "2"]), stop_after=4)
    root = tmp_path / "run" / "checkpoints"
    state = root / "step-4" / "state.eqx"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit of one parameter
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"checkpoint {root}/step-4 cannot be resumed from: state.eqx has [\d,]+ bytes of digest "
                                              rf"\w+; checkpoint.json recorded .* move it out of {root} \(or delete it\) to resume "
                                              r"from step-2, the checkpoint before it"):
        train(load_train_config(path))
    shutil.move(root / "step-4", tmp_path / "damaged")
    resumed = train(load_train_config(path), stop_after=0)
    assert (resumed.first_step, resumed.steps, resumed.final_loss) == (2, 0, None)  # no step: no loss (it was nan)


def test_a_checkpoint_of_the_old_layout_is_refused_by_name(tmp_path, caches):
    path = write_train_config(tmp_path, "run", TRAINER, MODEL, caches)
    train(load_train_config(path), stop_after=2)
    run = tmp_path / "run"
    shutil.move(run / "checkpoints" / "step-2" / "state.eqx", run / "checkpoint.eqx")  # what the old layout held
    (run / "checkpoint.json").write_text(json.dumps({"step": 2}))
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(CheckpointError, match=r"holds a checkpoint in the layout before checkpoints were directories \(checkpoint.eqx "
                                              r"and checkpoint.json\).* delete checkpoint.eqx and checkpoint.json"):
        train(load_train_config(path))
    assert len(read_metrics(str(run))[0]) == 2


def test_a_metrics_line_left_unfinished_by_a_stop_mid_write_is_cut_off_at_the_resume(tmp_path, caches, caplog):
    # the resumed run's lines used to follow the torn one on its line, and reading metrics.jsonl (train.png) failed
    path = write_train_config(tmp_path, "run", {**TRAINER, "num_train_steps": 3, "steps_per_checkpoint": 1}, MODEL, caches)
    train(load_train_config(path), stop_after=2)
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    metrics.write_bytes(b"".join(lines[:-1]) + lines[-1][:20] + b"\0" * 8)  # step 1's line torn, as a machine stopped mid-write
    with caplog.at_level(logging.WARNING, logger="tokenmix.train.loop"):
        train(load_train_config(path))
    assert [record["step"] for record in read_metrics(str(tmp_path / "run"))[0]] == [0, 2]
    assert f"{metrics}: cutting off its last line, which a stop mid-write left unfinished (28 bytes" in caplog.text


def _learning_rates(run: Path) -> dict[int, float]:
    return {record["step"]: record["learning_rate"] for record in read_metrics(str(run))[0]}


def _cosine(step: int, peak: float, warmup: int, end: int) -> float:
    """The learning rate of the warmup-cosine schedule after its warmup, computed here apart from optax."""
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (end - warmup)))


def test_a_resume_with_other_optimizer_settings_is_refused_naming_each_and_what_it_does_to_the_learning_rate(tmp_path, caches):
    # a resume used to re-stretch the cosine (or take another peak, warmup, weight decay) silently
    train(load_train_config(write_train_config(tmp_path, "run", TRAINER, MODEL, caches)), stop_after=4)
    longer = write_train_config(tmp_path, "run", {**TRAINER, "num_train_steps": 12}, MODEL, caches, "longer")
    with pytest.raises(OptimizerChangedError) as refused:
        train(load_train_config(longer))
    message = str(refused.value)
    assert f"{tmp_path / 'run' / 'checkpoints' / 'step-4'} was trained up to step 4 with other optimizer settings" in message
    assert "\n  trainer.num_train_steps: 6 -> 12\n" in message
    said = re.search(r"at step 4 it is ([\d.]+) where the checkpoint's schedule gives 0.005, and the cosine decay is "
                     r"stretched again over steps 2 to 12 \(it reaches 0 at step 12 instead of step 6\)", message)
    assert said and float(said.group(1)) == pytest.approx(_cosine(4, 0.01, 2, 12), rel=1e-5), message
    assert "--trainer.allow_optimizer_change true" in message and "Restore the checkpoint's values" in message
    other = write_train_config(tmp_path, "run", {**TRAINER, "learning_rate": 0.02, "weight_decay": 0.0, "warmup_steps": 1}, MODEL, caches,
                               "other")
    with pytest.raises(OptimizerChangedError, match=r"\n  trainer.learning_rate: 0.01 -> 0.02\n  trainer.warmup_steps: 2 -> 1\n"
                                                    r"  trainer.weight_decay: 0.1 -> 0.0\n(?s:.*)decay by 0.0 from step 4 \(by 0.1"):
        train(load_train_config(other))
    assert max(_learning_rates(tmp_path / "run")) == 3  # nothing trained past the checkpoint


def test_a_longer_run_allowed_follows_the_new_schedule_from_the_resumed_step_and_records_the_change(tmp_path, caches, caplog):
    path = write_train_config(tmp_path, "run", TRAINER, MODEL, caches)
    train(load_train_config(path), stop_after=4)
    before = _learning_rates(tmp_path / "run")
    assert before[3] == pytest.approx(_cosine(3, 0.01, 2, 6))
    longer = write_train_config(tmp_path, "run", {**TRAINER, "num_train_steps": 12}, MODEL, caches, "longer")
    with caplog.at_level(logging.WARNING, "tokenmix.train"):
        resumed = train(load_train_config(longer, ["--trainer.allow_optimizer_change", "true"]), stop_after=2)
    assert resumed.first_step == 4
    assert "with changed optimizer settings (trainer.allow_optimizer_change" in caplog.text and "trainer.num_train_steps: 6 -> 12" in caplog.text
    after = _learning_rates(tmp_path / "run")
    assert {step: after[step] for step in before} == before  # the steps trained before keep their lines
    for step in (4, 5):  # the new schedule at the resumed step, not the old one's 0.005 nor a schedule restarted at 0
        assert after[step] == pytest.approx(_cosine(step, 0.01, 2, 12), rel=1e-6)
    record = json.loads((tmp_path / "run" / "checkpoints" / "step-6" / "checkpoint.json").read_text())
    assert record["optimizer_changes"] == [{"step": 4, "changed": {"trainer.num_train_steps": [6, 12]}}]
    assert record["optimizer"]["trainer.num_train_steps"] == 12
    again = train(load_train_config(longer), stop_after=1)  # the new settings recorded: no flag needed to go on with them
    assert again.first_step == 6


def test_a_resume_changing_only_what_does_not_change_the_updates_goes_on_without_a_word(tmp_path, caches, caplog):
    train(load_train_config(write_train_config(tmp_path, "run", TRAINER, MODEL, caches)), stop_after=2)
    cadence = {**TRAINER, "steps_per_checkpoint": 1, "keep_checkpoints": 3, "steps_per_eval": 1, "max_eval_batches": 2, "prefetch": 0,
               "fingerprint": False, "eval_batch_size": 4, "seed": 7}
    with caplog.at_level(logging.WARNING, "tokenmix.train"):
        resumed = train(load_train_config(write_train_config(tmp_path, "run", cadence, MODEL, caches, "cadence")), stop_after=2)
    assert resumed.first_step == 2 and not [r for r in caplog.records if "optimizer" in r.getMessage()]
    record = json.loads((tmp_path / "run" / "checkpoints" / "step-3" / "checkpoint.json").read_text())
    assert record["optimizer_changes"] == [] and record["optimizer"]["trainer.num_train_steps"] == 6


def test_a_checkpoint_written_before_optimizer_settings_were_recorded_resumes_with_a_warning_and_records_them(tmp_path, caches, caplog):
    path = write_train_config(tmp_path, "run", TRAINER, MODEL, caches)
    train(load_train_config(path), stop_after=2)
    record_path = tmp_path / "run" / "checkpoints" / "step-2" / "checkpoint.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({k: v for k, v in record.items() if k not in ("optimizer", "optimizer_changes")}))
    with caplog.at_level(logging.WARNING, "tokenmix.train"):
        resumed = train(load_train_config(path), stop_after=1)
    assert resumed.first_step == 2
    assert f"{record_path.parent} records no optimizer settings (it was written before tokenmix recorded them)" in caplog.text
    written = json.loads((tmp_path / "run" / "checkpoints" / "step-3" / "checkpoint.json").read_text())
    assert written["optimizer_changes"] == [{"step": 2, "changed": {k: [None, v] for k, v in written["optimizer"].items()}}]
    assert written["optimizer"]["trainer.learning_rate"] == 0.01
    with pytest.raises(OptimizerChangedError, match=r"\n  trainer.num_train_steps: 6 -> 12\n"):  # checked from then on
        train(load_train_config(write_train_config(tmp_path, "run", {**TRAINER, "num_train_steps": 12}, MODEL, caches, "longer")))
