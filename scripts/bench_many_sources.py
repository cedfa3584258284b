"""A mixture of many small sources: build, cold start, steady reads, local and on an S3 server with latency (issue 39).

    python scripts/bench_many_sources.py [--sources 10 100 1000] [--steps 100] [--latency_ms 30] [--corpus ../shared/corpus]
                                         [--reader_src src]

For each N, N sources are cut from the corpus's training documents (40 documents each, taken in order and wrapping
around; weights 1 to 7 in turn) and written as JSONL; one mixture over all of them is built (``build_caches``, timed
whole) and read with 64 x 2048-token shuffled batches:

- locally, from the caches on disk (with tokenmix's defaults, sources of 100 and 1,000 are built as packs there);
- from a real S3 server process on 127.0.0.1 (moto's, from the dev install) holding the caches a build on object
  storage makes by default (a cache per source: the same sources built again locally with ``pack_below_bytes: 0``, and
  copied), or with ``--pack-below-bytes`` given, a copy of the local caches; through a proxy that holds each request 0
  ms, then ``--latency_ms`` (``tests/s3_server.py``), and counts requests and bytes.

Each read runs in a fresh process (``--reader_src`` chooses the tokenmix it imports, to time another checkout; its
bytecode compiled once before, as an installed package's is, whatever ``PYTHONDONTWRITEBYTECODE`` says): the time
from launching it to its first batch, then ``--steps`` steps in all (the first batch included), the requests and bytes
it fetched (first batch, all steps), its threads and open files then, and ``--warm`` steps more (the read rate once
the sources are open) and its peak RSS (``VmHWM``: ``ru_maxrss`` would carry this script's own over the exec). Then the read amplification
of ``--hosts`` simulated hosts: each host's rows of each step (a contiguous share of the batch, as the loader cuts it),
and from the caches' own shard indexes the bytes a host fetches for them (the open object of each source it opens, the
shard indexes that object does not hold, and the stored chunks its rows touch, each once), over the bytes of tokens it
is delivered. The one-host plan is checked against the bytes the S3 reader fetched (0 ms), HTTP headers aside.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from s3_server import LatencyProxy, S3Server  # noqa: E402 - the tests' server and proxy, one copy

BUCKET = "tokenmix-bench"
BATCH, SEQ = 64, 2048
DOCS_PER_SOURCE = 40

READER = r"""
import json, os, resource, sys, time
started = float(sys.argv[3])
import numpy as np
import tokenmix
config = tokenmix.load_data_config(json.load(open(sys.argv[1])))
steps, batch, seq, warm = int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
train = config.train_set(seq)
opened_at = time.time()
train.get_batch(np.arange(batch))
first = time.time()
opened = getattr(train, "opened_sources", lambda: train.names)()
print(json.dumps({"open_s": opened_at - started, "first_s": first - started, "opened": len(opened)}), flush=True)
sys.stdin.readline()
t = time.perf_counter()
for step in range(1, steps):
    train.get_batch(np.arange(batch * step, batch * (step + 1)))
cold = (steps - 1) * batch * seq / (time.perf_counter() - t) if steps > 1 else 0.0
out = {"cold_rate": cold, "threads": len(os.listdir("/proc/self/task")), "files": len(os.listdir("/proc/self/fd")),
       "opened_end": len(getattr(train, "opened_sources", lambda: train.names)())}
print(json.dumps(out), flush=True)
sys.stdin.readline()
t = time.perf_counter()
for step in range(steps, steps + warm):
    train.get_batch(np.arange(batch * step, batch * (step + 1)))
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].split()[1]
print(json.dumps({"warm_rate": warm * batch * seq / (time.perf_counter() - t), "rss_mib": int(hwm) / 1024}), flush=True)
"""


def corpus_documents(corpus: str) -> list[str]:
    """The corpus's training documents (JSONL lines), source after source, shard after shard."""
    docs: list[str] = []
    for source in sorted(d for d in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, d))):
        for shard in sorted(glob.glob(os.path.join(corpus, source, "train-*.jsonl.zst"))):
            with open(shard, "rb") as f:
                docs += zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read().decode().splitlines()
    return docs


def write_sources(docs: list[str], n: int, root: Path, cache_dir: str, tokenizer: str) -> dict:
    """N sources of ``DOCS_PER_SOURCE`` documents each under ``root/text``; returns the mixture config over them."""
    (root / "text").mkdir(parents=True, exist_ok=True)
    configs = {}
    for i in range(n):
        path = root / "text" / f"s{i:05d}.jsonl"
        path.write_text("\n".join(docs[(DOCS_PER_SOURCE * i + k) % len(docs)] for k in range(DOCS_PER_SOURCE)) + "\n")
        configs[f"s{i:05d}"] = {"train_urls": [str(path)]}
    return {"tokenizer": tokenizer, "cache_dir": cache_dir, "shuffle": True, "configs": configs,
            "train_weights": {name: 1 + i % 7 for i, name in enumerate(configs)}}


def reader_env(reader_src: str, pycache: str) -> dict[str, str]:
    """The readers' environment: ``reader_src``'s tokenmix, its bytecode kept under ``pycache`` (as an installed package
    has it: a process that compiled every module from source, as ``PYTHONDONTWRITEBYTECODE`` makes it, would pay about
    0.1 s more at start-up than any real reader), compiled by one import before the timed processes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=reader_src, PYTHONPYCACHEPREFIX=pycache)
    subprocess.run([sys.executable, "-c", "import tokenmix.config.loading, tokenmix.config.mixture"], env=env, check=True)
    return env


def read_in_process(config_path: Path, steps: int, warm: int, base_env: dict[str, str], env: dict[str, str], proxy: LatencyProxy | None) -> dict:
    """Run the reader in a fresh process: its figures, and the requests and bytes the proxy saw (first batch, the first
    ``steps`` steps)."""
    before = proxy.counts() if proxy else (0, 0)
    started = time.time()
    child = subprocess.Popen([sys.executable, "-c", READER, str(config_path), str(steps), repr(started), str(BATCH), str(SEQ), str(warm)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**base_env, **env})
    out = json.loads(child.stdout.readline())
    first = proxy.counts() if proxy else (0, 0)
    child.stdin.write("go\n")
    child.stdin.flush()
    out.update(json.loads(child.stdout.readline()))
    end = proxy.counts() if proxy else (0, 0)
    child.stdin.write("go\n")
    child.stdin.flush()
    out.update(json.loads(child.stdout.readline()))
    child.wait(timeout=600)
    out["first_requests"], out["first_bytes"] = first[0] - before[0], first[1] - before[1]
    out["requests"], out["bytes"] = end[0] - before[0], end[1] - before[1]
    return out


def host_plans(config: dict, steps: int, hosts: list[int]) -> dict[int, tuple[float, float, float]]:
    """Per number of simulated hosts: bytes fetched over bytes delivered, summed over hosts, for ``steps`` steps; the
    same without the sources' metadata (the steady state, once every host has opened its sources); and the one-host
    total of bytes fetched (for the check against a measured read). A source of its own cache costs a host its open
    object (and its shard's index where that does not hold it); a packed source its member record, and the pack it is in
    its open object and the index of each shard the host touches, once per host for all its members."""
    import tokenmix
    from tokenmix.cache.packs import MEMBER_FILE, read_member

    train = tokenmix.load_data_config(config).train_set(SEQ)
    indices = np.arange(steps * BATCH)
    ids, draws = train.locate(indices)
    meta: dict[int, int] = {}
    stored: dict[int, tuple[str, int]] = {}
    """Each source's stored cache (its own, or its pack) and where its tokens begin there."""
    caches: dict[str, tuple[int, Any, np.ndarray, set[int]]] = {}
    """Each stored cache: its open object's bytes, its layout, its chunks' stored bytes, the shards whose index it holds."""
    examples = np.empty(len(indices), np.int64)
    for s in np.unique(ids).tolist():
        name = train.names[s]
        examples[ids == s] = train.source(name).examples(draws[ids == s])
        where = Path(config["cache_dir"]) / name / "train"
        record = read_member(str(where))
        if record is None:
            meta[s], stored[s] = 0, (str(where), 0)
        else:
            meta[s], stored[s] = os.path.getsize(where / MEMBER_FILE), (record.pack_location(str(where)), record.tokens[0])
        if stored[s][0] not in caches:
            caches[stored[s][0]] = _stored_cache(Path(stored[s][0]))
    itemsize = next(iter(caches.values()))[1].dtype.itemsize
    out = {}
    for h in hosts:
        fetched = steady = 0
        per_host = BATCH // h
        for host in range(h):
            mine = (indices % BATCH) // per_host == host
            touched: dict[str, set[int]] = {}
            for s in np.unique(ids[mine]).tolist():
                location, first = stored[s]
                inner = caches[location][1].inner
                starts = first + examples[mine & (ids == s)] * SEQ
                touched.setdefault(location, set()).update(c for a in starts.tolist() for c in range(a // inner, (a + SEQ - 1) // inner + 1))
                fetched += meta[s]
            for location, chunks in touched.items():
                open_bytes, layout, sizes, held = caches[location]
                shards = {c // layout.chunks_per_shard for c in chunks}
                data = int(sizes[sorted(chunks)].sum())
                fetched += open_bytes + layout.index_bytes * len(shards - held) + data
                steady += data
        delivered = len(indices) * SEQ * itemsize
        out[h] = (fetched / delivered, steady / delivered, fetched if h == 1 else 0)
    return out


def _stored_cache(where: Path) -> tuple[int, Any, np.ndarray, set[int]]:
    """A stored cache's open object's bytes, its token layout, every stored chunk's bytes (from each shard's index),
    and the shards whose index its open object holds."""
    from tokenmix.cache.open_object import OPEN_FILE, read_open_object
    from tokenmix.cache.shard_reads import ShardLayout
    from tokenmix.cache.store import open_kvstore

    data = where / "input_ids" / "data"
    layout = ShardLayout.from_metadata(json.loads((data / "zarr.json").read_text()))
    assert layout is not None
    sizes = []
    for shard in range(len(os.listdir(data / "c"))):
        index = np.frombuffer((data / "c" / str(shard)).read_bytes()[: layout.index_bytes - 4], "<u8").reshape(-1, 2)
        sizes.append(index[:, 1].astype(np.int64))
    held = set(read_open_object(open_kvstore(str(where)), str(where)).shard_indexes)
    return os.path.getsize(where / OPEN_FILE), layout, np.concatenate(sizes), held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warm", type=int, default=50, help="steps timed after --steps, every source drawn so far open")
    parser.add_argument("--latency_ms", type=float, default=30.0)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(REPO.parent / "shared" / "tokenizer"))
    parser.add_argument("--reader_src", default=str(REPO / "src"), help="the tokenmix source tree the reader processes import")
    parser.add_argument("--work", default=None, help="keep the sources and caches here (default: a temporary directory)")
    parser.add_argument("--pack-below-bytes", type=int, default=None,
                        help="build.pack_below_bytes (default: tokenmix's, which packs 32 sources or more; 0: a cache per source)")
    args = parser.parse_args()
    import s3fs

    from tokenmix import build_caches, load_data_config

    docs = corpus_documents(args.corpus)
    print(f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {len(docs)} documents; "
          f"readers import {args.reader_src}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-many-") as scratch:
        work = Path(args.work or scratch)
        server = S3Server(scratch, BUCKET)
        try:
            keys = {"AWS_ENDPOINT_URL": server.endpoint, **server.keys}
            os.environ.update(keys)
            store = s3fs.S3FileSystem(skip_instance_cache=True)
            proxies = {0.0: LatencyProxy(server.port, 0.0), args.latency_ms: LatencyProxy(server.port, args.latency_ms / 1000)}
            rows = []
            readers = reader_env(args.reader_src, str(Path(scratch) / "pycache"))
            for n in args.sources:
                root = work / f"n{n}"
                config = write_sources(docs, n, root, str(root / "caches"), args.tokenizer)
                if args.pack_below_bytes is not None:
                    config["build"] = {"pack_below_bytes": args.pack_below_bytes}
                (root / "local.json").write_text(json.dumps(config))
                started = time.perf_counter()
                built = build_caches(load_data_config(config), progress=False)
                build_s = time.perf_counter() - started
                tokens = sum(int(stats["tokens"]) for stats in built.values())
                remote = config
                if args.pack_below_bytes is None:  # the bucket gets the caches a build there makes by default: no packs
                    remote = {**config, "cache_dir": str(root / "caches-s3"), "build": {"pack_below_bytes": 0}}
                    build_caches(load_data_config(remote), progress=False)
                store.put(remote["cache_dir"] + "/", f"{BUCKET}/n{n}/", recursive=True)
                (root / "s3.json").write_text(json.dumps({**remote, "cache_dir": f"s3://{BUCKET}/n{n}"}))
                print(f"N={n}: built {tokens / 1e6:.1f} M tokens ({tokens / n / 1e3:.0f} k a source) in {build_s:.1f} s, "
                      f"{tokens / build_s / 1e6:.2f} M tokens/s", flush=True)
                results = {"local": read_in_process(root / "local.json", args.steps, args.warm, readers, {}, None)}
                for latency, proxy in proxies.items():
                    results[f"s3 {latency:g} ms"] = read_in_process(root / "s3.json", args.steps, args.warm, readers,
                                                                   {"AWS_ENDPOINT_URL": proxy.endpoint, "AWS_REGION": "us-east-1"}, proxy)
                plans = host_plans(remote, args.steps, args.hosts)
                measured = results["s3 0 ms"]["bytes"]
                for label, r in results.items():
                    fetched = "-" if label == "local" else (f"{r['first_requests']} req / {r['first_bytes'] / 1e6:.2f} MB; "
                                                            f"{r['requests']} req / {r['bytes'] / 1e6:.1f} MB")
                    rows.append(f"| {n:,} | {label} | {r['open_s']:.2f} s | {r['first_s']:.2f} s ({r['opened']} opened) | "
                                f"{r['cold_rate'] / 1e6:.1f} / {r['warm_rate'] / 1e6:.1f} M tok/s | {r['rss_mib']:.0f} MiB | "
                                f"{r['threads']} | {r['files']} | {fetched} |")
                    print(rows[-1], flush=True)
                amplification = ", ".join(f"{h} hosts {total:.2f}x ({steady:.2f}x without metadata)"
                                          for h, (total, steady, _) in plans.items())
                rows.append(f"| {n:,} | amplification, {args.steps} steps | {amplification}; one-host plan "
                            f"{plans[1][2] / 1e6:.1f} MB, measured {measured / 1e6:.1f} MB |")
                print(rows[-1], f"build {build_s:.1f} s", flush=True)
        finally:
            server.stop()
    print("\n| sources | where | process start -> mixture opened | -> first batch | reads: steps 2-100 / 50 more | peak RSS | threads | "
          "open files | fetched: first batch; all steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
