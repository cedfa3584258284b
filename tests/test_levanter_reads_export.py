"""Levanter's own trainer path opens ``tokenmix export --to levanter`` and reads what tokenmix reads (issue 36).

Runs only where ``levanter`` is importable; it is never a tokenmix dependency. The run recorded in docs/benchmarks.md
("Levanter opens our export") used a side environment::

    python3 -m venv /work/sidevenv/levanter
    /work/sidevenv/levanter/bin/pip install levanter==1.2.dev1644 "jax[cpu]" gitpython chex pytest hypothesis \\
        xxhash fastokens blosc2 google-crc32c orjson ijson s3fs
    PYTHONPATH=src:tests /work/sidevenv/levanter/bin/python -m pytest -q -p no:cacheprovider tests/test_levanter_reads_export.py
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import SEQ_LEN, TOKENIZER, build, demo_urls

from tokenmix import TokenCache, TokenSeqDataset
from tokenmix.export import export_levanter

levanter_text = pytest.importorskip("levanter.data.text", reason="Levanter is not installed (it is checked in a side environment)")


def _gpt2_class_tokenizer(root: Path) -> str:
    """The demo tokenizer under transformers' GPT-2 class, which returns no token_type_ids (PreTrainedTokenizerFast, the
    demo's own class, does under transformers 4.x)."""
    root.mkdir()
    config = json.loads((Path(TOKENIZER) / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2TokenizerFast"}))
    shutil.copy(Path(TOKENIZER) / "tokenizer.json", root / "tokenizer.json")
    return str(root)


@pytest.mark.parametrize("enforce_eos,gpt2_class", [(True, False), (False, False), (True, True)])
def test_levanters_load_lm_dataset_cache_opens_our_export_and_its_examples_are_ours(tmp_path, caplog, enforce_eos, gpt2_class):
    from levanter.compat.hf_checkpoints import load_tokenizer
    from levanter.data.text import TextLmDatasetFormat, load_lm_dataset_cache
    from levanter.data.text import TokenSeqDataset as LevanterTokenSeqDataset

    tokenizer = _gpt2_class_tokenizer(tmp_path / "gpt2_class") if gpt2_class else TOKENIZER
    location = str(tmp_path / "ours")
    build(location, demo_urls("webster"), tokenizer=tokenizer, tokenization={"enforce_bos": True, "enforce_eos": enforce_eos})
    ours = TokenCache(location)
    export_levanter(ours, str(tmp_path / "levanter" / "train"), tokenizer=tokenizer, progress=False)
    with caplog.at_level(logging.WARNING):
        cache = load_lm_dataset_cache(str(tmp_path / "levanter" / "train"), TextLmDatasetFormat(), load_tokenizer(tokenizer),
                                      enforce_eos=enforce_eos)
    assert "metadata" not in caplog.text.lower(), caplog.text
    assert ("token_type_ids" in cache.store.tree) == (not gpt2_class)  # both layouts are opened
    rows = cache.store.tree["input_ids"]
    assert len(rows) == ours.num_rows()
    for i in (0, 1, ours.num_rows() // 2, ours.num_rows() - 1):
        assert np.array_equal(rows[i], np.asarray(ours[i]))
    theirs = LevanterTokenSeqDataset(cache, SEQ_LEN).as_sync_dataset()
    mine = TokenSeqDataset(ours, SEQ_LEN)
    assert len(theirs) == len(mine)
    picks = [0, 1, 7, len(mine) // 2, len(mine) - 1]
    assert np.array_equal(np.stack([theirs[i] for i in picks]), mine.get_batch(picks).tokens)
