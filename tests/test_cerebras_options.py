"""Cerebras' preprocessing options on tokenmix sources and formats, on the real tokenizer and corpus: text repairs
(``use_ftfy``, ``ftfy_normalizer``, ``wikitext_detokenize``) and ``min_sequence_len`` on the formats, ``.jsonl.zst.tar``
shards, ``metadata_files`` listings, and tokenizers given as files (GPT-2's vocab.json + merges.txt, a NeoX
tokenizer.json)."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile

import draccus
import fsspec
import numpy as np
import pyarrow as pa
import pytest
import zstandard
from helpers import REPO, TOKENIZER, build, encoder_for, read_jsonl_zst

import tokenmix.curate.modifiers as modifiers
import tokenmix.formats.text_fixes as text_fixes
from tokenmix import NoShardsError, ShardReadError, TextLmDatasetFormat, TokenCache, TokenizationConfig
from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.formats.encoder import DocumentEncoder
from tokenmix.formats.fim import FimLmDatasetFormat
from tokenmix.formats.supervised import SupervisedLmDatasetFormat
from tokenmix.formats.tokenizer import describe_tokenizer, load_tokenizer
from tokenmix.formats.tokenizer_identity import descriptions_dir, tokenizer_identity
from tokenmix.sources import FileShard, RawChunk
from tokenmix.sources.urls import urls_from_metadata_files

SHARED_CORPUS = REPO.parent / "shared" / "corpus"
SOURCES = ("linux_doc", "python_doc", "webster")


def corpus_shards() -> list[str]:
    """One small real shard per source: the shared corpus' validation shards, else (where ../shared is absent, as in CI)
    the bundled slice's."""
    shared = [SHARED_CORPUS / s / "validation.jsonl.zst" for s in SOURCES]
    if all(p.exists() for p in shared):
        return [str(p) for p in shared]
    return [str(REPO / "data" / "demo" / s / "validation.jsonl.zst") for s in SOURCES]


def corpus_texts() -> list[str]:
    return [r["text"] for url in corpus_shards() for r in read_jsonl_zst(url)]


def encode(fmt: LmDatasetFormatBase, records: list[dict]):
    """The records through the worker's encoder, as a build encodes a chunk."""
    spec, _ = encoder_for(fmt)
    return DocumentEncoder(spec).encode(RawChunk(0, [json.dumps(r).encode() for r in records]))


def documents(chunk) -> list[list[int]]:
    return [d.tolist() for d in np.split(chunk.tokens, np.cumsum(chunk.lengths)[:-1])] if len(chunk.lengths) else []


def ids(text: str) -> list[int]:
    return load_tokenizer(TOKENIZER).backend_tokenizer.encode(text, add_special_tokens=False).ids


EOS = 0  # <|endoftext|> of the shared tokenizer, put after every document (enforce_eos); it adds no BOS


# --- text repairs ---------------------------------------------------------------------------------------------------


def test_default_identities_are_those_of_caches_made_before_the_options():
    """Literal identities computed from the code before these options existed: existing caches keep their identity."""
    assert TextLmDatasetFormat().identity() == {"type": "text", "text_key": "text"}
    assert SupervisedLmDatasetFormat().identity() == {
        "type": "supervised", "input_field": "prompt", "output_field": "response", "separate_with": None, "mask_inputs": True,
        "max_seq_length": None, "min_sequence_len": None,
    }
    assert FimLmDatasetFormat().identity() == {
        "type": "fim", "text_key": "text", "fim_rate": 0.5, "spm_rate": 0.5, "fim_prefix_tok": "<fim_prefix>",
        "fim_middle_tok": "<fim_middle>", "fim_suffix_tok": "<fim_suffix>", "seed": 0,
    }
    # a normalizer without use_ftfy changes nothing, so it changes no identity either
    assert draccus.decode(LmDatasetFormatBase, {"type": "text", "ftfy_normalizer": "NFKC"}).identity() == {"type": "text", "text_key": "text"}


@pytest.mark.parametrize("options, entry", [
    ({"use_ftfy": True}, {"use_ftfy": True, "ftfy_normalizer": "NFC"}),
    ({"use_ftfy": True, "ftfy_normalizer": "None"}, {"use_ftfy": True, "ftfy_normalizer": None}),
    ({"use_ftfy": True, "ftfy_normalizer": None}, {"use_ftfy": True, "ftfy_normalizer": None}),
    ({"use_ftfy": True, "ftfy_normalizer": "NFKD"}, {"use_ftfy": True, "ftfy_normalizer": "NFKD"}),
    ({"wikitext_detokenize": True}, {"wikitext_detokenize": True}),
    ({"min_sequence_len": 10}, {"min_sequence_len": 10}),
])
def test_options_that_change_the_tokens_enter_the_identity(options, entry):
    text = draccus.decode(LmDatasetFormatBase, {"type": "text", **options})
    assert text.identity() == {"type": "text", "text_key": "text", **entry}
    if "min_sequence_len" not in options:
        supervised = draccus.decode(LmDatasetFormatBase, {"type": "supervised", **options})
        assert supervised.identity() == {**SupervisedLmDatasetFormat().identity(), **entry}
        fim = draccus.decode(LmDatasetFormatBase, {"type": "fim", **options})
        assert fim.identity() == {**FimLmDatasetFormat().identity(), **entry}


@pytest.mark.parametrize("type_", ["text", "supervised"])
def test_an_unknown_normalizer_is_refused_naming_the_option(type_):
    with pytest.raises(ValueError, match=f"format {type_}: ftfy_normalizer must be one of NFC, NFKC, NFD, NFKD or None"):
        (TextLmDatasetFormat if type_ == "text" else SupervisedLmDatasetFormat)(use_ftfy=True, ftfy_normalizer="NFX")


def test_curation_rewrites_texts_with_the_same_functions():
    assert modifiers.wikitext_detokenize is text_fixes.wikitext_detokenize
    assert modifiers.NORMALIZATIONS is text_fixes.NORMALIZATIONS
    texts = ["cafÃ© &amp; ﬁne", "x\u00b2 \u2460", "e\u0301"]
    for form in ("NFC", "NFKC", "none"):
        fixed = modifiers.UnicodeFix(form).modify(pa.array(texts)).to_pylist()
        assert fixed == [text_fixes.fix_unicode(t, None if form == "none" else form) for t in texts]


REPAIRS = [  # (record text, options, the text that must be tokenized)
    ("cafÃ© &amp; bar", {"use_ftfy": True}, "café & bar"),
    ("x\u00b2 \u2460 e\u0301", {"use_ftfy": True}, "x\u00b2 \u2460 \u00e9"),
    ("x\u00b2 \u2460 e\u0301", {"use_ftfy": True, "ftfy_normalizer": "NFKC"}, "x2 1 \u00e9"),
    ("x\u00b2 \u2460 e\u0301", {"use_ftfy": True, "ftfy_normalizer": "None"}, "x\u00b2 \u2460 e\u0301"),
    ("\u00e9t\u00e9", {"use_ftfy": True, "ftfy_normalizer": "NFD"}, "e\u0301te\u0301"),
    (" = = History = = \n The road , 1 @,@ 000 km @-@ long ( approx . ) .", {"wikitext_detokenize": True},
     " == History ==\nThe road, 1,000 km-long (approx.) ."),
    ("cafÃ© , 1 @,@ 000", {"use_ftfy": True, "wikitext_detokenize": True}, "café, 1,000"),
    ("cafÃ© , 1 @,@ 000", {}, "cafÃ© , 1 @,@ 000"),
]


@pytest.mark.parametrize("text, options, fixed", REPAIRS)
def test_text_is_repaired_before_it_is_tokenized(text, options, fixed):
    chunk = encode(TextLmDatasetFormat(**options), [{"text": text}])
    assert documents(chunk) == [ids(fixed) + [EOS]]


@pytest.mark.parametrize("text, options, fixed", REPAIRS)
def test_prompt_and_completion_are_repaired_before_they_are_tokenized(text, options, fixed):
    chunk = encode(SupervisedLmDatasetFormat(**options), [{"prompt": text, "response": text}])
    assert documents(chunk) == [ids(fixed) + ids(fixed) + [EOS]]
    assert chunk.spans.tolist() == [len(ids(fixed)), 2 * len(ids(fixed)) + 1]


@pytest.mark.parametrize("text, options, fixed", REPAIRS)
def test_fim_repairs_the_text_before_it_is_cut(text, options, fixed):
    """Cerebras' FIM mode takes the LMData repairs: the transform cuts the repaired text, as it would have cut that text."""
    repaired = encode(FimLmDatasetFormat(fim_rate=1.0, seed=3, **options), [{"text": text}])
    given_fixed = encode(FimLmDatasetFormat(fim_rate=1.0, seed=3), [{"text": fixed}])
    assert documents(repaired) == documents(given_fixed)


def test_a_text_that_repairs_to_nothing_is_an_empty_document():
    chunk = encode(TextLmDatasetFormat(use_ftfy=True), [{"text": "\ufeff"}, {"text": " \x1b[0m "}, {"text": "kept"}])
    assert [(p, r) for p, r, _ in chunk.skipped] == [(0, "empty_document"), (1, "empty_document")]
    assert "use_ftfy/wikitext_detokenize" in chunk.skipped[0][2]
    assert documents(chunk) == [ids("kept") + [EOS]]
    chunk = encode(SupervisedLmDatasetFormat(use_ftfy=True), [{"prompt": "\ufeff", "response": "r"}])
    assert [r for _, r, _ in chunk.skipped] == ["empty_document"] and "'prompt'" in chunk.skipped[0][2]


def test_a_build_with_repairs_changes_only_what_ftfy_changes(tmp_path):
    """On real text: the documents ftfy leaves alone keep their tokens; the cache identity differs."""
    shard = corpus_shards()[1]
    plain = build(str(tmp_path / "plain"), [shard])
    fixed = build(str(tmp_path / "fixed"), [shard], TextLmDatasetFormat(use_ftfy=True))
    assert plain["fingerprint"] != fixed["fingerprint"] and plain["documents"] == fixed["documents"]
    texts = [r["text"] for r in read_jsonl_zst(shard)]
    a, b = TokenCache(str(tmp_path / "plain")), TokenCache(str(tmp_path / "fixed"))
    rows = range(a.num_rows())
    for text, row_a, row_b in zip(texts, a.get_rows(rows), b.get_rows(rows)):
        expected = ids(text_fixes.fix_unicode(text)) + [EOS]
        assert row_b.tolist() == expected
        assert (row_a.tolist() == expected) == (text_fixes.fix_unicode(text) == text)


# --- min_sequence_len -----------------------------------------------------------------------------------------------


def test_documents_shorter_than_min_sequence_len_are_skipped_and_counted_as_too_short():
    texts = corpus_texts()[:200]
    lengths = np.array([len(ids(t)) + 1 for t in texts])  # with the EOS
    limit = int(np.median(lengths))
    chunk = encode(TextLmDatasetFormat(min_sequence_len=limit), [{"text": t} for t in texts])
    short = np.flatnonzero(lengths < limit).tolist()
    assert 0 < len(short) < len(texts)
    assert [p for p, _, _ in chunk.skipped] == short
    assert {r for _, r, _ in chunk.skipped} == {"too_short"}
    assert f"fewer than min_sequence_len {limit}" in chunk.skipped[0][2]
    kept = [i for i in range(len(texts)) if i not in set(short)]
    assert documents(chunk) == [ids(texts[i]) + [EOS] for i in kept]
    assert chunk.records == len(texts)
    assert chunk.chars == sum(len(texts[i]) for i in kept)


def test_min_sequence_len_counts_bos_and_eos(tmp_path):
    n = len(ids("one two three"))
    keeps = encode(TextLmDatasetFormat(min_sequence_len=n + 1), [{"text": "one two three"}])
    assert len(keeps.lengths) == 1 and not keeps.skipped
    drops = encode(TextLmDatasetFormat(min_sequence_len=n + 2), [{"text": "one two three"}])
    assert len(drops.lengths) == 0 and [r for _, r, _ in drops.skipped] == ["too_short"]
    with pytest.raises(ValueError, match="format text: min_sequence_len must be a positive number of tokens, got 0"):
        TextLmDatasetFormat(min_sequence_len=0)


def test_a_raising_build_counts_too_short_documents_instead_of_stopping(tmp_path):
    shard = corpus_shards()[2]
    full = build(str(tmp_path / "all"), [shard])
    limit = int(full["document_length_tokens"]["p50"])
    stats = build(str(tmp_path / "short"), [shard], TextLmDatasetFormat(min_sequence_len=limit), on_error="raise")
    cache = TokenCache(str(tmp_path / "short"))
    lengths = np.diff(cache.row_bounds(0, cache.num_rows()))
    assert lengths.min() >= limit
    assert stats["skipped_by_reason"] == {"too_short": full["documents"] - stats["documents"]} and stats["skipped_records"] > 0
    assert stats["records"] == full["records"]


# --- tar shards -----------------------------------------------------------------------------------------------------


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_tar(path, members: list[tuple[str, bytes]], directories: tuple[str, ...] = ()) -> str:
    with tarfile.open(path, "w") as tar:
        for directory in directories:
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            add_member(tar, name, data)
    return str(path)


def corpus_tar(tmp_path) -> tuple[str, list[bytes]]:
    """A ``.jsonl.zst.tar`` of the real shards as they are, and the lines it holds in order."""
    shards = corpus_shards()
    members = [(f"{s}/validation.jsonl.zst", open(u, "rb").read()) for s, u in zip(SOURCES, shards)]
    decompress = zstandard.ZstdDecompressor()
    lines = [line for u in shards for line in decompress.stream_reader(open(u, "rb"), read_across_frames=True).read().splitlines(True)]
    return write_tar(tmp_path / "corpus.jsonl.zst.tar", members, directories=SOURCES), lines


def read_all(url: str, start: int = 0, chunk_bytes: int = 1 << 20) -> list[bytes]:
    out: list[bytes] = []
    for chunk in FileShard(url).read(start, chunk_bytes):
        assert chunk.start == start + len(out)
        out.extend(chunk.records)
    return out


def test_a_jsonl_zst_tar_reads_every_member_in_archive_order_and_resumes_at_any_position(tmp_path):
    url, lines = corpus_tar(tmp_path)
    assert read_all(url) == lines
    first_member = len(read_jsonl_zst(corpus_shards()[0]))
    for start in (1, first_member - 1, first_member, first_member + 1, len(lines) - 1, len(lines)):
        assert read_all(url, start, chunk_bytes=4096) == lines[start:]
    shard = FileShard(url)
    within = min(4, len(read_jsonl_zst(corpus_shards()[1])) - 1)  # the bundled python_doc slice has 4 records
    assert shard.position_label(first_member + within) == f"{url}, member {SOURCES[1]}/validation.jsonl.zst, line {within + 1}"
    assert shard.position_label(0) == f"{url}, member {SOURCES[0]}/validation.jsonl.zst, line 1"


def test_tar_members_of_every_kind_and_a_compressed_tar(tmp_path):
    records = [{"text": f"document {i}"} for i in range(9)]
    lines = [json.dumps(r).encode() + b"\n" for r in records]
    members = [
        ("a.jsonl", b"".join(lines[:3])),
        ("b.jsonl.gz", gzip.compress(b"".join(lines[3:5]) + b"\n")),  # a blank line is a position, as in .jsonl
        ("c.txt", b"a whole text document\n"),
        ("empty.jsonl", b""),
        ("d.ndjson.zst", zstandard.ZstdCompressor().compress(b"".join(lines[5:]))),
    ]
    expected = [*lines[:5], b"\n", b"a whole text document\n", *lines[5:]]
    url = write_tar(tmp_path / "mixed.tar", members)
    assert read_all(url) == expected
    assert type(read_all(url)[6]).__name__ == "PlainText"
    assert read_all(url, 6) == expected[6:]
    for suffix, compress in ((".tar.zst", zstandard.ZstdCompressor().compress), (".tar.gz", gzip.compress)):
        path = tmp_path / f"mixed{suffix}"
        path.write_bytes(compress(open(url, "rb").read()))
        assert read_all(str(path)) == expected and read_all(str(path), 7) == expected[7:]
    shard = FileShard(url)
    assert [shard.position_label(p).split(", ", 1)[1] for p in (5, 6, 7)] == ["member b.jsonl.gz, line 3", "member c.txt",
                                                                               "member d.ndjson.zst, line 1"]


def test_a_build_from_a_tar_is_the_build_from_its_members(tmp_path):
    url, _ = corpus_tar(tmp_path)
    from_tar = build(str(tmp_path / "tar"), [url])
    from_files = build(str(tmp_path / "files"), corpus_shards())
    assert (from_tar["documents"], from_tar["tokens"]) == (from_files["documents"], from_files["tokens"])
    a, b = TokenCache(str(tmp_path / "tar")), TokenCache(str(tmp_path / "files"))
    rows = range(a.num_rows())
    assert all(np.array_equal(x, y) for x, y in zip(a.get_rows(rows), b.get_rows(rows)))


def test_a_truncated_tar_is_a_shard_error_after_every_complete_record(tmp_path):
    """Cut anywhere before its end-of-archive block (in a member's data, in a header, at a member boundary), the archive
    is refused as truncated, after the records wholly before the cut were handed on."""
    lines = [json.dumps({"text": f"record {i} " + "x" * (i * 37 % 300)}).encode() + b"\n" for i in range(60)]
    members = [(f"part-{m}.jsonl", b"".join(lines[m * 12 : (m + 1) * 12])) for m in range(5)]
    data = open(write_tar(tmp_path / "whole.tar", members), "rb").read()
    with tarfile.open(tmp_path / "whole.tar") as tar:
        end = max(m.offset_data + m.size for m in tar.getmembers())
        boundaries = [m.offset for m in tar.getmembers()][1:]
    end_block = -(-end // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    cuts = sorted({*range(0, end_block + tarfile.BLOCKSIZE, 211), *boundaries, *(b + 100 for b in boundaries), end_block})
    for cut in cuts:
        path = tmp_path / "cut.tar"
        path.write_bytes(data[:cut])
        seen: list[bytes] = []
        with pytest.raises(ShardReadError) as info:
            for chunk in FileShard(str(path)).read(0, chunk_bytes=200):
                seen.extend(chunk.records)
        assert info.value.reason == "truncated_file", (cut, info.value)
        assert info.value.position == len(seen) and seen == lines[: len(seen)]
        assert all(line.endswith(b"\n") for line in seen)
    path.write_bytes(data[: end_block + tarfile.BLOCKSIZE])  # the end-of-archive block is there: complete
    assert read_all(str(path)) == lines


def test_a_corrupt_header_or_an_unknown_member_is_an_unreadable_shard(tmp_path):
    lines = [json.dumps({"text": f"r{i}"}).encode() + b"\n" for i in range(4)]
    data = bytearray(open(write_tar(tmp_path / "a.tar", [("a.jsonl", b"".join(lines[:2])), ("b.jsonl", b"".join(lines[2:]))]), "rb").read())
    with tarfile.open(tmp_path / "a.tar") as tar:
        second = tar.getmembers()[1].offset
    data[second : second + 100] = b"\x7f" * 100
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    seen = []
    with pytest.raises(ShardReadError) as info:
        for chunk in FileShard(str(tmp_path / "bad.tar")).read():
            seen.extend(chunk.records)
    assert info.value.reason == "unreadable_file" and "corrupt" in info.value.detail and seen == lines[:2]
    url = write_tar(tmp_path / "other.tar", [("a.jsonl", lines[0]), ("table.parquet", b"PAR1")])
    with pytest.raises(ShardReadError) as info:
        read_all(url)
    assert info.value.reason == "unreadable_file" and "'table.parquet'" in info.value.detail and ".jsonl, .ndjson or .txt" in info.value.detail


# --- metadata_files -------------------------------------------------------------------------------------------------


def test_metadata_files_list_inputs_relative_to_themselves_in_order(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.jsonl", "b.jsonl", "c.jsonl.zst"):
        (data / name).write_text("{}\n")
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "one.txt").write_text(f"# Cerebras metadata file\n../data/b.jsonl\n\n  {data / 'a.jsonl'}  \n")
    (tmp_path / "two.txt").write_text("data/c.jsonl.zst\ndata/b.jsonl\n")
    monkeypatch.chdir(tmp_path)
    assert urls_from_metadata_files(["lists/one.txt", str(tmp_path / "two.txt")]) == [
        str(data / "b.jsonl"), str(data / "a.jsonl"), str(data / "c.jsonl.zst"),
    ]


def test_a_sources_metadata_files_follow_its_train_urls_and_build(tmp_path):
    from helpers import demo_urls

    import tokenmix

    first, second = demo_urls("webster")
    (tmp_path / "listing.txt").write_text(f"{second}\n{first}\n")
    config = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"), "configs": {
        "web": {"train_urls": [first], "metadata_files": [str(tmp_path / "listing.txt")]}}})
    assert [s.name for s in config.configs["web"].shards("train")] == [first, second]
    assert config.configs["web"].split_names() == ["train"]
    only_listed = tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "c2"), "configs": {
        "web": {"metadata_files": [str(tmp_path / "listing.txt")]}}})
    assert [s.name for s in only_listed.configs["web"].shards("train")] == [second, first]
    stats = tokenmix.build_caches(only_listed, progress=False)
    assert stats[("web", "train")]["documents"] > 0


def test_metadata_files_on_an_object_store_resolve_against_the_listing_url():
    fs = fsspec.filesystem("memory")
    fs.pipe({"/cerebras/data/x.jsonl": b"{}\n", "/cerebras/lists/all.txt": b"../data/x.jsonl\nmemory:///cerebras/data/x.jsonl\n"})
    try:
        assert urls_from_metadata_files(["memory:///cerebras/lists/all.txt"]) == ["memory:///cerebras/data/x.jsonl"]
    finally:
        fs.rm("/cerebras", recursive=True)


def test_a_missing_listed_input_is_named_with_its_listing_file_and_line(tmp_path):
    (tmp_path / "there.jsonl").write_text("{}\n")
    listing = tmp_path / "list.txt"
    listing.write_text("there.jsonl\n# a comment\nmissing.jsonl\n")
    with pytest.raises(NoShardsError) as info:
        urls_from_metadata_files([str(listing)])
    assert str(info.value).startswith(f"{listing}, line 3: input 'missing.jsonl' does not exist (resolved against the listing's directory: "
                                      f"{tmp_path / 'missing.jsonl'}); fix the path or remove the line")
    with pytest.raises(NoShardsError, match="metadata file .*nope.txt' does not exist; check the path in metadata_files"):
        urls_from_metadata_files([str(tmp_path / "nope.txt")])
    (tmp_path / "blank.txt").write_text("\n# nothing\n")
    with pytest.raises(NoShardsError, match="blank.txt' lists no input files"):
        urls_from_metadata_files([str(tmp_path / "blank.txt")])


# --- tokenizers given as files --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """The shared tokenizer as Cerebras' files: GPT-2's vocab.json + merges.txt (its BPE model saved by the tokenizers
    library), a NeoX-style tokenizer.json file, and a pair whose vocabulary lacks <|endoftext|>."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("tokenizer_files")
    pair = root / "gpt2"
    pair.mkdir()
    Tokenizer.from_file(os.path.join(TOKENIZER, "tokenizer.json")).model.save(str(pair))
    neox = root / "neox-encoder.json"
    shutil.copy(os.path.join(TOKENIZER, "tokenizer.json"), neox)
    bare = root / "bare"
    bare.mkdir()
    vocab = json.loads((pair / "vocab.json").read_text())
    del vocab["<|endoftext|>"]
    (bare / "vocab.json").write_text(json.dumps(vocab))
    shutil.copy(pair / "merges.txt", bare / "merges.txt")
    return {"pair": str(pair), "file": str(neox), "bare": str(bare)}


@pytest.mark.parametrize("kind", ["pair", "file"])
def test_tokenizers_given_as_files_encode_real_text_as_the_directory_does(tokenizer_files, kind):
    assert sorted(os.listdir(tokenizer_files["pair"])) == ["merges.txt", "vocab.json"]
    path = tokenizer_files[kind]
    texts = corpus_texts()
    reference = [e.ids for e in load_tokenizer(TOKENIZER).backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert [e.ids for e in load_tokenizer(path).backend_tokenizer.encode_batch(texts, add_special_tokens=False)] == reference
    info, directory = describe_tokenizer(path), describe_tokenizer(TOKENIZER)
    assert (info.vocab_size, info.eos_id, info.bos_id, info.adds_bos, info.adds_eos) == (32000, EOS, EOS, False, False)
    assert info.pad_id is None and info.fingerprint != directory.fingerprint
    assert tokenizer_identity(path) == info.identity()


def test_a_cache_built_with_tokenizer_files_holds_the_directory_tokenizers_ids_under_its_own_identity(tokenizer_files, tmp_path):
    shard = corpus_shards()[0]
    reference = build(str(tmp_path / "dir"), [shard])
    caches = {"dir": TokenCache(str(tmp_path / "dir"))}
    for kind in ("pair", "file"):
        stats = build(str(tmp_path / kind), [shard], tokenizer=tokenizer_files[kind])
        assert stats["tokens"] == reference["tokens"] and stats["fingerprint"] != reference["fingerprint"]
        caches[kind] = TokenCache(str(tmp_path / kind))
    rows = range(caches["dir"].num_rows())
    want = caches["dir"].get_rows(rows)
    for kind in ("pair", "file"):
        assert all(np.array_equal(a, b) for a, b in zip(want, caches[kind].get_rows(rows)))
    identities = {kind: TokenizationConfig(tokenizer=path).cache_identity(TextLmDatasetFormat(), "t")["tokenizer_fingerprint"]
                  for kind, path in (("dir", TOKENIZER), ("pair", tokenizer_files["pair"]), ("file", tokenizer_files["file"]))}
    assert len(set(identities.values())) == 3


def test_a_gpt2_pair_without_endoftext_gets_no_special_tokens_and_no_new_id(tokenizer_files):
    info = describe_tokenizer(tokenizer_files["bare"])
    assert (info.eos_id, info.bos_id, info.special_tokens) == (None, None, ())
    assert "<|endoftext|>" not in load_tokenizer(tokenizer_files["bare"]).get_vocab()
    with pytest.raises(ValueError, match="has no EOS token; set enforce_eos: false"):
        TokenizationConfig(tokenizer=tokenizer_files["bare"]).encoder_spec(TextLmDatasetFormat(), "test")


def test_a_tokenizer_file_is_remembered_by_its_contents(tokenizer_files, tmp_path):
    """A file's description is remembered as a directory's is, under a key of its bytes: a copy elsewhere is recalled, a
    changed copy is described anew."""
    def copy(name: str) -> str:
        (tmp_path / name).mkdir()
        shutil.copy(tokenizer_files["file"], tmp_path / name / "tokenizer.json")
        return str(tmp_path / name / "tokenizer.json")

    def remembered() -> set:
        return set(descriptions_dir().glob("*.json"))

    first, second, changed = copy("a"), copy("b"), copy("c")
    spec = json.loads(open(changed).read())
    spec["added_tokens"].append({**spec["added_tokens"][-1], "id": len(spec["model"]["vocab"]), "content": "<|new|>"})
    with open(changed, "w") as f:
        json.dump(spec, f)
    known = remembered()
    before = tokenizer_identity(first)
    assert len(remembered() - known) == 1
    assert tokenizer_identity(second) == before and len(remembered() - known) == 1
    after = tokenizer_identity(changed)
    assert after.vocab_size == before.vocab_size + 1 and after.fingerprint != before.fingerprint
    assert len(remembered() - known) == 2


def test_a_file_that_is_no_tokenizer_is_refused_with_the_forms_a_tokenizer_may_take(tmp_path):
    (tmp_path / "notes.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="a tokenizer.json file, or a directory holding GPT-2's vocab.json and merges.txt"):
        load_tokenizer(str(tmp_path / "notes.json"))
