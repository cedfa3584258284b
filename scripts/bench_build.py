"""Cache-build throughput against its two limits, measured in the same run.

    python scripts/bench_build.py [--corpus ../shared/corpus] [--tokenizer data/tokenizer] [--workers N] [--repeats 3]
                                  [--cold-repeats 1]
    python scripts/bench_build.py --sources N [--repeats 2]     # N small sources cut from the corpus (issue 39)

Builds the train caches of every source under --corpus into a fresh directory, timing the whole
``build_caches`` call: reading, decompressing, parsing, tokenizing, writing, committing, the backend
check, worker start-up. Each build is run with ``build.tokenizer_backend: auto`` (``fastokens`` where it
is exact) and with ``tokenizers``. Two limits are timed on the same shards, on the same cores:

(a) raw Hugging Face ``tokenizers`` ``encode_batch_fast`` over the documents already read and parsed
    into memory (its own thread pool, all cores): the limit of every builder that tokenizes with it;
(b) read + decompress + parse (orjson) + ``fastokens`` ``encode_batch_flat``, chunk by chunk, in
    one thread (``fastokens`` spreads each batch over every core), in a process of its own (a build's pool sets how
    many threads ``fastokens`` uses, once per process): the limit of a builder with an exact fast tokenizer, with
    nothing written.

Builds and limits alternate, --repeats times each, and the best of each is compared, so that noise
from other tenants of the machine hits both alike. Every build and every run of (b) starts from a
freshly loaded ``fastokens`` tokenizer (it caches words as it goes). The builds share one process, so
from the second build on the tokenizer libraries are already imported; a cold whole call on the same
corpus is timed as well (below; it replaced a cold ``tokenmix build-cache``, whose figure also held the
CLI's own imports and table). Prints tokens/s, the ratios, a breakdown of (b), peak RSS and
cache bytes per token, and a markdown row for docs/benchmarks.md (with ``--sources``, the process CPU of each build and
run of (b) too, all threads: a loaded machine moves it much less than wall time).

``--sources N`` builds instead N small sources of ``DOCS_PER_SOURCE`` documents each, cut from the corpus (its
documents in file order, train and validation, taken round after round until N sources have theirs), each written as
one ``.jsonl.zst`` shard, in one mixture with weights 1-7: a wide mixture's build, where each cache's fixed costs
(lock, ledger, arrays, backend check, final commit) weigh against little encoding, unless they are built as packs
(``build.pack_below_bytes``, the default; ``--pack-below-bytes 0`` builds a cache per source). Only ``auto`` is built,
against limit (b) on the same shards. Either way the cold whole call is timed too: ``build_caches`` in a new process,
from before ``import tokenmix`` to its return (tokenmix's bytecode compiled before, as an installed package's is), and
"once started": tokens over the time from the first cache's backend choice (the log line ``encoding with``: imports,
tokenizer loads and the check are behind) to the end; with the cold process's CPU seconds (all its threads), which a
loaded machine moves less than wall time. ``--cold-repeats N`` makes N cold calls, one after another, and keeps the
fastest (each one's whole and start-up seconds are printed): one alone moves by 20% and more on a shared VM. The cold
calls follow the in-process builds of the same shards, so the backend check's verdicts on their sample are remembered
(``formats/probe_verdicts.py``): a first build of new input also loads ``tokenizers`` and encodes its sample.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import platform
import shutil
import sys
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


class _StartedAt(logging.Handler):
    """Keeps the time of the first backend choice logged: the build's start-up is behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.time: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.time is None and "encoding with" in record.getMessage():
            self.time = time.perf_counter()


def _dir_bytes(path: str, pattern: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "**", pattern), recursive=True) if os.path.isfile(p))


DOCS_PER_SOURCE = 40
BUILD_OPTIONS: dict[str, int] = {}
"""``build:`` options every build of the run takes besides workers and backend (``--pack-below-bytes``)."""


def corpus_sources(corpus: str) -> dict[str, list[str]]:
    """The corpus's sources (its subdirectories) and their train shards."""
    sources = sorted(d for d in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, d)))
    return {s: sorted(glob.glob(os.path.join(corpus, s, "train-*"))) for s in sources}


def cut_sources(corpus: str, count: int, directory: str) -> dict[str, list[str]]:
    """``count`` sources of ``DOCS_PER_SOURCE`` documents each, cut from the corpus's documents in file order (wrapping
    around), each one ``.jsonl.zst`` shard under ``directory``."""
    import zstandard

    from tokenmix.sources import FileShard

    docs = [r for f in sorted(glob.glob(os.path.join(corpus, "*", "*.jsonl.zst"))) for chunk in FileShard(f).read() for r in chunk.records
            if r.strip()]
    compressor = zstandard.ZstdCompressor(level=3)
    sources = {}
    for i in range(count):
        path = os.path.join(directory, f"source-{i:05d}.jsonl.zst")
        lines = [docs[(i * DOCS_PER_SOURCE + j) % len(docs)] for j in range(DOCS_PER_SOURCE)]
        with open(path, "wb") as f:
            f.write(compressor.compress(b"".join(line.rstrip(b"\n") + b"\n" for line in lines)))
        sources[f"s{i:05d}"] = [path]
    return sources


def mixture_config(sources: dict[str, list[str]], tokenizer: str, cache_dir: str, workers: int | None, backend: str):
    """One mixture over the sources, weights 1-7 in turn."""
    from tokenmix import BuildOptions, LMDatasetSourceConfig, LMMixtureDatasetConfig

    return LMMixtureDatasetConfig(
        tokenizer=tokenizer,
        cache_dir=cache_dir,
        configs={s: LMDatasetSourceConfig(train_urls=urls) for s, urls in sources.items()},
        train_weights={s: 1 + i % 7 for i, s in enumerate(sources)},
        build=BuildOptions(num_workers=workers, tokenizer_backend=backend, **BUILD_OPTIONS),
    )


def bench_build(sources: dict[str, list[str]], tokenizer: str, workers: int | None, cache_dir: str, backend: str) -> dict:
    from tokenmix import build_caches
    from tokenmix.formats.backends import forget_loaded

    forget_loaded()
    config = mixture_config(sources, tokenizer, cache_dir, workers, backend)
    started_at = _StartedAt()
    logging.getLogger("tokenmix.cache.backend_choice").addHandler(started_at)
    logging.getLogger("tokenmix.cache.backend_choice").setLevel(logging.INFO)
    rss: dict[str, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_peak_rss_sampler, args=(stop, rss), daemon=True)
    sampler.start()
    cpu = time.process_time()
    started = time.perf_counter()
    results = build_caches(config, progress=False)
    ended = time.perf_counter()
    cpu = time.process_time() - cpu
    seconds = ended - started
    logging.getLogger("tokenmix.cache.backend_choice").removeHandler(started_at)
    stop.set()
    sampler.join()
    tokens = sum(r["tokens"] for r in results.values())
    docs = sum(r["documents"] for r in results.values())
    data_bytes = _dir_bytes(cache_dir, "input_ids/data/c/*")
    return {
        "seconds": seconds, "tokens": tokens, "documents": docs, "tokens_per_s": tokens / seconds, "cpu_seconds": cpu,
        "started_tokens_per_s": tokens / (ended - started_at.time) if started_at.time else None,
        "peak_rss": rss, "cache_bytes": _dir_bytes(cache_dir, "*"), "token_data_bytes": data_bytes,
        "train_files": [u for urls in sources.values() for u in urls],
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
    """Limit (b) (``fast_limit_here``) in a new process, as ``fastokens`` runs left to itself: a build's encoding pool
    gives each of its threads a share of the cores (``FASTOKENS_BPE_THREADS``, which ``fastokens`` reads once per
    process), which in this process would have bound the limit to one core."""
    import subprocess

    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); from bench_build import fast_limit_here; "
            "print(json.dumps(fast_limit_here(json.loads(sys.argv[1]), sys.argv[2])))")
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(files), tokenizer], check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def fast_limit_here(files: list[str], tokenizer: str) -> dict:
    """Limit (b) in this process: read, decompress, parse and ``fastokens``-encode the shards chunk by chunk (1 MiB, as
    the build reads), with a freshly loaded tokenizer; the seconds of each step are kept for the breakdown."""
    import fastokens

    from tokenmix.sources import FileShard

    tok = fastokens.Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json"))
    steps = {"read + decompress": 0.0, "parse": 0.0, "encode": 0.0}
    tokens = 0
    cpu = time.process_time()
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
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "steps": steps,
            "cpu_seconds": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(REPO / "data" / "tokenizer"))
    parser.add_argument("--workers", type=int, default=None, help="build.num_workers (default: one per core)")
    parser.add_argument("--repeats", type=int, default=3, help="builds and limit runs, alternating; the best of each counts")
    parser.add_argument("--sources", type=int, default=None, help=f"build N sources of {DOCS_PER_SOURCE} documents cut from the corpus")
    parser.add_argument("--pack-below-bytes", type=int, default=None,
                        help="build.pack_below_bytes (default: tokenmix's; 0 builds every source as a cache of its own)")
    parser.add_argument("--cold-repeats", type=int, default=1, help="cold whole calls, one after another; the fastest counts")
    args = parser.parse_args()
    if args.pack_below_bytes is not None:
        BUILD_OPTIONS["pack_below_bytes"] = args.pack_below_bytes
    if args.sources is not None:
        with tempfile.TemporaryDirectory(prefix="tokenmix-bench-sources-") as tmp:
            bench_many_sources(cut_sources(args.corpus, args.sources, tmp), args)
        return
    sources = corpus_sources(args.corpus)
    runs: dict[str, list[dict]] = {"auto": [], "tokenizers": [], "limit_a": [], "limit_b": []}
    files = [u for urls in sources.values() for u in urls]
    for _ in range(args.repeats):
        for backend in ("auto", "tokenizers"):
            runs[backend].append(_build_in_scratch(sources, args.tokenizer, args.workers, backend))
        runs["limit_b"].append(bench_fast_limit(files, args.tokenizer))
        runs["limit_a"].append(bench_raw(files, args.tokenizer))
    cold = bench_cold_calls(sources, args.tokenizer, args.workers, args.cold_repeats)
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    fast, slow, raw, limit = best["auto"], best["tokenizers"], best["limit_a"], best["limit_b"]
    assert fast["tokens"] == slow["tokens"] == cold["tokens"], "the builds made different caches"
    assert fast["tokens"] - fast["documents"] == raw["tokens"] == limit["tokens"], "the caches and the limits tokenized different text"
    mib = 1 << 20
    rss = runs["auto"][0]["peak_rss"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
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
    _print_cold(cold, limit)
    print(f"peak RSS (auto): driver {rss.get('driver', 0) / mib:.0f} MiB, largest worker {rss.get('worker', 0) / mib:.0f} MiB, "
          f"all processes {rss.get('total', 0) / mib:.0f} MiB")
    print(f"cache: {fast['cache_bytes'] / fast['tokens']:.3f} bytes/token on disk (token data {fast['token_data_bytes'] / fast['tokens']:.3f})")
    print(f"| {fast['tokens'] / 1e6:.1f} M | {fast['tokens_per_s'] / 1e6:.2f} M/s | {slow['tokens_per_s'] / 1e6:.2f} M/s | "
          f"{raw['tokens_per_s'] / 1e6:.2f} M/s | {limit['tokens_per_s'] / 1e6:.2f} M/s | **{fast['tokens_per_s'] / raw['tokens_per_s']:.1f}x** | "
          f"**{fast['tokens_per_s'] / limit['tokens_per_s']:.2f}** | {cold['tokens'] / cold['seconds'] / 1e6:.2f} M/s | "
          f"{rss.get('total', 0) / mib:.0f} MiB |")


def bench_many_sources(sources: dict[str, list[str]], args: argparse.Namespace) -> None:
    """``--sources N``: the auto build of N small sources against limit (b) on the same shards, and the cold whole call."""
    files = [u for urls in sources.values() for u in urls]
    builds, limits = [], []
    for _ in range(args.repeats):
        builds.append(_build_in_scratch(sources, args.tokenizer, args.workers, "auto"))
        limits.append(bench_fast_limit(files, args.tokenizer))
    cold = bench_cold_calls(sources, args.tokenizer, args.workers, args.cold_repeats)
    build, limit = min(builds, key=lambda r: r["seconds"]), min(limits, key=lambda r: r["seconds"])
    assert build["tokens"] == cold["tokens"] and build["tokens"] - build["documents"] == limit["tokens"], "builds and limit differ"
    rss = build["peak_rss"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{len(sources):,} sources of {DOCS_PER_SOURCE} documents from {args.corpus}: {build['tokens']:,} tokens "
          f"({build['tokens'] / len(sources) / 1e3:.1f} k a source)")
    print("build seconds: " + ", ".join(f"{r['seconds']:.2f}" for r in builds)
          + "; limit (b) seconds: " + ", ".join(f"{r['seconds']:.2f}" for r in limits))
    print(f"build, auto ({'+'.join(build['backends'])}): {build['seconds']:.2f} s  {build['tokens_per_s'] / 1e6:.2f} M tokens/s "
          f"({build['tokens_per_s'] / limit['tokens_per_s']:.2f}x (b)); once started {build['started_tokens_per_s'] / 1e6:.2f} M tokens/s "
          f"({build['started_tokens_per_s'] / limit['tokens_per_s']:.2f}x)")
    print(f"limit (b) read + decompress + parse + fastokens: {limit['seconds']:.2f} s  {limit['tokens_per_s'] / 1e6:.2f} M tokens/s")
    print("process CPU (user + system, all threads): build " + ", ".join(f"{r['cpu_seconds']:.2f}" for r in builds)
          + " s; limit (b) " + ", ".join(f"{r['cpu_seconds']:.2f}" for r in limits)
          + f" s; build over (b): {(build['cpu_seconds'] - limit['cpu_seconds']) / len(sources) * 1e3:.2f} ms a source")
    _print_cold(cold, limit)
    print(f"peak RSS: all processes {rss.get('total', 0) / (1 << 20):.0f} MiB")
    print(f"| {len(sources):,} | {build['tokens'] / 1e6:.1f} M | {build['seconds']:.2f} s | {build['tokens_per_s'] / 1e6:.2f} M/s | "
          f"{limit['tokens_per_s'] / 1e6:.2f} M/s | **{build['tokens_per_s'] / limit['tokens_per_s']:.2f}x** | "
          f"{cold['seconds']:.2f} s, {cold['tokens'] / cold['seconds'] / 1e6:.2f} M/s, "
          f"**{cold['tokens'] / cold['seconds'] / limit['tokens_per_s']:.2f}x** | "
          f"{cold['tokens'] / cold['started_seconds'] / 1e6:.2f} M/s, **{cold['tokens'] / cold['started_seconds'] / limit['tokens_per_s']:.2f}x** |")


def _build_in_scratch(sources: dict[str, list[str]], tokenizer: str, workers: int | None, backend: str) -> dict:
    cache_dir = tempfile.mkdtemp(prefix="tokenmix-bench-")
    try:
        return bench_build(sources, tokenizer, workers, cache_dir, backend)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _print_cold(cold: dict, limit: dict) -> None:
    whole, started = cold["tokens"] / cold["seconds"], cold["tokens"] / cold["started_seconds"]
    if len(cold["runs"]) > 1:
        print("cold whole calls (seconds; start-up): " + ", ".join(f"{r['seconds']:.2f}; {r['seconds'] - r['started_seconds']:.2f}"
                                                                 for r in cold["runs"]))
    print(f"cold whole call (new process, from import tokenmix to the return of build_caches): {cold['seconds']:.2f} s, "
          f"{whole / 1e6:.2f} M tokens/s ({whole / limit['tokens_per_s']:.2f}x (b)); once started "
          f"{cold['started_seconds']:.2f} s, {started / 1e6:.2f} M tokens/s ({started / limit['tokens_per_s']:.2f}x (b)); start-up "
          f"{cold['seconds'] - cold['started_seconds']:.2f} s; process CPU {cold['cpu_seconds']:.2f} s (all threads, interpreter start included)")


COLD_START = """
import time
began = time.perf_counter()
import json, logging, os, sys
class StartedAt(logging.Handler):
    time = None
    def emit(self, record):
        if StartedAt.time is None and "encoding with" in record.getMessage():
            StartedAt.time = time.perf_counter()
logging.getLogger("tokenmix.cache.backend_choice").addHandler(StartedAt())
logging.getLogger("tokenmix.cache.backend_choice").setLevel(logging.INFO)
"""
"""The start of a cold call's code, before ``import tokenmix``: the clock, and ``StartedAt.time`` set when the first
backend choice is logged ("once started" counts from there)."""

_COLD_CALL = COLD_START + """
import tokenmix
results = tokenmix.build_caches(tokenmix.load_data_config(sys.argv[1]), progress=False)
ended = time.perf_counter()
print(json.dumps({"seconds": ended - began, "started_seconds": ended - StartedAt.time, "cpu_seconds": time.process_time(),
                  "tokens": sum(r["tokens"] for r in results.values())}))
"""


def bench_cold_calls(sources: dict[str, list[str]], tokenizer: str, workers: int | None, repeats: int) -> dict:
    """The fastest of ``repeats`` cold calls (``bench_cold_call``), with every run under ``runs``."""
    runs = [bench_cold_call(sources, tokenizer, workers) for _ in range(repeats)]
    return {**min(runs, key=lambda r: r["seconds"]), "runs": runs}


def bench_cold_call(sources: dict[str, list[str]], tokenizer: str, workers: int | None) -> dict:
    """``build_caches`` in a new process, from before ``import tokenmix`` to its return (interpreter start left out), and
    from the first backend choice to its return. Tokenmix's bytecode is compiled first, as ``pip install`` compiles an
    installed package's: else, under ``PYTHONDONTWRITEBYTECODE`` (set on the development VMs) and a checkout whose
    ``__pycache__`` is missing or stale, the process would compile its seventy-odd modules from source, about 0.1 s
    that no installed build pays."""
    import subprocess
    import sys

    import yaml

    import tokenmix

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(tokenmix.__file__)], check=True)

    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-") as tmp:
        config = {
            "tokenizer": tokenizer,
            "cache_dir": os.path.join(tmp, "cache"),
            "configs": {s: {"train_urls": urls} for s, urls in sources.items()},
            "train_weights": {s: 1 + i % 7 for i, s in enumerate(sources)},
            "build": {"tokenizer_backend": "auto", **({"num_workers": workers} if workers is not None else {}), **BUILD_OPTIONS},
        }
        path = os.path.join(tmp, "bench.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        done = subprocess.run([sys.executable, "-c", _COLD_CALL, path], check=True, capture_output=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
