"""Nanotron's original Nanoset token files (``*_input_ids.npy``): despite the name, a headerless dump of uint16 or
int32 tokens, one stream without document boundaries. A file that does carry a numpy header is read through it.

Documents are not delimited in these files: the stream is one document unless an ``eos_id`` is given, after each of
which a document ends.
"""

from __future__ import annotations

import os

import numpy as np

from tokenmix.sources.token_file_base import TokenFile, TokenFileError, document_ends, local_path

NANOSET_DTYPES = ("uint16", "int32")
NPY_MAGIC = b"\x93NUMPY"


def nanoset_dtype(vocab_size: int) -> str:
    """The token type Nanotron gives a Nanoset of a vocabulary (run_train.py: int32 when ``len(tokenizer)`` is over
    65,536, else uint16), so that what tokenmix writes and what it reads of a Nanotron config agree with Nanotron."""
    return "uint16" if vocab_size <= 1 << 16 else "int32"


def open_nanoset(path: str, dtype: str | None, eos_id: int | None) -> TokenFile:
    """One Nanoset token file, memory-mapped; ``dtype`` must be given for a headerless dump (Nanotron chose it from the
    vocabulary size: ``nanoset_dtype``)."""
    path = local_path(path, "nanoset")
    if not os.path.exists(path):
        raise TokenFileError(f"{path}: no such file")
    with open(path, "rb") as f:
        headed = f.read(len(NPY_MAGIC)) == NPY_MAGIC
    if headed:
        try:
            tokens = np.load(path, mmap_mode="r").view(np.ndarray)
        except ValueError as e:
            raise TokenFileError(f"{path}: numpy cannot map it as a .npy array ({e}); the file is cut short or damaged, or holds "
                                 "no plain array of tokens: copy it again, or write it again") from None
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise TokenFileError(f"{path}: a .npy of {tokens.dtype} with shape {tokens.shape}; Nanoset token files hold one 1-d "
                                 "integer array")
        if dtype and np.dtype(dtype) != tokens.dtype:
            raise TokenFileError(f"{path}: token_files.dtype is {dtype}, but the file's header says {tokens.dtype}; remove dtype")
    else:
        if dtype not in NANOSET_DTYPES:
            raise TokenFileError(f"{path}: a headerless Nanoset dump; set token_files.dtype to the type it was written with "
                                 f"({' or '.join(NANOSET_DTYPES)}: uint16 for vocabularies of up to 65,536 tokens)")
        token_dtype = np.dtype(dtype)
        nbytes = os.path.getsize(path)
        if nbytes % token_dtype.itemsize:
            raise TokenFileError(f"{path}: {nbytes} bytes is not a whole number of {dtype} tokens; the file is truncated or not {dtype}")
        count = nbytes // token_dtype.itemsize
        tokens = np.memmap(path, token_dtype, mode="r", shape=(count,)).view(np.ndarray) if count else np.empty(0, token_dtype)
    return TokenFile(path, tokens, document_ends(tokens, eos_id), info={"format": "nanoset", "dtype": tokens.dtype.name,
                                                                        "eos_id": eos_id})
