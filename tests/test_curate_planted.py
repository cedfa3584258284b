"""The planted corpus (``tokenmix.curate.planted``): copies land at the similarity their band says, measured against
the exact shingle Jaccard of ``minhash.jaccard``; the natural clusters are those of an all-pairs check; the truth file
names every written document and puts every pair at or above the threshold in one cluster; pair scores count pairs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import DEMO_CORPUS, read_jsonl_zst
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix.curate.minhash import MinHashConfig, jaccard, shingle_sets
from tokenmix.curate.planted import PlantConfig, edit_to_band, natural_clusters, pair_scores, plant

SOURCES = ("linux_doc", "python_doc", "webster")
CONFIG = MinHashConfig()


@pytest.fixture(scope="module")
def demo_texts() -> list[str]:
    return [r["text"] for s in SOURCES for r in read_jsonl_zst(DEMO_CORPUS / s / "train-00-of-02.jsonl.zst")]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), above=st.booleans(), start=st.integers(0, 10_000), length=st.integers(0, 4000),
       low=st.floats(0.0, 0.8), width=st.floats(0.05, 0.2))
def test_a_copy_lands_in_its_band_at_the_exact_jaccard_it_reports(demo_texts, data, above, start, length, low, width):
    """Whatever the text (a slice of a real one, shorter than a shingle), the copy's reported Jaccard is the exact one,
    and it is on its band's side of the threshold; inside the band wherever one typo (which moves the Jaccard by at most
    ``2 * ngram / len(base)``) cannot step over half of it. An empty text is
    copied as it is, at Jaccard 0, as ``minhash.jaccard`` has it."""
    text = data.draw(st.sampled_from(demo_texts))[start:start + length]
    band = (round(low + 0.15, 3), 1.0) if above else (round(low * 0.8, 3), round(low * 0.8 + width, 3))
    base = shingle_sets([text], CONFIG)[0]
    copy, similarity, shingles = edit_to_band(text, base, band, above, np.random.default_rng(data.draw(st.integers(0, 2**32))), CONFIG)
    assert similarity == jaccard(copy, text, CONFIG)
    assert np.array_equal(shingles, shingle_sets([copy], CONFIG)[0])
    if not text:
        assert copy == text and similarity == 0.0
    elif above:
        assert similarity >= band[0]
    else:
        assert similarity <= band[1]
    if (band[1] - band[0]) * len(base) >= 4 * CONFIG.ngram:  # one typo moves the Jaccard by at most 2 * ngram / len(base)
        assert band[0] <= similarity <= band[1]


def _components(n: int, pairs: list[tuple[int, int]]) -> list[int]:
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        parent[max(root(a), root(b))] = min(root(a), root(b))
    return [root(x) for x in range(n)]


def test_natural_clusters_are_the_components_of_every_pair_at_the_threshold(demo_texts):
    """Real texts with edited copies of some, some copies exact, some short texts alike: the same clusters as
    comparing every pair with ``minhash.jaccard``."""
    rng = np.random.default_rng(3)
    texts = [t[:1500] for t in demo_texts[:40]]
    texts += [texts[i] for i in (1, 2)] + ["short text", "short text", "", "x" * 30, "x" * 31]
    for i, j in ((0.95, 3), (0.86, 5), (0.84, 7), (0.9, 7), (0.5, 9)):
        base = shingle_sets([texts[j]], CONFIG)[0]
        texts.append(edit_to_band(texts[j], base, (i - 0.01, i + 0.01), True, rng, CONFIG)[0])
    brute = _components(len(texts), [(a, b) for a, b in itertools.combinations(range(len(texts)), 2)
                                     if jaccard(texts[a], texts[b], CONFIG) >= 0.85])
    assert natural_clusters(shingle_sets(texts, CONFIG), 0.85).tolist() == brute
    assert len(set(brute)) < len(texts) - 4


@settings(max_examples=200, deadline=None)
@given(truth=st.lists(st.integers(0, 5), min_size=0, max_size=30), data=st.data())
def test_pair_scores_count_pairs(truth, data):
    found = data.draw(st.lists(st.integers(0, 5), min_size=len(truth), max_size=len(truth)))
    pairs = list(itertools.combinations(range(len(truth)), 2))
    same_found = [p for p in pairs if found[p[0]] == found[p[1]]]
    same_true = [p for p in pairs if truth[p[0]] == truth[p[1]]]
    both = [p for p in same_found if truth[p[0]] == truth[p[1]]]
    precision, recall = pair_scores(np.array(truth, dtype=np.int64).reshape(-1), np.array(found, dtype=np.int64).reshape(-1))
    assert precision == (len(both) / len(same_found) if same_found else 1.0)
    assert recall == (len(both) / len(same_true) if same_true else 1.0)


def _small_corpus(root: Path, demo_texts: list[str]) -> dict[str, list[str]]:
    """Two shards per source of real texts cut to at most 2,000 characters, one text repeated across sources."""
    sources = {}
    for k, source in enumerate(SOURCES):
        (root / source).mkdir(parents=True)
        sources[source] = []
        for shard in range(2):
            texts = [t[:2000] for t in demo_texts[k * 20 + shard * 8: k * 20 + shard * 8 + 8]] + [demo_texts[0][:2000]]
            path = root / source / f"part-{shard}.jsonl.zst"
            path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(orjson.dumps({"text": t, "n": i}) + b"\n"
                                                                           for i, t in enumerate(texts))))
            sources[source].append(str(path))
    return sources


def _written(out: Path) -> dict[tuple[str, str, int], dict]:
    records = {}
    for path in sorted(out.glob("*/*.jsonl.zst")):
        for row, line in enumerate(zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read().splitlines()):
            records[(path.parent.name, path.name, row)] = json.loads(line)
    return records


@pytest.mark.slow
def test_the_truth_names_every_document_and_holds_every_pair_at_the_threshold(tmp_path, demo_texts):
    """A planted corpus, 4 copies: round 0 is the input byte for byte; every written document has one truth row and
    every truth row one document, its base's fields kept; each copy's recorded Jaccard with its base is the exact
    one, on its band's side; every pair of documents at or above the threshold (all pairs checked) is in one truth
    cluster; the original written three times is one natural cluster; two workers write the same bytes."""
    sources = _small_corpus(tmp_path / "in", demo_texts)
    config = PlantConfig(copies=4, seed=7, shard_documents=10)
    summary = plant(sources, str(tmp_path / "out"), config)
    out = tmp_path / "out"
    for source, paths in sources.items():
        for path in paths:
            assert (out / source / Path(path).name).read_bytes() == Path(path).read_bytes()
    truth = pq.read_table(out / "truth.parquet").to_pylist()
    records = _written(out)
    assert sorted((t["source"], t["shard"], t["row"]) for t in truth) == sorted(records)
    assert summary.documents == len(truth) == 4 * 54 and summary.natural_clusters == 1
    by_doc = {t["doc"]: t for t in truth}
    text = {t["doc"]: records[(t["source"], t["shard"], t["row"])]["text"] for t in truth}
    assert {t["kind"] for t in truth} == {"original", "duplicate", "variant"}
    for t in truth:
        base = by_doc[t["base"]]
        assert records[(t["source"], t["shard"], t["row"])]["n"] == records[(base["source"], base["shard"], base["row"])]["n"]
        if t["kind"] != "original":
            assert t["jaccard"] == jaccard(text[t["doc"]], text[t["base"]], CONFIG)
            assert t["jaccard"] >= config.duplicate_band[0] if t["kind"] == "duplicate" else t["jaccard"] <= config.variant_band[1]
            assert t["cluster"] == (by_doc[t["base"]]["cluster"] if t["kind"] == "duplicate" else t["doc"])
    docs = sorted(text)
    sets = shingle_sets([text[d] for d in docs], CONFIG)
    for a, b in itertools.combinations(range(len(docs)), 2):
        if len(sets[a]) and len(sets[b]) and len(np.intersect1d(sets[a], sets[b])) / len(np.union1d(sets[a], sets[b])) >= config.threshold:
            assert by_doc[docs[a]]["cluster"] == by_doc[docs[b]]["cluster"], (docs[a], docs[b])
    originals = [t for t in truth if t["kind"] == "original" and text[t["doc"]] == demo_texts[0][:2000]]
    assert len({t["cluster"] for t in originals}) == 1 and len(originals) == 7
    plant(sources, str(tmp_path / "again"), PlantConfig(copies=4, seed=7, shard_documents=10, workers=2))
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == \
        {p.relative_to(tmp_path / "again"): p.read_bytes() for p in (tmp_path / "again").rglob("*") if p.is_file()}


def test_a_line_that_is_no_document_is_refused_by_file_and_line(tmp_path):
    path = tmp_path / "a.jsonl"
    for second in ('{"text": 2}', '{"text": "cut'):
        path.write_text('{"text": "one"}\n' + second + '\n')
        with pytest.raises(ValueError, match=r"a.jsonl, line 2: not a JSON object with a string 'text'"):
            plant({"a": [str(path)]}, str(tmp_path / "out"), PlantConfig(copies=2))


def test_bands_must_lie_on_either_side_of_the_threshold():
    with pytest.raises(ValueError, match="bands must lie on either side of threshold 0.85"):
        PlantConfig(duplicate_band=(0.8, 1.0))
