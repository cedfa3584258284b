"""Curation throughput: read + Gopher filters + write against a bare read + write of the same shards, and against
datatrove running the same filters, all in one run.

    python scripts/bench_curate.py [--corpus ../shared/corpus] [--workers N] [--repeats 3] [--copies 1]
                                   [--datatrove_python /path/to/venv/bin/python]

Five pipelines over the train shards of every source under --corpus, each writing every input shard back out as
zstd JSON lines, with --workers processes:

- tokenmix bare: read, parse, write (``tokenmix curate`` with no stages);
- tokenmix heuristics: the same with every heuristic filter NeMo Curator ships but the n-gram ones (19
  ``score_filter`` stages, NeMo's default thresholds, each score written to a field);
- tokenmix heuristics scored: the same 19 scores written by ``score`` stages, which remove nothing, so that every
  document is written as in the bare run (plus its 19 scores);
- tokenmix gopher: the same with the Gopher quality and repetition heuristics (19 ``score_filter`` stages with
  datatrove's default thresholds: word count, mean word length, symbol ratio, bullets, ellipsis, alphabetic words,
  stop words; duplicate lines and paragraphs by count and by characters; top 2/3/4-grams; duplicate 5..10-grams);
- datatrove bare and datatrove gopher (``JsonlReader`` -> [``GopherRepetitionFilter``, ``GopherQualityFilter``] ->
  ``JsonlWriter``, ``LocalPipelineExecutor`` with one task per shard), when --datatrove_python names a Python that
  has ``datatrove[processing]`` and ``spacy`` (its English word splitter needs no download).

The four alternate, --repeats times, and the best time of each is kept. Docs/s per core is documents read / seconds
/ workers. The goals: filtering at >= 0.8x of tokenmix bare, and faster than datatrove on the same filters.
"""

from __future__ import annotations

import argparse
import glob
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
    parser.add_argument("--datatrove_python", default=None)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="bench-curate-"))
    try:
        sources, shards, docs = _inputs(args.corpus, args.copies, scratch / "in")
        machine = platform.processor() or platform.machine()
        print(f"{docs:,} documents in {shards} shards of {len(sources)} sources; {args.workers} workers; {machine}, {os.cpu_count()} cores")
        best: dict[str, float] = {}
        kept: dict[str, int] = {}
        for repeat in range(args.repeats):
            for name in ("tokenmix bare", "tokenmix heuristics", "tokenmix heuristics scored", "tokenmix gopher", "datatrove bare",
                         "datatrove gopher"):
                out = scratch / f"{name.replace(' ', '-')}-{repeat}"
                if name.startswith("tokenmix"):
                    filters = {"bare": [], "heuristics": HEURISTICS, "gopher": GOPHER}[name.split()[1]]
                    seconds, kept[name] = _tokenmix(scratch / "in", sources, out, args.workers, filters, name.endswith("scored"))
                elif args.datatrove_python:
                    seconds = _datatrove(args.datatrove_python, scratch / "in", out, args.workers, name.split()[1], shards)
                else:
                    continue
                best[name] = min(best.get(name, float("inf")), seconds)
                print(f"  {name:<18} {seconds:7.2f} s")
                shutil.rmtree(out, ignore_errors=True)
        print()
        print("| pipeline | seconds (best) | docs/s per core | kept | vs tokenmix bare |")
        print("|---|---|---|---|---|")
        for name, seconds in best.items():
            print(f"| {name} | {seconds:.2f} | {docs / seconds / args.workers:,.0f} | {kept.get(name, '')} | "
                  f"{best['tokenmix bare'] / seconds:.2f}x |")
        if "datatrove gopher" in best:
            print(f"\ntokenmix gopher is {best['datatrove gopher'] / best['tokenmix gopher']:.2f}x as fast as datatrove gopher")
        for name in ("tokenmix heuristics", "tokenmix heuristics scored", "tokenmix gopher"):
            print(f"{name} runs at {best['tokenmix bare'] / best[name]:.2f}x of tokenmix bare (goal >= 0.8x)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    main()
