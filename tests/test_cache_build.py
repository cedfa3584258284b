"""Building caches from the real demo corpus with the real tokenizer: order, workers, reading, identity."""

import json

import numpy as np
import pytest
from helpers import TOKENIZER, build, cache_bytes, demo_urls, encoder_for, write_jsonl
from hypothesis import given
from hypothesis import strategies as st

from tokenmix import CacheMismatchError, ShardListMismatchError, TextLmDatasetFormat, TokenCache
from tokenmix.cache.builder import CacheBuilder
from tokenmix.cache.open_object import OPEN_FILE
from tokenmix.cache.options import BuildOptions
from tokenmix.sources import FileShard


def expected_rows(hf_tokenizer, records, eos=0):
    return [hf_tokenizer(r["text"], add_special_tokens=False)["input_ids"] + [eos] for r in records]


def test_rows_are_the_documents_in_listed_shard_order(tmp_path, demo_docs, hf_tokenizer):
    stats = build(str(tmp_path / "c"), demo_urls("webster"))
    cache = TokenCache(str(tmp_path / "c"))
    records = demo_docs["webster"]
    assert cache.num_rows() == stats["documents"] == len(records)
    want = expected_rows(hf_tokenizer, records)
    got = cache.get_rows(range(len(records)))
    assert [g.tolist() for g in got] == want
    assert cache.num_tokens() == stats["tokens"] == sum(map(len, want))
    assert cache.dtype == np.uint16
    assert cache.read_tokens(0, 5).tolist() == want[0][:5]


def test_reversed_shard_list_starts_with_the_other_shard(tmp_path, hf_tokenizer):
    urls = demo_urls("linux_doc")
    build(str(tmp_path / "c"), urls[::-1])
    first_record = json.loads(next(iter(FileShard(urls[1]).read())).records[0])
    assert TokenCache(str(tmp_path / "c"))[0].tolist() == expected_rows(hf_tokenizer, [first_record])[0]


@pytest.mark.slow
def test_worker_count_does_not_change_a_single_byte(tmp_path):
    urls = demo_urls("python_doc") + demo_urls("webster")
    results = {}
    for workers in (0, 1, 2, 3):
        location = str(tmp_path / f"w{workers}")
        build(location, urls, num_workers=workers, chunk_bytes=64 << 10, commit_interval_s=0.0)
        results[workers] = cache_bytes(location)
    assert results[0].keys() == results[2].keys()
    for workers in (1, 2, 3):
        assert results[workers] == results[0], f"{workers} workers built different bytes"


def test_memory_driver_holds_a_cache(demo_docs, hf_tokenizer):
    location = "memory://test-cache/webster/train"
    stats = build(location, demo_urls("webster")[:1])
    cache = TokenCache(location)
    assert cache.num_rows() == stats["documents"] > 0
    assert cache[3].tolist() == expected_rows(hf_tokenizer, [demo_docs["webster"][3]])[0]


def test_reading_while_building_sees_a_growing_committed_prefix(growing_cache, demo_docs, hf_tokenizer):
    growing = growing_cache(demo_urls("webster") + demo_urls("linux_doc"), held_from=2, chunk_bytes=32 << 10)
    cache = growing.open()
    first_two = len(demo_docs["webster"])
    rows = cache.wait_for_rows(first_two, timeout=60)
    assert rows == first_two
    assert not cache.is_finished()
    with pytest.raises(TimeoutError):
        cache.wait_for_rows(first_two + 1, timeout=0.3)
    assert [r.tolist() for r in cache.get_rows([0, first_two - 1])] == expected_rows(
        hf_tokenizer, [demo_docs["webster"][0], demo_docs["webster"][-1]])
    with pytest.raises(IndexError):
        cache.get_rows([first_two])
    growing.finish()
    total = cache.wait_until_finished(timeout=60)
    assert total == first_two + len(demo_docs["linux_doc"])
    assert cache.stats()["documents"] == total


def test_a_finished_cache_rebuild_is_a_no_op(tmp_path):
    location = str(tmp_path / "c")
    first = build(location, demo_urls("webster"))
    before = {name: (tmp_path / "c" / name).read_bytes() for name in ("ledger.json", "stats.json")}
    stats = build(location, demo_urls("webster"))
    assert stats == {**first, "already_built": True}  # the record of the build that made it, marked: nothing was built now
    assert stats["build"]["resumed_at_row"] == 0 and stats["build"]["tokens_this_run"] == stats["tokens"]
    assert {name: (tmp_path / "c" / name).read_bytes() for name in before} == before  # not even rewritten


def test_appending_shards_extends_without_redoing(tmp_path):
    urls = demo_urls("webster") + demo_urls("python_doc")
    once = str(tmp_path / "once")
    build(once, urls)
    grown = str(tmp_path / "grown")
    first = build(grown, urls[:2])
    stats = build(grown, urls)
    assert stats["build"]["resumed_at_row"] == first["documents"]
    assert stats["build"]["tokens_this_run"] == stats["tokens"] - first["tokens"]
    assert cache_bytes(grown) == cache_bytes(once)


def test_a_cache_being_extended_has_no_open_object_so_readers_see_its_ledger(tmp_path):
    """A finished cache opens from its open object; a build that extends it removes that object before anything else,
    so a reader opening it meanwhile is not told it is finished with its old rows, and the finished build writes it
    again for all the rows."""
    urls = demo_urls("webster") + demo_urls("python_doc")
    location = str(tmp_path / "c")
    first = build(location, urls[:2])
    assert (tmp_path / "c" / OPEN_FILE).exists()
    spec, identity = encoder_for()
    builder = CacheBuilder(location, [FileShard(u) for u in urls], spec, identity, BuildOptions(num_workers=0), info={})
    extending = builder.open()
    try:
        assert not (tmp_path / "c" / OPEN_FILE).exists()
        reader = TokenCache(location)
        assert not reader.is_finished() and reader.num_rows() == first["documents"]
    finally:
        extending.close()
    grown = build(location, urls)
    reader = TokenCache(location)
    assert reader.is_finished() and len(reader.committed_row_ends(0)) == grown["documents"] > first["documents"]


def test_changing_or_reordering_listed_shards_is_refused(tmp_path):
    urls = demo_urls("webster")
    location = str(tmp_path / "c")
    build(location, urls)
    with pytest.raises(ShardListMismatchError, match="differs at shard 0"):
        build(location, urls[::-1])
    with pytest.raises(ShardListMismatchError, match="can only be appended"):
        build(location, urls[:1])


def test_opening_with_a_different_tokenizer_format_or_options_is_refused(tmp_path, tiny_tokenizer):
    url = write_jsonl(tmp_path / "a.jsonl", [{"text": "the quick brown fox", "body": "x"}])
    location = str(tmp_path / "c")
    build(location, [url])
    _, identity = encoder_for()
    TokenCache(location, expected_identity=identity)
    for kwargs, field in (
        ({"tokenizer": tiny_tokenizer}, "tokenizer_fingerprint"),
        ({"fmt": TextLmDatasetFormat(text_key="body")}, "format"),
        ({"tokenization": {"enforce_eos": False}}, "eos_id"),
        ({"tokenization": {"enforce_bos": True}}, "bos_id"),
    ):
        with pytest.raises(CacheMismatchError) as err:
            build(location, [url], **kwargs)
        message = str(err.value)
        assert field in message and "fingerprint" in message
        fmt = kwargs.get("fmt")
        tok = kwargs.get("tokenizer", TOKENIZER)
        _, other = encoder_for(fmt, tok, **kwargs.get("tokenization", {}))
        with pytest.raises(CacheMismatchError):
            TokenCache(location, expected_identity=other)


def test_bos_and_eos_are_token_ids_not_pasted_text(tmp_path, hf_tokenizer):
    text = "a document that mentions <|endoftext|> only as prose? no: as text"
    url = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}])
    build(str(tmp_path / "c"), [url], tokenization={"enforce_bos": True})
    row = TokenCache(str(tmp_path / "c"))[0].tolist()
    assert row == [0] + hf_tokenizer("hello world", add_special_tokens=False)["input_ids"] + [0]
    ledger = json.loads((tmp_path / "c" / "ledger.json").read_text())
    assert ledger["identity"]["bos_id"] == 0 and ledger["identity"]["eos_id"] == 0
    build(str(tmp_path / "d"), [url], tokenization={"enforce_eos": False})
    assert TokenCache(str(tmp_path / "d"))[0].tolist() == hf_tokenizer("hello world", add_special_tokens=False)["input_ids"]
    assert text


def test_pretokenized_records_are_stored_as_they_are(tmp_path):
    url = write_jsonl(tmp_path / "a.jsonl", [{"input_ids": [5, 6, 7]}, {"text": "hi"}, {"input_ids": [31999]}])
    build(str(tmp_path / "c"), [url])
    rows = [r.tolist() for r in TokenCache(str(tmp_path / "c")).get_rows([0, 2])]
    assert rows == [[5, 6, 7], [31999]]


def test_list_valued_text_is_joined_with_blank_lines(tmp_path, hf_tokenizer):
    url = write_jsonl(tmp_path / "a.jsonl", [{"text": ["first part", "second part"]}])
    build(str(tmp_path / "c"), [url])
    want = hf_tokenizer("first part\n\nsecond part", add_special_tokens=False)["input_ids"] + [0]
    assert TokenCache(str(tmp_path / "c"))[0].tolist() == want


def test_statistics_describe_the_cache(tmp_path, demo_docs):
    stats = build(str(tmp_path / "c"), demo_urls("python_doc"))
    records = demo_docs["python_doc"]
    assert stats["documents"] == stats["records"] == len(records)
    assert stats["raw_chars"] == sum(len(r["text"]) for r in records)
    assert stats["raw_bytes"] == sum(len(r["text"].encode()) for r in records)
    lengths = stats["document_length_tokens"]
    assert lengths["min"] <= lengths["p10"] <= lengths["p50"] <= lengths["p90"] <= lengths["max"]
    assert sum(s["documents"] for s in stats["shards"].values()) == len(records)
    assert stats["build"]["seconds"] > 0 and stats["build"]["tokens_per_second"] > 0
    on_disk = json.loads((tmp_path / "c" / "stats.json").read_text())
    assert on_disk["tokens"] == stats["tokens"]


def test_cache_locations_map_to_tensorstore_kvstores(tmp_path):
    from tokenmix.cache.store import kvstore_spec
    from tokenmix.sources.urls import join_location

    assert kvstore_spec(str(tmp_path / "c")) == {"driver": "file", "path": f"{tmp_path}/c/"}
    assert kvstore_spec(f"file://{tmp_path}/c/") == {"driver": "file", "path": f"{tmp_path}/c/"}
    assert kvstore_spec("gs://bucket/caches/web/train") == {"driver": "gcs", "bucket": "bucket", "path": "caches/web/train/"}
    assert kvstore_spec("s3://bucket/caches/web") == {"driver": "s3", "bucket": "bucket", "path": "caches/web/"}
    assert kvstore_spec("memory://scratch/x") == {"driver": "memory", "path": "scratch/x/"}
    assert join_location("gs://b/c/", "web", "train") == "gs://b/c/web/train"
    with pytest.raises(ValueError, match="not supported"):
        kvstore_spec("ftp://host/c")


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=300))
def test_length_percentiles_are_numpys_to_the_bit(lengths):
    from tokenmix.cache.stats import _PERCENTILES, length_percentiles

    array = np.array(lengths, np.int64)
    assert length_percentiles(array.copy()) == np.percentile(array, _PERCENTILES).tolist()
