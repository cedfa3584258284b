"""The CLI (build-cache with overrides, inspect) and Levanter-compatible config parsing."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from curate_kill import finished_tasks
from helpers import DEMO_CORPUS, REPO, TOKENIZER, build, demo_urls

from tokenmix import (
    ConfigError,
    LMDatasetConfig,
    LMDatasetSourceConfig,
    LMMixtureDatasetConfig,
    PackedDataset,
    TextLmDatasetFormat,
    TokenCache,
    build_caches,
    load_data_config,
)
from tokenmix.cli.main import main
from tokenmix.config import cache_targets


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "tokenmix.cli.main", *args], cwd=cwd, capture_output=True, text=True)


def test_build_cache_cli_with_overrides_then_inspect(tmp_path):
    result = _cli("build-cache", "--config_path", "config/demo.yaml", "--cache_dir", str(tmp_path), "--source", "webster",
                  "--build.num_workers", "1", "--build.on_error", "skip")
    assert result.returncode == 0, result.stderr
    assert "webster" in result.stdout and "validation" in result.stdout
    assert not (tmp_path / "linux_doc").exists()
    stats = json.loads((tmp_path / "webster" / "train" / "stats.json").read_text())
    assert stats["documents"] == 270
    shown = _cli("inspect", str(tmp_path / "webster" / "train"), "--samples", "2")
    assert shown.returncode == 0, shown.stderr
    assert "fingerprint" in shown.stdout and "document 1" in shown.stdout and "finished" in shown.stdout
    as_json = json.loads(_cli("inspect", str(tmp_path / "webster" / "train"), "--json").stdout)
    assert as_json["stats"]["documents"] == 270 and as_json["ledger"]["finished"]
    assert as_json["packing_plans"] == {} and "packing plans" not in shown.stdout

    packed = PackedDataset(TokenCache(str(tmp_path / "webster" / "train")), 512, pad_id=1, max_segments_per_example=8)
    shown = _cli("inspect", str(tmp_path / "webster" / "train"), "--samples", "0")
    assert shown.returncode == 0, shown.stderr
    assert "packing plans" in shown.stdout and packed.plan_id in shown.stdout and "complete" in shown.stdout
    plan = json.loads(_cli("inspect", str(tmp_path / "webster" / "train"), "--json").stdout)["packing_plans"][packed.plan_id]
    assert plan["examples"] == len(packed) and plan["options"]["max_segments_per_example"] == 8
    assert plan["stats"]["tokens"] / (plan["examples"] * 512) == pytest.approx(packed.stats()["packing_efficiency"])
    for output in (result, shown):
        assert "PyTorch was not found" not in output.stdout + output.stderr


def test_build_cache_on_finished_caches_says_nothing_needed_building(tmp_path):
    args = ("build-cache", "--config_path", "config/demo.yaml", "--cache_dir", str(tmp_path), "--source", "webster")
    first = _cli(*args)
    assert first.returncode == 0, first.stderr
    assert f"{tmp_path}/webster/train: building from 2 shards" in first.stderr and "nothing" not in first.stdout + first.stderr
    seconds = json.loads((tmp_path / "webster" / "train" / "stats.json").read_text())["build"]["seconds"]
    again = _cli(*args)
    assert again.returncode == 0, again.stderr
    assert "building" not in again.stderr
    for split in ("train", "validation"):
        assert f"{tmp_path}/webster/{split}: finished already, nothing to build" in again.stderr
    assert "nothing needed building, every cache was finished already" in again.stdout
    rows = [line for line in again.stdout.splitlines() if line.startswith("│ webster")]
    assert len(rows) == 2 and all(line.replace(" ", "").endswith("│-│-│") for line in rows), again.stdout
    assert json.loads((tmp_path / "webster" / "train" / "stats.json").read_text())["build"]["seconds"] == seconds
    config = load_data_config(str(REPO / "config" / "demo.yaml"), ["--cache_dir", str(tmp_path)])
    results = build_caches(config, sources=["webster"])
    assert all(st["already_built"] for st in results.values()) and results[("webster", "train")]["documents"] == 270
    assert "already_built" not in json.loads((tmp_path / "webster" / "train" / "stats.json").read_text())


def test_cli_errors_are_one_clear_line_and_a_nonzero_exit(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"),
                                      "configs": {"s": {"train_urls": [str(bad)]}}}))
    result = _cli("build-cache", "--config_path", str(config))
    assert result.returncode == 1
    assert f"{bad}, line 2: malformed_json" in result.stderr
    assert _cli("build-cache", "--config_path", str(tmp_path / "missing.yaml")).returncode == 1
    assert _cli("inspect", str(tmp_path / "nothing")).returncode == 1
    assert main(["no-such-command"]) == 2


@pytest.mark.parametrize("args, message", [
    (["train", "--config_path", "config/nope.yaml"], "config file config/nope.yaml does not exist"),
    (["train", "--trainer.num_train_step", "5"], "config/train_demo.yaml: The fields `num_train_step` are not valid for TrainerConfig "
                                                 "(did you mean: num_train_step -> num_train_steps?)"),
    (["train", "--model.hidden_dim", "7"], "model.hidden_dim 7 must be a multiple of model.num_heads 4"),
    (["demo", "--seq_len", "0"], "tokenmix demo: argument --seq_len: must be at least 2 (tokens per example), got 0"),
    (["demo", "--batch_size", "12"], "argument --batch_size: must be a multiple of 8"),
    (["demo", "--cache_dri", "x"], "did you mean: cache_dri -> cache_dir?"),
    (["plot", "--config_path", "config/nope.yaml"], "config file config/nope.yaml does not exist"),
    (["plot", "--config_path", "config/demo.yaml", "--seed", "x", "--out", os.devnull], "`seed`: Couldn't parse 'x' into an int"),
    (["plot", "--config_path", "config/demo.yaml", "--steps", "0", "--out", os.devnull], "argument --steps: must be at least 1"),
    (["plot", "--config_path", "config/demo.yaml", "--seed", "[1", "--out", os.devnull],
     "override --seed: '[1' is not a valid YAML value: line 1, column 3: expected ',' or ']', but got '<stream end>' (while "
     "parsing a flow sequence from line 1, column 1)"),
    (["plot", "--config_path", "config/levanter_style_single.yaml", "--out", os.devnull],
     "config/levanter_style_single.yaml is a single-source config: it has no mixture schedule to draw"),
    (["plot", "--config_path", "config/demo.yaml", "--weight_log", "config/demo.yaml", "--out", os.devnull],
     "config/demo.yaml, line 1: not a JSON record (Expecting value: line 1 column 1 (char 0)); a weight log holds one JSON "
     "object a line (a run's weights.jsonl)"),
    (["curate", "--config_path", "config/curation/demo.yaml", "--num_worker", "3"], "did you mean: num_worker -> num_workers?"),
    (["build-cache", "--config_path", "config/demo.yaml", "--build.on_eror", "skip"], "did you mean: on_eror -> on_error?"),
    (["build-cache", "--config_path", "config/demo.yaml", "--build.num_workers", "-1"],
     "build.num_workers must be at least 0 (0 tokenizes in the driver's thread) or null (one per core), got -1"),
    (["verify", "--config_path", "config/nope.yaml"], "config file config/nope.yaml does not exist"),
    (["export", "--to", "megatron", "--output", "out/x", "--config_path", "config/demo.yaml", "--source", "web"],
     "unknown source 'web'; the config defines ['linux_doc', 'python_doc', 'webster']"),
    (["export", "--to", "megatron", "--output", "out/x", "--config_path", "config/demo.yaml", "--source", "webster", "--split", "test"],
     "tokenmix export: argument --split: invalid choice: 'test' (choose from 'train', 'validation')"),
    (["export", "--to", "megatron", "--output", "out/x", "--cache", "cache/nope", "--split", "validation"],
     "tokenmix export: --source and --split choose a config's cache, so they need --config_path; --cache names the cache itself"),
    (["verify", "cache/nope", "--source", "webster"], "tokenmix verify: --source chooses a config's caches, so it needs --config_path"),
    (["inspect", "cache/nope"], "no cache at cache/nope"),
    (["inspect", "cache/nope", "--samples", "-1"], "tokenmix inspect: argument --samples: must be at least 0 (documents to decode), got -1"),
    (["inspect", "cache/nope", "--chars", "0"], "tokenmix inspect: argument --chars: must be at least 1 (characters shown per document), got 0"),
])
def test_every_command_reports_a_bad_config_or_option_in_one_line_naming_it(args, message):
    """No traceback: one line on stderr naming the field (or option) and the fix, nothing on stdout, a non-zero exit."""
    result = _cli(*args)
    assert result.returncode != 0
    assert result.stdout == ""
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_every_commands_help_describes_each_option_with_its_default_and_no_markup():
    from tokenmix.cli.main import COMMANDS

    for command in COMMANDS:
        result = _cli(command, "--help")
        assert result.returncode == 0, result.stderr
        assert "``" not in result.stdout, command
        options = result.stdout.split("\noptions:\n", 1)[1].splitlines()
        for line, following in zip(options, options[1:] + [""]):
            described = re.match(r"  -.*?\S {2,}\S", line) or following.startswith(" " * 24)
            assert not line.startswith("  -") or described, f"tokenmix {command}: {line.strip()} has no description"
    demo = _cli("demo", "--help").stdout
    for option, default in (("seq_len", 1024), ("batch_size", 32), ("batches", 300)):
        assert re.search(rf"--{option} {option.upper()}\s.*\(default: {default}\)", demo.replace("\n" + " " * 24, " ")), option


def test_an_unknown_format_lists_the_choices_and_a_misspelt_one_names_the_closest():
    with pytest.raises(ConfigError) as unknown:
        load_data_config(str(REPO / "config" / "demo.yaml"), ["--configs.webster.format.type", "denoise"])
    assert "'denoise'" in str(unknown.value)
    assert str(unknown.value).endswith("(the choices are chat, fim, prebuilt, preference_chat, supervised, text, ul2r)")
    with pytest.raises(ConfigError, match=r"\(did you mean: chta -> chat\?\)$"):
        load_data_config(str(REPO / "config" / "demo.yaml"), ["--configs.webster.format.type", "chta"])


@pytest.mark.parametrize("field, value, message", [
    ("stop_strategy", "bogus", "stop_strategy: expected one of ('restart', 'first_exhausted', 'all_exhausted'), got 'bogus'"),
    ("mixture_block_size", "abc", "`mixture_block_size`: Couldn't parse 'abc' into an int"),
])
def test_config_errors_show_the_message_that_names_the_field(tmp_path, field, value, message):
    """draccus wraps a config's own error in "Couldn't instantiate class ..."; the user must still see what to fix."""
    doc = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    doc[field] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_data_config(str(path))
    assert message in str(info.value) and str(path) in str(info.value)


def test_levanter_mixture_yaml_parses_with_formats(tmp_path):
    doc = {
        "configs": {
            "owt": {"train_urls": ["gs://bucket/owt/train.{1..3}-of-3.jsonl.gz"], "validation_urls": ["gs://bucket/owt/val.jsonl.gz"]},
            "code": {"train_urls": ["s3://b/code-{00..01}.parquet"], "format": {"type": "text", "text_key": "content"},
                     "tags": ["code"], "cache_dir": "gs://elsewhere/code"},
            "wiki": {"id": "dlwh/wikitext_103_detokenized", "stream": False},
        },
        "tokenizer": "gpt2",
        "cache_dir": "gs://levanter-data/tokenized/mix",
        "enforce_eos": True,
    }
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump({"data": doc, "model": {"type": "gpt2"}, "trainer": {"num_train_steps": 10}}))
    config = load_data_config(str(path))
    assert isinstance(config, LMMixtureDatasetConfig)
    assert config.configs["code"].format == TextLmDatasetFormat(text_key="content")
    assert config.configs["owt"].format == TextLmDatasetFormat()
    assert [s.name for s in config.configs["owt"].shards("train")] == [f"gs://bucket/owt/train.{i}-of-3.jsonl.gz" for i in (1, 2, 3)]
    assert config.cache_location("owt", "train") == "gs://levanter-data/tokenized/mix/owt/train"
    assert config.cache_location("code", "validation") == "gs://elsewhere/code/validation"
    assert config.configs["wiki"].id == "dlwh/wikitext_103_detokenized" and not config.configs["wiki"].stream


def test_single_dataset_yaml_and_overrides(tmp_path):
    config = load_data_config(str(REPO / "config" / "levanter_style_single.yaml"), ["--cache_dir", str(tmp_path), "--enforce_eos", "false"])
    assert isinstance(config, LMDatasetConfig)
    assert not config.enforce_eos
    targets = {(t.split, t.location) for t in cache_targets(config)}
    assert targets == {("train", f"{tmp_path}/train"), ("validation", f"{tmp_path}/validation")}


def test_bad_configs_name_the_problem(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("configs:\n  a:\n    train_urls: [x.jsonl]\n    no_such_field: 1\n")
    with pytest.raises(ConfigError, match="no_such_field"):
        load_data_config(str(path))
    path.write_text(yaml.safe_dump({"configs": {"a": {"train_urls": [str(DEMO_CORPUS / "webster" / "validation.jsonl.zst")]}}}))
    with pytest.raises(ValueError, match="tokenizer"):
        cache_targets(load_data_config(str(path)))
    path.write_text(yaml.safe_dump({"tokenizer": str(tmp_path / "nope"), "configs": {"a": {"train_urls": ["x.jsonl"]}}}))
    with pytest.raises(ValueError, match="could not be loaded"):
        cache_targets(load_data_config(str(path)))
    with pytest.raises(ValueError, match="either `id`"):
        LMDatasetSourceConfig(id="x", train_urls=["y"])


def test_a_config_reads_with_libyaml_as_with_draccus_loader_includes_and_merges_too(tmp_path):
    """``read_yaml`` parses with libyaml (a thousand sources: 23 ms instead of 170) and resolves ``!include`` (relative to
    the including file, also as a merged mapping) exactly as draccus' pure-Python loader."""
    from draccus.parsers.yaml_loader import SafeLoaderWithInclusion

    from tokenmix.config.loading import read_yaml

    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "sources.yaml").write_text("web: {train_urls: [a.jsonl]}\ncode: {train_urls: [b.jsonl, c.jsonl]}\n")
    (tmp_path / "parts" / "build.yaml").write_text("num_workers: 2\non_error: skip\n")
    main = tmp_path / "main.yaml"
    main.write_text("tokenizer: t\nconfigs: !include parts/sources.yaml\nbuild:\n  <<: !include parts/build.yaml\n  chunk_bytes: 1024\n"
                    "train_weights: {web: 0.5, code: 1e-1}\nshuffle: true\nseed: 0x10\n")
    with open(main) as f:
        expected = yaml.load(f, Loader=SafeLoaderWithInclusion)
    assert read_yaml(str(main)) == expected
    assert expected["build"] == {"num_workers": 2, "on_error": "skip", "chunk_bytes": 1024}


_YAML_FEATURES = {
    "anchors_and_merges": "a: &x {p: 1, q: [1, 2]}\nb: *x\nc: {<<: *x, q: 3}\nd: {<<: [*x, {r: 4}], p: 0}\ne: {q: 0, <<: *x}\n",
    "scalars": "a: 1e3\nb: .inf\nc: 0x10\nd: 010\ne: yes\nf: on\ng: 1_000\nh: 1:30\ni: -.inf\nj: .nan\nk: 0b101\nl: ~\n"
               "m: 0o17\nn: 'yes'\no: No\np: OFF\nq: y\nr: 1e3.0\ns: 12.\n",
    "timestamps": "d: 2026-11-27\nt: 2026-11-27T08:30:00Z\nu: 2026-11-27 08:30:00.123+02:00\n",
    "non_string_keys": "1: a\n2.5: b\ntrue: c\nnull: d\n2026-01-01: e\n[1, 2]: f\n? {x: 1}\n: g\n",
    "empty": "",
    "comment_only": "# nothing\n",
    "empty_document": "---\n...\n",
    "unicode": "name: \"caf\\u00e9 \\U0001F600\"\nraw: café 😀 中文\n'ключ': значение\n",
    "duplicate_keys": "a: 1\na: 2\nb: {x: 1, x: 2}\n",
    "tags": "a: !!str 123\nb: !!int '42'\nc: !!float '1'\nd: !!binary aGVsbG8=\ne: !!set {x, y}\nf: !!omap [{a: 1}, {b: 2}]\n",
    "block_scalars": "a: |\n  line1\n  line2\nb: >-\n  folded\n  text\n\nc: |+\n  keep\n\n",
    "line_ends": "a: 1\r\nb: 'x\r\n  y'\r\n",
    "multi_document": "a: 1\n---\nb: 2\n",
    "python_tag": "a: !!python/tuple [1, 2]\n",
    "unknown_alias": "a: *nope\n",
    "included": "a: !include parts/x.yaml\nb: &i !include parts/x.yaml\nc: {<<: *i, k: 1}\nd:\n  <<: !include parts/dates.yaml\n",
}


def _typed(value):
    """``value`` with each scalar's type beside it (``True == 1`` and ``nan != nan`` would hide a difference)."""
    if isinstance(value, dict):
        return [(_typed(k), _typed(v)) for k, v in value.items()]
    if isinstance(value, (list, tuple, set)):
        return (type(value).__name__, [_typed(v) for v in (sorted(value, key=repr) if isinstance(value, set) else value)])
    return type(value).__name__, repr(value)


@pytest.mark.parametrize("feature", sorted(_YAML_FEATURES))
def test_every_yaml_feature_reads_as_draccus_reads_it(tmp_path, feature):
    """Anchors, aliases and merges, YAML 1.1's scalars (``010``, ``yes``, ``1:30``, ``.inf``), timestamps, keys that are not
    strings, empty documents, unicode, duplicate keys, tags and includes read with libyaml's parser as draccus' safe loader
    with includes (``SafeLoaderWithInclusion``, what tokenmix read configs with before) reads them, types included; what
    it refuses (several documents, a Python tag, an unknown alias) is refused, naming the file."""
    from draccus.parsers.yaml_loader import SafeLoaderWithInclusion

    from tokenmix.config.loading import ConfigError, read_yaml

    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "x.yaml").write_text("p: !include y.yaml\nq: [1, yes]\n")
    (tmp_path / "parts" / "y.yaml").write_text("010\n")
    (tmp_path / "parts" / "dates.yaml").write_text("d: 2026-01-01\n1: x\n'2': .inf\nl: [1, {a: ~}]\n")
    path = tmp_path / "config.yaml"
    path.write_bytes(_YAML_FEATURES[feature].encode("utf-8"))
    try:
        with open(path) as f:
            expected = yaml.load(f, Loader=SafeLoaderWithInclusion) or {}
    except yaml.YAMLError:
        with pytest.raises(ConfigError, match="is not valid YAML"):
            read_yaml(str(path))
        return
    assert _typed(read_yaml(str(path))) == _typed(expected)


def test_a_config_file_that_is_a_directory_not_text_or_not_yaml_is_refused_in_one_line_naming_it(tmp_path):
    """Every command reads its config through ``read_yaml``: what is wrong with the file itself is one line naming the
    file (and, for bad YAML, the line and column), a ``ConfigError``, never a decoder's message that names no file."""
    (tmp_path / "parts").mkdir()
    binary = tmp_path / "tokens.bin"
    binary.write_bytes(bytes(range(256)))
    broken = tmp_path / "parts" / "broken.yaml"
    broken.write_text("train_urls: [a.jsonl\nshuffle: true\n")
    including = tmp_path / "main.yaml"
    including.write_text("tokenizer: t\nconfigs: !include parts/broken.yaml\n")
    cases = [
        (tmp_path / "parts", f"config file {tmp_path / 'parts'} is a directory, not a YAML file"),
        (binary, f"{binary} is not a text file (byte 0x80 at offset 128 is not UTF-8); give the YAML data config"),
        (broken, f"{broken} is not valid YAML: line 2, column 8: did not find expected ',' or ']' (while parsing a flow "
                 "sequence from line 1, column 13)"),
        (including, f"{including} is not valid YAML: in {broken}, line 2, column 8: did not find expected ',' or ']' "
                    "(while parsing a flow sequence from line 1, column 13)"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError) as info:
            load_data_config(str(path))
        assert str(info.value) == message
        result = _cli("build-cache", "--config_path", str(path))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.strip().endswith(message), result.stderr


@pytest.mark.parametrize("text, field", [
    ("configs:\ntrain_weights: {a: 1}\n", "`configs`"),
    ("configs:\n  a:\n  b: {train_urls: [b.jsonl]}\n", "`configs`"),
    ("configs: {a: {train_urls: a.jsonl}}\n", "`configs.a.train_urls`"),
    ("configs: {a: {train_urls: [a.jsonl]}}\nbatch_size: 8\ntrain_weights: [[0, {a: 1}], [1e2, {a: 2}]]\n", "`train_weights`"),
])
def test_a_value_draccus_cannot_decode_is_one_line_naming_the_field(tmp_path, text, field):
    """draccus spreads some messages (a union none of whose types fits, a value of the wrong shape) over several lines;
    a command's error is one line."""
    path = tmp_path / "c.yaml"
    path.write_text("tokenizer: t\n" + text)
    with pytest.raises(ConfigError) as info:
        load_data_config(str(path))
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{path} does not parse as LMMixtureDatasetConfig: {field}")
    result = _cli("build-cache", "--config_path", str(path))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_training_configs_overrides_name_its_sections_as_draccus_and_tokenmix_train_do(tmp_path):
    """A Levanter training config is overridden section by section (``--data.cache_dir``, ``--trainer.train_batch_size``),
    as draccus reads it and as ``tokenmix train`` takes it; every command reading its data section takes the same
    overrides, and ``--cache_dir`` alone still means the data section's. A bad value names the file and the section."""
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({
        "data": {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "c"), "batch_size": None,
                 "configs": {"web": {"train_urls": ["a.jsonl"]}, "code": {"train_urls": ["b.jsonl"]}},
                 "train_weights": [[0, {"web": 1.0}], [10, {"web": 1.0, "code": 1.0}]]},
        "trainer": {"train_batch_size": 4, "num_train_steps": 20}, "model": {"type": "gpt2"},
    }).replace("  batch_size: null\n", ""))
    config = load_data_config(str(path), ["--data.cache_dir", str(tmp_path / "d"), "--trainer.train_batch_size", "16",
                                          "--data.train_weights", "[[0, {web: 1}], [20, {code: 1}]]", "--seed", "3"])
    assert config.cache_dir == str(tmp_path / "d") and config.seed == 3
    assert config.weight_schedule() == [(0, {"web": 1.0}), (320, {"code": 1.0})]
    assert load_data_config(str(path), ["--cache_dir", "/x"]).cache_dir == "/x"
    with pytest.raises(ConfigError) as info:
        load_data_config(str(path), ["--data.seed", "x"])
    assert str(info.value).startswith(f"{path}'s data section does not parse as LMMixtureDatasetConfig: `seed`: Couldn't parse 'x'")
    with pytest.raises(ConfigError, match=r"an override replaced the data section with 'x'; override its fields \(--data.cache_dir DIR\)"):
        load_data_config(str(path), ["--data", "x"])
    plot = _cli("plot", "--config_path", str(path), "--data.mixture_block_size", "64", "--trainer.train_batch_size", "2",
                "--out", str(tmp_path / "s.png"))
    assert plot.returncode == 0, plot.stderr
    from tokenmix.train.config import load_train_config

    with pytest.raises(ConfigError) as info:
        load_train_config(str(REPO / "config" / "train_demo.yaml"), ["--data.seed", "x"])
    assert str(info.value).startswith(f"{REPO / 'config' / 'train_demo.yaml'}'s data section does not parse as LMMixtureDatasetConfig: `seed`")


def test_a_mixture_without_a_cache_dir_needs_one_on_every_source_as_in_levanter(tmp_path):
    """Levanter's mixture ``cache_dir`` may be null when every source (component) keeps its caches in its own; a source
    left without one is refused at load, naming it (a build failed with a traceback)."""
    doc = {"tokenizer": TOKENIZER, "cache_dir": None,
           "configs": {"web": {"train_urls": ["a.jsonl"], "cache_dir": str(tmp_path / "web")},
                       "code": {"train_urls": ["b.jsonl"], "cache_dir": "s3://bucket/code/"}}}
    config = load_data_config(doc)
    assert config.cache_location("web", "train") == f"{tmp_path}/web/train"
    assert config.cache_location("code", "validation") == "s3://bucket/code/validation"
    del doc["configs"]["web"]["cache_dir"]
    message = "cache_dir is null, so every source needs a cache_dir of its own, and ['web'] have none: set the mixture's cache_dir"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_data_config(doc)
    result = _cli("build-cache", "--config_path", str(REPO / "config" / "demo.yaml"), "--cache_dir", "null")
    assert result.returncode == 1 and "['linux_doc', 'python_doc', 'webster'] have none" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("size", ["0", "-64"])
def test_a_mixture_block_size_below_one_is_refused_when_the_config_loads(tmp_path, size):
    """Before anything is built or drawn: ``tokenmix plot`` drew a schedule of blocks of 0 examples, and ``tokenmix train``
    built every cache before the mixture refused it."""
    message = f"mixture_block_size must be at least 1 (examples per block), got {size}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_data_config(str(REPO / "config" / "demo.yaml"), ["--mixture_block_size", size])
    result = _cli("plot", "--config_path", "config/demo.yaml", "--mixture_block_size", size, "--out", str(tmp_path / "s.png"))
    assert result.returncode == 1 and message in result.stderr and not (tmp_path / "s.png").exists()


@pytest.mark.parametrize("text, message", [
    ("", "{path} holds no config fields: a data config gives `configs:` (a mixture) or `train_urls:`/`id:` (one dataset)"),
    ("# a comment\n---\n", "{path} holds no config fields: a data config gives `configs:` (a mixture)"),
    ("data: {}\ntrainer: {train_batch_size: 8}\n", "{path}'s data section holds no config fields"),
    (f"tokenizer: {TOKENIZER}\nconfigs: {{}}\n", "a mixture needs at least one source in `configs` (or `components`), as in Levanter"),
    (f"tokenizer: {TOKENIZER}\ncomponents: {{}}\n", "a mixture needs at least one source in `configs` (or `components`)"),
])
def test_a_config_that_defines_no_data_is_refused_rather_than_building_nothing(tmp_path, text, message):
    """An empty file (a wrong path, a failed write) or an empty mixture built nothing and exited 0 with an empty table;
    as in Levanter, a mixture needs a source."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message.format(path=path))):
        load_data_config(str(path))
    result = _cli("build-cache", "--config_path", str(path), "--cache_dir", str(tmp_path / "cache"))
    assert result.returncode == 1 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    if not text:  # overrides may give every field, as draccus reads an empty file with them
        assert load_data_config(str(path), ["--tokenizer", TOKENIZER, "--train_urls", "[a.jsonl]"]).train_urls == ["a.jsonl"]


def test_overrides_merge_into_the_documents_mappings_as_draccus_merges_them(tmp_path):
    """draccus merges an override's mapping into the file's (``--train_weights '{web: 1}'`` keeps code's weight; replacing
    the mapping made code evaluation-only) and reads an empty value as an empty string; an override of a source that
    shares a YAML anchor with another changes that source alone."""
    path = tmp_path / "c.yaml"
    path.write_text(f"tokenizer: {TOKENIZER}\ncache_dir: {tmp_path}\ntrain_weights: {{web: 0.5, code: 0.25}}\n"
                    "configs:\n  web: &s {train_urls: [a.jsonl], format: {type: text, text_key: body}}\n  code: *s\n")
    config = load_data_config(str(path), ["--train_weights", "{web: 1}", "--configs.code.train_urls", "[b.jsonl]",
                                          "--configs", "{web: {format: {text_key: content}}}"])
    assert config.train_weights == {"web": 1.0, "code": 0.25}
    assert config.configs["web"].train_urls == ["a.jsonl"] and config.configs["code"].train_urls == ["b.jsonl"]
    assert config.configs["web"].format == TextLmDatasetFormat(text_key="content")
    assert config.configs["code"].format == TextLmDatasetFormat(text_key="body")
    assert load_data_config(str(path), ["--tokenizer="]).tokenizer == ""


def test_a_key_given_twice_is_read_as_draccus_reads_it_and_named_in_a_warning(tmp_path, caplog):
    """YAML keeps the last of two equal keys silently, as draccus and Levanter read them: a source given twice is one source,
    and a field set twice takes the second value. The value stays draccus's; the log names the file and line."""
    path = tmp_path / "c.yaml"
    path.write_text(f"tokenizer: {TOKENIZER}\nconfigs:\n  web: {{train_urls: [a.jsonl]}}\n  code: {{train_urls: [b.jsonl]}}\n"
                    "  web: {train_urls: [c.jsonl]}\nseed: 1\nbuild: {<<: {num_workers: 2}, num_workers: 3}\nseed: 2\n")
    with caplog.at_level(logging.WARNING, logger="tokenmix"):
        config = load_data_config(str(path))
    assert list(config.configs) == ["web", "code"] and config.configs["web"].train_urls == ["c.jsonl"] and config.seed == 2
    assert config.build.num_workers == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(warnings) == [f"{path}, line 5: 'web' is given twice in one mapping; the last is used, as draccus and Levanter read "
                        "it: remove the other",
                        f"{path}, line 8: 'seed' is given twice in one mapping; the last is used, as draccus and Levanter read "
                        "it: remove the other"]


@pytest.mark.parametrize("cache_dir, single", [("", False), ("", True), (None, True)])  # a mixture's null: the test above
def test_an_empty_cache_dir_is_refused_rather_than_read_as_the_filesystem_root_or_the_working_directory(tmp_path, single, cache_dir):
    """A mixture's empty ``cache_dir`` put its caches at ``/<source>/<split>``, a single dataset's (empty or null: Levanter
    refuses null) at ``./cache``. ``--cache_dir=`` gives the empty string, as draccus reads it."""
    source = {"train_urls": ["a.jsonl"]}
    doc = {"tokenizer": TOKENIZER, **(source if single else {"configs": {"web": source}}), "cache_dir": cache_dir}
    with pytest.raises(ConfigError, match="cache_dir is empty" if cache_dir == "" else "cache_dir is null"):
        load_data_config(doc)
    with pytest.raises(ConfigError, match="cache_dir is empty"):
        load_data_config({**doc, "cache_dir": str(tmp_path)}, ["--cache_dir="])


def test_export_takes_a_configs_overrides_as_every_command_reading_a_config_does(tmp_path):
    """``--cache_dir`` after ``--config_path`` is an override, as for build-cache, plot and verify (export refused it as an
    unknown argument); with ``--cache`` there is no config to override."""
    built = _cli("build-cache", "--config_path", "config/demo.yaml", "--cache_dir", str(tmp_path / "caches"), "--source", "webster")
    assert built.returncode == 0, built.stderr
    exported = _cli("export", "--to", "megatron", "--output", str(tmp_path / "web"), "--config_path", "config/demo.yaml",
                    "--source", "webster", "--cache_dir", str(tmp_path / "caches"))
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "web.bin").stat().st_size > 0 and (tmp_path / "web.idx").exists()
    stray = _cli("export", "--to", "megatron", "--output", str(tmp_path / "x"), "--cache", str(tmp_path / "caches" / "webster" / "train"),
                 "--cache_dir", "/x")
    assert stray.returncode == 2 and "--cache_dir /x (config overrides need --config_path)" in stray.stderr


CTRL_C_TO_A_WORKER = """
import os, signal, sys, time
from concurrent.futures.process import BrokenProcessPool
from tokenmix.execution import worker_process_pool

if __name__ == "__main__":
    pool = worker_process_pool(1)
    pid = pool.submit(os.getpid).result()  # the worker has started and run a task
    running = pool.submit(time.sleep, 120)
    os.kill(pid, signal.SIGINT)
    try:
        running.result(timeout=120)
    except BrokenProcessPool:
        print("worker ended")
    # joined before exit: CPython 3.11's exit hook could otherwise wake the broken pool's manager thread through the pipe
    # that thread was closing ("Exception ignored ... Bad file descriptor", a race of its own, not the worker's words)
    pool.shutdown(wait=True)
"""


def test_ctrl_c_ends_a_worker_process_without_a_traceback_of_its_own(tmp_path):
    """Ctrl-C reaches every process of the command's group: a worker of the pool (curation, a tokenizers build) ended
    by it printed its own KeyboardInterrupt traceback beside the driver's one line (seen in one of about 12 interrupted
    curate runs); it ends as the signal ends a process, silently."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_TO_A_WORKER)
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "worker ended", (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr


def test_ctrl_c_during_curate_is_one_line_and_exit_130_and_the_same_command_resumes(tmp_path):
    """SIGINT to the command's process group (what Ctrl-C sends) once a task has finished: no traceback, one line saying
    to run it again, the shell's 128 + SIGINT; the run again keeps the finished task (its record not written again) and completes."""
    out = tmp_path / "out"
    args = [sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", "config/curation/demo.yaml", "--output.path", str(out)]
    # as a shell's foreground command gets it: pytest-xdist's workers ignore SIGINT, which a child inherits, and Python
    # leaves a signal ignored at its start ignored
    interruptible = [sys.executable, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                     "sys.argv = ['tokenmix', *sys.argv[1:]]; runpy.run_module('tokenmix.cli.main', run_name='__main__')", *args[3:]]
    with open(tmp_path / "stderr", "w+") as log:
        proc = subprocess.Popen(interruptible, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 120
        while proc.poll() is None and not finished_tasks(out, ["pass-0/stats"]) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, "the run ended before a task finished: nothing to interrupt"
        kept = {p: p.stat().st_mtime_ns for p in finished_tasks(out, ["pass-0/stats"])}
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        log.seek(0)
        lines = [line for line in log.read().splitlines() if " ERROR " in line or "Traceback" in line or "Error" in line]
    assert len(lines) == 1 and "interrupted (Ctrl-C): run the same command again" in lines[0], lines
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert all(p.stat().st_mtime_ns == written for p, written in kept.items()), "a finished task was done again"
    assert json.loads(next(out.glob(".curate/*/curation_stats.json")).read_text())["accounted"]


def test_output_into_a_pipe_whose_reader_has_gone_ends_quietly_with_exit_1(tmp_path):
    """``tokenmix ... | head`` once head has exited: no BrokenPipeError traceback nor an error line, exit 1 (as Python
    advises and as rich does for the tables); the reader is closed before the command writes, so the pipe is surely gone."""
    location = str(tmp_path / "cache")
    build(location, demo_urls("webster")[:1])
    for args in (["--help"], ["inspect", location, "--json"], ["verify", location, "--json", "--no_inputs"]):
        read, write = os.pipe()
        os.close(read)
        try:
            result = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", *args], cwd=REPO, stdout=write, stderr=subprocess.PIPE,
                                    text=True)
        finally:
            os.close(write)
        assert result.returncode == 1, (args, result.stderr)
        assert "Broken pipe" not in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)


def test_plot_says_the_file_it_wrote_where_out_has_no_extension_and_makes_its_missing_directory(tmp_path):
    """matplotlib adds ``.png`` to a name without an extension: plot said it wrote the name as given, a file that is not
    there; a directory of ``--out`` that does not exist yet was a bare "No such file or directory"."""
    result = _cli("plot", "--config_path", "config/demo.yaml", "--steps", "10", "--out", str(tmp_path / "new" / "schedule"))
    assert result.returncode == 0, result.stderr
    written = tmp_path / "new" / "schedule.png"
    assert result.stdout.strip() == f"wrote {written}"
    assert written.read_bytes().startswith(b"\x89PNG")


def test_build_cache_of_small_sources_built_as_packs_prints_its_table(tmp_path):
    """A source built in a pack has the pack's seconds and no rate of its own: the table read its tokens/s and the
    command failed with a KeyError after the caches were built."""
    result = _cli("build-cache", "--config_path", "config/demo.yaml", "--cache_dir", str(tmp_path), "--build.pack_min_sources", "2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "webster" / "train" / "packed.json").exists()
    rows = [line.replace(" ", "") for line in result.stdout.splitlines() if line.startswith(("│ linux_doc", "│ python_doc", "│ webster"))]
    assert len(rows) == 6 and all(row.endswith("│packed│") for row in rows), result.stdout
    assert "packed: built in one pack with other small sources; its seconds are the pack's" in result.stdout


def test_inspect_decodes_a_levanter_cache_with_the_tokenizer_its_ledger_names(tmp_path):
    """Levanter's ledger names its tokenizer in its metadata; inspect looked only where a tokenmix ledger keeps it, and
    showed a Levanter cache's documents as token ids."""
    location = str(tmp_path / "cache")
    build(location, demo_urls("webster")[:1], tokenization={"enforce_bos": True})
    levanter = str(tmp_path / "levanter" / "train")
    exported = _cli("export", "--to", "levanter", "--output", levanter, "--cache", location)
    assert exported.returncode == 0, exported.stderr

    def first_document(cache: str) -> str:
        shown = _cli("inspect", cache, "--samples", "1", "--chars", "200")
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.split("document 0 (", 1)[1].split("\n", 1)[1]

    assert first_document(levanter) == first_document(location) and not first_document(location).startswith("[")


@pytest.mark.parametrize("to", ["megatron", "nanoset", "hdf5"])
def test_export_to_a_path_below_a_file_names_the_file_and_the_fix(tmp_path, to):
    """A file where the output needs a directory gave "[Errno 17] File exists: FILE" or "[Errno 20] Not a directory",
    naming a partial file or the file in the way but saying neither what is wrong nor what to do."""
    location = str(tmp_path / "cache")
    build(location, demo_urls("webster")[:1])
    (tmp_path / "taken").write_text("a file")
    output = tmp_path / "taken" / "out" / "x"
    result = _cli("export", "--to", to, "--output", str(output), "--cache", location)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"cannot write the {to} export at {output}: {tmp_path / 'taken'} is a file, where a directory is needed; choose an "
        "--output this user can write to"), result.stderr


@pytest.mark.parametrize("command", [["build-cache"], ["verify"], ["plot"], ["train"], ["demo"],
                                     ["export", "--to", "megatron", "--output", "out/x", "--source", "web"]])
def test_a_missing_config_exits_1_from_every_command_that_reads_one(command):
    """An error a user can hit exits 1 from every command (2 is argparse's, for a usage error); verify gave 2."""
    result = _cli(*command, "--config_path", "config/nope.yaml")
    assert result.returncode == 1 and "config/nope.yaml" in result.stderr and "Traceback" not in result.stderr, result.stderr
