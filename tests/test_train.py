"""The training launch (issue 21): the loader's batches train a model on a (data 4, model 2) mesh of fake CPU devices,
every source is evaluated, a stopped run resumes to the very batches and parameters of an uninterrupted one, and
attention never crosses a document boundary."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from helpers import DEMO_CORPUS, REPO, CountingDataset, read_jsonl_zst, write_train_config
from jax.sharding import Mesh

from tokenmix import build_caches
from tokenmix.datasets.subset import ExampleRange
from tokenmix.loader.loader import DataLoader
from tokenmix.train.config import TrainerConfig, TrainLmConfig, load_train_config
from tokenmix.train.loop import TrainResult, evaluate, evaluation_batches, make_mesh, train
from tokenmix.train.model import ModelConfig, TinyLM, loss_and_count, per_source, row_losses, shard_params
from tokenmix.train.plots import plot_run, read_metrics, run_figure, scheduled_weights
from tokenmix.train.processes import check_processes

TINY = {"hidden_dim": 64, "num_layers": 1, "num_heads": 2, "max_position": 256}


def _config(tmp_path, run: str, **trainer) -> TrainLmConfig:
    return load_train_config(write_train_config(tmp_path, run, {
        "num_train_steps": 24, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 4, "model": 2}, "learning_rate": 0.01,
        "warmup_steps": 4, "steps_per_eval": 12, "max_eval_batches": 2, "steps_per_checkpoint": 6, **trainer}, TINY))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[TrainLmConfig, TrainResult]:
    """A run of 24 steps trained without a stop, and its result; the tests only read them."""
    config = _config(tmp_path_factory.mktemp("uninterrupted"), "whole")
    return config, train(config)


def test_a_few_dozen_steps_lower_the_loss_and_every_source_is_evaluated(uninterrupted):
    config, result = uninterrupted
    steps, evals = read_metrics(config.trainer.checkpoint_dir)
    losses = [r["loss"] for r in steps]
    assert len(losses) == 24 and np.mean(losses[-6:]) < np.mean(losses[:6]) - 1.0  # (it falls by about 2.2)
    assert [e["step"] for e in evals] == [11, 23]  # evaluated after steps 11 and 23 (12 and 24 steps trained)
    assert set(result.validation) == {"linux_doc", "python_doc", "webster"}
    assert all(evals[-1]["loss"][n] < evals[0]["loss"][n] for n in result.validation)
    assert sum(sum(r["sources"].values()) == 8 for r in steps) == 24 and all(r["fingerprint"] for r in steps)
    assert 0 <= result.data_wait_share < 0.5
    picture = plot_run(config)
    assert open(picture, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_run_stopped_and_resumed_sees_the_batches_and_reaches_the_parameters_of_an_uninterrupted_one(tmp_path, uninterrupted):
    _, whole = uninterrupted
    stopped = _config(tmp_path, "stopped", loader_workers=1)  # its batches read in a process of their own
    first = train(stopped, stop_after=9)  # checkpoints at 6 and at 9, where it stops
    assert first.steps == 9
    resumed = train(stopped)
    assert resumed.first_step == 9 and resumed.steps == 15
    assert {s: resumed.fingerprints[s] for s in range(9, 24)} == {s: whole.fingerprints[s] for s in range(9, 24)}
    assert {s: first.fingerprints[s] for s in range(9)} == {s: whole.fingerprints[s] for s in range(9)}
    for a, b in zip(jax.tree_util.tree_leaves(resumed.model), jax.tree_util.tree_leaves(whole.model)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert resumed.final_loss == pytest.approx(whole.final_loss, rel=1e-5)
    logged = [json.loads(line) for line in open(tmp_path / "stopped" / "metrics.jsonl")]
    assert [r["step"] for r in logged if r["kind"] == "train"] == list(range(24))


def test_the_step_compiles_once_and_the_log_names_each_step_as_metrics_records_it(tmp_path, caplog):
    """Step 1 compiled the step again (its inputs, step 0's outputs, were laid out as XLA wrote them), and that compile
    counted as step time beside the data waits; the log's "step 4" was the step metrics.jsonl records as 3; a source
    without a validation set was left out of evaluation without a word."""
    path = write_train_config(tmp_path, "run", {"num_train_steps": 4, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 4, "model": 2},
                                                "steps_per_eval": 2, "max_eval_batches": 1, "steps_per_checkpoint": 4}, TINY)
    doc = yaml.safe_load(open(path))
    del doc["data"]["configs"]["webster"]["validation_urls"]
    open(path, "w").write(yaml.safe_dump(doc))
    config = load_train_config(path)
    with caplog.at_level(logging.INFO), jax.log_compiles():
        train(config)
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("Compiling jit(step_fn)") for m in messages) == 1
    steps, evals = read_metrics(config.trainer.checkpoint_dir)
    logged = [m for m in messages if re.match(r"step \d+: train loss", m)]
    assert [e["step"] for e in evals] == [1, 3] and len(logged) == 2
    for line, evaluation in zip(logged, evals):
        step, loss = re.match(r"step (\d+): train loss ([\d.]+)", line).groups()
        assert int(step) == evaluation["step"] and float(loss) == round(steps[int(step)]["loss"], 3)
        assert str({k: round(v, 3) for k, v in evaluation["loss"].items()}) in line
    assert all(set(e["loss"]) == {"linux_doc", "python_doc"} for e in evals)
    assert sum("source webster has no validation set" in m and "not evaluated" in m for m in messages) == 1


@pytest.mark.slow
def test_tokenmix_train_says_nothing_of_a_tpu_and_a_finished_run_run_again_says_there_is_nothing_to_train(tmp_path):
    path = write_train_config(tmp_path, "run", {"num_train_steps": 3, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 4, "model": 2},
                                                "cpu_devices": 8, "steps_per_eval": 3, "max_eval_batches": 1}, TINY)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}  # as a user runs it: trainer.cpu_devices asks
    first, again = (subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "train", "--config_path", path], cwd=REPO, env=env,
                                   capture_output=True, text=True) for _ in range(2))
    assert first.returncode == 0, first.stderr
    assert "Unable to initialize backend" not in first.stderr and "tpu" not in first.stderr.lower()
    assert "trained steps 0 to 2: final training loss" in first.stdout
    assert again.returncode == 0, again.stderr
    assert f"nothing to train: {tmp_path / 'run'} has trained 3 steps, all that trainer.num_train_steps asks for" in again.stdout
    assert "nan" not in again.stdout and "tpu" not in again.stderr.lower()


def test_evaluation_reads_only_the_batches_it_uses(tmp_path):
    config = _config(tmp_path, "eval")
    build_caches(config.data, progress=False)
    mesh = make_mesh(config)
    model = shard_params(TinyLM.init(config.model, 32000, jax.random.PRNGKey(0)), mesh)
    counting = CountingDataset(config.data.validation_sets(config.trainer.seq_len)["linux_doc"])
    losses = evaluate(model, {"linux_doc": counting}, 8, 2, mesh)
    assert set(losses) == {"linux_doc"} and losses["linux_doc"] > 0
    assert [len(indices) for indices in counting.reads] == [8, 8]


def test_a_document_never_attends_to_the_one_before_it_in_the_window():
    model = TinyLM.init(ModelConfig(**TINY), 500, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, 500, 20), rng.integers(0, 500, 12)
    other_first = rng.integers(0, 500, 20)
    segments = jnp.asarray([[0] * 20 + [1] * 12])
    positions = jnp.asarray([list(range(20)) + list(range(12))])
    window = model(jnp.asarray([np.concatenate([first, second])]), segments, positions)
    changed = model(jnp.asarray([np.concatenate([other_first, second])]), segments, positions)
    alone = model(jnp.asarray([second]), jnp.zeros((1, 12), jnp.int32), jnp.arange(12)[None])
    np.testing.assert_array_equal(np.asarray(window[0, 20:]), np.asarray(changed[0, 20:]))  # exactly: masked out
    np.testing.assert_allclose(np.asarray(window[0, 20:]), np.asarray(alone[0]), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.asarray(window[0, :20]), np.asarray(changed[0, :20]))


def test_the_run_picture_gives_a_source_one_colour_keeps_legends_off_the_data_and_says_what_the_run_is(tmp_path):
    """The loss panel coloured sources alphabetically and the shares panel in config order; the shares legend lay over the
    lines; the title was the directory's name."""
    import matplotlib.colors

    path = write_train_config(tmp_path, "pictured", {"num_train_steps": 30, "train_batch_size": 8, "seq_len": 64}, TINY)
    doc = yaml.safe_load(open(path))
    names = ["webster", "python_doc", "linux_doc"]  # not alphabetical
    doc["data"]["configs"] = {name: doc["data"]["configs"][name] for name in names}
    open(path, "w").write(yaml.safe_dump(doc, sort_keys=False))
    config = load_train_config(path)
    run = tmp_path / "pictured"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as log:
        for step in range(30):
            log.write(json.dumps({"kind": "train", "step": step, "loss": 10 - step / 10, "examples": 8,
                                  "sources": {"linux_doc": 4, "python_doc": 2, "webster": 2}}) + "\n")
            if step % 10 == 9:
                log.write(json.dumps({"kind": "eval", "step": step, "loss": {n: 9 - step / 20 + i for i, n in enumerate(names)}}) + "\n")
    figure = run_figure(config)
    for axes in figure.axes:
        assert {line.get_gid() for line in axes.get_lines()} - {None} == set(names)
    colours: dict[str, set[str]] = {}
    for line in (line for axes in figure.axes for line in axes.get_lines() if line.get_gid()):
        colours.setdefault(line.get_gid(), set()).add(matplotlib.colors.to_hex(line.get_color()))
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == 3
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    for axes in figure.axes:
        assert not axes.get_legend().get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))
    title = figure.get_suptitle()
    assert "TinyLM (1 layer, 64 wide) trained 30 of 30 steps on webster, python_doc, linux_doc" in title
    assert "batches of 8 x 64 tokens" in title and str(run) in title


def test_the_schedule_picture_follows_the_stages_in_steps(tmp_path):
    config = _config(tmp_path, "plot")
    data = replace(config.data, train_weights=[(0, {"linux_doc": 1.0}), (10, {"linux_doc": 0.5, "webster": 0.5})], batch_size=8)
    steps, weights = scheduled_weights(data, 20)
    assert weights["linux_doc"][:10].tolist() == [1.0] * 10 and weights["linux_doc"][10:].tolist() == [0.5] * 10
    assert weights["webster"][10:].tolist() == [0.5] * 10
    out = tmp_path / "schedule.png"
    config_path = tmp_path / "plot.yaml"
    subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "plot", "--config_path", str(config_path), "--steps", "100",
                    "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trainer_fields_are_checked_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="trainer.seq_len must be at least 1"):
        TrainerConfig(seq_len=0)
    with pytest.raises(ValueError, match=r"trainer.mesh: axes \['tensor'\] are not used"):
        TrainerConfig(mesh={"data": 1, "tensor": 2})
    with pytest.raises(ValueError, match=r"trainer.loader_read_timeout_s must be a number of seconds > 0, got 0"):
        TrainerConfig(loader_read_timeout_s=0)
    with pytest.raises(ValueError, match=r"trainer.process_id must be 0 to trainer.num_processes - 1 .* got process_id 2 of 2"):
        TrainerConfig(coordinator_address="127.0.0.1:12355", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match="trainer.num_processes 2 needs trainer.coordinator_address"):
        TrainerConfig(num_processes=2)
    with pytest.raises(ValueError, match=r"trainer.num_processes is 2, but JAX runs 1 process\(es\): start each process through"):
        check_processes(TrainerConfig(coordinator_address="127.0.0.1:12355", num_processes=2, process_id=1))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"data": {}, "trainer": {"num_train_step": 3}}))
    with pytest.raises(ValueError, match="num_train_step -> num_train_steps"):
        load_train_config(str(path))


@pytest.mark.parametrize(("name", "value"), [("warmup_steps", -3), ("learning_rate", -0.01), ("learning_rate", 0.0),
                                           ("learning_rate", float("nan")), ("weight_decay", -0.1), ("eval_batch_size", 0),
                                           ("eval_batch_size", -8), ("cpu_devices", 0)])
def test_trainer_fields_at_their_edges_are_refused_naming_the_field(name, value):
    # each used to be taken: a negative warmup started the schedule mid-decay, a learning rate <= 0 or nan trained nothing
    # or diverged, an eval_batch_size of 0 fell back to the training batch size and a negative one failed at the first
    # evaluation, cpu_devices 0 asked for no devices
    with pytest.raises(ValueError, match=rf"trainer.{name} must be .*got {value}"):
        TrainerConfig(**{name: value})
    TrainerConfig(warmup_steps=0, weight_decay=0.0)  # the edges that are fine


@pytest.mark.parametrize("mesh", [{"data": 0, "model": 1}, {"data": -1, "model": 0}, {"data": 4, "model": -1}])
def test_a_mesh_axis_of_fewer_than_one_device_is_refused_naming_the_axis(mesh):
    # refused only once the caches were built, as a mesh that "needs 0 devices" (model 0 with data -1: a ZeroDivisionError)
    axis, size = next((a, s) for a, s in mesh.items() if s < 1 and not (a == "data" and s == -1))
    with pytest.raises(ValueError, match=rf"trainer.mesh: axis {axis} has size {size}; an axis takes at least 1 device"):
        TrainerConfig(mesh=mesh)


def test_a_batch_size_the_mesh_does_not_divide_is_refused_before_any_step_naming_the_trainer_field(tmp_path):
    # it used to fail at the first evaluation, after the steps before it were trained; a training batch size was refused
    # naming only "batch_size"
    config = _config(tmp_path, "run", num_train_steps=2, steps_per_eval=1, steps_per_checkpoint=1, eval_batch_size=6)
    with pytest.raises(ValueError, match=r"trainer.eval_batch_size 6 does not fit trainer.mesh \{'data': 4, 'model': 2\}: batch size 6 "
                                         r"is not divisible by 4, .* use a multiple of 4"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(ValueError, match=r"trainer.train_batch_size 12 does not fit trainer.mesh .*: batch size 12 is not divisible by 8"):
        train(_config(tmp_path, "ramp", train_batch_size=[[0, 8], [1, 12]], mesh={"data": 8, "model": 1}))


def test_every_validation_example_is_evaluated_the_last_batch_padded_with_examples_that_weigh_nothing(tmp_path, caplog):
    """Evaluation took whole batches only: the examples past the last whole batch were never evaluated (linux_doc's set
    of 667 lost 3 at batches of 8), and a set smaller than one batch was not evaluated at all. With max_eval_batches
    null each set is evaluated whole, its last batch padded, and each loss is the mean over every trained token of its
    examples, computed here apart from the loop. An empty set is still left out, named."""
    path = write_train_config(tmp_path, "run", {"num_train_steps": 2, "train_batch_size": 8, "seq_len": 64, "mesh": {"data": 4, "model": 2},
                                                "steps_per_eval": 2, "max_eval_batches": None, "eval_batch_size": 8}, TINY)
    doc = yaml.safe_load(open(path))
    sets = {"linux_doc": read_jsonl_zst(DEMO_CORPUS / "linux_doc" / "validation.jsonl.zst")[:4],  # a tail past whole batches
            "webster": [{"text": " ".join(["word"] * 150)}],  # 2 examples: fewer than a batch and than the 4 devices of the data axis
            "python_doc": [{"text": "too short"}]}  # no example
    for name, docs in sets.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        doc["data"]["configs"][name]["validation_urls"] = [str(tmp_path / f"{name}.jsonl")]
    open(path, "w").write(yaml.safe_dump(doc))
    config = load_train_config(path)
    with caplog.at_level(logging.WARNING, logger="tokenmix.train.loop"):
        result = train(config)
    validation = config.data.validation_sets(64)
    sizes = {name: len(dataset) for name, dataset in validation.items()}
    assert sizes["linux_doc"] > 8 and sizes["linux_doc"] % 8 and sizes["webster"] == 2 and sizes["python_doc"] == 0
    assert "the validation set of python_doc holds no examples (its documents are shorter than one example, or there are none): " \
           "it is not evaluated; give it validation documents of at least one example" in caplog.text
    assert set(result.validation) == {"linux_doc", "webster"}
    _, evals = read_metrics(config.trainer.checkpoint_dir)
    assert evals[-1]["loss"] == result.validation
    model = jax.device_put(result.model, jax.devices()[0])
    for name in ("linux_doc", "webster"):
        examples = validation[name].get_batch(range(sizes[name]))
        rows, counts = row_losses(model, jnp.asarray(examples.tokens), jnp.asarray(examples.loss_mask),
                                  jnp.asarray(examples.segment_ids), jnp.asarray(examples.positions()))
        assert float(jnp.sum(counts)) > 0
        assert result.validation[name] == pytest.approx(float(jnp.sum(rows) / jnp.sum(counts)), rel=1e-5), name


def test_evaluation_batches_hold_the_examples_and_padding_of_levanters_padded_final_batch(tmp_path):
    """``tests/data/levanter/eval_batches.json`` holds the batches Levanter's own ``DataLoader(pad_final_batch=True)``
    (Levanter 1.2.dev1644, jax 0.10.2 CPU, a data axis of 2 devices) gave over sets of 11, 3, 1, 8 and 13 examples, and
    over 11 with max_eval_batches 2 (``train_lm`` keeps that many batches of examples of each set): which example each
    row holds, which rows are padding, and each row's loss weight. Made in the side venv by
    ``tests/data/levanter/make_eval_batches.py`` (its docstring gives the command). tokenmix's evaluation batches over the
    first N examples of a real validation set, on a data axis of 2, hold the same examples in the same rows and pad the
    same rows, with no position trained: before, the examples past the last whole batch were never read."""
    levanter = json.loads((REPO / "tests" / "data" / "levanter" / "eval_batches.json").read_text())
    config = _config(tmp_path, "levanter")
    build_caches(config.data, progress=False)
    whole = config.data.validation_sets(config.trainer.seq_len)["linux_doc"]
    mesh = Mesh(np.array(jax.devices()[: levanter["data_axis"]]).reshape(-1, 1), ("data", "model"))
    for case in levanter["cases"]:
        n, size = case["examples"], case["batch_size"]
        tokens = whole.get_batch(range(n)).tokens
        assert len({row.tobytes() for row in tokens}) == n  # each row names its example
        batches = []
        for step_batch in evaluation_batches(ExampleRange(whole, 0, n), size, case["max_eval_batches"], mesh):
            arrays = {k: np.asarray(v) for k, v in step_batch.batch.arrays().items()}
            assert [s.data.shape[0] for s in step_batch.batch.tokens.array.addressable_shards] == [size // 2] * 2
            examples = [next((i for i in range(n) if np.array_equal(row, tokens[i])), -1) for row in arrays["tokens"]]
            weight = arrays["loss_mask"].sum(axis=1)
            assert all((weight[r] == 0) == (e == -1) for r, e in enumerate(examples))
            batches.append({"examples": examples, "padding": [e == -1 for e in examples]})
        assert batches == [{"examples": b["examples"], "padding": b["padding"]} for b in case["batches"]], case
        assert all((w == 0) == p for b in case["batches"] for w, p in zip(b["loss_weight"], b["padding"]))


def test_max_eval_batches_null_reads_every_example_once_and_no_more(tmp_path):
    # Levanter's max_eval_batches: None evaluates every example; here it was refused (at least 1), and any number of
    # batches left out the examples past the last whole one
    config = _config(tmp_path, "eval")
    build_caches(config.data, progress=False)
    mesh = make_mesh(config)
    model = shard_params(TinyLM.init(config.model, 32000, jax.random.PRNGKey(0)), mesh)
    counting = CountingDataset(ExampleRange(config.data.validation_sets(config.trainer.seq_len)["linux_doc"], 0, 19))
    losses = evaluate(model, {"linux_doc": counting}, 8, None, mesh)
    assert losses["linux_doc"] > 0
    assert [r.tolist() for r in counting.reads] == [list(range(8)), list(range(8, 16)), [16, 17, 18]]
    assert TrainerConfig().max_eval_batches is None  # Levanter's default


def test_a_data_batch_size_other_than_the_trainers_is_refused_naming_both(tmp_path):
    # it was taken: a weight stage "from step 4" at data.batch_size 16 started at example 64, step 8 of the run's batches of 8
    stages = [[0, {"linux_doc": 1.0, "python_doc": 0.0, "webster": 0.0}], [4, {"linux_doc": 0.0, "python_doc": 1.0, "webster": 0.0}]]
    trainer = {"train_batch_size": 8, "checkpoint_dir": str(tmp_path / "run")}
    path = write_train_config(tmp_path, "other", trainer, TINY, batch_size=16, train_weights=stages)
    with pytest.raises(ValueError, match=r"other.yaml: data.batch_size 16 is not trainer.train_batch_size 8: .* Remove data.batch_size"):
        load_train_config(path)
    same = load_train_config(write_train_config(tmp_path, "same", trainer, TINY, batch_size=[[0, 8]], train_weights=stages))
    assert same.data.weight_schedule()[1][0] == 32  # step 4 of batches of 8
    with pytest.raises(ValueError, match=r"data.batch_size \[\(0, 8\)\] is not trainer.train_batch_size 16"):
        replace(same, trainer=replace(same.trainer, train_batch_size=16))  # a config built in code


def test_a_seq_len_longer_than_the_models_positions_is_refused_at_start_naming_both_fields(tmp_path):
    trainer = {"seq_len": 512, "checkpoint_dir": str(tmp_path / "run")}
    path = write_train_config(tmp_path, "long", trainer, {**TINY, "max_position": 256})
    with pytest.raises(ValueError, match=r"long.yaml: trainer.seq_len 512 is more than model.max_position 256: positions past 255 .*"
                                         r"Raise model.max_position to at least 512, or lower trainer.seq_len to at most 256"):
        load_train_config(path)
    path = write_train_config(tmp_path, "megatron", {**trainer, "seq_len": 256}, {**TINY, "max_position": 256}, example_convention="megatron")
    with pytest.raises(ValueError, match=r"trainer.seq_len 256 makes examples of 257 tokens \(data.example_convention megatron\), more "
                                         r"than model.max_position 256.* at most 255"):
        load_train_config(path)
    config = load_train_config(write_train_config(tmp_path, "fits", {**trainer, "seq_len": 256}, {**TINY, "max_position": 256}))
    with pytest.raises(ValueError, match="trainer.seq_len 257 is more than model.max_position 256"):
        replace(config, trainer=replace(config.trainer, seq_len=257))
    result = subprocess.run([sys.executable, "-m", "tokenmix.train", "--config_path", str(tmp_path / "long.yaml")], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 1 and "trainer.seq_len 512 is more than model.max_position 256" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1  # one line, as every command
    assert not (tmp_path / "run").exists()  # refused before anything was built or trained


def test_the_step_gives_each_sources_loss_sum_and_tokens_reduced_over_the_mesh_and_logs_them(uninterrupted):
    config, result = uninterrupted
    steps, _ = read_metrics(config.trainer.checkpoint_dir)
    names = ["linux_doc", "python_doc", "webster"]
    for r in steps:
        tokens = r["source_tokens"]
        assert set(tokens) == set(names) and all(tokens[n] > 0 for n in names if r["sources"][n])
        mean = sum(r["source_loss"][n] * tokens[n] for n in names if tokens[n]) / sum(tokens.values())
        assert mean == pytest.approx(r["loss"], rel=1e-5)
    mesh = make_mesh(config)
    train_set = config.data.train_set(config.trainer.seq_len)
    with DataLoader(train_set, 8, mesh, {"batch": "data"}, prefetch=0, positions=True) as loader:
        batch = loader.batch(0).batch
    b = batch.arrays()
    assert len(b["tokens"].sharding.device_set) == 8  # the batch is spread over the mesh
    rows, counts = jax.jit(row_losses)(result.model, b["tokens"], b["loss_mask"], b["segment_ids"], b["positions"])
    sums = jax.jit(per_source, static_argnums=2)(rows, b["source_ids"], 3)
    tokens = jax.jit(per_source, static_argnums=2)(counts, b["source_ids"], 3)
    ids = np.asarray(b["source_ids"])
    for sid in range(3):
        rows_of = np.flatnonzero(ids == sid)
        take = {k: jnp.asarray(np.asarray(v)[rows_of]) for k, v in b.items()}
        total, count = loss_and_count(result.model, take["tokens"], take["loss_mask"], take["segment_ids"], take["positions"])
        assert float(sums[sid]) == pytest.approx(float(total), rel=1e-5) and float(tokens[sid]) == float(count)


def test_the_run_picture_and_tokenmix_plot_draw_the_runs_weight_log_and_each_sources_training_loss(tmp_path):
    config = _config(tmp_path, "logged")
    run = tmp_path / "logged"
    run.mkdir()
    names = ["linux_doc", "python_doc", "webster"]
    with open(run / "metrics.jsonl", "w") as log:
        for step in range(20):
            log.write(json.dumps({"kind": "train", "step": step, "loss": 9 - step / 10, "examples": 8, "sources": {n: 3 for n in names},
                                  "source_loss": {n: 9 - step / 10 + i for i, n in enumerate(names)}}) + "\n")
    stages = [{"start": 0, "step": 0, "weights": {"linux_doc": 0.5, "python_doc": 0.3, "webster": 0.2}, "by": "config"},
              {"start": 80, "step": 10, "weights": {"linux_doc": 0.2, "python_doc": 0.2, "webster": 0.6}, "by": "odm", "decided_at_step": 5}]
    (run / "weights.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stages))
    figure = run_figure(config)
    loss_ax, share_ax = figure.axes
    assert {line.get_label() for line in loss_ax.get_lines()} >= {f"train: {n}" for n in names}
    dashed = {line.get_gid(): line.get_ydata() for line in share_ax.get_lines() if line.get_linestyle() == "--"}
    assert dashed["webster"][5] == 0.2 and dashed["webster"][15] == 0.6 and dashed["linux_doc"][15] == 0.2
    out = tmp_path / "log.png"
    subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "plot", "--config_path", str(tmp_path / "logged.yaml"), "--steps", "20",
                    "--weight_log", str(run / "weights.jsonl"), "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
