"""The benchmarks' limit: the token windows of mixture rows gathered from raw numpy memmaps of the caches.

Shared by scripts/bench_datasets.py and scripts/bench_loader.py (run from the repository root; the
scripts' folder is on the import path when a script runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from tokenmix import LMMixtureDatasetConfig, MixtureDataset, TokenCache


def memmap_gather(config: LMMixtureDatasetConfig, train: MixtureDataset, index: np.ndarray, seq_len: int,
                  tmp: str) -> Callable[..., np.ndarray]:
    """The limit: a function gathering the token windows of mixture ``index`` rows from raw memmaps of the caches."""
    ids, draws = train.locate(index)
    windows = np.empty(len(index), np.int64)
    for sid, name in enumerate(train.names):
        mine = ids == sid
        if mine.any():
            windows[mine] = train.source(name).examples(draws[mine])
    maps = []
    for name in train.names:
        cache = TokenCache(config.cache_location(name, "train"))
        path = os.path.join(tmp, f"{name}.npy")
        np.save(path, cache.read_tokens(0, cache.num_tokens()))
        maps.append(np.load(path, mmap_mode="r"))
    first = int(index[0])

    def gather(rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The rows' token windows as int32, in a new array or written into ``out``."""
        at = rows - first
        windows_ = [maps[s][w * seq_len : (w + 1) * seq_len] for s, w in zip(ids[at], windows[at])]
        return np.stack(windows_).astype(np.int32) if out is None else np.stack(windows_, out=out)

    return gather
