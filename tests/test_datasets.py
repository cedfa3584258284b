"""Datasets over real caches built from the bundled slice of the shared corpus, with the real tokenizer."""

from __future__ import annotations

import dataclasses
import re
import time

import draccus
import numpy as np
import pytest
import yaml
from helpers import DEMO_CORPUS, TOKENIZER, build, demo_urls

from tokenmix import ConfigError, LMMixtureDatasetConfig, TokenCache, TokenSeqDataset, build_caches, load_data_config

SOURCES = ("linux_doc", "python_doc", "webster")

MIXTURE_YAML = f"""
tokenizer: {TOKENIZER}
cache_dir: CACHE
batch_size: 16
mixture_block_size: 64
seed: 7
train_weights:
  - [0, {{linux_doc: 0.6, python_doc: 0.4}}]
  - [20, {{linux_doc: 0.1, python_doc: 0.2, webster: 0.7}}]
configs:
  linux_doc:
    train_urls: ["{DEMO_CORPUS}/linux_doc/train-{{00..01}}-of-02.jsonl.zst"]
    validation_urls: ["{DEMO_CORPUS}/linux_doc/validation.jsonl.zst"]
  python_doc:
    train_urls: ["{DEMO_CORPUS}/python_doc/train-*.jsonl.zst"]
  webster:
    train_urls: ["{DEMO_CORPUS}/webster/train-{{00..01}}-of-02.jsonl.zst"]
    validation_urls: ["{DEMO_CORPUS}/webster/validation.jsonl.zst"]
num_validation_sequences: {{python_doc: 6}}
build: {{num_workers: 0}}
"""


@pytest.fixture(scope="module")
def mixture_config(tmp_path_factory) -> LMMixtureDatasetConfig:
    text = MIXTURE_YAML.replace("CACHE", str(tmp_path_factory.mktemp("caches")))
    config = draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(text))
    build_caches(config, progress=False)
    return config


def stream_and_bounds(location: str) -> tuple[np.ndarray, np.ndarray]:
    cache = TokenCache(location)
    bounds = cache.row_bounds(0, cache.num_rows())
    return cache.read_tokens(0, int(bounds[-1])).astype(np.int32), bounds


@pytest.mark.parametrize("seq_len", [128, 1000])
def test_examples_are_windows_of_the_token_stream_with_document_segments(mixture_config, seq_len):
    location = mixture_config.cache_location("webster", "train")
    stream, bounds = stream_and_bounds(location)
    ds = TokenSeqDataset(TokenCache(location), seq_len)
    assert len(ds) == len(stream) // seq_len
    straddling = bounds[1:6] // seq_len  # windows holding the end of one document and the start of the next
    picks = np.unique(np.concatenate([[0, 1, len(ds) // 2, len(ds) - 1], straddling]))
    batch = ds.get_batch(picks)
    doc_of = np.searchsorted(bounds, np.arange(len(stream)), side="right") - 1
    for row, i in enumerate(picks):
        window = slice(i * seq_len, (i + 1) * seq_len)
        assert np.array_equal(batch.tokens[row], stream[window])
        docs = doc_of[window]
        assert np.array_equal(batch.segment_ids[row], docs - docs[0])
        expected_mask = np.append(docs[1:] == docs[:-1], False)
        assert np.array_equal(batch.loss_mask[row], expected_mask)
    ends = np.diff(batch.segment_ids, axis=1) != 0
    assert ends.any() and np.all(batch.tokens[:, :-1][ends] == 0)  # each document ends with the enforced EOS id (0)


def test_mixture_yaml_with_stages_produces_the_mixture_it_describes(mixture_config):
    train = mixture_config.train_set(seq_len=256)
    assert train.names == list(SOURCES)
    batch = 16
    first = train.get_batch(np.arange(0, 20 * batch))  # stage 1: steps 0..19
    counts = np.bincount(first.source_ids, minlength=3)
    assert counts[2] == 0 and abs(counts[0] - 0.6 * 320) < 1 and abs(counts[1] - 0.4 * 320) < 1
    second = train.get_batch(np.arange(20 * batch, 20 * batch + 640))  # stage 2: 10 whole blocks of 64
    counts = np.bincount(second.source_ids, minlength=3)
    assert np.all(np.abs(counts - np.array([0.1, 0.2, 0.7]) * 640) < 1)
    # every example is the source's own example at the located draw
    ids, draws = train.locate(np.arange(20 * batch, 20 * batch + 64))
    for sid, name in enumerate(SOURCES):
        source = train.source(name)
        mine = ids == sid
        if mine.any():
            direct = source.get_batch(draws[mine])
            assert np.array_equal(direct.tokens, second.tokens[:64][mine])


def test_weight_stages_start_where_a_batch_size_ramp_puts_their_step(tmp_path):
    """With a ramp, stage steps become example indices through the loader's own schedule, not step * size."""
    doc = yaml.safe_load(MIXTURE_YAML.replace("CACHE", "unused"))
    doc["batch_size"] = [[0, 8], [10, 32]]
    doc["train_weights"] = [[0, {"linux_doc": 1.0}], [5, {"python_doc": 1.0}], [30, {"webster": 1.0}]]
    config = draccus.decode(LMMixtureDatasetConfig, doc)
    schedule = config.batch_schedule()
    assert [start for start, _ in config.weight_schedule()] == [0, 40, 8 * 10 + 32 * 20] == [schedule.offset(s) for s in (0, 5, 30)]
    doc["batch_size"] = [[0, 8], [0, 32]]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="batch_size: stage start steps must increase, got 0 then 0"):
        load_data_config(str(bad))


def test_training_batches_are_deterministic_and_resumable(mixture_config):
    a = mixture_config.train_set(seq_len=256).get_batch(np.arange(5000, 5064))
    b = mixture_config.train_set(seq_len=256).get_batch(np.arange(5000, 5064))
    c = mixture_config.train_set(seq_len=256, key=8).get_batch(np.arange(5000, 5064))
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.source_ids, b.source_ids)
    assert not np.array_equal(a.tokens, c.tokens)


def test_held_out_documents_never_overlap_training(mixture_config):
    seq_len = 256
    validation = mixture_config.validation_sets(seq_len)
    assert set(validation) == set(SOURCES)
    assert len(validation["python_doc"]) >= 6
    train = mixture_config.train_set(seq_len).source("python_doc").base
    stream, bounds = stream_and_bounds(mixture_config.cache_location("python_doc", "train"))
    held, kept = validation["python_doc"], train
    assert held.num_documents() + kept.num_documents() == len(bounds) - 1
    assert held._stream_len() + kept._stream_len() == len(stream)
    held_docs = set(_rows_of(held, bounds).tolist())
    kept_docs = set(_rows_of(kept, bounds).tolist())
    assert held_docs and not held_docs & kept_docs
    # held-out examples are the held documents' tokens, in order
    docs = sorted(held_docs)
    expected = np.concatenate([stream[bounds[d] : bounds[d + 1]] for d in docs])
    got = held.get_batch(np.arange(len(held))).tokens.reshape(-1)
    assert np.array_equal(got, expected[: len(got)])


def test_holding_out_every_token_of_a_source_is_refused_naming_the_source_and_the_field(mixture_config):
    config = dataclasses.replace(mixture_config, num_validation_sequences={"python_doc": 10**6})
    asked = "source 'python_doc': num_validation_sequences 1000000 x seq_len 256 asks to hold out 256000000 tokens"
    with pytest.raises(ValueError, match=re.escape(asked) + r", all \d+ of its tokens: lower it"):
        config.validation_sets(256)


def _rows_of(ds: TokenSeqDataset, bounds: np.ndarray) -> np.ndarray:
    """Rows of the cache a subset dataset reads (from its runs)."""
    rows = []
    for r, start in enumerate(ds._run_tokens.tolist()):
        stop_stream = ds._run_stream[r + 1] if r + 1 < len(ds._run_stream) else ds._stream_len()
        end = start + int(stop_stream - ds._run_stream[r])
        rows.extend(range(int(np.searchsorted(bounds, start)), int(np.searchsorted(bounds, end))))
    return np.array(rows)


def test_validation_split_is_used_where_the_source_has_one(mixture_config):
    validation = mixture_config.validation_sets(128)
    stream, _ = stream_and_bounds(mixture_config.cache_location("webster", "validation"))
    assert len(validation["webster"]) == len(stream) // 128
    assert np.array_equal(validation["webster"].get_batch([0]).tokens[0], stream[:128])


def test_a_dataset_grows_while_its_cache_builds(tmp_path, growing_cache):
    urls = demo_urls("linux_doc")
    location = str(tmp_path / "first_shard")
    build(location, urls[:1])
    before = TokenSeqDataset(TokenCache(location), 512).current_len()
    assert before > 0
    building = growing_cache(urls, held_from=1, chunk_bytes=1 << 14)
    growing = building.open(lambda cache: TokenSeqDataset(cache, 512))
    assert growing.wait_for_len(before, timeout=60) == before and growing.final_len() is None
    building.release()
    seen = [growing.current_len()]
    while growing.final_len() is None:
        seen.append(growing.current_len())
        time.sleep(0.01)
    assert seen == sorted(seen) and growing.final_len() > before
    assert growing.wait_for_len(growing.final_len()) == growing.final_len()
    full = TokenSeqDataset(TokenCache(building.location), 512)
    assert np.array_equal(growing.get_batch([0, before - 1]).tokens, full.get_batch([0, before - 1]).tokens)


@pytest.mark.parametrize("source", SOURCES)
def test_every_window_reads_back_across_chunk_and_run_boundaries(mixture_config, source):
    """All examples in one shuffled batch: windows that straddle stored chunks (2^18 tokens) and, for a
    document subset, runs of kept documents, come back as the stream's tokens."""
    location = mixture_config.cache_location(source, "train")
    stream, bounds = stream_and_bounds(location)
    cache = TokenCache(location)
    assert len(stream) > cache.chunk_tokens
    rng = np.random.default_rng(0)
    docs = np.flatnonzero(rng.random(len(bounds) - 1) < 0.7)
    for subset in (None, docs):
        ds = TokenSeqDataset(cache, 1000, documents=subset)
        kept = stream if subset is None else np.concatenate([stream[bounds[d] : bounds[d + 1]] for d in docs])
        picks = rng.permutation(len(ds))
        got = ds.get_batch(picks)
        assert np.array_equal(got.tokens, kept[: len(ds) * 1000].reshape(-1, 1000)[picks])
