"""Datasets cross to a loader's reader processes pickled: caches and token files as where they are (opened again on the
other side, and refused if they changed meanwhile), never as copies of their tokens."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
from helpers import build, demo_urls

from tokenmix import TokenCache, TokenSeqDataset
from tokenmix.cache.chunk_cache import SHARED, ChunkCache
from tokenmix.cache.ledger import CacheMismatchError
from tokenmix.sources.token_file import TokenFile, TokenFileError
from tokenmix.sources.token_files import open_token_files


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


def test_a_cache_replaced_before_it_is_opened_again_is_refused(tmp_path):
    location = str(tmp_path / "c")
    build(location, demo_urls("linux_doc"))
    rows = TokenCache(location).num_rows()
    blob = pickle.dumps(TokenCache(location))
    build(location, demo_urls("linux_doc") + demo_urls("python_doc"))  # extended: the same cache, grown
    assert pickle.loads(blob).num_rows() == TokenCache(location).num_rows() > rows
    shutil.rmtree(location)
    build(location, demo_urls("linux_doc"), compression="none")  # deleted and made again otherwise: another identity
    with pytest.raises(CacheMismatchError, match=r"the cache was replaced .* start the loader again"):
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
    os.utime(path, ns=(1, 1))
    with pytest.raises(TokenFileError, match=r"n_input_ids.npy: the file changed"):
        pickle.loads(blob)
    with pytest.raises(TypeError, match=r"made by hand cannot be sent to another process.*open_token_files"):
        pickle.dumps(TokenFile(str(path), tokens, np.array([len(tokens)])))
