"""Levanter's YAMLs load unchanged: ``!include`` resolved relative to the including file, as draccus does (issue 16).

``tests/data/levanter/`` holds configs from Levanter's own ``config/`` tree, unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, TOKENIZER, demo_urls

import tokenmix

LEVANTER = Path(__file__).parent / "data" / "levanter"


def test_a_levanter_training_config_whose_data_is_an_include_loads():
    config = tokenmix.load_data_config(LEVANTER / "gpt2_small_fast_pile.yaml")
    assert isinstance(config, tokenmix.LMDatasetConfig)
    assert config.tokenizer == "EleutherAI/gpt-neox-20b"
    assert config.cache_location("default", "train") == "gs://levanter-data/tokenized/pile-old/train"
    assert [s.name for s in config.shards("train")] == [f"gs://levanter-data/pile/train/{i:02d}.jsonl.zst" for i in range(30)]
    assert [s.name for s in config.shards("validation")] == ["gs://levanter-data/pile/val.jsonl.zst"]


def test_includes_nest_and_merge_each_relative_to_the_file_that_names_it(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "data" / "common").mkdir(parents=True)
    (tmp_path / "runs" / "train.yaml").write_text("data: !include ../data/mixture.yaml\ntrainer: {train_batch_size: 8}\n")
    (tmp_path / "data" / "mixture.yaml").write_text(
        "<<: !include common/tokenizer.yaml\n"
        "configs:\n"
        "  web: !include common/web.yaml\n"
        "train_weights: {web: 1.0}\n"
    )
    (tmp_path / "data" / "common" / "tokenizer.yaml").write_text(f"tokenizer: {TOKENIZER}\ncache_dir: {tmp_path / 'cache'}\n")
    (tmp_path / "data" / "common" / "web.yaml").write_text(json.dumps({"train_urls": demo_urls("webster")}))
    config = tokenmix.load_data_config(tmp_path / "runs" / "train.yaml", ["--configs.web.cache_dir", str(tmp_path / "elsewhere")])
    assert isinstance(config, tokenmix.LMMixtureDatasetConfig)
    assert config.tokenizer == TOKENIZER and config.cache_dir == str(tmp_path / "cache")
    assert config.configs["web"].train_urls == demo_urls("webster")
    assert config.cache_location("web", "train") == f"{tmp_path / 'elsewhere'}/train"


def test_a_missing_include_names_itself_and_the_including_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("data: !include data/nope.yaml\n")
    with pytest.raises(tokenmix.ConfigError) as info:
        tokenmix.load_data_config(path)
    assert str(info.value) == (f"{path}: an !include names {tmp_path / 'data' / 'nope.yaml'}, which does not exist (an included "
                               "path is taken relative to the file that includes it)")
    with pytest.raises(tokenmix.ConfigError, match=f"config file {tmp_path / 'absent.yaml'} does not exist"):
        tokenmix.load_data_config(tmp_path / "absent.yaml")


@pytest.mark.timeout(180)
def test_the_cli_builds_from_a_config_with_an_include(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "web.yaml").write_text(json.dumps({"train_urls": demo_urls("webster")[:1], "tokenizer": TOKENIZER,
                                                            "cache_dir": str(tmp_path / "cache")}))
    (tmp_path / "train.yaml").write_text("data: !include data/web.yaml\nmodel: {type: gpt2}\n")
    result = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", str(tmp_path / "train.yaml"),
                             "--build.num_workers", "0"], cwd=REPO, capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr[-3000:]
    assert tokenmix.TokenCache(str(tmp_path / "cache" / "train")).is_finished()
