"""Packing: next fit by pointer doubling against a plain loop, and packed datasets over real caches (no
token lost or duplicated, masks aligned, segment ids contiguous), plans kept next to the cache, growing
caches, shuffled orders, and packed sources in a mixture."""

from __future__ import annotations

import json
import logging
import random
import time

import draccus
import numpy as np
import pytest
import yaml
from helpers import TOKENIZER, build, demo_urls, with_format, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenmix import (
    CacheMismatchError,
    LMMixtureDatasetConfig,
    PackedDataset,
    SupervisedLmDatasetFormat,
    TokenCache,
    TokenSeqDataset,
    build_caches,
)
from tokenmix.datasets import packed as packed_module
from tokenmix.datasets.packing import document_pieces, next_fit
from tokenmix.datasets.segments import in_spans, segment_positions, span_coverage

PAD = 1
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DATASET_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def reference_next_fit(sizes: list[int], seq_len: int, cap: int | None) -> list[int]:
    """Next fit, one piece at a time."""
    starts, tokens, count = [], 0, 0
    for i, size in enumerate(sizes):
        if not starts or tokens + size > seq_len or (cap is not None and count == cap):
            starts.append(i)
            tokens, count = 0, 0
        tokens += size
        count += 1
    return starts


# pure index math


@SETTINGS
@given(st.integers(2, 300), st.sampled_from([None, 1, 2, 3, 7, 64]), st.lists(st.integers(1, 400), max_size=400), st.data())
def test_next_fit_is_the_greedy_loop_and_prefix_stable(seq_len, cap, lengths, data):
    sizes = np.minimum(np.array(lengths, np.int64), seq_len)
    starts, end = next_fit(sizes, seq_len, cap, complete=True)
    assert starts.tolist() == reference_next_fit(sizes.tolist(), seq_len, cap) and end == len(sizes)
    # a prefix plans its closed examples exactly as the whole does; the open one begins where the whole's next does
    cut = data.draw(st.integers(0, len(sizes)))
    closed, open_at = next_fit(sizes[:cut], seq_len, cap, complete=False)
    assert closed.tolist() == [s for s in starts.tolist() if s < open_at]
    assert open_at == cut or open_at in starts.tolist()
    assert open_at == cut or (cut > 0 and open_at == starts[starts < cut].max())


@SETTINGS
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(2, 20), st.sampled_from(["truncate", "truncate_start", "split"]))
def test_document_pieces_keep_every_token_or_count_the_cut(lengths, seq_len, mode):
    lengths = np.array(lengths, np.int64)
    owner, offset, size = document_pieces(lengths, seq_len, mode)
    assert np.all((size >= 1) & (size <= seq_len)) and np.all(np.diff(owner) >= 0)
    if mode == "split":  # consecutive pieces tile each document exactly
        for doc, length in enumerate(lengths.tolist()):
            mine = owner == doc
            assert np.array_equal(offset[mine], np.arange(0, length, seq_len)) and size[mine].sum() == length
    else:
        assert owner.tolist() == np.flatnonzero(lengths > 0).tolist()
        assert np.array_equal(size, np.minimum(lengths[owner], seq_len))
        assert np.array_equal(offset + size, lengths[owner]) if mode == "truncate_start" else not offset.any()


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6)), max_size=30),
       st.lists(st.tuples(st.integers(0, 150), st.integers(0, 40)), max_size=20))
def test_span_membership_and_coverage_match_a_per_token_count(gaps_and_sizes, ranges):
    span_starts, span_ends, pos = [], [], 0
    for gap, size in gaps_and_sizes:  # sorted, disjoint, possibly touching spans
        pos += gap
        if size:
            span_starts.append(pos)
            span_ends.append(pos + size)
            pos += size
    a, b = np.array(span_starts, np.int64), np.array(span_ends, np.int64)
    covered = np.zeros(400, bool)
    for s, e in zip(span_starts, span_ends):
        covered[s:e] = True
    starts = np.array([r[0] for r in ranges], np.int64)
    lengths = np.array([r[1] for r in ranges], np.int64)
    expected = np.concatenate([covered[s : s + n] for s, n in zip(starts, lengths)]) if ranges else np.zeros(0, bool)
    assert np.array_equal(in_spans(starts, lengths, a, b), expected)
    assert span_coverage(starts, starts + lengths, a, b).tolist() == [int(covered[s : s + n].sum()) for s, n in zip(starts, lengths)]


@SETTINGS
@given(st.lists(st.lists(st.integers(-1, 3), min_size=1, max_size=12), min_size=1, max_size=5).filter(lambda r: len({len(x) for x in r}) == 1))
def test_segment_positions_restart_at_every_change(rows):
    ids = np.array(rows)
    expected = [[0 if i == 0 or row[i] != row[i - 1] else None for i in range(len(row))] for row in rows]
    for row in expected:
        for i in range(len(row)):
            row[i] = 0 if row[i] == 0 else row[i - 1] + 1
    assert segment_positions(ids).tolist() == expected


# packed datasets over real caches


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """A text cache (dictionary entries, with EOS) and a supervised one (prompts masked), both finished."""
    root = tmp_path_factory.mktemp("packing")
    build(str(root / "text"), demo_urls("webster")[:1])
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    records = [{"prompt": " ".join(rng.choices(words, k=rng.randint(1, 60))), "response": " " + " ".join(rng.choices(words, k=rng.randint(1, 90)))}
               for _ in range(250)]
    build(str(root / "sft"), [write_jsonl(root / "sft.jsonl", records)], SupervisedLmDatasetFormat())
    return {"text": TokenCache(str(root / "text")), "sft": TokenCache(str(root / "sft"))}


def documents(cache: TokenCache) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each document's tokens, and which of them the format trains on."""
    rows = cache.num_rows()
    tokens = cache.get_rows(range(rows))
    targets = [np.ones(len(t), bool) for t in tokens]
    if cache.has_loss_spans:
        targets = [np.zeros(len(t), bool) for t in tokens]
        for row, begin, end in zip(*cache.loss_spans(0, rows)):
            targets[row][begin:end] = True
    return tokens, targets


def kept_parts(lengths: list[int], seq_len: int, mode: str) -> list[tuple[int, int, int]]:
    """(document, first token, length) of every piece the documents become, in order."""
    out = []
    for doc, n in enumerate(lengths):
        if mode == "split":
            out.extend((doc, a, min(seq_len, n - a)) for a in range(0, n, seq_len))
        else:
            size = min(n, seq_len)
            out.append((doc, n - size if mode == "truncate_start" else 0, size))
    return out


def check_packed(ds: PackedDataset, cache: TokenCache, seq_len: int, cap: int | None, mode: str) -> None:
    tokens, targets = documents(cache)
    batch = ds.get_batch(np.arange(len(ds)))
    pieces = []  # (tokens, loss mask) of every segment, example after example
    for row in range(len(ds)):
        seg = batch.segment_ids[row]
        real = seg >= 0
        count = int(real.sum())
        assert real[:count].all() and not real[count:].any(), "padding only at the end"
        assert np.all(batch.tokens[row][count:] == PAD) and not batch.loss_mask[row][count:].any()
        ids = seg[:count]
        assert ids[0] == 0 and np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1), "segment ids contiguous from 0"
        assert cap is None or ids[-1] < cap
        assert np.array_equal(batch.positions()[row][:count], segment_positions(ids))
        for k in range(int(ids[-1]) + 1):
            where = np.flatnonzero(ids == k)
            pieces.append((batch.tokens[row][where], batch.loss_mask[row][where]))
    expected = kept_parts([len(t) for t in tokens], seq_len, mode)
    assert len(pieces) == len(expected), "every piece once: none lost, none duplicated"
    for (got, mask), (doc, start, size) in zip(pieces, expected):
        assert np.array_equal(got, tokens[doc][start : start + size])
        trained = np.append(targets[doc][start + 1 : start + size], False)
        assert np.array_equal(mask, trained), "position i learns token i + 1 of its piece only where the format trains on it"
    stats = ds.stats()
    real = sum(size for _, _, size in expected)
    assert stats["tokens"] == real and stats["examples"] == len(ds) and stats["pieces"] == len(expected)
    assert stats["packing_efficiency"] == pytest.approx(real / (len(ds) * seq_len))
    assert stats["truncated_tokens"] == (0 if mode == "split" else sum(len(t) for t in tokens) - real)
    assert stats["loss_valid_tokens"] == int(batch.loss_mask.sum())


@DATASET_SETTINGS
@given(st.sampled_from(["text", "sft"]), st.integers(8, 700), st.sampled_from([None, 1, 3, 64]),
       st.sampled_from(["truncate", "truncate_start", "split"]))
def test_packed_examples_hold_every_document_piece_once_with_aligned_masks(caches, name, seq_len, cap, mode):
    cache = caches[name]
    ds = PackedDataset(cache, seq_len, pad_id=PAD, max_segments_per_example=cap, long_documents=mode, persist=False)
    check_packed(ds, cache, seq_len, cap, mode)


def test_any_batch_order_reads_the_same_examples(caches):
    ds = PackedDataset(caches["sft"], 128, 3, pad_id=PAD, persist=False)
    whole = ds.get_batch(np.arange(len(ds)))
    picks = np.random.default_rng(0).permutation(len(ds))[:40]
    part = ds.get_batch(picks)
    assert np.array_equal(part.tokens, whole.tokens[picks]) and np.array_equal(part.loss_mask, whole.loss_mask[picks])
    assert np.array_equal(part.segment_ids, whole.segment_ids[picks]) and np.all(part.source_ids == 3)
    with pytest.raises(IndexError):
        ds.get_batch([len(ds)])


def test_examples_across_stored_chunks(tmp_path):
    """Pieces that straddle the cache's 2^18-token chunks come back whole."""
    build(str(tmp_path / "c"), demo_urls("linux_doc"))
    cache = TokenCache(str(tmp_path / "c"))
    assert cache.num_tokens() > cache.chunk_tokens
    seq_len = 3000
    ds = PackedDataset(cache, seq_len, pad_id=PAD, long_documents="split", persist=False)
    check_packed(ds, cache, seq_len, 64, "split")


def test_the_plan_is_kept_next_to_the_cache_and_reused(tmp_path, monkeypatch, caplog):
    build(str(tmp_path / "c"), demo_urls("webster")[:1])
    cache = TokenCache(str(tmp_path / "c"))
    first = PackedDataset(cache, 256, pad_id=PAD, max_segments_per_example=8)
    plan_dir = tmp_path / "c" / "packing" / first.plan_id
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert plan["complete"] and plan["examples"] == len(first) and plan["options"]["seq_len"] == 256
    assert plan["stats"]["tokens"] == first.stats()["tokens"]

    def no_planning(*args, **kwargs):
        raise AssertionError("the stored plan should have been used")

    monkeypatch.setattr(packed_module, "next_fit", no_planning)
    again = PackedDataset(TokenCache(str(tmp_path / "c")), 256, pad_id=PAD, max_segments_per_example=8)
    assert len(again) == len(first) and again.stats() == first.stats()
    assert np.array_equal(again.get_batch(np.arange(len(again))).tokens, first.get_batch(np.arange(len(first))).tokens)
    monkeypatch.undo()
    other = PackedDataset(cache, 256, pad_id=PAD, max_segments_per_example=9)
    assert other.plan_id != first.plan_id  # every option makes its own plan
    plan["options"]["max_segments_per_example"] = 7
    (plan_dir / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(CacheMismatchError, match="packing plan"):
        PackedDataset(cache, 256, pad_id=PAD, max_segments_per_example=8)
    plan["options"]["max_segments_per_example"] = 8
    plan["rows_digest"] = "0" * 32
    (plan_dir / "plan.json").write_text(json.dumps(plan))
    with caplog.at_level(logging.WARNING):
        replanned = PackedDataset(cache, 256, pad_id=PAD, max_segments_per_example=8)
    assert "does not match" in caplog.text and len(replanned) == len(first)


def test_packing_a_growing_cache_plans_its_prefix_and_keeps_it(growing_cache):
    building = growing_cache(demo_urls("webster"), held_from=1, chunk_bytes=1 << 13)
    location = building.location
    growing = building.open(lambda cache: PackedDataset(cache, 512, pad_id=PAD, max_segments_per_example=4))
    growing.wait_for_len(20, timeout=60)
    assert growing.final_len() is None
    early = growing.get_batch(np.arange(growing.current_len()))
    building.release()
    seen = [len(early)]
    while growing.final_len() is None:
        seen.append(growing.current_len())
        time.sleep(0.01)
    building.finish()
    assert seen == sorted(seen) and len(early) < len(growing)
    fresh = PackedDataset(TokenCache(location), 512, pad_id=PAD, max_segments_per_example=4, persist=False)
    reloaded = PackedDataset(TokenCache(location), 512, pad_id=PAD, max_segments_per_example=4)
    assert len(fresh) == len(growing) == len(reloaded)
    full = fresh.get_batch(np.arange(len(fresh)))
    assert np.array_equal(growing.get_batch(np.arange(len(growing))).tokens, full.tokens)
    assert np.array_equal(reloaded.get_batch(np.arange(len(reloaded))).tokens, full.tokens)
    # examples planned on a prefix are the final plan's
    assert np.array_equal(early.tokens, full.tokens[: len(early)]) and np.array_equal(early.segment_ids, full.segment_ids[: len(early)])


def test_shuffled_document_orders(caches):
    cache = caches["sft"]
    tokens, _ = documents(cache)
    base = PackedDataset(cache, 300, pad_id=PAD, persist=False)
    for shuffle in (True, 32):
        ds = PackedDataset(cache, 300, pad_id=PAD, shuffle=shuffle, key=5, persist=False)
        again = PackedDataset(cache, 300, pad_id=PAD, shuffle=shuffle, key=5, persist=False)
        other = PackedDataset(cache, 300, pad_id=PAD, shuffle=shuffle, key=6, persist=False)
        batch = ds.get_batch(np.arange(len(ds)))
        assert np.array_equal(batch.tokens, again.get_batch(np.arange(len(again))).tokens)
        assert not np.array_equal(batch.tokens[:5], other.get_batch(np.arange(5)).tokens)
        assert not np.array_equal(batch.tokens[:5], base.get_batch(np.arange(5)).tokens)
        segments = sorted(tuple(batch.tokens[r][batch.segment_ids[r] == k]) for r in range(len(ds)) for k in range(batch.segment_ids[r].max() + 1))
        assert segments == sorted(tuple(t[:300]) for t in tokens), "every document once, whatever the order"


def test_packed_sources_in_a_mixture_and_held_out_documents(tmp_path, caches):
    rng = random.Random(1)
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": f"Q{i}: " + "why " * rng.randint(1, 30), "response": " because" * rng.randint(1, 30)}
                                              for i in range(300)])
    config_text = f"""
tokenizer: {TOKENIZER}
cache_dir: {tmp_path / 'caches'}
build: {{num_workers: 0}}
mixture_block_size: 32
train_weights: {{sft: 0.5, dictionary: 0.25, packed_dictionary: 0.25}}
num_validation_sequences: {{sft: 3}}
configs:
  sft:
    train_urls: ["{sft}"]
    format: {{type: supervised}}
  dictionary:
    train_urls: ["{demo_urls('webster')[0]}"]
  packed_dictionary:
    train_urls: ["{demo_urls('webster')[0]}"]
    packing: {{max_segments_per_example: 2, long_documents: split, shuffle: 16}}
"""
    config = draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(config_text))
    build_caches(config, progress=False)
    train = config.train_set(seq_len=256)
    sources = {name: train.source(name).base for name in train.names}
    assert isinstance(sources["sft"], PackedDataset) and isinstance(sources["packed_dictionary"], PackedDataset)
    assert isinstance(sources["dictionary"], TokenSeqDataset)
    assert sources["sft"].max_segments == 64 and sources["packed_dictionary"].shuffle == 16
    batch = train.get_batch(np.arange(0, 128))
    assert np.bincount(batch.source_ids, minlength=3).tolist() == [64, 32, 32]
    ids, draws = train.locate(np.arange(128))
    for sid, name in enumerate(train.names):
        mine = ids == sid
        direct = train.source(name).get_batch(draws[mine])
        assert np.array_equal(direct.tokens, batch.tokens[mine]) and np.array_equal(direct.loss_mask, batch.loss_mask[mine])
    sft_rows = batch.source_ids == 0
    assert np.all(batch.tokens[sft_rows][batch.segment_ids[sft_rows] < 0] == PAD)  # the tokenizer's <|pad|>
    held = config.validation_sets(256)["sft"]
    assert isinstance(held, PackedDataset) and len(held) >= 1
    held_docs = set(held._piece_row.tolist())
    assert held_docs and not held_docs & set(sources["sft"]._piece_row.tolist())
    one_each = with_format(config, "sft", pack=False).train_set(seq_len=256).source("sft").base
    assert one_each.max_segments == 1 and np.all(one_each.get_batch(np.arange(10)).segment_ids <= 0)

