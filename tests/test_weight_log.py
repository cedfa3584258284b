"""A run's weight log (issue 38): new ``train_weights`` at a resume are refused unless allowed, then appended to the log
from the resume step, so the batches trained are those of one mixture drawn by the log, with no source's example
skipped or repeated; the log is in the checkpoints and in ``weights.jsonl``, and a run killed after a reweight resumes
to the uninterrupted run's batches and log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import REPO, write_train_config

from tokenmix import build_caches
from tokenmix.datasets.packed import PackedDataset
from tokenmix.loader.loader import DataLoader
from tokenmix.train.config import load_train_config
from tokenmix.train.data_identity import DataChangedError
from tokenmix.train.loop import make_mesh, train
from tokenmix.train.plots import read_metrics
from tokenmix.train.weight_log import WEIGHT_LOG, read_log, stages

TRAINER = {"num_train_steps": 10, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 1, "model": 1}, "learning_rate": 0.01,
           "warmup_steps": 2, "steps_per_eval": 10, "max_eval_batches": 1, "steps_per_checkpoint": 2, "keep_checkpoints": 1}
MODEL = {"hidden_dim": 32, "num_layers": 1, "num_heads": 2, "max_position": 64}
NEW_WEIGHTS = {"linux_doc": 0.0, "python_doc": 1.0, "webster": 1.0}
WORKER = REPO / "tests" / "train_worker.py"


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("caches")


def _reweighted(tmp_path: Path, caches: Path, run: str, **trainer) -> str:
    """The config of ``run`` with ``NEW_WEIGHTS`` instead of the demo's."""
    return write_train_config(tmp_path, run, {**TRAINER, **trainer}, MODEL, caches, config_name=f"{run}-reweighted",
                              train_weights=NEW_WEIGHTS)


@pytest.mark.slow
def test_a_hand_reweight_at_a_resume_is_refused_unless_allowed_then_draws_on_from_that_step_skipping_and_repeating_nothing(tmp_path, caches):
    before = load_train_config(write_train_config(tmp_path, "run", TRAINER, MODEL, caches))
    train(before, stop_after=4)
    with pytest.raises(DataChangedError, match=r"data.train_weights.linux_doc: 0.5 -> 0.0"):
        train(load_train_config(_reweighted(tmp_path, caches, "run")))
    after = load_train_config(_reweighted(tmp_path, caches, "run", allow_data_change=True))
    assert train(after).first_step == 4
    log = read_log(str(tmp_path / "run"))
    assert [(s.start, s.step, s.by, s.decided_at_step) for s in log] == [(0, 0, "config", None), (32, 4, "resume", 4)]
    assert log[1].weights == NEW_WEIGHTS and log[0].weights == {"linux_doc": 0.5, "python_doc": 0.3, "webster": 0.2}
    checkpoint = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/checkpoint.json")).read_text())
    assert [(s["start"], s["weights"]) for s in checkpoint["weight_log"]] == stages(log)

    steps, _ = read_metrics(after.trainer.checkpoint_dir)
    assert sum(r["sources"]["linux_doc"] for r in steps[:4]) > 0 and all(r["sources"]["linux_doc"] == 0 for r in steps[4:])
    mixture = after.data.train_set(after.trainer.seq_len, weight_log=stages(log))
    with DataLoader(mixture, 8, make_mesh(after), {"batch": "data"}, prefetch=0, fingerprint=True, positions=True) as loader:
        assert [loader.batch(r["step"]).fingerprint for r in steps] == [r["fingerprint"] for r in steps]  # the log is what trained
    ids, draws = mixture.locate(np.arange(80))
    for sid, name in enumerate(mixture.names):  # every draw of every source once, in order, across the reweight
        assert np.array_equal(draws[ids == sid], np.arange(np.sum(ids == sid))), name
    assert np.sum(ids[:32] == mixture.names.index("linux_doc")) > 0 and not np.any(ids[32:] == mixture.names.index("linux_doc"))


@pytest.mark.slow
def test_a_reweighted_run_killed_mid_way_and_resumed_gives_the_uninterrupted_runs_batches_and_weight_log(tmp_path, caches):
    runs = {}
    for run in ("whole", "killed"):
        train(load_train_config(write_train_config(tmp_path, run, TRAINER, MODEL, caches)), stop_after=4)
        runs[run] = _reweighted(tmp_path, caches, run, allow_data_change=True)
    train(load_train_config(runs["whole"]))
    killed = subprocess.run([sys.executable, str(WORKER), runs["killed"], "7", "write", "1"], capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr  # SIGKILLed saving step 8's checkpoint: it resumes from step 6
    assert train(load_train_config(runs["killed"])).first_step == 6
    whole, resumed = (read_metrics(str(tmp_path / run))[0] for run in ("whole", "killed"))
    assert {r["step"]: r["fingerprint"] for r in resumed} == {r["step"]: r["fingerprint"] for r in whole}
    assert (tmp_path / "killed" / WEIGHT_LOG).read_text() == (tmp_path / "whole" / WEIGHT_LOG).read_text()
    assert len(read_log(str(tmp_path / "killed"))) == 2


def test_a_packed_sources_draws_go_on_across_an_appended_stage(tmp_path, caches):
    path = write_train_config(tmp_path, "packed", TRAINER, MODEL, caches)
    doc = yaml.safe_load(open(path))
    doc["data"]["configs"]["webster"]["packing"] = {"max_segments_per_example": 8}
    open(path, "w").write(yaml.safe_dump(doc))
    config = load_train_config(path)
    build_caches(config.data, progress=False)
    mixture = config.data.train_set(config.trainer.seq_len)
    webster = mixture.names.index("webster")
    before = mixture.get_batch(np.arange(64))
    mixture.append_stage(64, {"linux_doc": 0.2, "webster": 0.8})
    batch = mixture.get_batch(np.arange(128))
    assert np.array_equal(batch.tokens[:64], before.tokens)
    rows = batch.source_ids == webster
    packed = mixture.source("webster")
    expected = packed.base.get_batch(packed.examples(np.arange(int(rows.sum()))))  # its first draws, in order, once each
    assert np.array_equal(batch.tokens[rows], expected.tokens) and np.array_equal(batch.segment_ids[rows], expected.segment_ids)
    assert rows[64:].sum() > rows[:64].sum() and isinstance(packed.base, PackedDataset)


@pytest.mark.parametrize(("edit", "line", "says"), [
    (lambda lines: [lines[0], lines[2], lines[1]], 3, "the stage starts at example 80, not after the line before's 160"),
    (lambda lines: lines[1:], 1, "the first stage starts at example 80, not 0"),
])
def test_a_weight_log_edited_by_hand_out_of_order_is_refused_naming_its_line(tmp_path, edit, line, says):
    # its stages were drawn unsorted (each step's weights looked up among starts out of order) or, the first removed, the
    # steps before the next stage had no weights at all: a picture of weights no run drew by, without a word
    config = write_train_config(tmp_path, "run", TRAINER, MODEL)
    records = [{"start": 0, "step": 0, "weights": {"linux_doc": 0.5, "python_doc": 0.3, "webster": 0.2}, "by": "config"},
               {"start": 80, "step": 10, "weights": {"linux_doc": 0.2, "python_doc": 0.2, "webster": 0.6}, "by": "odm", "decided_at_step": 5},
               {"start": 160, "step": 20, "weights": {"linux_doc": 0.6, "python_doc": 0.2, "webster": 0.2}, "by": "odm", "decided_at_step": 15}]
    log = tmp_path / WEIGHT_LOG
    log.write_text("".join(edit([json.dumps(r) + "\n" for r in records])))
    result = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "plot", "--config_path", config, "--steps", "30",
                             "--weight_log", str(log), "--out", str(tmp_path / "log.png")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0 and not (tmp_path / "log.png").exists()
    assert f"{log}, line {line}: {says}: a weight log's stages start at example 0 and increase" in result.stderr
    assert "Traceback" not in result.stderr and len([out for out in result.stderr.splitlines() if " ERROR " in out]) == 1


def test_a_finished_run_run_again_with_new_weights_trains_nothing_and_keeps_its_weight_log(tmp_path, caches):
    # weights.jsonl used to get a resume stage from the finished run's last step, which no step drew by and no
    # checkpoint holds (and train.png drew it)
    trainer = {**TRAINER, "num_train_steps": 2}
    train(load_train_config(write_train_config(tmp_path, "run", trainer, MODEL, caches)))
    logged = (tmp_path / "run" / WEIGHT_LOG).read_text()
    again = train(load_train_config(_reweighted(tmp_path, caches, "run", num_train_steps=2, allow_data_change=True)))
    assert (again.first_step, again.steps) == (2, 0)
    assert (tmp_path / "run" / WEIGHT_LOG).read_text() == logged and [s.by for s in read_log(str(tmp_path / "run"))] == ["config"]
