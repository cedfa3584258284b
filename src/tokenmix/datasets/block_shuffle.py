"""Newer Levanter's hierarchical block shuffle of a source's examples: pure index math, no I/O.

Examples are grouped into blocks of ``io_block_size`` consecutive examples; the full blocks are permuted, then taken
``window_blocks`` at a time, and the examples of each window are permuted among themselves. A read therefore stays
inside a few blocks at a time (locality for storage) while every example can move anywhere within its window. A last,
partial block stays at the very end, its examples permuted among themselves, as in Levanter. The permutations are
tokenmix's keyed Feistel permutations, so the order is a bijection computed per index, never materialized.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tokenmix.datasets.permutation import FeistelPermutation, derive_key
from tokenmix.datasets.settings import BlockShuffle


def block_shuffled(index: np.ndarray, length: int, shape: BlockShuffle, key: int) -> np.ndarray:
    """The example each position ``index`` (in ``[0, length)``) reads under the block shuffle ``shape`` keyed ``key``."""
    index = np.asarray(index, np.int64)
    block, window_blocks = shape.io_block_size, shape.window_blocks
    full, tail = divmod(length, block)
    blocks = full + (tail > 0)
    window_size = block * window_blocks
    window, offset = np.divmod(index, window_size)
    out = np.empty_like(index)
    for w in np.unique(window).tolist():
        members = window == w
        first_block = w * window_blocks
        in_window = min(window_blocks, blocks - first_block)
        has_tail = tail > 0 and first_block + in_window == blocks
        full_region = (in_window - has_tail) * block
        local = offset[members]
        result = np.empty_like(local)
        body = local < full_region
        if body.any():
            moved = _permutation(full_region, derive_key(key, "window", w))(local[body])
            position_block, within = np.divmod(moved, block)
            physical = position_block + first_block
            if full > 1:
                physical = _permutation(full, derive_key(key, "blocks"))(physical)
            result[body] = physical * block + within
        if (~body).any():
            result[~body] = full * block + _permutation(tail, derive_key(key, "tail", w))(local[~body] - full_region)
        out[members] = result
    return out


@lru_cache(maxsize=1024)
def _permutation(size: int, key: int) -> FeistelPermutation:
    return FeistelPermutation(size, key)
