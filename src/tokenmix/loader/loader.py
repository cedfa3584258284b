"""DataLoader: a dataset's global batch for each step, as sharded arrays on a device mesh.

Step ``s`` is examples ``schedule.offset(s) .. + batch_size(s) - 1`` of the dataset: a pure function of
the step, whatever the number of processes, the prefetch depth or the timing. Each process reads only
the rows its addressable devices hold (one ``dataset.read`` per step, each row once, see
``sharding.py``) and hands them to ``jax.make_array_from_process_local_data``, which cuts each
device's shard out of them and assembles the global ``jax.Array`` (on one process, ``placement.ArrayPlacer`` does
the same with JAX's dispatch done once per batch size). Reading and placing run ahead in
a background thread (``prefetch.py``); fingerprints are gathered in the consumer's thread, so every
process issues that collective in step order.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from types import TracebackType

import haliax as hax
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from tokenmix._waiting import POLL_MAX_S, POLL_START_S
from tokenmix.datasets.base import Dataset, Pending, TokenBatch
from tokenmix.loader.batch import LmBatch, StepBatch
from tokenmix.loader.batch_schedule import BatchSchedule, BatchSizeSpec
from tokenmix.loader.fingerprint import combine, row_digests
from tokenmix.loader.placement import ArrayPlacer
from tokenmix.loader.prefetch import END, Prefetcher
from tokenmix.loader.sharding import AxisMapping, BatchLayout

logger = logging.getLogger(__name__)


class LoaderError(RuntimeError):
    """Loading a step failed (waiting for, reading or placing its examples); the message names the step.

    It also names the example indices this process was loading and their sources; the original exception
    is its ``__cause__``."""

    def __init__(self, message: str, step: int, indices: np.ndarray, sources: list[str]):
        super().__init__(message)
        self.step = step
        self.indices = indices
        """The global example indices this process was loading (ascending)."""
        self.sources = sources
        """The sources those examples come from (mixture source names, or the dataset itself)."""


@dataclass(frozen=True)
class _Placed:
    """A step read and placed on the devices by the worker; the fingerprint is finished by the consumer."""

    step: int
    offset: int
    layout: BatchLayout
    batch: LmBatch
    digests: np.ndarray | None


class DataLoader:
    """Global batches of ``dataset`` for each training step, sharded over ``mesh`` by ``axis_mapping``.

    ``batch_size`` is an int, a ``BatchSchedule`` or ``[(start_step, batch_size), ...]`` (a ramp).
    ``axis_mapping`` is a haliax ``ResourceMapping``: ``{"batch": ("replica", "data")}`` splits the batch
    axis over those mesh axes; ``"position": "model"`` also splits the sequence; mesh axes it does not
    name hold replicas (read once per process all the same). Other keys are ignored, so a model's whole
    mapping can be passed. ``prefetch`` is how many finished batches may wait ahead of the consumer
    (0: read in ``next()``). ``read_ahead`` starts the reads of that many later steps before a step's own read is
    awaited, so that reads waiting on a network (caches on object storage) overlap; local reads do their work when
    started, so there it only delays the batch at hand (leave it 0). ``positions=True`` adds ``LmBatch.positions``, each token's position within
    its document (segment), for packed examples and rotary embeddings; off, it is None and costs nothing.
    ``fingerprint=True`` adds ``StepBatch.fingerprint`` (a per-row hash while
    reading, and on several processes one all-gather of 16 bytes per row); off, it costs nothing.

    A finite dataset ends iteration at its last full batch (a partial batch would change the shapes and
    the per-example weighting of the step); ``batch(step)`` past it raises ``IndexError``. A dataset whose
    cache is still building is waited for, with a log line naming the step and the examples it needs.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: BatchSizeSpec,
        mesh: Mesh,
        axis_mapping: AxisMapping,
        *,
        prefetch: int = 2,
        read_ahead: int = 0,
        fingerprint: bool = False,
        positions: bool = False,
        batch_axis: str = "batch",
        position_axis: str = "position",
    ):
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 (batches kept ready ahead of the training loop), got {prefetch!r}")
        if not isinstance(read_ahead, int) or read_ahead < 0:
            raise ValueError(f"read_ahead must be an int >= 0 (later steps whose reads start early), got {read_ahead!r}")
        self.dataset = dataset
        self.schedule = BatchSchedule.of(batch_size)
        self.mesh = mesh
        self.axis_mapping = dict(axis_mapping)
        self.prefetch = prefetch
        self.read_ahead = read_ahead
        self.fingerprint = fingerprint
        self.positions = positions
        self.batch_axis = batch_axis
        self.position_axis = position_axis
        self.seq_len = dataset.tokens_per_example
        self._layouts: dict[int, BatchLayout] = {}
        self._placers: dict[int, ArrayPlacer] = {}
        self._iterators: weakref.WeakSet[BatchIterator] = weakref.WeakSet()
        self._closed = False
        for start, size in self.schedule.stages:  # every batch size the schedule will use must fit the mesh
            try:
                self._layout(size)
            except ValueError as e:
                raise ValueError(f"batch_size (the stage from step {start}): {e}") from None

    def __repr__(self) -> str:
        return f"DataLoader({self.dataset!r}, {self.schedule}, mesh {dict(self.mesh.shape)}, {self.axis_mapping})"

    def _layout(self, size: int) -> BatchLayout:
        layout = self._layouts.get(size)
        if layout is None:
            layout = BatchLayout(self.mesh, self.axis_mapping, size, self.seq_len, self.batch_axis, self.position_axis)
            token, row = layout.token_sharding, layout.row_sharding
            self._placers[size] = ArrayPlacer([token, token, token, row] + [token] * self.positions)
            self._layouts[size] = layout
        return layout

    def num_steps(self) -> int | None:
        """Steps with a full batch; None for a dataset that never ends or whose length is not known yet."""
        if not self.dataset.is_finite():
            return None
        final = self.dataset.final_len()
        return None if final is None else self.schedule.steps_within(final)

    # --- the consumer's side ---

    def __iter__(self) -> BatchIterator:
        return self.iter_from_step(0)

    def iter_from_step(self, step: int) -> BatchIterator:
        """Batches from step ``step`` on (O(1): nothing before it is read or replayed), prefetched in the background."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        self.schedule.offset(step)  # validates the step
        it = BatchIterator(self, step)
        self._iterators.add(it)
        return it

    def batch(self, step: int) -> StepBatch:
        """Step ``step``'s batch, read now (no prefetch). ``IndexError`` past a finite dataset's last full batch."""
        placed = self._produce(step, threading.Event())
        if placed is END:
            raise IndexError(self._past_end_message(step))
        return self._finish(placed)

    __getitem__ = batch

    def close(self) -> None:
        """Stop every iterator's prefetch thread; the loader cannot iterate afterwards."""
        self._closed = True
        for it in list(self._iterators):
            it.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _finish(self, placed: _Placed) -> StepBatch:
        """Complete the fingerprint (gathering row digests from every process when the mesh spans several)."""
        fingerprint = None
        if placed.digests is not None:
            layout = placed.layout
            digests = placed.digests
            if not layout.fully_addressable:
                local = jax.make_array_from_process_local_data(layout.row_sharding_2d, digests, (layout.batch_size, digests.shape[1]))
                digests = np.asarray(multihost_utils.process_allgather(local, tiled=True))
            fingerprint = combine(digests, layout.seq_len)
        return StepBatch(placed.step, placed.offset, placed.batch, fingerprint)

    # --- the worker's side (the prefetch thread, or the caller with prefetch=0) ---

    def _produce(self, step: int, stop: threading.Event, ahead: dict[int, Pending | Exception] | None = None) -> _Placed | object:
        """Step ``step``'s placed batch, or ``END``. With ``ahead`` (an iterator's reads started early, by step), the reads
        of the next ``read_ahead`` steps are started before this one is awaited; a read started early that failed fails
        its own step."""
        size, offset = self.schedule.batch_size(step), self.schedule.offset(step)
        layout = self._layout(size)
        indices = offset + layout.rows
        try:
            started = ahead.pop(step, None) if ahead is not None else None
            if started is None:
                if not self._wait_for(step, offset + size, stop):
                    return END
                started = self.dataset.read(indices)
            if ahead is not None:
                self._read_ahead(step, ahead)
            if isinstance(started, Exception):
                raise started
            data = started.result()
            digests = row_digests(data) if self.fingerprint else None
            return _Placed(step, offset, layout, self._place(layout, data), digests)
        except Exception as e:
            raise self._load_error(step, indices, e) from e

    def _read_ahead(self, step: int, ahead: dict[int, Pending | Exception]) -> None:
        """Start the reads of steps after ``step`` (up to ``read_ahead`` of them) whose examples exist already."""
        for later in range(step + 1, step + 1 + self.read_ahead):
            if later in ahead:
                continue
            offset, size = self.schedule.offset(later), self.schedule.batch_size(later)
            if self._ready(offset + size) is not True:
                return
            try:
                ahead[later] = self.dataset.read(offset + self._layout(size).rows)
            except Exception as e:  # noqa: BLE001 - raised by that step, not this one
                ahead[later] = e

    def _place(self, layout: BatchLayout, data: TokenBatch) -> LmBatch:
        """The global arrays from this process's rows (in ``layout.rows`` order), one transfer per device shard."""
        host = [data.tokens, data.loss_mask, data.segment_ids, data.source_ids] + ([data.positions()] if self.positions else [])
        placer = self._placers[layout.batch_size]
        if layout.fully_addressable:  # one process holds the whole batch: JAX's dispatch done once per shape (placement.py)
            placed = placer(host)
        else:
            shape = (layout.batch_size, layout.seq_len)
            placed = jax.make_array_from_process_local_data(placer.shardings, host, [shape, shape, shape, shape[:1]] + [shape] * self.positions)
        axes = (layout.Batch, layout.Position)
        tokens, loss_mask, segment_ids = (hax.NamedArray(a, axes) for a in placed[:3])
        positions = hax.NamedArray(placed[4], axes) if self.positions else None
        return LmBatch(tokens, loss_mask, segment_ids, hax.NamedArray(placed[3], (layout.Batch,)), positions)

    def _ready(self, end: int) -> bool | None:
        """True when examples below ``end`` can be read, False when the dataset ends before ``end``, None to wait."""
        ds = self.dataset
        if not ds.is_finite() or ds.current_len() >= end:
            return True
        final = ds.final_len()
        return None if final is None else end <= final

    def _wait_for(self, step: int, end: int, stop: threading.Event) -> bool:
        """Wait until examples below ``end`` exist; False if the dataset ends first or the loader stops.

        Polls with back-off on ``stop`` rather than calling ``dataset.wait_for_len``, whose wait cannot
        be interrupted: ``close()`` must not hang while a cache is still building.
        """
        ready = self._ready(end)
        if ready is None:
            start = time.monotonic()
            logger.info("step %d needs examples up to %d; %r has %d so far: waiting for its cache to grow",
                        step, end, self.dataset, self.dataset.current_len())
            delay = POLL_START_S
            while ready is None and not stop.wait(delay):
                delay = min(2 * delay, POLL_MAX_S)
                ready = self._ready(end)
            if ready is not None:
                logger.info("step %d: waited %.1f s for examples up to %d", step, time.monotonic() - start, end)
        if ready is False:
            logger.info("%s; iteration stops", self._past_end_message(step))
        return bool(ready)

    def _past_end_message(self, step: int) -> str:
        final = self.dataset.final_len() or 0
        steps = self.schedule.steps_within(final)
        offset = self.schedule.offset(step)
        last = f"its last full batch is step {steps - 1}" if steps else "not even step 0 is a full batch"
        return f"step {step} needs examples [{offset}, {offset + self.schedule.batch_size(step)}) but {self.dataset!r} has {final}: {last}"

    def _load_error(self, step: int, indices: np.ndarray, error: Exception) -> LoaderError:
        sources = self._sources_of(indices)
        return LoaderError(
            f"step {step}: loading examples {_ranges(indices)} ({len(indices)} rows of this process) from {', '.join(sources)} failed: "
            f"{type(error).__name__}: {error}. Once the cause is fixed, resume with iter_from_step({step}).",
            step, indices, sources,
        )

    def _sources_of(self, indices: np.ndarray) -> list[str]:
        """The source names of ``indices`` with their row counts, for a mixture; else the dataset itself."""
        locate = getattr(self.dataset, "locate", None)
        names = getattr(self.dataset, "names", None)
        if locate is None or names is None:
            return [repr(self.dataset)]
        try:
            ids, _ = locate(indices)
        except Exception:  # the error being reported may be in the index math itself
            return [repr(self.dataset)]
        counts = np.bincount(ids, minlength=len(names))
        return [f"{names[i]} ({int(counts[i])} row{'' if counts[i] == 1 else 's'})" for i in np.flatnonzero(counts)]


class BatchIterator(Iterator[StepBatch]):
    """Consecutive ``StepBatch``es from a start step, read ahead by a prefetch thread.

    The thread starts at once and stops on ``close()``, at the end of a ``with`` block, when the
    iterator is garbage-collected, or when its loader is closed. A read error is raised by ``next()``
    as a ``LoaderError``; the iterator is finished after it.
    """

    def __init__(self, loader: DataLoader, start: int):
        self._loader = loader
        ahead: dict[int, Pending | Exception] = {}
        prefetcher: Prefetcher[_Placed] = Prefetcher(partial(loader._produce, ahead=ahead), start, loader.prefetch,
                                                     name=f"tokenmix-loader-from-step-{start}")
        self._prefetcher = prefetcher
        self._finalizer = weakref.finalize(self, prefetcher.close)  # the thread holds no reference to self

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> StepBatch:
        placed = self._prefetcher.get()
        if placed is END:
            raise StopIteration
        assert isinstance(placed, _Placed)
        return self._loader._finish(placed)

    def close(self) -> None:
        """Stop the prefetch thread and wait for it."""
        self._finalizer()

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _ranges(indices: np.ndarray) -> str:
    """Ascending indices as half-open ranges: ``[0, 16), [32, 48)``."""
    if len(indices) == 0:
        return "(none)"
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(indices)]])
    parts = [f"[{int(indices[a])}, {int(indices[b - 1]) + 1})" for a, b in zip(starts, stops)]
    return ", ".join(parts) if len(parts) <= 8 else ", ".join(parts[:8]) + f", ... ({len(parts)} ranges)"

