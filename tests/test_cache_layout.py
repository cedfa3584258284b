"""The cache layout: zarr3 shards of small compressed chunks, caches of the previous layout still open, resume and
extend, and exact reads (a corpus the chunk cache cannot hold) give the very batches block reads give."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorstore as ts
from helpers import REPO, TOKENIZER, build, cache_bytes, demo_urls

from tokenmix import CacheDamagedError, PackedDataset, TokenCache, TokenSeqDataset
from tokenmix.cache import store
from tokenmix.cache.chunk_cache import ChunkCache

PAD = 1


def _legacy_arrays(location: str) -> None:
    """The arrays as tokenmix made them before shards: one zstd chunk of 2^18 tokens (2^16 row ends) per object."""
    for sub, dtype, chunk in (("input_ids/data", "uint16", 1 << 18), ("input_ids/offsets", "int64", 1 << 16)):
        ts.open({"driver": "zarr3", "kvstore": store._subspec(location, sub), "metadata": {
            "shape": [store.CAPACITY], "data_type": dtype, "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}]}},
            create=True).result()


def _rows(location: str) -> list[list[int]]:
    cache = TokenCache(location)
    return [r.tolist() for r in cache.get_rows(range(cache.num_rows()))]


def test_tokens_are_stored_in_shards_of_small_separately_compressed_chunks(tmp_path):
    location = str(tmp_path / "c")
    build(location, demo_urls("linux_doc"))
    meta = json.loads((tmp_path / "c" / "input_ids" / "data" / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [store.DATA_SHARD]
    (sharding,) = meta["codecs"]
    assert sharding["name"] == "sharding_indexed" and sharding["configuration"]["chunk_shape"] == [store.DATA_INNER]
    assert [c["name"] for c in sharding["configuration"]["codecs"]] == ["bytes", "zstd", "crc32c"]
    objects = list((tmp_path / "c" / "input_ids" / "data" / "c").iterdir())
    assert len(objects) == -(-TokenCache(location).num_tokens() // store.DATA_SHARD)


def test_a_cache_of_the_previous_layout_opens_resumes_and_extends_in_its_own_layout(tmp_path):
    urls = demo_urls("linux_doc")
    legacy, current = str(tmp_path / "legacy"), str(tmp_path / "current")
    _legacy_arrays(legacy)
    build(legacy, urls[:1])
    build(legacy, urls)  # a shard appended to the source's list: the build extends the cache
    build(current, urls)
    assert _rows(legacy) == _rows(current)
    assert TokenCache(legacy)._array.data.chunk_layout.read_chunk.shape == (1 << 18,)
    assert TokenCache(current)._array.data.chunk_layout.read_chunk.shape == (store.DATA_INNER,)
    assert set(cache_bytes(legacy)) != set(cache_bytes(current))  # the same rows in two layouts


@pytest.mark.parametrize("packed", [False, True], ids=["windows", "packed"])
def test_exact_reads_give_the_batches_block_reads_give(tmp_path, packed):
    location = str(tmp_path / "c")
    build(location, demo_urls("python_doc"))
    caches = {"blocks": TokenCache(location), "exact": TokenCache(location, chunk_cache=ChunkCache(0))}
    assert caches["blocks"].caches_blocks(caches["blocks"].num_tokens())
    assert not caches["exact"].caches_blocks(caches["exact"].num_tokens())
    datasets = {k: PackedDataset(c, 3000, pad_id=PAD, long_documents="split", persist=False) if packed else TokenSeqDataset(c, 3000)
                for k, c in caches.items()}
    picks = np.random.default_rng(0).permutation(len(datasets["blocks"]))
    batches = {k: ds.get_batch(picks) for k, ds in datasets.items()}
    for field in ("tokens", "loss_mask", "segment_ids"):
        assert np.array_equal(getattr(batches["exact"], field), getattr(batches["blocks"], field)), field


@pytest.fixture
def small_shards(monkeypatch):
    """Shards of 2^12 tokens holding chunks of 2^9: a demo cache spans many complete shards and a partial last one."""
    monkeypatch.setattr(store, "DATA_SHARD", 1 << 12)
    monkeypatch.setattr(store, "DATA_INNER", 1 << 9)


def _every_window(cache: TokenCache, seq_len: int = 700) -> np.ndarray:
    ds = TokenSeqDataset(cache, seq_len)
    return ds.get_batch(np.random.default_rng(1).permutation(len(ds))).tokens


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_exact_reads_of_many_shards_match_the_stored_tokens(tmp_path, small_shards, compression):
    location = str(tmp_path / "c")
    build(location, demo_urls("webster"), compression=compression)
    codecs = json.loads((tmp_path / "c" / "input_ids" / "data" / "zarr.json").read_text())["codecs"][0]["configuration"]["codecs"]
    assert [c["name"] for c in codecs] == {"zstd": ["bytes", "zstd"], "lz4": ["bytes", "blosc"], "none": ["bytes"]}[compression] + ["crc32c"]
    exact = TokenCache(location, chunk_cache=ChunkCache(0))
    assert exact._exact is not None and exact.read_unit == 1 << 9
    assert exact.num_tokens() > 20 * (1 << 12)
    assert np.array_equal(_every_window(exact), _every_window(TokenCache(location)))


def test_an_exact_read_of_no_ranges_gives_none(tmp_path):
    location = str(tmp_path / "c")
    build(location, demo_urls("webster")[:1])
    read = ("import numpy as np, sys; from tokenmix import TokenCache; from tokenmix.cache.chunk_cache import ChunkCache; "
            "cache = TokenCache(sys.argv[1], chunk_cache=ChunkCache(0)); none = np.empty(0, np.int64); "
            "print(cache.read_ranges(none, none, cache.num_tokens())())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", read, location], capture_output=True, env=env, timeout=120)  # a crash kills only it
    assert (done.returncode, done.stdout.decode().strip()) == (0, "[]"), done.stderr.decode()[-2000:]


def test_a_reader_open_while_the_cache_grows_sees_the_rewritten_last_shard(tmp_path, small_shards):
    urls = demo_urls("python_doc")
    location, reference = str(tmp_path / "c"), str(tmp_path / "ref")
    build(location, urls[:1])
    reader = TokenCache(location, chunk_cache=ChunkCache(0))
    first = _every_window(reader)  # maps the partial last shard
    build(location, urls)  # the same cache extended: its last shard is rewritten, then more follow
    build(reference, urls)
    grown = _every_window(reader)
    assert len(grown) > len(first)
    assert np.array_equal(grown, _every_window(TokenCache(reference)))


def test_a_damaged_shard_index_is_reported_with_the_shard_and_the_fix(tmp_path, small_shards):
    location = str(tmp_path / "c")
    build(location, demo_urls("linux_doc"))
    shard = tmp_path / "c" / "input_ids" / "data" / "c" / "1"
    raw = bytearray(shard.read_bytes())
    raw[5] ^= 0xFF
    shard.write_bytes(bytes(raw))
    cache = TokenCache(location, chunk_cache=ChunkCache(0))
    with pytest.raises(CacheDamagedError, match=r"input_ids/data elements 4,096-8,191 \(c/1\): damaged index\. They hold rows \d+-\d+\..*--repair"):
        cache.read_ranges(np.array([(1 << 12) + 3]), np.array([10]), cache.num_tokens())


def test_compression_is_part_of_the_identity(tmp_path):
    from tokenmix import load_data_config
    from tokenmix.cache.ledger import CacheMismatchError
    from tokenmix.config.caches import build_caches, open_cache

    config_path = tmp_path / "c.yaml"
    config_path.write_text(json.dumps({"tokenizer": str(TOKENIZER), "cache_dir": str(tmp_path / "caches"),
                                       "configs": {"web": {"train_urls": demo_urls("webster")[:1]}}, "build": {"compression": "none"}}))
    config = load_data_config(str(config_path))
    build_caches(config, progress=False)
    assert open_cache(config, "web").identity["compression"] == "none"
    with pytest.raises(CacheMismatchError, match=r"compression: cache has 'none', config asks for None[\s\S]*delete the cache"):
        open_cache(load_data_config(str(config_path), ["--build.compression", "zstd"]), "web")
    with pytest.raises(ValueError, match=r"c.yaml.*build.compression.*'lz5'.*zstd, lz4, none"):
        load_data_config(str(config_path), ["--build.compression", "lz5"])


def test_a_chunk_cache_made_smaller_stops_holding_blocks_of_a_cache_it_held(tmp_path):
    location = str(tmp_path / "c")
    build(location, demo_urls("python_doc"))
    chunks = ChunkCache()
    cache = TokenCache(location, chunk_cache=chunks)
    committed = cache.num_tokens()
    assert cache.caches_blocks(committed)
    chunks.max_bytes = 0
    assert not cache.caches_blocks(committed)


def test_sources_claim_chunk_cache_room_first_come_and_give_it_back(tmp_path):
    locations = [str(tmp_path / name) for name in ("a", "b")]
    for location in locations:
        build(location, demo_urls("python_doc"))
    size = TokenCache(locations[0]).num_tokens() * 2
    chunks = ChunkCache(int(size * 1.5))
    first, second = (TokenCache(location, chunk_cache=chunks) for location in locations)
    assert first.caches_blocks(first.num_tokens()) and not second.caches_blocks(second.num_tokens())
    del first
    assert second.caches_blocks(second.num_tokens())


def test_a_cache_built_again_where_it_was_reads_its_new_tokens_once_the_readers_of_the_old_one_are_gone(tmp_path):
    """Deleted and built again from other inputs at the same location (a cache_dir deleted to build afresh), a cache
    read in the same process gives its new tokens, not the old cache's blocks that the chunk cache kept."""
    location = str(tmp_path / "cache")
    build(location, demo_urls("python_doc")[:1])
    cache = TokenCache(location)
    old = TokenSeqDataset(cache, 64).get_batch(np.arange(8)).tokens
    assert cache.caches_blocks(cache.num_tokens())
    del cache
    shutil.rmtree(location)
    build(location, demo_urls("linux_doc")[:1])
    again = TokenCache(location)
    want = np.stack([again.read_tokens(64 * k, 64 * k + 64) for k in range(8)])
    assert not np.array_equal(want, old)
    assert np.array_equal(TokenSeqDataset(again, 64).get_batch(np.arange(8)).tokens, want)


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_exact_reads_decode_chunks_that_did_not_compress(tmp_path, compression):
    """Random tokens do not compress: zstd and blosc then store a chunk raw in their own framing, which reads must undo."""
    from tokenmix.cache.shard_reads import reads_for

    shard, inner = 1 << 12, 1 << 9
    location = str(tmp_path / "c")
    array = store._open_array(location, "x/data", "uint16", shard, inner, create=True, compression=compression)
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.integers(0, 1 << 16, 3 * shard, dtype=np.uint16), np.arange(shard, dtype=np.uint16) % 7])
    array[: len(values)].write(values).result()
    metadata = json.loads((tmp_path / "c" / "x" / "data" / "zarr.json").read_text())
    reads = reads_for(metadata, location, "x/data", "tensorstore")
    assert reads is not None and reads.layout.codec == {"zstd": "zstd", "lz4": "blosc"}[compression] and reads.layout.checksummed
    begin = rng.integers(0, len(values) - inner, 200)
    size = np.minimum(rng.integers(1, inner, 200), inner - begin % inner)
    pieces = reads.read(begin, size, len(values))
    assert all(np.array_equal(p, values[b : b + n]) for p, b, n in zip(pieces, begin.tolist(), size.tolist()))


def test_rewinding_unpublished_rows_keeps_every_published_token_and_leaves_the_bytes_of_never_having_written_them(tmp_path):
    """Rows written and taken back (a compressed shard refused at its end) are erased so that storage is as if they had
    never been written; the published row before them keeps every token, even one that is the fill value alone in its
    chunk (an EOS id 0 first in a chunk), and even when the taken-back rows filled whole stored objects."""
    row = np.arange(1, store.DATA_INNER + 2, dtype=np.uint16)
    row[-1] = 0  # the row's last token opens a chunk of its own and is the fill value
    taken_back = np.full(store.DATA_SHARD + 100_000, 7, np.uint16)
    for name, rows in (("rewound", [row, taken_back]), ("never", [row])):
        array = store.JaggedArray.open(str(tmp_path / name), "input_ids", "uint16", create=True)
        for write in array.write_rows(0, 0, row, np.array([len(row)])):
            write.result()
        array.publish(1)
        if len(rows) > 1:
            for write in array.write_rows(1, len(row), taken_back, np.array([len(taken_back)])) + array.flush():
                write.result()
            array.rewind(1, len(row))
        array.publish(1)
    rewound = store.JaggedArray.open(str(tmp_path / "rewound"), "input_ids", "uint16")
    assert np.array_equal(rewound.read_tokens(0, len(row)), row) and rewound.committed_rows() == 1
    assert cache_bytes(str(tmp_path / "rewound")) == cache_bytes(str(tmp_path / "never"))


def test_a_packing_plan_grown_after_it_was_read_keeps_its_chunks_of_zeros(tmp_path):
    """A plan is read, then grown (a cache that builds on): the rows appended are written through a handle that stores
    every chunk, so pieces of row 0 filling a whole chunk read back, where a chunk left out would read as missing."""
    from tokenmix.cache.plans import PlanStore

    assert PlanStore(str(tmp_path / "plan"), {"seq_len": 8}).write(0, 0, np.array([1, 2, 3]), np.array([3]), {"examples": 1, "pieces": 3})
    plan = PlanStore(str(tmp_path / "plan"), {"seq_len": 8})  # a later reader: it reads the plan first
    plan.read_arrays(1, 3)
    zeros = np.zeros(2 * store.DATA_INNER, np.int64)  # the pieces of one long document, row 0
    assert plan.write(1, 3, zeros, np.array([len(zeros)]), {"examples": 2, "pieces": 3 + len(zeros)})
    bounds, rows = PlanStore(str(tmp_path / "plan"), {"seq_len": 8}).read_arrays(2, 3 + len(zeros))
    assert bounds.tolist() == [0, 3, 3 + len(zeros)] and rows.tolist() == [1, 2, 3, *zeros.tolist()]


def test_a_commit_writes_the_values_of_a_partial_object_once(tmp_path):
    """A commit flushes the values held back for partial objects, then publishes: the publication writes none of them
    again (it rewrote and recompressed both partial objects, a cache's whole data for a small source); values appended
    since are written by the next flush."""
    array = store.JaggedArray.open(str(tmp_path / "c"), "input_ids", "uint16", create=True)
    rows = [np.arange(1, 1000, dtype=np.uint16), np.arange(5, 300, dtype=np.uint16)]
    writes = array.write_rows(0, 0, rows[0], np.array([len(rows[0])])) + array.flush()
    assert len(writes) == 2  # the tokens and the row ends, each a partial object
    for write in writes:
        write.result()
    assert array.flush() == []
    array.publish(1)
    writes = array.write_rows(1, len(rows[0]), rows[1], np.array([len(rows[1])])) + array.flush()
    assert len(writes) == 2
    for write in writes:
        write.result()
    array.publish(2)
    reopened = store.JaggedArray.open(str(tmp_path / "c"), "input_ids", "uint16")
    assert reopened.committed_rows() == 2 and np.array_equal(reopened.read_tokens(0, 1294), np.concatenate(rows))


def test_arrays_opened_as_fresh_are_created_once_and_an_existing_one_is_opened_as_it_is(tmp_path):
    """A cache without a ledger creates its arrays without trying to open them first; arrays a killed build created
    before its ledger are opened with what they hold."""
    location = str(tmp_path / "c")
    created = store.JaggedArray.open(location, "input_ids", "uint16", create=True, fresh=True)
    assert created.created
    for write in created.write_rows(0, 0, np.arange(1, 10, dtype=np.uint16), np.array([9])) + created.flush():
        write.result()
    created.publish(1)
    again = store.JaggedArray.open(location, "input_ids", "uint16", create=True, fresh=True)
    assert not again.created and again.committed_rows() == 1
    assert np.array_equal(again.read_tokens(0, 9), np.arange(1, 10))
