"""Levanter's YAMLs load with Levanter's meaning (issue 16): ``!include`` resolved relative to the including file, as
draccus does, and the fields of Levanter's data configs that tokenmix did not know.

``tests/data/levanter/`` holds configs from Levanter's own ``config/`` tree, unchanged (its README says which)."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import DEMO_CORPUS, REPO, TOKENIZER, demo_urls, read_jsonl_zst

import tokenmix
from tokenmix.config import cache_targets
from tokenmix.config.levanter import CacheOptions

LEVANTER = Path(__file__).parent / "data" / "levanter"


def test_every_levanter_config_kept_here_loads():
    paths = sorted(p for p in LEVANTER.rglob("*.yaml") if "wild" not in p.parts)  # wild/: test_levanter_wild_configs.py
    assert len(paths) == 10
    for path in paths:
        tokenmix.load_data_config(path)


def test_a_levanter_training_config_whose_data_is_an_include_loads_the_mixture(caplog):
    with caplog.at_level(logging.INFO, logger="tokenmix.config"):
        config = tokenmix.load_data_config(LEVANTER / "gpt2_small_fast_pile.yaml")
    assert isinstance(config, tokenmix.LMMixtureDatasetConfig)
    assert config.tokenizer == "EleutherAI/gpt-neox-20b" and len(config.configs) == 21
    assert config.cache_location("arxiv", "train") == "gs://levanter-data/tokenized/pile-domains/arxiv/train"
    assert [s.name for s in config.configs["arxiv"].shards("train")] == [
        f"gs://levanter-data/pile-domains/arxiv/{i:02d}.jsonl.zst" for i in range(30)]
    assert config.weight_schedule()[0][1]["pile_cc"] == 0.1811 and config.weight_schedule()[0][1]["enron"] == 0.0014
    assert config.cache_options == CacheOptions(num_shard_groups=16, batch_size=32)
    assert "cache_options CacheOptions(num_shard_groups=16, target_size_per_flush='512MB', batch_size=32) (Levanter's) are not used" \
        in caplog.text


def test_cache_options_and_a_null_vocab_size_change_nothing():
    source = tokenmix.load_data_config(LEVANTER / "data" / "openwebtext_source.yaml")
    assert isinstance(source, tokenmix.LMDatasetConfig) and source.tokenizer == "gpt2"
    assert source.cache_options == CacheOptions(num_shard_groups=64, batch_size=1024)
    assert len(source.shards("train")) == 128 and len(source.shards("validation")) == 8
    dolma = tokenmix.load_data_config(LEVANTER / "data" / "dolma_llama.yaml")
    assert dolma.vocab_size is None and dolma.cache_options is not None
    ours = tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {"web": {"train_urls": demo_urls("webster")}}})
    with_options = dataclasses.replace(ours, cache_options=CacheOptions(), vocab_size=None)
    assert cache_targets(with_options)[0].identity == cache_targets(ours)[0].identity


def test_vocab_size_must_be_the_tokenizers():
    doc = {"tokenizer": TOKENIZER, "configs": {"web": {"train_urls": demo_urls("webster")}}}
    assert cache_targets(tokenmix.load_data_config({**doc, "vocab_size": 32000}))
    with pytest.raises(ValueError, match="vocab_size is 50257, but tokenizer .* has 32000 tokens; remove vocab_size"):
        cache_targets(tokenmix.load_data_config({**doc, "vocab_size": 50257}))


def test_splits_choose_among_a_hugging_face_datasets_splits(tmp_path):
    config = tokenmix.load_data_config(LEVANTER / "data" / "redpajama_1b_source.yaml")
    assert config.id == "togethercomputer/RedPajama-Data-1T-Sample" and config.splits == ["train"]
    local = tmp_path / "hf"
    local.mkdir()
    for split, name in (("train", "train-00-of-02"), ("validation", "validation")):
        records = read_jsonl_zst(DEMO_CORPUS / "webster" / f"{name}.jsonl.zst")[:5]
        (local / f"{split}.jsonl").write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in records))
    assert dataclasses.replace(config, id=str(local)).split_names() == ["train"]
    assert dataclasses.replace(config, id=str(local), splits=None).split_names() == ["train", "validation"]
    with pytest.raises(ValueError, match="splits: chooses the splits of a Hugging Face dataset"):
        tokenmix.LMDatasetSourceConfig(train_urls=["x.jsonl"], splits=["train"])
    with pytest.raises(ValueError, match=r"splits: \['test'\] are not splits tokenmix builds"):
        tokenmix.LMDatasetSourceConfig(id="x", splits=["test"])


def test_staged_weights_take_the_trainers_batch_size_schedule():
    config = tokenmix.load_data_config(LEVANTER / "gpt2_small_fast_batch_schedule.yaml")
    schedule = config.batch_schedule()
    assert schedule == tokenmix.BatchSchedule.of([(0, 64), (64, 128), (256, 64), (1024, 256)])
    assert schedule.offset(1000) == 64 * 64 + 128 * 192 + 64 * 744
    assert config.weight_schedule() == [(0, {"owt": 0.8, "wikitext": 0.2}), (schedule.offset(1000), {"owt": 0.5, "wikitext": 0.5})]
    nano = tokenmix.load_data_config(LEVANTER / "gpt2_nano_mixture.yaml")
    assert nano.batch_size == 32 and nano.weight_schedule()[1][0] == 100 * 32
    assert nano.cache_location("w2", "train") == "wikitext2_cache/train"
    overridden = tokenmix.load_data_config(LEVANTER / "gpt2_nano_mixture.yaml", ["--batch_size", "8"])
    assert overridden.weight_schedule()[1][0] == 800


def test_shuffle_buffer_size_is_read_as_eras_of_that_many_examples(caplog):
    with caplog.at_level(logging.INFO, logger="tokenmix.config"):
        config = tokenmix.load_data_config(LEVANTER / "olmo_7b_repro.yaml")
    assert config.shuffle == 100000 and config.stop_strategy == "restart"
    assert "shuffle_buffer_size 100000 (older Levanter) is read as shuffle: 100000" in caplog.text
    assert config.batch_size == 2048


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


def _budget_config(tmp_path, **fields) -> tokenmix.LMMixtureDatasetConfig:
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"),
           "configs": {s: {"train_urls": demo_urls(s)} for s in ("webster", "python_doc")}, **fields}
    return tokenmix.load_data_config(doc)


def test_simulated_epoching_keeps_a_random_stable_share_of_each_source(tmp_path):
    full = _budget_config(tmp_path)
    tokenmix.build_caches(full, progress=False)
    budgeted = _budget_config(tmp_path, target_budget=400, experiment_budget=100)
    train, whole = budgeted.train_set(256), full.train_set(256)
    for name in ("webster", "python_doc"):
        subset, source = train.source(name).base, whole.source(name).base
        assert len(subset) == int(len(source) * 0.25) > 0
        rows = {tuple(r) for r in source.get_batch(range(len(source))).tokens.tolist()}
        kept = [tuple(r) for r in subset.get_batch(range(len(subset))).tokens.tolist()]
        assert set(kept) <= rows and len(set(kept)) == len(kept)  # distinct examples of the source
        assert kept != [tuple(r) for r in source.get_batch(range(len(subset))).tokens.tolist()]  # a random share, not a prefix
        again = budgeted.train_set(256).source(name).base
        assert again.get_batch(range(len(again))).tokens.tolist() == subset.get_batch(range(len(subset))).tokens.tolist()
    assert train.get_batch(range(64)).tokens.shape == (64, 256)


def test_max_train_batches_keeps_that_many_first_size_batches_of_a_source(tmp_path):
    config = _budget_config(tmp_path, max_train_batches={"webster": 3}, batch_size=[[0, 4], [10, 8]])
    tokenmix.build_caches(config, progress=False)
    train = config.train_set(256)
    assert len(train.source("webster").base) == 12
    assert train.source("python_doc").base.final_len() > 12  # only the sources named are cut
    too_many = _budget_config(tmp_path, max_train_batches={"webster": 10**6}, batch_size=4)
    with pytest.raises(ValueError, match=r"max_train_batches: source 'webster' would keep 4000000 of its \d+ training examples"):
        too_many.train_set(256)


@pytest.mark.parametrize(("fields", "message"), [
    ({"target_budget": 10}, "target_budget and experiment_budget go together"),
    ({"target_budget": 10, "experiment_budget": 20}, "at most target_budget"),
    ({"target_budget": 10, "experiment_budget": 5, "max_train_batches": {"webster": 1}, "batch_size": 2}, "cannot be combined"),
    ({"max_train_batches": {"webster": 1}}, "set `batch_size`"),
    ({"max_train_batches": {"wiki": 1}, "batch_size": 2}, "unknown source 'wiki'"),
])
def test_budget_fields_are_checked_as_levanter_checks_them(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        _budget_config(tmp_path, **fields)


def test_ignore_token_id_takes_no_loss_where_that_id_is_predicted_as_levanter_does(tmp_path):
    plain = _budget_config(tmp_path)
    tokenmix.build_caches(plain, progress=False)
    eos = 0
    ignoring = _budget_config(tmp_path, ignore_token_id=eos)
    levanter_default = _budget_config(tmp_path, ignore_token_id=-100)
    picks = np.arange(200)
    want = plain.train_set(256).get_batch(picks)
    got = ignoring.train_set(256).get_batch(picks)
    assert np.array_equal(got.tokens, want.tokens)
    predicts_eos = np.zeros_like(want.loss_mask)
    predicts_eos[:, :-1] = want.tokens[:, 1:] == eos
    assert predicts_eos.any() and np.array_equal(got.loss_mask, want.loss_mask & ~predicts_eos)
    assert np.array_equal(levanter_default.train_set(256).get_batch(picks).loss_mask, want.loss_mask)
    validation = ignoring.validation_sets(256)
    assert validation == {} or all(isinstance(ds, tokenmix.Dataset) for ds in validation.values())


def test_permutation_type_takes_levanters_names(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tokenmix.config.mixture"):
        assert _budget_config(tmp_path, permutation_type="linear").permutation_type == "linear"
    assert any("keyed Feistel permutation" in r.getMessage() for r in caplog.records)
    assert _budget_config(tmp_path, permutation_type="feistel").permutation_type == "feistel"
    with pytest.raises(ValueError, match="permutation_type"):
        _budget_config(tmp_path, permutation_type="random")


def test_single_turn_chat_is_the_first_exchange_as_a_supervised_prompt_and_completion(tmp_path):
    conversations = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"question {i}?"},
                      {"role": "assistant", "content": f"answer {i}."}, {"role": "user", "content": "and then?"},
                      {"role": "assistant", "content": "nothing more"}] for i in range(20)]
    conversations.append([{"role": "user", "content": "no answer"}])
    chat_url = tmp_path / "chat.jsonl"
    chat_url.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
    pairs_url = tmp_path / "pairs.jsonl"
    pairs_url.write_text("".join(json.dumps({"prompt": f"question {i}?", "response": f"answer {i}."}) + "\n" for i in range(20)))
    config = tokenmix.load_data_config({
        "tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "build": {"on_error": "skip", "num_workers": 0},
        "configs": {"chat": {"train_urls": [str(chat_url)], "format": {"type": "chat", "single_turn": True}},
                    "pairs": {"train_urls": [str(pairs_url)], "format": {"type": "supervised"}}}})
    stats = tokenmix.build_caches(config, progress=False)
    assert stats[("chat", "train")]["skipped_by_reason"] == {"missing_field": 1}
    chat, pairs = (tokenmix.open_cache(config, name) for name in ("chat", "pairs"))
    assert [r.tolist() for r in chat.get_rows(range(20))] == [r.tolist() for r in pairs.get_rows(range(20))]
    assert chat.loss_spans(0, 20)[1].tolist() == pairs.loss_spans(0, 20)[1].tolist()
    templated = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "other"), "configs": {"c": {
        "train_urls": [str(chat_url)], "format": {"type": "chat", "single_turn": True, "chat_template": "{{ messages }}"}}}})
    with pytest.raises(ValueError, match="source 'c': format chat: single_turn takes no chat_template"):
        tokenmix.build_caches(templated, progress=False)


def test_newer_levanter_top_level_fields_load_with_their_meaning(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tokenmix.config.mixture"):
        config = _budget_config(tmp_path, train_weights=None, auto_build_caches=False, block_cross_document_attention=True)
    assert config.train_weights == {} and config.weight_schedule() == [(0, {"webster": 1.0, "python_doc": 1.0})]  # equal weights
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "auto_build_caches: False is accepted" in said and "block_cross_document_attention: True is accepted" in said


@pytest.mark.parametrize("shuffle", [True, False])
def test_shuffle_before_trainval_split_chooses_random_or_final_documents(tmp_path, shuffle):
    config = _budget_config(tmp_path, num_validation_sequences={"webster": 4}, shuffle_before_trainval_split=shuffle)
    tokenmix.build_caches(config, progress=False)
    cache = tokenmix.open_cache(config, "webster")
    held = config._held_out("webster", cache, 256)
    rows = cache.num_rows()
    tokens = int(np.diff(cache.row_bounds(0, rows))[held].sum())
    assert tokens >= 4 * 256
    final = np.arange(rows - len(held), rows)
    assert np.array_equal(held, final) != shuffle  # unshuffled: the last documents, as Levanter's split keeps its last


def test_simulated_epoch_subset_seed_chooses_the_kept_examples_whatever_the_training_seed(tmp_path):
    tokenmix.build_caches(_budget_config(tmp_path), progress=False)

    def kept(**fields) -> list:
        subset = _budget_config(tmp_path, target_budget=4, experiment_budget=1, **fields).train_set(256).source("webster").base
        return subset.get_batch(range(len(subset))).tokens.tolist()

    assert kept(simulated_epoch_subset_seed=7, seed=1) == kept(simulated_epoch_subset_seed=7, seed=2)
    assert kept(simulated_epoch_subset_seed=7) != kept(simulated_epoch_subset_seed=8)
    assert kept(seed=1) != kept(seed=2)


def test_a_chat_source_mixed_with_text_sources_packs_its_conversations_as_levanter_does():
    config = tokenmix.load_data_config(LEVANTER / "gpt2_small_fast_mix_chat.yaml")
    assert config.batch_size == 256 and config.train_weights == {"owt": 0.6, "wikitext": 0.3, "tulu": 0.1}
    tulu = config.configs["tulu"]
    assert tulu.id == "allenai/tulu-3-sft-mixture" and isinstance(tulu.format, tokenmix.ChatLmDatasetFormat)
    assert tulu.format.messages_field == "messages" and tulu.format.mask_user_turns
    assert tulu.packing_options().max_segments_per_example == 64  # chat packs by default, 64 segments
    assert config.configs["owt"].packing_options() is None and len(config.configs["owt"].shards("train")) == 128


def test_the_supervised_example_of_levanters_guide_reads_its_fields(caplog):
    source = tokenmix.load_data_config(LEVANTER / "supervised_source_from_docs.yaml")
    assert isinstance(source, tokenmix.LMDatasetConfig) and source.cache_location("default", "train") == "gs://bucket/cache/train"
    assert source.format == tokenmix.SupervisedLmDatasetFormat(input_field="prompt", output_field="answer", separate_with="\n")
    assert source.packing_options().max_segments_per_example == 64  # supervised packs by default


def test_the_chat_field_levanters_guide_misnames_is_refused_with_the_right_name():
    doc = {"tokenizer": TOKENIZER, "configs": {"tulu": {"id": "allenai/tulu-3-sft-mixture", "format": {"type": "chat", "messages_key": "messages"}}}}
    with pytest.raises(tokenmix.ConfigError, match="messages_key -> messages_field"):
        tokenmix.load_data_config(doc)
