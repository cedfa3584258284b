"""Levanter data configs from public repositories outside Levanter's own tree load with Levanter's meaning (issue 36).

``tests/data/levanter/wild/`` holds them (the data part of a training config, or the whole data file), unchanged;
``SOURCES`` there names each one's repository, path and commit. The table says what each must load as: its shape
(single dataset, ``configs`` mixture, ``components`` mixture), tokenizer, sources, URLs, weights and formats. Before
issue 36, 13 of these 21 loaded on main (16 on this branch before its second half): ``plaintext``, the DPO configs'
``preference_chat`` format and component ``shuffle``, and marin's ``ul2r`` format were refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import DPO_TEMPLATE

import tokenmix
from tokenmix.config.components import LEVANTER_BLOCK_SHUFFLE
from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.formats.ul2r import RXDenoisingTaskConfig, SDenoisingTaskConfig

WILD = Path(__file__).parent / "data" / "levanter" / "wild"


def fmt(config, name="default"):
    """The format name of a source (``default``: a single-dataset config's own)."""
    source = config.sources()[name]
    return LmDatasetFormatBase.get_choice_name(type(source.format))


def shards(config, name, split):
    return [s.name for s in config.sources()[name].shards(split)]


def weights(config):
    return dict(config.train_weights)


MIMIR = "gs://mimir-data-eu/mimir-base/data/"
UL2R_TASKS = {"r": RXDenoisingTaskConfig(50257, 0.15, 3.0, True), "x1": RXDenoisingTaskConfig(50258, 0.15, 32.0, True),
              "x2": RXDenoisingTaskConfig(50258, 0.5, 3.0, True), "s": SDenoisingTaskConfig(50259)}
UL2R_PROBS = {"r": 0.5, "x1": 0.125, "x2": 0.125, "s": 0.25}

MEANING = {
    # single datasets (LMDatasetConfig): URLs with brace ranges, parquet over https, plain-text token files
    "nb_mimir_base_data.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "mimir-project/mimir-mistral-7b-base-scratch"),
        ("train shards", lambda c: len(shards(c, "default", "train")), 6 + 21 + 7),
        ("first train shard", lambda c: shards(c, "default", "train")[0], MIMIR + "train-bad-0001-of-0006.json.gz"),
        ("validation shards", lambda c: shards(c, "default", "validation")[-1], MIMIR + "validation-good-0001-of-0001.json.gz"),
        ("train cache", lambda c: c.cache_location("default", "train"), "gs://mimir-train-us/levanter/tokenized/mimir-base/train"),
        ("format", fmt, "text"),
    ],
    "nb_mimir_mistral_1b_base_scratch.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "mimir-project/mimir-mistral-7b-base-scratch"),
        ("train shards", lambda c: len(shards(c, "default", "train")), 34),
        ("single-dataset order", lambda c: c.shuffle, False),
    ],
    "nb_mimir_mistral_7b_books.yaml": [
        ("train shards", lambda c: len(shards(c, "default", "train")), 5 + 14 + 7),
        ("last train shard", lambda c: shards(c, "default", "train")[-1], "gs://mimir-data-eu/mimir-books/data/train-good-0007-of-0007.json.gz"),
        ("validation cache", lambda c: c.cache_location("default", "validation"), "gs://mimir-train-us/levanter/tokenized/mimir-books/validation"),
    ],
    "nb_gemma3_4b_pretrain.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "google/gemma-3-4b-pt"),
        ("train shards", lambda c: len(shards(c, "default", "train")), 128),
        ("first train shard", lambda c: shards(c, "default", "train")[0],
         "https://huggingface.co/datasets/NbAiLab/aurora-open-2511/resolve/main/train/00000_data.parquet"),
    ],
    "heineman_llama_collapse.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "NousResearch/Llama-2-7b-hf"),
        ("shards", lambda c: (len(shards(c, "default", "train")), len(shards(c, "default", "validation"))), (128, 8)),
        ("first train shard", lambda c: shards(c, "default", "train")[0], "gs://your-bucket/data/train.1-of-128.jsonl.gz"),
    ],
    "whenwen_pile_source_llama.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "NousResearch/Llama-2-7b-hf"),
        ("train shards", lambda c: shards(c, "default", "train")[29], "gs://levanter-data-new/raw/Pile/train/29.jsonl.zst"),
        ("train cache", lambda c: c.cache_location("default", "train"), "gs://levanter-data-new/tokenized/pile-lla/train"),
    ],
    "marin_gpt2_nano.yaml": [
        ("tokenizer (unset: Levanter's gpt2, resolved when a cache is built)", lambda c: c.tokenizer, None),
        ("Hugging Face dataset", lambda c: (c.id, c.name, c.stream), ("dlwh/wikitext_103_detokenized", None, True)),
        ("train cache", lambda c: c.cache_location("default", "train"), "cache/train"),
    ],
    "midi_lakh_small_long.yaml": [
        ("tokenizer", lambda c: (c.tokenizer, c.vocab_size, c.enforce_eos), ("passthrough", None, False)),
        ("train shard", lambda c: shards(c, "default", "train"), ["gs://levanter-eu/lakh-data-inter-16384/train.txt"]),
        ("plaintext", lambda c: c.plaintext, True),
    ],
    "cutieowl_lakh_small_32k.yaml": [
        ("tokenizer", lambda c: (c.tokenizer, c.vocab_size, c.enforce_eos), ("passthrough", None, False)),
        ("train cache", lambda c: c.cache_location("default", "train"), "gs://levanter-eu/lakh-data-inter-1024/cache/train"),
    ],
    "anticipation_finetune_small.yaml": [
        ("tokenizer", lambda c: (c.tokenizer, c.vocab_size, c.enforce_eos), ("passthrough", 55028, False)),
        ("URLs", lambda c: (c.train_urls, c.validation_urls), (["/path/to/training/data"], ["/path/to/validation/data"])),
    ],
    "marin_gpt2_nano_ul2r.yaml": [
        ("format", fmt, "ul2r"),
        ("tasks", lambda c: (c.format.task_configs, c.format.task_probs), (UL2R_TASKS, UL2R_PROBS)),
        ("sentinels and seed", lambda c: (c.format.sentinel_token_id_start, c.format.sentinel_token_id_count, c.format.rng_seed),
         (50260, 100, 42)),
        ("dataset", lambda c: (c.id, c.tokenizer, c.cache_location("default", "train")),
         ("dlwh/wikitext_103_detokenized", "./gpt2_ul2r_DEV", "/tmp/marin_cache/train")),
    ],
    # Levanter's older mixture schema (configs + train_weights)
    "whenwen_llama2_100M_muon.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "EleutherAI/gpt-neox-20b"),
        ("sources", lambda c: len(c.configs), 18),
        ("weights", lambda c: {n: w for n, w in weights(c).items() if w}, {"dclm": 1.0}),
        ("dclm train URL", lambda c: c.configs["dclm"].train_urls, ["gs://marin-us-central2/raw/dclm/v2024-07-09-baseline-dedup/**/*.zstd"]),
        ("eval-only source", lambda c: (c.configs["paloma/ptb"].train_urls, c.configs["paloma/ptb"].validation_urls),
         ([], ["gs://levanter-data/paloma/ptb/val/val*.jsonl.gz"])),
        ("shuffle in eras", lambda c: c.shuffle, 100000),
        ("batch size from trainer", lambda c: c.batch_size, 1024),
        ("cache", lambda c: c.cache_location("dclm", "train"), "gs://marin-us-central2/tokenized/gpt_neox/dclm/train"),
    ],
    "marin_comma_150m_mixture.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "meta-llama/Meta-Llama-3.1-8B"),
        ("sources: existing caches only", lambda c: sorted(n for n, s in c.configs.items() if s.train_urls or s.id), []),
        ("weights", lambda c: (len(weights(c)), weights(c)["youtube"], weights(c)["peS2o"]), (15, 0.20718425463647342, 0.1556522341405229)),
        ("cache", lambda c: c.cache_location("peS2o", "train"), "gs://marin-us-central2/tokenized/common_pile/peS2o-2e6500/train"),
    ],
    "marin_dolma.yaml": [
        ("sources", lambda c: len(c.configs), 31),
        ("weights", lambda c: (weights(c)["dolma/cc"], weights(c)["paloma/gab"]), (597.75, 0.0)),
        ("cc shards", lambda c: len(shards(c, "dolma/cc", "train")), 275 + 239 + 140 + 153 + 291),
        ("per-source cache", lambda c: c.cache_location("dolma/cc", "train"), "gs://marin-us-central2/tokenized/dolma/cc-74b017/train"),
        ("order", lambda c: (c.shuffle, c.stop_strategy), (True, "restart")),
    ],
    "marin_gpt2_small_fast_mix.yaml": [
        ("order: older schema, no shuffle set", lambda c: c.shuffle, False),
        ("tokenizer", lambda c: c.tokenizer, "gpt2"),
        ("weights", weights, {"owt": 0.6, "wikitext": 0.4}),
        ("URL source", lambda c: len(shards(c, "owt", "train")), 128),
        ("Hugging Face source", lambda c: c.configs["wikitext"].id, "dlwh/wikitext_103_detokenized"),
        ("cache", lambda c: c.cache_location("wikitext", "validation"), "gs://marin-us-central2/scratch/dlwh/gpt2_small_fast_mix/wikitext/validation"),
    ],
    "marin_gpt2_eval_ul2r.yaml": [
        ("formats", lambda c: (fmt(c, "wikitext"), fmt(c, "ul2r")), ("text", "ul2r")),
        ("tasks", lambda c: (c.configs["ul2r"].format.task_configs, c.configs["ul2r"].format.task_probs), (UL2R_TASKS, UL2R_PROBS)),
        ("Hugging Face sources", lambda c: {n: (s.id, s.name) for n, s in c.configs.items()},
         {"wikitext": ("Salesforce/wikitext", "wikitext-103-raw-v1"), "ul2r": ("Salesforce/wikitext", "wikitext-103-raw-v1")}),
        ("weights", weights, {"wikitext": 0.5, "ul2r": 0.5}),
        ("own caches", lambda c: c.cache_location("ul2r", "train"), "/tmp/marin_cache_ul2r/train"),
    ],
    # newer Levanter's components schema, DPO pairs among them
    "marin_fineweb_llama_txt.yaml": [
        ("order: newer schema, no shuffle set", lambda c: c.shuffle, LEVANTER_BLOCK_SHUFFLE),
        ("tokenizer", lambda c: c.tokenizer, "NousResearch/Llama-2-7b-hf"),
        ("components", lambda c: len(c.configs), 17),
        ("fineweb URL patterns", lambda c: len(c.configs["fineweb"].train_urls), 50),
        ("weights", lambda c: {n: w for n, w in weights(c).items() if w}, {"fineweb": 1.0}),
        ("cache", lambda c: c.cache_location("fineweb", "train"), "gs://marin-data/tokenized/fineweb/llama2_tokenizer/txt/fineweb/train"),
    ],
    "marin_pubmed_source.yaml": [
        ("tokenizer (unset: gpt2)", lambda c: c.tokenizer, None),
        ("shards", lambda c: (len(shards(c, "pubmed", "train")), len(shards(c, "pubmed", "validation"))), (128, 8)),
        ("weights (unset: equal)", lambda c: c.weight_schedule()[0][1], {"pubmed": 1.0}),
        ("cache", lambda c: c.cache_location("pubmed", "train"), "gs://pubmed-mosaic/tokenized/pubmed-sharded/pubmed/train"),
    ],
    "marin_dpo_tiny_gpt2.yaml": [
        ("order: its component's shuffle", lambda c: c.shuffle, True),
        ("tokenizer", lambda c: c.tokenizer, "gpt2"),
        ("format", lambda c: fmt(c, "default"), "preference_chat"),
        ("pairs", lambda c: (c.configs["default"].format.chat_template, c.configs["default"].format.chosen_field,
                             c.configs["default"].format.rejected_field), (DPO_TEMPLATE, "chosen", "rejected")),
        ("one pair a example", lambda c: c.configs["default"].packing_options().max_segments_per_example, 1),
        ("order (component shuffle: true)", lambda c: c.shuffle, True),
        ("cache", lambda c: c.cache_location("default", "train"), "cache/dpo_tiny/default/train"),
    ],
    "marin_dpo_ultrafeedback_llama3_8b.yaml": [
        ("formats", lambda c: {fmt(c, n) for n in c.configs}, {"preference_chat"}),
        ("weights", weights, {"ultrafeedback_train_prefs": 1.0, "ultrafeedback_test_prefs": 0.0}),
        ("splits", lambda c: {n: (len(s.train_urls), len(s.validation_urls)) for n, s in c.configs.items()},
         {"ultrafeedback_train_prefs": (1, 0), "ultrafeedback_test_prefs": (0, 1)}),
        ("order", lambda c: (c.shuffle, c.permutation_type), (True, "feistel")),
        ("cache", lambda c: c.cache_location("ultrafeedback_train_prefs", "train"),
         "gs://marin-us-central1/tokenized/ultrafeedback_binarized_train_prefs_marin_tokenizer-7040eb/train"),
    ],
    "marin_dpo_bloom_speceval_llama3_8b.yaml": [
        ("tokenizer", lambda c: c.tokenizer, "marin-community/marin-tokenizer"),
        ("formats", lambda c: {fmt(c, n) for n in c.configs}, {"preference_chat"}),
        ("weights", weights, {"bloom_speceval_train": 1.0, "bloom_speceval_eval": 0.0}),
        ("train URL", lambda c: c.configs["bloom_speceval_train"].train_urls,
         ["gs://marin-us-central1/preference/bloom_openai_model_spec_gpt41_vs_mixtral_opposite/train/*.jsonl.gz"]),
    ],
}
SINGLE = {"nb_mimir_base_data.yaml", "nb_mimir_mistral_1b_base_scratch.yaml", "nb_mimir_mistral_7b_books.yaml",
          "nb_gemma3_4b_pretrain.yaml", "heineman_llama_collapse.yaml", "whenwen_pile_source_llama.yaml", "marin_gpt2_nano.yaml",
          "midi_lakh_small_long.yaml", "cutieowl_lakh_small_32k.yaml", "anticipation_finetune_small.yaml", "marin_gpt2_nano_ul2r.yaml"}
"""The single-dataset configs; every other one is a mixture (``configs`` or ``components``)."""


def test_the_table_covers_every_config_kept():
    assert sorted(MEANING) == sorted(p.name for p in WILD.glob("*.yaml"))
    assert len(MEANING) >= 20
    sources = (WILD / "SOURCES").read_text()
    assert all(name in sources for name in MEANING)


@pytest.mark.parametrize("name", sorted(MEANING))
def test_a_config_from_the_wild_loads_with_levanters_meaning(name):
    config = tokenmix.load_data_config(WILD / name)
    assert isinstance(config, tokenmix.LMDatasetConfig if name in SINGLE else tokenmix.LMMixtureDatasetConfig)
    for what, read, expected in MEANING[name]:
        assert read(config) == expected, what
