"""The build lock and exact reads on an object store: an S3-compatible server (moto's, a real server process on 127.0.0.1) behind
tensorstore's own s3 driver, reached through ``AWS_ENDPOINT_URL`` as any S3-compatible store is."""

from __future__ import annotations

import time

import numpy as np
import pytest
import yaml
from helpers import TOKENIZER, check_lease_lifecycle, demo_urls, start_builders
from s3_server import BUCKET, LatencyProxy

import tokenmix


def test_a_lease_on_s3_excludes_others_and_is_taken_over_from_a_stalled_holder(s3, caplog):
    # renewed every lease_s / 4, each renewal a request to the server: one that a busy machine holds up 3 s is in time
    check_lease_lifecycle(f"s3://{BUCKET}/lease-{time.time_ns()}/web/train", 4.0, caplog)


@pytest.mark.timeout(300)
def test_two_builders_of_one_s3_cache_build_it_once(s3, tmp_path):
    cache_dir = f"s3://{BUCKET}/race-{time.time_ns()}"
    urls = demo_urls("webster")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": cache_dir, "configs": {"web": {"train_urls": urls}},
                                      "build": {"num_workers": 0, "commit_interval_s": 0.05, "chunk_bytes": 1 << 15}}))
    procs = start_builders([config, config], tmp_path / "go")
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("waiting for the build lock" in out for out in outputs) == 1, outputs
    built = tokenmix.TokenCache(f"{cache_dir}/web/train")
    local = tmp_path / "local"
    tokenmix.build_caches(tokenmix.load_data_config(config, ["--cache_dir", str(local)]), progress=False)
    reference = tokenmix.TokenCache(str(local / "web" / "train"))
    assert built.is_finished() and built.num_rows() == reference.num_rows() > 0
    rows = range(reference.num_rows())
    assert [r.tolist() for r in built.get_rows(rows)] == [r.tolist() for r in reference.get_rows(rows)]
    assert built.ledger.to_json()["shards"] == reference.ledger.to_json()["shards"]


@pytest.mark.parametrize(("object_reads", "compression"), [("tensorstore", "zstd"), ("fsspec", "zstd"), ("fsspec", "lz4")])
def test_exact_reads_of_an_s3_cache_match_the_local_cache(s3, tmp_path, monkeypatch, object_reads, compression):
    from helpers import build

    from tokenmix.cache import store
    from tokenmix.cache.chunk_cache import ChunkCache

    monkeypatch.setattr(store, "DATA_SHARD", 1 << 14)  # several complete shards and a partial last one
    monkeypatch.setattr(store, "DATA_INNER", 1 << 10)
    remote, local = f"s3://{BUCKET}/reads-{time.time_ns()}/web", str(tmp_path / "web")
    for location in (remote, local):
        build(location, demo_urls("webster"), compression=compression)
    windows = {}
    for name, location in (("remote", remote), ("local", local)):
        cache = tokenmix.TokenCache(location, chunk_cache=ChunkCache(0), object_reads=object_reads)
        # read from its bytes: local files, fsspec, or tensorstore's drivers by range (its open object holds the index
        # of the partial last shard)
        assert cache._exact is not None and cache._exact.issues_ahead == (name == "remote" and object_reads == "tensorstore")
        ds = tokenmix.TokenSeqDataset(cache, 1000)
        windows[name] = ds.get_batch(np.random.default_rng(0).permutation(len(ds))).tokens
    assert cache.num_tokens() > 4 * (1 << 14)
    assert np.array_equal(windows["remote"], windows["local"])


def test_a_levanter_cache_on_object_storage_is_read_in_place_by_a_mixture(s3, tmp_path):
    """Levanter users keep finished caches in buckets: a mixture pointed at one reads it there, building nothing."""
    from tokenmix.export import export_levanter

    local = tokenmix.load_data_config({"tokenizer": TOKENIZER, "enforce_bos": True, "cache_dir": str(tmp_path / "local"),
                                       "configs": {"web": {"train_urls": demo_urls("webster")}}})
    tokenmix.build_caches(local, progress=False)
    built = tokenmix.open_cache(local, "web")
    export_levanter(built, f"s3://{BUCKET}/levanter/web/train", tokenizer=TOKENIZER, progress=False)
    remote = tokenmix.load_data_config({"tokenizer": TOKENIZER, "enforce_bos": True, "cache_dir": str(tmp_path / "unused"), "configs": {
        "web": {"train_urls": demo_urls("webster"), "cache_dir": f"s3://{BUCKET}/levanter/web"}}})
    tokenmix.build_caches(remote, progress=False)
    opened = tokenmix.open_cache(remote, "web")
    assert opened.identity["levanter_cache"] and opened.num_rows() == built.num_rows()
    rows = np.random.default_rng(0).choice(built.num_rows(), 20, replace=False)
    assert all(np.array_equal(a, b) for a, b in zip(opened.get_rows(rows), built.get_rows(rows)))
    seq = tokenmix.TokenSeqDataset(opened, 256)
    assert np.array_equal(seq.get_batch(range(8)).tokens, tokenmix.TokenSeqDataset(built, 256).get_batch(range(8)).tokens)


def test_fsspec_reaches_the_endpoint_the_environment_names_now_as_tensorstore_does(s3, tmp_path, monkeypatch):
    """fsspec keeps a filesystem, and its client, for each set of arguments it is given: a process that read through it
    once, then was pointed at another endpoint (a test's next server, a job moved to another store), reached the first
    one still. Inputs, and caches read with ``object_reads="fsspec"``, go where the environment says at each open,
    as caches read through tensorstore do."""
    import s3fs
    from helpers import build

    from tokenmix.sources.shards import FileShard

    remote = f"s3://{BUCKET}/endpoint-{time.time_ns()}"
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(f'{{"text": "document {i} of a few words"}}\n' for i in range(50)))
    s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3.endpoint).put(str(text), f"{remote}/docs.jsonl".removeprefix("s3://"))
    for location in (f"{remote}/cache", str(tmp_path / "local")):
        build(location, [str(text)])
    local = tokenmix.TokenCache(str(tmp_path / "local"))

    def read_both() -> tuple[list[list[int]], int | None, int]:
        cache = tokenmix.TokenCache(f"{remote}/cache", object_reads="fsspec")
        shard = FileShard(f"{remote}/docs.jsonl")
        return [r.tolist() for r in cache.get_rows(range(cache.num_rows()))], shard.size_bytes(), sum(len(c.records) for c in shard.read())

    proxies = [LatencyProxy(s3.port, 0.0) for _ in range(2)]
    expected = ([r.tolist() for r in local.get_rows(range(local.num_rows()))], text.stat().st_size, 50)
    for now in (0, 1, 0):
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxies[now].endpoint)
        before = [p.requests for p in proxies]
        assert read_both() == expected
        assert proxies[now].requests > before[now] and proxies[1 - now].requests == before[1 - now], now


def test_a_cache_at_a_buckets_root_is_stored_at_its_top_as_under_a_prefix(s3, tmp_path):
    """``cache_dir: s3://bucket`` (or ``s3://bucket/``): the cache's objects are ``ledger.json``, ``input_ids/...`` at
    the bucket's top, where fsspec, the AWS tools and Levanter look, not under keys beginning with ``/`` (an unnamed
    folder) that only tensorstore finds; it reads and verifies as one under a prefix does."""
    import subprocess
    import sys
    import urllib.request

    import s3fs
    from helpers import build

    bucket = f"root-{time.time_ns()}"
    urllib.request.urlopen(urllib.request.Request(f"{s3.endpoint}/{bucket}", method="PUT"), timeout=60).read()
    build(f"s3://{bucket}", demo_urls("webster"))
    build(str(tmp_path / "local"), demo_urls("webster"))
    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3.endpoint)
    assert {"ledger.json", "stats.json", "input_ids"} <= {p.removeprefix(f"{bucket}/") for p in fs.ls(bucket, refresh=True)}
    local = tokenmix.TokenCache(str(tmp_path / "local"))
    expected = [r.tolist() for r in local.get_rows(range(local.num_rows()))]
    for location in (f"s3://{bucket}", f"s3://{bucket}/"):
        for object_reads in ("tensorstore", "fsspec"):
            cache = tokenmix.TokenCache(location, object_reads=object_reads)
            assert [r.tolist() for r in cache.get_rows(range(cache.num_rows()))] == expected, (location, object_reads)
    verify = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "verify", f"s3://{bucket}"], capture_output=True, text=True, timeout=240)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize(("target", "output"), [("megatron", "m/web"), ("datatrove", "d/web.ds"), ("nanoset", "n/web_input_ids.npy"),
                                                ("hdf5", "h")])
def test_an_export_of_local_files_to_a_bucket_is_refused_naming_it_and_writes_nothing(s3, tmp_path, target, output):
    """Megatron, datatrove, Nanoset and Cerebras HDF5 files are written as local files: given ``s3://bucket/...`` the
    export wrote them under a local directory named ``s3:`` and reported success. It is refused, naming the URL and what
    to do, and nothing is written (a ``file://`` URL is its path)."""
    import subprocess
    import sys

    from helpers import build

    cache = str(tmp_path / "cache")
    build(cache, demo_urls("webster")[:1])
    url = f"s3://{BUCKET}/export-{time.time_ns()}/{output}"
    run = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "export", "--to", target, "--cache", cache, "--output", url,
                          "--tokenizer", TOKENIZER], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    assert f"{url}: " in run.stderr and "local or mounted disk" in run.stderr and "--to levanter" in run.stderr, run.stderr
    assert not (tmp_path / "s3:").exists()
    written = tmp_path / "out" / output
    run = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "export", "--to", target, "--cache", cache, "--output",
                          f"file://{written}", "--tokenizer", TOKENIZER], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(written.parent.glob(f"{written.name}*")) and not (tmp_path / "file:").exists()  # megatron: a prefix


def test_inputs_on_s3_are_listed_as_they_are_now_after_another_process_added_or_removed_some(s3):
    """fsspec keeps the listings a filesystem made (its ``dircache``) for as long as the process: a glob expanded again
    after another process (a worker, an upload) added an input missed it, and after one was removed still named it.
    Each listing asks the store, as tensorstore does."""
    import s3fs

    from tokenmix.sources.urls import expand_urls

    other = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3.endpoint)
    prefix = f"{BUCKET}/listed-{time.time_ns()}"
    pattern = f"s3://{prefix}/*.jsonl"
    other.pipe({f"{prefix}/a.jsonl": b'{"text": "a"}\n'})
    assert expand_urls([pattern]) == [f"s3://{prefix}/a.jsonl"]
    other.pipe({f"{prefix}/b.jsonl": b'{"text": "b"}\n'})
    assert expand_urls([pattern]) == [f"s3://{prefix}/a.jsonl", f"s3://{prefix}/b.jsonl"]
    other.rm_file(f"{prefix}/a.jsonl")
    assert expand_urls([pattern]) == [f"s3://{prefix}/b.jsonl"]


@pytest.mark.parametrize("unset", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
def test_half_a_pair_of_s3_keys_is_refused_naming_both_variables(s3, tmp_path, unset):
    """One of ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` without the other: tensorstore said only that
    "required environment variables could not be sourced" (a secret without its key id went on without keys). The
    error names the cache, both variables and the fix."""
    import os
    import subprocess
    import sys

    from helpers import build

    location = f"s3://{BUCKET}/keys-{time.time_ns()}"
    build(location, demo_urls("webster")[:1])
    env = {k: v for k, v in os.environ.items() if k != unset}
    run = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "verify", location], capture_output=True, text=True,
                         timeout=240, env=env)
    assert run.returncode != 0, run.stdout + run.stderr
    set_one = ({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} - {unset}).pop()
    assert f"{location}: {set_one} is set but {unset} is not; set both" in run.stderr, run.stderr
