"""MinHash signatures for fuzzy dedup: equal to a slow plain-Python reference (its own shingling, hashing and
``(a * x + b) % p`` on Python ints) on real and tricky texts, for character and word shingles, 32 and 64 bits; the
same whichever batch a document is in; agreement rates that estimate the shingles' Jaccard similarity on real
documents edited to known similarity; short and empty documents; memory bounded on one long document; config
validation; and the LSH threshold formulas (hypothesis)."""

from __future__ import annotations

import json
import math
import random
import tracemalloc
from pathlib import Path

import draccus
import numpy as np
import orjson
import pyarrow as pa
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import tokenmix.curate.minhash as minhash
from tokenmix.curate.minhash import MinHashConfig, candidate_probability, jaccard, lsh_threshold, permutations, signatures

REPO = Path(__file__).resolve().parents[1]
P = (1 << 61) - 1
MASK64 = (1 << 64) - 1

TRICKY = [
    "",
    None,
    "short",
    "a" * 24,
    "b" * 25,
    " \t\n\u2003 ",
    "naïve café résumé — “quotes” and ‘more’ " * 2,
    "emoji 😀🎉👩\u200d👩\u200d👧 and CJK 中文字符测试 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 outside the BMP " * 2,
    "e\u0301 combining marks e\u0301 stay separate code points e\u0301\u0301\u0301 !" * 2,
    "nul \x00 and controls \x1c\x1d\x1e\x1f split words? \x85 and\u00a0nbsp\u2028line sep",
    "one two  three\u3000four\nfive\tsix seven eight nine ten eleven",
    "x",
    "\U0010ffff" * 30,
]


def corpus_texts(source: str, limit: int) -> list[str]:
    shared = REPO.parent / "shared" / "corpus" / source
    paths = sorted(shared.glob("*.jsonl.zst")) or sorted((REPO / "data" / "demo" / source).glob("*.jsonl.zst"))
    texts: list[str] = []
    for path in paths:
        with open(path, "rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
        texts += [orjson.loads(line)["text"] for line in raw.splitlines() if line.strip()]
        if len(texts) >= limit:
            break
    return texts[:limit]


# ---- the reference: plain Python, written from the definitions in minhash.py's docstring ----


def ref_shingles(text: str, shingle: str, n: int, short: str) -> set[str]:
    if shingle == "word":
        words = text.split()
        if not words:
            return set()
        if len(words) < n:
            return {" ".join(words)} if short == "whole" else set()
        return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}
    if not text:
        return set()
    if len(text) < n:
        return {text} if short == "whole" else set()
    return {text[i : i + n] for i in range(len(text) - n + 1)}


def ref_shingle_hash(shingle: str) -> int:
    base = 0x9E3779B97F4A7C15 % P
    poly = 0
    for ch in shingle:
        poly = (poly * base + ord(ch) + 1) % P
    h = poly
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK64
    h ^= h >> 33
    return h >> 3


def ref_signature(text: str | None, config: MinHashConfig) -> list[int] | None:
    if text is None:
        return None
    shingles = ref_shingles(text, config.shingle, config.ngram, config.short_documents)
    if not shingles:
        return None
    rng = np.random.default_rng(config.seed)
    a = [int(v) for v in rng.integers(1, P, config.num_perm, dtype=np.uint64)]
    b = [int(v) for v in rng.integers(0, P, config.num_perm, dtype=np.uint64)]
    xs = [ref_shingle_hash(s) for s in shingles]
    mins = [min((ak * x + bk) % P for x in xs) for ak, bk in zip(a, b)]
    return [m & 0xFFFFFFFF for m in mins] if config.bits == 32 else mins


def assert_matches_reference(texts: list[str | None], config: MinHashConfig, **kwargs) -> None:
    sigs, has = signatures(pa.array(texts, pa.large_string()), config, **kwargs)
    assert sigs.dtype == (np.uint32 if config.bits == 32 else np.uint64)
    assert sigs.shape == (len(texts), config.num_perm) and has.shape == (len(texts),)
    for i, text in enumerate(texts):
        want = ref_signature(text, config)
        assert has[i] == (want is not None), (i, repr(text)[:60])
        if want is None:
            assert (sigs[i] == np.iinfo(sigs.dtype).max).all()
        else:
            assert sigs[i].tolist() == want, (i, repr(text)[:60])


def real_prefixes() -> list[str]:
    """300 webster documents cut at random lengths (0 to 400 code points), so that the reference stays quick."""
    rng = random.Random(7)
    return [text[: rng.randrange(0, 400)] for text in corpus_texts("webster", 300)]


@pytest.mark.parametrize(
    "config",
    [
        MinHashConfig(num_perm=16),
        MinHashConfig(num_perm=16, bits=32, seed=3),
        MinHashConfig(shingle="word", ngram=5, num_perm=16),
        MinHashConfig(shingle="word", ngram=3, num_perm=16, bits=32, short_documents="skip"),
        MinHashConfig(ngram=5, num_perm=16, short_documents="skip"),
    ],
    ids=["char25-64", "char25-32", "word5-64", "word3-32-skip", "char5-64-skip"],
)
def test_signatures_equal_a_plain_python_reference(config):
    non_ascii = [t[:1500] for t in corpus_texts("linux_doc", 400) if not t.isascii()][:5]
    assert_matches_reference([*real_prefixes(), *non_ascii, *TRICKY], config)


def test_every_position_of_a_long_signature_equals_the_reference():
    texts = [t[:300] for t in corpus_texts("webster", 2)] + ["tiny"]
    assert_matches_reference(texts, MinHashConfig.nemo())
    assert_matches_reference(texts, MinHashConfig(shingle="word", ngram=2, num_perm=300, bits=32, seed=2**40))


@pytest.mark.parametrize("shingle,ngram", [("char", 25), ("char", 1), ("word", 4), ("word", 1), ("word", 30)])
def test_documents_cut_into_pieces_and_groups_give_the_same_signatures(monkeypatch, shingle, ngram):
    """A document longer than a group is hashed in overlapping pieces; the pieces' shingles are exactly its own."""
    config = MinHashConfig(shingle=shingle, ngram=ngram, num_perm=8)
    texts = [*corpus_texts("webster", 3), TRICKY[7] * 40, "w " * 3000, "x" * 300 + " y" * 20 + " " + "z" * 500,
             ("run of spaces" + " " * 70 + "\n\t") * 60, "short one", None]
    whole_sigs, whole_has = signatures(pa.array(texts), config)
    for group in (40, 257, 1000):
        monkeypatch.setattr(minhash, "GROUP_CODE_POINTS", group)
        sigs, has = signatures(pa.array(texts), config)
        assert (sigs == whole_sigs).all() and (has == whole_has).all(), group
    assert_matches_reference(texts, config)


def test_pinned_permutations_and_signature():
    """The definition in numbers, so that a change of numpy's generator or of the hashing shows here first."""
    a, b = permutations(MinHashConfig())
    assert a.dtype == b.dtype == np.uint64 and len(a) == len(b) == 128
    assert a[:2].tolist() == [1784621144001422544, 1011984782196883448]
    assert b[:2].tolist() == [238431010254994964, 1355016128658349554]
    assert ref_shingle_hash("hello") == 923821923578813921
    sigs, _ = signatures(pa.array(["The quick brown fox jumps over the lazy dog."]), MinHashConfig())
    assert sigs[0, :2].tolist() == [298598103277393459, 135997758804544954]


def test_same_seed_same_signatures_whatever_the_batch_and_a_new_seed_changes_them():
    texts = [*corpus_texts("webster", 40), *TRICKY]
    config = MinHashConfig(num_perm=32)
    sigs, has = signatures(pa.array(texts), config)
    again, again_has = signatures(pa.chunked_array([pa.array(texts[:7]), pa.array(texts[7:], pa.string())]), config)
    assert (sigs == again).all() and (has == again_has).all()
    rng = random.Random(0)
    order = list(range(len(texts)))
    rng.shuffle(order)
    cuts = sorted(rng.sample(range(1, len(texts)), 5))
    for part in np.split(np.array(order), cuts):
        part_sigs, part_has = signatures(pa.array([texts[i] for i in part]), config)
        assert (part_sigs == sigs[part]).all() and (part_has == has[part]).all()
    other, other_has = signatures(pa.array(texts), MinHashConfig(num_perm=32, seed=43))
    assert (other_has == has).all()
    assert (other[has] != sigs[has]).mean() > 0.99


def edit(text: str, fraction: float, rng: random.Random, words: bool) -> str:
    units = text.split() if words else list(text)
    for i in rng.sample(range(len(units)), max(1, int(fraction * len(units)))):
        units[i] = f"w{rng.randrange(10**9)}" if words else rng.choice("abcdefghijklmnopqrstuvwxyz#")
    return " ".join(units) if words else "".join(units)


@pytest.mark.parametrize(
    "config,fractions",
    [(MinHashConfig(), (0.001, 0.004, 0.012, 0.03)), (MinHashConfig(bits=32, seed=5), (0.002, 0.02)),
     (MinHashConfig(shingle="word", ngram=5), (0.005, 0.02, 0.06, 0.15))],
    ids=["char25-64", "char25-32", "word5-64"],
)
def test_agreement_rate_estimates_the_jaccard_similarity(config, fractions):
    rng = random.Random(11)
    originals = corpus_texts("webster", 20)
    pairs = [(text, edit(text, f, rng, config.shingle == "word")) for text in originals for f in fractions]
    sigs, has = signatures(pa.array([t for pair in pairs for t in pair]), config)
    assert has.all()
    estimates = (sigs[0::2] == sigs[1::2]).mean(axis=1)
    exact = np.array([jaccard(a, b, config) for a, b in pairs])
    assert 0.05 < exact.min() < 0.6 and 0.85 < exact.max() < 1.0  # a wide range of similarities, none identical
    errors = np.sqrt(exact * (1 - exact) / config.num_perm)
    assert (np.abs(estimates - exact) <= 4 * errors).all(), list(zip(exact.round(3), estimates.round(3)))
    # no bias: the mean of the estimates is within 4 standard errors of the mean similarity
    assert abs(estimates.mean() - exact.mean()) <= 4 * math.sqrt((errors**2).sum()) / len(pairs)


def test_jaccard_is_exact_on_shingle_sets():
    char3 = MinHashConfig(ngram=3)
    assert jaccard("abcd", "abce", char3) == pytest.approx(1 / 3)  # {abc, bcd} and {abc, bce}
    assert jaccard("abcabc", "abcabcabc", char3) == 1.0  # a set: repeats count once
    assert jaccard("ab", "ab", char3) == 1.0 and jaccard("ab", "abc", char3) == 0.0  # short texts are one shingle
    assert jaccard("ab", "ab", MinHashConfig(ngram=3, short_documents="skip")) == 0.0
    assert jaccard("", "", char3) == 0.0
    word2 = MinHashConfig(shingle="word", ngram=2)
    assert jaccard("a b  c\nd", "a b c e", word2) == pytest.approx(2 / 4)  # {a b, b c, c d} and {a b, b c, c e}
    assert jaccard(" \n", " \n", word2) == 0.0


def test_short_empty_and_null_documents():
    texts = ["", None, "tiny", "tiny", "tinY", "   ", "a b c", "a  b\tc", "x" * 25]
    sigs, has = signatures(pa.array(texts), MinHashConfig())
    assert has.tolist() == [False, False, True, True, True, True, True, True, True]
    assert (sigs[2] == sigs[3]).all() and (sigs[2] != sigs[4]).all() and (sigs[6] != sigs[7]).any()
    assert (sigs[:2] == np.iinfo(np.uint64).max).all()
    sigs, has = signatures(pa.array(texts), MinHashConfig(short_documents="skip"))
    assert has.tolist() == [False] * 8 + [True]
    sigs, has = signatures(pa.array(texts), MinHashConfig(shingle="word", ngram=5))
    assert has.tolist() == [False, False, True, True, True, False, True, True, True]
    assert (sigs[6] == sigs[7]).all()  # the same words: whitespace does not matter in word mode
    sigs, has = signatures(pa.array([], pa.string()), MinHashConfig(bits=32))
    assert sigs.shape == (0, 128) and sigs.dtype == np.uint32 and has.shape == (0,)


def test_memory_is_bounded_on_one_long_document():
    """Hashed whole, 4 million code points would need about 600 MB; in groups the work takes a few MB."""
    rng = random.Random(3)
    text = " ".join(rng.choice(["alpha", "beta", "gamma", "délta", "ε", "zeta", "eta", "theta"]) for _ in range(700_000))
    batch = pa.array([text])
    for config in (MinHashConfig(num_perm=4), MinHashConfig(shingle="word", ngram=5, num_perm=4)):
        tracemalloc.start()
        _, has = signatures(batch, config)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert has.all()
        assert peak < 4 * len(text) + (20 << 20), (config.shingle, peak)


def test_jax_backend_gives_the_same_signatures():
    """In a process of its own, so that JAX's threads are not running in the test process when later tests fork."""
    import subprocess
    import sys

    pytest.importorskip("jax")
    texts = [*corpus_texts("webster", 12), *TRICKY]
    code = (
        "import json, sys, pyarrow as pa\n"
        "from tokenmix.curate.minhash import MinHashConfig, signatures\n"
        "texts = json.loads(sys.stdin.read())\n"
        "for config in (MinHashConfig(num_perm=20), MinHashConfig(shingle='word', ngram=3, num_perm=7, bits=32)):\n"
        "    sigs, has = signatures(pa.array(texts), config)\n"
        "    jax_sigs, jax_has = signatures(pa.array(texts), config, backend='jax')\n"
        "    assert (jax_sigs == sigs).all() and (jax_has == has).all(), config\n"
        "print('same')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "same"


@pytest.mark.parametrize(
    "field,value",
    [("shingle", "byte"), ("ngram", 0), ("ngram", 2.5), ("num_perm", 0), ("bits", 16), ("seed", -1), ("short_documents", "drop")],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"minhash\.{field} must be"):
        MinHashConfig(**{field: value})


def test_presets_draccus_and_other_errors():
    assert MinHashConfig.zyda2() == MinHashConfig(shingle="char", ngram=25, num_perm=128)
    config = draccus.decode(MinHashConfig, {"shingle": "word", "ngram": 5, "bits": 32, "short_documents": "skip"})
    assert config == MinHashConfig(shingle="word", ngram=5, bits=32, short_documents="skip")
    assert draccus.decode(MinHashConfig, draccus.encode(MinHashConfig.nemo())) == MinHashConfig.nemo()
    nemo = MinHashConfig.nemo()
    assert (nemo.shingle, nemo.ngram, nemo.num_perm) == ("char", 24, 260)
    with pytest.raises(TypeError, match="string array"):
        signatures(pa.array([1, 2]), nemo)
    with pytest.raises(ValueError, match="backend"):
        signatures(pa.array(["x"]), nemo, backend="torch")
    with pytest.raises(ValueError, match="bands and rows"):
        lsh_threshold(0, 3)
    with pytest.raises(ValueError, match="similarity"):
        candidate_probability(1.5, 20, 13)


bands_st = st.integers(1, 300)
rows_st = st.integers(1, 40)
similarity_st = st.floats(0.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(bands_st, rows_st, similarity_st, similarity_st)
def test_candidate_probability_is_a_monotone_s_curve(bands, rows, s, t):
    low, high = min(s, t), max(s, t)
    assert 0.0 <= candidate_probability(low, bands, rows) <= candidate_probability(high, bands, rows) + 1e-12 <= 1.0 + 1e-12
    assert candidate_probability(0.0, bands, rows) == 0.0 and candidate_probability(1.0, bands, rows) == 1.0
    # more bands: more chances; more rows per band: each band harder to match
    assert candidate_probability(s, bands + 1, rows) >= candidate_probability(s, bands, rows) - 1e-12
    assert candidate_probability(s, bands, rows + 1) <= candidate_probability(s, bands, rows) + 1e-12


@settings(max_examples=200, deadline=None)
@given(bands_st, rows_st)
def test_lsh_threshold_is_where_one_band_matches_with_probability_one_over_bands(bands, rows):
    threshold = lsh_threshold(bands, rows)
    assert 0.0 < threshold <= 1.0 and (threshold == 1.0) == (bands == 1)
    assert threshold**rows == pytest.approx(1 / bands)
    # there a pair is a candidate with probability 1 - (1 - 1/b)^b: 1 for one band, falling to 1 - 1/e
    at = candidate_probability(threshold, bands, rows)
    assert at == pytest.approx(1 - (1 - 1 / bands) ** bands, abs=1e-9)
    assert at >= 1 - 1 / math.e - 1e-9
    assert lsh_threshold(bands + 1, rows) < threshold
    assert lsh_threshold(bands, rows + 1) >= threshold
