"""Our Cerebras HDF5 export against what Cerebras's own preprocessing wrote from the same documents: the same ``data``
arrays, the same files with the same samples each, and the same ``data_params.json`` statistics.

How the fixtures in ``tests/data/cerebras_hdf5/`` were made (none of Cerebras's code is in this repository):

- Input: ``lm.jsonl``, 162 documents (paragraphs of 1 to 400 tokens, some with non-ASCII text) and
  ``summarization.jsonl``, 90 ``prompt``/``completion`` pairs (consecutive paragraphs; 21 longer than 64 tokens, one
  shorter than 10), both drawn with a fixed seed from the validation shards (held back from training) of the shared
  corpus (linux_doc, webster, python_doc).
- Cerebras's code: github.com/Cerebras/modelzoo at tag Release_2.1.1 (commit de67aaec12ba684ebedc6fb841e0c4d0ff8cd2e8),
  ``modelzoo/transformers/data_processing/scripts/hdf5_preprocessing/create_hdf5_dataset.py`` with that directory's
  ``utils.py``, ``hdf5_base_preprocessor.py`` and ``hdf5_dataset_preprocessors.py`` and the ``tokenizers`` package
  beside them, extracted outside this repository and run in a separate virtual environment (Python 3.11, numpy 1.24.4,
  h5py 3.16, tokenizers 0.23.3, transformers 5.24, pyarrow 12.0.1, lm-dataformat 0.0.20, Keras-Preprocessing 1.1.2).
  Shims: empty ``cerebras_pytorch`` and ``cerebras_appliance.environment`` packages (``modelzoo/__init__.py`` refuses to
  import without them; nothing of them is used here); tokenizers 0.23 instead of the pinned 0.13.3, which cannot read
  ``data/tokenizer/tokenizer.json``; numpy 1.24, because Release_2.1.1's FIM mode compares an array with ``[]``, which
  numpy 2 refuses.
- Each run: ``python create_hdf5_dataset.py MODE --input_dir DIR --output_dir OUT --tokenizer_type NeoXTokenizer
  --encoder_file data/tokenizer/tokenizer.json --processes 1 --max_seq_length 64 --use_ftfy False`` plus the arguments
  recorded per configuration in ``modelzoo_params.json`` (``arguments``; ``--params`` names a YAML file holding
  ``dataset: {inverted_mask: true}``, an option its command line lacks).
- Kept: every ``.h5`` file's ``data`` in file order (``examples_{i}_0.h5``), as uint16 (every value fits) in
  ``modelzoo_data.npz`` under the configuration's name; per file its ``n_examples``, and ``data_params.json``'s sections,
  ``dataset``, ``processing`` (without the tokenizer path), ``post-process`` and ``h5_dataset_stats`` in
  ``modelzoo_params.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import TOKENIZER, build

from tokenmix import SupervisedLmDatasetFormat, TokenCache
from tokenmix.export import Hdf5ExportOptions, export_hdf5
from tokenmix.sources.cerebras_hdf5 import DATA_PARAMS

FIXTURES = Path(__file__).parent / "data" / "cerebras_hdf5"
MODELZOO = json.loads((FIXTURES / "modelzoo_params.json").read_text())
MODES = {"LMData": "lm", "Summarization": "summarization", "FIM": "fim"}
CONVERT = {"files_per_record": int, "min_sequence_len": int, "seed": int, "short_seq_prob": float, "fim_rate": float, "spm_rate": float,
           "pack_sequences": lambda v: v == "True", "write_remainder": lambda v: v == "True"}
NOT_OURS = ("prompt_key", "completion_key", "params")
"""Arguments that name input fields or a YAML file: the cache's format (``output_field``) and ``inverted_mask`` stand for them."""


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> dict[str, TokenCache]:
    """The fixture inputs built as a user would: the documents as text, the pairs in the supervised format."""
    root = tmp_path_factory.mktemp("modelzoo")
    build(str(root / "lm"), [str(FIXTURES / "lm.jsonl")])
    build(str(root / "sum"), [str(FIXTURES / "summarization.jsonl")], SupervisedLmDatasetFormat(output_field="completion"))
    return {"lm.jsonl": TokenCache(str(root / "lm")), "summarization.jsonl": TokenCache(str(root / "sum"))}


def options_of(run: dict) -> Hdf5ExportOptions:
    """Cerebras's arguments of a run as our options."""
    given = {name.lstrip("-"): value for name, value in run["arguments"].items()}
    options = {name: CONVERT.get(name, str)(value) for name, value in given.items() if name not in NOT_OURS}
    return Hdf5ExportOptions(mode=MODES[run["mode"]], max_seq_length=run["processing"]["max_seq_length"],
                             inverted_mask=run["dataset"].get("inverted_mask", False), **options)


@pytest.mark.parametrize("name", sorted(MODELZOO))
def test_our_export_writes_the_files_and_statistics_modelzoo_writes(caches, tmp_path, name):
    run = MODELZOO[name]
    out = tmp_path / "out"
    stats = export_hdf5(caches[run["input"]], str(out), options_of(run), progress=False, tokenizer=TOKENIZER)

    files = sorted((f for f in os.listdir(out) if f.endswith(".h5")), key=lambda f: int(f.split("_")[1]))
    assert {f: h5py.File(out / f, "r").attrs["n_examples"] for f in files} == run["files"]
    arrays = []
    for f in files:
        with h5py.File(out / f, "r") as h5:
            assert h5["data"].dtype == np.int32 and h5["data"].chunks == (1, 3, 64) and h5["data"].compression == "gzip"
            arrays.append(h5["data"][()])
    np.testing.assert_array_equal(np.concatenate(arrays), np.load(FIXTURES / "modelzoo_data.npz")[name].astype(np.int32))

    params = json.loads((out / DATA_PARAMS).read_text())
    assert set(run["sections"]) <= set(params) and set(params) - set(run["sections"]) == {"tokenmix"}
    assert stats == params["h5_dataset_stats"] == run["h5_dataset_stats"]
    assert params["post-process"] == run["post-process"]
    for section in ("dataset", "processing"):
        shared = set(params[section]) & set(run[section]) - {"eos_id", "pad_id"}  # Cerebras records the arguments given: None
        assert {k: params[section][k] for k in shared} == {k: run[section][k] for k in shared}

