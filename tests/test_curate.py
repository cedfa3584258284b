"""The curation stage on real shards: names kept, every record accounted, exact dedup by rank, blend counts, shuffles,
resume, and NeMo Curator's DocumentDataset calls. (The heuristics themselves: test_curate_heuristics.py.)"""

from __future__ import annotations

import dataclasses
import gzip
import io
import itertools
import json
import math
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from curate_kill import curate_until, finished_tasks
from helpers import DEMO_CORPUS, REPO, build, read_jsonl_zst

from tokenmix.curate import (
    AddId,
    CurationConfig,
    CurationError,
    CurationInputError,
    CurationOutput,
    CurationSource,
    DocumentDataset,
    ExactDedup,
    FieldFilter,
    Modify,
    Score,
    ScoreFilter,
    Shuffle,
    ShuffleConfig,
    blend_datasets,
    get_batched_files,
    get_remaining_files,
    load_curation_config,
    run_curation,
    scatter,
)
from tokenmix.curate.exact_dedup import MemoryBoundError
from tokenmix.curate.filters import DocumentFilter
from tokenmix.curate.fuzzy_dedup import FuzzyDedup
from tokenmix.curate.minhash import MinHashConfig
from tokenmix.curate.modifiers import DocumentModifier
from tokenmix.curate.pipeline_config import BlendConfig
from tokenmix.curate.shard_io import shard_stem

SOURCES = ("linux_doc", "python_doc", "webster")


def _read(path) -> list[dict]:
    path = str(path)
    if path.endswith(".parquet"):
        return pq.ParquetFile(path).read().to_pylist()  # not read_table: its dataset scanner owns the names __filename, ...
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".zst"):
        raw = zstandard.ZstdDecompressor().stream_reader(raw).read()
    elif path.endswith(".gz"):
        raw = gzip.decompress(raw)
    return [orjson.loads(line) for line in raw.splitlines() if line.strip()]


def _outputs(out) -> dict[str, bytes]:
    """Every output file (not the work directory, not the stats: those hold timings) by relative path, as bytes."""
    files = {}
    for root, dirs, names in os.walk(out):
        dirs[:] = [d for d in dirs if d != ".curate"]
        for name in names:
            if name != "curation_stats.json":
                path = os.path.join(root, name)
                files[os.path.relpath(path, out)] = open(path, "rb").read()
    return files


def _artifacts(out) -> dict[str, bytes]:
    """The decision artifacts a run keeps in its work directory (dedup removals, LSH edges, clusters), by path below
    the run's key, as bytes."""
    work = out / ".curate"
    files = {}
    for key in os.listdir(work):
        for root, _, names in os.walk(work / key):
            for name in names:
                if name.endswith(".parquet"):
                    path = os.path.join(root, name)
                    files[os.path.relpath(path, work / key)] = open(path, "rb").read()
    return files


def _word_filter(min_words: int) -> DocumentFilter:
    return DocumentFilter.get_choice_class("word_count")(min_words=min_words)


def _demo_source(name: str) -> CurationSource:
    return CurationSource(name, [str(DEMO_CORPUS / name / "train-{00..01}-of-02.jsonl.zst")])


def test_shard_names_kept_extra_fields_untouched_and_every_record_accounted(tmp_path):
    shards = tmp_path / "in"
    shards.mkdir()
    records = [{"text": (f"document {i} " + "word " * (i % 7)).strip(), "meta": {"n": i, "tags": ["a", "b"]}, "score": i / 3}
               for i in range(60)]
    records[5] = {"text": "no meta here at all", "only_here": True}
    for k in range(3):
        (shards / f"books_{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[k * 20:(k + 1) * 20]))
    books = DocumentDataset.read_json(str(shards), add_filename=True)
    kept = ScoreFilter(_word_filter(4), score_field="word_count")(books)
    stats = kept.to_json(str(tmp_path / "out"), write_to_filename=True)

    out = sorted(os.listdir(tmp_path / "out"))
    assert [n for n in out if not n.startswith(".") and n.endswith(".jsonl")] == ["books_00.jsonl", "books_01.jsonl", "books_02.jsonl"]
    written = {n: _read(tmp_path / "out" / n) for n in ("books_00.jsonl", "books_01.jsonl", "books_02.jsonl")}
    for name, rows in written.items():
        assert {r["filename"] for r in rows} == {name}
    expected = [r for r in records if len(r["text"].split()) >= 4]
    got = [r for n in sorted(written) for r in written[n]]
    assert [{k: v for k, v in r.items() if k not in ("filename", "word_count")} for r in got] == expected
    assert all(r["word_count"] == len(r["text"].split()) for r in got)
    assert stats["accounted"]
    assert stats["sources"]["documents"]["read"] == 60
    assert stats["stages"][0]["removed"] == {"word_count": 60 - len(expected)}
    assert stats["output"]["records"] == len(expected)


def test_write_to_filename_needs_add_filename(tmp_path):
    books = DocumentDataset.read_json(str(DEMO_CORPUS / "webster"))
    with pytest.raises(ValueError, match="add_filename=True"):
        books.to_json(str(tmp_path / "out"), write_to_filename=True)


def test_partitions_asked_of_an_output_written_to_file_names_are_refused_naming_both_fields(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"text": "one two three"}\n')
    document = {"sources": [{"name": "s", "paths": [str(tmp_path / "s.jsonl")]}],
                "output": {"path": str(tmp_path / "out"), "write_to_filename": True, "partitions": 4}}
    with pytest.raises(Exception, match=r"output.partitions.*output.write_to_filename.*remove output.partitions"):
        load_curation_config(document)
    books = DocumentDataset.read_json(str(tmp_path / "s.jsonl"), add_filename=True)
    with pytest.raises(CurationError, match=r"output.partitions"):
        books.to_json(str(tmp_path / "out"), write_to_filename=True, partitions=4)
    assert not (tmp_path / "out").exists()


def test_inputs_of_every_kind_and_outputs_of_every_format_hold_the_same_records(tmp_path):
    records = [{"text": f"line {i}\nof text", "id": i, "nested": {"x": [i, None]}} for i in range(25)]
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records[:10]).encode()))
    pq.write_table(pa.Table.from_pylist(records[10:20]), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text("a whole text file\nis one document")
    config = CurationConfig(sources=[CurationSource("mixed", [str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.parquet"), str(tmp_path / "c.txt")])],
                            output=CurationOutput(str(tmp_path / "x"), "jsonl", write_to_filename=True), num_workers=0)
    expected = records[:20] + [{"text": "a whole text file\nis one document"}]
    for fmt in ("jsonl", "jsonl.gz", "jsonl.zst", "parquet"):
        out = tmp_path / fmt.replace(".", "_")
        run_curation(CurationConfig(sources=config.sources, output=CurationOutput(str(out), fmt, write_to_filename=True), num_workers=0))
        got = [r for name in ("a", "b", "c") for r in _read(out / "mixed" / f"{name}.{fmt}")]
        if fmt == "parquet":
            got = [{k: v for k, v in r.items() if v is not None or k == "text"} for r in got]
        assert got == expected, fmt


def test_bad_records_raise_naming_file_and_line_or_are_counted(tmp_path):
    lines = ['{"text": "good one"}', "", '{"text": "bad', '{"no_text": 1}', '[1, 2]', '{"text": "good two"}']
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    source = CurationSource("s", [str(tmp_path / "s.jsonl")])
    with pytest.raises(CurationInputError, match=r"s\.jsonl, line 3: malformed json"):
        run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o1")), num_workers=0))
    stats = run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o2"), "jsonl"), on_error="skip", num_workers=0))
    assert stats["sources"]["s"]["read"] == 5 and stats["sources"]["s"]["bad"] == {"malformed_json": 1, "missing_text": 1, "not_an_object": 1}
    assert stats["accounted"] and stats["output"]["records"] == 2



def test_json_lines_with_nan_or_infinity_are_read_as_nemo_reads_them_and_integers_beyond_64_bits_are_named(tmp_path):
    """Python's json.dumps writes NaN, Infinity and -Infinity; NeMo Curator reads JSON lines with pandas, which takes
    them (and writes them back as null), as Arrow's JSON reader and the cache builder do. Before, curation counted such
    records malformed_json (orjson refuses them) and dropped them. An integer beyond 64 bits fits no record field
    (pandas refuses it: "Value is too big"): it stays malformed, and the error says why."""
    import pandas as pd

    records = [{"text": "a NaN score", "score": float("nan")}, {"text": "an infinite score", "score": float("inf")},
               {"text": "a negative infinite one", "score": float("-inf"), "meta": {"w": float("nan")}},
               {"text": "a finite score", "score": 0.5}]
    lines = [json.dumps(r) for r in records]
    (tmp_path / "s.jsonl").write_text("\n".join(lines[:2] + ['{"text": "a huge id", "id": 123456789012345678901234567890}'] + lines[2:]) + "\n")
    source = CurationSource("s", [str(tmp_path / "s.jsonl")])
    with pytest.raises(CurationInputError, match=r"s\.jsonl, line 3: malformed json \(the integer 123456789012345678901234567890 is beyond 64 bits"):
        run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o1")), num_workers=0))
    stats = run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "jsonl"), "jsonl"), on_error="skip", num_workers=0))
    assert stats["sources"]["s"]["read"] == 5 and stats["sources"]["s"]["bad"] == {"malformed_json": 1}
    assert stats["output"]["records"] == 4
    got = [r for path in sorted((tmp_path / "jsonl").rglob("*.jsonl")) for r in _read(path)]
    assert got == [{"text": "a NaN score", "score": None}, {"text": "an infinite score", "score": None},
                   {"text": "a negative infinite one", "score": None, "meta": {"w": None}}, {"text": "a finite score", "score": 0.5}]
    nemo = pd.read_json(io.StringIO("\n".join(lines)), lines=True)
    written = [json.loads(line) for line in nemo.to_json(orient="records", lines=True).splitlines()]
    assert [(r["text"], r["score"]) for r in written] == [(r["text"], r["score"]) for r in got]
    run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "parquet"), "parquet"), on_error="skip", num_workers=0))
    kept = [r for path in sorted((tmp_path / "parquet").rglob("*.parquet")) for r in _read(path)]
    scores = [r["score"] for r in kept]
    assert math.isnan(scores[0]) and scores[1:] == [float("inf"), float("-inf"), 0.5]

def test_a_deeply_nested_json_line_is_read_or_counted_malformed_never_a_crash(tmp_path):
    """orjson reads 1,024 levels of nesting but writes 254: a record nested deeper crashed the curation where it was
    written (or carried as JSON text beside other types), past on_error: skip ("Recursion limit reached"); and looking
    a line's values over for integers orjson read as floats recursed, which Python's stack took only to about 500
    levels. A record nested deeper than can be written is malformed_json, named; one within is carried whole."""
    lines = [f'{{"text": "{text}", "a": {"[" * levels}{"]" * levels}}}' for text, levels in (("deep", 253), ("deeper", 900), ("deepest", 5000))]
    lines.append('{"text": "flat", "a": 1}')
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    source = CurationSource("s", [str(tmp_path / "s.jsonl")])
    with pytest.raises(CurationInputError, match=r"s\.jsonl, line 2: malformed json \(nested 901 levels deep, over the 254 a record may have\)"):
        run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o1"), "jsonl"), num_workers=0))
    stats = run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o"), "jsonl"), on_error="skip", num_workers=0))
    assert stats["sources"]["s"]["bad"] == {"malformed_json": 2} and stats["output"]["records"] == 2
    got = [r for path in sorted((tmp_path / "o").rglob("*.jsonl")) for r in _read(path)]
    assert got == [json.loads(lines[0]), json.loads(lines[3])]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_text_that_is_not_utf8_is_a_bad_record_named_by_file_and_record_or_counted(tmp_path, kind):
    texts = [b"good one", b"bad \xff\xfe bytes", b"good two", b"GOOD  one"]
    if kind == "jsonl":
        (tmp_path / "s.jsonl").write_bytes(b"".join(b'{"text": "' + t + b'", "n": %d}\n' % i for i, t in enumerate(texts)))
    else:  # Arrow writes a Parquet string column without checking its bytes are UTF-8, as other writers may
        offsets = pa.array([0, *itertools.accumulate(map(len, texts))], pa.int32()).buffers()[1]
        column = pa.Array.from_buffers(pa.string(), len(texts), [None, offsets, pa.py_buffer(b"".join(texts))])
        pq.write_table(pa.table({"text": column, "n": pa.array(range(len(texts)), pa.int64())}), tmp_path / "s.parquet")
    source = CurationSource("s", [str(tmp_path / f"s.{kind}")])
    where = "line 2" if kind == "jsonl" else "record 1"
    with pytest.raises(CurationInputError, match=rf"s\.{kind}, {where}: .*(invalid utf8|not valid UTF-8).*on_error: skip"):
        run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o1"), "jsonl"), num_workers=0))
    stats = run_curation(CurationConfig(sources=[source], stages=[ExactDedup()], on_error="skip", num_workers=0,
                                        output=CurationOutput(str(tmp_path / "o2"), "jsonl", write_to_filename=True)))
    assert stats["sources"]["s"]["read"] == 4 and stats["sources"]["s"]["bad"] == {"invalid_utf8": 1}
    assert stats["accounted"] and _read(tmp_path / "o2" / "s" / "s.jsonl") == [{"text": "good one", "n": 0}, {"text": "good two", "n": 2}]


@pytest.mark.parametrize("encoding", ["dictionary", "string_view"])
def test_a_parquet_text_column_stored_dictionary_encoded_or_as_views_is_text_as_in_json_lines(tmp_path, encoding):
    texts = ["one two three", "four five", "one two three", "six"]
    column = pa.array(texts).dictionary_encode() if encoding == "dictionary" else pa.array(texts, pa.string_view())
    pq.write_table(pa.table({"text": column, "n": pa.array(range(4), pa.int64())}), tmp_path / "s.parquet")
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    outputs = {}
    for kind in ("parquet", "jsonl"):
        stats = run_curation(CurationConfig(sources=[CurationSource("s", [str(tmp_path / f"s.{kind}")])], stages=[ExactDedup()], num_workers=0,
                                            output=CurationOutput(str(tmp_path / f"out-{kind}"), "jsonl", write_to_filename=True)))
        assert stats["sources"]["s"]["bad"] == {} and stats["output"]["records"] == 3
        outputs[kind] = (tmp_path / f"out-{kind}" / "s" / f"s.{'jsonl'}").read_bytes()
    assert outputs["parquet"] == outputs["jsonl"]


def _planted_sources(tmp_path) -> list[CurationSource]:
    """Three sources; ``dup-*`` texts appear in several, with case and whitespace changed."""
    texts = {
        "high": ["dup-A the same text", "unique high 1", "dup-B shared   by two", "unique high 2", "dup-C internal"],
        "mid": ["DUP-a   the same TEXT ", "unique mid", "dup-D mid and low", "dup-C internal"],
        "low": ["dup-b shared by two", "dup-D mid and low", "unique low", "dup-A the same text"],
    }
    sources = []
    for name, docs in texts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "s0.jsonl").write_text("".join(json.dumps({"text": t, "src": name}) + "\n" for t in docs[:2]))
        (tmp_path / name / "s1.jsonl").write_text("".join(json.dumps({"text": t, "src": name}) + "\n" for t in docs[2:]))
        sources.append(CurationSource(name, [str(tmp_path / name / "s{0,1}.jsonl")]))
    return sources


def test_exact_dedup_across_sources_keeps_the_highest_ranked_copy(tmp_path):
    sources = _planted_sources(tmp_path)
    stats = run_curation(CurationConfig(sources=sources, stages=[AddId(), ExactDedup()], num_workers=0,
                                        output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True)))
    files = {name: [tmp_path / "out" / name / f"{shard}.jsonl" for shard in ("s0", "s1")] for name in ("high", "mid", "low")}
    # a shard whose records were all duplicates gets no output file, as NeMo Curator writes none for a file whose rows are gone
    assert [str(f.relative_to(tmp_path / "out")) for fs in files.values() for f in fs if not f.exists()] == ["low/s0.jsonl"]
    kept = {name: [r["text"] for f in fs if f.exists() for r in _read(f)] for name, fs in files.items()}
    assert kept["high"] == ["dup-A the same text", "unique high 1", "dup-B shared   by two", "unique high 2", "dup-C internal"]
    assert kept["mid"] == ["unique mid", "dup-D mid and low"]
    assert kept["low"] == ["unique low"]
    dedup = stats["stages"][1]
    assert dedup["stage"] == "exact_dedup" and dedup["removed"] == {"exact_duplicate": 5}
    assert {n: s["removed"].get("exact_duplicate", 0) for n, s in dedup["per_source"].items()} == {"high": 0, "mid": 2, "low": 3}
    ids = [r["id"] for r in _read(tmp_path / "out" / "mid" / "s1.jsonl")]
    assert ids == ["mid-00001-000000000"]
    assert stats["accounted"]


def test_a_shard_whose_records_are_all_removed_writes_no_output_so_its_cache_builds(tmp_path):
    """A shard every record of which a stage removed was written as an empty file, which build-cache then refused
    (empty_shard) under its default on_error: raise; NeMo Curator writes no file for an input whose rows are gone. A
    rerun that finds the pipeline finished writes nothing either."""
    sources = _planted_sources(tmp_path)
    config = CurationConfig(sources=sources, stages=[ExactDedup()], num_workers=0,
                            output=CurationOutput(str(tmp_path / "out"), "jsonl.zst", write_to_filename=True))
    run_curation(config)
    low = sorted(str(p) for p in (tmp_path / "out" / "low").glob("*.jsonl.zst"))
    assert [os.path.basename(p) for p in low] == ["s1.jsonl.zst"]
    assert build(str(tmp_path / "cache"), low)["documents"] == 1
    before = _outputs(tmp_path / "out")
    assert run_curation(config)["output"]["records"] == 5 + 2 + 1 and _outputs(tmp_path / "out") == before  # finished: nothing written


def test_exact_dedup_decides_in_passes_when_memory_is_short_and_refuses_a_range_that_cannot_fit(tmp_path):
    sources = _planted_sources(tmp_path)
    out = {}
    for memory in (1 << 30, 2048):
        stats = run_curation(CurationConfig(sources=sources, stages=[ExactDedup(memory_bytes=memory)], num_workers=0,
                                            output=CurationOutput(str(tmp_path / f"out{memory}"), "jsonl", partitions=2)))
        out[memory] = _outputs(tmp_path / f"out{memory}")
        assert stats["stages"][0]["removed"] == {"exact_duplicate": 5}
    assert out[2048] == out[1 << 30]
    dedup = tmp_path / "out2048" / ".curate" / os.listdir(tmp_path / "out2048" / ".curate")[0] / "pass-0" / "dedup"
    passes = [json.loads((dedup / "stats" / n).read_text()) for n in os.listdir(dedup / "stats")]
    assert len(passes) > 1 and max(p["held_bytes"] for p in passes) <= 2048
    with pytest.raises(MemoryBoundError, match=r"exact_dedup.memory_bytes \(48\) cannot hold hash range .*raise exact_dedup.memory_bytes"):
        run_curation(CurationConfig(sources=sources, stages=[ExactDedup(memory_bytes=48)], num_workers=0,
                                    output=CurationOutput(str(tmp_path / "out48"), "jsonl", partitions=2)))


def test_exact_dedup_cross_source_removes_only_copies_in_lower_ranked_sources(tmp_path):
    """Zyda-2's policy on real documents planted as duplicates within and across sources: a text some higher-ranked
    source holds is removed from the lower ones, and the copies of a text inside its best source all stay; the default
    keeps one copy only. Deciding in passes (memory short) changes nothing."""
    docs = [r["text"] for r in read_jsonl_zst(DEMO_CORPUS / "python_doc" / "train-00-of-02.jsonl.zst")[:8]]
    variant = "  " + "".join(c.upper() if c.isascii() else c for c in docs[2]).replace(" ", " \n ")  # equal once normalized
    planted = {"high": [[0, 1], [0, 2]], "mid": [[3, 1, 3, 4, variant]], "low": [[3, 6, 6, 4, 7]]}
    sources = []
    for name, shards in planted.items():
        urls = []
        for k, shard in enumerate(shards):
            urls.append(str(tmp_path / name / f"s{k}.jsonl"))
            (tmp_path / name).mkdir(exist_ok=True)
            Path(urls[-1]).write_text("".join(json.dumps({"text": docs[d] if isinstance(d, int) else d, "doc": d if isinstance(d, int) else "2'"})
                                               + "\n" for d in shard))
        sources.append(CurationSource(name, urls))
    expected = {"cross_source": {"high": [0, 1, 0, 2], "mid": [3, 3, 4], "low": [6, 6, 7]},
                "one_per_cluster": {"high": [0, 1, 2], "mid": [3, 4], "low": [6, 7]}}
    removed = {"cross_source": {"high": 0, "mid": 2, "low": 2}, "one_per_cluster": {"high": 1, "mid": 3, "low": 3}}
    outputs = {}
    for policy, memory in (("cross_source", 1 << 30), ("cross_source", 2048), ("one_per_cluster", 1 << 30)):
        out = tmp_path / f"{policy}-{memory}"
        stats = run_curation(CurationConfig(sources=sources, stages=[ExactDedup(policy=policy, memory_bytes=memory)], num_workers=0,
                                            output=CurationOutput(str(out), "jsonl", write_to_filename=True)))
        kept = {name: [r["doc"] for k in range(len(shards)) for r in _read(out / name / f"s{k}.jsonl")] for name, shards in planted.items()}
        assert kept == expected[policy]
        assert {n: s["removed"].get("exact_duplicate", 0) for n, s in stats["stages"][0]["per_source"].items()} == removed[policy]
        assert stats["accounted"]
        outputs[policy, memory] = _outputs(out)
    assert outputs["cross_source", 2048] == outputs["cross_source", 1 << 30]
    with pytest.raises(ValueError, match="exact_dedup.policy: 'per_source' is not one of cross_source, one_per_cluster"):
        ExactDedup(policy="per_source")


def test_blend_counts_are_exact_with_oversampling_and_seeded(tmp_path):
    sources = [_demo_source(s) for s in SOURCES]
    docs = {s: [r["text"] for i in range(2) for r in read_jsonl_zst(DEMO_CORPUS / s / f"train-0{i}-of-02.jsonl.zst")] for s in SOURCES}
    target = 401
    weights = {"linux_doc": 1.0, "python_doc": 1.0, "webster": 2.0}
    wanted = {"linux_doc": 101, "python_doc": 101, "webster": 201}  # ceil(401 * w / 4): 100.25, 100.25, 200.5
    over = "python_doc"
    assert wanted[over] > len(docs[over]) and wanted["webster"] < len(docs["webster"]), "the test needs both an oversampled and a cut source"
    results = {}
    for run, seed in enumerate((None, 7, 7)):
        out = tmp_path / f"blend-{run}"
        stats = run_curation(CurationConfig(sources=sources, stages=[AddId()], blend=BlendConfig(target, weights, seed), num_workers=0,
                                            output=CurationOutput(str(out), "jsonl", partitions=3)))
        rows = [r for p in range(3) for r in _read(out / f"part-{p:05d}.jsonl")]
        results[run] = rows
        assert stats["output"]["records"] == len(rows) == sum(wanted.values())
        for s in SOURCES:
            mine = [r for r in rows if r["id"].startswith(s + "-")]
            count = len(docs[s])
            rounds, extra = divmod(wanted[s], count)
            assert len(mine) == wanted[s] == stats["blend"][s]["blended"]
            times = Counter(r["id"] for r in mine)
            expected_times = {k: v for k, v in {rounds: count - extra, rounds + 1: extra}.items() if v and k}
            assert dict(Counter(times.values())) == expected_times
            if seed is None:
                assert [r["text"] for r in mine[:min(count, wanted[s])]] == docs[s][:min(count, wanted[s])]
        repeated = [r["text"] for r in rows if r["id"].startswith(over + "-")]
        rounds, extra = divmod(wanted[over], len(docs[over]))
        assert repeated[:rounds * len(docs[over])] == docs[over] * rounds
        if seed is None:
            assert repeated[rounds * len(docs[over]):] == docs[over][:extra]
    assert results[1] == results[2]
    assert results[1] != results[0]


def test_shuffle_is_a_seeded_permutation_with_memory_bounded_by_its_buffer(tmp_path):
    sources = [_demo_source(s) for s in SOURCES]
    plain = run_curation(CurationConfig(sources=sources, num_workers=0, output=CurationOutput(str(tmp_path / "plain"), "jsonl", partitions=2)))
    ordered = [r["text"] for p in range(2) for r in _read(tmp_path / "plain" / f"part-{p:05d}.jsonl")]
    expected = [r["text"] for s in SOURCES for i in range(2) for r in read_jsonl_zst(DEMO_CORPUS / s / f"train-0{i}-of-02.jsonl.zst")]
    assert ordered == expected and plain["accounted"]
    shuffled = {}
    for seed, buffer in ((1, 1 << 30), (1, 1 << 20), (2, 1 << 20)):
        out = tmp_path / f"s{seed}-{buffer}"
        stats = run_curation(CurationConfig(sources=sources, shuffle=ShuffleConfig(seed, buffer), num_workers=0,
                                            output=CurationOutput(str(out), "jsonl", partitions=2)))
        texts = [r["text"] for p in range(2) for r in _read(out / f"part-{p:05d}.jsonl")]
        assert Counter(texts) == Counter(expected) and texts != expected
        shuffled[(seed, buffer)] = texts
        gathered = stats["shuffle"]
        assert gathered["buckets"] == scatter.bucket_count(gathered["record_bytes"], 2, buffer)
        if buffer == 1 << 20:
            assert gathered["buckets"] > 2, "the corpus must be larger than the buffer"
            assert gathered["max_bucket_bytes"] <= 2 * buffer
    assert shuffled[(1, 1 << 20)] != shuffled[(2, 1 << 20)]
    again = run_curation(CurationConfig(sources=sources, shuffle=ShuffleConfig(1, 1 << 20), num_workers=0,
                                        output=CurationOutput(str(tmp_path / "again"), "jsonl", partitions=2)))
    assert again["accounted"]
    assert _outputs(tmp_path / "again") == _outputs(tmp_path / "s1-1048576")


def test_remaining_and_batched_files(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    for k in range(5):
        (tmp_path / "in" / f"books_{k:02d}.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "out" / "books_01.jsonl").write_text("")
    (tmp_path / "out" / "books_03.parquet").write_text("")
    (tmp_path / "out" / ".books_04.jsonl.partial").write_text("")
    remaining = get_remaining_files(str(tmp_path / "in"), str(tmp_path / "out"), "jsonl")
    assert [os.path.basename(p) for p in remaining] == ["books_00.jsonl", "books_02.jsonl", "books_03.jsonl", "books_04.jsonl"]
    assert [len(b) for b in get_batched_files(str(tmp_path / "in"), str(tmp_path / "out"), "jsonl", batch_size=3)] == [3, 1]
    assert [os.path.basename(p) for p in get_remaining_files(str(tmp_path / "in"), str(tmp_path / "out"), "jsonl", "parquet")] == [
        "books_00.jsonl", "books_01.jsonl", "books_02.jsonl", "books_04.jsonl"]
    for batch in get_batched_files(str(tmp_path / "in"), str(tmp_path / "out2"), "jsonl", batch_size=2):
        DocumentDataset.read_json(batch, add_filename=True).to_json(str(tmp_path / "out2"), write_to_filename=True, num_workers=0)
    assert get_remaining_files(str(tmp_path / "in"), str(tmp_path / "out2"), "jsonl") == []
    assert shard_stem("s3://b/x/books_00.jsonl.zst") == "books_00"


def test_nemo_style_blend_and_shuffle_calls(tmp_path):
    books = DocumentDataset.read_json(str(DEMO_CORPUS / "linux_doc"), name="books")
    web = DocumentDataset.read_json([str(DEMO_CORPUS / "webster" / "train-00-of-02.jsonl.zst")], name="web")
    blended = Shuffle(seed=3)(blend_datasets(500, [books, web], [3.0, 1.0]))
    stats = blended.to_parquet(str(tmp_path / "out"), partitions=2, num_workers=0)
    assert stats["output"]["records"] == 375 + 125
    rows = [r for p in range(2) for r in _read(tmp_path / "out" / f"part-{p:05d}.parquet")]
    assert len(rows) == 500
    with pytest.raises(ValueError, match="before blending or shuffling"):
        ScoreFilter(_word_filter(3))(blended)
    with pytest.raises(ValueError, match="different stages"):
        blend_datasets(10, [ScoreFilter(_word_filter(3))(books), web], [1, 1])
    with pytest.raises(CurationError, match="write_to_filename"):
        CurationConfig(sources=[_demo_source("webster")], output=CurationOutput(str(tmp_path / "x"), write_to_filename=True),
                       shuffle=ShuffleConfig())


@pytest.mark.parametrize("differ", ["add_filename", "on_error"])
def test_a_blend_of_datasets_read_with_different_options_is_refused_naming_the_option(tmp_path, differ):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"text": "one two three"}\n')
    option = {"add_filename": True} if differ == "add_filename" else {"on_error": "skip"}
    first = DocumentDataset.read_json(str(tmp_path / "a.jsonl"), name="a", **option)
    second = DocumentDataset.read_json(str(tmp_path / "b.jsonl"), name="b")
    with pytest.raises(ValueError, match=rf"blend_datasets: the datasets were read with different {differ}.*read them with the same"):
        blend_datasets(4, [first, second], [1, 1])
    assert blend_datasets(4, [first, dataclasses.replace(second, filename_field=first.filename_field, on_error=first.on_error)], [1, 1])


def test_one_id_prefix_for_several_sources_is_refused_as_their_ids_would_repeat(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"text": "one two three"}\n')
    sources = [CurationSource(name, [str(tmp_path / f"{name}.jsonl")]) for name in ("a", "b")]
    output = CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True)
    with pytest.raises(CurationError, match=r"stages\[1\] \(add_id\)\.id_prefix 'web'.*2 sources.*leave id_prefix unset"):
        CurationConfig(sources=sources, stages=[ScoreFilter(_word_filter(1)), AddId(id_prefix="web")], output=output, num_workers=0)
    run_curation(CurationConfig(sources=sources[:1], stages=[AddId(id_prefix="web")], output=output, num_workers=0))
    assert _read(tmp_path / "out" / "a" / "a.jsonl") == [{"text": "one two three", "id": "web-00000-000000000"}]
    run_curation(CurationConfig(sources=sources, stages=[AddId()], output=output, num_workers=0))
    assert [_read(tmp_path / "out" / n / f"{n}.jsonl")[0]["id"] for n in ("a", "b")] == ["a-00000-000000000", "b-00000-000000000"]


@pytest.mark.parametrize("bad", ["shuffle.seed", "shuffle.buffer_bytes", "blend.seed"])
def test_a_negative_seed_or_an_empty_shuffle_buffer_is_refused_naming_the_field_before_any_work(tmp_path, bad):
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(10)))
    document = {"sources": [{"name": "s", "paths": [str(tmp_path / "s.jsonl")]}], "output": {"path": str(tmp_path / "out"), "partitions": 2},
                "num_workers": 0, "shuffle": {}, "blend": {"target_size": 20, "weights": {"s": 1}}}
    section, name = bad.split(".")
    document[section][name] = -1 if name == "seed" else 0
    with pytest.raises(Exception, match=rf"{re.escape(bad)} must be .*, got {document[section][name]}"):
        run_curation(load_curation_config(document))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("writer", ["add_id", "score", "filename_field"])
def test_a_stage_or_add_filename_writing_the_text_field_is_refused_naming_both(tmp_path, writer):
    (tmp_path / "s.jsonl").write_text('{"content": "one two three", "text": "a title"}\n')
    stages = {"add_id": [AddId(id_field="content")], "score": [Score(_word_filter(1), score_field="content")], "filename_field": []}[writer]
    config = {"sources": [CurationSource("s", [str(tmp_path / "s.jsonl")], text_field="content")], "stages": stages, "num_workers": 0,
              "filename_field": "content" if writer == "filename_field" else None,
              "output": CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True)}
    where = r"filename_field" if writer == "filename_field" else rf"stages\[0\] \({writer}"
    with pytest.raises(CurationError, match=rf"{where}.* writes the field 'content', the text of sources\[s\].*another field"):
        run_curation(CurationConfig(**config))
    assert not (tmp_path / "out").exists()


def test_field_filter_and_a_user_function(tmp_path):
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": "x " * i, "int_score": i % 5}) + "\n" for i in range(20)))
    ds = DocumentDataset.read_json([str(tmp_path / "s.jsonl")])
    kept = FieldFilter("int_score", ">=", 3)(ds)
    assert [r["int_score"] for t in kept.iter_batches() for r in t.to_pylist()] == [i % 5 for i in range(20) if i % 5 >= 3]
    user = DocumentFilter.get_choice_class("function")(score_function="builtins:len", min_score=30)
    assert sum(t.num_rows for t in ScoreFilter(user)(ds).iter_batches()) == sum(1 for i in range(20) if 2 * i >= 30)
    with pytest.raises(ValueError, match="filter.score_function: cannot import 'no_such_module'"):
        DocumentFilter.get_choice_class("function")(score_function="no_such_module:f")


def test_a_changed_input_is_curated_again_not_taken_from_earlier_work(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"text": "one two three four"}\n')
    config = CurationConfig(sources=[CurationSource("s", [str(tmp_path / "s.jsonl")])], num_workers=0,
                            stages=[ScoreFilter(_word_filter(3))], output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True))
    assert run_curation(config)["output"]["records"] == 1
    assert run_curation(config)["output"]["records"] == 1
    (tmp_path / "s.jsonl").write_text('{"text": "one two"}\n{"text": "one two three"}\n')
    assert run_curation(config)["output"]["records"] == 1
    assert _read(tmp_path / "out" / "s" / "s.jsonl") == [{"text": "one two three"}]


def test_bundled_pipeline_runs_from_the_cli_and_feeds_build_cache(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "curated"
    proc = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(REPO / "config" / "curation" / "demo.yaml"),
                           "--output.path", str(out), "--num_workers", "2"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads((out / "curation_stats.json").read_text())
    assert stats["accounted"] and stats["output"]["records"] > 0
    config = load_curation_config(REPO / "config" / "curation" / "demo.yaml", ["--output.path", str(out)])
    assert [s.name for s in config.sources] == list(SOURCES)
    from tokenmix import build_caches, load_data_config

    data = load_data_config({"tokenizer": str(REPO / "data" / "tokenizer"), "cache_dir": str(tmp_path / "cache"),
                             "configs": {s: {"train_urls": [str(out / s / "*.jsonl.zst")]} for s in SOURCES}})
    built = build_caches(data)
    assert sum(st["documents"] for st in built.values()) == stats["output"]["records"]


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """The demo corpus with each shard copied 6 times, for runs long enough to kill and to spread over workers."""
    root = tmp_path_factory.mktemp("copies")
    for s in SOURCES:
        (root / s).mkdir()
        for c in range(6):
            for i in range(2):
                shutil.copyfile(DEMO_CORPUS / s / f"train-0{i}-of-02.jsonl.zst", root / s / f"c{c}-train-0{i}.jsonl.zst")
    return root


def _kill_config(root, out) -> CurationConfig:
    return CurationConfig(
        sources=[CurationSource(s, [str(root / s / "*.jsonl.zst")]) for s in SOURCES],
        stages=[AddId(), Modify(DocumentModifier.get_choice_class("unicode_fix")()), ScoreFilter(_word_filter(20), score_field="words"),
                ScoreFilter(DocumentFilter.get_choice_class("repeating_top_ngrams")(n=3, max_repeating_ngram_ratio=0.5)),
                FuzzyDedup(MinHashConfig(num_perm=32), bands=4, rows=8, policy="one_per_cluster"), ExactDedup()],
        shuffle=ShuffleConfig(seed=5, buffer_bytes=4 << 20), output=CurationOutput(str(out), "jsonl.zst", partitions=4), num_workers=2)


def test_local_ray_and_dask_give_the_same_bytes(copies, tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("distributed")
    from tokenmix import DaskExecutorConfig, RayExecutorConfig

    outputs = {}
    for name, executor in (("local", None), ("ray", RayExecutorConfig()), ("dask", DaskExecutorConfig())):
        config = _kill_config(copies, tmp_path / name)
        if executor is not None:
            config = CurationConfig(**{**config.__dict__, "executor": executor})
        stats = run_curation(config)
        assert stats["accounted"]
        outputs[name] = _outputs(tmp_path / name)
        outputs[name + " artifacts"] = _artifacts(tmp_path / name)
    assert len(outputs["local"]) == 4
    assert any("clusters.parquet/" in path for path in outputs["local artifacts"])
    for name in ("ray", "dask"):
        assert outputs[name] == outputs["local"]
        assert outputs[name + " artifacts"] == outputs["local artifacts"]


@pytest.mark.slow
def test_a_fuzzy_decision_in_memory_bounded_tasks_on_ray_and_dask_gives_the_local_bytes(copies, tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("distributed")
    from tokenmix import DaskExecutorConfig, RayExecutorConfig

    outputs = {}
    for name, executor in (("local", None), ("ray", RayExecutorConfig()), ("dask", DaskExecutorConfig())):
        config = _kill_config(copies, tmp_path / name)
        stages = [dataclasses.replace(s, memory_bytes=64 << 10) if isinstance(s, FuzzyDedup | ExactDedup) else s for s in config.stages]
        config = CurationConfig(**{**config.__dict__, "stages": stages, "keep_intermediate": True,
                                   **({"executor": executor} if executor is not None else {})})
        stats = run_curation(config)
        assert stats["accounted"]
        bounds = stats["stages"][4]["fuzzy_dedup"]["bounds"]
        assert bounds["ranges"] > 1 and bounds["partitions"] > 1 and bounds["max_task_bytes"] <= 64 << 10, bounds
        outputs[name] = _outputs(tmp_path / name)
        outputs[name + " artifacts"] = _artifacts(tmp_path / name)
    sent = [re.search(r"/components/round-\d+/messages/(\d+)-(\d+)\.parquet$", path) for path in outputs["local artifacts"]]
    assert any(m and m[1] != m[2] for m in sent), "no label crossed from one range's task to another's"
    for name in ("ray", "dask"):
        assert outputs[name] == outputs["local"]
        assert outputs[name + " artifacts"] == outputs["local artifacts"]


def _work_done(out) -> int:
    """The records of finished work a run keeps in its work directory (``.json`` files): its progress."""
    return sum(1 for _, _, files in os.walk(out / ".curate") for f in files if f.endswith(".json"))


def _run_until(config_path, out, target: int) -> bool:
    """Run the curation until its work directory holds ``target`` records of finished work, then SIGKILL it (driver
    and workers); whether it finished first."""
    return curate_until(config_path, out, lambda: _work_done(out) >= target, f"{target} records of work")


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_gives_identical_output(copies, tmp_path):
    import random
    import subprocess
    import sys

    import yaml

    from tokenmix.curate.pipeline import describe

    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(describe(_kill_config(copies, tmp_path / "unused"))))
    reference = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(config_path), "--output.path",
                                str(tmp_path / "reference")], cwd=REPO, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr[-3000:]
    work = _work_done(tmp_path / "reference")
    out = tmp_path / "killed"
    kills = 0
    seen = set()
    for point in sorted(random.Random(0).sample(range(1, work * 9 // 10), 4)):  # all through the run, not at its very end
        if _run_until(config_path, out, max(point, _work_done(out) + 1)):
            break
        kills += 1
        seen.add(_work_done(out))
    finished = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(config_path), "--output.path", str(out)],
                              cwd=REPO, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr[-3000:]
    print("kills", kills, "of", work, "records of work; seen after each kill", sorted(seen))
    assert kills == 4, "a run ended before its kill point"
    assert len(seen) >= 2, "every kill landed at the same point"
    assert _outputs(out) == _outputs(tmp_path / "reference")
    assert _artifacts(out) == _artifacts(tmp_path / "reference")
    assert not [f for _, _, files in os.walk(out) for f in files if f.endswith(".partial")]


def test_a_run_killed_while_writing_partitions_then_run_into_fewer_is_refused_naming_the_killed_runs_partitions(copies, tmp_path):
    import yaml

    from tokenmix.curate.pipeline import describe

    config = CurationConfig(sources=[CurationSource(s, [str(copies / s / "*.jsonl.zst")]) for s in SOURCES], num_workers=2,
                            output=CurationOutput(str(tmp_path / "unused"), "jsonl", partitions=8))
    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(describe(config)))
    out = tmp_path / "out"
    curate_until(config_path, out, lambda: len(finished_tasks(out, ["gather/stats"])) >= 2, "two partitions written")
    left = sorted(p.name for p in out.glob("part-*.jsonl") if p.name != "part-00000.jsonl")
    assert left, "two partitions were written, so one after the first"
    fewer = dataclasses.replace(config, num_workers=0, output=CurationOutput(str(out), "jsonl", partitions=1))
    with pytest.raises(CurationError, match=rf"holds {len(left)} files.*: {re.escape(', '.join(left[:5]))}"):
        run_curation(fewer)
    for name in left:
        os.remove(out / name)
    records = run_curation(fewer)["output"]["records"]
    assert sorted(_outputs(out)) == ["part-00000.jsonl"] and len(_read(out / "part-00000.jsonl")) == records


def test_a_truncated_shard_raises_naming_it_or_keeps_its_readable_records_and_counts_it(tmp_path):
    whole = (DEMO_CORPUS / "webster" / "train-00-of-02.jsonl.zst").read_bytes()
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    source = CurationSource("web", [str(tmp_path / "cut.jsonl.zst")])
    with pytest.raises(CurationInputError, match=r"cut\.jsonl\.zst: truncated_file after \d+ records"):
        run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o1")), num_workers=0))
    stats = run_curation(CurationConfig(sources=[source], output=CurationOutput(str(tmp_path / "o2"), "jsonl", write_to_filename=True),
                                        on_error="skip", num_workers=0))
    kept = _read(tmp_path / "o2" / "web" / "cut.jsonl")
    full = read_jsonl_zst(DEMO_CORPUS / "webster" / "train-00-of-02.jsonl.zst")
    assert 0 < len(kept) < len(full) and kept == full[: len(kept)]
    assert stats["sources"]["web"]["shards_failed"] == {"truncated_file": 1} and stats["sources"]["web"]["read"] == len(kept)
    assert stats["accounted"]


HOLD_MODULE = '''
import os
import pathlib
import time


def hold(text):
    """A score function that marks the worker as busy and never returns: the run is still in its tasks when killed."""
    pathlib.Path(os.environ["CURATE_BUSY_DIR"], str(os.getpid())).touch()
    while True:
        time.sleep(0.1)
'''


def test_sigkill_of_the_curate_process_alone_takes_its_workers_and_resource_tracker_with_it(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import psutil
    import yaml

    (tmp_path / "curate_hold.py").write_text(HOLD_MODULE)
    busy = tmp_path / "busy"
    busy.mkdir()
    for k in range(2):
        (tmp_path / f"s{k}.jsonl").write_text('{"text": "one two three"}\n')
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump({
        "sources": [{"name": "s", "paths": [str(tmp_path / "s{0..1}.jsonl")]}],
        "stages": [{"type": "score_filter", "filter": {"type": "function", "score_function": "curate_hold:hold"}}],
        "output": {"path": str(tmp_path / "out"), "format": "jsonl", "write_to_filename": True}, "num_workers": 2}))
    env = {**os.environ, "CURATE_BUSY_DIR": str(busy),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    main = subprocess.Popen([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(tmp_path / "pipeline.yaml")],
                            cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(busy)) < 2:
            assert main.poll() is None, main.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the workers never started their tasks"
            time.sleep(0.1)
        descendants = psutil.Process(main.pid).children(recursive=True)
        workers = [p for p in descendants if str(p.pid) in os.listdir(busy)]
        trackers = [p for p in descendants if "resource_tracker" in " ".join(p.cmdline())]
        assert len(workers) == 2 and len(trackers) == 1, [p.cmdline() for p in descendants]
        os.kill(main.pid, signal.SIGKILL)
        main.wait()

        def alive() -> list[psutil.Process]:
            left = []
            for p in descendants:
                try:
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        left.append(p)
                except psutil.NoSuchProcess:
                    pass
            return left

        deadline = time.monotonic() + 60
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(), f"still running 60 s after the curate process was killed: {[p.cmdline() for p in alive()]}"
    finally:
        for p in descendants:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if main.poll() is None:
            main.kill()
            main.wait()


ENGINE_LIKE_FIELDS = ("__index", "__filename", "__batch_index", "__last_in_fragment", "__fragment_index", "__position", "__absent", "__~x")
"""Field names in the engine's ``__`` space: its own columns, and the columns Arrow's dataset scanner adds."""


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_fields_named_like_the_engines_columns_pass_through_untouched(tmp_path, on_error):
    records = []
    for i in range(40):
        record = {"text": f"document {i}" + " word" * (i % 5), "filename": f"earlier-{i % 3}.jsonl"}
        record.update({name: f"{name}-{i}" for name in ENGINE_LIKE_FIELDS if (i + len(name)) % 4})
        if i % 7 == 0:
            record["__index"] = i
        records.append(record)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:20]))
    columns = {name: [r.get(name) for r in records[20:]] for name in ("text", "filename", *ENGINE_LIKE_FIELDS[1:])}
    pq.write_table(pa.table(columns), tmp_path / "b.parquet")
    parquet_records = [{k: v for k, v in r.items() if k != "__index"} | {name: r.get(name) for name in ENGINE_LIKE_FIELDS[1:]}
                       for r in records[20:]]
    expected = [{**r, "__score": len(r["text"].split())} for r in records[:20] + parquet_records]
    sources = [CurationSource("s", [str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")])]
    score = DocumentFilter.get_choice_class("word_count")()
    stages = [AddId(id_field="__id"), FieldFilter("__id", "!=", ""),
              Modify(DocumentModifier.get_choice_class("whitespace")()), Score(score, score_field="__score")]

    def run(output, **kw):
        stats = run_curation(CurationConfig(sources=sources, stages=stages, output=output, on_error=on_error, num_workers=0, **kw))
        assert stats["accounted"] and stats["output"]["records"] == len(records)
        rows = [r for name in sorted(os.listdir(output.path)) if name.startswith("part-") for r in _read(Path(output.path) / name)]
        assert all(r.pop("__id").startswith("s-0000") for r in rows)
        return rows

    assert run(CurationOutput(str(tmp_path / "in_order"), "jsonl", partitions=3)) == expected
    shuffled = run(CurationOutput(str(tmp_path / "shuffled"), "jsonl.zst", partitions=2), shuffle=ShuffleConfig(seed=1))
    assert sorted(json.dumps(r, sort_keys=True) for r in shuffled) == sorted(json.dumps(r, sort_keys=True) for r in expected)
    looked_at = list(DocumentDataset.read_json([str(tmp_path / "a.jsonl")], on_error=on_error).iter_batches())
    assert [set(t.column_names) for t in looked_at] == [{"text", "filename", *ENGINE_LIKE_FIELDS}]
    assert looked_at[0].column("__filename").to_pylist() == [r.get("__filename") for r in records[:20]]
    as_parquet = run(CurationOutput(str(tmp_path / "parquet"), "parquet", partitions=1))
    assert [{k: v for k, v in r.items() if v is not None} for r in as_parquet] == [
        {k: (json.dumps(v) if k == "__index" and v is not None else v) for k, v in r.items() if v is not None} for r in expected]


def test_add_filename_names_the_shard_read_now_and_a_chain_of_steps_round_trips(tmp_path):
    (tmp_path / "raw").mkdir()
    records = [{"text": f"record {i}", **({"filename": "from-an-earlier-pipeline.jsonl"} if i % 3 == 0 else {}),
                **({"filename": i} if i % 3 == 1 else {}), "n": i} for i in range(30)]
    for k in range(2):
        (tmp_path / "raw" / f"books_{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[k * 15:(k + 1) * 15]))
    step1 = DocumentDataset.read_json(str(tmp_path / "raw"), add_filename=True).to_json(str(tmp_path / "step1"), write_to_filename=True,
                                                                                         num_workers=0)
    assert step1["accounted"] and step1["output"]["records"] == 30
    for k in range(2):
        name = f"books_{k:02d}.jsonl"
        assert _read(tmp_path / "step1" / name) == [{**r, "filename": name} for r in records[k * 15:(k + 1) * 15]]
    step2 = DocumentDataset.read_json(str(tmp_path / "step1"), add_filename=True).to_json(str(tmp_path / "step2"), write_to_filename=True,
                                                                                          num_workers=0)
    assert step2["output"]["records"] == 30
    assert _outputs(tmp_path / "step2") == _outputs(tmp_path / "step1")


def test_parquet_output_holds_the_records_fields_only_when_its_batches_differ_in_fields(tmp_path):
    """Batches whose fields differ are merged into one schema, fields named like the engine's columns included."""
    records = [{"text": f"record {i}", "__index": i, "__~x": f"x{i}", **({"extra": i} if i % 2 else {})} for i in range(6)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run_curation(CurationConfig(sources=[CurationSource("s", [str(tmp_path / "s.jsonl")])], chunk_bytes=1, num_workers=0,
                                output=CurationOutput(str(tmp_path / "out"), "parquet", write_to_filename=True)))
    assert _read(tmp_path / "out" / "s" / "s.parquet") == [{**r, "extra": r.get("extra")} for r in records]


@pytest.mark.parametrize("partitioned", [False, True], ids=["write_to_filename", "shuffled_partitions"])
def test_a_finished_curation_writes_again_the_outputs_deleted_cut_or_garbled_since(tmp_path, partitioned):
    out = tmp_path / "out"
    config = CurationConfig(sources=[_demo_source(s) for s in SOURCES], stages=[AddId(), ExactDedup()], num_workers=0,
                            shuffle=ShuffleConfig(seed=3) if partitioned else None,
                            output=CurationOutput(str(out), "jsonl.zst", write_to_filename=not partitioned, partitions=4 if partitioned else None))
    first = run_curation(config)
    reference = _outputs(out)
    assert len(reference) >= 4
    deleted, cut, garbled = sorted(reference)[:3]
    os.remove(out / deleted)
    (out / cut).write_bytes(reference[cut][:-7])
    flipped = bytearray(reference[garbled])
    flipped[len(flipped) // 2] ^= 0x10
    (out / garbled).write_bytes(bytes(flipped))
    again = run_curation(config)
    assert _outputs(out) == reference
    assert again["output"] == first["output"] and again["sources"] == first["sources"]
    assert not [f for _, _, files in os.walk(out) for f in files if f.endswith(".partial")]
    untouched = {name: os.stat(out / name).st_mtime_ns for name in reference}
    assert run_curation(config)["output"] == first["output"]
    assert {name: os.stat(out / name).st_mtime_ns for name in reference} == untouched


@pytest.mark.parametrize("earlier", ["partitions", "write_to_filename"])
def test_an_output_directory_holding_another_pipelines_outputs_that_this_run_would_not_replace_is_refused(tmp_path, earlier):
    for k in range(4):
        (tmp_path / f"s{k}.jsonl").write_text("".join(json.dumps({"text": f"document {k} {i}"}) + "\n" for i in range(5)))
    out = tmp_path / "out"

    def config(shards: str, partitions: int | None) -> CurationConfig:
        return CurationConfig(sources=[CurationSource("s", [str(tmp_path / shards)])], num_workers=0,
                              output=CurationOutput(str(out), "jsonl", write_to_filename=partitions is None, partitions=partitions))

    run_curation(config("s{0..3}.jsonl", 4 if earlier == "partitions" else None))
    smaller = config("s{0..1}.jsonl", 2)
    left = ["part-00002.jsonl", "part-00003.jsonl"] if earlier == "partitions" else ["s/s0.jsonl", "s/s1.jsonl", "s/s2.jsonl", "s/s3.jsonl"]
    with pytest.raises(CurationError, match=rf"output.path {out} holds {len(left)} files.*: {', '.join(left)} .*remove them.*another output.path"):
        run_curation(smaller)
    assert all((out / name).exists() for name in left)
    for name in left:
        os.remove(out / name)
    assert run_curation(smaller)["output"]["records"] == 10
    assert sorted(_outputs(out)) == ["part-00000.jsonl", "part-00001.jsonl"]
    assert run_curation(config("s{0..3}.jsonl", 4))["output"]["records"] == 20
    assert sorted(_outputs(out)) == [f"part-0000{p}.jsonl" for p in range(4)]
    if earlier == "write_to_filename":  # a step reading the shards the step before wrote, written as partitions beside them
        chained = tmp_path / "chained"
        DocumentDataset.read_json(str(tmp_path / "s0.jsonl"), add_filename=True).to_json(str(chained), write_to_filename=True, num_workers=0)
        with pytest.raises(CurationError, match=r"holds 1 files.*: s0.jsonl .*set another output.path: they are this run's inputs"):
            DocumentDataset.read_json(str(chained)).to_json(str(chained), num_workers=0)


def test_inputs_that_are_files_the_pipeline_writes_are_refused_so_a_rerun_never_reads_its_own_output(tmp_path):
    for k in range(2):
        (tmp_path / f"s{k}.jsonl").write_text("".join(json.dumps({"text": f"document {k} {i}"}) + "\n" for i in range(5)))
    into_inputs = CurationConfig(sources=[CurationSource("s", [str(tmp_path / "*.jsonl")])], num_workers=0,
                                 output=CurationOutput(str(tmp_path), "jsonl"))
    assert run_curation(into_inputs)["output"]["records"] == 10
    written = {name: (tmp_path / name).read_bytes() for name in ("part-00000.jsonl", "part-00001.jsonl")}
    with pytest.raises(CurationError, match=rf"sources\[s\]: {tmp_path}/part-00000.jsonl is an input and a file this pipeline writes.*"
                                            r"sources\[s\].paths.*another output.path"):
        run_curation(into_inputs)
    assert sorted(_outputs(tmp_path)) == ["part-00000.jsonl", "part-00001.jsonl", "s0.jsonl", "s1.jsonl"]
    assert {name: (tmp_path / name).read_bytes() for name in written} == written
    two = tmp_path / "two"
    (two / "b").mkdir(parents=True)
    shutil.copyfile(tmp_path / "s0.jsonl", two / "s0.jsonl")
    shutil.copyfile(tmp_path / "s1.jsonl", two / "b" / "s0.jsonl")
    crossed = CurationConfig(sources=[CurationSource("a", [str(two / "b" / "s0.jsonl")]), CurationSource("b", [str(two / "s0.jsonl")])],
                             num_workers=0, output=CurationOutput(str(two), "jsonl", write_to_filename=True))
    with pytest.raises(CurationError, match=rf"sources\[a\]: {two}/b/s0.jsonl is an input and a file this pipeline writes"):
        run_curation(crossed)
    in_place = dataclasses.replace(crossed, sources=crossed.sources[1:], output=CurationOutput(str(two), "jsonl", write_to_filename=True,
                                                                                            source_dirs=False))
    assert run_curation(in_place)["output"]["records"] == 5


def test_intermediates_left_by_a_finished_run_are_removed_when_it_is_run_again_without_keep_intermediate(tmp_path):
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": f"document {i % 3}"}) + "\n" for i in range(9)))
    config = CurationConfig(sources=[CurationSource("s", [str(tmp_path / "s.jsonl")])], stages=[ExactDedup()], num_workers=0,
                            keep_intermediate=True, output=CurationOutput(str(tmp_path / "out"), "jsonl", partitions=2))

    def intermediates() -> list[str]:
        return sorted(os.path.relpath(d, tmp_path / "out") for d, _, files in os.walk(tmp_path / "out" / ".curate")
                      if os.path.basename(d) == "data" and files)

    first = run_curation(config)
    assert len(intermediates()) == 3  # pass-0, pass-1, scatter: as a run killed while it removed them leaves them
    reference = _outputs(tmp_path / "out")
    assert run_curation(dataclasses.replace(config, keep_intermediate=False))["output"] == first["output"]
    assert intermediates() == [] and _outputs(tmp_path / "out") == reference


def test_directories_named_with_spaces_unicode_and_glob_brackets_are_read_and_written_as_named(tmp_path):
    raw = tmp_path / "raw [v1] ü"
    decoy = tmp_path / "raw v ü"  # what "raw [v1] ü" means as a glob
    texts = {}
    for directory, tag in ((raw, "kept"), (decoy, "decoy")):
        directory.mkdir()
        for k in range(2):
            texts[directory, k] = [f"{tag} document {k} {i}" for i in range(3)] + ["the same text in every shard"]
            (directory / f"s{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[directory, k]))
    expected = sorted(dict.fromkeys(texts[raw, 0] + texts[raw, 1]))
    out = tmp_path / "out [1] ü"
    stats = run_curation(CurationConfig(sources=[CurationSource("raw", [str(raw / "s0.jsonl"), str(raw / "s1.jsonl")])],
                                        stages=[ExactDedup()], num_workers=0, output=CurationOutput(str(out), "jsonl", partitions=2)))
    assert stats["output"]["records"] == len(expected)
    assert sorted(r["text"] for p in sorted(out.glob("part-*.jsonl")) for r in _read(p)) == expected
    assert not [d for d, _, _ in os.walk(out / ".curate") if os.path.basename(d) == "data"]  # the intermediates removed
    step = tmp_path / "step [2]"
    DocumentDataset.read_json(str(raw), add_filename=True).to_json(str(step), write_to_filename=True)
    assert {n: [r["text"] for r in _read(step / n)] for n in ("s0.jsonl", "s1.jsonl")} == {f"s{k}.jsonl": texts[raw, k] for k in range(2)}


@pytest.mark.parametrize("where", ["output shard", "statistics"])
def test_a_symlink_where_a_temporary_file_goes_is_refused_by_name_and_its_target_left_alone(tmp_path, where):
    from tokenmix import UnsafeFileError

    (tmp_path / "s.jsonl").write_text('{"text": "one two three"}\n')
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    link = out / "s" / ".s.jsonl.partial" if where == "output shard" else out / "curation_stats.json.partial"
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)
    config = CurationConfig(sources=[CurationSource("s", [str(tmp_path / "s.jsonl")])], num_workers=0,
                            output=CurationOutput(str(out), "jsonl", write_to_filename=True))
    with pytest.raises(UnsafeFileError, match=rf"{link}: the temporary file of a curation is a symbolic link \(to .*\).*Remove the link"):
        run_curation(config)
    assert victim.read_text() == "precious" and link.is_symlink()
    link.unlink()
    link.write_bytes(b"left by a killed run")
    assert run_curation(config)["output"]["records"] == 1
    assert _read(out / "s" / "s.jsonl") == [{"text": "one two three"}] and not link.exists()


def _filter_run_corpus(directory: Path) -> list[dict]:
    """400 documents of about 1 KB; of each 20, one too short, one of over-long words, one of repeated lines."""
    records = []
    for i in range(400):
        words = [f"word{i}x{j}" for j in range(120)]
        if i % 20 == 3:
            words = words[:10]
        elif i % 20 == 7:
            words = [w * 3 for w in words]
        text = " ".join(words) if i % 20 != 11 else "\n".join(["the same line again"] * 60)
        records.append({"text": text, "n": i})
    directory.mkdir()
    (directory / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


_FILTER_RUN = [
    ScoreFilter(_word_filter(50), score_field="words"),
    ScoreFilter(DocumentFilter.get_choice_class("mean_word_length")(min_mean_word_length=3, max_mean_word_length=10)),
    ScoreFilter(DocumentFilter.get_choice_class("repeated_lines")(max_repeated_line_fraction=0.7)),
]


def test_a_run_of_filters_copies_the_batch_once_and_counts_each_filter_in_order(tmp_path):
    """Consecutive score_filter stages mark what they keep and the batch is cut once at the end of the run, not once
    per filter that removes records; the records, the scores written and what each filter removed (in order, a record
    counted by the first filter that removes it) are those of applying the filters one by one."""
    records = _filter_run_corpus(tmp_path / "in")
    dataset = DocumentDataset.read_json(str(tmp_path / "in"))
    pool = pa.default_memory_pool()
    before = pool.total_bytes_allocated()
    bare = list(dataset.iter_batches())
    read_bytes = pool.total_bytes_allocated() - before
    filtered = dataset
    for stage in _FILTER_RUN:
        filtered = stage(filtered)
    before = pool.total_bytes_allocated()
    kept = list(filtered.iter_batches())
    filtering_bytes = pool.total_bytes_allocated() - before - read_bytes
    assert len(bare) == len(kept) == 1
    text_bytes = sum(len(r["text"].encode()) for r in records)
    assert filtering_bytes < 1.5 * text_bytes, (filtering_bytes, text_bytes)

    def kept_by(i: int, record: dict) -> bool:
        words = record["text"].split()
        lines = record["text"].split("\n")
        return [len(words) >= 50, 3 <= sum(map(len, words)) / len(words) <= 10, len(set(lines)) / len(lines) >= 0.7][i]

    expected = [r for r in records if all(kept_by(i, r) for i in range(3))]
    assert [r["n"] for r in kept[0].to_pylist()] == [r["n"] for r in expected]
    assert kept[0].column("words").to_pylist() == [len(r["text"].split()) for r in expected]
    stats = filtered.to_json(str(tmp_path / "out"))
    removed = [s["removed"] for s in stats["stages"]]
    left = records
    for i, stage in enumerate(_FILTER_RUN):
        gone = [r for r in left if not kept_by(i, r)]
        assert removed[i] == ({stage.filter.reason: len(gone)} if gone else {})
        left = [r for r in left if kept_by(i, r)]
    assert _read(tmp_path / "out" / "part-00000.jsonl") == [{**r, "words": len(r["text"].split())} for r in expected]


@pytest.mark.parametrize("write_to_filename", [True, False])
def test_curation_reads_and_writes_s3_paths_with_glob_characters_as_local_ones(s3, tmp_path, write_to_filename):
    """Input and output paths on s3:// holding ``[``, a space, ``+`` and ``%``: fsspec's ``mv`` and ``rm`` take ``[1]``
    for a glob, so publishing an output (or a run's own record) and removing the intermediate records failed with
    FileNotFoundError. The records written are the local run's."""
    import time

    import s3fs
    from s3_server import BUCKET

    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3.endpoint)
    records = [{"text": f"document number {i} " + "word " * (i % 5)} for i in range(40)]
    local_in = tmp_path / "in"
    local_in.mkdir()
    for k in range(2):
        (local_in / f"books_{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[k * 20:(k + 1) * 20]))
    prefix = f"{BUCKET}/curate-{time.time_ns()}/in [1] a+b%20c"
    for name in ("books_00.jsonl", "books_01.jsonl"):
        fs.put(str(local_in / name), f"{prefix}/{name}")
    out = f"s3://{BUCKET}/curate-{time.time_ns()}/out [1] a+b%20c"
    stats = DocumentDataset.read_json(f"s3://{prefix}", add_filename=True).to_json(out, write_to_filename=write_to_filename)
    local = DocumentDataset.read_json(str(local_in), add_filename=True).to_json(str(tmp_path / "out"), write_to_filename=write_to_filename)
    assert stats["output"]["records"] == local["output"]["records"] == 40
    stored = fs.find(out.removeprefix("s3://"), refresh=True)
    assert not [p for p in stored if "/scatter/data/" in p or "/pass-0/data/" in p]  # the intermediate records removed
    written = sorted(p for p in stored if "/.curate/" not in p)
    expected = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file() and ".curate" not in p.parts)
    assert [p.removeprefix(out.removeprefix("s3://") + "/") for p in written] == expected
    for name in (n for n in expected if n.endswith(".jsonl")):  # curation_stats.json names the output path
        assert sorted(fs.cat_file(f"{out.removeprefix('s3://')}/{name}").splitlines()) == sorted((tmp_path / "out" / name).read_bytes().splitlines())



def test_a_failed_curation_task_on_an_s3_path_with_glob_characters_raises_its_own_error_and_leaves_no_partial_file(s3, tmp_path):
    """A task that fails after writing part of its output removes that partial file; on an s3:// path holding ``[``
    the removal matched nothing (fsspec's ``rm`` reads the path as a glob) and the partial file was left behind. The
    task's own error, naming the file and line, is raised."""
    import time

    import s3fs
    from s3_server import BUCKET

    from tokenmix.curate.shard_io import BATCH_BYTES, CurationInputError

    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3.endpoint)
    out = f"{BUCKET}/curate-{time.time_ns()}/out [1]"
    line = json.dumps({"text": "a document of a few words " * 8}) + "\n"
    lines = 2 * BATCH_BYTES // len(line)  # the bad record in a later batch than the first, written already
    (tmp_path / "books_00.jsonl").write_text(line * lines + "{not json\n")
    with pytest.raises(CurationInputError, match=rf"books_00.jsonl, line {lines + 1}: malformed json"):
        DocumentDataset.read_json(str(tmp_path / "books_00.jsonl"), add_filename=True).to_json(f"s3://{out}", write_to_filename=True)
    assert not [p for p in fs.find(out, refresh=True) if p.endswith(".partial")]
