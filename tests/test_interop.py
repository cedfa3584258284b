"""Token files of other stacks read in place (Megatron, datatrove, Nanoset), Levanter's caches opened as they are, and
caches exported to those formats: round trips on real files, the formats' documented layouts written independently
here, splits by ratio, the Megatron/Nanoset example convention, and the errors users meet."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import SEQ_LEN, TOKENIZER, build, demo_urls, write_jsonl
from hypothesis import given
from hypothesis import strategies as st

import tokenmix
from tokenmix import SupervisedLmDatasetFormat, TokenCache, UnsafeFileError
from tokenmix.cache import CacheMismatchError
from tokenmix.datasets.splits import parse_split, split_bounds
from tokenmix.export import export_cache, export_datatrove, export_levanter, export_megatron, export_nanoset
from tokenmix.export.streaming import partial_name
from tokenmix.sources.token_file_base import TokenFileError


@pytest.fixture(scope="module")
def text_cache(tmp_path_factory) -> TokenCache:
    location = str(tmp_path_factory.mktemp("text") / "cache")
    build(location, demo_urls("webster") + demo_urls("python_doc"))
    return TokenCache(location)


@pytest.fixture(scope="module")
def bos_cache(tmp_path_factory) -> TokenCache:
    """Rows as Levanter's tokenizer shapes them for the demo tokenizer: BOS, the text's ids, EOS."""
    location = str(tmp_path_factory.mktemp("bos") / "cache")
    build(location, demo_urls("webster"), tokenization={"enforce_bos": True})
    return TokenCache(location)


@pytest.fixture(scope="module")
def supervised_cache(tmp_path_factory) -> TokenCache:
    root = tmp_path_factory.mktemp("sup")
    records = [{"prompt": f"Question {i}: what is {i} + {i}?", "response": f" It is {2 * i}." * (1 + i % 3)} for i in range(40)]
    location = str(root / "cache")
    build(location, [write_jsonl(root / "sup.jsonl", records)], SupervisedLmDatasetFormat())
    return TokenCache(location)


def rows_of(cache) -> list[np.ndarray]:
    return [np.asarray(cache[i]) for i in range(cache.num_rows())]


def mixture(tmp_path, sources: dict, **extra) -> tokenmix.LMMixtureDatasetConfig:
    return tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"), "configs": sources, **extra})


def write_megatron_by_hand(prefix: str, docs: list[np.ndarray], dtype: np.dtype, code: int,
                           document_indices: list[int] | None = None) -> None:
    """The indexed-dataset layout as megatron/core/datasets/indexed_dataset.py documents it, written without tokenmix
    (``document_indices``: the index's first sequence of each document, one per sequence unless given)."""
    if document_indices is None:
        document_indices = list(range(len(docs) + 1))
    lengths = np.array([len(d) for d in docs], np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * np.dtype(dtype).itemsize
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(document_indices)))
        f.write(lengths.tobytes() + pointers.tobytes() + np.array(document_indices, np.int64).tobytes())


@pytest.mark.parametrize("kind", ["megatron", "datatrove", "nanoset"])
def test_an_exported_cache_reads_back_as_a_source_with_identical_documents(tmp_path, text_cache, kind):
    path = {"megatron": tmp_path / "out" / "web_text_document", "datatrove": tmp_path / "out" / "00000.ds",
            "nanoset": tmp_path / "out" / "web_input_ids.npy"}[kind]
    export = {"megatron": export_megatron, "datatrove": export_datatrove, "nanoset": export_nanoset}[kind]
    stats = export(text_cache, str(path), progress=False)
    assert stats["tokens"] == text_cache.num_tokens() and stats["dtype"] == "uint16"
    assert not [n for n in os.listdir(path.parent) if n.endswith(".partial")]
    options = {"kind": kind, **({"dtype": "uint16", "eos_id": 0} if kind == "nanoset" else {})}
    urls = [str(path.parent)] if kind == "datatrove" else [str(path)]
    config = mixture(tmp_path, {"web": {"train_urls": urls, "token_files": options}})
    opened = tokenmix.open_cache(config, "web")
    assert opened.num_rows() == text_cache.num_rows()
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(opened), rows_of(text_cache)))
    assert np.array_equal(opened.row_bounds(0, opened.num_rows()), text_cache.row_bounds(0, text_cache.num_rows()))
    ours = config.train_sources(SEQ_LEN)["web"]
    built = tokenmix.TokenSeqDataset(text_cache, SEQ_LEN)
    assert len(ours) == len(built)
    idx = np.random.default_rng(0).permutation(len(built))[:50]
    got, want = ours.get_batch(idx), built.get_batch(idx)
    for field in ("tokens", "loss_mask", "segment_ids"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field


def test_datatrove_export_keeps_loss_masks_and_reads_back_as_loss_spans(tmp_path, supervised_cache):
    path = str(tmp_path / "sup.ds")
    stats = export_datatrove(supervised_cache, path, tokenizer="our-tokenizer", progress=False)
    assert stats["loss"] is True
    with open(path + ".metadata") as f:
        assert f.readline().strip() == "our-tokenizer|2"
    loss = np.fromfile(path + ".loss", np.uint8)
    assert len(loss) == supervised_cache.num_tokens() and 0 < loss.sum() < len(loss)
    config = mixture(tmp_path, {"sup": {"train_urls": [path], "token_files": {"kind": "datatrove"},
                                        "format": {"type": "supervised"}}})
    opened = tokenmix.open_cache(config, "sup")
    assert opened.has_loss_spans
    for got, want in zip(opened.loss_spans(0, opened.num_rows()), supervised_cache.loss_spans(0, supervised_cache.num_rows())):
        assert np.array_equal(got, want)
    a = tokenmix.TokenSeqDataset(opened, 64).get_batch(range(10))
    b = tokenmix.TokenSeqDataset(supervised_cache, 64).get_batch(range(10))
    assert np.array_equal(a.loss_mask, b.loss_mask) and np.array_equal(a.tokens, b.tokens)


def test_a_datatrove_export_over_a_masked_one_leaves_no_loss_file_of_the_older_export(tmp_path, supervised_cache):
    """Before, the older export's .loss stayed beside the new .ds and was read back as its loss mask."""
    path = str(tmp_path / "out" / "00000.ds")
    export_datatrove(supervised_cache, path, progress=False)
    write_megatron_by_hand(str(tmp_path / "plain"), rows_of(supervised_cache), np.uint16, 8)
    plain = tokenmix.open_cache(mixture(tmp_path, {"m": {"train_urls": [str(tmp_path / "plain.bin")], "token_files": {"kind": "megatron"}}}), "m")
    assert not plain.has_loss_spans and plain.num_tokens() == supervised_cache.num_tokens()
    stats = export_datatrove(plain, path, progress=False)
    assert stats["loss"] is False and not os.path.exists(path + ".loss")
    config = mixture(tmp_path, {"d": {"train_urls": [path], "token_files": {"kind": "datatrove"}}})
    opened = tokenmix.open_cache(config, "d")
    assert not opened.has_loss_spans
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(opened), rows_of(plain)))


@pytest.mark.parametrize("dtype,code", [(np.uint16, 8), (np.int32, 4), (np.int64, 5), (np.uint8, 1)])
def test_megatron_files_written_by_the_documented_layout_are_read_in_every_dtype(tmp_path, dtype, code):
    rng = np.random.default_rng(code)
    docs = [rng.integers(0, 250, rng.integers(1, 300)).astype(dtype) for _ in range(37)]
    write_megatron_by_hand(str(tmp_path / "d"), docs, dtype, code)
    config = mixture(tmp_path, {"m": {"train_urls": [str(tmp_path / "d.bin")], "token_files": {"kind": "megatron"}}})
    opened = tokenmix.open_cache(config, "m")
    assert [len(r) for r in rows_of(opened)] == [len(d) for d in docs]
    assert all(np.array_equal(r, d) for r, d in zip(rows_of(opened), docs))


def test_several_files_make_one_source_in_order_and_reads_cross_file_boundaries(tmp_path, text_cache):
    half = text_cache.num_rows() // 2
    rows = rows_of(text_cache)
    write_megatron_by_hand(str(tmp_path / "a"), rows[:half], np.uint16, 8)
    write_megatron_by_hand(str(tmp_path / "b"), rows[half:], np.uint16, 8)
    config = mixture(tmp_path, {"m": {"train_urls": [str(tmp_path / "{a,b}.idx")], "token_files": {"kind": "megatron"}}})
    opened = tokenmix.open_cache(config, "m")
    assert len(opened.files) == 2
    got = tokenmix.TokenSeqDataset(opened, 1000).get_batch(range(len(tokenmix.TokenSeqDataset(opened, 1000))))
    want = tokenmix.TokenSeqDataset(text_cache, 1000).get_batch(range(len(tokenmix.TokenSeqDataset(text_cache, 1000))))
    assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.segment_ids, want.segment_ids)


def test_token_files_mix_with_text_sources_in_exact_proportions(tmp_path, text_cache):
    export_megatron(text_cache, str(tmp_path / "m" / "web"), progress=False)
    config = mixture(tmp_path, {
        "text": {"train_urls": demo_urls("linux_doc")},
        "tokens": {"train_urls": [str(tmp_path / "m" / "web")], "token_files": {"kind": "megatron"}},
    }, train_weights={"text": 1, "tokens": 3}, mixture_block_size=64)
    tokenmix.build_caches(config, progress=False)
    assert not os.path.exists(tmp_path / "caches" / "tokens" / "train" / "ledger.json")  # nothing built for token files
    batch = config.train_set(SEQ_LEN).get_batch(range(128))
    assert np.bincount(batch.source_ids).tolist() == [32, 96]


def test_a_declared_tokenizer_of_another_vocabulary_is_refused(tmp_path, text_cache):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the quick brown fox"] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(tmp_path / "tiny")
    export_megatron(text_cache, str(tmp_path / "m" / "web"), progress=False)
    config = mixture(tmp_path, {"m": {"train_urls": [str(tmp_path / "m" / "web")],
                                      "token_files": {"kind": "megatron", "tokenizer": str(tmp_path / "tiny")}}})
    with pytest.raises(ValueError, match=r"source 'm': token_files.tokenizer .* has \d+ tokens but the config's tokenizer"):
        tokenmix.open_cache(config, "m")


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    np.array([5, 6, 40000, 0], np.int32).tofile(tmp_path / "x_input_ids.npy")
    config = mixture(tmp_path, {"n": {"train_urls": [str(tmp_path / "x_input_ids.npy")], "token_files": {"kind": "nanoset", "dtype": "int32"}}})
    with pytest.raises(ValueError, match="holds token id 40000, outside the 32000-token vocabulary"):
        tokenmix.open_cache(config, "n")


def test_nanoset_samples_equal_nanosets_documented_indexing(tmp_path, text_cache):
    """Nanoset: sample i is tokens [i * seq_len, i * seq_len + seq_len + 1) of the file; (N - 1) // seq_len samples."""
    path = tmp_path / "web_input_ids.npy"
    export_nanoset(text_cache, str(path), progress=False)
    raw = np.fromfile(path, np.uint16)
    config = mixture(tmp_path, {"n": {"train_urls": [str(path)], "token_files": {"kind": "nanoset", "dtype": "uint16"}}},
                     example_convention="megatron", shuffle=False)
    examples = config.train_sources(SEQ_LEN)["n"]
    assert len(examples) == (len(raw) - 1) // SEQ_LEN and examples.tokens_per_example == SEQ_LEN + 1
    idx = np.array([0, 1, 7, len(examples) - 1])
    batch = examples.get_batch(idx)
    for row, i in enumerate(idx):
        assert np.array_equal(batch.tokens[row], raw[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1])
    assert batch.loss_mask[:, :-1].all() and not batch.loss_mask[:, -1].any()  # one stream: every label but the last


def test_split_949_50_1_gives_contiguous_train_validation_and_test(tmp_path, text_cache):
    export_megatron(text_cache, str(tmp_path / "m" / "web"), progress=False)
    source = {"train_urls": [str(tmp_path / "m" / "web")], "token_files": {"kind": "megatron", "split": "949,50,1"}}
    config = mixture(tmp_path, {"web": source}, shuffle=False)
    whole = tokenmix.TokenSeqDataset(text_cache, SEQ_LEN)
    bounds = split_bounds(len(whole), (949, 50, 1))
    train, valid, test = config.train_sources(SEQ_LEN)["web"], config.validation_sets(SEQ_LEN)["web"], config.test_sets(SEQ_LEN)["web"]
    assert [len(train), len(valid), len(test)] == [bounds[1], bounds[2] - bounds[1], bounds[3] - bounds[2]]
    assert len(train) + len(valid) + len(test) == len(whole)
    assert np.array_equal(valid.get_batch(range(len(valid))).tokens, whole.get_batch(range(bounds[1], bounds[2])).tokens)
    assert np.array_equal(test.get_batch([0]).tokens, whole.get_batch([bounds[2]]).tokens)
    by_docs = mixture(tmp_path, {"web": {**source, "token_files": {**source["token_files"], "split_by": "documents"}}}, shuffle=False)
    docs = split_bounds(text_cache.num_rows(), (949, 50, 1))
    v = by_docs.validation_sets(SEQ_LEN)["web"]
    start = int(text_cache.row_bounds(docs[1], docs[1] + 1)[0])
    assert np.array_equal(v.get_batch([0]).tokens[0], text_cache.read_tokens(start, start + SEQ_LEN))


@given(st.integers(0, 10**9), st.lists(st.integers(0, 1000), min_size=1, max_size=3).filter(lambda w: sum(w) > 0))
def test_split_bounds_cover_the_whole_in_order(total, weights):
    bounds = split_bounds(total, parse_split(",".join(map(str, weights)), "t"))
    assert bounds[0] == 0 and bounds[-1] == total and len(bounds) == 4
    exact = np.cumsum([0, *parse_split(",".join(map(str, weights)), "t")]) / sum(weights) * total
    assert all(abs(b - e) <= 2 for b, e in zip(bounds, exact))


def test_a_cache_levanter_wrote_opens_in_a_mixture_and_is_checked_against_the_config(tmp_path, bos_cache):
    export_levanter(bos_cache, str(tmp_path / "lev" / "train"), tokenizer=TOKENIZER, progress=False)
    ledger = json.loads((tmp_path / "lev" / "train" / "shard_ledger.json").read_text())
    assert ledger["is_finished"] and ledger["metadata"]["preprocessor_metadata"] == {
        "tokenizer": TOKENIZER, "vocab_size": 32000, "return_attention_mask": False, "padding": False, "max_length": 10**9,
        "append_bos": True, "append_eos": True}
    source = {"train_urls": demo_urls("webster"), "cache_dir": str(tmp_path / "lev")}
    config = mixture(tmp_path, {"lev": source}, enforce_bos=True)
    tokenmix.build_caches(config, progress=False)  # finds Levanter's cache there and builds nothing
    assert not (tmp_path / "lev" / "train" / "ledger.json").exists()
    opened = tokenmix.open_cache(config, "lev")
    assert opened.dtype == np.int64 and opened.identity["levanter_cache"]
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(opened), rows_of(bos_cache)))
    assert np.array_equal(config.train_set(SEQ_LEN).get_batch(range(8)).tokens, config.train_set(SEQ_LEN).get_batch(range(8)).tokens)
    with pytest.raises(CacheMismatchError, match="append_eos: Levanter's cache has True, the config asks for False"):
        tokenmix.open_cache(mixture(tmp_path, {"lev": source}, enforce_bos=True, enforce_eos=False), "lev")


def test_levanter_export_refuses_rows_shaped_otherwise_than_levanters_tokenizer_shapes_them(tmp_path, text_cache, bos_cache):
    """Levanter's trainer asks its tokenizer for BOS: rows without it would be exported under metadata that lies (or
    that Levanter warns about), so the export refuses them and says how to rebuild; so too a cache of another tokenizer."""
    with pytest.raises(ValueError, match="starts with BOS but this cache's rows do not; rebuild the cache with enforce_bos: true"):
        export_levanter(text_cache, str(tmp_path / "lev"), tokenizer=TOKENIZER, progress=False)
    assert not (tmp_path / "lev").exists()
    other = tmp_path / "other_tokenizer"
    other.mkdir()
    config = json.loads((Path(TOKENIZER) / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": "<|endoftext|>"}))
    shutil.copy(Path(TOKENIZER) / "tokenizer.json", other / "tokenizer.json")
    with pytest.raises(ValueError, match="built with another tokenizer than .*; give --tokenizer the tokenizer the cache was built with"):
        export_levanter(bos_cache, str(tmp_path / "lev"), tokenizer=str(other), progress=False)


def test_levanter_export_into_a_tokenmix_cache_is_refused_and_leaves_it_whole(tmp_path, bos_cache):
    """The export replaces the arrays at its location: over a tokenmix cache (the exported one itself included) it
    destroyed that cache, whose ledger.json, still there, made every reader take the Levanter arrays for a damaged cache."""
    target = tmp_path / "cache"
    shutil.copytree(bos_cache.location, target)
    for cache in (bos_cache, TokenCache(str(target))):
        with pytest.raises(ValueError, match=f"{re.escape(str(target))} holds a tokenmix cache .*export to another location"):
            export_levanter(cache, str(target), tokenizer=TOKENIZER, progress=False)
    kept = TokenCache(str(target))
    assert not (target / "shard_ledger.json").exists() and kept.num_rows() == bos_cache.num_rows()
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(kept), rows_of(bos_cache)))


def test_a_second_levanter_export_to_a_location_being_written_is_refused_and_the_first_finishes_whole(tmp_path, bos_cache,
                                                                                                        monkeypatch):
    """Two exports to one location interleaved their arrays: each erased the ledger, wrote its objects, and the last to
    finish wrote a finished ledger over arrays that could hold the other's rows. The export now holds the location's
    build lock; the second writer is refused while the first runs, naming the location."""
    import tokenmix.export.levanter as levanter_export
    from tokenmix.cache.lock import CacheLockedError

    started, go_on = threading.Event(), threading.Event()
    streamed = levanter_export.row_batches

    def held_after_the_first_batch(*args, **kwargs):
        for i, batch in enumerate(streamed(*args, **kwargs)):
            yield batch
            if i == 0 and threading.current_thread() is not threading.main_thread():  # the first export, in its thread
                started.set()
                assert go_on.wait(60)

    monkeypatch.setattr(levanter_export, "row_batches", held_after_the_first_batch)
    target = tmp_path / "lev" / "train"
    results: list = []
    first = threading.Thread(target=lambda: results.append(export_levanter(bos_cache, str(target), tokenizer=TOKENIZER, progress=False)))
    first.start()
    try:
        assert started.wait(60)
        with pytest.raises(CacheLockedError, match=f"{re.escape(str(target))} is being written by .* export to another location"):
            export_levanter(bos_cache, str(target), tokenizer=TOKENIZER, progress=False)
    finally:
        go_on.set()
        first.join()
    assert results and results[0]["documents"] == bos_cache.num_rows()
    source = {"train_urls": demo_urls("webster"), "cache_dir": str(tmp_path / "lev")}
    opened = tokenmix.open_cache(mixture(tmp_path, {"lev": source}, enforce_bos=True), "lev")
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(opened), rows_of(bos_cache), strict=True))
    assert not (target / "build.lock").exists()


def test_a_levanter_export_to_a_filesystem_without_flock_takes_a_lease_instead(tmp_path, bos_cache, monkeypatch):
    """On a network filesystem that takes no flock locks, the build lock's flock fails: the export takes the lease lock a
    build there is told to use (build.lock: lease) rather than refusing to export where it exported before."""
    import errno

    import tokenmix.cache.lock as lock_module

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_module.fcntl, "flock", no_flock)
    target = tmp_path / "lev" / "train"
    assert export_levanter(bos_cache, str(target), tokenizer=TOKENIZER, progress=False)["documents"] == bos_cache.num_rows()
    assert json.loads((target / "shard_ledger.json").read_text())["is_finished"]


@pytest.mark.parametrize("export", [export_megatron, export_datatrove, export_nanoset])
def test_a_file_export_to_a_directory_is_refused_before_writing_anything(tmp_path, text_cache, export):
    """An export whose files are named from its path, given a directory: Megatron's wrote ``DIR/.bin`` and ``DIR/.idx``
    (hidden, and reported as written), datatrove's and Nanoset's exported everything, then failed at the rename with a
    message about permissions."""
    existing = tmp_path / "exports"
    existing.mkdir()
    refused = [str(existing) + "/", str(tmp_path / "new") + "/"]
    if export is not export_megatron:  # a prefix may name a directory: DIR.bin and DIR.idx lie beside it
        refused.append(str(existing))
    for output in refused:
        with pytest.raises(ValueError, match=f"{re.escape(output)}: a .* export is written as files named from this path, and it "
                                             "names a directory; give a file path"):
            export(text_cache, output, progress=False)
    assert not list(existing.iterdir()) and not (tmp_path / "new").exists()


def test_exporting_an_interrupted_build_says_to_finish_it_not_to_wait(tmp_path, text_cache):
    """An export of a cache whose build was killed said it was "still building": with nothing running, a user waited."""
    location = tmp_path / "cache"
    shutil.copytree(text_cache.location, location)
    ledger = json.loads((location / "ledger.json").read_text())
    (location / "ledger.json").write_text(json.dumps({**ledger, "finished": False}))
    (location / "open.bin").unlink()
    with pytest.raises(ValueError, match=r"build has not finished: it is still running, or it was interrupted \(run build-cache again"):
        export_cache(TokenCache(str(location)), "megatron", str(tmp_path / "out" / "train"), progress=False)


def test_a_levanter_export_to_a_file_is_refused_naming_it(tmp_path, bos_cache):
    """It said "File exists. Choose a cache_dir this user can write to (and check the bucket's credentials ...)"."""
    target = tmp_path / "a.ds"
    target.write_bytes(b"not a directory")
    with pytest.raises(ValueError, match=f"{re.escape(str(target))} is a file; a Levanter cache is a directory"):
        export_levanter(bos_cache, str(target), tokenizer=TOKENIZER, progress=False)
    assert target.read_bytes() == b"not a directory"


def test_levanter_export_refuses_a_cache_that_masks_the_loss(tmp_path, supervised_cache):
    with pytest.raises(ValueError, match="Levanter's token caches hold ids only"):
        export_levanter(supervised_cache, str(tmp_path / "lev"), tokenizer=TOKENIZER, progress=False)


@pytest.mark.parametrize("kind", ["megatron", "nanoset"])
def test_megatron_and_nanoset_exports_refuse_a_cache_that_masks_the_loss(tmp_path, supervised_cache, kind):
    """Before, the loss spans were dropped: read back, the export trained on the prompts the cache masks."""
    export = {"megatron": export_megatron, "nanoset": export_nanoset}[kind]
    with pytest.raises(ValueError, match=r"hold ids only, and this cache's format masks the loss; export it to datatrove"):
        export(supervised_cache, str(tmp_path / "out" / "sup"), progress=False)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_an_export_that_fails_part_way_leaves_no_file(tmp_path, text_cache):
    class Failing:
        def __init__(self, cache):
            self.cache, self.reads = cache, 0

        def __getattr__(self, name):
            return getattr(self.cache, name)

        def read_tokens(self, start, stop):
            self.reads += 1
            if self.reads > 1:
                raise OSError("disk went away")
            return self.cache.read_tokens(start, stop)

    from tokenmix.export import streaming

    old = streaming.BATCH_TOKENS
    streaming.BATCH_TOKENS = 50_000
    try:
        with pytest.raises(OSError, match="disk went away"):
            export_megatron(Failing(text_cache), str(tmp_path / "m" / "web"), progress=False)
    finally:
        streaming.BATCH_TOKENS = old
    assert os.listdir(tmp_path / "m") == []
    assert not os.path.exists(partial_name(str(tmp_path / "m" / "web.bin")))


@pytest.mark.parametrize("kind", ["megatron", "datatrove", "nanoset"])
def test_a_second_export_to_a_path_another_is_writing_is_refused_and_the_first_ends_whole(tmp_path, text_cache, bos_cache, kind):
    """Two exports of different caches to one path at once: the second is refused while the first writes (it took the
    first's partial files for an interrupted export's, and the first then renamed the second's into place)."""
    export = {"megatron": export_megatron, "datatrove": export_datatrove, "nanoset": export_nanoset}[kind]
    path = str(tmp_path / "out" / {"megatron": "web", "datatrove": "web.ds", "nanoset": "web_input_ids.npy"}[kind])
    reading, go = threading.Event(), threading.Event()

    class Held:
        def __init__(self, cache):
            self.cache = cache

        def __getattr__(self, name):
            return getattr(self.cache, name)

        def read_tokens(self, start, stop):
            reading.set()
            assert go.wait(60)
            return self.cache.read_tokens(start, stop)

    first: dict = {}
    writer = threading.Thread(target=lambda: first.update(export(Held(text_cache), path, progress=False)))
    writer.start()
    try:
        assert reading.wait(60)
        with pytest.raises(FileExistsError, match="another export is writing it"):
            export(bos_cache, path, progress=False)
    finally:
        go.set()
        writer.join(60)
    assert first["tokens"] == text_cache.num_tokens()
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".partial")]
    options = {"kind": kind, **({"dtype": "uint16"} if kind == "nanoset" else {})}
    opened = tokenmix.open_cache(mixture(tmp_path, {"web": {"train_urls": [path], "token_files": options}}), "web")
    assert np.array_equal(opened.read_tokens(0, opened.num_tokens()), text_cache.read_tokens(0, text_cache.num_tokens()))


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_a_symbolic_link_where_an_export_writes_its_partial_file_is_refused_and_its_target_untouched(tmp_path, text_cache, suffix):
    """Before, the partial file was opened through a link planted at its name, writing token bytes over the link's target."""
    target = tmp_path / "precious"
    target.write_bytes(b"not yours")
    prefix = tmp_path / "m" / "web"
    prefix.parent.mkdir()
    partial = Path(partial_name(str(prefix) + suffix))
    partial.symlink_to(target)
    with pytest.raises(UnsafeFileError, match=rf"{partial}: the partial export file is a symbolic link \(to {target}\)"):
        export_megatron(text_cache, str(prefix), progress=False)
    assert target.read_bytes() == b"not yours" and partial.is_symlink()
    assert not os.path.exists(str(prefix) + ".bin") and not os.path.exists(str(prefix) + ".idx")


@pytest.mark.parametrize("damage,message", [
    (lambda p: open(p + ".idx", "r+b").write(b"NOTMEGA"), "not a Megatron index"),
    (lambda p: os.truncate(p + ".idx", 40), "the file is truncated: copy the files again .*or write them again"),
    (lambda p: os.truncate(p + ".idx", 0), r"web.idx: 0 bytes is shorter than the Megatron index header; the file is truncated: copy the files"),
    (lambda p: os.truncate(p + ".bin", 100), "the .bin file is truncated or belongs to another index: copy the files again"),
    (lambda p: os.remove(p + ".idx"), "no such file"),
])
def test_damaged_megatron_files_are_refused_naming_the_file(tmp_path, text_cache, damage, message):
    prefix = str(tmp_path / "web")
    export_megatron(text_cache, prefix, progress=False)
    damage(prefix)
    config = mixture(tmp_path, {"m": {"train_urls": [prefix], "token_files": {"kind": "megatron"}}})
    with pytest.raises(TokenFileError, match=message):
        tokenmix.open_cache(config, "m")


@pytest.mark.parametrize("document_indices,message", [
    ([0, 1, 5], "ends at sequence 5, not at the 3 sequences"),
    ([0, 1], "ends at sequence 1, not at the 3 sequences"),
    ([1, 2, 3], "starts at sequence 1, not 0"),
    ([0, 2, 1, 3], "goes back from sequence 2 to 1"),
    ([], "has no entries"),
])
def test_a_megatron_document_index_that_does_not_cover_the_sequences_is_refused(tmp_path, document_indices, message):
    """Before, the document index was not read: one that megatron-core refuses (its last entry must be the sequence
    count) was opened, and its document count reported, as if whole."""
    write_megatron_by_hand(str(tmp_path / "d"), [np.arange(1, 4), np.arange(4, 6), np.arange(6, 9)], np.uint16, 8, document_indices)
    config = mixture(tmp_path, {"m": {"train_urls": [str(tmp_path / "d")], "token_files": {"kind": "megatron"}}})
    with pytest.raises(TokenFileError, match=rf"{re.escape(str(tmp_path / 'd.idx'))}: the document index .*{message}.*damaged"):
        tokenmix.open_cache(config, "m")


@pytest.mark.parametrize("index,message", [
    (b"", "lists no documents, but the file holds 10 tokens"),
    (np.array([4, 10], "<u8").tobytes() + b"\x01", "17 bytes is not a whole number of 8-byte document ends"),
])
def test_a_datatrove_index_that_lists_no_documents_or_has_a_partial_entry_is_refused(tmp_path, index, message):
    """Before, an empty ``.ds.index`` gave a file of 10 tokens no documents (every token silently dropped), and a
    trailing partial entry was ignored."""
    path = tmp_path / "d.ds"
    np.arange(1, 11, dtype="<u2").tofile(path)
    (tmp_path / "d.ds.index").write_bytes(index)
    config = mixture(tmp_path, {"d": {"train_urls": [str(path)], "token_files": {"kind": "datatrove"}}})
    with pytest.raises(TokenFileError, match=rf"{re.escape(str(path))}.index: {message}"):
        tokenmix.open_cache(config, "d")


def test_datatrove_files_whose_metadata_names_only_the_tokenizer_are_read_as_uint16(tmp_path):
    """datatrove before its token_size option wrote uint16 tokens and a ``.metadata`` whose first line is the tokenizer
    name alone (then the token count); before, such files were refused as if the metadata were damaged."""
    path = tmp_path / "00000_shuffled.ds"
    np.array([7, 8, 9, 10, 11], "<u2").tofile(path)
    np.array([2, 5], "<u8").tofile(tmp_path / "00000_shuffled.ds.index")
    (tmp_path / "00000_shuffled.ds.metadata").write_text("gpt2\n5\n5T")
    config = mixture(tmp_path, {"d": {"train_urls": [str(path)], "token_files": {"kind": "datatrove"}}})
    assert [r.tolist() for r in rows_of(tokenmix.open_cache(config, "d"))] == [[7, 8], [9, 10, 11]]


def _npy_object_array(path: Path) -> None:
    np.save(path, np.array(["a", "b"], dtype=object), allow_pickle=True)


@pytest.mark.parametrize("damage,message", [
    (lambda path: os.truncate(path, path.stat().st_size - 51), "mmap length is greater than file size"),
    (lambda path: os.truncate(path, 9), "reading array header length"),
    (_npy_object_array, "Python objects in dtype"),
])
def test_a_headed_nanoset_file_that_numpy_cannot_map_is_refused_naming_the_file(tmp_path, damage, message):
    """Before, numpy's ValueError came through bare ("mmap length is greater than file size"), naming no file."""
    path = tmp_path / "x_input_ids.npy"
    np.save(path, np.arange(100, dtype=np.uint16))
    damage(path)
    config = mixture(tmp_path, {"n": {"train_urls": [str(path)], "token_files": {"kind": "nanoset"}}})
    with pytest.raises(TokenFileError, match=rf"{re.escape(str(path))}: numpy cannot map it as a .npy array \(.*{message}.*\); the "
                                             "file is cut short or damaged"):
        tokenmix.open_cache(config, "n")


def test_a_datatrove_document_of_no_tokens_is_read_as_an_empty_document(tmp_path):
    """datatrove's tokenizer writes a document whose tokens were all cut off with its loss values (or one of no text and
    no EOS) as an end equal to the one before; before, such an index was refused as "must increase"."""
    path = tmp_path / "d.ds"
    np.array([7, 8, 9, 10, 11], "<u2").tofile(path)
    np.array([0, 2, 2, 5], "<u8").tofile(tmp_path / "d.ds.index")
    config = mixture(tmp_path, {"d": {"train_urls": [str(path)], "token_files": {"kind": "datatrove"}}})
    assert [r.tolist() for r in rows_of(tokenmix.open_cache(config, "d"))] == [[], [7, 8], [], [9, 10, 11]]


def test_nanoset_and_datatrove_errors_name_the_fix(tmp_path, text_cache):
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "x_input_ids.npy")
    with pytest.raises(TokenFileError, match="set token_files.dtype"):
        tokenmix.open_cache(mixture(tmp_path, {"n": {"train_urls": [str(tmp_path / "x_input_ids.npy")], "token_files": {"kind": "nanoset"}}}), "n")
    path = str(tmp_path / "d.ds")
    export_datatrove(text_cache, path, progress=False)
    np.array([5, 3], "<u8").tofile(path + ".index")
    with pytest.raises(TokenFileError, match="document ends must increase"):
        tokenmix.open_cache(mixture(tmp_path, {"d": {"train_urls": [path], "token_files": {"kind": "datatrove"}}}), "d")
    with pytest.raises(ValueError, match="eos_id splits Nanoset streams"):  # datatrove files index their documents
        mixture(tmp_path, {"d": {"train_urls": [path], "token_files": {"kind": "datatrove", "eos_id": 0}}})


def nanotron_yaml(tmp_path, stages: str, tokenizer: str = TOKENIZER) -> str:
    path = tmp_path / "nanotron.yaml"
    path.write_text(f"""
tokenizer:
  tokenizer_name_or_path: {tokenizer}
tokens:
  sequence_length: {SEQ_LEN}
  micro_batch_size: 4
  batch_accumulation_per_replica: 2
  train_steps: 100
parallelism:
  dp: 2
data_stages:
{stages}
""")
    return str(path)


def test_a_nanotron_data_stages_config_loads_as_a_staged_mixture_of_nanosets(tmp_path, text_cache):
    export_nanoset(text_cache, str(tmp_path / "web_input_ids.npy"), progress=False)
    export_nanoset(text_cache, str(tmp_path / "europarl_input_ids.npy"), progress=False)
    path = nanotron_yaml(tmp_path, f"""
  - name: Stable training
    start_training_step: 1
    data:
      dataset:
        data_path:
          {tmp_path}/web_input_ids.npy: 0.8
          {tmp_path}/europarl_input_ids.npy: 0.2
        split: 949,50,1
        path_to_cache: {tmp_path}/.nanoset_cache
      num_loading_workers: 0
      seed: 1234
  - name: Annealing
    start_training_step: 11
    data:
      dataset:
        data_path: {tmp_path}/europarl_input_ids.npy
        split: 949,50,1
        path_to_cache: {tmp_path}/.nanoset_cache
      seed: 1234
""")
    config = tokenmix.load_data_config(path)
    assert sorted(config.configs) == ["europarl", "web"] and config.seed == 1234 and config.batch_size == 16
    assert config.configs["web"].token_files.kind == "nanoset" and config.configs["web"].token_files.dtype == "uint16"
    assert config.weight_schedule() == [(0, {"web": 0.8, "europarl": 0.2}), (160, {"europarl": 1.0})]
    train = config.train_set(SEQ_LEN)
    assert train.tokens_per_example == SEQ_LEN + 1
    first, annealing = train.get_batch(range(160)), train.get_batch(range(160, 320))
    assert list(config.configs) == ["web", "europarl"]  # source ids in this order
    assert np.bincount(annealing.source_ids, minlength=2).tolist() == [0, 160]
    assert np.bincount(first.source_ids, minlength=2).tolist() == [128, 32]
    samples = (text_cache.num_tokens() - 1) // SEQ_LEN
    bounds = split_bounds(samples, (949, 50, 1))
    assert len(config.train_sources(SEQ_LEN)["web"]) == bounds[1]
    assert len(config.validation_sets(SEQ_LEN)["web"]) == bounds[2] - bounds[1]


@pytest.mark.parametrize("vocab_size", [65535, 65536])
def test_a_nanoset_export_of_a_vocabulary_of_up_to_65536_ids_reads_back_through_a_nanotron_config(tmp_path, vocab_size):
    """Nanotron stores ids as uint16 while ``len(tokenizer) <= 65536`` (run_train.py); a Nanotron config naming the
    export must read it as the export wrote it, the highest ids included."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token="0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "tok").mkdir()
    words.save(str(tmp_path / "tok" / "tokenizer.json"))
    rng = np.random.default_rng(0)
    docs = [rng.integers(vocab_size - 300, vocab_size, 50 + i) for i in range(20)]
    location = str(tmp_path / "cache")
    build(location, [write_jsonl(tmp_path / "ids.jsonl", [{"text": " ".join(map(str, d))} for d in docs])],
          tokenizer=str(tmp_path / "tok"), tokenization={"enforce_eos": False})
    cache = TokenCache(location)
    export_nanoset(cache, str(tmp_path / "big_input_ids.npy"), progress=False)
    path = nanotron_yaml(tmp_path, f"""
  - name: Stable training
    start_training_step: 1
    data:
      dataset:
        data_path: {tmp_path}/big_input_ids.npy
      seed: 1234
""", tokenizer=str(tmp_path / "tok"))
    read = tokenmix.open_cache(tokenmix.load_data_config(path), "big")
    assert read.num_tokens() == cache.num_tokens()
    np.testing.assert_array_equal(read.read_tokens(0, read.num_tokens()), cache.read_tokens(0, cache.num_tokens()))


def test_a_nanotron_config_with_a_datatrove_folder_and_bad_stages(tmp_path, text_cache):
    export_datatrove(text_cache, str(tmp_path / "dt" / "000.ds"), progress=False)
    path = nanotron_yaml(tmp_path, f"""
  - name: only
    start_training_step: 1
    data:
      dataset:
        dataset_folder: {tmp_path}/dt
      seed: 5
""")
    config = tokenmix.load_data_config(path)
    assert config.configs["dt"].token_files.kind == "datatrove" and config.example_convention == "datatrove"
    assert tokenmix.open_cache(config, "dt").num_rows() == text_cache.num_rows()
    late = nanotron_yaml(tmp_path, f"""
  - name: late
    start_training_step: 5
    data:
      dataset:
        data_path: {tmp_path}/dt
""")
    with pytest.raises(tokenmix.ConfigError, match="first stage starts at step 5"):
        tokenmix.load_data_config(late)


def test_the_export_command_converts_a_sources_token_files_and_a_cache(tmp_path, text_cache, capsys):
    from tokenmix.cli.main import main
    from tokenmix.export import read_hdf5_samples

    export_megatron(text_cache, str(tmp_path / "m" / "web"), progress=False)
    cfg = tmp_path / "data.yaml"
    cfg.write_text(f"tokenizer: {TOKENIZER}\ncache_dir: {tmp_path}/caches\nconfigs:\n  web:\n"
                   f"    train_urls: [{tmp_path}/m/web]\n    token_files: {{kind: megatron}}\n")
    assert main(["export", "--to", "hdf5", "--output", str(tmp_path / "h5"), "--config_path", str(cfg), "--source", "web",
                 "--max_seq_length", "256", "--pack_sequences", "true", "--files_per_record", "100", "--compression", "none"]) == 0
    result = json.loads(capsys.readouterr().out)
    samples = np.concatenate(list(read_hdf5_samples(str(tmp_path / "h5"))))
    assert json.loads((tmp_path / "h5" / "data_params.json").read_text())["tokenmix"]["compression"] is None
    assert samples.shape[1:] == (3, 256) and result["num_sequences"] == len(samples)
    stream = text_cache.read_tokens(0, text_cache.num_tokens())
    assert np.array_equal(samples[0, 0], stream[:256]) and np.array_equal(samples[0, 2], stream[1:257])
    assert main(["export", "--to", "datatrove", "--output", str(tmp_path / "d" / "web.ds"), "--cache", text_cache.location]) == 0
    assert np.array_equal(np.fromfile(tmp_path / "d" / "web.ds", np.uint16), stream)
    assert main(["export", "--to", "nanoset", "--output", str(tmp_path / "x.npy"), "--cache", str(tmp_path / "nowhere")]) == 1


def test_an_export_of_a_cache_whose_tokenizer_moved_names_the_option_that_gives_it(tmp_path, caplog):
    """The path came from the cache's ledger, not from the command: the error said to check a path the user never gave."""
    from tokenmix.cli.main import main

    shutil.copytree(TOKENIZER, tmp_path / "tok")
    build(str(tmp_path / "cache"), demo_urls("webster")[:1], tokenizer=str(tmp_path / "tok"), tokenization={"enforce_bos": True})
    (tmp_path / "tok").rename(tmp_path / "moved")
    for to in ("hdf5", "levanter"):
        caplog.clear()
        assert main(["export", "--to", to, "--output", str(tmp_path / to), "--cache", str(tmp_path / "cache")]) == 1
        assert re.search(rf"{re.escape(str(tmp_path / 'tok'))}.* recorded in the cache's ledger .*give --tokenizer", caplog.text)
        assert main(["export", "--to", to, "--output", str(tmp_path / to), "--cache", str(tmp_path / "cache"),
                     "--tokenizer", str(tmp_path / "moved")]) == 0


@pytest.mark.parametrize("pack", [True, False])
def test_a_cerebras_lm_export_reads_back_as_a_source_with_identical_documents(tmp_path, text_cache, pack):
    from tokenmix.export import Hdf5ExportOptions, export_hdf5

    options = Hdf5ExportOptions(max_seq_length=300, pack_sequences=pack, min_sequence_len=1, files_per_record=200,
                                short_seq_prob=0.3 if pack else 0.0, seed=3, keep_last_window=True, short_seq_carry=True)
    export_hdf5(text_cache, str(tmp_path / "h5"), options, progress=False)
    config = mixture(tmp_path, {"h5": {"train_urls": [str(tmp_path / "h5")], "token_files": {"kind": "hdf5"}}})
    opened = tokenmix.open_cache(config, "h5")
    assert opened.num_rows() == text_cache.num_rows() and not opened.has_loss_spans
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(opened), rows_of(text_cache)))


def test_a_cerebras_summarization_export_reads_back_with_its_loss_masks(tmp_path, supervised_cache):
    from tokenmix.export import Hdf5ExportOptions, export_hdf5

    export_hdf5(supervised_cache, str(tmp_path / "h5"), Hdf5ExportOptions(mode="summarization", max_seq_length=128,
                                                                            min_sequence_len=1), progress=False)
    config = mixture(tmp_path, {"sup": {"train_urls": [str(tmp_path / "h5")], "token_files": {"kind": "hdf5"},
                                        "format": {"type": "supervised"}}})
    opened = tokenmix.open_cache(config, "sup")
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(opened), rows_of(supervised_cache)))
    for got, want in zip(opened.loss_spans(0, opened.num_rows()), supervised_cache.loss_spans(0, supervised_cache.num_rows())):
        assert np.array_equal(got, want)
    as_cerebras = tmp_path / "modelzoo"  # create_hdf5_dataset.py names its processor in setup, not the mode
    shutil.copytree(tmp_path / "h5", as_cerebras)
    params = json.loads((as_cerebras / "data_params.json").read_text())
    assert params["setup"].pop("mode") == "Summarization" and params["setup"]["dataset_processor"] == "SummarizationPreprocessor"
    (as_cerebras / "data_params.json").write_text(json.dumps(params))
    config = mixture(tmp_path, {"cb": {"train_urls": [str(as_cerebras)], "token_files": {"kind": "hdf5"}, "format": {"type": "supervised"}}})
    assert all(np.array_equal(a, b) for a, b in zip(rows_of(tokenmix.open_cache(config, "cb")), rows_of(supervised_cache)))
    params["setup"]["dataset_processor"] = "FIMDataPreprocessor"
    (as_cerebras / "data_params.json").write_text(json.dumps(params))
    config = mixture(tmp_path, {"fim": {"train_urls": [str(as_cerebras)], "token_files": {"kind": "hdf5"}}})
    with pytest.raises(TokenFileError, match=r"Cerebras's 'FIM' mode .*export the documents again in LMData mode"):
        tokenmix.open_cache(config, "fim")
    with pytest.raises(TokenFileError, match="no data_params.json"):
        tokenmix.open_cache(mixture(tmp_path, {"x": {"train_urls": [str(tmp_path)], "token_files": {"kind": "hdf5"}}}), "x")


def _cut_in_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _samples_of_another_length(path: Path) -> None:
    import h5py

    path.unlink()
    with h5py.File(path, "w") as h5:
        h5.create_dataset("data", data=np.ones((2, 3, 64), np.int32))


@pytest.mark.parametrize("damage,message", [
    (_cut_in_half, r"{second}: cannot be read as HDF5 \(.*truncated.*\); the file is cut short or damaged"),
    (lambda path: path.write_bytes(b"not hdf5" * 100), r"{second}: cannot be read as HDF5 \(.*signature.*\)"),
    (_samples_of_another_length, r"{second}: samples of 64 positions, but {first}'s are 300"),
    (lambda path: (path.parent / "data_params.json").write_text("{setup: 1}"),
     r"{params}: not JSON \(.* line 1, column 2\)"),
])
def test_a_damaged_cerebras_hdf5_directory_is_refused_naming_the_file(tmp_path, text_cache, damage, message):
    """Before, h5py's and numpy's errors came through bare: "Unable to synchronously open file (truncated file ...)" and
    "all the input array dimensions ... must match", naming no file of the directory."""
    from tokenmix.export import Hdf5ExportOptions, export_hdf5

    export_hdf5(text_cache, str(tmp_path / "h5"), Hdf5ExportOptions(max_seq_length=300, files_per_record=1000), progress=False)
    first, second = sorted((tmp_path / "h5").glob("*.h5"))[:2]
    damage(second)
    config = mixture(tmp_path, {"h5": {"train_urls": [str(tmp_path / "h5")], "token_files": {"kind": "hdf5"}}})
    names = {"first": re.escape(first.name), "second": re.escape(str(second)), "params": re.escape(str(tmp_path / "h5" / "data_params.json"))}
    with pytest.raises(TokenFileError, match=message.format(**names)):
        tokenmix.open_cache(config, "h5")


def test_datatrove_windows_stay_inside_each_file_as_nanotrons_datatrove_nanosets_read_them(tmp_path, text_cache):
    """DatatroveFolderDataset: file after file, windows of seq_len + 1 tokens with no overlap, a file's partial last
    window left out (its len is tokens // (seq_len + 1)); each window's segment ids restart at each document."""
    rows = rows_of(text_cache)
    width = SEQ_LEN + 1
    total = sum(len(r) for r in rows)
    # a split whose two partial last windows add up to more than a window, so windows across files would differ in count
    half = next(h for h in range(1, len(rows)) if sum(len(r) for r in rows[:h]) % width + (total - sum(len(r) for r in rows[:h])) % width >= width)
    folder = tmp_path / "dt"
    for name, part in (("000.ds", rows[:half]), ("001.ds", rows[half:])):
        folder.mkdir(exist_ok=True)
        np.concatenate(part).astype("<u2").tofile(folder / name)
        np.cumsum([len(r) for r in part]).astype("<u8").tofile(folder / (name + ".index"))
    config = mixture(tmp_path, {"dt": {"train_urls": [str(folder)], "token_files": {"kind": "datatrove"}}},
                     example_convention="datatrove")
    examples = config.train_sources(SEQ_LEN)["dt"]
    files = [np.fromfile(folder / n, "<u2") for n in ("000.ds", "001.ds")]
    expected = [f[w * width : (w + 1) * width] for f in files for w in range(len(f) // width)]
    assert examples.tokens_per_example == width and len(examples) == len(expected)
    assert sum(len(f) for f in files) // width > len(expected)  # windows across the file boundary would make more
    batch = examples.get_batch(range(len(expected)))
    assert np.array_equal(batch.tokens, np.stack(expected))
    doc_starts = [np.cumsum([0] + [len(r) for r in part])[:-1] for part in (rows[:half], rows[half:])]
    segments = [np.searchsorted(starts, w * width + np.arange(width), side="right") - np.searchsorted(starts, w * width, side="right")
                for f, starts in zip(files, doc_starts) for w in range(len(f) // width)]
    assert np.array_equal(batch.segment_ids, np.stack(segments))  # segments restart at each document, counted within its file
