"""datatrove's tokenized files: ``name.ds`` (raw little-endian tokens), ``name.ds.index`` (uint64 end of each
document, in tokens), and optionally ``name.ds.loss`` (one byte per token: trained on or not) and ``name.ds.metadata``
(``tokenizer|token size`` on its first line, or the tokenizer alone before datatrove's ``token_size``; then the token
count).
"""

from __future__ import annotations

import logging
import os

import numpy as np

from tokenmix.sources.token_file_base import TokenFile, TokenFileError, document_ends, local_path
from tokenmix.sources.urls import expand_urls

logger = logging.getLogger(__name__)

TOKEN_SIZES = {2: np.uint16, 4: np.uint32}


def datatrove_files(urls: list[str]) -> list[str]:
    """The ``.ds`` files of ``urls`` in order: a folder gives every ``.ds`` file under it, sorted; a file or glob, itself."""
    files: list[str] = []
    for url in expand_urls(urls):
        path = local_path(url, "datatrove")
        if os.path.isdir(path):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names if name.endswith(".ds"))
            if not found:
                raise TokenFileError(f"{path}: no .ds files in this folder; a datatrove source names a folder of tokenized files "
                                     "or the .ds files themselves")
            files.extend(found)
        else:
            files.append(path)
    return files


def read_metadata(path: str) -> tuple[str | None, int | None]:
    """The tokenizer name and token size a ``.ds.metadata`` file records, or (None, None) where there is none. datatrove
    before its ``token_size`` option wrote the tokenizer name alone (its tokens were all uint16): the size is then None."""
    try:
        with open(path + ".metadata", encoding="utf-8") as f:
            first = f.readline().strip()
    except FileNotFoundError:
        return None, None
    if "|" not in first:
        return first or None, None
    name, _, size = first.rpartition("|")
    if not size.isdigit():
        raise TokenFileError(f"{path}.metadata: first line {first!r} is not `tokenizer|token size`, as datatrove writes it")
    return name or None, int(size)


def open_datatrove(path: str, dtype: str | None = None) -> TokenFile:
    """The documents of one ``.ds`` file, memory-mapped; ``dtype`` (uint16, uint32) where no metadata says the token size."""
    if not os.path.exists(path):
        raise TokenFileError(f"{path}: no such file")
    tokenizer, size = read_metadata(path)
    declared = np.dtype(dtype) if dtype else None
    if declared is not None and size is not None and declared.itemsize != size:
        raise TokenFileError(f"{path}: token_files.dtype is {declared}, but {path}.metadata says tokens are {size} bytes; remove "
                             "dtype or correct it")
    token_dtype = declared or np.dtype(TOKEN_SIZES.get(size or 2, np.uint16))
    if token_dtype.itemsize not in TOKEN_SIZES:
        raise TokenFileError(f"{path}: datatrove tokens are 2 or 4 bytes, not {token_dtype.itemsize} ({token_dtype})")
    token_dtype = np.dtype(TOKEN_SIZES[token_dtype.itemsize]).newbyteorder("<")
    nbytes = os.path.getsize(path)
    if nbytes % token_dtype.itemsize:
        raise TokenFileError(f"{path}: {nbytes} bytes is not a whole number of {token_dtype.itemsize}-byte tokens; the file is "
                             "truncated, or its token size is not the one declared")
    count = nbytes // token_dtype.itemsize
    tokens = np.memmap(path, token_dtype, mode="r", shape=(count,)).view(np.ndarray) if count else np.empty(0, token_dtype)
    if os.path.exists(path + ".index"):
        ends = _document_ends(path + ".index", count)
    else:
        logger.warning("%s has no .index file: its tokens are read as one document", path)
        ends = document_ends(tokens, None)
    loss = None
    if os.path.exists(path + ".loss"):
        if os.path.getsize(path + ".loss") != count:
            raise TokenFileError(f"{path}.loss: {os.path.getsize(path + '.loss')} bytes, not one per token ({count})")
        loss = np.memmap(path + ".loss", np.uint8, mode="r", shape=(count,)).view(np.ndarray) if count else np.empty(0, np.uint8)
    return TokenFile(path, tokens, ends, loss, info={"format": "datatrove", "dtype": token_dtype.name, "tokenizer": tokenizer})


def _document_ends(index_path: str, count: int) -> np.ndarray:
    """The document ends a ``.ds.index`` lists, refused unless they are whole uint64 entries that never decrease and end at
    ``count``: an empty index over tokens would give them no documents, and a partial entry is a cut or damaged file. An
    end equal to the one before is a document of no tokens, which datatrove writes where a document's loss values cut
    all of its tokens off."""
    nbytes = os.path.getsize(index_path)
    if nbytes % 8:
        raise TokenFileError(f"{index_path}: {nbytes} bytes is not a whole number of 8-byte document ends; the index is cut "
                             "short or damaged: write it again with datatrove's tokenizer")
    ends = np.fromfile(index_path, np.dtype("<u8")).astype(np.int64)
    if not ends.size and count:
        raise TokenFileError(f"{index_path}: lists no documents, but the file holds {count} tokens; the index is damaged "
                             "or belongs to another file: write it again with datatrove's tokenizer")
    if ends.size and (ends[-1] != count or np.any(np.diff(ends) < 0) or ends[0] < 0):
        raise TokenFileError(f"{index_path}: document ends must increase (or stay, for a document of no tokens) to the file's "
                             f"{count} tokens (last is {int(ends[-1])}); the index belongs to another file or is damaged")
    return ends
