"""Where a cold ``build_caches`` call's time goes beyond limit (b): the same cold call with one cost taken away at a time.

    python scripts/bench_cold_parts.py [--corpus ../shared/corpus] [--tokenizer data/tokenizer] [--rounds 6]
                                       [--only "as shipped"] [--compare before=/path/to/other/src]

The cold whole call is ``bench_build.py``'s: ``build_caches(load_data_config(path))`` in a new process, timed from
before ``import tokenmix`` to its return, tokenmix's bytecode compiled first and the backend check's verdict on the
sample remembered by a build before (as ``bench_build.py``'s cold call has it). Each variant removes one cost that
limit (b) does not pay, in ways a library may not choose for its users, so that what each costs is measured rather
than guessed (each also timed "once started", from the first backend choice logged):

- ``uncompressed``: ``build.compression: none`` (the stored chunks' zstd, which limit (b) does not pay);
- ``openblas 1``: ``OPENBLAS_NUM_THREADS=1`` in the process's environment (numpy's import starts OpenBLAS threads;
  ``import tokenmix`` already keeps them from spinning for 0.1 s of a core each, ``_blas_threads.py``: this variant
  shows what starting none would add);
- ``no gc``: ``gc.disable()`` before ``import tokenmix`` (the collections the imports' allocations trigger);
- ``early load``: the ``fastokens`` tokenizer's load begun before the config is read (it begins once the config names it);
- then these together, without and with ``uncompressed``.

Every round runs each variant once, in turn, and limit (b) (``bench_build.bench_fast_limit``) once, so that the load
of a shared machine hits them alike; the medians and the best of each are printed, as seconds and as ratios to the
best limit (b). ``--compare NAME=SRC`` adds a variant: the same cold call with the tokenmix at ``SRC`` first on
``PYTHONPATH`` (a ``git worktree`` of another commit: before and after a change, in the same rounds); ``--only`` keeps
the variants named. No call inherits this process's ``OPENBLAS_THREAD_TIMEOUT`` (its own ``import tokenmix`` set it):
each call's code decides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import COLD_START, REPO, bench_fast_limit, corpus_sources  # noqa: E402 - the build benchmark's own cold call, limit and corpus

_CALL = COLD_START + """
parts = os.environ.get("TOKENMIX_BENCH_PARTS", "")
if "nogc" in parts:
    import gc
    gc.disable()
import tokenmix
if "early" in parts:
    from tokenmix.formats.backends import preload_fast
    from tokenmix.formats.tokenizer_identity import tokenizer_info
    preload_fast(tokenizer_info(sys.argv[2]).backend_json)
tokenmix.build_caches(tokenmix.load_data_config(sys.argv[1]), progress=False)
ended = time.perf_counter()
print(ended - began, ended - StartedAt.time)
"""

VARIANTS = {
    "as shipped": ((), {}),
    "uncompressed": (("none",), {}),
    "openblas 1": ((), {"OPENBLAS_NUM_THREADS": "1"}),
    "no gc": (("nogc",), {}),
    "early load": (("early",), {}),
    "openblas 1 + no gc + early load": (("nogc", "early"), {"OPENBLAS_NUM_THREADS": "1"}),
    "all four": (("none", "nogc", "early"), {"OPENBLAS_NUM_THREADS": "1"}),
}


def cold_call(config: dict, scratch: str, tokenizer: str, parts: tuple[str, ...], env: dict[str, str]) -> tuple[float, float]:
    """One cold whole call of ``config`` (stored uncompressed where ``parts`` says) in a new process: its seconds, whole
    and once started (from the first backend choice logged, as ``bench_build.py`` counts it)."""
    config = json.loads(json.dumps(config))
    config["cache_dir"] = os.path.join(scratch, "cache")
    if "none" in parts:
        config["build"]["compression"] = "none"
    path = os.path.join(scratch, "bench.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    subprocess.run(["rm", "-rf", config["cache_dir"]], check=True)
    inherited = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    done = subprocess.run([sys.executable, "-c", _CALL, path, tokenizer], check=True, capture_output=True, text=True,
                          env={**inherited, **env, "TOKENMIX_BENCH_PARTS": ",".join(parts)})
    whole, started = done.stdout.strip().splitlines()[-1].split()
    return float(whole), float(started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--tokenizer", default=str(REPO / "data" / "tokenizer"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--only", action="append", default=[], help="a variant to run (repeatable); default: all")
    parser.add_argument("--compare", action="append", default=[], help="NAME=SRC: the cold call with the tokenmix at SRC")
    args = parser.parse_args()
    import tokenmix

    variants = {name: VARIANTS[name] for name in (args.only or VARIANTS)}
    for name, src in (item.split("=", 1) for item in args.compare):
        variants[name] = ((), {"PYTHONPATH": os.path.abspath(src)})
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(src, "tokenmix")], check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(tokenmix.__file__)], check=True)
    sources = corpus_sources(args.corpus)
    files = [f for urls in sources.values() for f in urls]
    config = {"tokenizer": os.path.abspath(args.tokenizer), "configs": {s: {"train_urls": urls} for s, urls in sources.items()},
              "train_weights": {s: 1 + i % 7 for i, s in enumerate(sources)}, "build": {"tokenizer_backend": "auto"}}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {len(files)} shards", flush=True)
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    limits = []
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-") as scratch:
        for parts, env in variants.values():  # each code's verdicts and facts remembered, as bench_build's cold call has them
            cold_call(config, scratch, args.tokenizer, parts, env)
        for _ in range(args.rounds):
            for name, (parts, env) in variants.items():
                seconds[name].append(cold_call(config, scratch, args.tokenizer, parts, env))
            limits.append(bench_fast_limit(files, args.tokenizer)["seconds"])
    limit = min(limits)
    print(f"limit (b): best {limit:.3f} s, median {statistics.median(limits):.3f} s; load {os.getloadavg()[0]:.1f}")
    print("| cold whole call | whole: median, best | best / (b) | once started: median, best | best / (b) |\n|---|---|---|---|---|")
    for name, runs in seconds.items():
        whole, started = [r[0] for r in runs], [r[1] for r in runs]
        print(f"| {name} | {statistics.median(whole):.3f}, {min(whole):.3f} s | {limit / min(whole):.2f}x | "
              f"{statistics.median(started):.3f}, {min(started):.3f} s | {limit / min(started):.2f}x |")


if __name__ == "__main__":
    main()
