"""Fields of Levanter's data configs read with Levanter's meaning (issue 36): a missing ``tokenizer`` is Levanter's
default, ``gpt2``, taken from the local Hugging Face cache only when a cache is built or opened; the single-dataset
form's ``shuffle``, ``permutation_type``, ``ignore_token_id`` and ``chat_template``; older Levanter's source fields."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, SEQ_LEN, TOKENIZER, demo_urls

import tokenmix
from tokenmix.config import cache_targets
from tokenmix.config.loading import ConfigError

_DEFAULT_TOKENIZER_RUN = """
import json, sys
import tokenmix
from tokenmix.config import cache_targets
config = tokenmix.load_data_config({"train_urls": sys.argv[1:], "cache_dir": "unused"})
try:
    target = cache_targets(config)[0]
except ValueError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"vocab_size": target.spec.vocab_size, "fingerprint": target.identity["tokenizer_fingerprint"]}))
"""


def _default_tokenizer_run(hub_cache: Path) -> dict:
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "", "TOKENMIX_CACHE_DIR": str(hub_cache / "tm"),
           "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", _DEFAULT_TOKENIZER_RUN, *demo_urls("webster")], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_config_without_tokenizer_means_gpt2_from_the_local_hugging_face_cache_only(tmp_path):
    """Loading reads no tokenizer; building finds gpt2 in the hub cache (here: the demo tokenizer's files laid out as a
    cached snapshot of gpt2), or says which field to set, never downloading it."""
    assert tokenmix.load_data_config({"train_urls": demo_urls("webster")}).tokenizer is None
    missing = _default_tokenizer_run(tmp_path / "empty_hub")
    assert "`tokenizer` is not set, so it is Levanter's default, 'gpt2'" in missing["error"]
    assert "Fix: set `tokenizer:`" in missing["error"] and "huggingface-cli download gpt2" in missing["error"]
    snapshot = tmp_path / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(TOKENIZER) / name, snapshot / name)
    (tmp_path / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--gpt2" / "refs" / "main").write_text("0" * 40)
    found = _default_tokenizer_run(tmp_path / "hub")
    ours = cache_targets(tokenmix.load_data_config({"tokenizer": TOKENIZER, "train_urls": demo_urls("webster")}))[0]
    assert found == {"vocab_size": 32000, "fingerprint": ours.identity["tokenizer_fingerprint"]}


def _single(tmp_path, **fields):
    return tokenmix.load_data_config({"tokenizer": TOKENIZER, "train_urls": demo_urls("webster"),
                                      "cache_dir": str(tmp_path / "cache"), **fields})


def test_the_single_dataset_form_trains_in_cache_order_or_shuffled_with_ignore_token_id(tmp_path):
    plain = _single(tmp_path)
    tokenmix.build_caches(plain, progress=False)
    in_order = plain.train_set(SEQ_LEN).get_batch(range(6))
    windows = tokenmix.TokenSeqDataset(tokenmix.open_cache(plain, "default"), SEQ_LEN).get_batch(range(6))
    assert np.array_equal(in_order.tokens, windows.tokens)  # Levanter's single-dataset default: shuffle false
    shuffled = _single(tmp_path, shuffle=True, permutation_type="linear").train_set(SEQ_LEN)
    first = shuffled.get_batch(range(64)).tokens
    assert not np.array_equal(first[:6], in_order.tokens)
    everything = tokenmix.TokenSeqDataset(tokenmix.open_cache(plain, "default"), SEQ_LEN)
    assert {r.tobytes() for r in first} <= {r.tobytes() for r in everything.get_batch(range(len(everything))).tokens}
    ignored = int(in_order.tokens[0, 5])
    masked = _single(tmp_path, ignore_token_id=ignored).train_set(SEQ_LEN).get_batch(range(6))
    assert not masked.loss_mask[:, :-1][in_order.tokens[:, 1:] == ignored].any()
    assert in_order.loss_mask[:, :-1][in_order.tokens[:, 1:] == ignored].all()
    with pytest.raises(ConfigError, match="permutation_type.*Cannot convert .random. .* into one of: feistel, linear"):
        _single(tmp_path, permutation_type="random")


def test_chat_template_is_the_template_of_chat_sources_that_give_none(tmp_path):
    template = ("{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
                "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}")
    chats = {"chat": {"train_urls": ["chat.jsonl"], "format": {"type": "chat"}},
             "own": {"train_urls": ["own.jsonl"], "format": {"type": "chat", "chat_template": template + " "}}}
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "chat_template": template, "configs": chats})
    identities = {t.source: t.identity["format"]["chat_template"] for t in cache_targets(config)}
    assert identities == {"chat": template, "own": template + " "}
    single = tokenmix.load_data_config({"tokenizer": TOKENIZER, "chat_template": template, **chats["chat"]})
    assert cache_targets(single)[0].identity["format"]["chat_template"] == template


def test_older_levanter_source_fields_keep_their_last_meaning_or_are_refused_naming_the_release(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tokenmix.config"):
        config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {"web": {
            "train_urls": demo_urls("webster"), "text_key": "content", "plaintext": False, "rows_per_chunk": 8192}}})
    assert config.configs["web"].format == tokenmix.TextLmDatasetFormat(text_key="content")
    assert "plaintext: False (older Levanter) is accepted: Levanter never read it" in caplog.text
    assert "rows_per_chunk: 8192 (older Levanter) is accepted" in caplog.text
    with pytest.raises(ConfigError, match="num_train_shards: Levanter 1.0 removed it .*; remove it"):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "train_urls": ["a.jsonl"], "num_train_shards": 128})
    with pytest.raises(ConfigError, match="text_key: 'content' .* but the format is 'chat'"):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "train_urls": ["a.jsonl"], "text_key": "content", "format": {"type": "chat"}})


def test_sources_naming_their_type_as_levanters_2025_configs_write_them_load_with_the_same_meaning(tmp_path):
    """Levanter's 2025 sources are a choice, ``UrlDatasetSourceConfig`` (``type: url``) or ``HfDatasetSourceConfig``
    (``type: hf``), and draccus writes the choice name into every config it saves: such a ``configs:`` entry means what
    the same entry without ``type`` means; a type that contradicts the fields is refused naming the source."""
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path),
           "configs": {"web": {"train_urls": demo_urls("webster"), "tags": ["en"]}, "wiki": {"id": "dlwh/wikitext_103_detokenized"}},
           "train_weights": {"web": 1.0, "wiki": 0.0}}
    plain = tokenmix.load_data_config(doc)
    typed = tokenmix.load_data_config({**doc, "configs": {"web": {"type": "url", **doc["configs"]["web"]},
                                                          "wiki": {"type": "hf", **doc["configs"]["wiki"]}}})
    assert [(t.source, t.split, t.location, [s.name for s in t.shards]) for t in cache_targets(typed, ["web"])] == \
        [(t.source, t.split, t.location, [s.name for s in t.shards]) for t in cache_targets(plain, ["web"])]
    assert typed.configs["wiki"].id == plain.configs["wiki"].id and typed.configs["web"].tags == ["en"]
    with pytest.raises(ConfigError, match=r"`configs.wiki`.*source type url takes train_urls/validation_urls, not `id`; use type: hf"):
        tokenmix.load_data_config({**doc, "configs": {"web": doc["configs"]["web"], "wiki": {"type": "url", "id": "x/y"}}})
    with pytest.raises(ConfigError, match=r"source type hf needs `id` \(the Hugging Face dataset\)"):
        tokenmix.load_data_config({**doc, "configs": {"web": {"type": "hf", **doc["configs"]["web"]}}, "train_weights": {}})


def test_a_sources_type_is_not_a_change_of_data_to_a_resumed_run():
    """``type: url`` says what the fields say: a run resumed from a config that writes it (or drops it) reads the same
    batches, and its data identity is the same."""
    from tokenmix.train.config import ModelConfig, TrainerConfig, TrainLmConfig
    from tokenmix.train.data_identity import data_identity

    def identity(source: dict) -> dict:
        data = tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {"web": source}})
        return data_identity(TrainLmConfig(data, TrainerConfig(), ModelConfig()))

    assert identity({"type": "url", "train_urls": demo_urls("webster")}) == identity({"train_urls": demo_urls("webster")})


@pytest.mark.parametrize("where", ["configs", "components"])
@pytest.mark.parametrize("pack", [0, -3])
def test_a_pack_that_is_no_number_of_documents_is_refused_when_the_config_loads(where, pack):
    """It was refused only when a training set was made, after every cache was built."""
    if where == "configs":
        doc = {"configs": {"web": {"train_urls": ["a.jsonl"], "format": {"type": "chat", "pack": pack}}}}
    else:
        doc = {"components": {"web": {"source": {"train_urls": ["a.jsonl"]}, "format": {"type": "chat"}, "pack": pack}}}
    named = "`configs.web`: Couldn't instantiate class LMDatasetSourceConfig using the given arguments: " if where == "configs" \
        else "component 'web': "
    with pytest.raises(ConfigError, match=re.escape(f"{named}pack must be true, false, pad or a positive number of documents per "
                                                    f"example, got {pack!r}")):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, **doc})
