"""Cerebras's HDF5 samples (``create_hdf5_dataset.py``'s output, or ``tokenmix export --to hdf5``) read back as documents.

A directory holds ``.h5`` files, each a dataset ``data`` of ``[n, 3, max_seq_length]`` samples (input ids, loss mask,
labels), and ``data_params.json``. A sample's window is its first input and its labels: ``max_seq_length + 1`` tokens,
the first ``r + 1`` of them real, where ``r`` counts the positions trained (LMData) or ends at the last trained one
(Summarization, whose completion ends trained). The stream comes back by these rules, as Cerebras cuts it:

- LMData, packed: each window starts on the token the one before ended with, so the stream is every window's first
  ``r`` tokens and the last window's ``r + 1``; documents end after each EOS.
- LMData, unpacked: each document is cut alone the same way; a window whose last token is EOS ends its document.
- Summarization: one document a sample, trained where the mask says its label is (a token after the first).

The files are gzip-chunked, so they are read whole into memory (12 bytes a position as stored, 4 a token kept).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from tokenmix.sources.token_file_base import TokenFile, TokenFileError, document_ends, local_path

DATA_PARAMS = "data_params.json"
PROCESSOR_MODES = {"LMDataPreprocessor": "LMData", "SummarizationPreprocessor": "Summarization", "FIMDataPreprocessor": "FIM"}
"""Cerebras's mode for each of its processors, as ``setup.dataset_processor`` names the one that wrote the samples."""


def _natural(name: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _params(directory: str) -> dict:
    path = os.path.join(directory, DATA_PARAMS)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise TokenFileError(f"{directory}: no {DATA_PARAMS}; a Cerebras HDF5 source names the directory of a finished export "
                             "(its .h5 files and data_params.json)") from None
    except json.JSONDecodeError as e:
        raise TokenFileError(f"{path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno}); the export wrote it as JSON: "
                             "correct it there, or export the samples again") from None


def _samples(path: str) -> np.ndarray:
    """The ``[n, 3, max_seq_length]`` samples of one ``.h5`` file; a file h5py cannot read is refused naming it."""
    import h5py

    try:
        with h5py.File(path, "r") as h5:
            if "data" not in h5 or h5["data"].ndim != 3 or h5["data"].shape[1] != 3:
                raise TokenFileError(f"{path}: no `data` dataset of [n, 3, max_seq_length] samples")
            return h5["data"][()]
    except OSError as e:
        raise TokenFileError(f"{path}: cannot be read as HDF5 ({e}); the file is cut short or damaged: copy it again, or "
                             "export the samples again") from None


def _setting(params: dict, key: str, default: object) -> object:
    for section in ("processing", "dataset", "setup", "post-process"):
        if key in (params.get(section) or {}):
            return params[section][key]
    return default


def _mode(params: dict) -> str:
    """The mode that wrote the samples: ``setup.mode`` (tokenmix's exports), else Cerebras's processor class (what
    ``create_hdf5_dataset.py`` records), else LMData (its default)."""
    setup = params.get("setup") or {}
    if "mode" in setup:
        return str(setup["mode"])
    processor = str(setup.get("dataset_processor", "LMDataPreprocessor"))
    return PROCESSOR_MODES.get(processor, processor)


def open_cerebras_hdf5(directory: str, eos_id: int | None = None) -> TokenFile:
    """The documents of one Cerebras HDF5 directory, in memory; ``eos_id`` where ``data_params.json`` records none."""
    directory = local_path(directory, "hdf5").rstrip("/")
    params = _params(directory)
    mode = _mode(params)
    packed = bool(_setting(params, "pack_sequences", True))
    inverted = bool(_setting(params, "inverted_mask", False))
    eos = eos_id if eos_id is not None else _setting(params, "eos_id", None)
    names = sorted((n for n in os.listdir(directory) if n.endswith(".h5")), key=_natural)
    if not names:
        raise TokenFileError(f"{directory}: no .h5 files beside {DATA_PARAMS}")
    parts = []
    for name in names:
        parts.append(_samples(os.path.join(directory, name)))
        if parts[-1].shape[2] != parts[0].shape[2]:
            raise TokenFileError(f"{os.path.join(directory, name)}: samples of {parts[-1].shape[2]} positions, but {names[0]}'s "
                                 f"are {parts[0].shape[2]}; a directory holds one export of one max_seq_length: give each "
                                 "export its own directory (and source)")
    samples = np.concatenate(parts)
    if not len(samples):
        return TokenFile(directory, np.empty(0, samples.dtype), np.empty(0, np.int64), info={"format": "cerebras_hdf5", "mode": mode})
    inputs, labels = samples[:, 0], samples[:, 2]
    trained = (samples[:, 1] != 0) != inverted
    window = np.concatenate([inputs[:, :1], labels], axis=1)
    positions = np.arange(window.shape[1])
    if mode == "Summarization":
        last = window.shape[1] - 2 - np.argmax(trained[:, ::-1], axis=1)
        real = np.where(trained.any(axis=1), last + 1, 0)
        take = positions < (real + 1)[:, None]
        tokens = window[take]
        loss = np.concatenate([np.zeros((len(window), 1), bool), trained], axis=1)[take]
        ends = np.cumsum(real + 1)
        return TokenFile(directory, tokens, ends, loss.astype(np.uint8), info={"format": "cerebras_hdf5", "mode": mode})
    if mode != "LMData":
        raise TokenFileError(f"{directory}: samples written in Cerebras's {mode!r} mode ({DATA_PARAMS}: setup); tokenmix reads "
                             "LMData and Summarization samples back as documents (FIM samples are rearranged: export the "
                             "documents again in LMData mode, or read the source they were made from)")
    real = trained.sum(axis=1)
    if packed:
        closes = np.zeros(len(window), bool)
        closes[-1] = True
    else:
        if eos is None:
            raise TokenFileError(f"{directory}: unpacked LMData samples end their documents with EOS, and neither data_params.json "
                                 "nor token_files.eos_id gives it")
        closes = (window[np.arange(len(window)), real] == eos) | (np.arange(len(window)) == len(window) - 1)
    take = positions < (real + closes)[:, None]
    tokens = window[take]
    if packed:
        ends = document_ends(tokens, None if eos is None else int(eos))
    else:
        ends = np.cumsum(real + closes)[closes]
    return TokenFile(directory, tokens, ends, info={"format": "cerebras_hdf5", "mode": mode, "pack_sequences": packed})
