"""A source of a mixture opened when a batch first draws from it, and the bounded pool that opens many at once.

Opening a source reads its cache's open object (``cache/open_object.py``; a cache without one: its ledger, array
metadata and row ends, five requests): tens of milliseconds a request on an object store. A mixture of a thousand
sources that opened them all at start-up would pay that a thousand times before its first batch, and hold every
source's state although a batch draws from a few dozen. A ``DeferredDataset``
is a source not yet opened: what mixing needs before any read (the example width) is given up front; the first read,
or a mixture asking for the sources of a batch together (``open_together``), opens it. The sources of a batch open
concurrently, ``OPENING_THREADS`` threads at most, whatever the number of sources.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from tokenmix.datasets.base import Dataset, Pending, TokenBatch

OPENING_THREADS = 16
"""Sources opened at once: enough requests in flight to hide tens of milliseconds each, and a bound on threads."""


class DeferredDataset(Dataset):
    """The dataset ``open()`` makes, made on first use; ``name`` says which source it is in messages."""

    def __init__(self, open: Callable[[], Dataset], tokens_per_example: int, name: str):
        """``open`` must be picklable (a reader process opens the source again itself, when it first needs it)."""
        self._open = open
        self.tokens_per_example = tokens_per_example
        self.name = name
        self._dataset: Dataset | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return repr(self._dataset) if self._dataset is not None else f"DeferredDataset({self.name!r}, not opened yet)"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled, a source is its recipe: the process that loads it opens it when it first needs it."""
        return DeferredDataset, (self._open, self.tokens_per_example, self.name)

    @property
    def is_open(self) -> bool:
        return self._dataset is not None

    @property
    def dataset(self) -> Dataset:
        """The source, opened now if it was not."""
        if self._dataset is None:
            with self._lock:
                if self._dataset is None:
                    opened = self._open()
                    if opened.tokens_per_example != self.tokens_per_example:
                        raise ValueError(f"source {self.name!r}: its examples hold {opened.tokens_per_example} tokens, not the "
                                         f"{self.tokens_per_example} the mixture was made for")
                    self._dataset = opened
        return self._dataset

    def is_finite(self) -> bool:
        return self.dataset.is_finite()

    def current_len(self) -> int:
        return self.dataset.current_len()

    def final_len(self) -> int | None:
        return self.dataset.final_len()

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        return self.dataset.read(indices)

    def read_into(self, indices: Sequence[int] | np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        return self.dataset.read_into(indices, out, rows)


def open_together(datasets: Iterable[Dataset]) -> None:
    """Open every ``DeferredDataset`` among ``datasets`` not opened yet, at most ``OPENING_THREADS`` at once; the first
    error (naming its source) is raised once all have finished.

    The threads live while they open (daemon threads: a process that exits never waits on one), so a process that has
    opened its sources holds none."""
    waiting: queue.SimpleQueue[DeferredDataset] = queue.SimpleQueue()
    count = 0
    for ds in datasets:
        if isinstance(ds, DeferredDataset) and not ds.is_open:
            waiting.put(ds)
            count += 1
    errors: list[BaseException] = []

    def open_waiting() -> None:
        while True:
            try:
                ds = waiting.get_nowait()
            except queue.Empty:
                return
            try:
                ds.dataset  # noqa: B018 - opens it
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                errors.append(e)

    if count == 1:
        open_waiting()
    threads = [threading.Thread(target=open_waiting, name="tokenmix-open", daemon=True)
               for _ in range(min(count, OPENING_THREADS) if count > 1 else 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
