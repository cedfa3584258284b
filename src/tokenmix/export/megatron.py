"""A cache written as Megatron-LM's indexed dataset: ``prefix.bin`` (the tokens) and ``prefix.idx`` (where each sequence
is), the files ``sources/megatron.py`` reads. One sequence (and document) per row; tokens are uint16 below 65,500
tokens of vocabulary, else int32, as Megatron's preprocessing picks.

The cache is streamed a bounded batch of rows at a time (``streaming.py``) under temporary names, renamed when
complete, the index last, so a file that exists is whole.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tokenmix.export.streaming import TokenSource, atomic_files, local_file_output, refuse_loss_spans, row_batches
from tokenmix.sources.megatron import HEADER, MAGIC, VERSION, dtype_code


def megatron_dtype(vocab_size: int) -> np.dtype:
    """The token type Megatron's preprocessing picks for a vocabulary (``DType.optimal_dtype``)."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def export_megatron(cache: TokenSource, prefix: str, progress: bool = True) -> dict[str, Any]:
    """Write ``prefix.bin`` and ``prefix.idx``: one Megatron sequence (and document) per row of the cache. A cache that
    masks the loss is refused (the files hold ids only)."""
    prefix = local_file_output(prefix, "Megatron", prefix=True)
    refuse_loss_spans(cache, "Megatron's indexed datasets")
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
