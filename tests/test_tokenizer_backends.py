"""The tokenizer backend seam: ``fastokens`` where it gives exactly ``tokenizers``' ids, ``tokenizers`` otherwise.

Caches built with either backend are byte-identical, on the bundled corpus (and the full shared corpus where it is
present), with every format, and with tokenizers trained here of the kinds users bring (byte-level BPE, BPE with an
NFKC normalizer, Unigram, WordPiece, added special tokens written in the text). Where ``fastokens`` cannot load a
tokenizer or gives other ids, the build falls back to ``tokenizers`` and says why, in the log and in stats.json.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import DEMO_CORPUS, REPO, TOKENIZER, cache_bytes, read_jsonl_zst, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from tokenmix import (
    BuildOptions,
    ChatLmDatasetFormat,
    FimLmDatasetFormat,
    LMDatasetSourceConfig,
    LMMixtureDatasetConfig,
    SupervisedLmDatasetFormat,
    TextLmDatasetFormat,
    TokenCache,
    build_caches,
)
from tokenmix.cache.backend_choice import sample_verdict_key
from tokenmix.formats.backends import (
    BackendChoice,
    FastBackendUnavailable,
    char_offsets,
    choose_backend,
    fast_ids,
    load_fast,
    load_reference,
    probe_texts,
)
from tokenmix.formats.probe_verdicts import verdict_key
from tokenmix.formats.tokenizer_facts import tokenizer_facts
from tokenmix.sources.shards import PlainText, RawChunk

SOURCES = ("linux_doc", "python_doc", "webster")
SHARED_CORPUS = REPO.parent / "shared" / "corpus"
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>\n"
    "{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endif %}{% endfor %}"
)
SPECIALS = ("<|endoftext|>", "<|pad|>", "[SPECIAL]")
"""Added special tokens of the trained tokenizers; the test documents write them inside their text."""


def _texts() -> list[str]:
    return [r["text"] for s in SOURCES for r in read_jsonl_zst(DEMO_CORPUS / s / "train-00-of-02.jsonl.zst")[:60]]


def _records() -> list[dict[str, str]]:
    """Real documents, some with special tokens written in them, Unicode that normalizers change, and odd spacing."""
    texts = _texts()[:90]
    texts += [f"before {SPECIALS[0]} after", f"{SPECIALS[2]}glued{SPECIALS[0]}", "ﬁne ligatures ①２ ÀÉÎ naïve", "tabs\tand  double  spaces\n"]
    return [{"text": t} for t in texts]


def _save(tokenizer: Tokenizer, path: Path) -> str:
    """A tokenizer directory ``AutoTokenizer`` loads, with ``<|endoftext|>`` as its EOS."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=SPECIALS[0], pad_token=SPECIALS[1]).save_pretrained(path)
    return str(path)


def _trained(kind: str, path: Path) -> str:
    unk = "[UNK]"
    special = [unk, *SPECIALS]
    if kind == "byte_level_bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "bpe_nfkc":
        tok = Tokenizer(models.BPE(unk_token=unk))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=special)
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        # a seed vocabulary of 20,000 pieces (not a million), halved each round (not cut by a quarter): 5 CPU-s to train, not 16
        trainer = trainers.UnigramTrainer(vocab_size=1500, special_tokens=special, unk_token=unk, seed_size=20_000, shrinking_factor=0.5)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=1500, special_tokens=special)
    elif kind == "bpe_dropout":  # a BPE that merges at random: no second encoder can reproduce its ids
        tok = Tokenizer(models.BPE(dropout=0.5))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        raise ValueError(kind)
    tok.train_from_iterator(_texts(), trainer)
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return _save(tok, path / kind)


def _config(tmp_path: Path, name: str, tokenizer: str, sources: dict[str, list[str]], backend: str, fmt=None,
            **build) -> LMMixtureDatasetConfig:
    return LMMixtureDatasetConfig(
        tokenizer=tokenizer,
        cache_dir=str(tmp_path / name),
        configs={s: LMDatasetSourceConfig(train_urls=urls, format=fmt or TextLmDatasetFormat()) for s, urls in sources.items()},
        build=BuildOptions(tokenizer_backend=backend, **build),
    )


def _build_each_backend(tmp_path: Path, tokenizer: str, sources: dict[str, list[str]], **build) -> dict[str, dict]:
    """Build the same sources with each backend choice; returns each build's statistics per source."""
    return {backend: {s: stats for (s, _), stats in build_caches(_config(tmp_path, backend, tokenizer, sources, backend, **build),
                                                                  progress=False).items()}
            for backend in ("tokenizers", "auto", "fastokens")}


def _assert_identical(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    for source in sources:
        reference = cache_bytes(str(tmp_path / "tokenizers" / source / "train"))
        for backend in ("auto", "fastokens"):
            assert cache_bytes(str(tmp_path / backend / source / "train")) == reference, (backend, source)


def _backend(stats: dict) -> dict:
    return stats["build"]["tokenizer_backend"]


def test_caches_built_with_either_backend_are_byte_identical_on_the_bundled_corpus(tmp_path):
    sources = {s: sorted(glob.glob(str(DEMO_CORPUS / s / "train-*"))) for s in SOURCES}
    stats = _build_each_backend(tmp_path, TOKENIZER, sources, num_workers=2)
    _assert_identical(tmp_path, sources)
    for source in SOURCES:
        assert _backend(stats["tokenizers"][source])["name"] == "tokenizers"
        assert _backend(stats["auto"][source])["name"] == "fastokens"
        assert _backend(stats["auto"][source])["reason"].endswith(" and the probes encode identically")
        assert " records sampled from " in _backend(stats["auto"][source])["reason"]
        assert _backend(stats["fastokens"][source])["name"] == "fastokens"
        assert stats["auto"][source]["tokens"] == stats["tokenizers"][source]["tokens"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_CORPUS.is_dir(), reason="the full shared corpus is not beside this checkout")
def test_caches_built_with_either_backend_are_byte_identical_on_the_shared_corpus(tmp_path):
    sources = {s: sorted(glob.glob(str(SHARED_CORPUS / s / "train-*"))) for s in SOURCES}
    _build_each_backend(tmp_path, TOKENIZER, sources)
    _assert_identical(tmp_path, sources)


@pytest.mark.parametrize("fmt", [SupervisedLmDatasetFormat(separate_with="<|endoftext|>"), FimLmDatasetFormat(fim_rate=0.7)],
                         ids=["supervised", "fim"])
def test_formats_made_of_pieces_encode_them_with_the_fast_backend_to_the_same_bytes(tmp_path, fmt):
    texts = _texts()
    if isinstance(fmt, SupervisedLmDatasetFormat):
        records = [{"prompt": a[:300], "response": b[:300]} for a, b in zip(texts[::2], texts[1::2])]
    else:
        records = [{"text": t} for t in texts]
    url = write_jsonl(tmp_path / "records.jsonl", records)
    stats = {}
    for backend in ("tokenizers", "auto"):
        config = _config(tmp_path, backend, TOKENIZER, {"s": [url]}, backend, fmt, num_workers=2)
        stats[backend] = build_caches(config, progress=False)[("s", "train")]
    assert _backend(stats["auto"])["name"] == "fastokens"
    assert stats["auto"]["loss_valid_tokens"] == stats["tokenizers"]["loss_valid_tokens"] > 0
    assert cache_bytes(str(tmp_path / "auto" / "s" / "train")) == cache_bytes(str(tmp_path / "tokenizers" / "s" / "train"))


def test_special_tokens_written_in_the_text_come_out_as_hugging_face_encodes_them(tmp_path, hf_tokenizer):
    texts = ["a document that mentions <|endoftext|> inside it", "<|endoftext|>", "two<|endoftext|><|endoftext|>glued"]
    url = write_jsonl(tmp_path / "special.jsonl", [{"text": t} for t in texts])
    for backend in ("fastokens", "tokenizers"):
        build_caches(_config(tmp_path, backend, TOKENIZER, {"s": [url]}, backend, num_workers=0), progress=False)
        cache = TokenCache(str(tmp_path / backend / "s" / "train"))
        expected = [hf_tokenizer.encode(t, add_special_tokens=False) + [hf_tokenizer.eos_token_id] for t in texts]
        assert [cache[i].tolist() for i in range(len(texts))] == expected
        assert expected[1] == [0, 0]  # the text's own <|endoftext|> is the special id, not its characters


@pytest.mark.parametrize("kind", ["byte_level_bpe", "bpe_nfkc", "unigram", "wordpiece"])
def test_tokenizers_trained_here_build_identical_caches_and_fall_back_where_fastokens_cannot_load_them(tmp_path, kind, caplog):
    tokenizer = _trained(kind, tmp_path)
    url = write_jsonl(tmp_path / "records.jsonl.zst", _records())
    with caplog.at_level(logging.INFO, logger="tokenmix.cache.backend_choice"):
        stats = {backend: build_caches(_config(tmp_path, backend, tokenizer, {"s": [url]}, backend, num_workers=2), progress=False)
                 for backend in ("tokenizers", "auto")}
    assert cache_bytes(str(tmp_path / "auto" / "s" / "train")) == cache_bytes(str(tmp_path / "tokenizers" / "s" / "train"))
    chosen = _backend(stats["auto"][("s", "train")])
    said = [r for r in caplog.records if "encoding with" in r.getMessage() and "/auto/" in r.getMessage()]
    assert len(said) == 1
    if kind == "byte_level_bpe":
        assert chosen["name"] == "fastokens"
    else:
        assert chosen["name"] == "tokenizers" and "fastokens cannot load this tokenizer" in chosen["reason"]
        assert said[0].levelno == logging.WARNING and chosen["reason"] in said[0].getMessage()
        with pytest.raises(FastBackendUnavailable, match="build.tokenizer_backend: auto"):
            build_caches(_config(tmp_path, "forced", tokenizer, {"s": [url]}, "fastokens", num_workers=0), progress=False)


def test_a_fast_backend_that_gives_other_ids_is_not_used_and_the_log_says_where_it_differs(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path / "remembered"))
    tokenizer = _trained("bpe_dropout", tmp_path)
    url = write_jsonl(tmp_path / "records.jsonl", _records())
    with caplog.at_level(logging.INFO, logger="tokenmix.cache.backend_choice"):
        stats = build_caches(_config(tmp_path, "auto", tokenizer, {"s": [url]}, "auto", num_workers=0), progress=False)
    chosen = _backend(stats[("s", "train")])
    assert chosen["name"] == "tokenizers" and chosen["reason"].startswith("fastokens differs from tokenizers: ")
    assert "tokenizers gives [" in chosen["reason"] and ", fastokens [" in chosen["reason"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "encoding with tokenizers" in r.getMessage()]
    assert len(warnings) == 1 and "fastokens differs" in warnings[0]
    assert not list((tmp_path / "remembered").rglob("*.probes.json")), "a tokenizer that encodes at random is probed every time"


def test_the_check_covers_every_added_token_written_inside_text_and_the_sample():
    spec = json.loads(Path(TOKENIZER, "tokenizer.json").read_text())
    tokenizer_json = json.dumps(spec)
    probes = probe_texts(tokenizer_json)
    for token in spec["added_tokens"]:
        assert any(token["content"] in p and p != token["content"] for p in probes), token["content"]
    choice = choose_backend(tokenizer_json, "auto", lambda: None, "2 records sampled from x")
    assert choice.name == "fastokens" and choice.reason == "2 records sampled from x and the probes encode identically"
    differing = choose_backend(tokenizer_json, "auto", lambda: "tokens differ at 7", "2 records sampled from x")
    assert differing == BackendChoice("tokenizers", "fastokens differs from tokenizers: tokens differ at 7")
    assert choose_backend(tokenizer_json, "tokenizers", lambda: None, "").name == "tokenizers"


def _build_in_a_new_process(tmp_path: Path, name: str, inputs: list[str], remembered: Path) -> dict:
    """A cold ``auto`` build of ``inputs`` into a new cache, remembering in ``remembered``: its backend choice, whether
    it loaded ``tokenizers``, and how many times it derived the tokenizer's facts from its parsed serialization."""
    config = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / name), "configs": {"s": {"train_urls": inputs}}}
    code = ("import json, sys, tokenmix\n"
            "from tokenmix.formats import tokenizer_facts as facts\n"
            "derive, parsed = facts._derive, []\n"
            "facts._derive = lambda spec: parsed.append(1) or derive(spec)\n"
            "stats = tokenmix.build_caches(tokenmix.load_data_config(json.loads(sys.argv[1])), progress=False)\n"
            "print(json.dumps({**stats['s', 'train']['build']['tokenizer_backend'], 'tokenizers': 'tokenizers' in sys.modules,\n"
            "                  'parsed': len(parsed)}))")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TOKENMIX_CACHE_DIR": str(remembered)})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_build_whose_sample_was_checked_before_takes_the_verdict_and_loads_no_tokenizers(tmp_path):
    """The sample's half of the check costs a cold build ``tokenizers``' load and two encodings of the sample; a build of
    a sample checked before on this machine (same records, spec, libraries and code) takes the remembered verdict, a
    difference remembered included, and another sample is checked again."""
    remembered = tmp_path / "remembered"
    url = write_jsonl(tmp_path / "records.jsonl", _records())
    first = _build_in_a_new_process(tmp_path, "first", [url], remembered)
    assert first["name"] == "fastokens" and first["tokenizers"] and "checked by an earlier build" not in first["reason"]
    verdicts = list(remembered.rglob("*.sample.json"))
    assert len(verdicts) == 1 and json.loads(verdicts[0].read_text()) == {"difference": None}

    again = _build_in_a_new_process(tmp_path, "again", [url], remembered)
    assert again["name"] == "fastokens" and not again["tokenizers"], again
    assert "(checked by an earlier build on this machine) and the probes encode identically" in again["reason"]

    verdicts[0].write_text(json.dumps({"difference": "a difference planted in the remembered verdict"}))
    planted = _build_in_a_new_process(tmp_path, "planted", [url], remembered)
    assert (planted["name"], planted["reason"]) == ("tokenizers", "fastokens differs from tokenizers: a difference planted in the "
                                                    "remembered verdict")
    verdicts[0].write_text('{"difference": ')  # cut short (a crash while it was written): checked again, and rewritten
    rechecked = _build_in_a_new_process(tmp_path, "rechecked", [url], remembered)
    assert rechecked["name"] == "fastokens" and rechecked["tokenizers"]
    assert json.loads(verdicts[0].read_text()) == {"difference": None}

    other = write_jsonl(tmp_path / "other.jsonl", [{"text": "one more document first"}, *_records()])
    changed = _build_in_a_new_process(tmp_path, "changed", [other], remembered)
    assert changed["name"] == "fastokens" and changed["tokenizers"] and "checked by an earlier build" not in changed["reason"]
    assert len(list(remembered.rglob("*.sample.json"))) == 2


FAST_THREADS_AFTER_A_BUILD = """
import json, os, sys, tokenmix
config = tokenmix.load_data_config(json.loads(sys.argv[1]))
stats = tokenmix.build_caches(config, progress=False)
def name(task):
    try:
        with open(f"/proc/self/task/{task}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:  # a thread that ended after the listing (the build's own, winding down)
        return ""
names = [name(t) for t in os.listdir("/proc/self/task")]
print(json.dumps({"backend": stats["s", "train"]["build"]["tokenizer_backend"]["name"], "cores": os.cpu_count(),
                  "setting": os.environ.get("FASTOKENS_BPE_THREADS"), "own": sum(name.startswith("fastokens") for name in names)}))
"""


@pytest.mark.parametrize(("workers", "given"), [(None, None), (1, None), (0, None), (None, "2")])
def test_a_pool_of_encoding_threads_gives_each_its_share_of_the_cores_not_fastokens_own_threads_beside_them(tmp_path, workers, given):
    """``fastokens`` spreads a batch over every core with threads of its own; beside a pool thread per core they only
    spun (0.13 s of CPU in the shared corpus's cold build on 2 cores). A pool of N threads gives each ``cores // N``
    (``FASTOKENS_BPE_THREADS``, read at the first encoding); a build in the calling thread leaves ``fastokens`` its own
    (every core it may run on: 2, under ``taskset``), and a user's setting is kept."""
    url = write_jsonl(tmp_path / "records.jsonl", _records())
    config = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "configs": {"s": {"train_urls": [url]}},
              "build": {"tokenizer_backend": "fastokens", **({} if workers is None else {"num_workers": workers})}}
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"} | ({} if given is None else {"FASTOKENS_BPE_THREADS": given})
    run = subprocess.run(["taskset", "-c", "0,1", sys.executable, "-c", FAST_THREADS_AFTER_A_BUILD, json.dumps(config)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    pool = got["cores"] if workers is None else workers
    setting = given or (str(max(1, got["cores"] // pool)) if pool else None)
    assert got["backend"] == "fastokens" and got["setting"] == setting, got
    assert got["own"] == int(setting or 2) - 1, got  # it encodes in its caller too, beside (threads - 1) of its own


def test_a_cold_build_takes_the_tokenizer_s_facts_remembered_and_parses_no_serialization(tmp_path):
    """Parsing the serialization (2 MB here) for what the encoders and the check read of it held the GIL for 20-30 ms of
    a cold build's start; a build of a tokenizer whose facts were derived before on this machine reads them back."""
    remembered = tmp_path / "remembered"
    url = write_jsonl(tmp_path / "records.jsonl", _records())
    first = _build_in_a_new_process(tmp_path, "first", [url], remembered)
    assert first["name"] == "fastokens" and first["parsed"] == 1, first
    assert len(list(remembered.rglob("*.facts.json"))) == 1
    again = _build_in_a_new_process(tmp_path, "again", [url], remembered)
    assert again["name"] == "fastokens" and again["parsed"] == 0, again
    assert cache_bytes(str(tmp_path / "again" / "s" / "train")) == cache_bytes(str(tmp_path / "first" / "s" / "train"))


@pytest.mark.parametrize("damage", ["cut", "types", "base64", "length"])
def test_remembered_tokenizer_facts_that_are_damaged_are_derived_again_and_rewritten(tmp_path, monkeypatch, damage):
    """A facts file cut short by a crash, or holding what no version wrote, is never taken: the facts are derived from
    the serialization again, equal to those first derived, and the file is written again; another serialization (a BPE
    with dropout here) has facts of its own."""
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path))
    spec = json.loads(Path(TOKENIZER, "tokenizer.json").read_text())
    tokenizer_json = json.dumps(spec)

    def fresh(serialization: str):
        tokenizer_facts.cache_clear()
        return tokenizer_facts(serialization)

    derived = fresh(tokenizer_json)
    assert not derived.encodes_at_random and derived.exact_split and "<|endoftext|>" in derived.added_tokens
    ids = [*spec["model"]["vocab"].values(), *(t["id"] for t in spec["added_tokens"])]
    assert derived.byte_lengths is not None and len(derived.byte_lengths) == max(ids) + 1
    (path,) = tmp_path.rglob("*.facts.json")
    written = path.read_text()
    damaged = json.loads(written)
    if damage == "cut":
        path.write_text(written[: len(written) // 2])
    else:
        damaged.update({"types": {"exact_split": "yes"}, "base64": {"byte_lengths": "not base64!"},
                        "length": {"byte_lengths": "AAAA"}}[damage])
        path.write_text(json.dumps(damaged))
    again = fresh(tokenizer_json)
    assert (again.encodes_at_random, again.added_tokens, again.exact_split) == (False, derived.added_tokens, True)
    assert np.array_equal(again.byte_lengths, derived.byte_lengths) and again.byte_lengths.dtype == np.int64
    assert path.read_text() == written
    assert fresh(tokenizer_json).byte_lengths.tolist() == derived.byte_lengths.tolist()  # read back, as derived

    spec["model"]["dropout"] = 0.1
    assert fresh(json.dumps(spec)).encodes_at_random and len(list(tmp_path.rglob("*.facts.json"))) == 2


def test_the_remembered_facts_of_a_byte_level_bpe_with_no_tokens_are_read_back(tmp_path, monkeypatch):
    """A byte-level BPE with an empty vocabulary and no added tokens has byte lengths for no id (an empty array): its
    facts file is read back as such, not taken for a damaged one and derived and written again at every build."""
    monkeypatch.setenv("TOKENMIX_CACHE_DIR", str(tmp_path))
    empty = Tokenizer(models.BPE(vocab={}, merges=[]))
    empty.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    serialization = empty.to_str()
    tokenizer_facts.cache_clear()
    derived = tokenizer_facts(serialization)
    assert derived.byte_lengths is not None and len(derived.byte_lengths) == 0
    (path,) = tmp_path.rglob("*.facts.json")
    written = path.stat().st_ino
    tokenizer_facts.cache_clear()
    again = tokenizer_facts(serialization)
    assert path.stat().st_ino == written, "the remembered facts were derived and written again"
    assert again.byte_lengths is not None and len(again.byte_lengths) == 0 and again.byte_lengths.dtype == np.int64
    assert (again.encodes_at_random, again.added_tokens, again.exact_split) == (False, (), derived.exact_split)


def test_a_remembered_sample_verdict_is_keyed_by_all_that_decides_the_sample_s_encoding(tmp_path):
    spec, _ = _config(tmp_path, "c", TOKENIZER, {"s": ["unread.jsonl"]}, "auto").encoder_spec(TextLmDatasetFormat(), "source 's'")
    records = [b'{"text": "a document"}', b'{"text": "another"}']
    key = sample_verdict_key(spec, RawChunk(0, records))
    assert key == sample_verdict_key(dataclasses.replace(spec, backend="fastokens"), RawChunk(0, list(records)))
    others = {sample_verdict_key(spec, RawChunk(1, records)), sample_verdict_key(spec, RawChunk(0, records[:1])),
              sample_verdict_key(spec, RawChunk(0, [b'{"text": "a Document"}', records[1]])),
              sample_verdict_key(spec, RawChunk(0, [PlainText(records[0]), records[1]])),
              sample_verdict_key(dataclasses.replace(spec, format=TextLmDatasetFormat(text_key="body")), RawChunk(0, records)),
              sample_verdict_key(dataclasses.replace(spec, eos_id=None), RawChunk(0, records)),
              sample_verdict_key(dataclasses.replace(spec, tokenizer_json=spec.tokenizer_json.replace('"BPE"', '"BPE" ')), RawChunk(0, records))}
    assert key not in others and len(others) == 7
    assert sample_verdict_key(spec, RawChunk(0, [{"text": "a parsed row"}])) is None
    dropout = json.loads(spec.tokenizer_json)
    dropout["model"]["dropout"] = 0.1
    assert sample_verdict_key(dataclasses.replace(spec, tokenizer_json=json.dumps(dropout)), RawChunk(0, records)) is None

    checker = tmp_path / "checker.py"
    checker.write_text("x = 1\n")
    before = verdict_key(spec.tokenizer_json, ["text"], [str(checker)], ["numpy"])
    assert before == verdict_key(spec.tokenizer_json, ["text"], [str(checker)], ["numpy"])
    checker.write_text("x = 2  # the checking code changed\n")
    assert verdict_key(spec.tokenizer_json, ["text"], [str(checker)], ["numpy"]) != before
    assert verdict_key(spec.tokenizer_json, ["text"], [str(checker)]) != verdict_key(spec.tokenizer_json, ["text"], [str(checker)], ["numpy"])
    assert verdict_key(spec.tokenizer_json, ["ab", "c"], [str(checker)]) != verdict_key(spec.tokenizer_json, ["a", "bc"], [str(checker)])


SAMPLE_KEY_IN_A_NEW_PROCESS = """
import sys
from tokenmix.cache.backend_choice import sample_verdict_key
from tokenmix.formats import TextLmDatasetFormat
from tokenmix.formats.encoder_spec import EncoderSpec
from tokenmix.sources.shards import RawChunk
spec = EncoderSpec(open(sys.argv[1]).read(), TextLmDatasetFormat(use_ftfy=True), 32000, None, 0, "uint16")
print(sample_verdict_key(spec, RawChunk(0, [b'{"text": "a document"}'])))
"""


@pytest.mark.parametrize("library", ["orjson", "ftfy", "jinja2"])
def test_a_remembered_sample_verdict_is_keyed_by_the_libraries_that_make_the_text_encoded(tmp_path, library):
    """What the sample's records become before either backend encodes them is made by libraries too: ``orjson`` parses
    the records, ``ftfy`` repairs their text (``use_ftfy``), ``jinja2`` and ``transformers`` render a chat template. Another
    installation of one of them may give the backends other text, so it is another key, and the sample is checked again."""
    shadow = tmp_path / "site"
    shadow.mkdir()
    shutil.copytree(Path(__import__(library).__file__).parent, shadow / library)

    def key(*path: Path) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), os.environ.get("PYTHONPATH", "")])}
        run = subprocess.run([sys.executable, "-c", SAMPLE_KEY_IN_A_NEW_PROCESS, str(Path(TOKENIZER, "tokenizer.json"))],
                             capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert key() == key(tmp_path / "nothing")
    assert key(shadow) != key()


PROBES_KEY_IN_A_NEW_PROCESS = """
import sys
from tokenmix.formats import backends
from tokenmix.formats.probe_verdicts import verdict_key
print(verdict_key(open(sys.argv[1]).read(), backends._PROBES, [backends.__file__]))
"""


def test_a_remembered_verdict_is_keyed_by_the_native_code_of_the_backends_not_only_their_init(tmp_path):
    """A backend rebuilt in place (``maturin develop``, a reinstall of the same version built otherwise) changes its native
    extension and leaves its ``__init__.py`` as it was: the verdict on the old build must not be taken for the new."""
    shadow = tmp_path / "site"
    shutil.copytree(Path(__import__("fastokens").__file__).parent, shadow / "fastokens", ignore=shutil.ignore_patterns("__pycache__"))

    def key() -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
        run = subprocess.run([sys.executable, "-c", PROBES_KEY_IN_A_NEW_PROCESS, str(Path(TOKENIZER, "tokenizer.json"))],
                             capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    before = key()
    native = next((shadow / "fastokens").glob("_native*.so"))
    with open(native, "ab") as f:
        f.write(b"\0" * 4096)  # another build of the extension
    assert key() != before


def _choose_in_a_new_process(tokenizer_json: Path, remembered: Path) -> BackendChoice:
    """``choose_backend`` on a serialized tokenizer (the sample agreeing) in a fresh process remembering in ``remembered``."""
    code = ("import sys; from tokenmix.formats.backends import choose_backend; "
            "choice = choose_backend(open(sys.argv[1]).read(), 'auto', lambda: None, 'no sample'); print(choice.name); print(choice.reason)")
    run = subprocess.run([sys.executable, "-c", code, str(tokenizer_json)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TOKENMIX_CACHE_DIR": str(remembered)})
    assert run.returncode == 0, run.stderr
    name, reason = run.stdout.strip().split("\n", 1)
    return BackendChoice(name, reason)


def test_the_probes_verdict_is_remembered_per_tokenizer_and_a_changed_tokenizer_is_probed_again(tmp_path):
    """A cold build's check need not encode the probes again (they depend only on the tokenizer and the two libraries):
    their verdict is read back from the machine's remembered ones, and a changed tokenizer is another key, probed again."""
    remembered = tmp_path / "remembered"
    spec = json.loads(Path(TOKENIZER, "tokenizer.json").read_text())
    original = tmp_path / "tokenizer.json"
    original.write_text(json.dumps(spec))
    assert _choose_in_a_new_process(original, remembered).name == "fastokens"
    verdicts = list(remembered.rglob("*.probes.json"))
    assert len(verdicts) == 1 and json.loads(verdicts[0].read_text()) == {"difference": None}

    verdicts[0].write_text(json.dumps({"difference": "a difference planted in the remembered verdict"}))
    assert _choose_in_a_new_process(original, remembered) == BackendChoice(
        "tokenizers", "fastokens differs from tokenizers: a difference planted in the remembered verdict")
    verdicts[0].write_text('{"difference": ')  # cut short: not a verdict, so the probes run again and it is rewritten
    assert _choose_in_a_new_process(original, remembered).name == "fastokens"
    assert json.loads(verdicts[0].read_text()) == {"difference": None}

    added = max(*spec["model"]["vocab"].values(), *(t["id"] for t in spec["added_tokens"])) + 1
    spec["added_tokens"].append({"id": added, "content": "<|new|>", "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": True})
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(spec))
    assert _choose_in_a_new_process(changed, remembered).name == "fastokens"
    assert len(list(remembered.rglob("*.probes.json"))) == 2


def test_chat_loss_spans_come_out_the_same_with_fastokens_ids_and_offsets_derived_from_them(tmp_path):
    texts = _texts()
    conversations = [[{"role": "user", "content": a[:200] + " ﬁ ① 😀"}, {"role": "assistant", "content": " " + b[:400] + "\n  é"},
                      {"role": "user", "content": "<|endoftext|> more"}, {"role": "assistant", "content": "ok 👍🏽"}]
                     for a, b in zip(texts[::2], texts[1::2])]
    url = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations])
    fmt = ChatLmDatasetFormat(chat_template=CHAT_TEMPLATE)
    stats = {backend: build_caches(_config(tmp_path, backend, TOKENIZER, {"s": [url]}, backend, fmt, num_workers=0), progress=False)[("s", "train")]
             for backend in ("tokenizers", "auto")}
    assert _backend(stats["auto"])["name"] == "fastokens"
    assert stats["auto"]["loss_valid_tokens"] == stats["tokenizers"]["loss_valid_tokens"] > 0
    assert cache_bytes(str(tmp_path / "auto" / "s" / "train")) == cache_bytes(str(tmp_path / "tokenizers" / "s" / "train"))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=80))
def test_character_offsets_derived_from_byte_level_ids_are_tokenizers_offsets(text):
    tokenizer_json = Path(TOKENIZER, "tokenizer.json").read_text()
    reference = load_reference(tokenizer_json).encode(text, add_special_tokens=False)
    ids, _ = fast_ids(load_fast(tokenizer_json), [text])
    assert ids.tolist() == reference.ids
    offsets = char_offsets(ids, text, tokenizer_facts(tokenizer_json).byte_lengths)
    assert offsets is not None and offsets.tolist() == [list(o) for o in reference.offsets]


def test_the_backend_option_is_checked_where_the_config_is_read():
    with pytest.raises(ValueError, match="build.tokenizer_backend must be one of auto, fastokens, tokenizers"):
        BuildOptions(tokenizer_backend="fast")  # type: ignore[arg-type]
    assert TextLmDatasetFormat().identity() == TextLmDatasetFormat().identity()  # the backend is no part of the format
