"""Newer Levanter's data config (``LmDataConfig``, marin's ``lib/levanter``) loads with Levanter's meaning (issue 16):
``components`` (cached, hierarchical, direct), the component's ``format``/``pack``/``cache_dir``/``tags``, ``type``d
sources, ``train_weights: null``, the block shuffle, the ``prebuilt`` format, ``text`` with ``pack`` and ``chat`` with
``system_prompt`` and ``chat_template_kwargs``.

Levanter's repository holds no YAML of this shape (its configs still use ``configs:``), so the documents here are
written field for field from ``LmDataConfig`` and its component classes in marin-levanter 0.2.20's
``levanter/data/text/datasets.py``."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import yaml
from helpers import TOKENIZER, demo_urls

import tokenmix
from tokenmix.config.loading import ConfigError
from tokenmix.datasets.packed import PackedDataset
from tokenmix.datasets.settings import BlockShuffle
from tokenmix.datasets.token_seq import TokenSeqDataset


def _newer(tmp_path, **top) -> dict:
    """A newer-schema mixture over the bundled demo corpus: a URL component, and a hierarchical one of two children."""
    return {
        "tokenizer": TOKENIZER,
        "cache_dir": str(tmp_path / "caches"),
        "shuffle": True,
        "permutation_type": "feistel",
        "auto_build_caches": True,
        "components": {
            "web": {"type": "cached", "source": {"type": "url", "train_urls": demo_urls("webster")}, "tags": ["english", "reference"]},
            "docs": {
                "type": "hierarchical_cached",
                "components": {
                    "linux": {"source": {"train_urls": demo_urls("linux_doc")}, "pack": True},
                    "python": {"source": {"train_urls": demo_urls("python_doc")}, "pack": 8, "tags": ["code"]},
                },
                "train_weights": {"linux": 1.0, "python": 3.0},
                "token_counts": {"linux": 1000, "python": 1000},
                "tags": ["docs"],
            },
        },
        "train_weights": {"web": 1.0, "docs": 1.0},
        "num_validation_sequences": {"web": 4},
        **top,
    }


def _load(tmp_path, doc: dict):
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump({"data": doc, "trainer": {"train_batch_size": 16}}, sort_keys=False))
    return tokenmix.load_data_config(path)


def test_components_resolve_to_sources_weights_caches_and_packing_as_levanter_reads_them(tmp_path):
    config = _load(tmp_path, _newer(tmp_path))
    assert list(config.configs) == ["web", "docs/linux", "docs/python"]
    assert config.train_weights == {"web": 1.0, "docs/linux": 0.25, "docs/python": 0.75}
    assert config.cache_location("docs/python", "train") == str(tmp_path / "caches" / "docs" / "python" / "train")
    assert config.configs["web"].packing_options() is None  # text: windows of the token stream
    assert config.configs["docs/linux"].packing_options().max_segments_per_example == 64
    assert config.configs["docs/python"].packing_options().max_segments_per_example == 8
    assert config.components == {}
    tokenmix.build_caches(config, progress=False)
    train = config.train_set(256)
    assert isinstance(train.source("web").base, TokenSeqDataset)
    assert isinstance(train.source("docs/python").base, PackedDataset)
    usage = train.usage(2048 * 4)
    drawn = {name: u.examples for name, u in usage.items()}
    assert drawn == {"web": 4096, "docs/linux": 1024, "docs/python": 3072}  # 1 : 1 between components, 1 : 3 inside docs
    tagged = {name: tags for name, _, tags in config.tagged_validation_sets(256)}
    assert tagged == {"web": ["english", "reference", "web"]}


def test_null_train_weights_weigh_every_component_the_same_and_share_a_hierarchical_ones(tmp_path):
    config = _load(tmp_path, _newer(tmp_path, train_weights=None))
    assert config.train_weights == {"web": 1.0, "docs/linux": 0.25, "docs/python": 0.75}
    staged = _load(tmp_path, _newer(tmp_path, train_weights=[[0, {"web": 1.0, "docs": 0.0}], [10, {"web": 0.5, "docs": 0.5}]]))
    assert staged.weight_schedule() == [(0, {"web": 1.0, "docs/linux": 0.0, "docs/python": 0.0}),
                                        (160, {"web": 0.5, "docs/linux": 0.125, "docs/python": 0.375})]


def test_a_components_format_is_the_one_built_and_the_sources_is_reported_unused(tmp_path, caplog):
    doc = _newer(tmp_path)
    doc["components"] = {"chat": {"source": {"train_urls": demo_urls("webster"), "format": {"type": "chat"},
                                             "cache_dir": str(tmp_path / "ignored")}}}
    doc.pop("num_validation_sequences")
    doc["train_weights"] = None
    with caplog.at_level(logging.WARNING, logger="tokenmix.config"):
        config = _load(tmp_path, doc)
    assert config.configs["chat"].format == tokenmix.TextLmDatasetFormat()
    assert config.cache_location("chat", "train") == str(tmp_path / "caches" / "chat" / "train")
    assert "its source's format" in caplog.text and "move `format` up to the component" in caplog.text
    assert "its source's cache_dir is not used" in caplog.text


@pytest.mark.parametrize("component, message", [
    ({"type": "direct"}, "holds datasets made in Python"),
    ({"type": "hierarchical_cached", "components": {"a": {}}, "train_weights": {"b": 1.0}}, r"names \['b'\], which are not among"),
    ({"type": "hierarchical_cached", "components": {"a": {}}, "train_weights": {"a": 1.0}, "token_counts": {}}, "token_counts must cover"),
    ({"source": {"type": "hf", "train_urls": ["x.jsonl"]}}, "source type hf needs `id`"),
    ({"format": {"type": "fim"}, "pack": True}, "pack is not available for format FimLmDatasetFormat"),
    ({"type": "hierarchical_cached", "components": {"a": {}, "b": {}}, "train_weights": {"a": 1.0, "b": -1.0}},
     r"component 'x': train_weights: child 'b' has weight -1.0; give it a finite number >= 0 \(0 leaves it to validation\)"),
    ({"type": "hierarchical_cached", "components": {"a": {}, "b": {}}, "train_weights": {"a": 1.0, "b": float("inf")}},
     r"component 'x': train_weights: child 'b' has weight inf; give it a finite number >= 0"),
], ids=["direct", "unknown-child-weight", "token-counts", "hf-without-id", "fim-pack", "negative-child-weight", "infinite-child-weight"])
def test_components_levanter_refuses_are_refused_naming_the_field(tmp_path, component, message):
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path), "components": {"x": component}}
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, doc)


def test_configs_and_components_together_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="give `configs`.*or `components`.*not both"):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {"a": {"train_urls": ["a.jsonl"]}},
                                   "components": {"b": {"source": {"train_urls": ["b.jsonl"]}}}})


def test_block_shuffle_reads_each_example_once_per_epoch_a_few_blocks_at_a_time(tmp_path):
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"),
           "components": {"web": {"source": {"train_urls": demo_urls("webster")}}},
           "shuffle": {"io_block_size": 16, "window_blocks": 4, "perm_type": "feistel"}}
    config = _load(tmp_path, doc)
    assert config.shuffle == BlockShuffle(16, 4)
    tokenmix.build_caches(config, progress=False)
    train = config.train_set(128)
    web = train.source("web")
    n = web.length()
    order = web.examples(np.arange(n))
    assert sorted(order.tolist()) == list(range(n))
    assert not np.array_equal(order, np.arange(n))
    full_windows = n // 64
    for w in range(full_windows):  # a window of positions reads exactly four whole blocks
        blocks = np.unique(order[w * 64 : (w + 1) * 64] // 16)
        assert len(blocks) == 4
    assert not np.array_equal(web.examples(np.arange(n, 2 * n)), order)  # the next epoch in another order


def test_text_pack_packs_documents_of_an_older_schema_source_too(tmp_path):
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path),
                                        "configs": {"py": {"train_urls": demo_urls("python_doc"), "format": {"type": "text", "pack": 4}},
                                                    "web": {"train_urls": demo_urls("webster"), "format": {"type": "text", "pack": "pad"}}}})
    assert config.configs["py"].packing_options().max_segments_per_example == 4
    assert config.configs["web"].packing_options().max_segments_per_example == 1
    plain = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path),
                                       "configs": {"py": {"train_urls": demo_urls("python_doc")}}})
    targets = [tokenmix.config.cache_targets(c)[0].identity for c in (config, plain)]
    assert targets[0] == targets[1]  # pack chooses how a cache is read, not what it holds


@pytest.mark.parametrize("doc, hint", [
    ({"components": {"web": {"sourc": {"train_urls": ["a.jsonl"]}}}}, r"`components.web`.*sourc -> source"),
    ({"components": {"web": {"source": {"train_url": ["a.jsonl"]}}}}, "train_url -> train_urls"),
    ({"components": {"web": {"type": "cachd"}}}, "cachd -> cached"),
    ({"configs": {"web": {"train_urls": ["a.jsonl"], "format": {"type": "chatt"}}}}, "chatt -> chat"),
    ({"configs": {}, "train_weigths": {}}, "train_weigths -> train_weights"),
])
def test_an_unknown_field_or_choice_is_named_with_the_closest_valid_name(doc, hint):
    with pytest.raises(ConfigError, match=hint):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, **doc})
