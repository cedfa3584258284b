"""The random-access dataset protocol every tokenmix dataset follows.

A dataset has a length that may still grow (while its cache builds) and reads batches of examples by
index. ``read(indices)`` issues every read of the batch at once (tensorstore futures) and returns a
``Pending`` batch; ``get_batch`` is the synchronous convenience on top, so no event loop is needed.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from tokenmix._waiting import poll_until
from tokenmix.datasets.segments import segment_positions

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

    def __len__(self) -> int:
        return len(self.tokens)

    def positions(self) -> np.ndarray:
        """Each token's position within its segment, from 0 (position ids that restart per packed document)."""
        return segment_positions(self.segment_ids)

    @staticmethod
    def empty(n: int, length: int) -> TokenBatch:
        """A batch of ``n`` examples of ``length`` tokens to fill with ``put``."""
        return TokenBatch(np.empty((n, length), np.int32), np.empty((n, length), bool), np.empty((n, length), np.int32), np.empty(n, np.int32))

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


def as_indices(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """Indices as a 1-d int64 array, refusing negative ones."""
    arr = np.asarray(indices, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise IndexError(f"negative example index {int(arr.min())}")
    return arr
