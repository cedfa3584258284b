"""The options of a Cerebras HDF5 export (``Hdf5ExportOptions``), with the names and defaults of Cerebras's
``create_hdf5_dataset.py`` (modelzoo Release_2.1.1, ``hdf5_preprocessing``), each checked when the options are made: a
wrong value is refused naming the field and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tokenmix.sources.cerebras_hdf5 import PROCESSOR_MODES

MODES = {"lm": "LMData", "summarization": "Summarization", "fim": "FIM"}
"""This exporter's mode names and Cerebras's."""

PROCESSORS = {mode: processor for processor, cerebras in PROCESSOR_MODES.items() for mode, name in MODES.items() if name == cerebras}
"""The class of ``hdf5_dataset_preprocessors.py`` that Cerebras runs for each mode (``setup.dataset_processor``)."""

_COMPRESSIONS = (None, "gzip")


@dataclass(frozen=True)
class Hdf5ExportOptions:
    """How a cache becomes Cerebras HDF5 samples, with the option names of Cerebras's ``create_hdf5_dataset.py``.

    Every field is a Cerebras option except the two marked as this exporter's own.

    The three rows of a sample share one HDF5 dataset, so the file stores all of them as ``input_ids_dtype``; when
    ``input_mask_dtype`` differs, both are recorded in ``data_params.json`` (its mask row holds only 0 and 1, which
    every integer dtype represents exactly).
    """

    mode: Literal["lm", "summarization", "fim"] = "lm"
    """``lm`` (Cerebras's LMData: every token trained on), ``summarization`` (one document per sample, trained only on
    its loss spans; needs a cache that stores them, such as one of the supervised format) or ``fim`` (LMData samples
    rearranged for fill-in-the-middle, as Cerebras's FIM mode does; needs ``tokenizer``)."""
    max_seq_length: int = 2048
    """Positions per sample, at least 2. A full sample takes ``max_seq_length + 1`` tokens: its inputs are all but the
    last, its labels all but the first; the next window starts on the last of them."""
    pack_sequences: bool = True
    """``lm``, ``fim``: true concatenates the documents (each with the EOS it was stored with) into one stream cut into
    windows of ``max_seq_length + 1`` tokens every ``max_seq_length``; the stream's last, partial window is not written
    (as Cerebras; ``keep_last_window`` writes it). False cuts each document alone the same way and pads its last window;
    a last window of one token (already the label before it) is dropped and counted in ``discarded_files``."""
    min_sequence_len: int = 6
    """Windows (``lm``, ``fim``) or examples (``summarization``) of fewer tokens are skipped and counted in
    ``discarded_files``. Packed windows are full, so it skips none of them unless it exceeds ``max_seq_length + 1``. The
    default is what ``create_hdf5_dataset.py``'s command line gives (its documentation says 10)."""
    short_seq_prob: float = 0.0
    """``lm``, ``fim``: the probability that a window is cut to a count of tokens drawn from ``[2, max_seq_length - 1]``
    and padded, drawn per window from Python's ``random.Random(seed)`` as Cerebras draws. The tokens cut off are lost,
    as in Cerebras, unless ``short_seq_carry``."""
    inverted_mask: bool = False
    """False: mask 1 marks the positions trained on. True: 1 marks the positions not trained on (padding included)."""
    input_ids_dtype: str = "int32"
    """Integer numpy dtype of the input ids and labels, and of the ``data`` dataset; it must hold every token id
    (Cerebras stores int32 whatever this says: int32 gives its files)."""
    input_mask_dtype: str = "int32"
    """Integer numpy dtype of the loss mask, recorded for readers; stored as ``input_ids_dtype`` (see the class)."""
    pad_id: int | None = None
    """Id written at padded positions of input ids and labels; None takes the cache's EOS id (as Cerebras does for a
    tokenizer without a ``<|padding|>`` token), or 0 without one."""
    output_name: str = "examples"
    """Prefix of the file names: ``{output_name}_{i}_0.h5``, as Cerebras's single process names them."""
    files_per_record: int = 50000
    """Samples per file."""
    write_remainder: bool = True
    """Write the last file when it holds fewer than ``files_per_record`` samples; false drops it (as Cerebras)."""
    seed: int = 0
    """Seed of ``short_seq_prob``'s draws (Python's ``random``) and of FIM's (numpy's ``RandomState``): the same seed
    gives the same files, and Cerebras's for one process."""
    fim_rate: float = 0.9
    """``fim``: the probability that a document's part of a sample is rearranged (else it stays left to right)."""
    spm_rate: float = 0.5
    """``fim``: the probability that a rearranged part takes suffix-prefix-middle order (else prefix-suffix-middle)."""
    fim_prefix_tok: str = "<fim_prefix>"
    """``fim``: the token that opens the prefix; it must be in the tokenizer's vocabulary (so must the next two)."""
    fim_middle_tok: str = "<fim_middle>"
    """``fim``: the token that opens the middle."""
    fim_suffix_tok: str = "<fim_suffix>"
    """``fim``: the token that opens the suffix."""
    keep_last_window: bool = False
    """This exporter's own: with packing, write the stream's final, partial window (padded) that Cerebras never writes,
    so that no token of the cache is lost."""
    short_seq_carry: bool = False
    """This exporter's own: a window cut short by ``short_seq_prob`` leaves the tokens it did not take to start the next
    window, instead of losing them as Cerebras does."""
    compression: Literal["gzip"] | None = "gzip"
    """This exporter's own: the HDF5 filter of ``data``, ``gzip`` (built into every HDF5 library, as Cerebras writes)
    or None (larger files, faster export)."""
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
        for name in ("pack_sequences", "inverted_mask", "write_remainder", "keep_last_window", "short_seq_carry"):
            if not isinstance(getattr(self, name), bool):
                _refuse(name, getattr(self, name), "give true or false")
        for name in ("short_seq_prob", "fim_rate", "spm_rate"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                _refuse(name, value, "give a probability in [0, 1]")
        if self.short_seq_prob and self.max_seq_length < 3:
            _refuse("short_seq_prob", self.short_seq_prob, "short windows take 2 to max_seq_length - 1 tokens: give max_seq_length 3 or more, or 0")
        for name in ("fim_prefix_tok", "fim_middle_tok", "fim_suffix_tok"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                _refuse(name, getattr(self, name), "give the token's text, such as <fim_prefix>")
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
