"""Fuzzy dedup: MinHash signatures against datasketch, rensa and datatrove on the same documents, then the whole
recipe end to end on the shared corpus with planted near-duplicates, with 1 and 2 workers.

    python scripts/bench_dedup.py [--corpus ../shared/corpus] [--peers_python /path/to/venv/bin/python] [--repeats 3]

1. Signatures, one core (the process pinned to it), the corpus' train documents (7,691 documents, 51 M characters), 128 permutations:
   tokenmix (character 25-grams, the exact universal hash family (a*x + b) mod (2^61 - 1)), with numba (the default)
   and with JAX (start-up and compilation excluded, as they are paid once per worker); datasketch ``MinHash``
   and rensa ``RMinHash`` fed the same character 25-grams; datatrove's ``MinhashDedupSignature.get_signature`` with
   8 buckets x 16 hashes on its own word 5-grams. Peers run in --peers_python (a venv with ``datasketch``, ``rensa``
   and ``datatrove[processing]``; none of them is a tokenmix dependency). Best of --repeats.
2. End to end: the corpus plus planted copies (every 20th document copied into another source with one character in
   a thousand changed, which leaves about 95% of its 25-gram shingles), written as shards; ``tokenmix curate`` with
   ``add_id`` and ``fuzzy_dedup`` (Zyda-2's defaults, cross-source removal) with 1 and 2 workers: seconds, peak memory
   (driver and workers together), the planted copies removed, and what else was found.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("linux_doc", "python_doc", "webster")

PEERS = textwrap.dedent("""
    import json, sys, time
    texts = json.load(open(sys.argv[1]))
    repeats = int(sys.argv[2])
    n = 25
    def best(fn):
        return min(fn() for _ in range(repeats))
    def datasketch_run():
        from datasketch import MinHash
        started = time.perf_counter()
        for text in texts:
            m = MinHash(num_perm=128, seed=1)
            m.update_batch([text[i:i + n].encode() for i in range(max(1, len(text) - n + 1))])
        return time.perf_counter() - started
    def rensa_run():
        from rensa import RMinHash
        started = time.perf_counter()
        for text in texts:
            m = RMinHash(num_perm=128, seed=42)
            m.update([text[i:i + n] for i in range(max(1, len(text) - n + 1))])
            m.digest()
        return time.perf_counter() - started
    def datatrove_run():
        from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
        stage = MinhashDedupSignature("/tmp/unused-datatrove-sigs", config=MinhashConfig(num_buckets=8, hashes_per_bucket=16))
        started = time.perf_counter()
        for text in texts:
            shingles = stage.get_shingles(text)
            if len(shingles):
                stage.get_signature(shingles)
        return time.perf_counter() - started
    print(json.dumps({"datasketch": best(datasketch_run), "rensa": best(rensa_run), "datatrove": best(datatrove_run)}))
""")


def _texts(corpus: str) -> dict[str, list[dict]]:
    import orjson
    import zstandard

    out = {}
    for source in SOURCES:
        out[source] = []
        for path in sorted(glob.glob(os.path.join(corpus, source, "train-*.jsonl.zst"))):
            with open(path, "rb") as f:
                raw = zstandard.ZstdDecompressor().stream_reader(f).read()
            out[source] += [orjson.loads(line) for line in raw.splitlines() if line.strip()]
    return out


def _signatures(texts: list[str], repeats: int, backend: str) -> float:
    import pyarrow as pa

    from tokenmix.curate.minhash import MinHashConfig, signatures

    config = MinHashConfig()
    batch = 256
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            signatures(pa.array(texts[i:i + batch]), config, backend=backend)
        best = min(best, time.perf_counter() - started)
    return best


def _planted(records: dict[str, list[dict]], root: Path) -> tuple[list[str], int]:
    """The corpus with planted near-copies, as one shard per source; returns the planted copies' texts."""
    rng = random.Random(0)
    planted = []
    out = {s: [r["text"] for r in records[s]] for s in SOURCES}
    for k, source in enumerate(SOURCES):
        for i, record in enumerate(records[source]):
            if i % 20 == 0 and len(record["text"]) > 200:
                target = SOURCES[(k + 1 + i // 20 % 2) % 3]
                chars = list(record["text"])
                for _ in range(max(1, len(chars) // 1000)):
                    at = rng.randrange(len(chars))
                    chars[at] = "#"
                copy = "".join(chars)
                out[target].append(copy)
                planted.append((target, copy, SOURCES.index(target) > k))
    for source, texts in out.items():
        (root / source).mkdir(parents=True)
        with open(root / source / "all.jsonl", "w") as f:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
    removable = sum(1 for _, _, lower in planted if lower)
    return planted, removable


def _peak_rss(stop: threading.Event, out: dict[str, int]) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        try:
            out["peak"] = max(out.get("peak", 0), me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True)))
        except psutil.Error:
            pass
        time.sleep(0.05)


def _end_to_end(root: Path, out: Path, workers: int) -> tuple[float, int, dict]:
    from tokenmix.curate import AddId, CurationConfig, CurationOutput, CurationSource, FuzzyDedup, run_curation

    config = CurationConfig(sources=[CurationSource(s, [str(root / s / "all.jsonl")]) for s in SOURCES], stages=[AddId(), FuzzyDedup()],
                            output=CurationOutput(str(out), "jsonl", write_to_filename=True), num_workers=workers)
    stop, peak = threading.Event(), {}
    sampler = threading.Thread(target=_peak_rss, args=(stop, peak), daemon=True)
    sampler.start()
    started = time.perf_counter()
    stats = run_curation(config)
    seconds = time.perf_counter() - started
    stop.set()
    sampler.join()
    return seconds, peak.get("peak", 0), stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--peers_python", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    records = _texts(args.corpus)
    texts = [r["text"] for s in SOURCES for r in records[s]]
    chars = sum(map(len, texts))
    print(f"{len(texts):,} documents, {chars / 1e6:.1f} M characters; {os.cpu_count()} cores")
    scratch = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # signatures on one core: this process, its threads (XLA's) and the peers' process
    try:
        for backend in ("numba", "jax"):
            _signatures(texts[:50], 1, backend)  # loading numba's cached kernels; JAX's start-up and compilation
        ours = _signatures(texts, args.repeats, "numba")
        rows = [("tokenmix, numba (char 25-grams, exact (a*x+b) mod 2^61-1)", ours),
                ("tokenmix, jax (the same bits)", _signatures(texts, args.repeats, "jax"))]
        if args.peers_python:
            (scratch / "texts.json").write_text(json.dumps(texts))
            (scratch / "peers.py").write_text(PEERS)
            proc = subprocess.run([args.peers_python, str(scratch / "peers.py"), str(scratch / "texts.json"), str(args.repeats)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:])
            peers = json.loads(proc.stdout.strip().splitlines()[-1])
            rows += [("datasketch MinHash (same char 25-grams)", peers["datasketch"]), ("rensa RMinHash (same char 25-grams)", peers["rensa"]),
                     ("datatrove MinhashDedupSignature (word 5-grams, 8x16)", peers["datatrove"])]
        print("\n| signatures, 1 core, 128 permutations | seconds | docs/s | M chars/s | tokenmix is |")
        print("|---|---|---|---|---|")
        for name, seconds in rows:
            print(f"| {name} | {seconds:.2f} | {len(texts) / seconds:,.0f} | {chars / seconds / 1e6:.2f} | {seconds / ours:.2f}x as fast |")

        os.sched_setaffinity(0, cores)
        planted, removable = _planted(records, scratch / "planted")
        print(f"\nend to end: {len(texts) + len(planted):,} documents, {len(planted)} planted near-copies "
              f"({removable} in a lower-ranked source than their original, which cross-source removal must remove)")
        print("| workers | seconds | docs/s per core | peak memory | clusters | removed | planted copies removed |")
        print("|---|---|---|---|---|---|---|")
        for workers in (1, 2):
            out = scratch / f"out-{workers}"
            seconds, peak, stats = _end_to_end(scratch / "planted", out, workers)
            kept = set()
            for source in SOURCES:
                with open(out / source / "all.jsonl") as f:
                    kept |= {(source, json.loads(line)["text"]) for line in f}
            caught = sum(1 for target, copy, lower in planted if lower and (target, copy) not in kept)
            decision = stats["stages"][1]["fuzzy_dedup"]
            docs = len(texts) + len(planted)
            print(f"| {workers} | {seconds:.1f} | {docs / seconds / workers:,.0f} | {peak / 2**20:,.0f} MiB | {decision['clusters']:,} | "
                  f"{sum(decision['removed_by_source'].values()):,} | {caught} of {removable} |")
            shutil.rmtree(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    main()
