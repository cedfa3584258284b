"""A mixture of many sources read from an object store with a bucket's latency (issue 39): a real S3 server process (the
``s3`` fixture) behind a proxy on 127.0.0.1 that holds every request 30 ms and counts requests and bytes
(``s3_server.LatencyProxy``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import DEMO_CORPUS, REPO, TOKENIZER, read_jsonl_zst, write_jsonl
from s3_server import BUCKET, LatencyProxy

import tokenmix
from tokenmix.cache import shard_reads, store
from tokenmix.cache.chunk_cache import ChunkCache
from tokenmix.cache.open_object import OPEN_FILE, SHARD_INDEXES_HELD, OpenObjectDamagedError, read_open_object
from tokenmix.cache.reader import TokenCache
from tokenmix.cache.shard_reads import ShardLayout
from tokenmix.datasets.deferred import OPENING_THREADS

SOURCES = 24
SEQ = 256
LATENCY_S = 0.03
OPEN_REQUESTS = 1
"""A finished cache opens from its open object alone (``open_object.py``)."""
OPEN_FROM_PARTS = 5
"""A cache without one opens from its ledger, its two arrays' metadata, and the index and chunk of its row ends."""
HEADER_BYTES = 1024
"""What an HTTP response may add to the stored bytes it carries (status line, headers)."""


def _config(cache_dir: str, text: Path, sources: int = SOURCES) -> dict:
    names = [f"s{i:02d}" for i in range(sources)]
    return {"tokenizer": TOKENIZER, "cache_dir": cache_dir, "shuffle": True,
            "configs": {n: {"train_urls": [str(text / f"{n}.jsonl")]} for n in names},
            "train_weights": {n: 1 + i % 7 for i, n in enumerate(names)}}


@pytest.fixture(scope="module")
def caches(s3, tmp_path_factory):
    """``SOURCES`` small sources (6 demo documents each, stored in chunks of 2^10 tokens), built locally and copied to
    the bucket; yields the local directory, the text directory and the bucket's cache directory."""
    root = tmp_path_factory.mktemp("many")
    (root / "text").mkdir()
    docs = [r for source in ("webster", "linux_doc") for r in read_jsonl_zst(DEMO_CORPUS / source / "train-00-of-02.jsonl.zst")]
    for i in range(SOURCES):
        write_jsonl(root / "text" / f"s{i:02d}.jsonl", [docs[(6 * i + k) % len(docs)] for k in range(6)])
    local = root / "caches"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "DATA_SHARD", 1 << 14)
        patch.setattr(store, "DATA_INNER", 1 << 10)
        tokenmix.build_caches(tokenmix.load_data_config(_config(str(local), root / "text")), progress=False)
    import s3fs

    remote = f"s3://{BUCKET}/many-{time.time_ns()}"
    s3fs.S3FileSystem(skip_instance_cache=True).put(str(local) + "/", remote.removeprefix("s3://") + "/", recursive=True)
    return local, root / "text", remote


@pytest.fixture
def proxy(s3, monkeypatch):
    """The latency proxy in front of the server, and the environment pointing tokenmix at it."""
    proxy = LatencyProxy(s3.port, LATENCY_S)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return proxy


def _plan(local: Path, train: tokenmix.MixtureDataset, indices: np.ndarray) -> tuple[int, int, int]:
    """What a cold read of ``indices`` may fetch: the open object of each source they draw from, and of its token data
    the shard indexes the open object does not hold and the stored chunks their examples touch; the number of those
    sources, and of the requests for their tokens (an index each, a range for each run of consecutive chunks)."""
    ids, draws = train.locate(indices)
    planned = pieces = 0
    drawn = np.unique(ids).tolist()
    for s in drawn:
        name = train.names[s]
        where = local / name / "train"
        data = where / "input_ids" / "data"
        planned += os.path.getsize(where / OPEN_FILE)
        held = read_open_object(store.open_kvstore(str(where)), str(where)).shard_indexes
        layout = ShardLayout.from_metadata(json.loads((data / "zarr.json").read_text()))
        examples = train.source(name).examples(draws[ids == s])
        chunks = {c for e in examples.tolist() for c in range(e * SEQ // layout.inner, ((e + 1) * SEQ - 1) // layout.inner + 1)}
        pieces += sum(c - 1 not in chunks or c % layout.chunks_per_shard == 0 for c in chunks)
        for shard in {c // layout.chunks_per_shard for c in chunks}:
            index = np.frombuffer((data / "c" / str(shard)).read_bytes()[: layout.index_bytes - 4], "<u8").reshape(-1, 2)
            planned += sum(int(index[c % layout.chunks_per_shard, 1]) for c in chunks if c // layout.chunks_per_shard == shard)
            if shard not in held:
                planned += layout.index_bytes
                pieces += 1
    return planned, len(drawn), pieces


def test_a_cold_start_on_s3_opens_no_source_up_front_fetches_what_the_plan_says_and_reads_the_local_batches(caches, proxy):
    local, text, remote = caches
    here = tokenmix.load_data_config(_config(str(local), text)).train_set(SEQ)
    there_config = tokenmix.load_data_config(_config(remote, text))
    requests, fetched = proxy.counts()
    there = there_config.train_set(SEQ)
    assert proxy.counts() == (requests, fetched), "opening the mixture fetched something: no source is drawn yet"
    first = np.arange(4)
    planned, drawn, pieces = _plan(local, here, first)
    assert drawn < SOURCES // 2
    batch = there.get_batch(first)
    requests, fetched = proxy.requests - requests, proxy.bytes_returned - fetched
    assert fetched <= planned + HEADER_BYTES * requests, (fetched, planned, requests)
    # a source opens in OPEN_REQUESTS; its tokens cost a request per shard index its open object does not hold and per
    # run of consecutive stored chunks the batch touches
    assert requests <= OPEN_REQUESTS * drawn + pieces, (requests, drawn, pieces)
    assert np.array_equal(batch.tokens, here.get_batch(first).tokens)
    requests = proxy.requests
    assert np.array_equal(there.get_batch(first).tokens, batch.tokens)
    assert proxy.requests == requests, "a batch read again is served from the chunks fetched (the caches are finished)"
    for step in range(1, 6):
        indices = np.arange(4 * step, 4 * step + 4)
        want, got = here.get_batch(indices), there.get_batch(indices)
        for field in ("tokens", "loss_mask", "segment_ids", "source_ids"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), (step, field)


def _remote_cache(remote: str, name: str) -> str:
    return f"{remote}/{name}/train"


def test_a_finished_source_on_s3_opens_in_one_request_of_its_open_object_and_reads_its_row_ends_from_it(caches, proxy):
    local, _, remote = caches
    where = local / "s03" / "train"
    requests, fetched = proxy.counts()
    cache = TokenCache(_remote_cache(remote, "s03"))
    assert cache.is_finished()
    ends = cache.committed_row_ends(0)
    requests, fetched = proxy.requests - requests, proxy.bytes_returned - fetched
    assert requests == OPEN_REQUESTS, requests
    assert fetched <= (where / OPEN_FILE).stat().st_size + HEADER_BYTES, fetched
    from_parts = where.parent / "from-parts"
    shutil.copytree(where, from_parts)
    (from_parts / OPEN_FILE).unlink()
    assert np.array_equal(ends, TokenCache(str(from_parts)).committed_row_ends(0))
    assert cache.num_rows() == len(ends) and cache.num_tokens() == int(ends[-1])


def test_every_window_of_a_source_on_s3_costs_its_open_object_and_one_ranged_request_a_shard(caches, proxy, monkeypatch):
    """The chunks a batch reads from one shard are consecutive here (every window of the source): one ranged request."""
    local, _, remote = caches
    monkeypatch.setattr(shard_reads, "FETCHED", shard_reads.FetchedRanges(64 << 20))  # none kept from other tests' reads
    requests = proxy.requests
    there = tokenmix.TokenSeqDataset(TokenCache(_remote_cache(remote, "s07"), chunk_cache=ChunkCache(0)), SEQ)
    got = there.get_batch(np.arange(len(there))).tokens
    requests = proxy.requests - requests
    layout = ShardLayout.from_metadata(json.loads((local / "s07" / "train" / "input_ids" / "data" / "zarr.json").read_text()))
    shards = -(-there.cache.num_tokens() // layout.shard)
    assert 0 < shards <= SHARD_INDEXES_HELD and there.cache.num_tokens() > 4 * layout.inner
    assert requests == OPEN_REQUESTS + shards, (requests, shards)
    here = tokenmix.TokenSeqDataset(TokenCache(str(local / "s07" / "train")), SEQ)
    assert np.array_equal(got, here.get_batch(np.arange(len(here))).tokens)


def test_a_cache_without_its_open_object_opens_from_its_parts_and_a_damaged_one_is_refused_naming_it(caches, tmp_path):
    local, _, _ = caches
    shutil.copytree(local / "s05" / "train", tmp_path / "missing")
    (tmp_path / "missing" / OPEN_FILE).unlink()
    want, got = TokenCache(str(local / "s05" / "train")), TokenCache(str(tmp_path / "missing"))
    rows = list(range(want.num_rows()))
    assert got.is_finished() and np.array_equal(got.committed_row_ends(0), want.committed_row_ends(0))
    assert all(np.array_equal(a, b) for a, b in zip(got.get_rows(rows), want.get_rows(rows)))
    for name, damage in (("flipped", lambda b: b[:9] + bytes([b[9] ^ 4]) + b[10:]), ("cut", lambda b: b[: len(b) // 2])):
        shutil.copytree(local / "s05" / "train", tmp_path / name)
        stored = tmp_path / name / OPEN_FILE
        stored.write_bytes(damage(stored.read_bytes()))
        with pytest.raises(OpenObjectDamagedError, match=f"{name}: its open.bin .* is damaged: checksum mismatch. Delete open.bin"):
            TokenCache(str(tmp_path / name))


READER = """
import json, os, sys
import numpy as np
import tokenmix
config = tokenmix.load_data_config(json.loads(sys.argv[1]))
train = config.train_set(int(sys.argv[2]))
before = len(os.listdir("/proc/self/task"))
step = 0
while len(train.opened_sources()) < len(train.names):
    train.get_batch(np.arange(16 * step, 16 * step + 16))
    step += 1
print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "before": before, "files": len(os.listdir("/proc/self/fd"))}))
"""


@pytest.mark.slow
def test_threads_and_open_files_of_a_reading_process_do_not_grow_with_its_sources(caches, proxy):
    """A process reads a mixture of 4, then of 24 sources on the bucket until it has opened every one: what it holds
    does not grow with the sources beyond the threads that open them (no thread, pool or file per source)."""
    local, text, remote = caches
    counts = {}
    for sources in (4, SOURCES):
        run = subprocess.run([sys.executable, "-c", READER, json.dumps(_config(remote, text, sources)), str(SEQ)],
                             capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ})
        assert run.returncode == 0, run.stderr
        counts[sources] = json.loads(run.stdout.strip().splitlines()[-1])
    few, many = counts[4], counts[SOURCES]
    assert many["threads"] <= few["threads"] + OPENING_THREADS - 4, counts
    assert many["files"] <= few["files"] + 2, counts


def test_the_validation_sets_of_many_sources_on_s3_open_together_and_read_as_the_local_ones(caches, s3, monkeypatch):
    """A training run evaluates every source: its validation sets are opened a few at a time, not one after another (a
    thousand sources at 30 ms a request would wait 30 s before the first step). Behind a proxy that holds each request
    a quarter of a second, one opening after another never has two requests held at once."""
    local, text, remote = caches
    slow = LatencyProxy(s3.port, 0.25)
    monkeypatch.setenv("AWS_ENDPOINT_URL", slow.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")

    def held_out(cache_dir: str) -> dict:
        return {**_config(cache_dir, text), "validation_fraction": {f"s{i:02d}": 0.3 for i in range(SOURCES)}}

    here = tokenmix.load_data_config(held_out(str(local))).validation_sets(SEQ)
    there = tokenmix.load_data_config(held_out(remote)).validation_sets(SEQ)
    assert list(there) == list(here) == [f"s{i:02d}" for i in range(SOURCES)]
    assert slow.most_held > 1, "the sources were opened one after another"
    assert slow.most_held <= OPENING_THREADS
    assert {name: len(dataset) for name, dataset in there.items()} == {name: len(dataset) for name, dataset in here.items()}
    for name in ("s00", "s07"):
        everything = np.arange(len(here[name]))
        assert np.array_equal(there[name].get_batch(everything).tokens, here[name].get_batch(everything).tokens)
