"""A cache written as datatrove's tokenized files, the files ``sources/datatrove_tokens.py`` reads: ``name.ds`` with its
``.index``, ``.metadata`` and, for a cache that masks the loss, ``.loss``. Tokens take 2 bytes up to a vocabulary of
65,536, else 4, as datatrove picks.

The cache is streamed a bounded batch of rows at a time (``streaming.py``) under temporary names, renamed when
complete, the metadata last; a ``.loss`` an older export left beside ``name.ds`` is removed when this cache has none.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tokenmix.export.streaming import TokenSource, atomic_files, local_file_output, row_batches
from tokenmix.sources.datatrove_tokens import TOKEN_SIZES


def export_datatrove(cache: TokenSource, path: str, tokenizer: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Write ``path`` (a ``.ds`` file) with its ``.index``, ``.metadata`` and, for a cache that masks the loss, ``.loss``."""
    path = local_file_output(path, "datatrove")
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
    if not cache.has_loss_spans and os.path.lexists(path + ".loss"):  # an older export's, which readers would take for this one's
        os.remove(path + ".loss")
    name = tokenizer or cache.identity.get("tokenizer_fingerprint", "unknown")
    with atomic_files(path + ".metadata") as (meta,):
        meta.write(f"{name}|{size}\n{total}\n{total / 1e9:.1f}GT".encode())
    return {"format": "datatrove", "path": path, "documents": cache.num_rows(), "tokens": total, "dtype": dtype.name,
            "loss": cache.has_loss_spans}
