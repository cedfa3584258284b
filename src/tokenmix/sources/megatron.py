"""Megatron-LM's indexed datasets: ``prefix.bin`` (the tokens) and ``prefix.idx`` (where each sequence is).

The index is the ``MMIDIDX\\x00\\x00`` magic, a little-endian uint64 version (1), a uint8 dtype code, uint64 counts of
sequences and documents, then the int32 length of every sequence, the int64 byte offset of every sequence in the
``.bin`` file, and the int64 first sequence of every document (starting at 0, ending with the sequence count). Each
sequence is a row here (Megatron's preprocessing writes one per document, EOD included).
"""

from __future__ import annotations

import os
import struct

import numpy as np

from tokenmix.sources.token_file_base import TokenFile, TokenFileError, local_path

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}
"""Megatron's dtype codes (``indexed_dataset.DType``)."""
HEADER = struct.Struct("<9sQBQQ")
_WRITE_AGAIN = ("copy the files again from where they were written, or write them again with Megatron's preprocessing (or "
                "`tokenmix export --to megatron` from a cache of the text)")
"""What mends a cut or damaged pair of files, said alike by every refusal of one."""


def dtype_code(dtype: np.dtype) -> int:
    """Megatron's code for a token dtype, or ``TokenFileError`` for one it has no code for."""
    for code, known in DTYPE_CODES.items():
        if np.dtype(known) == np.dtype(dtype):
            return code
    raise TokenFileError(f"Megatron indexed datasets cannot hold {np.dtype(dtype)} tokens; use one of "
                         f"{sorted(np.dtype(t).name for t in DTYPE_CODES.values())}")


def open_megatron(prefix: str) -> TokenFile:
    """The rows of the indexed dataset at ``prefix`` (``prefix.bin`` and ``prefix.idx``), memory-mapped."""
    prefix = local_path(prefix, "megatron")
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    for path in (idx_path, bin_path):
        if not os.path.exists(path):
            raise TokenFileError(f"{path}: no such file; a Megatron source names the common prefix of its .bin and .idx files "
                                 "(or either file)")
    if (idx_size := os.path.getsize(idx_path)) < HEADER.size:  # before mapping it: numpy cannot map an empty file
        raise TokenFileError(f"{idx_path}: {idx_size} bytes is shorter than the Megatron index header; the file is truncated: "
                             f"{_WRITE_AGAIN}")
    index = np.memmap(idx_path, np.uint8, mode="r")
    magic, version, code, sequences, documents = HEADER.unpack(bytes(index[: HEADER.size]))
    if magic != MAGIC:
        raise TokenFileError(f"{idx_path}: not a Megatron index (starts with {magic!r}, not {MAGIC!r})")
    if version != VERSION:
        raise TokenFileError(f"{idx_path}: index version {version}; tokenmix reads version {VERSION}")
    if code not in DTYPE_CODES:
        raise TokenFileError(f"{idx_path}: unknown dtype code {code}; Megatron's codes are {sorted(DTYPE_CODES)}")
    dtype = np.dtype(DTYPE_CODES[code])
    expected = HEADER.size + sequences * (4 + 8) + documents * 8
    if len(index) < expected:
        raise TokenFileError(f"{idx_path}: {len(index)} bytes, but its header promises {sequences} sequences and {documents} "
                             f"documents ({expected} bytes); the file is truncated: {_WRITE_AGAIN}")
    offset = HEADER.size
    lengths = np.frombuffer(index, np.int32, sequences, offset).astype(np.int64)
    pointers = np.frombuffer(index, np.int64, sequences, offset + 4 * sequences)
    ends = np.cumsum(lengths)
    starts = (ends - lengths) * dtype.itemsize
    if not np.array_equal(pointers, starts):
        first = int(np.flatnonzero(pointers != starts)[0])
        raise TokenFileError(f"{idx_path}: sequence {first} starts at byte {int(pointers[first])} of {bin_path}, not right after the "
                             f"one before it ({int(starts[first])}); tokenmix reads .bin files whose sequences are contiguous, "
                             "as Megatron's preprocessing writes them")
    _check_document_index(idx_path, np.frombuffer(index, np.int64, documents, offset + 12 * sequences), sequences)
    size = os.path.getsize(bin_path)
    total = int(ends[-1]) if sequences else 0
    if size < total * dtype.itemsize:
        raise TokenFileError(f"{bin_path}: {size} bytes, but {idx_path} indexes {total} {dtype} tokens ({total * dtype.itemsize} "
                             f"bytes); the .bin file is truncated or belongs to another index: {_WRITE_AGAIN}")
    tokens = np.memmap(bin_path, dtype, mode="r", shape=(total,)).view(np.ndarray) if total else np.empty(0, dtype)
    return TokenFile(bin_path, tokens, ends, info={"format": "megatron", "dtype": dtype.name, "sequences": int(sequences),
                                                   "documents": max(int(documents) - 1, 0)})


def _check_document_index(idx_path: str, document_indices: np.ndarray, sequences: int) -> None:
    """Refuse a document index that does not run from sequence 0 up to the sequence count: megatron-core refuses one
    that does not end there, and one that starts elsewhere or goes back is damaged, so its counts cannot be trusted."""
    problem = None
    if not document_indices.size:
        problem = "has no entries (Megatron writes at least [0])"
    elif document_indices[0] != 0:
        problem = f"starts at sequence {int(document_indices[0])}, not 0"
    elif np.any(np.diff(document_indices) < 0):
        back = int(np.flatnonzero(np.diff(document_indices) < 0)[0])
        problem = f"goes back from sequence {int(document_indices[back])} to {int(document_indices[back + 1])} (entry {back + 1})"
    elif document_indices[-1] != sequences:
        problem = f"ends at sequence {int(document_indices[-1])}, not at the {sequences} sequences the index holds"
    if problem:
        raise TokenFileError(f"{idx_path}: the document index {problem}; the index is damaged or belongs to other sequences: "
                             f"{_WRITE_AGAIN}")
