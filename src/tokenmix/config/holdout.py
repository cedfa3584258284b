"""Choosing held-out validation documents from a training cache: pure index math, no I/O.

Documents are taken in a seeded pseudo-random order (or from the end) until they hold the requested number of tokens;
everything else stays in training, so the two sets never share a document (or a token).
"""

from __future__ import annotations

import numpy as np

from tokenmix.datasets.permutation import FeistelPermutation


def held_out_documents(doc_lengths: np.ndarray, tokens_wanted: int, key: int, asked: str, shuffle: bool = True) -> np.ndarray:
    """Sorted row numbers of the held-out documents: the fewest, in seeded order (``shuffle``) or from the end of the
    cache (not: Levanter's unshuffled split keeps its last sequences), holding ``tokens_wanted``. ``asked`` says what
    asks for them, for the message refusing to hold out every token."""
    n = len(doc_lengths)
    if tokens_wanted <= 0 or n == 0:
        return np.zeros(0, np.int64)
    order = FeistelPermutation(n, key)(np.arange(n)) if shuffle else np.arange(n - 1, -1, -1)
    covered = np.cumsum(doc_lengths[order])
    if covered[-1] <= tokens_wanted:
        raise ValueError(f"{asked} asks to hold out {tokens_wanted} tokens, all {int(covered[-1])} of its tokens: lower it, so "
                         "that some stay in training")
    take = int(np.searchsorted(covered, tokens_wanted, side="left")) + 1
    return np.sort(order[:take])


def kept_documents(num_docs: int, held_out: np.ndarray) -> np.ndarray:
    """The complement of ``held_out`` in [0, num_docs), sorted."""
    keep = np.ones(num_docs, bool)
    keep[held_out] = False
    return np.flatnonzero(keep)
