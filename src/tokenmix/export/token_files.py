"""A cache written as the token files other stacks train from: Megatron ``.bin/.idx``, datatrove ``.ds`` (with its
index, loss values and metadata) and Nanotron's Nanoset ``.npy`` dump.

Each export streams the cache a bounded batch of rows at a time (``streaming.py``), writes under temporary names and
renames when complete, the index last, so a file that exists is whole. Token types follow what each stack itself
picks for the vocabulary: Megatron and Nanoset uint16 below 65,500 (65,536) tokens, else int32; datatrove 2-byte tokens
up to 65,535, else 4.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from tokenmix.export.streaming import TokenSource, atomic_files, row_batches
from tokenmix.sources.datatrove_tokens import TOKEN_SIZES
from tokenmix.sources.megatron import HEADER, MAGIC, VERSION, dtype_code

logger = logging.getLogger(__name__)


def megatron_dtype(vocab_size: int) -> np.dtype:
    """The token type Megatron's preprocessing picks for a vocabulary (``DType.optimal_dtype``)."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def export_megatron(cache: TokenSource, prefix: str, progress: bool = True) -> dict[str, Any]:
    """Write ``prefix.bin`` and ``prefix.idx``: one Megatron sequence (and document) per row of the cache."""
    dtype = megatron_dtype(cache.identity["vocab_size"])
    lengths: list[np.ndarray] = []
    with atomic_files(prefix + ".bin", prefix + ".idx") as (bin_file, idx_file):
        for batch in row_batches(cache, description=f"megatron {os.path.basename(prefix)}", progress=progress):
            bin_file.write(np.ascontiguousarray(batch.tokens, dtype).tobytes())
            lengths.append(batch.lengths)
        sizes = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
        if sizes.size and sizes.max() > np.iinfo(np.int32).max:
            raise ValueError(f"{cache.location}: a row of {int(sizes.max())} tokens is longer than a Megatron sequence can be (int32)")
        pointers = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) * dtype.itemsize if sizes.size else np.empty(0, np.int64)
        documents = np.arange(len(sizes) + 1, dtype=np.int64)
        idx_file.write(HEADER.pack(MAGIC, VERSION, dtype_code(dtype), len(sizes), len(documents)))
        for array in (sizes.astype("<i4"), pointers.astype("<i8"), documents.astype("<i8")):
            idx_file.write(array.tobytes())
    return {"format": "megatron", "path": prefix, "documents": int(len(sizes)), "tokens": int(sizes.sum()), "dtype": dtype.name}


def export_datatrove(cache: TokenSource, path: str, tokenizer: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Write ``path`` (a ``.ds`` file) with its ``.index``, ``.metadata`` and, for a cache that masks the loss, ``.loss``."""
    size = 2 if cache.identity["vocab_size"] <= 1 << 16 else 4
    dtype = np.dtype(TOKEN_SIZES[size]).newbyteorder("<")
    names = [path, path + ".index"] + ([path + ".loss"] if cache.has_loss_spans else [])
    total = 0
    with atomic_files(*names) as files:
        for batch in row_batches(cache, description=f"datatrove {os.path.basename(path)}", progress=progress):
            files[0].write(np.ascontiguousarray(batch.tokens, dtype).tobytes())
            files[1].write((total + np.cumsum(batch.lengths)).astype("<u8").tobytes())
            if batch.trained is not None:
                files[2].write(batch.trained.astype(np.uint8).tobytes())
            total += int(batch.lengths.sum())
    name = tokenizer or cache.identity.get("tokenizer_fingerprint", "unknown")
    with atomic_files(path + ".metadata") as (meta,):
        meta.write(f"{name}|{size}\n{total}\n{total / 1e9:.1f}GT".encode())
    return {"format": "datatrove", "path": path, "documents": cache.num_rows(), "tokens": total, "dtype": dtype.name,
            "loss": cache.has_loss_spans}


def export_nanoset(cache: TokenSource, path: str, progress: bool = True) -> dict[str, Any]:
    """Write the cache's token stream to ``path`` as Nanotron's original Nanoset did: a headerless dump (uint16 for
    vocabularies under 65,536 tokens, else int32) without document boundaries (each document keeps its EOS)."""
    dtype = np.dtype(np.uint16 if cache.identity["vocab_size"] <= 1 << 16 else np.int32)
    total = 0
    with atomic_files(path) as (f,):
        for batch in row_batches(cache, description=f"nanoset {os.path.basename(path)}", progress=progress):
            f.write(np.ascontiguousarray(batch.tokens, dtype).tobytes())
            total += len(batch.tokens)
    return {"format": "nanoset", "path": path, "documents": cache.num_rows(), "tokens": total, "dtype": dtype.name}
