"""Cache builds on real local Ray and Dask clusters: identical bytes, retried workers, failed shards, driver restarts."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import DEMO_CORPUS, REPO, TOKENIZER, DelegatingShard, cache_bytes, encoder_for, write_lines

from tokenmix import (
    BadInputError,
    BuildOptions,
    DaskExecutorConfig,
    LocalExecutorConfig,
    MissingExtraError,
    RayExecutorConfig,
    ShardTaskError,
    SupervisedLmDatasetFormat,
    TokenCache,
    load_data_config,
)
from tokenmix.cache import CacheBuilder
from tokenmix.cache.shard_task import STAGING_DIR
from tokenmix.execution import ExecutorConfig, import_extra
from tokenmix.sources import DEFAULT_CHUNK_BYTES, FileShard

TESTS = str(Path(__file__).resolve().parent)
CHUNK = 64 << 10
OPTIONS = {"chunk_bytes": CHUNK, "on_error": "skip", "commit_interval_s": 0.0}


class KillingShard(DelegatingShard):
    """A real file shard whose reader SIGKILLs its own worker process after its first chunk while ``marker`` exists.

    With ``once`` it removes the marker before killing, so the retried task reads the shard through.
    """

    def __init__(self, url: str, marker: str, once: bool = True):
        super().__init__(url)
        self.marker = marker
        self.once = once

    def read(self, start=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
        for i, chunk in enumerate(super().read(start, chunk_bytes)):
            if i == 1 and os.path.exists(self.marker):
                if self.once:
                    os.remove(self.marker)
                os.kill(os.getpid(), signal.SIGKILL)
            yield chunk


class BrokenStorageShard(KillingShard):
    """A shard whose reader fails with an unexpected error (not a ShardReadError) on every try."""

    def read(self, start=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
        raise OSError("the bucket is unreachable")
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """Six shards: two real shards of two sources, one with bad records (skipped) and one truncated .zst."""
    root = tmp_path_factory.mktemp("corpus")
    urls = []
    for source in ("python_doc", "webster"):
        for i in range(2):
            target = root / f"{source}-{i}.jsonl.zst"
            shutil.copyfile(DEMO_CORPUS / source / f"train-0{i}-of-02.jsonl.zst", target)
            urls.append(str(target))
    lines = [json.dumps({"text": f"document {i} " * (i + 1)}).encode() for i in range(40)]
    lines[7] = b'{"text": '
    lines[20] = json.dumps({"text": "   "}).encode()
    urls.insert(2, write_lines(root / "bad.jsonl", lines))
    whole = (DEMO_CORPUS / "linux_doc" / "train-00-of-02.jsonl.zst").read_bytes()
    (root / "truncated.jsonl.zst").write_bytes(whole[: len(whole) * 2 // 3])
    urls.append(str(root / "truncated.jsonl.zst"))
    return urls


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> str:
    """The corpus built by the local executor, in the driver process."""
    location = str(tmp_path_factory.mktemp("reference") / "cache")
    _build(location, [FileShard(u) for u in corpus], num_workers=0)
    return location


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray of 2 CPUs for the module; this process stays connected, so executors without an address use it."""
    ray = pytest.importorskip("ray", reason="the Ray executor needs pip install 'tokenmix[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": TESTS}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def dask_address():
    """A Dask LocalCluster of 2 single-threaded worker processes; a lost worker fails its task (allowed-failures 0)."""
    pytest.importorskip("distributed", reason="the Dask executor needs pip install 'tokenmix[dask]'")
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    yield cluster.scheduler_address
    cluster.close()


def _build(location, shards, **options):
    spec, identity = encoder_for(options.pop("fmt", None))
    options = {**OPTIONS, **options}
    return CacheBuilder(location, shards, spec, identity, BuildOptions(**options)).build()


def _executor(kind, ray_address, dask_address, **options) -> ExecutorConfig:
    if kind == "ray":
        return RayExecutorConfig(**options)  # no address: this process's Ray
    return DaskExecutorConfig(address=dask_address, **options)


@pytest.fixture(params=["ray", "dask"])
def engine(request):
    """The engine under test, its cluster started once per module."""
    address = request.getfixturevalue(f"{request.param}_address")
    return request.param, address


@pytest.mark.timeout(180)
def test_a_cluster_build_is_byte_identical_to_a_local_build(engine, corpus, reference, tmp_path, caplog):
    kind, address = engine
    location = str(tmp_path / "cache")
    config = RayExecutorConfig() if kind == "ray" else DaskExecutorConfig(address=address)
    with caplog.at_level(logging.INFO, logger="tokenmix"):
        stats = _build(location, [FileShard(u) for u in corpus], executor=config)
    assert cache_bytes(location) == cache_bytes(reference)
    assert stats["skipped_by_reason"] == {"empty_document": 1, "malformed_json": 1, "truncated_file": 1}
    assert not os.path.exists(os.path.join(location, STAGING_DIR))
    progress = [r.getMessage() for r in caplog.records if "6/6 shards" in r.getMessage()]
    assert progress and "tok/s" in progress[-1] and "docs/s" in progress[-1] and "workers" in progress[-1]


@pytest.mark.timeout(180)
def test_a_killed_worker_is_retried_and_the_cache_is_still_identical(engine, corpus, reference, tmp_path, caplog):
    kind, address = engine
    marker = tmp_path / "kill-once"
    marker.touch()
    shards = [FileShard(u) for u in corpus]
    shards[1] = KillingShard(corpus[1], str(marker))
    location = str(tmp_path / "cache")
    config = RayExecutorConfig(max_retries=2) if kind == "ray" else DaskExecutorConfig(address=address, max_retries=2)
    with caplog.at_level(logging.WARNING, logger="tokenmix"):
        _build(location, shards, executor=config)
    assert not marker.exists(), "the worker was never killed"
    assert any(f"{corpus[1]}: try 1 of 3 failed" in r.getMessage() for r in caplog.records)
    assert cache_bytes(location) == cache_bytes(reference)


@pytest.mark.timeout(180)
def test_a_shard_failing_every_try_stops_the_build_naming_it_then_a_rerun_resumes(ray_address, corpus, reference, tmp_path):
    location = str(tmp_path / "cache")
    shards = [FileShard(u) for u in corpus]
    shards[3] = BrokenStorageShard(corpus[3], "")
    with pytest.raises(ShardTaskError) as err:
        _build(location, shards, executor=RayExecutorConfig(max_retries=1))
    message = str(err.value)
    assert corpus[3] in message and "failed 2 times on ray" in message and "the bucket is unreachable" in message
    assert "re-run the build to resume" in message
    # the committed prefix is exactly the shards before the broken one, row for row
    cache = TokenCache(location)
    ledger = cache.ledger
    assert [s.finished for s in ledger.shards] == [True, True, True, False, False, False]
    ref = TokenCache(reference)
    rows = cache.num_rows()
    assert rows == sum(s.rows for s in ref.ledger.shards[:3])
    assert [r.tolist() for r in cache.get_rows([0, rows // 2, rows - 1])] == [r.tolist() for r in ref.get_rows([0, rows // 2, rows - 1])]
    stats = _build(location, [FileShard(u) for u in corpus], executor=RayExecutorConfig())
    assert stats["build"]["resumed_at_row"] == rows
    assert cache_bytes(location) == cache_bytes(reference)


@pytest.mark.timeout(180)
def test_a_compressed_shard_failing_its_checksum_is_refused_whole_on_a_cluster_as_locally(dask_address, tmp_path):
    """Its staged chunks are never appended; the local build takes its written rows back: the same bytes, tokens and loss
    spans, as a build that never listed it."""
    rng = random.Random(7)
    words = [f"w{rng.getrandbits(24):06x}" for _ in range(3000)]
    records = [{"prompt": " ".join(rng.choices(words, k=i % 4 + 1)), "response": " ".join(rng.choices(words, k=i % 6 + 1))}
               for i in range(9000)]
    lines = [json.dumps(r).encode() for r in records]
    damaged = tmp_path / "damaged.jsonl.gz"
    write_lines(damaged, lines[:6000])
    data = bytearray(damaged.read_bytes())
    data[-7] ^= 1 << 3  # in the CRC-32 at its end, found after every record was read
    damaged.write_bytes(bytes(data))
    before, after = write_lines(tmp_path / "before.jsonl", lines[6000:7500]), write_lines(tmp_path / "after.jsonl", lines[7500:])
    fmt = SupervisedLmDatasetFormat(max_seq_length=64)
    urls = [before, str(damaged), after]
    local = _build(str(tmp_path / "local"), [FileShard(u) for u in urls], fmt=fmt, num_workers=0, chunk_bytes=4096)
    on_dask = _build(str(tmp_path / "dask"), [FileShard(u) for u in urls], fmt=fmt, chunk_bytes=4096,
                     executor=DaskExecutorConfig(address=dask_address))
    assert local["skipped_by_reason"] == {"corrupt_shard": 1} and local["documents"] == 3000
    read = re.search(r"none of the (\d+) record positions read is kept", local["shards"][str(damaged)]["error"])
    assert read and int(read.group(1)) > 3000, "most records were read before the CRC failed, and taken back"
    assert cache_bytes(str(tmp_path / "dask")) == cache_bytes(str(tmp_path / "local")) and on_dask == {**local, "build": on_dask["build"]}
    _build(str(tmp_path / "without"), [FileShard(u) for u in (before, after)], fmt=fmt, num_workers=0, chunk_bytes=4096)
    arrays = {name: data for name, data in cache_bytes(str(tmp_path / "local")).items() if "/" in name}
    assert arrays == {name: data for name, data in cache_bytes(str(tmp_path / "without")).items() if "/" in name}
    assert any(name.startswith("loss_spans/") for name in arrays)


@pytest.mark.timeout(120)
def test_loss_spans_are_staged_and_appended_identically(dask_address, tmp_path):
    records = [{"prompt": f"question {i}? " * (i % 5 + 1), "response": f"answer {i}. " * (i % 7 + 1)} for i in range(300)]
    urls = [write_lines(tmp_path / f"sft-{k}.jsonl", [json.dumps(r).encode() for r in records[k::3]]) for k in range(3)]
    fmt = SupervisedLmDatasetFormat(max_seq_length=40)
    _build(str(tmp_path / "local"), [FileShard(u) for u in urls], fmt=fmt, num_workers=0, chunk_bytes=4096)
    _build(str(tmp_path / "dask"), [FileShard(u) for u in urls], fmt=fmt, chunk_bytes=4096, executor=DaskExecutorConfig(address=dask_address))
    local = cache_bytes(str(tmp_path / "local"))
    assert any(k.startswith("loss_spans/") for k in local)
    assert cache_bytes(str(tmp_path / "dask")) == local


def _cli_config(tmp_path, corpus, cache_dir) -> str:
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump({
        "tokenizer": TOKENIZER, "cache_dir": str(cache_dir), "configs": {"corpus": {"train_urls": corpus}},
        "build": {"on_error": "skip", "chunk_bytes": CHUNK, "commit_interval_s": 0.0},
    }))
    return str(path)


@pytest.mark.timeout(240)
def test_a_killed_driver_restarted_against_the_same_cluster_resumes(engine, corpus, reference, tmp_path):
    kind, address = engine
    many = []  # 18 shards (three copies of the corpus), one in flight at a time, so the driver is caught between shards
    for copy in range(3):
        (tmp_path / f"copy{copy}").mkdir()
        many += [shutil.copyfile(u, tmp_path / f"copy{copy}" / os.path.basename(u)) for u in corpus]
    many = [str(u) for u in many]
    cache_dir = tmp_path / "cache"
    config = _cli_config(tmp_path, many, cache_dir)
    command = [sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", config, "--build.executor.type", kind,
               "--build.executor.address", address, "--build.executor.max_in_flight", "1"]
    ledger_path = cache_dir / "corpus" / "train" / "ledger.json"
    driver = subprocess.Popen(command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finished_before_kill = 0
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline and driver.poll() is None:
            try:
                finished_before_kill = sum(s["finished"] for s in json.loads(ledger_path.read_text())["shards"])
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            if finished_before_kill >= 2:
                break
            time.sleep(0.02)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        _, stderr = driver.communicate()
    assert 2 <= finished_before_kill < len(many), stderr.decode()[-3000:]
    committed = TokenCache(str(cache_dir / "corpus" / "train")).ledger
    assert not committed.finished
    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=150)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    stats = json.loads((cache_dir / "corpus" / "train" / "stats.json").read_text())
    assert stats["build"]["resumed_at_row"] >= committed.rows > 0
    # the whole build is what a local build of the 18 shards holds: the reference's rows three times, in order,
    # and the same account of every shard
    final = TokenCache(str(cache_dir / "corpus" / "train"))
    ref = TokenCache(reference)
    assert final.num_rows() == 3 * ref.num_rows() and final.num_tokens() == 3 * ref.num_tokens()
    n = ref.num_rows()
    want = [r.tolist() for r in ref.get_rows(range(n))]
    for copy in range(3):
        assert [g.tolist() for g in final.get_rows(range(copy * n, (copy + 1) * n))] == want
    # (each copy is its own file: its name, and its identity, are not the reference's; its digest is)
    accounts = [{k: v for k, v in vars(s).items() if k not in ("name", "error", "source")} for s in final.ledger.shards]
    assert accounts == [{k: v for k, v in vars(s).items() if k not in ("name", "error", "source")} for s in ref.ledger.shards] * 3
    assert not (cache_dir / "corpus" / "train" / STAGING_DIR).exists()


def test_executor_config_parses_from_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "train_urls": ["x.jsonl"],
                                    "build": {"executor": {"type": "dask", "max_retries": 5}}}))
    config = load_data_config(str(path), ["--build.executor.address", "tcp://scheduler:8786"])
    assert config.build.executor == DaskExecutorConfig(address="tcp://scheduler:8786", max_retries=5)
    config = load_data_config(str(path), ["--build.executor.type", "ray", "--build.executor.max_in_flight", "16"])
    assert config.build.executor == RayExecutorConfig(max_retries=5, max_in_flight=16)
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "train_urls": ["x.jsonl"]}))
    assert load_data_config(str(path)).build.executor == LocalExecutorConfig()


def test_unusable_executor_settings_are_clear_errors(tmp_path):
    with pytest.raises(MissingExtraError, match=r"pip install 'tokenmix\[ray\]'"):
        import_extra("tokenmix_no_such_engine", "ray")
    with pytest.raises(ValueError, match="num_workers: 0 .* 'dask'"):
        BuildOptions(num_workers=0, executor=DaskExecutorConfig())
    with pytest.raises(ValueError, match="max_retries must be 0 or more"):
        RayExecutorConfig(max_retries=-1)
    url = write_lines(tmp_path / "a.jsonl", [b'{"text": "hello"}'])
    with pytest.raises(ValueError, match="memory:// cache lives in the driver process"):
        _build("memory://cluster-cache", [FileShard(url)], executor=DaskExecutorConfig(address="tcp://127.0.0.1:1"))


@pytest.mark.timeout(120)
def test_a_bad_record_stops_a_cluster_build_like_a_local_one_and_the_fixed_shard_resumes_mid_way(dask_address, corpus, tmp_path):
    lines = [json.dumps({"text": f"line {i}: " + "words " * (i % 13 + 1)}).encode() for i in range(400)]
    good = list(lines)
    lines[300] = b'{"text": "unfinished'
    shard = tmp_path / "b.jsonl"
    write_lines(shard, lines)
    urls = [corpus[0], str(shard)]
    options = {"on_error": "raise", "chunk_bytes": 2048}
    local = str(tmp_path / "local")
    with pytest.raises(BadInputError) as local_error:
        _build(local, [FileShard(u) for u in urls], num_workers=0, **options)
    on_cluster = str(tmp_path / "cluster")
    with pytest.raises(BadInputError) as cluster_error:
        _build(on_cluster, [FileShard(u) for u in urls], executor=DaskExecutorConfig(address=dask_address), **options)
    assert str(cluster_error.value).replace(on_cluster, "<cache>") == str(local_error.value).replace(local, "<cache>")
    assert f"{shard}, line 301: malformed_json" in str(cluster_error.value) and f"cache at {on_cluster} keeps" in str(cluster_error.value)
    assert cache_bytes(on_cluster) == cache_bytes(local)
    stopped = TokenCache(on_cluster).ledger.shards[1]
    assert 0 < stopped.position <= 300 and not stopped.finished
    write_lines(shard, good)  # fixed in place: the cluster resumes the shard at the stopped position
    stats = _build(on_cluster, [FileShard(u) for u in urls], executor=DaskExecutorConfig(address=dask_address), **options)
    assert stats["build"]["resumed_at_row"] > 0
    fresh = str(tmp_path / "fresh")
    _build(fresh, [FileShard(u) for u in urls], num_workers=0, **options)
    assert cache_bytes(on_cluster) == cache_bytes(fresh)
