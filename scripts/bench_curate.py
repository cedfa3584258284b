"""Curation throughput: read + Gopher filters + write against a bare read + write of the same shards, and against
datatrove running the same filters, all in one run.

    python scripts/bench_curate.py [--corpus ../shared/corpus] [--workers N] [--repeats 3] [--copies 1]
                                   [--marginal] [--pipelines bare,heuristics,scored,gopher] [--compare LABEL=SRC ...]
                                   [--datatrove_python /path/to/venv/bin/python]

Five pipelines over the train shards of every source under --corpus, each writing every input shard back out as
zstd JSON lines, with --workers processes:

- tokenmix bare: read, parse, write (``tokenmix curate`` with no stages);
- tokenmix heuristics: the same with every heuristic filter NeMo Curator ships but the n-gram ones (19
  ``score_filter`` stages, NeMo's default thresholds, each score written to a field);
- tokenmix scored: the same 19 scores written by ``score`` stages, which remove nothing, so that every
  document is written as in the bare run (plus its 19 scores);
- tokenmix gopher: the same with the Gopher quality and repetition heuristics (20 ``score_filter`` stages with
  datatrove's default thresholds: word count, mean word length, symbol ratio, bullets, ellipsis, alphabetic words,
  stop words; duplicate lines and paragraphs by count and by characters; top 2/3/4-grams; duplicate 5..10-grams);
- datatrove bare and datatrove gopher (``JsonlReader`` -> [``GopherRepetitionFilter``, ``GopherQualityFilter``] ->
  ``JsonlWriter``, ``LocalPipelineExecutor`` with one task per shard), when --datatrove_python names a Python that
  has ``datatrove[processing]`` and ``spacy`` (its English word splitter needs no download).

The pipelines alternate, --repeats times, and the best time of each is kept, and the best CPU time (the driver's run
and its workers', start-up included; on a machine that others share it moves less than the time does). Docs/s per
core is documents read / seconds / workers. The goals: filtering at >= 0.8x of tokenmix bare, and faster than
datatrove on the same filters.

--compare LABEL=SRC (repeatable) names the ``src`` folder of another tree of tokenmix (``git worktree add /tmp/before
<commit>``, or a copy with a change in it): its pipelines run too, labelled, alternating with this checkout's, so
that a change is measured against what it replaced in the same run. Ratios are to this checkout's bare run; each
tree's own bare run shows how far two runs of the same code differ. Before the pipelines, the start-up a worker
process pays for the heuristic filters is measured in each tree: a fresh interpreter imports them and scores a first
text, best of five, and once more with an empty numba cache (what a first run after installing pays, where kernels
are compiled on first use).
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HEURISTICS = [
    ("word_count", {}), ("mean_word_length", {}), ("non_alpha_numeric", {}), ("symbols_to_words", {}), ("numbers", {}), ("urls", {}),
    ("bullets", {}), ("white_space", {}), ("parentheses", {}), ("long_word", {}), ("boilerplate_string", {}), ("repeated_lines", {}),
    ("repeated_paragraphs", {}), ("repeated_lines_by_char", {}), ("repeated_paragraphs_by_char", {}), ("punctuation", {}),
    ("ellipsis", {}), ("common_english_words", {}), ("words_without_alphabets", {}),
]
"""Every heuristic NeMo Curator ships but the n-gram ones, with its default thresholds."""

GOPHER = [
    ("repeated_lines", {"max_repeated_line_fraction": 0.7}),
    ("repeated_paragraphs", {"max_repeated_paragraphs_ratio": 0.7}),
    ("repeated_lines_by_char", {"max_repeated_lines_char_ratio": 0.8}),
    ("repeated_paragraphs_by_char", {"max_repeated_paragraphs_char_ratio": 0.8}),
    *[("repeating_top_ngrams", {"n": n, "max_repeating_ngram_ratio": r}) for n, r in ((2, 0.2), (3, 0.18), (4, 0.16))],
    *[("repeating_duplicate_ngrams", {"n": n, "max_repeating_duplicate_ngram_ratio": r})
      for n, r in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))],
    ("word_count", {"min_words": 50, "max_words": 100000}),
    ("mean_word_length", {"min_mean_word_length": 3, "max_mean_word_length": 10}),
    ("symbols_to_words", {"max_symbol_to_word_ratio": 0.1}),
    ("bullets", {"max_bullet_lines_ratio": 0.9}),
    ("ellipsis", {"max_num_lines_ending_with_ellipsis_ratio": 0.3}),
    ("words_without_alphabets", {"min_words_with_alphabets": 0.8}),
    ("common_english_words", {"min_num_common_words": 2}),
]
"""datatrove's GopherRepetitionFilter then GopherQualityFilter, with its default thresholds: its ``dup_line_frac`` 0.3
(at most 30% of lines duplicated) is NeMo's ``max_repeated_line_fraction`` 0.7 (at least 70% distinct), and so on; its
``max_non_alpha_words_ratio`` 0.8 keeps a document when at least 80% of its words have a letter."""

DATATROVE = textwrap.dedent("""
    import sys, time
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    inputs, out, logs, workers, kind, tasks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    steps = [JsonlReader(inputs, glob_pattern="*/*.jsonl.zst", compression="zstd")]
    if kind == "gopher":
        steps += [GopherRepetitionFilter(), GopherQualityFilter()]
    steps.append(JsonlWriter(out, output_filename="${rank}.jsonl.zst", compression="zstd"))
    if __name__ == "__main__":
        started = time.perf_counter()
        LocalPipelineExecutor(steps, tasks=tasks, workers=workers, logging_dir=logs).run()
        print("SECONDS", time.perf_counter() - started)
""")


def _inputs(corpus: str, copies: int, root: Path) -> tuple[list[str], int, int]:
    """The train shards, each linked ``copies`` times into ``root/<source>/``; returns sources, shards and documents."""
    import orjson
    import zstandard

    sources = sorted(d for d in os.listdir(corpus) if glob.glob(os.path.join(corpus, d, "train-*.jsonl.zst")))
    shards = docs = 0
    for source in sources:
        (root / source).mkdir(parents=True)
        for path in sorted(glob.glob(os.path.join(corpus, source, "train-*.jsonl.zst"))):
            with open(path, "rb") as f:
                n = sum(1 for line in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines() if line.strip() and orjson.loads(line))
            for c in range(copies):
                os.symlink(os.path.abspath(path), root / source / f"c{c}-{os.path.basename(path)}")
                shards += 1
                docs += n
    return sources, shards, docs


PIPELINES = {"bare": [], "heuristics": HEURISTICS, "scored": HEURISTICS, "gopher": GOPHER}
"""tokenmix's pipelines by short name; ``scored`` writes the heuristics' scores and removes nothing."""

STARTUP = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    started, cpu = time.perf_counter(), time.process_time()
    import pyarrow as pa
    from tokenmix.curate import WordCountFilter, RepeatedLinesFilter
    WordCountFilter().score(pa.array(["a first text\\nof two lines"]))
    RepeatedLinesFilter().score(pa.array(["a first text\\nof two lines"]))
    print("STARTUP", time.process_time() - cpu, time.perf_counter() - started)
""")
"""A worker's start-up for the heuristic filters: importing them and scoring a first text."""

TOKENMIX_FROM = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(1, sys.argv[2])
    import bench_curate
    args = json.loads(sys.argv[3])
    def cpu(who):
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime
    before = cpu(resource.RUSAGE_SELF)
    seconds, kept = bench_curate._tokenmix(Path(args[0]), args[1], Path(args[2]), args[3], [tuple(f) for f in args[4]], args[5])
    print("RESULT", seconds, kept, cpu(resource.RUSAGE_SELF) - before + cpu(resource.RUSAGE_CHILDREN))
""")
"""``_tokenmix`` in a fresh interpreter with the tokenmix of a checkout (its ``src`` first on the path, which the
workers inherit): every pipeline's driver starts alike, whichever checkout it runs. Prints the run's seconds, the
records kept, and the CPU seconds of the driver's run and of its workers, start-up included."""


def _startup(src: str, numba_cache: str | None = None) -> tuple[float, float]:
    """CPU and wall seconds of ``STARTUP`` in a fresh interpreter with ``src``'s tokenmix."""
    env = {**os.environ, **({"NUMBA_CACHE_DIR": numba_cache} if numba_cache else {})}
    proc = subprocess.run([sys.executable, "-c", STARTUP, src], capture_output=True, text=True, env=env, check=True)
    cpu, wall = (float(v) for v in next(line for line in proc.stdout.splitlines() if line.startswith("STARTUP")).split()[1:])
    return cpu, wall


def _tokenmix_from(src: str, inputs: Path, sources: list[str], out: Path, workers: int, filters: list[tuple[str, dict]],
                   keep_all: bool) -> tuple[float, int, float]:
    """``_tokenmix`` with the tokenmix under ``src`` (``TOKENMIX_FROM``): seconds, records kept, CPU seconds."""
    args = json.dumps([str(inputs), sources, str(out), workers, filters, keep_all])
    proc = subprocess.run([sys.executable, "-c", TOKENMIX_FROM, src, str(Path(__file__).parent), args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the pipeline with {src} failed: {proc.stderr[-2000:]}")
    seconds, kept, cpu = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT")).split()[1:]
    return float(seconds), int(kept), float(cpu)


def _tokenmix(inputs: Path, sources: list[str], out: Path, workers: int, filters: list[tuple[str, dict]], keep_all: bool) -> tuple[float, int]:
    from tokenmix.curate import CurationConfig, CurationOutput, CurationSource, DocumentFilter, Score, ScoreFilter, run_curation

    stage = Score if keep_all else ScoreFilter
    stages = [stage(DocumentFilter.get_choice_class(name)(**kwargs), score_field=f"s{i}") for i, (name, kwargs) in enumerate(filters)]
    config = CurationConfig(sources=[CurationSource(s, [str(inputs / s / "*.jsonl.zst")]) for s in sources], stages=stages,
                            output=CurationOutput(str(out), "jsonl.zst", write_to_filename=True), num_workers=workers)
    started = time.perf_counter()
    stats = run_curation(config)
    return time.perf_counter() - started, stats["output"]["records"]


def _datatrove(python: str, inputs: Path, out: Path, workers: int, kind: str, tasks: int) -> float:
    script = out.parent / "datatrove_run.py"
    script.write_text(DATATROVE)
    proc = subprocess.run([python, str(script), str(inputs), str(out), str(out) + "-logs", str(workers), kind, str(tasks)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"datatrove failed: {proc.stderr[-2000:]}")
    return float(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("SECONDS")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--marginal", action="store_true",
                        help="with --copies N > 1: run every pipeline on 1 copy too, and give the ratios per added document")
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help=f"tokenmix's pipelines to run, of {','.join(PIPELINES)}")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=SRC")
    parser.add_argument("--datatrove_python", default=None)
    args = parser.parse_args()
    chosen = args.pipelines.split(",")
    if "bare" not in chosen or not set(chosen) <= set(PIPELINES):
        parser.error(f"--pipelines: a comma-separated list of {', '.join(PIPELINES)}, with bare (the reference)")
    if not all("=" in c for c in args.compare):
        parser.error("--compare: LABEL=SRC, SRC the src folder of another tree of tokenmix")
    trees = {"": str(REPO / "src"), **{f" ({label})": src for label, _, src in (c.partition("=") for c in args.compare)}}
    import logging

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="bench-curate-"))
    try:
        if args.marginal and args.copies < 2:
            parser.error("--marginal: with --copies 2 or more")
        sources, shards, docs = _inputs(args.corpus, args.copies, scratch / "in")
        if args.marginal:
            _, one_shards, one_docs = _inputs(args.corpus, 1, scratch / "in-1")
        machine = platform.processor() or platform.machine()
        print(f"{docs:,} documents in {shards} shards of {len(sources)} sources; {args.workers} workers; {machine}, {os.cpu_count()} cores")
        for label, src in trees.items():
            cpu, wall = min(_startup(src) for _ in range(5))
            with tempfile.TemporaryDirectory() as empty:
                cold_cpu, cold_wall = _startup(src, numba_cache=empty)
            print(f"start-up{label}: {cpu:.2f} s CPU ({wall:.2f} s) to import the filters and score a first text; "
                  f"{cold_cpu:.2f} s CPU ({cold_wall:.2f} s) with an empty numba cache")
        names = [(f"tokenmix {name}{label}", name, src) for name in chosen for label, src in trees.items()]
        if args.marginal:
            names += [(f"{name}, 1 copy", kind, src) for name, kind, src in names]
        names += [(f"datatrove {kind}", kind, None) for kind in ("bare", "gopher") if args.datatrove_python]
        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        kept: dict[str, int] = {}
        for repeat in range(args.repeats):
            for name, kind, src in names:
                out = scratch / f"{name.replace(' ', '-').replace('(', '').replace(')', '')}-{repeat}"
                cpu = None
                inputs = scratch / ("in-1" if name.endswith(", 1 copy") else "in")
                if src is None:
                    seconds = _datatrove(args.datatrove_python, inputs, out, args.workers, kind, shards)
                else:
                    seconds, kept[name], cpu = _tokenmix_from(src, inputs, sources, out, args.workers, PIPELINES[kind], kind == "scored")
                    best_cpu[name] = min(best_cpu.get(name, float("inf")), cpu)
                best[name] = min(best.get(name, float("inf")), seconds)
                print(f"  {name:<32} {seconds:7.2f} s" + (f", {cpu:6.2f} s CPU" if cpu is not None else ""))
                shutil.rmtree(out, ignore_errors=True)
        print()
        print("| pipeline | seconds (best) | docs/s per core | kept | vs tokenmix bare | CPU seconds (best) | vs bare, CPU |")
        print("|---|---|---|---|---|---|---|")
        for name, seconds in best.items():
            if name.endswith(", 1 copy"):
                continue
            cpu_columns = f"{best_cpu[name]:.2f} | {best_cpu['tokenmix bare'] / best_cpu[name]:.2f}x" if name in best_cpu else " | "
            print(f"| {name} | {seconds:.2f} | {docs / seconds / args.workers:,.0f} | {kept.get(name, '')} | "
                  f"{best['tokenmix bare'] / seconds:.2f}x | {cpu_columns} |")
        if "datatrove gopher" in best and "tokenmix gopher" in best:
            print(f"\ntokenmix gopher is {best['datatrove gopher'] / best['tokenmix gopher']:.2f}x as fast as datatrove gopher")
        for name in best_cpu:
            if name != "tokenmix bare" and not name.endswith(", 1 copy"):
                print(f"{name} runs at {best['tokenmix bare'] / best[name]:.2f}x of tokenmix bare (goal >= 0.8x); "
                      f"{best_cpu['tokenmix bare'] / best_cpu[name]:.2f}x in CPU seconds")
        if args.marginal:
            print(f"\nPer added document (the {docs - one_docs:,} documents of copies 2 to {args.copies}: each pipeline's best on "
                  f"{args.copies} copies less its best on 1, which takes the costs that do not grow with the corpus out):")
            added = {name: (best[name] - best[f"{name}, 1 copy"], best_cpu[name] - best_cpu[f"{name}, 1 copy"])
                     for name in best_cpu if not name.endswith(", 1 copy")}
            bare_seconds, bare_cpu = added["tokenmix bare"]
            for name, (seconds, cpu) in added.items():
                if min(seconds, cpu, bare_seconds, bare_cpu) <= 0:
                    print(f"  {name:<32} no added time measured ({seconds:.2f} s, {cpu:.2f} s CPU): more copies, or more repeats")
                    continue
                print(f"  {name:<32} {seconds:6.2f} s, {cpu:6.2f} s CPU: {bare_seconds / seconds:.2f}x of tokenmix bare, "
                      f"{bare_cpu / cpu:.2f}x in CPU seconds; {(docs - one_docs) / seconds / args.workers:,.0f} docs/s per core")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
