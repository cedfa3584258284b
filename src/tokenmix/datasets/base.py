"""The random-access dataset protocol every tokenmix dataset follows.

A dataset has a length that may still grow (while its cache builds) and reads batches of examples by
index. ``read(indices)`` issues every read of the batch at once (tensorstore futures) and returns a
``Pending`` batch; ``get_batch`` is the synchronous convenience on top, so no event loop is needed.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from tokenmix._waiting import poll_until
from tokenmix.datasets.segments import fill_documents, segment_positions

logger = logging.getLogger(__name__)

T = TypeVar("T")

class Pending(Generic[T]):
    """A batch whose reads are in flight; ``result()`` waits for them and assembles the batch."""

    def __init__(self, finish: Callable[[], T]):
        self._finish = finish

    def result(self) -> T:
        return self._finish()


@dataclass
class TokenBatch:
    """A batch of fixed-length examples (numpy arrays; the loader turns them into jax arrays).

    ``loss_mask[b, i]`` is true when position ``i`` is trained to predict token ``i + 1``: both are in
    the example and in the same document, and (for formats that mask the loss: supervised, chat) token
    ``i + 1`` is one the format trains on. ``segment_ids`` number the documents inside each example
    from 0, so attention can be masked per document; padding after packed documents has segment id -1
    (Levanter's convention) and no loss. ``source_ids`` name the source of each example.
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    segment_ids: np.ndarray
    source_ids: np.ndarray
    _documents: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = field(
        default_factory=list, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_documents(self, rows: np.ndarray, cut_row: np.ndarray, cut_offset: np.ndarray, trained: np.ndarray | None = None) -> None:
        """Leave the segment ids and loss masks of ``rows`` to ``settle_documents``: their documents begin at the cuts
        (cut ``k`` at offset ``cut_offset[k]`` of row ``rows[cut_row[k]]``, see ``fill_documents``), and where
        ``trained`` (``(len(rows), length)``, or None) is false a position is not trained on either.

        Each source of a mixture adds its rows, and the first to finish fills them all in one pass: the work per batch
        does not grow with the number of sources. Rows added must not overlap."""
        self._documents.append((rows, rows[cut_row], cut_offset, trained))

    def settle_documents(self) -> None:
        """Fill the segment ids and loss masks of every row added by ``add_documents`` since the last call."""
        pending, self._documents = self._documents, []
        if not pending:
            return
        rows = np.concatenate([p[0] for p in pending])
        cut_row = np.concatenate([p[1] for p in pending])
        cut_offset = np.concatenate([p[2] for p in pending])
        if len(rows) == len(self):  # every row of the batch (they do not overlap): filled in place
            fill_documents(self.segment_ids, self.loss_mask, cut_row, cut_offset)
        else:
            compact = np.empty(len(self), np.int64)
            compact[rows] = np.arange(len(rows))
            segment_ids = np.empty((len(rows), self.tokens.shape[1]), np.int32)
            loss_mask = np.empty(segment_ids.shape, bool)
            fill_documents(segment_ids, loss_mask, compact[cut_row], cut_offset)
            self.segment_ids[rows] = segment_ids
            self.loss_mask[rows] = loss_mask
        for added, _, _, trained in pending:
            if trained is not None:
                self.loss_mask[added] &= trained

    def positions(self) -> np.ndarray:
        """Each token's position within its segment, from 0 (position ids that restart per packed document)."""
        return segment_positions(self.segment_ids)

    @staticmethod
    def layout(n: int, length: int) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The (shape, dtype) of ``tokens``, ``loss_mask``, ``segment_ids`` and ``source_ids`` for ``n`` examples of
        ``length`` tokens."""
        return [((n, length), np.dtype(np.int32)), ((n, length), np.dtype(bool)), ((n, length), np.dtype(np.int32)), ((n,), np.dtype(np.int32))]

    @staticmethod
    def empty(n: int, length: int) -> TokenBatch:
        """A batch of ``n`` examples of ``length`` tokens to fill with ``put``.

        Every array starts on a 64-byte boundary, which lets JAX's CPU backend place it on devices without a copy
        (an unaligned array is copied, which doubles the cost of placing a batch: docs/benchmarks.md)."""
        return TokenBatch(*aligned_empty(TokenBatch.layout(n, length)))

    def put(self, rows: np.ndarray, part: TokenBatch) -> None:
        """Write ``part``'s examples into ``rows`` of this batch."""
        self.tokens[rows] = part.tokens
        self.loss_mask[rows] = part.loss_mask
        self.segment_ids[rows] = part.segment_ids
        self.source_ids[rows] = part.source_ids


class Dataset(ABC):
    """Random access to examples by index; the length may grow while the underlying cache builds."""

    tokens_per_example: int
    """Tokens in each example (the sequence length), for token accounting."""

    @abstractmethod
    def is_finite(self) -> bool:
        """Whether the dataset has an end (a restarting mixture does not)."""

    @abstractmethod
    def current_len(self) -> int:
        """Examples readable now."""

    @abstractmethod
    def final_len(self) -> int | None:
        """The final length once known (the cache finished); None before that or when infinite."""

    @abstractmethod
    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        """Issue the reads of examples ``indices`` together; ``.result()`` returns the batch in that order."""

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        """Issue the reads of examples ``indices``; the returned function waits and writes them to ``rows`` of ``out``.

        Lets a mixture assemble one batch from many sources without a copy per source.
        """
        pending = self.read(indices)
        return lambda: out.put(rows, pending.result())

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> TokenBatch:
        """The examples ``indices``, read together."""
        return self.read(indices).result()

    def __getitem__(self, index: int) -> TokenBatch:
        return self.get_batch([index])

    def __len__(self) -> int:
        n = self.final_len()
        if n is None:
            raise TypeError(f"{self!r} has no final length yet (still building, or infinite); use current_len()")
        return n

    def wait_for_len(self, n: int, timeout: float | None = None, why: str = "") -> int:
        """Block until at least ``n`` examples are readable or the length is final; returns the length."""
        poll_until(
            lambda: self.current_len() >= n or self.final_len() is not None or not self.is_finite(),
            timeout,
            lambda: f"{self!r}: only {self.current_len()} of {n} examples ready after {timeout} s",
            lambda: logger.info("%r: waiting for %d examples (%d ready)%s", self, n, self.current_len(), f": {why}" if why else ""),
        )
        return self.current_len()

    def wait_until_final(self, timeout: float | None = None, why: str = "") -> int:
        """Block until the length is final; returns it."""
        poll_until(
            lambda: self.final_len() is not None,
            timeout,
            lambda: f"{self!r}: not finished after {timeout} s ({self.current_len()} examples so far)",
            lambda: logger.info("%r: waiting for the cache to finish%s", self, f": {why}" if why else ""),
        )
        return self.final_len()


class DirectDataset(Dataset):
    """A dataset that writes its examples straight into a batch: no intermediate batch per source of a mixture."""

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        idx = as_indices(indices)
        out = TokenBatch.empty(len(idx), self.tokens_per_example)
        finish = self.read_into(idx, out, np.arange(len(idx)))

        def assemble() -> TokenBatch:
            finish()
            return out

        return Pending(assemble)

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        idx = as_indices(indices)
        if len(idx) and int(idx.max()) >= self.current_len():
            raise IndexError(f"{self!r}: example {int(idx.max())} is beyond the {self.current_len()} examples available")
        return self._write(idx, out, np.asarray(rows, np.int64))

    @abstractmethod
    def _write(self, idx: np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        """Start reading examples ``idx`` (all readable) for ``rows`` of ``out``; the function returned waits and writes them."""


ALIGNMENT = 64
"""Bytes every batch array is aligned to: what XLA's CPU client needs to use a host buffer in place."""


Specs = list[tuple[tuple[int, ...], type | np.dtype]]
"""Arrays as (shape, dtype) pairs."""


def aligned_bytes(specs: Specs) -> int:
    """Bytes that arrays of the given (shape, dtype)s take laid out one after the other, each on an ``ALIGNMENT``-byte
    boundary (``aligned_views``)."""
    return sum(-(-math.prod(shape) * np.dtype(dtype).itemsize // ALIGNMENT) * ALIGNMENT for shape, dtype in specs)


def aligned_views(buffer: np.ndarray, specs: Specs) -> list[np.ndarray]:
    """Arrays of the given (shape, dtype)s laid out in ``buffer`` (uint8, ``aligned_bytes(specs)`` long, starting on an
    ``ALIGNMENT``-byte boundary), each on such a boundary."""
    arrays, at = [], 0
    for shape, dtype in specs:
        size = math.prod(shape) * np.dtype(dtype).itemsize
        arrays.append(buffer[at : at + size].view(dtype).reshape(shape))
        at += -(-size // ALIGNMENT) * ALIGNMENT
    return arrays


def aligned_empty(specs: Specs) -> list[np.ndarray]:
    """Uninitialised arrays of the given (shape, dtype)s, each starting on an ``ALIGNMENT``-byte boundary, carved from
    one allocation."""
    size = aligned_bytes(specs)
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    at = -buffer.ctypes.data % ALIGNMENT
    return aligned_views(buffer[at : at + size], specs)


def as_indices(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """Indices as a 1-d int64 array, refusing negative ones."""
    arr = np.asarray(indices, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise IndexError(f"negative example index {int(arr.min())}")
    return arr
