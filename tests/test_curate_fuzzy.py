"""Fuzzy dedup: LSH edges, clusters and removal on hand-built cases; accuracy on planted near-duplicates of the real
corpus (the S-curve, the Jaccard check); the whole recipe through the pipeline."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pyarrow as pa
import pytest
from helpers import DEMO_CORPUS, read_jsonl_zst

from tokenmix.curate import AddId, CurationConfig, CurationOutput, CurationSource, run_curation
from tokenmix.curate.fuzzy_dedup import FuzzyDedup, band_hashes, bucket_edges, components, pack, removals, unpack
from tokenmix.curate.minhash import MinHashConfig, candidate_probability, jaccard, signatures


def test_bucket_members_join_their_first_only_and_a_pair_in_two_bands_counts_once():
    bands = np.array([0, 0, 0, 0, 1, 1, 1, 0], dtype=np.int16)
    hashes = np.array([5, 5, 5, 5, 5, 5, 9, 7], dtype=np.uint64)
    docs = np.array([40, 10, 30, 20, 30, 10, 50, 60], dtype=np.int64)
    edges = bucket_edges(bands, hashes, docs)
    assert edges.tolist() == [[10, 20], [10, 30], [10, 40]]
    big = bucket_edges(np.zeros(10_000, dtype=np.int16), np.zeros(10_000, dtype=np.uint64), np.arange(10_000, dtype=np.int64))
    assert len(big) == 9_999 and (big[:, 0] == 0).all()


def test_components_join_chains_and_number_clusters_by_their_first_document():
    edges = np.array([[7, 9], [1, 3], [3, 5], [9, 11]], dtype=np.int64)
    nodes, clusters = components(edges)
    assert nodes.tolist() == [1, 3, 5, 7, 9, 11]
    assert clusters.tolist() == [0, 0, 0, 1, 1, 1]


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
    clusters = [os.path.join(r, f) for r, _, fs in os.walk(work) for f in fs if f == "clusters.parquet"]
    assert len(clusters) == 1


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
    import pyarrow.parquet as pq

    text = " ".join(f"word{i}" for i in range(400))
    _write_source(tmp_path / "x" / "s.jsonl", [text, text, "something else entirely " * 20])
    _write_source(tmp_path / "y" / "s.jsonl", [text])
    sources = [CurationSource("x", [str(tmp_path / "x" / "s.jsonl")]), CurationSource("y", [str(tmp_path / "y" / "s.jsonl")])]
    stats = run_curation(CurationConfig(sources=sources, stages=[FuzzyDedup()], num_workers=0, keep_intermediate=True,
                                        output=CurationOutput(str(tmp_path / "out"), "jsonl", write_to_filename=True)))
    counts = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "out" / ".curate") for f in fs if f == "cluster_counts.parquet"]
    assert pq.read_table(counts[0]).to_pylist() == [{"cluster": 0, "source": "x", "documents": 2}, {"cluster": 0, "source": "y", "documents": 1}]
    assert stats["stages"][0]["fuzzy_dedup"]["removed_by_source"] == {"y": 1} and stats["output"]["records"] == 3
