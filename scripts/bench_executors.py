"""Cache-build throughput through the Ray and Dask executors, as a ratio to the local executor, and per-task overhead.

    python scripts/bench_executors.py [--corpus ../shared/corpus] [--tokenizer data/tokenizer] [--repeats 3] [--tasks 500]

1. Builds the train caches of every source under --corpus through ``local``, ``ray`` and ``dask``
   on this machine (one worker per core; Ray and Dask start their own local cluster), alternating
   executors --repeats times, one engine alive at a time; the best build of each counts and is
   compared with the best local build. Each engine is started, warmed up on one shard (workers
   import and load the tokenizer), then timed on the whole corpus, so engine start-up is timed
   apart (a real build pays it once). Every cache is checked to hold the first local build's bytes.
2. Per-task overhead: --tasks trivial tasks through each cluster executor's ``submit`` and
   ``finished`` (all submitted at once: throughput; one after another: round-trip latency), and the
   same through a spawn ``concurrent.futures`` process pool (what the local executor is built on).
3. The driver's side of a cluster build: staged shards appended to a cache on one core (read the
   staged chunks back, decompress, write at their offsets, await), in tokens/s: how many tokenizing
   workers one driver keeps up with.
4. Peak RSS of each cluster worker process after the builds.
5. Each cluster build's per-worker rates as the builder logs them (tokens/s of each worker while its tasks ran).

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import logging
import os
import platform
import resource
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _noop(x: int) -> int:
    return x


def _peak_rss_mib(_: int) -> tuple[int, float]:
    return os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for path in glob.glob(os.path.join(root, "**", "*"), recursive=True):
        if os.path.isfile(path) and not path.endswith("stats.json"):
            out[os.path.relpath(path, root)] = Path(path).read_bytes()
    return out


def build_once(config, executor, cache_dir: str) -> tuple[float, int]:
    """Seconds to build every train cache of ``config`` into ``cache_dir`` with an already started executor, and tokens."""
    from tokenmix.cache import CacheBuilder
    from tokenmix.config import cache_targets

    config = dataclasses.replace(config, cache_dir=cache_dir)
    started = time.perf_counter()
    tokens = 0
    for target in cache_targets(config):
        stats = CacheBuilder(target.location, target.shards, target.spec, target.identity, config.build, None, {}, executor).build()
        tokens += stats["tokens"]
    return time.perf_counter() - started, tokens


def task_overhead(executor, n: int) -> tuple[float, float]:
    """Microseconds per trivial task: all ``n`` submitted at once, then one at a time (round trip)."""
    def drain(futures):
        while futures:
            done = executor.finished(futures, 1.0)
            for f in done:
                f.result()
            futures = [f for f in futures if f not in done]

    drain([executor.submit(_noop, i) for i in range(20)])  # warm the workers
    started = time.perf_counter()
    drain([executor.submit(_noop, i) for i in range(n)])
    batch = (time.perf_counter() - started) / n
    rounds = max(20, n // 10)
    started = time.perf_counter()
    for i in range(rounds):
        drain([executor.submit(_noop, i)])
    return batch * 1e6, (time.perf_counter() - started) / rounds * 1e6


def pool_overhead(n: int) -> tuple[float, float]:
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=get_context("spawn")) as pool:
        list(pool.map(_noop, range(20)))
        started = time.perf_counter()
        for f in [pool.submit(_noop, i) for i in range(n)]:
            f.result()
        batch = (time.perf_counter() - started) / n
        rounds = max(20, n // 10)
        started = time.perf_counter()
        for i in range(rounds):
            pool.submit(_noop, i).result()
        return batch * 1e6, (time.perf_counter() - started) / rounds * 1e6


def driver_append_rate(config, scratch: str) -> float:
    """Tokens/s at which the driver appends staged shards (read back, decompress, write, await), on one core."""
    from tokenmix.cache.shard_task import ShardJob, run_shard, staged_chunks
    from tokenmix.cache.store import TOKENS_ARRAY, JaggedArray
    from tokenmix.config import cache_targets

    target = max(cache_targets(config), key=lambda t: sum(s.size_bytes() or 0 for s in t.shards))
    results = [run_shard(ShardJob(i, s, 0, scratch, f"a{i}", "bench", 1 << 20, False), target.spec) for i, s in enumerate(target.shards)]
    array = JaggedArray.open(os.path.join(scratch, "appended"), TOKENS_ARRAY, target.spec.dtype, create=True)
    rows = tokens = 0
    started = time.perf_counter()
    writes = []
    for result in results:
        for chunk in staged_chunks(result, scratch):
            writes.extend(array.write_rows(rows, tokens, chunk.tokens, chunk.lengths))
            rows += len(chunk.lengths)
            tokens += len(chunk.tokens)
    for w in writes:
        w.result()
    array.publish(rows)
    return tokens / (time.perf_counter() - started)


class _WorkerRates(logging.Handler):
    """Keeps the builder's per-worker rate lines (``tokenmix.cache.progress``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "while busy" in record.getMessage():
            self.lines.append(record.getMessage())


def main() -> None:
    rates = _WorkerRates()
    progress_logger = logging.getLogger("tokenmix.cache.progress")
    progress_logger.addHandler(rates)
    progress_logger.setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(REPO / "data" / "tokenizer"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=500, help="trivial tasks for the per-task overhead")
    args = parser.parse_args()

    from tokenmix import BuildOptions, DaskExecutorConfig, LMDatasetSourceConfig, LMMixtureDatasetConfig, LocalExecutorConfig, RayExecutorConfig
    from tokenmix.cache.encoding import open_build_executor

    sources = sorted(d for d in os.listdir(args.corpus) if os.path.isdir(os.path.join(args.corpus, d)))
    config = LMMixtureDatasetConfig(
        tokenizer=args.tokenizer, cache_dir="unused",
        configs={s: LMDatasetSourceConfig(train_urls=sorted(glob.glob(os.path.join(args.corpus, s, "train-*")))) for s in sources},
        build=BuildOptions(),
    )
    engines = {"local": LocalExecutorConfig(), "ray": RayExecutorConfig(), "dask": DaskExecutorConfig()}
    warm_up = dataclasses.replace(config, configs={sources[0]: LMDatasetSourceConfig(train_urls=config.configs[sources[0]].train_urls[:1])})
    scratch = tempfile.mkdtemp(prefix="tokenmix-bench-executors-")
    startup: dict[str, list[float]] = {name: [] for name in engines}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    overhead, rss = {}, {}
    reference = None
    tokens = 0
    try:
        for repeat in range(args.repeats):
            for name, engine in engines.items():  # one engine alive at a time: idle engines cost CPU on a small machine
                started = time.perf_counter()
                with open_build_executor(BuildOptions(executor=engine)) as executor:
                    startup[name].append(time.perf_counter() - started)
                    build_once(warm_up, executor, os.path.join(scratch, "warm-up"))  # workers import and load the tokenizer
                    shutil.rmtree(os.path.join(scratch, "warm-up"))
                    cache_dir = os.path.join(scratch, f"{name}-{repeat}")
                    took, tokens = build_once(config, executor, cache_dir)
                    seconds[name].append(took)
                    files = _files(cache_dir)
                    reference = files if reference is None else reference
                    assert files == reference, f"{name} built different bytes"
                    shutil.rmtree(cache_dir)
                    print(f"repeat {repeat}: {name:5s} {took:6.2f} s  {tokens / took / 1e6:.3f} M tokens/s", flush=True)
                    if repeat == args.repeats - 1 and name != "local":
                        overhead[name] = task_overhead(executor, args.tasks)
                        rss[name] = sorted({pid: mib for pid, mib in (executor.submit(_peak_rss_mib, i).result() for i in range(8))}.values())
        overhead["process pool"] = pool_overhead(args.tasks)
        append = driver_append_rate(config, os.path.join(scratch, "staging"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    best = {name: min(s) for name, s in seconds.items()}
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; corpus {args.corpus}: "
          f"{tokens / 1e6:.1f} M tokens in {sum(len(c.train_urls) for c in config.configs.values())} shards")
    print(f"| executor | engine start-up | build (best of {args.repeats}) | tokens/s | ratio to local |")
    print("|---|---|---|---|---|")
    for name in engines:
        print(f"| {name} | {min(startup[name]):.1f} s | {best[name]:.2f} s ({', '.join(f'{s:.2f}' for s in seconds[name])}) | "
              f"{tokens / best[name] / 1e6:.3f} M | **{best['local'] / best[name]:.2f}x** |")
    print("\n| engine | per task, submitted together | per task, one round trip |")
    print("|---|---|---|")
    for name, (batch, latency) in overhead.items():
        print(f"| {name} | {batch:,.0f} us | {latency:,.0f} us |")
    print(f"\ndriver append of staged shards (one core): {append / 1e6:.1f} M tokens/s")
    for name, values in rss.items():
        print(f"{name} worker peak RSS: " + ", ".join(f"{v:.0f} MiB" for v in values))
    print("\nper-worker rates logged by the cluster builds (the last repeat's):")
    for line in rates.lines[-2 * len(sources):]:
        print("  " + line)


if __name__ == "__main__":
    main()
