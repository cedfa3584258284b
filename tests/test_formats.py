"""Supervised, chat and fill-in-the-middle formats on the shared tokenizer: exact token and loss layouts,
bad records under both error policies, loss spans in the cache, statistics, identity and determinism."""

from __future__ import annotations

import json
import logging

import draccus
import numpy as np
import pytest
import yaml
from helpers import TOKENIZER, build, cache_bytes, encoder_for, with_format, write_jsonl, write_lines

import tokenmix
from tokenmix import (
    BadInputError,
    CacheMismatchError,
    ChatLmDatasetFormat,
    FimLmDatasetFormat,
    LMMixtureDatasetConfig,
    PrebuiltLmDatasetFormat,
    SupervisedLmDatasetFormat,
    TextLmDatasetFormat,
    TokenCache,
    TokenSeqDataset,
    build_caches,
    open_cache,
)

EOS, PAD, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = 0, 1, 2, 3, 4  # ids in the shared tokenizer

TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>\n"
    "{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endif %}{% endfor %}"
)
CHAT = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Ciao"},
]


def ids(hf_tokenizer, text: str) -> list[int]:
    return hf_tokenizer(text, add_special_tokens=False)["input_ids"]


def built(tmp_path, fmt, records, name="c", **kw):
    url = write_jsonl(tmp_path / f"{name}.jsonl", records)
    stats = build(str(tmp_path / name), [url], fmt, **kw)
    return TokenCache(str(tmp_path / name)), stats


def target_mask(cache: TokenCache, row: int) -> np.ndarray:
    """Per token of a row: whether the format trains on it, from the stored spans."""
    mask = np.zeros(len(cache[row]), bool)
    rows, begin, end = cache.loss_spans(row, row + 1)
    for b, e in zip(begin, end):
        mask[b:e] = True
    return mask


# supervised


def test_supervised_layout_is_prompt_then_completion_and_eos_with_loss_on_the_completion(tmp_path):
    cache, stats = built(tmp_path, SupervisedLmDatasetFormat(), [{"prompt": "Translate: Hello", "response": " Bonjour"}])
    # 'Trans' 'late' ':' 'ĠHello' | 'ĠBon' 'j' 'our' EOS
    assert cache[0].tolist() == [4068, 4870, 30, 28652, 30753, 78, 665, EOS]
    rows, begin, end = cache.loss_spans(0, 1)
    assert (rows.tolist(), begin.tolist(), end.tolist()) == ([0], [4], [8])
    # Cerebras: position 3 (the last prompt token) predicts the first completion token; the EOS position predicts nothing
    batch = TokenSeqDataset(cache, 8).get_batch([0])
    assert batch.loss_mask[0].astype(int).tolist() == [0, 0, 0, 1, 1, 1, 1, 0]
    assert stats["loss_valid_tokens"] == 4 and stats["masked_tokens"] == 4
    assert stats["raw_chars"] == len("Translate: Hello") + len(" Bonjour")


def test_supervised_boundaries_with_bos_separators_and_custom_fields(tmp_path, hf_tokenizer):
    record = {"question": "2+2=", "answer": " 4", "other": 1}
    prompt, completion = ids(hf_tokenizer, "2+2="), ids(hf_tokenizer, " 4")
    text_sep = SupervisedLmDatasetFormat(input_field="question", output_field="answer", separate_with="\n")
    cache, _ = built(tmp_path, text_sep, [record], "text_sep", tokenization={"enforce_bos": True})
    newline = ids(hf_tokenizer, "\n")
    assert cache[0].tolist() == [EOS] + prompt + newline + completion + [EOS]  # BOS is <|endoftext|> too
    assert target_mask(cache, 0).tolist() == [False] * (1 + len(prompt) + len(newline)) + [True] * (len(completion) + 1)
    id_sep = SupervisedLmDatasetFormat(input_field="question", output_field="answer", separate_with=FIM_MIDDLE)
    cache, _ = built(tmp_path, id_sep, [record], "id_sep")
    assert cache[0].tolist() == prompt + [FIM_MIDDLE] + completion + [EOS]
    assert target_mask(cache, 0).tolist() == [False] * (len(prompt) + 1) + [True] * (len(completion) + 1)
    unmasked = SupervisedLmDatasetFormat(input_field="question", output_field="answer", mask_inputs=False)
    cache, stats = built(tmp_path, unmasked, [record], "unmasked")
    assert not cache.has_loss_spans and cache[0].tolist() == prompt + completion + [EOS]
    assert stats["loss_valid_tokens"] == len(prompt) + len(completion)


def test_supervised_length_limits_skip_and_count_even_under_raise(tmp_path, caplog):
    fmt = SupervisedLmDatasetFormat(max_seq_length=8, min_sequence_len=4)
    records = [
        {"prompt": "Translate: Hello", "response": " Bonjour"},  # 8 tokens: kept
        {"prompt": "Translate: Hello there", "response": " Bonjour"},  # 9: too long
        {"prompt": "a", "response": "b"},  # 3: too short
        {"prompt": "2+2=", "response": " 4"},  # 6: kept
    ]
    with caplog.at_level(logging.WARNING):
        cache, stats = built(tmp_path, fmt, records)
    assert cache.num_rows() == stats["documents"] == 2
    assert stats["records"] == 4 and stats["skipped_by_reason"] == {"too_long": 1, "too_short": 1}
    assert "line 2: too_long" in caplog.text and "line 3: too_short" in caplog.text
    assert [len(cache[r]) for r in range(2)] == [8, 6]


# chat


def test_chat_masks_every_assistant_turn_and_nothing_else(tmp_path, hf_tokenizer):
    cache, stats = built(tmp_path, ChatLmDatasetFormat(chat_template=TEMPLATE), [{"messages": CHAT}])
    rendered = "<|user|>\nHi\n<|assistant|>\nHello!<|endoftext|><|user|>\nBye\n<|assistant|>\nCiao<|endoftext|>"
    row = cache[0].tolist()
    assert row == ids(hf_tokenizer, rendered)  # the template places EOS; no BOS/EOS added around it
    assert len(row) == 40 and row[16:19] == ids(hf_tokenizer, "Hello!") + [EOS] and row[36:40] == ids(hf_tokenizer, "Ciao") + [EOS]
    rows, begin, end = cache.loss_spans(0, 1)
    assert list(zip(begin.tolist(), end.tolist())) == [(16, 19), (36, 40)]
    mask = TokenSeqDataset(cache, 40).get_batch([0]).loss_mask[0]
    assert np.flatnonzero(mask).tolist() == [15, 16, 17, 35, 36, 37, 38]
    assert stats["loss_valid_tokens"] == 7 and stats["masked_tokens"] == 33


def test_chat_spans_match_hugging_face_assistant_masks(tmp_path, hf_tokenizer):
    """Levanter's semantics: the assistant mask apply_chat_template(return_assistant_tokens_mask=True) gives."""
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[SYS] {{ m['content'] }}\n"
        "{% elif m['role'] == 'user' %}[USER] {{ m['content'] }}\n"
        "{% else %}[BOT] {% generation %}{{ m['content'] | trim }} <|endoftext|>{% endgeneration %}\n{% endif %}{% endfor %}"
    )
    conversations = [
        [{"role": "system", "content": "Be brief."}, *CHAT],
        [{"role": "user", "content": "déjà vu? 日本"}, {"role": "assistant", "content": "  Oui, très.  "}],
    ]
    cache, _ = built(tmp_path, ChatLmDatasetFormat(chat_template=template), [{"messages": c} for c in conversations])
    for row, messages in enumerate(conversations):
        hf = hf_tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True)
        assert cache[row].tolist() == list(hf["input_ids"])
        assert target_mask(cache, row).tolist() == [bool(m) for m in hf["assistant_masks"]]


def test_chat_without_masking_needs_no_generation_marks(tmp_path, hf_tokenizer):
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    cache, stats = built(tmp_path, ChatLmDatasetFormat(chat_template=plain, mask_user_turns=False), [{"messages": CHAT[:2]}])
    assert cache[0].tolist() == ids(hf_tokenizer, "user: Hi\nassistant: Hello!\n")
    assert not cache.has_loss_spans and stats["loss_valid_tokens"] == len(cache[0]) - 1


@pytest.mark.parametrize("template, problem", [
    (None, "tokenizer has no chat template"),
    ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "cannot mark assistant turns"),
    ("{% for m in messages %}{% if m['role'] == 'user' %}{% generation %}{% endgeneration %}{% endif %}{{ m['content'] }}{% endfor %}",
     "marks nothing"),
    ("{% for m in messages %}{% generation %}{{ m['content'] }}{% endfor %}", "does not compile"),
])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_template_that_cannot_mark_assistant_turns_is_refused_before_any_record(tmp_path, template, problem, on_error):
    url = write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}])
    with pytest.raises(ValueError, match=problem) as err:
        build(str(tmp_path / "c"), [url], ChatLmDatasetFormat(chat_template=template), on_error=on_error)
    assert "format chat" in str(err.value) and "test" in str(err.value)  # names the source (here: "test")
    assert not (tmp_path / "c" / "ledger.json").exists()


# fill in the middle


def test_fim_psm_and_spm_sentinel_order(tmp_path, hf_tokenizer):
    text = "def add(a, b):\n    return a + b\n"
    for spm_rate, name in ((0.0, "psm"), (1.0, "spm")):
        fmt = FimLmDatasetFormat(fim_rate=1.0, spm_rate=spm_rate, seed=3)
        spm, lo, hi = fmt.draw(text)
        assert spm == (name == "spm") and 0 <= lo <= hi <= len(text)
        prefix, middle, suffix = (ids(hf_tokenizer, t) for t in (text[:lo], text[lo:hi], text[hi:]))
        cache, stats = built(tmp_path, fmt, [{"text": text}], name)
        if name == "psm":
            expected = [FIM_PREFIX] + prefix + [FIM_SUFFIX] + suffix + [FIM_MIDDLE] + middle + [EOS]
        else:
            expected = [FIM_PREFIX, FIM_SUFFIX] + suffix + [FIM_MIDDLE] + prefix + middle + [EOS]
        assert cache[0].tolist() == expected
        assert not cache.has_loss_spans and stats["loss_valid_tokens"] == len(expected) - 1
    plain, _ = built(tmp_path, FimLmDatasetFormat(fim_rate=0.0), [{"text": text}], "plain")
    assert plain[0].tolist() == ids(hf_tokenizer, text) + [EOS]


def test_fim_with_bos_and_custom_sentinels(tmp_path, hf_tokenizer):
    text = "x = 1"
    fmt = FimLmDatasetFormat(fim_rate=1.0, spm_rate=0.0, fim_prefix_tok="<fim_middle>", fim_middle_tok="<fim_prefix>")
    _, lo, hi = fmt.draw(text)
    cache, _ = built(tmp_path, fmt, [{"text": text}], tokenization={"enforce_bos": True})
    parts = [ids(hf_tokenizer, t) for t in (text[:lo], text[lo:hi], text[hi:])]
    assert cache[0].tolist() == [EOS, FIM_MIDDLE] + parts[0] + [FIM_SUFFIX] + parts[2] + [FIM_PREFIX] + parts[1] + [EOS]


def test_fim_is_deterministic_per_document_from_the_seed(tmp_path):
    texts = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(300)]
    records = [{"text": t} for t in texts] + [{"text": texts[7]}]
    fmt = FimLmDatasetFormat(seed=11)
    url = write_jsonl(tmp_path / "s.jsonl", records)
    build(str(tmp_path / "a"), [url], fmt)
    build(str(tmp_path / "b"), [url], fmt, num_workers=2, chunk_bytes=512, commit_interval_s=0.0)
    assert cache_bytes(str(tmp_path / "a")) == cache_bytes(str(tmp_path / "b"))
    a = TokenCache(str(tmp_path / "a"))
    assert a[7].tolist() == a[300].tolist()  # the same document, the same transform
    draws = [fmt.draw(t) for t in texts]
    transformed = [d for d in draws if d is not None]
    assert 100 < len(transformed) < 200  # fim_rate 0.5 of 300
    assert 40 < sum(spm for spm, _, _ in transformed) < len(transformed) - 40  # spm_rate 0.5
    assert all(0 <= lo <= hi <= len(t) for t, d in zip(texts, draws) if d for _, lo, hi in [d])
    other = [FimLmDatasetFormat(seed=12).draw(t) for t in texts]
    assert other != draws and [FimLmDatasetFormat(seed=11).draw(t) for t in texts] == draws


def test_fim_needs_the_sentinel_tokens(tmp_path):
    with pytest.raises(ValueError, match="no token '<fim_hole>' .fim_middle_tok."):
        encoder_for(FimLmDatasetFormat(fim_middle_tok="<fim_hole>"))
    with pytest.raises(ValueError, match="fim_rate must be a probability"):
        FimLmDatasetFormat(fim_rate=1.5)


# bad records, both policies

GOOD = {
    "supervised": [{"prompt": f"question {i}", "response": f" answer {i}"} for i in range(4)],
    "chat": [{"messages": CHAT[:2]} for _ in range(4)],
    "fim": [{"text": f"code {i}"} for i in range(4)],
}
FORMATS = {
    "supervised": SupervisedLmDatasetFormat(),
    "chat": ChatLmDatasetFormat(chat_template=TEMPLATE + "{% if messages[0]['content'] == 'boom' %}{{ raise_exception('no boom') }}{% endif %}"),
    "fim": FimLmDatasetFormat(),
}
BAD = {  # case: (format, reason, record)
    "supervised-missing-completion": ("supervised", "missing_field", {"prompt": "q"}),
    "supervised-prompt-not-a-string": ("supervised", "wrong_type", {"prompt": ["q"], "response": "a"}),
    "supervised-empty-completion": ("supervised", "empty_document", {"prompt": "q", "response": ""}),
    "chat-missing-messages": ("chat", "missing_field", {"conversation": CHAT}),
    "chat-messages-not-a-list": ("chat", "wrong_type", {"messages": "Hi"}),
    "chat-content-not-a-string": ("chat", "wrong_type", {"messages": [{"role": "user", "content": 5}]}),
    "chat-message-without-content": ("chat", "missing_field", {"messages": [{"role": "user"}]}),
    "chat-no-assistant-turn": ("chat", "no_assistant_span", {"messages": [{"role": "user", "content": "Hi"}]}),
    "chat-template-raises": ("chat", "template_error", {"messages": [{"role": "user", "content": "boom"}]}),
    "fim-missing-text": ("fim", "missing_field", {"content": "x"}),
    "fim-text-not-a-string": ("fim", "wrong_type", {"text": 3}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_raise_naming_file_line_and_reason(tmp_path, case):
    fmt_name, reason, record = BAD[case]
    lines = [json.dumps(r).encode() for r in GOOD[fmt_name]]
    url = write_lines(tmp_path / "s.jsonl", lines[:2] + [json.dumps(record).encode()] + lines[2:])
    with pytest.raises(BadInputError) as err:
        build(str(tmp_path / "c"), [url], FORMATS[fmt_name])
    assert f"{url}, line 3: {reason}" in str(err.value) and "on_error: skip" in str(err.value)
    assert TokenCache(str(tmp_path / "c")).num_rows() == 0  # the chunk with the bad record is not committed


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_are_skipped_and_counted(tmp_path, case, caplog):
    fmt_name, reason, record = BAD[case]
    records = GOOD[fmt_name][:2] + [record] + GOOD[fmt_name][2:]
    with caplog.at_level(logging.WARNING):
        cache, stats = built(tmp_path, FORMATS[fmt_name], records, on_error="skip")
    assert stats["documents"] == cache.num_rows() == 4 and stats["records"] == 5
    assert stats["skipped_by_reason"] == {reason: 1}
    assert "line 3" in caplog.text
    if cache.has_loss_spans:  # the spans stay aligned with their rows around the skipped record
        assert all(target_mask(cache, r).any() for r in range(4))


def test_plain_text_shards_need_a_text_format(tmp_path):
    (tmp_path / "doc.txt").write_text("x = 1\n")
    stats = build(str(tmp_path / "fim"), [str(tmp_path / "doc.txt")], FimLmDatasetFormat(fim_rate=1.0))
    assert stats["documents"] == 1
    stats = build(str(tmp_path / "sup"), [str(tmp_path / "doc.txt")], SupervisedLmDatasetFormat(), on_error="skip")
    assert stats["skipped_by_reason"] == {"wrong_type": 1}


def test_pretokenized_records_in_a_masked_format_train_on_every_token(tmp_path):
    cache, stats = built(tmp_path, SupervisedLmDatasetFormat(), [{"input_ids": [5, 6, 7]}, GOOD["supervised"][0]])
    assert cache[0].tolist() == [5, 6, 7] and target_mask(cache, 0).all()
    assert not target_mask(cache, 1).all() and target_mask(cache, 1)[-1]


# prebuilt (newer Levanter)


def test_prebuilt_records_are_stored_as_given_and_train_where_their_loss_weights_say(tmp_path):
    fmt = PrebuiltLmDatasetFormat(input_ids_key="ids", loss_weights_key="w")
    records = [{"ids": [10, 11, 12, 13, 14], "w": [0, 0, 1, 1, 0]}, {"ids": [7, 8], "w": [1.0, 1.0], "extra": "kept aside"}]
    cache, stats = built(tmp_path, fmt, records)
    assert cache[0].tolist() == [10, 11, 12, 13, 14] and cache[1].tolist() == [7, 8]  # no BOS/EOS added, as Levanter
    # the loss at position i predicts token i + 1: weights [0, 0, 1, 1, 0] train tokens 13 and 14
    assert target_mask(cache, 0).tolist() == [False, False, False, True, True]
    assert target_mask(cache, 1).tolist() == [True, True]
    plain, _ = built(tmp_path, PrebuiltLmDatasetFormat(), [{"input_ids": [3, 4, 5]}], name="plain")
    assert plain[0].tolist() == [3, 4, 5] and not plain.has_loss_spans


@pytest.mark.parametrize("record, problem", [
    ({"ids": [1, 2], "w": [0.5, 1]}, "loss weights must be 0 or 1"),
    ({"ids": [1, 2], "w": [1]}, "has 1 weights for 2 tokens"),
    ({"ids": [1, 99999], "w": [1, 1]}, "ids outside"),
    ({"ids": [], "w": []}, "non-empty list of integers"),
])
def test_prebuilt_records_that_cannot_be_stored_are_bad_records(tmp_path, record, problem):
    url = write_jsonl(tmp_path / "bad.jsonl", [record])
    with pytest.raises(Exception, match=problem):
        build(str(tmp_path / "c"), [url], PrebuiltLmDatasetFormat(input_ids_key="ids", loss_weights_key="w"))


@pytest.mark.parametrize("weights", [["a", 1], ["1", "0"], [{"w": 1}, 0], [[1], [0]]])
def test_prebuilt_loss_weights_that_are_not_numbers_are_skipped_as_bad_records_naming_the_field(tmp_path, weights):
    fmt = PrebuiltLmDatasetFormat(input_ids_key="ids", loss_weights_key="w")
    cache, stats = built(tmp_path, fmt, [{"ids": [5, 6], "w": weights}, {"ids": [7, 8], "w": [1, 1]}], on_error="skip")
    assert stats["skipped_by_reason"] == {"wrong_type": 1} and cache.num_rows() == 1 and cache[0].tolist() == [7, 8]
    url = write_jsonl(tmp_path / "bad.jsonl", [{"ids": [5, 6], "w": weights}])
    with pytest.raises(Exception, match="'w' must be a list of 0s and 1s"):
        build(str(tmp_path / "raise"), [url], fmt)


@pytest.mark.parametrize("fmt", [TextLmDatasetFormat(), PrebuiltLmDatasetFormat()])
@pytest.mark.parametrize("huge", [2**63, 2**64 - 1])
def test_token_ids_too_large_for_64_bits_are_skipped_as_out_of_range(tmp_path, fmt, huge):
    cache, stats = built(tmp_path, fmt, [{"input_ids": [5, huge]}, {"input_ids": [7, 8]}], on_error="skip")
    assert stats["skipped_by_reason"] == {"token_out_of_range": 1} and cache.num_rows() == 1 and cache[0].tolist() == [7, 8]


def test_a_prebuilt_source_makes_one_example_per_record_unless_it_packs(tmp_path):
    url = write_jsonl(tmp_path / "p.jsonl", [{"input_ids": list(range(2, 2 + n))} for n in (5, 3, 7)])
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "c"),
                                        "configs": {"p": {"train_urls": [url], "format": {"type": "prebuilt"}}}})
    build_caches(config, progress=False)
    batch = config.train_set(6).source("p").base.get_batch([0, 1, 2])
    assert batch.tokens.tolist() == [[2, 3, 4, 5, 6, 1], [2, 3, 4, 1, 1, 1], [2, 3, 4, 5, 6, 7]]


# chat: newer Levanter's per-record fields


def test_chat_reads_a_records_system_prompt_and_template_variables(tmp_path, hf_tokenizer):
    template = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
                "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}{% if persona %}persona: {{ persona }}{% endif %}")
    fmt = ChatLmDatasetFormat(chat_template=template, system_prompt="system")
    records = [{"messages": CHAT[:2], "system": "Be brief.", "chat_template_kwargs": {"persona": "terse", "add_generation_prompt": True}},
               {"messages": CHAT[:2], "system": {"content": "Be kind."}},
               {"messages": CHAT[:2]}]
    cache, _ = built(tmp_path, fmt, records)
    hf = hf_tokenizer
    texts = [hf.decode(cache[i].tolist()) for i in range(3)]
    assert texts[0] == "<|system|>Be brief.<|user|>Hi<|assistant|>Hello!persona: terse"  # trim_blocks, as Hugging Face renders
    assert texts[1] == "<|system|>Be kind.<|user|>Hi<|assistant|>Hello!"
    assert texts[2] == "<|user|>Hi<|assistant|>Hello!"
    assert hf.decode(cache[0][target_mask(cache, 0)].tolist()) == "Hello!"
    ignoring = ChatLmDatasetFormat(chat_template=template, chat_template_kwargs=None)
    assert ignoring.identity() != ChatLmDatasetFormat(chat_template=template).identity()
    assert "system_prompt" not in ignoring.identity() and fmt.identity()["system_prompt"] == "system"


def test_template_variables_may_not_override_how_the_template_is_applied(tmp_path):
    url = write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT, "chat_template_kwargs": {"tokenize": True}}])
    with pytest.raises(Exception, match="may not set 'tokenize'"):
        build(str(tmp_path / "c"), [url], ChatLmDatasetFormat(chat_template=TEMPLATE))


# the cache


def test_loss_spans_survive_appends_and_worker_counts(tmp_path):
    records = [{"prompt": f"Question number {i}: " + "why? " * (i % 7), "response": f" Because {i}." * (1 + i % 3)} for i in range(400)]
    urls = [write_jsonl(tmp_path / f"s{k}.jsonl", records[k * 200 : (k + 1) * 200]) for k in range(2)]
    fmt = SupervisedLmDatasetFormat()
    build(str(tmp_path / "once"), urls, fmt, chunk_bytes=2048)
    build(str(tmp_path / "grown"), urls[:1], fmt)
    grown = build(str(tmp_path / "grown"), urls, fmt)  # resumes: the spans continue where the first shard's ended
    build(str(tmp_path / "workers"), urls, fmt, num_workers=2, chunk_bytes=1024, commit_interval_s=0.0)
    once = cache_bytes(str(tmp_path / "once"))
    assert any(k.startswith("loss_spans/") for k in once)
    assert cache_bytes(str(tmp_path / "grown")) == once == cache_bytes(str(tmp_path / "workers"))
    cache = TokenCache(str(tmp_path / "once"))
    rows, begin, end = cache.loss_spans(0, cache.num_rows())
    assert rows.tolist() == list(range(400))
    lengths = np.diff(cache.row_bounds(0, 400))
    assert np.all(end == lengths) and np.all(begin < end)
    assert grown["loss_valid_tokens"] == int((end - begin).sum())
    assert grown["masked_tokens"] == grown["tokens"] - grown["loss_valid_tokens"]


def test_token_sequences_never_train_on_prompts_or_across_documents(tmp_path):
    records = [{"prompt": f"Prompt {i} " + "x " * i, "response": f" reply {i}" + " y" * (i % 5)} for i in range(60)]
    cache, _ = built(tmp_path, SupervisedLmDatasetFormat(), records)
    bounds = cache.row_bounds(0, cache.num_rows())
    targets = np.concatenate([target_mask(cache, r) for r in range(cache.num_rows())])
    doc = np.searchsorted(bounds, np.arange(bounds[-1]), side="right") - 1
    ds = TokenSeqDataset(cache, 37)
    batch = ds.get_batch(np.arange(len(ds)))
    for row in range(len(ds)):
        at = np.arange(row * 37, row * 37 + 37)
        expected = np.append((doc[at[1:]] == doc[at[:-1]]) & targets[at[1:]], False)
        assert np.array_equal(batch.loss_mask[row], expected)


def test_format_options_are_part_of_the_cache_identity(tmp_path):
    yaml_text = f"""
tokenizer: {TOKENIZER}
cache_dir: {tmp_path / 'caches'}
build: {{num_workers: 0}}
configs:
  sft:
    train_urls: ["{write_jsonl(tmp_path / 'sft.jsonl', GOOD['supervised'])}"]
    format: {{type: supervised, separate_with: "\\n", max_seq_length: 64}}
  chat:
    train_urls: ["{write_jsonl(tmp_path / 'chat.jsonl', GOOD['chat'])}"]
    format:
      type: chat
      chat_template: {json.dumps(TEMPLATE)}
  code:
    train_urls: ["{write_jsonl(tmp_path / 'code.jsonl', GOOD['fim'])}"]
    format: {{type: fim, fim_rate: 0.9, spm_rate: 0.1, seed: 5}}
"""
    config = draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(yaml_text))
    assert config.configs["sft"].format == SupervisedLmDatasetFormat(separate_with="\n", max_seq_length=64)
    assert config.configs["chat"].format == ChatLmDatasetFormat(chat_template=TEMPLATE)
    assert config.configs["code"].format == FimLmDatasetFormat(fim_rate=0.9, spm_rate=0.1, seed=5)
    build_caches(config, progress=False)
    identity = open_cache(config, "sft").identity
    assert identity["format"]["type"] == "supervised" and identity["loss_spans"] is True and "pack" not in identity["format"]
    assert open_cache(config, "chat").identity["eos_id"] is None  # the template places EOS
    for name, change in (("sft", {"separate_with": " "}), ("code", {"seed": 6}), ("chat", {"mask_user_turns": False})):
        with pytest.raises(CacheMismatchError, match="format"):
            open_cache(with_format(config, name, **change), name)
    # `pack` chooses how the cache is read, not what it holds: the same cache opens
    open_cache(with_format(config, "sft", pack=False), "sft")
    with pytest.raises(CacheMismatchError):
        open_cache(with_format(config, "code", TextLmDatasetFormat()), "code")


@pytest.mark.parametrize("written", ["false", "true"])
def test_a_boolean_separate_with_is_refused_not_read_as_token_id_0_or_1(tmp_path, written):
    """draccus reads a YAML boolean as the int it is: ``separate_with: false`` meant no separator and put token id 0
    (EOS here) between every prompt and completion."""
    config = tmp_path / "sft.yaml"
    config.write_text(f"""tokenizer: {TOKENIZER}
cache_dir: {tmp_path / 'caches'}
configs:
  sft:
    train_urls: ["{write_jsonl(tmp_path / 'sft.jsonl', GOOD['supervised'])}"]
    format: {{type: supervised, separate_with: {written}}}
""")
    with pytest.raises(tokenmix.ConfigError, match=rf"{config}.*separate_with is {written}, not a separator; leave it out"):
        tokenmix.load_data_config(config)
    assert SupervisedLmDatasetFormat(separate_with=0).separate_with == 0  # a token id 0 given as a number stays one
