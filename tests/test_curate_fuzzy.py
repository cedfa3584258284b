"""Fuzzy dedup: LSH edges, clusters and removal on hand-built cases; accuracy on planted near-duplicates of the real
corpus (the S-curve, the Jaccard check); the whole recipe through the pipeline."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from curate_kill import curate_until, finished_tasks, run_files
from helpers import DEMO_CORPUS, read_jsonl_zst
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix.curate import AddId, CurationConfig, CurationOutput, CurationSource, run_curation
from tokenmix.curate.components import Components, DocRanges, RangeWriters, find_components, scatter_by_range
from tokenmix.curate.dedup_policy import pack, removals, unpack
from tokenmix.curate.fuzzy_dedup import FuzzyDedup, band_hashes, bucket_edges
from tokenmix.curate.minhash import MinHashConfig, candidate_probability, jaccard, signatures


def test_bucket_members_join_their_first_only_and_a_pair_in_two_bands_counts_once():
    bands = np.array([0, 0, 0, 0, 1, 1, 1, 0], dtype=np.int16)
    hashes = np.array([5, 5, 5, 5, 5, 5, 9, 7], dtype=np.uint64)
    docs = np.array([40, 10, 30, 20, 30, 10, 50, 60], dtype=np.int64)
    edges = bucket_edges(bands, hashes, docs)
    assert edges.tolist() == [[10, 20], [10, 30], [10, 40]]
    big = bucket_edges(np.zeros(10_000, dtype=np.int16), np.zeros(10_000, dtype=np.uint64), np.arange(10_000, dtype=np.int64))
    assert len(big) == 9_999 and (big[:, 0] == 0).all()


def _components_of(edges: np.ndarray, ranges: DocRanges, out) -> tuple[Components, dict[int, int]]:
    """``find_components`` over ``edges`` written as adjacency files by range, its tasks run in this process: what it
    found, and each node's label."""
    writers = RangeWriters(str(out / "adjacency"), 0)
    both = np.concatenate([edges, edges[:, ::-1]])
    scatter_by_range({"node": both[:, 0], "neighbor": both[:, 1]}, both[:, 0], ranges, writers)
    written = writers.close()
    adjacency = [[str(out / "adjacency" / f"00000-{q:05d}.parquet")] if str(q) in written else [] for q in range(len(ranges))]
    found = find_components(ranges, adjacency, str(out / "components"), lambda fn, tasks, stats, label: [fn(t) for t in tasks])
    labels = {}
    for url in found.labels_urls:
        table = pq.read_table(url)
        labels.update(zip(table.column("node").to_pylist(), table.column("label").to_pylist(), strict=True))
    return found, labels


def test_components_found_range_by_range_join_chains_across_ranges_and_number_clusters_by_their_first_document(tmp_path):
    edges = np.array([[7, 9], [1, 3], [3, 5], [9, 11], [2, 11]], dtype=np.int64)
    ranges = DocRanges((0, 4, 8))
    found, labels = _components_of(edges, ranges, tmp_path)
    assert labels == {1: 1, 3: 1, 5: 1, 2: 2, 7: 2, 9: 2, 11: 2}
    assert found.rounds >= 2, "the label of 2 reaches 7 only through 11 and 9, in ranges of their own"
    assert found.first_cluster == [0, 2, 2]
    members = pq.read_table(found.member_urls[0]).to_pydict()
    assert sorted(zip(members["doc"], members["root"], strict=True)) == sorted(labels.items())
    assert found.member_urls[1] == [] and found.member_urls[2] == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)), max_size=80),
       st.lists(st.integers(1, 59), max_size=6, unique=True))
def test_components_range_by_range_equal_scipy_connected_components(tmp_path_factory, pairs, cuts):
    """The labels found range by range, in rounds of messages between ranges, are the components scipy's
    ``connected_components`` finds on the whole graph held in one process (the oracle the driver used before)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    out = tmp_path_factory.mktemp("components")
    edges = np.array([p for p in pairs if p[0] != p[1]], dtype=np.int64).reshape(-1, 2)
    ranges = DocRanges((0, *sorted(cuts)))
    found, labels = _components_of(edges, ranges, out)
    nodes = np.unique(edges)
    assert sorted(labels) == nodes.tolist()
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(60, 60))
    _, oracle = connected_components(graph, directed=False)
    least = {}
    for node in nodes.tolist():
        least.setdefault(int(oracle[node]), node)
    assert labels == {node: least[int(oracle[node])] for node in nodes.tolist()}


def test_cross_source_removal_keeps_the_top_ranked_source_and_internal_duplicates():
    # tasks 0, 1 belong to source rank 0; task 2 to rank 1; task 3 to rank 2
    rank_of_task = np.array([0, 0, 1, 2])
    nodes = pack(np.array([0, 1, 2, 3, 2, 2, 3, 3, 3]), np.array([0, 4, 1, 2, 7, 8, 5, 6, 9]))
    clusters = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])
    removed = removals(nodes, clusters, rank_of_task, "cross_source")
    # cluster 0: two copies in the top source are kept (an internal duplicate), ranks 1 and 2 removed;
    # cluster 1: rank 1 keeps both its copies, rank 2 loses its one; cluster 2: one source only, nothing removed
    assert removed.tolist() == [False, False, True, True, False, False, True, False, False]
    one = removals(nodes, clusters, rank_of_task, "one_per_cluster")
    assert one.tolist() == [False, True, True, True, False, True, True, False, True]
    tasks, rows = unpack(nodes)
    assert tasks.tolist() == [0, 1, 2, 3, 2, 2, 3, 3, 3] and rows.tolist() == [0, 4, 1, 2, 7, 8, 5, 6, 9]


def test_equal_bands_hash_equal_and_different_bands_differ():
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 2**61, size=(3, 128), dtype=np.uint64)
    sigs[1, :16] = sigs[0, :16]
    h = band_hashes(sigs, 8, 16)
    assert h.shape == (3, 8) and h[0, 0] == h[1, 0] and (h[0, 1:] != h[1, 1:]).all() and (h[2] != h[0]).all()


def _edit(text: str, changes: int, rng: random.Random) -> str:
    """``text`` with ``changes`` characters replaced at evenly spread places."""
    chars = list(text)
    step = max(1, len(chars) // max(changes, 1))
    for i in range(changes):
        at = min(len(chars) - 1, i * step + rng.randrange(step))
        chars[at] = "#" if chars[at] != "#" else "%"
    return "".join(chars)


@pytest.fixture(scope="module")
def planted_pairs():
    """Pairs of (document, edited copy) from the real corpus at similarities spread over 0.3 .. 0.98, with their
    exact character 25-gram Jaccard."""
    rng = random.Random(1)
    docs = [r["text"] for s in ("linux_doc", "python_doc", "webster") for i in range(2)
            for r in read_jsonl_zst(DEMO_CORPUS / s / f"train-0{i}-of-02.jsonl.zst") if len(r["text"]) >= 1500]
    config = MinHashConfig()
    pairs = []
    for k in range(1200):
        base = docs[k % len(docs)][:1500]
        target = rng.uniform(0.3, 0.98)
        changes = max(1, round(len(base) * (1 - target) / (25 * (1 + target))))
        copy = _edit(base, changes, rng)
        pairs.append((base, copy, jaccard(base, copy, config)))
    return pairs


def test_candidate_rate_follows_the_lsh_s_curve(planted_pairs):
    config = MinHashConfig()
    bands, rows = 8, 16
    left = signatures(pa.array([a for a, _, _ in planted_pairs]), config)[0]
    right = signatures(pa.array([b for _, b, _ in planted_pairs]), config)[0]
    candidate = (band_hashes(left, bands, rows) == band_hashes(right, bands, rows)).any(axis=1)
    similarity = np.array([s for _, _, s in planted_pairs])
    checked = 0
    for low in np.arange(0.3, 1.0, 0.1):
        mine = (similarity >= low) & (similarity < low + 0.1)
        if mine.sum() < 30:
            continue
        expected = np.array([candidate_probability(s, bands, rows) for s in similarity[mine]])
        mean = expected.mean()
        sigma = np.sqrt((expected * (1 - expected)).sum()) / mine.sum()
        measured = candidate[mine].mean()
        assert abs(measured - mean) <= 4 * sigma + 0.02, f"similarity {low:.1f}-{low + 0.1:.1f}: {measured:.3f} vs {mean:.3f}"
        checked += 1
    assert checked >= 5
    assert candidate[similarity < 0.6].mean() < 0.02 and candidate[similarity > 0.95].mean() > 0.95


def _write_source(path, texts):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def test_the_jaccard_check_merges_no_pair_below_its_threshold(planted_pairs, tmp_path):
    low = [(a, b) for a, b, s in planted_pairs if 0.2 <= s < 0.45][:60]
    high = [(a, b) for a, b, s in planted_pairs if s >= 0.9][:30]
    assert len(low) >= 30
    _write_source(tmp_path / "a" / "s.jsonl", [a for a, _ in low + high])
    _write_source(tmp_path / "b" / "s.jsonl", [b for _, b in low + high])
    sources = [CurationSource("a", [str(tmp_path / "a" / "s.jsonl")]), CurationSource("b", [str(tmp_path / "b" / "s.jsonl")])]
    loose = dict(bands=32, rows=4)  # threshold about 0.42: pairs near 0.3-0.45 do become candidates
    merged = {}
    for check in (False, True):
        stage = FuzzyDedup(jaccard_check=check, jaccard_threshold=0.5, **loose)
        stats = run_curation(CurationConfig(sources=sources, stages=[AddId(), stage], num_workers=0,
                                            output=CurationOutput(str(tmp_path / f"out-{check}"), "jsonl", write_to_filename=True)))
        kept_b = {json.loads(line)["text"] for line in open(tmp_path / f"out-{check}" / "b" / "s.jsonl")}
        merged[check] = [b for _, b in low if b not in kept_b], [b for _, b in high if b not in kept_b]
        assert stats["accounted"]
    assert len(merged[False][0]) > 0, "the loose LSH must propose low-similarity pairs, or the check is not tested"
    assert merged[True][0] == []
    assert len(merged[True][1]) == len(high)


def test_the_zyda2_recipe_removes_cross_source_duplicates_by_rank(tmp_path):
    rng = random.Random(3)
    texts = {s: [r["text"] for r in read_jsonl_zst(DEMO_CORPUS / s / "train-00-of-02.jsonl.zst") if len(r["text"]) > 500][:40]
             for s in ("linux_doc", "python_doc", "webster")}
    near = lambda t: _edit(t, max(1, len(t) // 2000), rng)  # noqa: E731  (about 99% similar)
    high = texts["linux_doc"]
    mid = texts["python_doc"] + [near(high[0]), near(high[1])] + [texts["python_doc"][3]]   # 2 cross-source, 1 internal
    low = texts["webster"] + [near(high[0]), near(texts["python_doc"][5])]
    for name, docs in (("high", high), ("mid", mid), ("low", low)):
        _write_source(tmp_path / name / "s.jsonl", docs)
    sources = [CurationSource(n, [str(tmp_path / n / "s.jsonl")]) for n in ("high", "mid", "low")]
    stats = run_curation(CurationConfig(sources=sources, stages=[AddId(), FuzzyDedup()], num_workers=0,
                                        output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True)))
    kept = {n: [json.loads(line)["text"] for line in open(tmp_path / "out" / n / "s.jsonl")] for n in ("high", "mid", "low")}
    assert kept["high"] == high
    assert kept["mid"] == texts["python_doc"] + [texts["python_doc"][3]], "cross-source copies go, the internal duplicate stays"
    assert kept["low"] == texts["webster"]
    fuzzy = stats["stages"][1]
    assert fuzzy["removed"] == {"fuzzy_duplicate": 4}
    assert fuzzy["fuzzy_dedup"]["removed_by_source"] == {"mid": 2, "low": 2}
    assert fuzzy["fuzzy_dedup"]["clusters_by_sources"]["high+low+mid"] == 1
    assert stats["accounted"]
    work = tmp_path / "out" / ".curate"
    clusters = [os.path.join(r, d) for r, ds, _ in os.walk(work) for d in ds if d == "clusters.parquet"]
    assert len(clusters) == 1 and len(pq.read_table(clusters[0])) == 9


def test_the_bundled_zyda2_pipeline_runs(tmp_path):
    from helpers import REPO

    from tokenmix.curate import load_curation_config

    config = load_curation_config(REPO / "config" / "curation" / "zyda2.yaml", ["--output.path", str(tmp_path / "out"), "--num_workers", "0"])
    config = CurationConfig(**{**config.__dict__,
                               "sources": [CurationSource(s.name, [str(REPO / p) for p in s.paths]) for s in config.sources]})
    stats = run_curation(config)
    assert stats["accounted"] and stats["output"]["records"] > 0
    assert "fuzzy_dedup" in stats["stages"][1] and stats["stages"][1]["stage"] == "fuzzy_dedup"


def test_per_cluster_source_counts_are_written(tmp_path):
    text = " ".join(f"word{i}" for i in range(400))
    _write_source(tmp_path / "x" / "s.jsonl", [text, text, "something else entirely " * 20])
    _write_source(tmp_path / "y" / "s.jsonl", [text])
    sources = [CurationSource("x", [str(tmp_path / "x" / "s.jsonl")]), CurationSource("y", [str(tmp_path / "y" / "s.jsonl")])]
    stats = run_curation(CurationConfig(sources=sources, stages=[FuzzyDedup()], num_workers=0, keep_intermediate=True,
                                        output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True)))
    counts = [os.path.join(r, d) for r, ds, _ in os.walk(tmp_path / "out" / ".curate") for d in ds if d == "cluster_counts.parquet"]
    assert pq.read_table(counts[0]).to_pylist() == [{"cluster": 0, "source": "x", "documents": 2}, {"cluster": 0, "source": "y", "documents": 1}]
    assert stats["stages"][0]["fuzzy_dedup"]["removed_by_source"] == {"y": 1} and stats["output"]["records"] == 3


def _chained_sources(root) -> list[CurationSource]:
    """Three sources of two shards each from the real corpus, with near-copies across and inside sources, and chains
    (a copy of a copy) whose ends share fewer bands than either link."""
    rng = random.Random(5)
    texts = {s: [r["text"] for r in read_jsonl_zst(DEMO_CORPUS / s / "train-00-of-02.jsonl.zst") if len(r["text"]) > 500][:30]
             for s in ("linux_doc", "python_doc", "webster")}
    near = lambda t: _edit(t, max(1, len(t) // 1500), rng)  # noqa: E731
    high, mid, low = texts["linux_doc"], list(texts["python_doc"]), list(texts["webster"])
    for i in range(0, 12, 2):
        first = near(high[i])
        mid.insert(3 * i % len(mid), first)
        low.insert(5 * i % len(low), near(first))
    mid.append(mid[7])
    low += [near(mid[2]), near(mid[2])]
    sources = []
    for name, docs in (("high", high), ("mid", mid), ("low", low)):
        half = len(docs) // 2
        _write_source(root / name / "a.jsonl", docs[:half])
        _write_source(root / name / "b.jsonl", docs[half:])
        sources.append(CurationSource(name, [str(root / name / "a.jsonl"), str(root / name / "b.jsonl")]))
    return sources


def _decision_files(out, name: str) -> pa.Table:
    found = [os.path.join(r, d) for r, ds, _ in os.walk(out / ".curate") for d in ds if d == name]
    assert len(found) == 1
    table = pq.read_table(found[0])
    return table.sort_by([(table.column_names[0], "ascending"), (table.column_names[1], "ascending")])


@pytest.mark.parametrize("policy", ["cross_source", "one_per_cluster"])
def test_buckets_and_edges_too_large_for_memory_give_the_same_clusters_and_output_within_the_bound(tmp_path, policy):
    sources = _chained_sources(tmp_path)
    runs = {}
    for memory in (1 << 30, 8192):
        out = tmp_path / f"out-{memory}"
        stats = run_curation(CurationConfig(sources=sources, stages=[AddId(), FuzzyDedup(policy=policy, memory_bytes=memory)], num_workers=0,
                                            keep_intermediate=True, output=CurationOutput(str(out), "jsonl", write_to_filename=True)))
        files = {os.path.relpath(os.path.join(r, f), out): open(os.path.join(r, f), "rb").read()
                 for r, _, fs in os.walk(out) if ".curate" not in r for f in fs if f != "curation_stats.json"}
        decision = dict(stats["stages"][1]["fuzzy_dedup"])
        for per_partition in ("candidate_pairs", "edges"):  # a pair whose bands fall in two partitions is found in each
            decision.pop(per_partition)
        runs[memory] = (files, decision.pop("bounds"), decision, _decision_files(out, "clusters.parquet"),
                        _decision_files(out, "cluster_counts.parquet"), stats["stages"][1]["removed"])
    (files, unbounded, *decided), (tiny_files, bounds, *tiny_decided) = runs[1 << 30], runs[8192]
    assert tiny_files == files and len(files) == 6
    assert tiny_decided == decided
    assert decided[0]["clusters"] >= 8 and decided[-1]["fuzzy_duplicate"] >= 12
    assert unbounded["partitions"] == 1 and unbounded["ranges"] == 1
    assert bounds["partitions"] > 8 and bounds["ranges"] >= 3 and bounds["rounds"] >= 2
    assert bounds["max_task_bytes"] <= 8192 < unbounded["max_task_bytes"]


def test_a_bucket_larger_than_the_memory_bound_is_refused_naming_the_setting(tmp_path):
    from tokenmix.curate.pipeline_config import CurationError

    text = " ".join(f"word{i}" for i in range(300))
    _write_source(tmp_path / "x" / "s.jsonl", [text] * 60 + [f"other {i} " * 40 for i in range(20)])
    config = CurationConfig(sources=[CurationSource("x", [str(tmp_path / "x" / "s.jsonl")])], stages=[FuzzyDedup(memory_bytes=1024)],
                            num_workers=0, output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True))
    with pytest.raises(CurationError, match=r"fuzzy_dedup.memory_bytes \(1,024\) cannot hold LSH partition \d+: \d+ bucket entries .*"
                                            r"one text copied many times.*raise fuzzy_dedup.memory_bytes$"):
        run_curation(config)


def _edge_stats(out) -> list[dict]:
    """Each edges task's statistics (one per LSH partition)."""
    return [json.loads(p.read_text()) for p in sorted(out.glob(".curate/*/pass-0/fuzzy/edges/stats/*.json"))]


def test_the_jaccard_check_within_a_small_memory_bound_reads_texts_in_groups_and_gives_the_same_clusters_and_output(tmp_path):
    sources = _chained_sources(tmp_path)
    runs = {}
    for memory in (1 << 30, 512 << 10):
        out = tmp_path / f"out-{memory}"
        stage = FuzzyDedup(jaccard_check=True, jaccard_threshold=0.95, memory_bytes=memory)
        stats = run_curation(CurationConfig(sources=sources, stages=[AddId(), stage],
                                            num_workers=0, keep_intermediate=True, output=CurationOutput(str(out), "jsonl", write_to_filename=True)))
        files = {os.path.relpath(os.path.join(r, f), out): open(os.path.join(r, f), "rb").read()
                 for r, _, fs in os.walk(out) if ".curate" not in r for f in fs if f != "curation_stats.json"}
        decision = dict(stats["stages"][1]["fuzzy_dedup"])
        for per_partition in ("candidate_pairs", "edges"):
            decision.pop(per_partition)
        runs[memory] = (files, decision.pop("bounds"), _edge_stats(out), decision, _decision_files(out, "clusters.parquet"),
                        _decision_files(out, "cluster_counts.parquet"), stats["stages"][1]["removed"])
    (files, _, whole, *decided), (small_files, bounds, grouped, *small_decided) = runs[1 << 30], runs[512 << 10]
    assert small_files == files and small_decided == decided
    assert decided[0]["clusters"] >= 8
    assert 0 < sum(s["edges"] for s in grouped) == sum(s["edges"] for s in whole) < sum(s["candidates"] for s in whole), \
        "the check must drop some candidates and keep others, or the grouping is not tested"
    assert [s["check"]["groups"] for s in whole] == [1] and whole[0]["check"]["chunks"] == 1
    groups = sum(s["check"]["groups"] for s in grouped)
    assert groups > len(grouped) and sum(s["check"]["chunks"] for s in grouped) > groups
    assert all(0 < s["check"]["held_bytes"] and s["held_bytes"] <= 512 << 10 for s in grouped if s["candidates"])
    assert bounds["max_task_bytes"] <= 512 << 10 < whole[0]["held_bytes"]


def test_a_pair_too_large_for_the_jaccard_checks_share_of_memory_is_refused_naming_the_setting(tmp_path):
    from tokenmix.curate.pipeline_config import CurationError

    sources = _chained_sources(tmp_path)
    config = CurationConfig(sources=sources, stages=[AddId(), FuzzyDedup(jaccard_check=True, memory_bytes=16 << 10)], num_workers=0,
                            output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True))
    with pytest.raises(CurationError, match=r"^fuzzy_dedup.memory_bytes leaves [\d,]+ bytes to the jaccard_check of LSH partition \d+ .*"
                                            r"row \d+ of \S+ \([\d,]+ characters\) needs [\d,]+ bytes for its text and shingle set; "
                                            r"raise fuzzy_dedup.memory_bytes$"):
        run_curation(config)


STAGE_DIRS = {"signatures": ["pass-0/stats"], "buckets": ["pass-0/fuzzy/lsh/stats"], "edges": ["pass-0/fuzzy/edges/stats"],
              "components": ["pass-0/fuzzy/components"], "removal": ["pass-0/fuzzy/clusters/stats", "pass-0/fuzzy/removed/stats"]}
"""Where each step of fuzzy dedup records its finished tasks (``.json``), below the run's work directory."""


def _finished_tasks(out, stage: str) -> int:
    return len(finished_tasks(out, STAGE_DIRS[stage]))


def _curate_until(config_path, out, stage: str) -> bool:
    """Run the curation until ``stage`` has finished a task, then SIGKILL it and its workers; whether it ended first."""
    return curate_until(config_path, out, lambda: _finished_tasks(out, stage) >= 1, f"a finished task of {stage}")


@pytest.mark.slow
def test_a_kill_in_each_step_of_fuzzy_dedup_resumes_to_identical_output_and_decisions(tmp_path):
    import subprocess
    import sys

    import yaml
    from helpers import REPO

    from tokenmix.curate.pipeline import describe

    sources = []
    for source in _chained_sources(tmp_path / "corpus"):
        docs = [line for path in source.paths for line in open(path)]
        paths = []
        for k in range(5):
            (tmp_path / source.name / f"{k}.jsonl").parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / source.name / f"{k}.jsonl").write_text("".join(docs[k::5]))
            paths.append(str(tmp_path / source.name / f"{k}.jsonl"))
        sources.append(CurationSource(source.name, paths))
    config = CurationConfig(sources=sources, stages=[AddId(), FuzzyDedup(memory_bytes=8192)], num_workers=1,
                            output=CurationOutput(str(tmp_path / "unused"), "jsonl", write_to_filename=True))
    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(describe(config)))

    def curate(out):
        done = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(config_path), "--output.path", str(out)],
                              cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]

    def everything(out):
        """The outputs and the decision's files."""
        return run_files(out, (".jsonl", ".parquet"))

    curate(tmp_path / "reference")
    tasks = {stage: _finished_tasks(tmp_path / "reference", stage) for stage in STAGE_DIRS}
    assert min(tasks.values()) >= 8, tasks
    out = tmp_path / "killed"
    landed = {}
    for stage in STAGE_DIRS:
        assert not _curate_until(config_path, out, stage), f"the run ended before it was killed in {stage}"
        landed[stage] = _finished_tasks(out, stage)
    curate(out)
    print("finished tasks of each step at its kill", landed, "of", tasks)
    assert all(landed[stage] < tasks[stage] for stage in STAGE_DIRS), f"a kill landed after its step: {landed} of {tasks}"
    assert everything(out) == everything(tmp_path / "reference")
    assert not [f for _, _, files in os.walk(out) for f in files if f.endswith(".partial")]
    first = sorted(p for p in everything(out) if p.endswith(".jsonl"))[0]
    os.remove(out / first)
    curate(out)
    assert everything(out) == everything(tmp_path / "reference")
