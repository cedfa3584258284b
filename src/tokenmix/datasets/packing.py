"""Packing documents into fixed-length examples: pure index math on document lengths, no I/O.

Documents, taken in a given order, become *pieces* of at most ``seq_len`` tokens: a longer document is
truncated (``truncate`` keeps its first ``seq_len`` tokens, ``truncate_start`` its last, as Levanter's
``left``/``right`` slice strategies) or ``split`` into consecutive pieces of ``seq_len`` tokens and a
remainder. Pieces are then packed greedily in order (next fit, as Levanter's ``pack_documents``): an
example takes pieces while they fit in ``seq_len`` tokens and it holds fewer than ``max_segments``;
the piece that does not fit opens the next example. Each piece is one segment of its example.

Next fit is sequential by nature (where an example starts depends on where the one before ended), but
the step "the example starting at piece i ends before piece f(i)" is one vectorized binary search over
the prefix sums of the lengths, and the chain 0, f(0), f(f(0)), ... is found by pointer doubling:
``f^t(0)`` for every t at once, in log2(#examples) rounds of array gathers. No Python loop per document
or per example.

Packing is prefix-stable: an example that closed (the next piece did not fit, or the segment cap was
reached) closes the same way whatever documents come later, so a still-growing cache's prefix can be
planned and the plan extended later from where its last, still open, example starts.
"""

from __future__ import annotations

import numpy as np

from tokenmix.datasets.segments import expand_counts


def document_pieces(lengths: np.ndarray, seq_len: int, long_documents: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces documents of ``lengths`` tokens become, in order: each piece's document (index into
    ``lengths``), its first token within the document, and its length (1 to ``seq_len``).

    Empty documents give no piece.
    """
    lengths = np.asarray(lengths, np.int64)
    if long_documents == "split":
        owner, rank = expand_counts(-(-lengths // seq_len))
        offset = rank * seq_len
        return owner, offset, np.minimum(lengths[owner] - offset, seq_len)
    owner = np.flatnonzero(lengths > 0) if len(lengths) and lengths.min() < 1 else np.arange(len(lengths))
    size = np.minimum(lengths[owner], seq_len)
    offset = lengths[owner] - size if long_documents == "truncate_start" else np.zeros(len(owner), np.int64)
    return owner, offset, size


def next_fit(sizes: np.ndarray, seq_len: int, max_segments: int | None, complete: bool) -> tuple[np.ndarray, int]:
    """Greedy next-fit packing of pieces of ``sizes`` (each at most ``seq_len``) in order.

    Returns the first piece of every closed example, and the first piece of the example still open (it
    could take more pieces when more arrive), which is ``len(sizes)`` when there is none. With
    ``complete`` (no piece will ever follow) the last example is closed too.
    """
    sizes = np.asarray(sizes, np.int64)
    n = len(sizes)
    if n == 0:
        return np.zeros(0, np.int64), 0
    if int(sizes.max()) > seq_len or int(sizes.min()) < 1:
        raise ValueError(f"pieces must hold 1 to {seq_len} tokens, got {int(sizes.min())} to {int(sizes.max())}")
    index_type = np.int32 if n < 2**31 - 1 else np.int64
    ends = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=ends[1:])
    # the example starting at piece i takes pieces up to (not including) step[i]
    step = np.empty(n + 1, index_type)
    step[:n] = np.searchsorted(ends, ends[:n] + seq_len, side="right") - 1
    if max_segments is not None:
        np.minimum(step[:n], np.arange(n, dtype=np.int64) + max_segments, out=step[:n], casting="unsafe")
    step[n] = n
    # next fit opens fewer than 2 * tokens / seq_len examples closed by length, plus those closed by the cap
    bound = min(n, 2 * int(ends[-1]) // seq_len + (n // max_segments if max_segments else 0) + 2)
    size = 1 << int(bound).bit_length()
    chain = np.zeros(size, index_type)  # chain[t] = step^t(0)
    bit = 0
    while (1 << bit) < size:  # the t whose bit is set: the upper half of every block of 2^(bit+1)
        jump = chain.reshape(-1, 2 << bit)[:, 1 << bit :]
        jump[...] = step[jump]
        bit += 1
        if (1 << bit) < size:
            step = step[step]
    count = int(np.searchsorted(chain, n, side="left"))
    starts = chain[:count].astype(np.int64)
    if complete or count == 0:
        return starts, n
    return starts[:-1], int(starts[-1])


def example_bounds(starts: np.ndarray, end: int) -> np.ndarray:
    """Piece boundaries of the examples that start at ``starts`` and end where the next one starts (the last at ``end``)."""
    return np.append(np.asarray(starts, np.int64), end)
