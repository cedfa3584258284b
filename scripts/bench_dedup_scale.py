"""Curation at scale (issue 40): Zyda-2's fuzzy dedup plus the Gopher filters on 1x, 10x, 100x of the shared corpus,
with planted near-duplicates whose clusters are known, against datatrove's MinHash dedup on the same data.

    python scripts/bench_dedup_scale.py [--corpus ../shared/corpus] [--scales 1,10,100] [--workers 2]
                                        [--datatrove_python /path/to/venv/bin/python] [--datatrove_scales 1,10]
                                        [--memory_bytes BYTES] [--jaccard_threshold 0.85] [--kill_check SCALE]
                                        [--scratch DIR]

For each scale N, ``tokenmix.curate.planted`` makes the corpus: the train shards of every source, and N - 1 edited
copies of each document (half duplicates at shingle Jaccard 0.9-1.0 with a document of their cluster, half variants
at 0.3-0.6 with their original: new documents), with the truth of its clusters (the originals' own near-duplicates
included, found by an exact all-pairs check). A corpus already under --scratch is used again.

- tokenmix: ``add_id``, ``fuzzy_dedup`` (Zyda-2's settings: character 25-grams, 128 permutations, 8 bands of 16 rows,
  cross-source removal), then the Gopher filters (``bench_curate.GOPHER``: datatrove's repetition and quality rules
  and thresholds), writing every kept document as zstd JSON lines, with --workers processes, each run in a fresh
  interpreter: wall seconds, docs/s per core, the driver's peak RSS and the largest worker's (sampled every 0.1 s), the peak
  and the final disk use of the output directory (shards and work directory; the final one is what stays: the
  output, the dedup's artifacts and statistics), and the clusters found (``clusters*.parquet`` in the work
  directory: document, cluster) against the truth: pairwise precision and recall (``planted.pair_scores``).
  At the datatrove scales a second row runs the same with fuzzy dedup's ``jaccard_check`` at --jaccard_threshold
  (the truth's, 0.85, by default): each candidate pair kept only if its texts' exact shingle Jaccard reaches it, as
  the truth is made (Zyda-2 does not check), so that its precision and recall compare like for like.
- datatrove (--datatrove_python: a venv with ``datatrove[processing]`` and ``spacy``, never a tokenmix dependency),
  at --datatrove_scales: its four MinHash stages, each a ``LocalPipelineExecutor`` with --workers processes:
  signatures (one task per shard), buckets (one task per bucket), clusters (one task, ``save_cluster_id``), filter
  (one task per shard, then its ``GopherRepetitionFilter`` and ``GopherQualityFilter``, then ``JsonlWriter``), with
  ``MinhashConfig(num_buckets=8, hashes_per_bucket=16)`` (Zyda-2's banding; its shingles are its own word 5-grams):
  the same measures, its clusters read from its ``.clusters`` files (task = shard in sorted order, document = row).

--kill_check N: at scale N, after the rows, the pipeline with a cross-source ``exact_dedup`` before the fuzzy dedup
(the dedup bound set so that every step has several tasks) is run uninterrupted, then again to another output,
SIGKILLed (its process group) after the first finished task of each step in turn (text hashes, exact dedup,
signatures, lsh buckets, edges, components, clusters, removal, Gopher filters and output), each run resuming the
last: a line per kill (where it landed, whether the run after it kept every task finished before it), and a verdict:
the output, every dedup decision and every intermediate file byte-identical to the uninterrupted run's.

The goals (issue 40): peak memory within 1.5x from the smallest scale to the largest, time within 1.2x of linear
(seconds per document), and >= 10x datatrove's end-to-end throughput at equal or better precision and recall.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
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

DATATROVE = textwrap.dedent("""
    import json, os, sys, time
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                   MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    inputs, work, workers, shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = MinhashConfig(num_buckets=8, hashes_per_bucket=16)
    def reader():
        return JsonlReader(inputs, glob_pattern="*/*.jsonl.zst", compression="zstd")
    stages = [
        ("signatures", [reader(), MinhashDedupSignature(f"{work}/signatures", config=config)], shards),
        ("buckets", [MinhashDedupBuckets(f"{work}/signatures", f"{work}/buckets", config=config)], config.num_buckets),
        ("clusters", [MinhashDedupCluster(f"{work}/buckets", f"{work}/remove_ids", config=config, save_cluster_id=True)], 1),
        ("filter", [reader(), MinhashDedupFilter(f"{work}/remove_ids"), GopherRepetitionFilter(), GopherQualityFilter(),
                    JsonlWriter(f"{work}/output", output_filename="${rank}.jsonl.zst", compression="zstd")], shards),
    ]
    if __name__ == "__main__":
        seconds = {}
        for name, steps, tasks in stages:
            started = time.perf_counter()
            LocalPipelineExecutor(steps, tasks=tasks, workers=min(workers, tasks), logging_dir=f"{work}/logs/{name}").run()
            seconds[name] = time.perf_counter() - started
        print("RESULT", json.dumps({"seconds": seconds}))
""")
"""datatrove's four MinHash stages and the Gopher filters, run with --datatrove_python (its code is not ours: it is
called, never copied)."""


def _disk(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class _DiskPeak:
    """The largest size of a directory, sampled every ``every`` seconds while the block runs."""

    def __init__(self, path: Path, every: float = 1.0) -> None:
        self.path, self.every, self.peak = path, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, _disk(self.path))

    def __enter__(self) -> _DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _disk(self.path))


def _pipeline(planted: Path, out: Path, workers: int, options: dict):
    """The benchmark's pipeline. ``options``: ``memory_bytes`` (the dedup stages' bound, 0 for their default),
    ``jaccard_threshold`` (0: no candidate check, as Zyda-2; else fuzzy dedup's ``jaccard_check`` at it), ``exact``
    (an ``exact_dedup``, cross-source, before the fuzzy dedup) and ``keep_intermediate``."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_curate import GOPHER

    from tokenmix.curate import AddId, CurationConfig, CurationOutput, CurationSource, DocumentFilter, ExactDedup, FuzzyDedup, ScoreFilter

    bound = {"memory_bytes": options["memory_bytes"]} if options.get("memory_bytes") else {}
    check = {"jaccard_check": True, "jaccard_threshold": options["jaccard_threshold"]} if options.get("jaccard_threshold") else {}
    stages = [AddId(), *([ExactDedup(policy="cross_source", **bound)] if options.get("exact") else []), FuzzyDedup(**bound, **check)]
    stages += [ScoreFilter(DocumentFilter.get_choice_class(name)(**kwargs)) for name, kwargs in GOPHER]
    return CurationConfig(sources=[CurationSource(s, [str(planted / s / "*.jsonl.zst")]) for s in SOURCES], stages=stages,
                          output=CurationOutput(str(out), "jsonl.zst", write_to_filename=True), num_workers=workers,
                          keep_intermediate=bool(options.get("keep_intermediate")))


def _run_tokenmix(planted: str, out: str, workers: int, options: dict) -> None:
    """One tokenmix run, in this fresh interpreter (``tokenmix-run``): prints its measures."""
    import logging

    from tokenmix.curate import run_curation

    logging.basicConfig(level=logging.WARNING)
    config = _pipeline(Path(planted), Path(out), workers, options)
    with _DiskPeak(Path(out)) as disk:
        started = time.perf_counter()
        stats = run_curation(config)
        seconds = time.perf_counter() - started
    print("RESULT", json.dumps({"seconds": seconds, "peak_disk": disk.peak, "kept": stats["output"]["records"]}))


class _RssPeak:
    """The peak RSS of a process (the driver) and of the largest of its descendants (the workers), sampled every
    ``every`` seconds: ``ru_maxrss`` would not do, as a process started by fork and exec keeps the RSS its parent had
    when it forked as its own maximum."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        import psutil

        self.root, self.every, self.driver, self.worker = psutil.Process(pid), every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                self.driver = max(self.driver, self.root.memory_info().rss)
                for child in self.root.children(recursive=True):
                    try:
                        self.worker = max(self.worker, child.memory_info().rss)
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _child(command: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``command``, which prints ``RESULT <json>``: that JSON, with its processes' peak RSS."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rss = _RssPeak(proc.pid)
    stdout, stderr = proc.communicate()
    rss.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed: {stderr[-3000:]}")
    result = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT"))[len("RESULT "):])
    return {**result, "driver_rss": rss.driver, "worker_rss": rss.worker}


def _truth(planted: Path):
    import pyarrow.parquet as pq

    from tokenmix.curate.planted import TRUTH_FILE

    return pq.read_table(planted / TRUTH_FILE, columns=["source", "shard", "row", "cluster"])


def _scores(truth, labels_of: dict[tuple[str, str], object]) -> tuple[float, float, int]:
    """Pairwise precision and recall of found clusters (``labels_of``: per shard, the found cluster of each row, -1
    for none) against the truth, and the number of found clusters."""
    import numpy as np

    from tokenmix.curate.planted import pair_scores

    found = np.full(truth.num_rows, -1, dtype=np.int64)
    source, shard, row = (truth.column(c).to_numpy(zero_copy_only=False) for c in ("source", "shard", "row"))
    keys = np.char.add(np.char.add(source.astype(str), "/"), shard.astype(str))
    for (s, name), labels in labels_of.items():
        mine = keys == f"{s}/{name}"
        found[mine] = labels[row[mine]]
    clusters = len(np.unique(found[found >= 0]))
    alone = found < 0
    found[alone] = found.max(initial=0) + 1 + np.arange(int(alone.sum()))
    precision, recall = pair_scores(truth.column("cluster").to_numpy(), found)
    return precision, recall, clusters


def _tokenmix_clusters(planted: Path, out: Path, workers: int, options: dict) -> dict[tuple[str, str], object]:
    import numpy as np
    import pyarrow.parquet as pq

    from tokenmix.curate.dedup_policy import unpack
    from tokenmix.curate.pipeline_plan import list_shards

    shards = list_shards(_pipeline(planted, out, workers, options))
    files = sorted((out / ".curate").rglob("clusters*.parquet"))
    if not files:
        raise RuntimeError(f"no clusters*.parquet under {out / '.curate'}: where does fuzzy_dedup keep its clusters now?")
    tables = [pq.read_table(f, columns=["doc", "cluster"]) for f in files]
    docs = np.concatenate([t.column("doc").to_numpy() for t in tables])
    cluster = np.concatenate([t.column("cluster").to_numpy() for t in tables])
    tasks, rows = unpack(docs)
    labels = {}
    for ref in shards:
        rows_here = _rows(ref.url)
        mine = np.full(rows_here, -1, dtype=np.int64)
        here = tasks == ref.index
        mine[rows[here]] = cluster[here]
        labels[(ref.source, os.path.basename(ref.url))] = mine
    return labels


def _rows(path: str) -> int:
    """Lines in a zstd JSON-lines shard: its documents (a planted shard has no blank lines)."""
    import zstandard

    lines = 0
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f)
        while chunk := reader.read(1 << 24):
            lines += chunk.count(b"\n")
    return lines


def _datatrove_clusters(planted: Path, work: Path) -> dict[tuple[str, str], object]:
    import numpy as np

    files = sorted(str(Path(p).relative_to(planted)) for p in glob.glob(str(planted / "*" / "*.jsonl.zst")))
    labels = {}
    for rank, name in enumerate(files):
        mine = np.full(_rows(str(planted / name)), -1, dtype=np.int64)
        path = work / "remove_ids" / f"{rank:06d}.clusters"
        if path.exists():
            pairs = np.frombuffer(path.read_bytes(), dtype="<u4").reshape(-1, 2)
            mine[pairs[:, 0]] = pairs[:, 1]
        source, shard = name.split("/", 1)
        labels[(source, shard)] = mine
    return labels


def _plant(corpus: str, scale: int, scratch: Path, workers: int) -> tuple[Path, float | None]:
    from tokenmix.curate.planted import TRUTH_FILE, PlantConfig, plant

    planted = scratch / f"planted-{scale}x"
    if (planted / TRUTH_FILE).exists():
        return planted, None
    shutil.rmtree(planted, ignore_errors=True)
    sources = {s: sorted(glob.glob(os.path.join(corpus, s, "train-*.jsonl.zst"))) for s in SOURCES}
    started = time.perf_counter()
    plant(sources, str(planted), PlantConfig(copies=scale, workers=workers))
    return planted, time.perf_counter() - started


KILL_STEPS = (("add_id and text hashes", "pass-0/stats"), ("exact dedup", "pass-0/dedup/stats"), ("signatures", "pass-1/stats"),
              ("lsh buckets", "pass-1/fuzzy/lsh/stats"), ("edges", "pass-1/fuzzy/edges/stats"), ("components", "pass-1/fuzzy/components"),
              ("clusters", "pass-1/fuzzy/clusters/stats"), ("removal", "pass-1/fuzzy/removed/stats"),
              ("Gopher filters and output", "pass-2/stats"))
"""The kill check's steps, in the order they run, and where each records its finished tasks in the run's work
directory (the pipeline with an ``exact_dedup`` before the fuzzy dedup: pass 0 hashes, pass 1 signs, pass 2 filters)."""
KILL_RANGES = 8
"""The kill check's dedup bound is set so that a range of document ids holds 1/8 of the corpus: every step then has
several tasks (8 ranges, about 40 bucket partitions, about 7 exact-dedup passes), so a kill after a step's first
finished task lands inside it."""


def _kill_check(planted: Path, work: Path, workers: int, docs: int, env: dict[str, str]) -> str:
    """The pipeline with an exact dedup added, run once uninterrupted, then again to another output, SIGKILLed (driver
    and workers) after the first finished task of each step in turn, each run resuming the last: prints a line per
    kill (where it landed, whether the run after it kept every task finished before it); returns the verdict (the
    output and every dedup decision and intermediate file byte-identical to the uninterrupted run's)."""
    import yaml

    from tokenmix.curate.components import BYTES_PER_NODE
    from tokenmix.curate.fuzzy_dedup import BYTES_PER_PAIR
    from tokenmix.curate.pipeline import describe

    sys.path.insert(0, str(REPO / "tests"))
    from curate_kill import curate_until, finished_tasks, run_files

    memory = -(-docs // KILL_RANGES) * (BYTES_PER_NODE + BYTES_PER_PAIR * len(SOURCES))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config_path = work / "pipeline.yaml"
    options = {"memory_bytes": memory, "exact": True, "keep_intermediate": True}
    config_path.write_text(yaml.safe_dump(describe(_pipeline(planted, work / "unused", workers, options))))
    started = time.perf_counter()
    reference, out = work / "reference", work / "killed"
    done = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(config_path), "--output.path",
                           str(reference)], cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the kill check's uninterrupted run failed: {done.stderr[-3000:]}")
    print(f"kill check: exact_dedup + fuzzy_dedup at memory_bytes {memory:,}, uninterrupted in {time.perf_counter() - started:.1f} s", flush=True)
    totals = {step: len(finished_tasks(reference, [d])) for step, d in KILL_STEPS}
    os.environ.update(env)  # the killed runs (curate_until) start from this process's environment

    def records() -> dict[Path, tuple[int, int]]:
        """Each finished task's record, with its inode and time: a task run again writes a new one."""
        found = {}
        for path in finished_tasks(out, [d for _, d in KILL_STEPS]):
            st = os.stat(path)
            found[path] = (st.st_ino, st.st_mtime_ns)
        return found

    inside, kept_all, pending = True, True, None
    for step, d in KILL_STEPS:
        before = len(finished_tasks(out, [d]))
        run_started = time.perf_counter()
        ended = curate_until(config_path, out, lambda d=d, before=before: len(finished_tasks(out, [d])) > before, f"a finished task of {step}",
                             limit_s=3600)
        after = records()
        if pending is not None:
            kept_all &= _report_kill(*pending, after)
        landed = len(finished_tasks(out, [d]))
        inside &= not ended and landed < totals[step]
        pending = (step, landed, totals[step], time.perf_counter() - run_started, ended, after)
    done = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(config_path), "--output.path", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the kill check's last resume failed: {done.stderr[-3000:]}")
    if pending is not None:
        kept_all &= _report_kill(*pending, records())
    suffixes = (".jsonl.zst", ".parquet")
    mine, theirs = run_files(out, suffixes), run_files(reference, suffixes)
    differ = sorted(p for p in mine.keys() | theirs.keys() if mine.get(p) != theirs.get(p))
    partial = [f for _, _, files in os.walk(out) for f in files if f.endswith(".partial")]
    ok = inside and kept_all and not differ and not partial
    verdict = (f"kill check at {docs:,} documents: {'PASS' if ok else 'FAIL'}: {len(KILL_STEPS)} kills, "
               f"{'each inside its step' if inside else 'NOT every one inside its step'}; "
               f"{'every resume kept the tasks finished before its kill' if kept_all else 'a resume ran finished tasks again'}; "
               f"{len(theirs)} output and decision files {'byte-identical' if not differ else f'differ: {differ[:5]}'} to the "
               f"uninterrupted run's{f'; left {len(partial)} .partial files' if partial else ''} "
               f"({time.perf_counter() - started:.0f} s in all)")
    shutil.rmtree(work, ignore_errors=True)
    return verdict


def _report_kill(step: str, landed: int, total: int, seconds: float, ended: bool, at_kill: dict, later: dict) -> bool:
    """Print one kill's line, now that the run after it has run: whether that run kept every task finished before it."""
    redone = [p for p, stamp in at_kill.items() if later.get(p) != stamp]
    when = "the run ended before the kill" if ended else f"after {landed} of {total} tasks of the step, {seconds:.1f} s into its run"
    print(f"kill in {step}: {when}; resumed {'ok' if not redone else 'NOT ok'}: "
          f"{len(at_kill) - len(redone)} of {len(at_kill)} finished tasks kept{f', {len(redone)} run again' if redone else ''}", flush=True)
    return not redone


def main() -> None:
    from tokenmix.curate.planted import PlantConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--scales", default="1,10,100")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--datatrove_python", default=None)
    parser.add_argument("--datatrove_scales", default="1,10")
    parser.add_argument("--memory_bytes", type=int, default=0, help="fuzzy_dedup's memory_bytes (0: the stage's default)")
    parser.add_argument("--jaccard_threshold", type=float, default=PlantConfig().threshold,
                        help="at the datatrove scales, a second tokenmix row with fuzzy_dedup's jaccard_check at this threshold "
                             "(default: the truth's; 0: no such row)")
    parser.add_argument("--kill_check", type=int, default=0, help="at this scale, the kill check (0: none)")
    parser.add_argument("--scratch", default=None, help="where planted corpora are made and kept (default: a temporary directory)")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    scales = [int(s) for s in args.scales.split(",")]
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bench-dedup-scale-"))
    scratch.mkdir(parents=True, exist_ok=True)
    machine = platform.processor() or platform.machine()
    print(f"{machine}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {args.workers} workers")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    rows: list[tuple] = []
    verdicts: list[str] = []
    for scale in scales:
        planted, plant_seconds = _plant(args.corpus, scale, scratch, args.workers)
        truth = _truth(planted)
        docs, text_bytes = truth.num_rows, _disk(planted)
        print(f"{scale}x: {docs:,} documents, {text_bytes / 1e6:,.0f} MB of zstd shards"
              + (f", planted in {plant_seconds:.0f} s" if plant_seconds is not None else " (planted before)"))
        at_datatrove_scale = scale in {int(s) for s in args.datatrove_scales.split(",")}
        checks = [0.0] + ([args.jaccard_threshold] if args.jaccard_threshold and at_datatrove_scale else [])
        for threshold in checks:
            options = {"memory_bytes": args.memory_bytes, "jaccard_threshold": threshold}
            out = scratch / f"tokenmix-{scale}x"
            shutil.rmtree(out, ignore_errors=True)
            measured = _child([sys.executable, __file__, "tokenmix-run", str(planted), str(out), str(args.workers), json.dumps(options)], env)
            precision, recall, clusters = _scores(truth, _tokenmix_clusters(planted, out, args.workers, options))
            who = f"tokenmix, Jaccard check >= {threshold}" if threshold else "tokenmix"
            rows.append((who, scale, docs, measured, _disk(out), precision, recall, clusters))
            _print_row(rows[-1], args.workers)
            shutil.rmtree(out, ignore_errors=True)
        if args.datatrove_python and at_datatrove_scale:
            work = scratch / f"datatrove-{scale}x"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            (work / "run.py").write_text(DATATROVE)
            shards = len(glob.glob(str(planted / "*" / "*.jsonl.zst")))
            with _DiskPeak(work) as disk:
                started = time.perf_counter()
                measured = _child([args.datatrove_python, str(work / "run.py"), str(planted), str(work), str(args.workers), str(shards)])
                measured["seconds_total"] = time.perf_counter() - started
            measured["peak_disk"] = disk.peak
            precision, recall, clusters = _scores(truth, _datatrove_clusters(planted, work))
            rows.append(("datatrove", scale, docs, measured, _disk(work), precision, recall, clusters))
            _print_row(rows[-1], args.workers)
            shutil.rmtree(work, ignore_errors=True)
        if scale == args.kill_check:
            verdicts.append(_kill_check(planted, scratch / f"kill-{scale}x", args.workers, docs, env))
    _summary(rows, args.workers)
    for verdict in verdicts:
        print(verdict)


def _seconds(measured: dict) -> float:
    return measured.get("seconds_total", measured["seconds"]) if isinstance(measured["seconds"], dict) else measured["seconds"]


def _print_row(row: tuple, workers: int) -> None:
    who, scale, docs, m, final_disk, precision, recall, clusters = row
    seconds = _seconds(m)
    stages = f" ({', '.join(f'{k} {v:.0f} s' for k, v in m['seconds'].items())})" if isinstance(m["seconds"], dict) else ""
    print(f"| {who} | {scale}x | {docs:,} | {seconds:,.1f}{stages} | {docs / seconds / workers:,.0f} | {m['driver_rss'] / 2**20:,.0f} MiB | "
          f"{m['worker_rss'] / 2**20:,.0f} MiB | {m['peak_disk'] / 1e6:,.0f} MB | {final_disk / 1e6:,.0f} MB | {clusters:,} | "
          f"{precision:.4f} | {recall:.4f} |", flush=True)


def _summary(rows: list[tuple], workers: int) -> None:
    print("\n| stack | scale | documents | seconds | docs/s per core | driver peak RSS | largest worker peak RSS | peak disk | disk after | "
          "clusters found | pair precision | pair recall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        _print_row(row, workers)
    ours = [r for r in rows if r[0] == "tokenmix"]
    if len(ours) > 1:
        first, last = ours[0], ours[-1]
        memory = max(last[3]["driver_rss"], last[3]["worker_rss"]) / max(first[3]["driver_rss"], first[3]["worker_rss"])
        linear = (_seconds(last[3]) / last[2]) / (_seconds(first[3]) / first[2])
        print(f"\ntokenmix {first[1]}x -> {last[1]}x: largest process {memory:.2f}x (goal <= 1.5x); seconds per document "
              f"{linear:.2f}x (goal <= 1.2x)")
    for theirs in (r for r in rows if r[0] == "datatrove"):
        for mine in (r for r in rows if r[0].startswith("tokenmix") and r[1] == theirs[1]):
            print(f"{theirs[1]}x: {mine[0]}: {_seconds(theirs[3]) / _seconds(mine[3]):.1f}x datatrove's throughput (goal >= 10x); "
                  f"precision {mine[5]:.4f} vs {theirs[5]:.4f}, recall {mine[6]:.4f} vs {theirs[6]:.4f}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    if len(sys.argv) > 1 and sys.argv[1] == "tokenmix-run":
        _run_tokenmix(sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5]))
    else:
        main()
