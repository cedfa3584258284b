"""Levanter's (marin's) preference_chat and ul2r formats, component ``shuffle``, and the passthrough tokenizer (issue 36)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from helpers import DPO_TEMPLATE, TOKENIZER, demo_urls

import tokenmix
from tokenmix.config import cache_targets
from tokenmix.config.loading import ConfigError
from tokenmix.datasets.ul2r_denoising import DenoisingTask, Ul2rDataset

LEVANTER_DATA = Path(__file__).parent / "data" / "levanter"

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


def _preference_config(tmp_path, data: Path, top: dict | None = None, **component):
    return tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "chat_template": TEMPLATE,
                                      "batch_size": 4, **(top or {}), "components": {"prefs": {
                                          "source": {"type": "url", "train_urls": [str(data)]},
                                          "format": {"type": "preference_chat", "slice_strategy": "raise"}, **component}}})


def test_preference_chat_pairs_are_chosen_then_rejected_each_with_its_assistant_loss(tmp_path, caplog):
    pairs = _pairs(tmp_path / "prefs.jsonl")
    with caplog.at_level(logging.INFO, logger="tokenmix.config"):
        config = _preference_config(tmp_path, tmp_path / "prefs.jsonl", shuffle=True)
    assert "component 'prefs': shuffle: True is read as the config's shuffle, which sets none" in caplog.text
    assert config.shuffle is True
    tokenmix.build_caches(config, progress=False)
    # each side is exactly what the chat format makes of that conversation alone, but for the padding
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
    padded_with_zeros = np.where(expected.segment_ids < 0, 0, expected.tokens)  # Levanter's padding, whatever the tokenizer's pad
    assert np.array_equal(batch.tokens, padded_with_zeros.reshape(len(pairs), 2 * SEQ))
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
        _preference_config(tmp_path, data, {"shuffle": True}, shuffle=1000)
    with pytest.raises(ConfigError, match=r"\['prefs'\] are preference_chat pairs and \['web'\] are not"):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {
            "prefs": {"train_urls": [str(data)], "format": {"type": "preference_chat"}}, "web": {"train_urls": demo_urls("webster")}}})
    config = _preference_config(tmp_path, data)
    tokenmix.build_caches(config, progress=False)
    with pytest.raises(ValueError, match=r"preference pair 0: its chosen conversation has \d+ tokens, more than seq_len 8"):
        config.train_sources(8)["prefs"].get_batch([0])



def test_preference_chat_equals_marins_preference_pair_dataset(tmp_path):
    """``tests/data/levanter/preference_marin.npz`` is what marin's own preference code made of ``preference_pairs.jsonl``
    (11 records: 10 pairs, multi-turn and system turns among them, and one with an empty chosen side).

    How it was made: in the side venv /work/sidevenv/marin (marin-levanter 0.2.20.dev202606180959, jax 0.10.2 CPU,
    transformers 4.57.6), ``levanter.tokenizers.load_tokenizer`` of data/tokenizer, then, for ``mask_user_turns`` true and
    false, ``preprocessor_for_preference_format(PreferenceChatLmDatasetFormat(chat_template=DPO_TEMPLATE,
    mask_user_turns=...), tokenizer)`` (a ``PreferenceChatProcessor``) over all records at once; with mask_user_turns true
    its rows' ``{chosen,rejected}_{input_ids,assistant_masks}`` are kept (concatenated, with per-row lengths). Its rows
    were written with Levanter's ``SerialCacheWriter`` and ``dataset_for_preference_format(format, Axis("position",
    seq_len), TreeCache.load(...))`` (a ``PreferencePairDataset``, max_segments_per_example 1, slice_strategy raise) gave,
    for seq_len 39 (the longest conversation) and 64, every ``DpoExample``'s chosen and rejected tokens, loss_weight and
    segment ids (``L{seq_len}_*``; ``nomask_L*`` for mask_user_turns false); at seq_len 24 making the dataset raised,
    and ``L24_error`` is its message. The script stays in the side venv, not here."""
    marin = np.load(LEVANTER_DATA / "preference_marin.npz")
    assert "Document 2 in leaf 'chosen_" in str(marin["L24_error"])  # Levanter refuses the whole dataset when it is made
    for mask_user_turns, tag in ((True, ""), (False, "nomask_")):
        config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / tag), "components": {"prefs": {
            "source": {"type": "url", "train_urls": [str(LEVANTER_DATA / "preference_pairs.jsonl")]},
            "format": {"type": "preference_chat", "chat_template": DPO_TEMPLATE, "mask_user_turns": mask_user_turns}}}})
        tokenmix.build_caches(config, progress=False)
        cache = tokenmix.open_cache(config, "prefs")
        if mask_user_turns:  # the cache holds what Levanter's PreferenceChatProcessor stores, side by side
            rows = cache.get_rows(range(cache.num_rows()))
            assistant = [np.zeros(len(r), np.int32) for r in rows]
            for row, begin, end in zip(*cache.loss_spans(0, cache.num_rows())):
                assistant[row][begin:end] = 1
            for k, side in enumerate(("chosen", "rejected")):
                cut = np.cumsum(marin[f"{side}_input_ids_lengths"])[:-1]
                assert [r.tolist() for r in rows[k::2]] == [r.tolist() for r in np.split(marin[f"{side}_input_ids"], cut)]
                assert [m.tolist() for m in assistant[k::2]] == [m.tolist() for m in np.split(marin[f"{side}_assistant_masks"], cut)]
        for seq_len in (39, 64):
            source = config.train_sources(seq_len)["prefs"]
            assert len(source) == 10
            batch = source.get_batch(range(10))
            for k, side in enumerate(("chosen", "rejected")):
                half = slice(k * seq_len, (k + 1) * seq_len)
                levanter = {f: marin[f"{tag}L{seq_len}_{side}_{f}"] for f in ("tokens", "loss_weight", "segment_ids")}
                assert np.array_equal(batch.tokens[:, half], levanter["tokens"]), (tag, seq_len, side)
                assert np.array_equal(batch.loss_mask[:, half], levanter["loss_weight"] > 0), (tag, seq_len, side)
                assert np.array_equal(batch.segment_ids[:, half] >= 0, levanter["segment_ids"] >= 0), (tag, seq_len, side)
        with pytest.raises(ValueError, match=r"preference pair 2: its chosen conversation has 39 tokens, more than seq_len 24"):
            config.train_sources(24)

UL2R_TASKS = {"r": {"type": "rx", "mask_prob": 0.15, "mean_span_length": 3.0, "random_roll": True, "task_token_id": 31000},
              "x": {"type": "rx", "mask_prob": 0.5, "mean_span_length": 3.0, "random_roll": False, "task_token_id": 31001},
              "s": {"type": "s", "task_token_id": 31002}}


def _ul2r_config(tmp_path: Path, **format_fields):
    fmt = {"type": "ul2r", "task_configs": UL2R_TASKS, "task_probs": {"r": 0.5, "x": 0.25, "s": 0.25}, "rng_seed": 42,
           "sentinel_token_id_start": 31900, "sentinel_token_id_count": 100, **format_fields}
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "train_urls": [str(LEVANTER_DATA / "ul2r_docs.jsonl")],
           "format": fmt}
    config = tokenmix.load_data_config(doc)
    tokenmix.build_caches(config, progress=False)
    return config.as_mixture(), doc


def test_ul2r_examples_equal_marins_ul2r_dataset(tmp_path):
    """``tests/data/levanter/ul2r_marin.npz`` holds every example marin's own ``Ul2rDataset`` made of this cache's rows.

    How it was made: the rows of the cache this test builds (``ul2r_docs.jsonl``: 54 runs of 1 to 160 words of the
    webster demo's validation split, tokenized by data/tokenizer, whose EOS is 0) were written with Levanter's
    ``SerialCacheWriter`` in the side venv /work/sidevenv/marin (marin-levanter 0.2.20.dev202606180959, jax 0.10.2 CPU),
    where ``levanter/data/ul2r.py`` and the ``pack_documents``/``GreedyPrepackedDataset`` (with ``packing_lengths``) of
    marin commit c9310e7d ran unchanged but for a holder of the attention mask (that release's ``AttentionMask`` has no
    ``prefix_lm_mask``) and a no-op ``await_finished``. ``Ul2rDataset(cache, Pos, KPos, tasks r/x/s as UL2R_TASKS,
    probs 0.5/0.25/0.25, PRNGKey(seed), pad_token_id, arange(31900, 32000), max_segments_per_example)`` gave, for
    seq_len 64 (seed 42, 64 segments, pad 0: what a ul2r source uses) and 128 (seed 7, 4 segments, pad 1:
    data/tokenizer's pad), the task of every document and each example's tokens, loss mask, prefix-LM input mask and
    segment ids (the cache row of each position, -1 for padding). The script stays in the side venv, not here."""
    levanter = np.load(LEVANTER_DATA / "ul2r_marin.npz")
    config, _ = _ul2r_config(tmp_path)
    cache = tokenmix.open_cache(config, "default")
    train = config.train_sources(64)["default"]
    seq_len, seed, segments, pad = (int(v) for v in levanter["L64_params"])
    assert (seq_len, seed, segments, pad) == (64, 42, 64, 0)
    assert len(train) == len(levanter["L64_tokens"]) == 47
    batch = train.get_batch(np.arange(len(train)))
    assert np.array_equal(batch.tokens, levanter["L64_tokens"])
    assert np.array_equal(batch.loss_mask, levanter["L64_loss_mask"])
    for row, documents in zip(batch.segment_ids, levanter["L64_documents"]):  # ours number an example's documents from 0
        assert np.array_equal(row, np.unique(documents, return_inverse=True)[1] - int(documents.min() < 0))
    wider = Ul2rDataset(cache, 128, tasks=[DenoisingTask(*t) for t in config.configs["default"].format.task_table()],
                        task_probs=[0.5, 0.25, 0.25], seed=7, sentinel_ids=np.arange(31900, 32000), pad_id=1, max_segments_per_example=4)
    for tag, dataset in (("L64", train), ("L128", wider)):
        assert np.array_equal(dataset.task_of, levanter[f"{tag}_tasks"])
        assert len(dataset) == len(levanter[f"{tag}_tokens"])
        for i in range(len(dataset)):
            example = dataset.example(i)
            for field in ("tokens", "loss_mask", "input_mask", "documents"):
                assert np.array_equal(getattr(example, field), levanter[f"{tag}_{field}"][i]), (tag, i, field)


def test_ul2r_examples_lay_out_task_token_inputs_then_targets_trained_on_alone(tmp_path):
    config, doc = _ul2r_config(tmp_path)
    train = config.train_sources(64)["default"]
    tasks = config.configs["default"].format.task_table()
    sentinels = set(range(31900, 32000))
    seen = set()
    lengths = np.diff(train.cache.row_bounds(0, train.cache.num_rows()))
    for i in range(len(train)):
        ex = train.example(i)
        documents = np.unique(ex.documents[ex.documents >= 0])
        if lengths[documents].min() < 3:
            continue  # a document under 3 tokens is not denoised: Levanter ORs its example's whole row in (the quirk)
        for document in documents:
            at = np.flatnonzero(ex.documents == document)
            kind, token = tasks[int(train.task_of[document])][:2]
            seen.add(kind)
            assert ex.tokens[at[0]] == token and ex.input_mask[at[0]]
            inputs = at[ex.input_mask[at]]
            assert np.array_equal(inputs, np.arange(at[0], at[0] + len(inputs)))  # inputs first, then targets
            targets = at[~ex.input_mask[at]]
            if len(targets):
                assert ex.tokens[targets[0]] in sentinels  # targets open with a sentinel (S: the first; R/X: the first span's)
                trained = np.flatnonzero(ex.loss_mask[at[:-1]]) + at[0] + 1
                assert set(trained) <= set(targets)  # only targets are predicted
            if kind == "s":
                assert ex.tokens[inputs[-1] + 1] == 31900 or not len(targets)
    assert seen == {"rx", "s"}
    again = tokenmix.load_data_config(doc).as_mixture().train_sources(64)["default"].get_batch(np.arange(len(train)))
    assert np.array_equal(again.tokens, train.get_batch(np.arange(len(train))).tokens)
    other = tokenmix.load_data_config({**doc, "format": {**doc["format"], "rng_seed": 43}}).as_mixture().train_sources(64)["default"]
    assert not np.array_equal(other.get_batch(np.arange(len(other))).tokens[:, :20], again.tokens[: len(other), :20])
    with pytest.raises(ValueError, match="format ul2r: Levanter's UL2R packs every document of the cache in order"):
        mixture = {"tokenizer": TOKENIZER, "configs": {"default": {k: v for k, v in doc.items() if k != "tokenizer"}},
                   "num_validation_sequences": {"default": 1}}
        tokenmix.load_data_config(mixture).train_sources(64)
    with pytest.raises(ConfigError, match=r"task_probs keys \['r'\] must be task_configs keys \['r', 's', 'x'\]"):
        tokenmix.load_data_config({**doc, "format": {**doc["format"], "task_probs": {"r": 1.0}}})
    with pytest.raises(ValueError, match=r"sentinel_token_id_count - 1\) is 40099, outside the tokenizer's 32000 ids"):
        cache_targets(tokenmix.load_data_config({**doc, "format": {**doc["format"], "sentinel_token_id_start": 40000}}))


@pytest.mark.parametrize("count", [0, -3])
def test_ul2r_without_sentinels_is_refused_when_the_config_is_read(tmp_path, count):
    """No sentinel ids passed every check, built the cache, and failed reading the first batch (an IndexError)."""
    fmt = {"type": "ul2r", "task_configs": UL2R_TASKS, "task_probs": {"r": 0.5, "x": 0.25, "s": 0.25},
           "sentinel_token_id_start": 31900, "sentinel_token_id_count": count}
    with pytest.raises(ConfigError, match=f"sentinel_token_id_count must be at least 1, got {count}"):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"),
                                   "train_urls": [str(LEVANTER_DATA / "ul2r_docs.jsonl")], "format": fmt})


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


@pytest.mark.parametrize("damage", ["cut short", "other ids"])
def test_a_damaged_remembered_passthrough_tokenizer_is_written_again_never_used(tmp_path, monkeypatch, damage):
    """The passthrough tokenizer's ``tokenizer.json`` is written once per vocabulary size beside tokenmix's remembered
    descriptions. One cut short (a crash before the file system wrote it) stopped every passthrough build with a message
    about a tokenizer the user never gave, and one that still parses but maps the texts to other ids gave a cache of other
    tokens: it is compared with what it must hold, and written again where it differs."""
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path / "remembered"))
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(map(str, range(i, 90, 7)))}) + "\n" for i in range(5)))

    def build(name: str) -> list[list[int]]:
        config = tokenmix.load_data_config({"tokenizer": "passthrough", "vocab_size": 100, "cache_dir": str(tmp_path / name),
                                            "train_urls": [str(data)]})
        tokenmix.build_caches(config, progress=False)
        cache = tokenmix.open_cache(config, "default")
        return [cache.get_rows([i])[0].tolist() for i in range(cache.num_rows())]

    expected = [list(range(i, 90, 7)) for i in range(5)]
    assert build("first") == expected
    written = next((tmp_path / "remembered" / "passthrough").glob("*.tokenizer.json"))
    if damage == "cut short":
        written.write_bytes(written.read_bytes()[:100])
    else:
        spec = json.loads(written.read_text())
        spec["model"]["vocab"]["7"], spec["model"]["vocab"]["8"] = 8, 7
        written.write_text(json.dumps(spec))
    assert build("second") == expected


def test_a_passthrough_tokenizer_that_cannot_be_written_is_an_error_naming_where_and_the_fix(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where tokenmix's directory should be")
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(blocked))
    config = tokenmix.load_data_config({"tokenizer": "passthrough", "vocab_size": 100, "cache_dir": str(tmp_path / "cache"),
                                        "train_urls": [str(tmp_path / "ids.jsonl")]})
    with pytest.raises(OSError, match=r"the data config: tokenizer: passthrough needs its tokenizer file at .*blocked.*set TOKENMIX_CACHE_DIR"):
        config.tokenizer_name("the data config")
    assert not list(tmp_path.glob("**/*.tmp"))
