"""The options of a Cerebras HDF5 export (``Hdf5ExportOptions``), with the names of Cerebras's ``create_hdf5_dataset.py``,
each checked when the options are made: a wrong value is refused naming the field and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

MODES = {"lm": "LMData", "summarization": "Summarization"}
"""This exporter's mode names and Cerebras's."""

_COMPRESSIONS = (None, "gzip")


@dataclass(frozen=True)
class Hdf5ExportOptions:
    """How a cache becomes Cerebras HDF5 samples, with the option names of Cerebras's ``create_hdf5_dataset.py``.

    Every field is a Cerebras option except the two marked as this exporter's own.

    The three rows of a sample share one HDF5 dataset, so the file stores all of them as ``input_ids_dtype``; when
    ``input_mask_dtype`` differs, both are recorded in ``data_params.json`` (its mask row holds only 0 and 1, which
    every integer dtype represents exactly).
    """

    mode: Literal["lm", "summarization"] = "lm"
    """``lm`` (Cerebras's LMData: every token trained on) or ``summarization`` (one document per sample, trained only on
    its loss spans; needs a cache that stores them, such as one of the supervised format)."""
    max_seq_length: int = 2048
    """Positions per sample, at least 2. A full sample takes ``max_seq_length + 1`` tokens: its inputs are all but the
    last, its labels all but the first."""
    pack_sequences: bool = True
    """``lm``: true concatenates the documents (each with the EOS it was stored with) into one stream and cuts it into
    samples, so only the last is padded; false cuts each document on its own and pads its last sample. Either way, as
    Cerebras cuts, each sample starts on the token the one before ends with (its last label), so no label is lost.
    Summarization never packs."""
    min_sequence_len: int = 10
    """Documents of fewer tokens are skipped and counted (``discarded_documents``). Without packing a document needs at
    least 2 tokens (one label) whatever this says."""
    short_seq_prob: float = 0.0
    """``lm``: the probability that a sample takes fewer tokens, a count drawn uniformly from ``[2, max_seq_length]``,
    and is padded after them; the tokens it leaves start the next sample, so none is lost."""
    inverted_mask: bool = False
    """False: mask 1 marks the positions trained on. True: 1 marks the positions not trained on (padding included)."""
    input_ids_dtype: str = "int32"
    """Integer numpy dtype of the input ids and labels, and of the ``data`` dataset; it must hold every token id."""
    input_mask_dtype: str = "int32"
    """Integer numpy dtype of the loss mask, recorded for readers; stored as ``input_ids_dtype`` (see the class)."""
    pad_id: int | None = None
    """Id written at padded positions of input ids and labels; None takes the cache's EOS id, or 0 without one."""
    output_name: str = "examples"
    """Prefix of the file names: ``{output_name}_{i:05d}.h5``."""
    files_per_record: int = 50000
    """Samples per file; the last file holds the rest."""
    write_remainder: bool = True
    """``lm`` with packing: write the stream's final, partial sample (padded); false drops it, its labels counted as
    ``remainder_tokens_dropped``."""
    seed: int = 0
    """Seed of the numpy generator behind ``short_seq_prob``: the same seed gives the same files."""
    compression: Literal["gzip"] | None = "gzip"
    """This exporter's own: the HDF5 filter of ``data``, ``gzip`` (built into every HDF5 library) or None (larger files,
    faster export)."""
    batch_tokens: int = 1 << 20
    """This exporter's own: source tokens handled at once, which bounds memory (about 45 bytes each, some 50 MiB by
    default); at least one sample's worth. The files do not depend on it."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            _refuse("mode", self.mode, f"use one of {sorted(MODES)}")
        for name, least in (("max_seq_length", 2), ("min_sequence_len", 0), ("files_per_record", 1), ("seed", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                _refuse(name, value, f"give a whole number of at least {least}")
        for name in ("pack_sequences", "inverted_mask", "write_remainder"):
            if not isinstance(getattr(self, name), bool):
                _refuse(name, getattr(self, name), "give true or false")
        if not isinstance(self.short_seq_prob, int | float) or isinstance(self.short_seq_prob, bool) or not 0.0 <= self.short_seq_prob <= 1.0:
            _refuse("short_seq_prob", self.short_seq_prob, "give a probability in [0, 1]")
        if self.mode == "summarization" and self.short_seq_prob:
            _refuse("short_seq_prob", self.short_seq_prob, "summarization keeps each document whole in one sample; leave it at 0")
        for name in ("input_ids_dtype", "input_mask_dtype"):
            _integer_dtype(name, getattr(self, name))
        if self.pad_id is not None and (not _is_int(self.pad_id) or self.pad_id < 0):
            _refuse("pad_id", self.pad_id, "give a token id (a whole number, 0 or more) or None for the cache's EOS id")
        if not isinstance(self.output_name, str) or not self.output_name or self.output_name.startswith(".") or re.search(r"[/\\]", self.output_name):
            _refuse("output_name", self.output_name, "give a plain file name prefix (not empty, no path separator, not starting with a dot)")
        if self.compression not in _COMPRESSIONS:
            _refuse("compression", self.compression, f"use one of {list(_COMPRESSIONS)}")
        if not _is_int(self.batch_tokens) or self.batch_tokens < self.max_seq_length + 1:
            _refuse("batch_tokens", self.batch_tokens, f"give at least one sample's tokens, max_seq_length + 1 = {self.max_seq_length + 1}")

    @property
    def data_dtype(self) -> np.dtype:
        """The dtype of the ``data`` dataset (all three rows)."""
        return np.dtype(self.input_ids_dtype)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _integer_dtype(field: str, value: Any) -> None:
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "iu":
        _refuse(field, value, "give an integer numpy dtype such as int32, int16 or uint16")


def _refuse(field: str, value: Any, fix: str) -> None:
    raise ValueError(f"Hdf5ExportOptions.{field} is {value!r}: {fix}")
