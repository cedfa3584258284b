"""Cache-build throughput against the raw tokenizer ceiling, measured in the same run.

    python scripts/bench_build.py [--corpus ../shared/corpus] [--tokenizer data/tokenizer] [--workers N] [--repeats 3]

Builds the train caches of every source under --corpus into a fresh directory, timing the whole
``build_caches`` call: reading, decompressing, parsing, tokenizing, writing, committing, worker
start-up. The raw ceiling reads, decompresses and parses the same documents into memory first,
then times bare ``tokenizers`` ``encode_batch_fast`` over them on the same cores (its own
thread pool, all cores). Builds and raw runs alternate, --repeats times each, and the best of
each is compared, so that noise from other tenants of the machine hits both alike.

The builds run in one process, so from the second build on the tokenizer library (transformers)
is already imported: the ratio is the steady throughput a long build sees. The first build's
extra time is printed as the one-off start-up cost, and a cold CLI build of the same corpus is
timed as well. Prints tokens/s, the ratio, peak RSS (driver and workers) and cache bytes per
token, and a markdown row for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def _peak_rss_sampler(stop: threading.Event, out: dict[str, int]) -> None:
    me = psutil.Process()
    while not stop.is_set():
        try:
            out["driver"] = max(out.get("driver", 0), me.memory_info().rss)
            children = me.children(recursive=True)
            for child in children:
                out["worker"] = max(out.get("worker", 0), child.memory_info().rss)
            out["total"] = max(out.get("total", 0), me.memory_info().rss + sum(c.memory_info().rss for c in children))
        except psutil.Error:
            pass
        stop.wait(0.05)


def _dir_bytes(path: str, pattern: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "**", pattern), recursive=True) if os.path.isfile(p))


def bench_build(corpus: str, tokenizer: str, workers: int | None, cache_dir: str) -> dict:
    from tokenmix import BuildOptions, LMDatasetSourceConfig, LMMixtureDatasetConfig, build_caches

    sources = sorted(d for d in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, d)))
    config = LMMixtureDatasetConfig(
        tokenizer=tokenizer,
        cache_dir=cache_dir,
        configs={s: LMDatasetSourceConfig(train_urls=sorted(glob.glob(os.path.join(corpus, s, "train-*")))) for s in sources},
        build=BuildOptions(num_workers=workers),
    )
    rss: dict[str, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_peak_rss_sampler, args=(stop, rss), daemon=True)
    sampler.start()
    started = time.perf_counter()
    results = build_caches(config, progress=False)
    seconds = time.perf_counter() - started
    stop.set()
    sampler.join()
    tokens = sum(r["tokens"] for r in results.values())
    docs = sum(r["documents"] for r in results.values())
    data_bytes = _dir_bytes(cache_dir, "input_ids/data/c/*")
    return {
        "seconds": seconds, "tokens": tokens, "documents": docs, "tokens_per_s": tokens / seconds,
        "peak_rss": rss, "cache_bytes": _dir_bytes(cache_dir, "*"), "token_data_bytes": data_bytes,
        "train_files": [u for s in sources for u in config.configs[s].train_urls],
    }


def bench_raw(files: list[str], tokenizer: str) -> dict:
    from tokenizers import Tokenizer

    from tokenmix.sources import FileShard

    texts = [json.loads(r)["text"] for f in files for chunk in FileShard(f).read() for r in chunk.records]
    tok = Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json"))
    tok.encode_batch_fast(texts[:64], add_special_tokens=False)
    best = None
    for _ in range(2):
        started = time.perf_counter()
        tokens = 0
        for i in range(0, len(texts), 1024):
            tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i : i + 1024], add_special_tokens=False))
        seconds = time.perf_counter() - started
        best = seconds if best is None else min(best, seconds)
    return {"seconds": best, "tokens": tokens, "tokens_per_s": tokens / best, "chars": sum(map(len, texts))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(REPO / "data" / "tokenizer"))
    parser.add_argument("--workers", type=int, default=None, help="tokenizing processes (default: one per core)")
    parser.add_argument("--repeats", type=int, default=3, help="builds and raw runs, alternating; the best of each counts")
    args = parser.parse_args()
    builds, raws = [], []
    for _ in range(args.repeats):
        cache_dir = tempfile.mkdtemp(prefix="tokenmix-bench-")
        try:
            builds.append(bench_build(args.corpus, args.tokenizer, args.workers, cache_dir))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        raws.append(bench_raw(builds[0]["train_files"], args.tokenizer))
    cold = bench_cold_cli(args.corpus, args.tokenizer, args.workers)
    built = min(builds, key=lambda b: b["seconds"])
    raw = min(raws, key=lambda r: r["seconds"])
    assert built["tokens"] - built["documents"] == raw["tokens"], "the cache and the raw run tokenized different text"
    ratio = built["tokens_per_s"] / raw["tokens_per_s"]
    cold_ratio = (built["tokens"] / cold) / raw["tokens_per_s"]
    mib = 1 << 20
    rss = builds[0]["peak_rss"]  # later builds share the process with the raw runs' texts
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"corpus: {args.corpus}: {built['documents']:,} documents, {raw['chars'] / 1e6:.1f} M chars, {built['tokens']:,} tokens")
    print("build seconds:", ", ".join(f"{b['seconds']:.2f}" for b in builds), "| raw seconds:", ", ".join(f"{r['seconds']:.2f}" for r in raws))
    print(f"build (best): {built['seconds']:.2f} s  {built['tokens_per_s'] / 1e6:.3f} M tokens/s")
    print(f"raw encode_batch_fast (best): {raw['seconds']:.2f} s  {raw['tokens_per_s'] / 1e6:.3f} M tokens/s")
    print(f"ratio build / raw: {ratio:.3f}")
    print(f"first build's one-off start-up (tokenizer library import): {builds[0]['seconds'] - built['seconds']:.2f} s")
    print(f"cold CLI build (new process, imports, tokenizer load, workers): {cold:.2f} s, ratio {cold_ratio:.3f}")
    print(f"peak RSS: driver {rss.get('driver', 0) / mib:.0f} MiB, largest worker {rss.get('worker', 0) / mib:.0f} MiB, "
          f"all processes {rss.get('total', 0) / mib:.0f} MiB")
    print(f"cache: {built['cache_bytes'] / built['tokens']:.3f} bytes/token on disk (token data {built['token_data_bytes'] / built['tokens']:.3f})")
    print(f"| {built['tokens'] / 1e6:.1f} M | {built['tokens_per_s'] / 1e6:.3f} M/s | {raw['tokens_per_s'] / 1e6:.3f} M/s | "
          f"**{ratio:.2f}x** | {cold_ratio:.2f}x | {rss.get('total', 0) / mib:.0f} MiB | {built['cache_bytes'] / built['tokens']:.2f} |")


def bench_cold_cli(corpus: str, tokenizer: str, workers: int | None) -> float:
    """Seconds for ``tokenmix build-cache`` of the same corpus in a new process."""
    import subprocess
    import sys

    import yaml

    sources = sorted(d for d in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, d)))
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-") as tmp:
        config = {
            "tokenizer": tokenizer,
            "cache_dir": os.path.join(tmp, "cache"),
            "configs": {s: {"train_urls": sorted(glob.glob(os.path.join(corpus, s, "train-*")))} for s in sources},
        }
        path = os.path.join(tmp, "bench.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        command = [sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", path]
        if workers is not None:
            command += ["--build.num_workers", str(workers)]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return time.perf_counter() - started


if __name__ == "__main__":
    main()
