"""Online mixing (issue 38): ODM and DoReMi change the weights during a run, each update appended to the weight log at a
deterministic boundary; a run SIGKILLed mid-way resumes to the uninterrupted run's batches and log, bit for bit (also a
run of 2 processes resumed on 1); on a
planted case (one source of noise, one learnable) DoReMi moves weight away from the noise and ODM towards it, as their
papers predict, and no weight goes below its floor."""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import REPO, TOKENIZER, write_jsonl, write_train_config
from s3_server import free_port

from tokenmix.config.adaptive import WEIGHT_QUANTUM, AdaptiveMixing
from tokenmix.loader.batch_schedule import BatchSchedule
from tokenmix.loader.loader import DataLoader
from tokenmix.mixing.source_stats import SourceStats
from tokenmix.mixing.weight_updaters import DoReMiUpdater, OdmUpdater, floored
from tokenmix.train.checkpoint import latest_checkpoint
from tokenmix.train.config import load_train_config
from tokenmix.train.loop import make_mesh, train
from tokenmix.train.online_mixing import OnlineMixing
from tokenmix.train.plots import plot_run, read_metrics
from tokenmix.train.weight_log import WEIGHT_LOG, from_records, read_log, stages

TRAINER = {"num_train_steps": 12, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 1, "model": 1}, "learning_rate": 0.01,
           "warmup_steps": 2, "steps_per_eval": 12, "max_eval_batches": 1, "steps_per_checkpoint": 4, "keep_checkpoints": 1}
MODEL = {"hidden_dim": 32, "num_layers": 1, "num_heads": 2, "max_position": 64}
ODM = {"algorithm": "odm", "update_every": 3, "floor": 0.05}
WORKER = REPO / "tests" / "train_worker.py"


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("caches")


@pytest.fixture(scope="module")
def whole_in_blocks_of_8(tmp_path_factory, caches) -> Path:
    """The run directory of an ODM run trained uninterrupted in mixture blocks of 8, what a resumed run must end as; the
    tests only read it."""
    directory = tmp_path_factory.mktemp("whole-in-blocks-of-8")
    train(load_train_config(write_train_config(directory, "whole", TRAINER, MODEL, caches, adaptive=ODM, mixture_block_size=8)))
    return directory / "whole"


def _stats(losses: list[float], tokens: list[int]) -> SourceStats:
    return SourceStats(("a", "b", "c")[: len(losses)], np.array(losses) * np.array(tokens), np.array(tokens, np.float64))


@pytest.mark.parametrize("weights", [[1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [1e-9, 1.0, 1e-9], [1 / 3, 1 / 3, 1 / 3]])
def test_floored_weights_are_whole_units_summing_to_one_each_at_least_the_floor(weights):
    units = floored(np.array(weights), 500)
    assert units.sum() == WEIGHT_QUANTUM and np.all(units >= 500) and units.dtype == np.int64
    assert abs(units[np.argmax(weights)] - 500 - 8500 * max(weights) / sum(weights)) <= 1


def test_an_updaters_state_restored_decides_what_the_uninterrupted_one_decides(tmp_path):
    metrics = tmp_path / "reference.jsonl"
    metrics.write_text(json.dumps({"kind": "eval", "step": 9, "loss": {"a": 3.0, "b": 5.0, "c": 1.0}}) + "\n")
    windows = [_stats([9.0, 8.0, 7.0], [100, 50, 10]), _stats([6.0, 7.5, 2.0], [80, 60, 20]), _stats([5.0, 7.0, 1.5], [0, 60, 20])] * 2
    for make in (lambda: OdmUpdater(AdaptiveMixing("odm"), "abc"),
                 lambda: DoReMiUpdater(AdaptiveMixing("doremi", reference_metrics=str(metrics)), "abc", {"a": 0.5, "b": 0.3, "c": 0.2})):
        whole = make()
        decided = [whole.update(w) for w in windows]
        resumed = make()
        resumed.update(windows[0])
        again = make()
        again.restore(json.loads(json.dumps(resumed.state())))
        assert [again.update(w) for w in windows[1:]] == decided[1:]
        assert decided[0] != decided[-1]  # (ODM explores uniformly while eps_t = 1/K: its first 3 updates for 3 sources)


def test_the_order_the_sources_are_listed_in_changes_no_decision_and_no_restored_state(tmp_path):
    """The mixture's layout sorts its sources by name, so listing them in another order changes no batch; an updater's
    decisions must not change either: not in the floor's ties (ODM's first updates are uniform, 2833.33 units each) nor
    in a state saved by a run listing them in one order and restored by a resume listing them in another."""
    metrics = tmp_path / "reference.jsonl"
    metrics.write_text(json.dumps({"kind": "eval", "step": 9, "loss": {"a": 3.0, "b": 5.0, "c": 1.0}}) + "\n")
    losses = {"a": [9.0, 6.0, 5.0, 4.0], "b": [8.0, 7.5, 7.0, 7.2], "c": [7.0, 2.0, 1.5, 1.4]}
    tokens = {"a": [100, 80, 0, 70], "b": [50, 60, 60, 55], "c": [10, 20, 20, 30]}

    def window(order: str, i: int) -> SourceStats:
        return SourceStats(tuple(order), np.array([losses[n][i] * tokens[n][i] for n in order]),
                           np.array([tokens[n][i] for n in order], np.float64))

    for make in (lambda order: OdmUpdater(AdaptiveMixing("odm", floor=0.05), order),
                 lambda order: DoReMiUpdater(AdaptiveMixing("doremi", floor=0.05, reference_metrics=str(metrics)), order,
                                             {"a": 0.5, "b": 0.3, "c": 0.2})):
        listed = make("abc")
        decided = [listed.update(window("abc", i)) for i in range(4)]
        assert make("cab").update(window("cab", 0)) == decided[0]
        saved = make("abc")
        saved.update(window("abc", 0))
        resumed = make("cab")
        resumed.restore(json.loads(json.dumps(saved.state())))
        assert [resumed.update(window("cab", i)) for i in range(1, 4)] == decided[1:]


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_loss_that_is_not_a_finite_number_is_refused_naming_the_source_not_turned_into_weights(tmp_path, loss):
    """A diverged step's loss used to go through the floor's integer rounding as -2^63 units, and the run stopped on a
    stage of weight -9.2e14 blamed on train_weights."""
    metrics = tmp_path / "reference.jsonl"
    metrics.write_text(json.dumps({"kind": "eval", "step": 9, "loss": {"a": 3.0, "b": 5.0, "c": 1.0}}) + "\n")
    for updater in (OdmUpdater(AdaptiveMixing("odm"), "abc"),
                    DoReMiUpdater(AdaptiveMixing("doremi", reference_metrics=str(metrics)), "abc", {"a": 0.5, "b": 0.3, "c": 0.2})):
        with pytest.raises(ValueError, match=r"adaptive \((odm|doremi)\): the training loss of \['b'\] .* is not a finite number .* "
                                             r"the model diverged. Resume from an earlier checkpoint"):
            updater.update(_stats([2.0, loss, 3.0], [10, 10, 10]))
        assert updater.updates == 0


def test_adaptive_settings_are_checked_naming_the_field(tmp_path, caches):
    with pytest.raises(ValueError, match="adaptive.algorithm must be one of"):
        AdaptiveMixing("exp3")
    with pytest.raises(ValueError, match="adaptive.algorithm doremi needs adaptive.reference_metrics"):
        AdaptiveMixing("doremi")
    with pytest.raises(ValueError, match=r"adaptive.floor 0.4 for each of 3 sources adds up to more than 1; lower it to at most 0.3333"):
        OdmUpdater(AdaptiveMixing("odm", floor=0.4), "abc")
    with pytest.raises(ValueError, match=r"adaptive.reference_metrics: .*missing.jsonl"):
        DoReMiUpdater(AdaptiveMixing("doremi", reference_metrics=str(tmp_path / "missing.jsonl")), "ab", {"a": 1.0})
    with pytest.raises(ValueError, match="adaptive.delay 2 is less than the 4 steps the loader may have read ahead"):
        train(load_train_config(write_train_config(tmp_path, "short", TRAINER, MODEL, caches, adaptive={**ODM, "delay": 2})))
    with pytest.raises(ValueError, match=r"adaptive.delay 5 is less than the 6 steps .* trainer.loader_workers 1 x the prefetch"):
        train(load_train_config(write_train_config(tmp_path, "workers", {**TRAINER, "loader_workers": 1}, MODEL, caches,
                                                   adaptive={**ODM, "delay": 5})))
    schedule = [[0, {"linux_doc": 0.5, "python_doc": 0.5}], [100, {"webster": 1.0}]]
    with pytest.raises(ValueError, match=r"adaptive: train_weights is a schedule of 2 stages, .* before the last stage starts \(at step "
                                         r"100\): give train_weights one mapping"):
        load_train_config(write_train_config(tmp_path, "staged", TRAINER, MODEL, adaptive=ODM, train_weights=schedule))
    with pytest.raises(ValueError, match="stop_strategy all_exhausted .* set adaptive.floor above 0"):
        load_train_config(write_train_config(tmp_path, "finite", TRAINER, MODEL, adaptive={**ODM, "floor": 0}, stop_strategy="all_exhausted"))


@pytest.mark.slow
def test_an_adaptive_run_killed_mid_way_resumes_to_the_uninterrupted_runs_batches_and_weight_log(tmp_path, caches):
    paths = {run: write_train_config(tmp_path, run, TRAINER, MODEL, caches, adaptive=ODM, mixture_block_size=16) for run in ("whole", "killed")}
    train(load_train_config(paths["whole"]))
    killed = subprocess.run([sys.executable, str(WORKER), paths["killed"], "6", "write", "1"], capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr  # killed after step 6 is logged, at its first write after: step 8's update
    assert train(load_train_config(paths["killed"])).first_step == 4
    whole, resumed = (read_metrics(str(tmp_path / run))[0] for run in ("whole", "killed"))
    assert {r["step"]: r["fingerprint"] for r in resumed} == {r["step"]: r["fingerprint"] for r in whole}
    assert (tmp_path / "killed" / WEIGHT_LOG).read_text() == (tmp_path / "whole" / WEIGHT_LOG).read_text()
    log = read_log(str(tmp_path / "whole"))
    assert [(s.by, s.decided_at_step) for s in log] == [("config", None), ("odm", 2), ("odm", 5), ("odm", 8), ("odm", 11)]
    assert all((s.start - log[i].start) % 16 == 0 and s.start >= 8 * (s.decided_at_step + 4) for i, s in enumerate(log[1:]))
    assert log[-1].weights != log[1].weights  # the weights moved
    picture = plot_run(load_train_config(paths["whole"]))  # metrics.jsonl's weight lines are not evaluations
    assert open(picture, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def _two_processes_killed(tmp_path: Path, config: str, after_step: int, write: int, phase: str) -> None:
    """Run ``config`` on 2 processes of 2 CPU devices each until process 0 (which alone writes the run's files) SIGKILLs
    itself just before its ``write``-th file write after step ``after_step`` is logged; then kill process 1 too."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    joined = ["--trainer.coordinator_address", f"127.0.0.1:{free_port()}", "--trainer.num_processes", "2", "--trainer.process_id"]
    kill_at = [(str(after_step), "write", str(write)), (str(after_step), "write", "0")]
    logs = [tmp_path / f"{phase}-process-{i}.log" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), config, *kill_at[i], *joined, str(i)], env=env,
                              stdout=subprocess.DEVNULL, stderr=logs[i].open("w")) for i in range(2)]
    try:
        deadline = time.monotonic() + 300
        while procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        killed_itself = procs[0].poll() is not None  # the kill below would give it -9 too
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert killed_itself and procs[0].returncode == -9, logs[0].read_text()[-4000:]
    assert procs[1].returncode != 0, logs[1].read_text()[-4000:]  # it waited for process 0's checkpoint, never finished


@pytest.mark.slow
def test_an_adaptive_run_on_2_processes_killed_mid_way_resumes_to_the_uninterrupted_runs_batches_and_weight_log(tmp_path, caches):
    """A run on 2 processes of 2 CPU devices each (a mesh of 4) is SIGKILLed in its save of step 8, resumed on 2
    processes from step 4 (the checkpoint they wrote, each placing its part of every array) and SIGKILLed in its save of
    step 12, then resumed on one process of 4 devices from step 8: it ends with the batches and the weight log of a run
    that trained uninterrupted on one process, and process 0 alone wrote its metrics."""
    trainer = {**TRAINER, "mesh": {"data": 4, "model": 1}}
    paths = {run: write_train_config(tmp_path, run, trainer, MODEL, caches, adaptive=ODM, mixture_block_size=16) for run in ("whole", "killed")}
    train(load_train_config(paths["whole"]))
    _two_processes_killed(tmp_path, paths["killed"], 6, 1, "first")  # the first write after step 6: the save of step 8
    _two_processes_killed(tmp_path, paths["killed"], 10, 2, "second")  # after step 11's update is written: the save of step 12
    assert train(load_train_config(paths["killed"])).first_step == 8
    whole, resumed = (read_metrics(str(tmp_path / run))[0] for run in ("whole", "killed"))
    assert {r["step"]: r["fingerprint"] for r in resumed} == {r["step"]: r["fingerprint"] for r in whole}
    assert (tmp_path / "killed" / WEIGHT_LOG).read_text() == (tmp_path / "whole" / WEIGHT_LOG).read_text()
    assert len(read_log(str(tmp_path / "whole"))) == 5
    lines = [r["step"] for r in map(json.loads, (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert lines == list(range(8)) + list(range(4, 12)) + list(range(8, 12))  # each step once per run that trained it


def _planted_config(tmp_path: Path, run: str, adaptive: dict | None) -> str:
    """Two sources: ``noise`` (random letters: nothing to learn beyond their frequencies) and ``learnable`` (a few
    sentences, repeated)."""
    rng = random.Random(0)
    sentences = ["the cat sat on the mat.", "a dog ran in the park.", "we read a book at home."]
    corpora = {
        "noise": lambda: " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(60)),
        "learnable": lambda: " ".join(rng.choice(sentences) for _ in range(20)),
    }
    configs = {}
    for name, make in corpora.items():
        for split in ("train", "validation"):
            path = tmp_path / "corpus" / f"{name}-{split}.jsonl"
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                write_jsonl(path, [{"text": make()} for _ in range(200 if split == "train" else 20)])
        configs[name] = {"train_urls": [str(tmp_path / "corpus" / f"{name}-train.jsonl")],
                         "validation_urls": [str(tmp_path / "corpus" / f"{name}-validation.jsonl")]}
    data = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"), "train_weights": {"noise": 0.5, "learnable": 0.5},
            "mixture_block_size": 16, "configs": configs, **({"adaptive": adaptive} if adaptive else {})}
    trainer = {**TRAINER, "num_train_steps": 30, "steps_per_eval": 10, "steps_per_checkpoint": 30, "learning_rate": 0.02,
               "checkpoint_dir": str(tmp_path / run)}
    path = tmp_path / f"{run}.yaml"
    path.write_text(yaml.safe_dump({"data": data, "trainer": trainer, "model": MODEL}))
    return str(path)


@pytest.mark.slow
def test_on_noise_beside_a_learnable_source_doremi_moves_weight_away_from_the_noise_and_odm_towards_it(tmp_path):
    """DoReMi runs with step size 0.3 and a floor of 0.2: at step size 1 and a floor of 0.05 this tiny model, nearly
    starved of the noise, forgot what it had learnt of it, its loss rose above the reference's, and DoReMi (a minimax
    over excess losses) gave the noise the weight back (0.95 by step 20): what DoReMi does, but not the planted answer."""
    train(load_train_config(_planted_config(tmp_path, "reference", None)))
    reference = tmp_path / "reference" / "metrics.jsonl"
    _, evals = read_metrics(str(tmp_path / "reference"))
    assert evals[-1]["loss"]["noise"] > evals[-1]["loss"]["learnable"] + 1  # the planted case: noise stays hard
    floor = 0.2
    shares = {}
    for algorithm in ("doremi", "odm"):
        adaptive = {"algorithm": algorithm, "update_every": 3, "floor": floor, "doremi_step_size": 0.3, "reference_metrics": str(reference)}
        train(load_train_config(_planted_config(tmp_path, algorithm, adaptive)))
        log = read_log(str(tmp_path / algorithm))
        assert len(log) == 11 and all(w >= floor for s in log for w in s.weights.values())
        shares[algorithm] = [s.weights["noise"] for s in log[1:]]
    assert max(shares["doremi"]) < 0.4  # every update, from the first, keeps the noise well below its initial half
    odm = shares["odm"]
    assert odm[0] == 0.5 and all(b >= a for a, b in zip(odm, odm[1:])) and odm[-1] > 0.52  # the highest loss gains weight


@pytest.mark.slow
def test_an_adaptive_run_is_the_same_whatever_its_prefetch_depth_or_readers_and_when_resumed_on_8_devices_after_4(tmp_path, caches):
    """With ``adaptive.delay`` set (6 steps, past every read-ahead here), prefetching 0 or 4 batches, or reading in 2
    reader processes, gives the same batches and log; a run stopped on 4 devices and resumed on 8 replays its log and
    decides the same updates."""
    adaptive = {**ODM, "delay": 6}
    mesh4, mesh8 = {"data": 4, "model": 1}, {"data": 8, "model": 1}
    whole = write_train_config(tmp_path, "whole", {**TRAINER, "mesh": mesh4, "prefetch": 0}, MODEL, caches, adaptive=adaptive,
                               mixture_block_size=16)
    train(load_train_config(whole))
    for mesh, stop in ((mesh4, 6), (mesh8, None)):
        config = write_train_config(tmp_path, "elastic", {**TRAINER, "mesh": mesh, "prefetch": 4}, MODEL, caches,
                                    config_name=f"elastic-{mesh['data']}", adaptive=adaptive, mixture_block_size=16)
        result = train(load_train_config(config), stop_after=stop)
    assert result.first_step == 6
    runs = [read_metrics(str(tmp_path / run))[0] for run in ("whole", "elastic")]
    assert [{r["step"]: r["fingerprint"] for r in steps} for steps in runs][0] == {r["step"]: r["fingerprint"] for r in runs[1]}
    assert (tmp_path / "elastic" / WEIGHT_LOG).read_text() == (tmp_path / "whole" / WEIGHT_LOG).read_text()
    assert len(read_log(str(tmp_path / "whole"))) == 5
    readers = {**TRAINER, "mesh": mesh4, "loader_workers": 2, "prefetch": 1}  # reads in 2 processes, each told of every update
    workers = write_train_config(tmp_path, "workers", readers, MODEL, caches, adaptive=adaptive, mixture_block_size=16)
    train(load_train_config(workers))
    assert {r["step"]: r["fingerprint"] for r in read_metrics(str(tmp_path / "workers"))[0]} == {r["step"]: r["fingerprint"] for r in runs[0]}
    assert (tmp_path / "workers" / WEIGHT_LOG).read_text() == (tmp_path / "whole" / WEIGHT_LOG).read_text()


@pytest.mark.parametrize("stop_strategy", ["restart", "first_exhausted"])
def test_under_a_batch_size_ramp_updates_start_where_the_ramp_puts_step_s_plus_delay_and_the_log_gives_the_batches(tmp_path, caches,
                                                                                                                   stop_strategy):
    ramp = [[0, 8], [4, 16]]
    path = write_train_config(tmp_path, "ramp", {**TRAINER, "num_train_steps": 9, "train_batch_size": ramp}, MODEL, caches,
                              adaptive=ODM, mixture_block_size=16, stop_strategy=stop_strategy)
    config = load_train_config(path)
    train(config)
    log = read_log(str(tmp_path / "ramp"))
    offset = BatchSchedule.of([tuple(stage) for stage in ramp]).offset
    # steps 0-3 take 8 examples, then 16: step s + 4 starts at 32 + 16 (s + 4 - 4), here already on a block boundary
    assert [(s.decided_at_step, s.start, s.step) for s in log[1:]] == [(2, 64, 6), (5, 112, 9), (8, 160, 12)]
    assert all(offset(s.decided_at_step + 4) <= s.start < offset(s.decided_at_step + 4) + 16 for s in log[1:])
    steps, _ = read_metrics(str(tmp_path / "ramp"))
    mixture = config.data.train_set(config.trainer.seq_len, weight_log=stages(log))
    with DataLoader(mixture, [tuple(stage) for stage in ramp], make_mesh(config), {"batch": "data"}, prefetch=0, fingerprint=True,
                    positions=True) as loader:
        assert [loader.batch(r["step"]).fingerprint for r in steps] == [r["fingerprint"] for r in steps]
    if stop_strategy == "first_exhausted":  # a finite mixture's end moves with the weights
        assert len(mixture) != len(config.data.train_set(config.trainer.seq_len)) and len(mixture) > log[-1].start


@pytest.mark.slow
def test_a_run_with_delay_unset_resumed_with_another_prefetch_keeps_its_update_starts_and_batches(tmp_path, caches, whole_in_blocks_of_8):
    """Unset, ``adaptive.delay`` is the loader's read-ahead, which ``trainer.prefetch`` and ``trainer.loader_workers`` set:
    neither is data, so a resume may change them. The resume goes on with the delay the run so far used (4 steps), not
    its own loader's (2, prefetching nothing), so its updates start where the uninterrupted run's do; a resume reading
    further ahead than that delay (6 steps, with a reader process) is refused naming adaptive.delay."""
    path = write_train_config(tmp_path, "resumed", TRAINER, MODEL, caches, adaptive=ODM, mixture_block_size=8)
    assert train(load_train_config(path), stop_after=6).first_step == 0
    workers = write_train_config(tmp_path, "resumed", {**TRAINER, "loader_workers": 1}, MODEL, caches, config_name="workers",
                                 adaptive=ODM, mixture_block_size=8)
    with pytest.raises(ValueError, match=r"adaptive.delay is unset, and the run so far applied each update 4 steps .* now read 6 steps"):
        train(load_train_config(workers))
    no_prefetch = write_train_config(tmp_path, "resumed", {**TRAINER, "prefetch": 0}, MODEL, caches, config_name="no-prefetch",
                                     adaptive=ODM, mixture_block_size=8)
    assert train(load_train_config(no_prefetch)).first_step == 6
    whole, resumed = (read_metrics(str(run))[0] for run in (whole_in_blocks_of_8, tmp_path / "resumed"))
    assert {r["step"]: r["fingerprint"] for r in resumed} == {r["step"]: r["fingerprint"] for r in whole}
    assert (tmp_path / "resumed" / WEIGHT_LOG).read_text() == (whole_in_blocks_of_8 / WEIGHT_LOG).read_text()
    assert [(s.decided_at_step, s.step) for s in read_log(str(whole_in_blocks_of_8))[1:]] == [(2, 6), (5, 9), (8, 12), (11, 15)]


@pytest.mark.slow
def test_a_run_resumed_with_its_sources_listed_in_another_order_decides_the_uninterrupted_runs_weights(tmp_path, caches,
                                                                                                       whole_in_blocks_of_8):
    """Listing the sources in another order renumbers them (a batch's source ids, hence its fingerprint: allowed as a data
    change) but changes no example; the resume restores the updater's state and its window's sums by source name, so it
    decides the weights the uninterrupted run decides."""
    path = write_train_config(tmp_path, "resumed", TRAINER, MODEL, caches, adaptive=ODM, mixture_block_size=8)
    train(load_train_config(path), stop_after=7)  # its last checkpoint holds step 6's statistics, a window under way
    doc = yaml.safe_load(Path(path).read_text())
    doc["data"]["configs"] = dict(reversed(doc["data"]["configs"].items()))
    doc["trainer"]["allow_data_change"] = True
    reordered = tmp_path / "reordered.yaml"
    reordered.write_text(yaml.safe_dump(doc, sort_keys=False))
    config = load_train_config(str(reordered))
    train_set = config.data.train_set(64)
    assert train_set.names == ["webster", "python_doc", "linux_doc"]
    checkpoint = latest_checkpoint(str(tmp_path / "resumed"))
    saved = checkpoint.record["mixing"]["window"]
    under_way = OnlineMixing.start(config, train_set, from_records(checkpoint.record["weight_log"], "checkpoint"), checkpoint).window
    assert under_way.names == tuple(train_set.names) and min(saved["tokens"]) > 0
    assert under_way.mean_losses() == {n: s / t for n, s, t in zip(sorted(train_set.names), saved["loss_sums"], saved["tokens"])}
    assert train(config).first_step == 7
    assert (tmp_path / "resumed" / WEIGHT_LOG).read_text() == (whole_in_blocks_of_8 / WEIGHT_LOG).read_text()
