"""Levanter's (marin's) preference_chat and ul2r formats, component ``shuffle``, and the passthrough tokenizer (issue 36)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from helpers import TOKENIZER, demo_urls

import tokenmix
from tokenmix.config import cache_targets
from tokenmix.config.loading import ConfigError

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
            "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}")
SEQ = 48


def _pairs(path: Path) -> list[dict]:
    rows = []
    for i in range(6):
        question = {"role": "user", "content": f"What is {i} plus {i}?"}
        rows.append({"chosen": [question, {"role": "assistant", "content": f"It is {2 * i}."}],
                     "rejected": [question, {"role": "assistant", "content": f"Maybe {i}, maybe not."}]})
    rows.insert(3, {"chosen": [], "rejected": rows[0]["rejected"]})  # Levanter skips a pair with an empty side
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [r for r in rows if r["chosen"]]


def _preference_config(tmp_path, data: Path, **component):
    return tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "chat_template": TEMPLATE,
                                      "batch_size": 4, "components": {"prefs": {
                                          "source": {"type": "url", "train_urls": [str(data)]},
                                          "format": {"type": "preference_chat", "slice_strategy": "raise"}, **component}}})


def test_preference_chat_pairs_are_chosen_then_rejected_each_with_its_assistant_loss(tmp_path, caplog):
    pairs = _pairs(tmp_path / "prefs.jsonl")
    with caplog.at_level(logging.INFO, logger="tokenmix.config"):
        config = _preference_config(tmp_path, tmp_path / "prefs.jsonl", shuffle=True)
    assert "component 'prefs': shuffle: True is accepted" in caplog.text
    tokenmix.build_caches(config, progress=False)
    # each side is exactly what the chat format makes of that conversation alone
    chat = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "chat"), "chat_template": TEMPLATE,
                                      "train_urls": [str(tmp_path / "chosen.jsonl")], "format": {"type": "chat", "pack": False}})
    sides = [{"messages": p[side]} for p in pairs for side in ("chosen", "rejected")]
    (tmp_path / "chosen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sides))
    tokenmix.build_caches(chat, progress=False)
    one_each = tokenmix.PackedDataset(tokenmix.open_cache(chat, "default"), SEQ, pad_id=config.pad_id(), max_segments_per_example=1)
    expected = one_each.get_batch(range(2 * len(pairs)))
    source = config.train_sources(SEQ)["prefs"]
    assert len(source) == len(pairs) and source.tokens_per_example == 2 * SEQ
    batch = source.get_batch(range(len(pairs)))
    assert np.array_equal(batch.tokens, expected.tokens.reshape(len(pairs), 2 * SEQ))
    assert np.array_equal(batch.loss_mask, expected.loss_mask.reshape(len(pairs), 2 * SEQ))
    rejected = batch.segment_ids[:, SEQ:]
    assert set(np.unique(batch.segment_ids[:, :SEQ])) == {-1, 0} and set(np.unique(rejected)) == {-1, 1}
    # the loss is on the assistant's answer only, and never across the chosen/rejected boundary
    assert batch.loss_mask.any(axis=1).all() and not batch.loss_mask[:, SEQ - 1].any()
    mixture = config.train_set(SEQ).get_batch(range(8))
    assert mixture.tokens.shape == (8, 2 * SEQ)
    assert {r.tobytes() for r in mixture.tokens} <= {r.tobytes() for r in batch.tokens}


def test_preference_chat_refuses_what_levanters_dpo_data_refuses(tmp_path):
    data = tmp_path / "prefs.jsonl"
    _pairs(data)
    for option, value, message in (("pack", True, "pack: True is not supported"), ("slice_strategy", "left", "slice_strategy: 'left'")):
        with pytest.raises(ConfigError, match=message):
            tokenmix.load_data_config({"tokenizer": TOKENIZER, "train_urls": [str(data)],
                                       "format": {"type": "preference_chat", option: value}})
    with pytest.raises(ConfigError, match=r"component 'prefs': shuffle: 1000 differs from the config's shuffle: True"):
        _preference_config(tmp_path, data, shuffle=1000)
    with pytest.raises(ConfigError, match=r"\['prefs'\] are preference_chat pairs and \['web'\] are not"):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {
            "prefs": {"train_urls": [str(data)], "format": {"type": "preference_chat"}}, "web": {"train_urls": demo_urls("webster")}}})
    config = _preference_config(tmp_path, data)
    tokenmix.build_caches(config, progress=False)
    with pytest.raises(ValueError, match=r"preference pair 0: its chosen conversation has \d+ tokens, more than seq_len 8"):
        config.train_sources(8)["prefs"].get_batch([0])


def test_ul2r_builds_its_text_cache_and_refuses_to_train_saying_why(tmp_path):
    tasks = {"r": {"type": "rx", "mask_prob": 0.15, "mean_span_length": 3.0, "random_roll": True, "task_token_id": 31000},
             "s": {"type": "s", "task_token_id": 31001}}
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "train_urls": demo_urls("webster")[:1],
           "format": {"type": "ul2r", "task_configs": tasks, "task_probs": {"r": 0.75, "s": 0.25}, "rng_seed": 42,
                      "sentinel_token_id_start": 31900, "sentinel_token_id_count": 100}}
    config = tokenmix.load_data_config(doc)
    text = tokenmix.load_data_config({**doc, "format": {"type": "text"}, "cache_dir": str(tmp_path / "text")})
    tokenmix.build_caches(config, progress=False)
    tokenmix.build_caches(text, progress=False)
    ul2r_cache, text_cache = tokenmix.open_cache(config, "default"), tokenmix.open_cache(text, "default")
    assert np.array_equal(ul2r_cache.read_tokens(0, ul2r_cache.num_tokens()), text_cache.read_tokens(0, text_cache.num_tokens()))
    with pytest.raises(ValueError, match="format ul2r: tokenmix builds its cache .* but does not make UL2R denoising examples"):
        config.train_set(64)
    with pytest.raises(ConfigError, match=r"task_probs keys \['r'\] must be task_configs keys \['r', 's'\]"):
        tokenmix.load_data_config({**doc, "format": {**doc["format"], "task_probs": {"r": 1.0}}})
    with pytest.raises(ValueError, match=r"sentinel_token_id_count - 1\) is 40099, outside the tokenizer's 32000 ids"):
        cache_targets(tokenmix.load_data_config({**doc, "format": {**doc["format"], "sentinel_token_id_start": 40000}}))


def test_the_passthrough_tokenizer_reads_text_of_integers_as_levanter_does(tmp_path):
    """``tests/data/levanter/passthrough_levanter.json`` is what Levanter 1.2.dev1644's own ``BatchTokenizer`` over its
    ``PassthroughTokenizer(55028)`` made of four texts (enforce_bos/enforce_eos true), run in the side venv
    /work/sidevenv/levanter: the ids, and its metadata saying it appends no BOS or EOS."""
    levanter = json.loads((Path(__file__).parent / "data" / "levanter" / "passthrough_levanter.json").read_text())
    assert levanter["metadata"] == {"vocab_size": 55028, "append_bos": False, "append_eos": False}
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in levanter["texts"]))
    config = tokenmix.load_data_config({"tokenizer": "passthrough", "vocab_size": 55028, "cache_dir": str(tmp_path / "cache"),
                                        "train_urls": [str(data)]})
    tokenmix.build_caches(config, progress=False)
    cache = tokenmix.open_cache(config, "default")
    assert [cache.get_rows([i])[0].tolist() for i in range(cache.num_rows())] == levanter["input_ids"]
    with pytest.raises(ValueError, match="tokenizer: passthrough reads token ids written as text, and needs vocab_size"):
        cache_targets(tokenmix.load_data_config({"tokenizer": "passthrough", "train_urls": [str(data)]}))
