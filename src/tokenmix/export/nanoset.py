"""A cache written as Nanotron's original Nanoset token file (``*_input_ids.npy``), the file ``sources/nanoset.py``
reads: one headerless stream of uint16 (vocabularies of up to 65,536 tokens, as Nanotron) or int32 tokens, without document boundaries.

The cache is streamed a bounded batch of rows at a time (``streaming.py``) under a temporary name, renamed when
complete.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tokenmix.export.streaming import TokenSource, atomic_files, local_file_output, refuse_loss_spans, row_batches
from tokenmix.sources.nanoset import nanoset_dtype


def export_nanoset(cache: TokenSource, path: str, progress: bool = True) -> dict[str, Any]:
    """Write the cache's token stream to ``path`` as Nanotron's original Nanoset did: a headerless dump (uint16 for
    vocabularies of up to 65,536 tokens, else int32) without document boundaries (each document keeps its EOS). A cache
    that masks the loss is refused (the file holds ids only)."""
    path = local_file_output(path, "Nanoset")
    refuse_loss_spans(cache, "Nanoset token files")
    dtype = np.dtype(nanoset_dtype(cache.identity["vocab_size"]))
    total = 0
    with atomic_files(path) as (f,):
        for batch in row_batches(cache, description=f"nanoset {os.path.basename(path)}", progress=progress):
            f.write(np.ascontiguousarray(batch.tokens, dtype).tobytes())
            total += len(batch.tokens)
    return {"format": "nanoset", "path": path, "documents": cache.num_rows(), "tokens": total, "dtype": dtype.name}
