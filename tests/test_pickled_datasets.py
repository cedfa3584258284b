"""Datasets cross to a loader's reader processes pickled: caches and token files as where they are (opened again on the
other side, and refused if they changed meanwhile), never as copies of their tokens."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
from helpers import build, demo_urls

from tokenmix import PackedDataset, TokenCache, TokenSeqDataset
from tokenmix.cache.chunk_cache import SHARED, ChunkCache
from tokenmix.cache.ledger import CacheMismatchError
from tokenmix.cache.token_files_cache import TokenFilesCache
from tokenmix.sources.token_file_base import TokenFile, TokenFileError
from tokenmix.sources.token_file_kinds import open_token_files


def test_a_cache_pickles_as_its_location_and_reads_the_same_on_the_other_side(tmp_path):
    location = str(tmp_path / "c")
    build(location, demo_urls("linux_doc"))
    dataset = TokenSeqDataset(TokenCache(location), 512)
    blob = pickle.dumps(dataset)
    assert len(blob) < 10_000 < dataset.cache.num_tokens() * 2  # the tokens stay on disk
    copy = pickle.loads(blob)
    rows = np.random.default_rng(0).permutation(len(dataset))[:40]
    assert np.array_equal(copy.get_batch(rows).tokens, dataset.get_batch(rows).tokens)
    assert copy.cache._chunk_cache is SHARED  # the other process's own chunk cache, not a copy of this one's
    private = pickle.loads(pickle.dumps(TokenCache(location, chunk_cache=ChunkCache(1234))))
    assert private._chunk_cache is not SHARED and private._chunk_cache.max_bytes == 1234


@pytest.mark.parametrize("persist", [True, False])
def test_a_packed_dataset_pickles_as_how_it_was_made_not_its_plan(tmp_path, persist):
    location = str(tmp_path / "c")
    build(location, demo_urls("python_doc"))
    cache = TokenCache(location)
    packed = PackedDataset(cache, 256, pad_id=1, long_documents="split", shuffle=True, key=3, persist=persist,
                           documents=np.arange(0, cache.num_rows(), 2))
    blob = pickle.dumps(packed)
    assert len(blob) < 10_000 + 8 * cache.num_rows()  # the document subset travels, not the plan nor the bounds
    copy = pickle.loads(blob)
    assert copy.plan_id == packed.plan_id and len(copy) == len(packed)
    rows = np.random.default_rng(0).permutation(len(packed))[:50]
    ours, theirs = copy.get_batch(rows), packed.get_batch(rows)
    for field in ("tokens", "loss_mask", "segment_ids"):
        assert np.array_equal(getattr(ours, field), getattr(theirs, field)), field


def test_a_cache_replaced_before_it_is_opened_again_is_refused(tmp_path):
    location = str(tmp_path / "c")
    build(location, demo_urls("linux_doc"))
    rows = TokenCache(location).num_rows()
    blob = pickle.dumps(TokenCache(location))
    build(location, demo_urls("linux_doc") + demo_urls("python_doc"))  # extended: the same cache, grown
    assert pickle.loads(blob).num_rows() == TokenCache(location).num_rows() > rows
    shutil.rmtree(location)
    build(location, demo_urls("linux_doc"), compression="none")  # deleted and made again otherwise: another identity
    with pytest.raises(CacheMismatchError, match=r"the cache was replaced while it was being read .* start the loader again"):
        pickle.loads(blob)


def test_token_files_pickle_as_how_they_were_opened_and_refuse_a_changed_file(tmp_path):
    path = tmp_path / "n_input_ids.npy"
    tokens = np.random.default_rng(0).integers(1, 1000, 200_000).astype(np.uint16)
    tokens[::97] = 0
    np.save(path, tokens)
    (file,) = open_token_files("nanoset", [str(path)], eos_id=0)
    blob = pickle.dumps(file)
    assert len(blob) < 5_000
    copy = pickle.loads(blob)
    assert np.array_equal(copy.tokens, file.tokens) and np.array_equal(copy.ends, file.ends)
    cache = TokenFilesCache([file], str(tmp_path / "plans"), {"token_files": "nanoset"})
    assert len(pickle.dumps(cache)) < 5_000  # its per-document bounds are derived again from the files
    assert np.array_equal(pickle.loads(pickle.dumps(cache)).row_ends(0, cache.num_rows()), cache.row_ends(0, cache.num_rows()))
    os.utime(path, ns=(1, 1))
    with pytest.raises(TokenFileError, match=r"n_input_ids.npy: the file changed"):
        pickle.loads(blob)
    with pytest.raises(TypeError, match=r"made by hand cannot be sent to another process.*open_token_files"):
        pickle.dumps(TokenFile(str(path), tokens, np.array([len(tokens)])))
