"""A data config of many sources: decoded without draccus's per-source cost, to the objects and errors draccus gives."""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import subprocess
import sys
import typing

import pytest
from draccus.parsers.decoding import decode_dict
from helpers import REPO

from tokenmix import ConfigError, LMDatasetSourceConfig, load_data_config
from tokenmix.config.loading import explain_error


def draccus_sources(configs: dict) -> dict[str, LMDatasetSourceConfig]:
    """The sources as draccus's own mapping decoder makes them (what ``load_data_config`` made before its fast path)."""
    return decode_dict(str, LMDatasetSourceConfig)(configs, ("configs",))


def test_a_thousand_sources_resolve_the_type_hints_a_few_times_not_per_source():
    configs = {f"s{i:04d}": {"train_urls": [f"/data/s{i:04d}-{{0..3}}.jsonl"]} for i in range(1000)}
    doc = {"tokenizer": "gpt2", "cache_dir": "/caches", "configs": configs,
           "train_weights": {name: 1 + i % 7 for i, name in enumerate(configs)}}
    profile = cProfile.Profile()
    config = profile.runcall(load_data_config, doc)
    hints = sum(calls for (_, _, name), (calls, *_) in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
                if name == typing.get_type_hints.__name__)
    assert hints < 20, f"get_type_hints ran {hints} times for 1000 sources"
    assert config.configs == draccus_sources(configs)
    assert repr(config.configs) == repr(draccus_sources(configs))


def test_plain_and_other_sources_decode_to_what_draccus_makes():
    configs = {
        "urls": {"train_urls": ["/a/{0..3}.jsonl"], "validation_urls": ["/a/v.jsonl"], "cache_dir": "/c/urls", "tags": ["web"]},
        "hf": {"id": "org/set", "name": "en", "stream": False, "splits": ["train"]},
        "listed": {"metadata_files": ["/a/list.txt"], "text_key": "content", "plaintext": True, "rows_per_chunk": 128},
        "nulls": {"train_urls": ["/b.jsonl"], "cache_dir": None, "tags": None, "plaintext": None},
        "tags_converted": {"train_urls": ["/b.jsonl"], "tags": [1, 2.5]},  # draccus makes strings of them
        "stream_converted": {"train_urls": ["/b.jsonl"], "stream": "false"},
        "rows_converted": {"train_urls": ["/b.jsonl"], "rows_per_chunk": True},  # draccus makes 1 of it
        "chat": {"train_urls": ["/c.jsonl"], "format": {"type": "chat", "messages_field": "turns"}},
        "packed": {"train_urls": ["/d.jsonl"], "packing": {"max_segments_per_example": 8}},
        "empty": {},
    }
    config = load_data_config({"tokenizer": "gpt2", "configs": configs})
    reference = draccus_sources(configs)
    assert list(config.configs) == list(reference)
    assert config.configs == reference
    assert repr(config.configs) == repr(reference)  # types too: True is not 1 in a repr
    assert config.configs["urls"].train_urls is not configs["urls"]["train_urls"]


@pytest.mark.parametrize("bad, names", [
    ({"train_urls": "one.jsonl"}, ["configs.s3.train_urls", "list"]),
    ({"trian_urls": ["x.jsonl"]}, ["configs.s3", "trian_urls -> train_urls"]),
    ({"id": "org/set", "train_urls": ["x.jsonl"]}, ["give either `id`", "not both"]),
    ({"train_urls": ["x.jsonl"], "stream": "yes"}, ["configs.s3.stream", "bool"]),
    ({"train_urls": ["x.jsonl"], "plaintext": 1}, ["configs.s3.plaintext", "bool"]),
    ({"train_urls": ["x.jsonl"], "splits": ["train"]}, ["splits:", "`id:`"]),
    ({"train_urls": ["x.jsonl"], "format": {"type": "chatt"}}, ["configs.s3.format", "chatt -> chat"]),
])
def test_a_bad_source_among_plain_ones_gets_draccus_message_naming_the_field_and_fix(bad, names):
    """draccus's message word for word, the source named where draccus names none."""
    configs = {f"s{i}": {"train_urls": [f"/data/{i}.jsonl"]} for i in range(6)}
    configs["s3"] = bad
    with pytest.raises(ConfigError) as raised:
        load_data_config({"tokenizer": "gpt2", "configs": configs})
    with pytest.raises(Exception) as expected:
        draccus_sources(configs)
    wanted = explain_error(expected.value)
    if not wanted.startswith("`"):  # draccus names no field where the class refuses its arguments: the source is named
        wanted = f"`configs.s3`: {wanted}"
    assert str(raised.value) == f"the data config does not parse as LMMixtureDatasetConfig: {wanted}"
    for name in names:
        assert name in str(raised.value)


def test_opening_a_mixture_imports_no_fsspec():
    """fsspec's import scans every installed package's entry points (0.03-0.1 s of a reader's start): a process that
    parses a mixture and opens its training set (sources opened when first drawn) never needs it."""
    configs = {f"s{i}": {"train_urls": [f"/data/{i}.jsonl"]} for i in range(3)}
    code = ("import json, sys, tokenmix; config = tokenmix.load_data_config(json.loads(sys.argv[1])); config.train_set(128); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'fsspec'))")
    run = subprocess.run([sys.executable, "-c", code, json.dumps({"tokenizer": "gpt2", "configs": configs})],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout


@pytest.mark.parametrize("bad, message", [
    ({"id": "org/set", "train_urls": ["x.jsonl"]}, "`configs.s3`: Couldn't instantiate class LMDatasetSourceConfig using the given "
                                                   "arguments: source 'org/set': give either `id` (Hugging Face) or"),
    ({"train_urls": ["x.jsonl"], "splits": ["train"]}, "`configs.s3`: Couldn't instantiate class LMDatasetSourceConfig using the "
                                                       "given arguments: splits: chooses the splits of a Hugging Face dataset"),
    ({"type": "hf", "train_urls": ["x.jsonl"]}, "`configs.s3`: Couldn't instantiate class LMDatasetSourceConfig using the given "
                                                "arguments: source type hf needs `id`"),
])
def test_a_source_its_class_refuses_is_named_among_a_thousand(bad, message):
    """draccus names no field when a class refuses its arguments: among a thousand sources, the message names the one."""
    configs = {f"s{i}": {"train_urls": [f"/data/{i}.jsonl"]} for i in range(1000)}
    configs["s3"] = bad
    with pytest.raises(ConfigError) as raised:
        load_data_config({"tokenizer": "gpt2", "configs": configs})
    assert str(raised.value).startswith(f"the data config does not parse as LMMixtureDatasetConfig: {message}")
