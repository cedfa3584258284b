"""Cache-build throughput against its two limits, measured in the same run.

    python scripts/bench_build.py [--corpus ../shared/corpus] [--tokenizer data/tokenizer] [--workers N] [--repeats 3]

Builds the train caches of every source under --corpus into a fresh directory, timing the whole
``build_caches`` call: reading, decompressing, parsing, tokenizing, writing, committing, the backend
check, worker start-up. Each build is run with ``build.tokenizer_backend: auto`` (``fastokens`` where it
is exact) and with ``tokenizers``. Two limits are timed on the same shards, on the same cores:

(a) raw Hugging Face ``tokenizers`` ``encode_batch_fast`` over the documents already read and parsed
    into memory (its own thread pool, all cores): the limit of every builder that tokenizes with it;
(b) read + decompress + parse (orjson) + ``fastokens`` ``encode_batch_flat``, chunk by chunk, in
    one thread (``fastokens`` spreads each batch over every core): the limit of a builder with an
    exact fast tokenizer, with nothing written.

Builds and limits alternate, --repeats times each, and the best of each is compared, so that noise
from other tenants of the machine hits both alike. Every build and every run of (b) starts from a
freshly loaded ``fastokens`` tokenizer (it caches words as it goes). The builds share one process, so
from the second build on the tokenizer library (transformers) is already imported; a cold CLI build
of the same corpus is timed as well. Prints tokens/s, the ratios, a breakdown of (b), peak RSS and
cache bytes per token, and a markdown row for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

import orjson
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


def bench_build(corpus: str, tokenizer: str, workers: int | None, cache_dir: str, backend: str) -> dict:
    from tokenmix import BuildOptions, LMDatasetSourceConfig, LMMixtureDatasetConfig, build_caches
    from tokenmix.formats.backends import forget_loaded

    forget_loaded()
    sources = sorted(d for d in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, d)))
    config = LMMixtureDatasetConfig(
        tokenizer=tokenizer,
        cache_dir=cache_dir,
        configs={s: LMDatasetSourceConfig(train_urls=sorted(glob.glob(os.path.join(corpus, s, "train-*")))) for s in sources},
        build=BuildOptions(num_workers=workers, tokenizer_backend=backend),
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
        "backends": sorted({r["build"]["tokenizer_backend"]["name"] for r in results.values()}),
    }


def bench_raw(files: list[str], tokenizer: str) -> dict:
    """Limit (a): ``tokenizers``' ``encode_batch_fast`` on documents already in memory, 1024 at a time."""
    from tokenizers import Tokenizer

    from tokenmix.sources import FileShard

    texts = [orjson.loads(r)["text"] for f in files for chunk in FileShard(f).read() for r in chunk.records]
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


def bench_fast_limit(files: list[str], tokenizer: str) -> dict:
    """Limit (b): read, decompress, parse and ``fastokens``-encode the shards chunk by chunk (1 MiB, as the build reads),
    with a freshly loaded tokenizer; the seconds of each step are kept for the breakdown."""
    import fastokens

    from tokenmix.sources import FileShard

    tok = fastokens.Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json"))
    steps = {"read + decompress": 0.0, "parse": 0.0, "encode": 0.0}
    tokens = 0
    started = time.perf_counter()
    for f in files:
        mark = time.perf_counter()
        for chunk in FileShard(f).read(0, 1 << 20):
            parsed = time.perf_counter()
            texts = [orjson.loads(r)["text"] for r in chunk.records]
            encoded = time.perf_counter()
            ids, _ = tok.encode_batch_flat(texts)
            tokens += len(ids) // 4
            done = time.perf_counter()
            steps["read + decompress"] += parsed - mark
            steps["parse"] += encoded - parsed
            steps["encode"] += done - encoded
            mark = time.perf_counter()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(REPO / "data" / "tokenizer"))
    parser.add_argument("--workers", type=int, default=None, help="build.num_workers (default: one per core)")
    parser.add_argument("--repeats", type=int, default=3, help="builds and limit runs, alternating; the best of each counts")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"auto": [], "tokenizers": [], "limit_a": [], "limit_b": []}
    files: list[str] = []
    for _ in range(args.repeats):
        for backend in ("auto", "tokenizers"):
            cache_dir = tempfile.mkdtemp(prefix="tokenmix-bench-")
            try:
                runs[backend].append(bench_build(args.corpus, args.tokenizer, args.workers, cache_dir, backend))
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
            files = runs[backend][-1]["train_files"]
        runs["limit_b"].append(bench_fast_limit(files, args.tokenizer))
        runs["limit_a"].append(bench_raw(files, args.tokenizer))
    cold = bench_cold_cli(args.corpus, args.tokenizer, args.workers)
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    fast, slow, raw, limit = best["auto"], best["tokenizers"], best["limit_a"], best["limit_b"]
    assert fast["tokens"] == slow["tokens"], "the two backends built different caches"
    assert fast["tokens"] - fast["documents"] == raw["tokens"] == limit["tokens"], "the caches and the limits tokenized different text"
    mib = 1 << 20
    rss = runs["auto"][0]["peak_rss"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"corpus: {args.corpus}: {fast['documents']:,} documents, {raw['chars'] / 1e6:.1f} M chars, {fast['tokens']:,} tokens")
    for key, label in (("auto", "build, auto"), ("tokenizers", "build, tokenizers"), ("limit_a", "limit (a)"), ("limit_b", "limit (b)")):
        print(f"{label} seconds: " + ", ".join(f"{r['seconds']:.2f}" for r in runs[key]))
    print(f"build, auto ({'+'.join(fast['backends'])}): {fast['seconds']:.2f} s  {fast['tokens_per_s'] / 1e6:.2f} M tokens/s")
    print(f"build, tokenizers: {slow['seconds']:.2f} s  {slow['tokens_per_s'] / 1e6:.2f} M tokens/s")
    print(f"limit (a) raw encode_batch_fast: {raw['seconds']:.2f} s  {raw['tokens_per_s'] / 1e6:.2f} M tokens/s")
    print(f"limit (b) read + decompress + parse + fastokens: {limit['seconds']:.2f} s  {limit['tokens_per_s'] / 1e6:.2f} M tokens/s  "
          + ", ".join(f"{k} {v:.2f} s" for k, v in limit["steps"].items()))
    print(f"ratios: auto / (a) {fast['tokens_per_s'] / raw['tokens_per_s']:.2f}x, auto / (b) {fast['tokens_per_s'] / limit['tokens_per_s']:.2f}, "
          f"tokenizers / (a) {slow['tokens_per_s'] / raw['tokens_per_s']:.2f}, auto / tokenizers {fast['tokens_per_s'] / slow['tokens_per_s']:.1f}x")
    print(f"cold CLI build, auto (new process, imports, tokenizer load): {cold:.2f} s, {fast['tokens'] / cold / 1e6:.2f} M tokens/s")
    print(f"peak RSS (auto): driver {rss.get('driver', 0) / mib:.0f} MiB, largest worker {rss.get('worker', 0) / mib:.0f} MiB, "
          f"all processes {rss.get('total', 0) / mib:.0f} MiB")
    print(f"cache: {fast['cache_bytes'] / fast['tokens']:.3f} bytes/token on disk (token data {fast['token_data_bytes'] / fast['tokens']:.3f})")
    print(f"| {fast['tokens'] / 1e6:.1f} M | {fast['tokens_per_s'] / 1e6:.2f} M/s | {slow['tokens_per_s'] / 1e6:.2f} M/s | "
          f"{raw['tokens_per_s'] / 1e6:.2f} M/s | {limit['tokens_per_s'] / 1e6:.2f} M/s | **{fast['tokens_per_s'] / raw['tokens_per_s']:.1f}x** | "
          f"**{fast['tokens_per_s'] / limit['tokens_per_s']:.2f}** | {fast['tokens'] / cold / 1e6:.2f} M/s | {rss.get('total', 0) / mib:.0f} MiB |")


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
        command = [sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", path, "--build.tokenizer_backend", "auto"]
        if workers is not None:
            command += ["--build.num_workers", str(workers)]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return time.perf_counter() - started


if __name__ == "__main__":
    main()
