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

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING

import haliax as hax
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from tokenmix.datasets.base import Dataset, Pending, TokenBatch
from tokenmix.loader.batch import LmBatch, StepBatch
from tokenmix.loader.batch_schedule import BatchSchedule, BatchSizeSpec
from tokenmix.loader.fingerprint import DIGEST_BYTES, combine
from tokenmix.loader.placement import ArrayPlacer
from tokenmix.loader.prefetch import END, Prefetcher
from tokenmix.loader.sharding import AxisMapping, BatchLayout
from tokenmix.loader.step_reads import LoaderError, StepRead, StepReads

if TYPE_CHECKING:
    from tokenmix.loader.reader_processes import ReaderProcesses

__all__ = ["BatchIterator", "DataLoader", "LoaderError"]


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

    ``workers=N`` (N >= 1) reads in N processes of their own, each reading every N-th step into ``prefetch`` slots of
    shared memory; the prefetch thread then only copies each step's rows out and places them. Reading takes none of
    this process's GIL, which a training loop's own Python (dispatching its steps) needs. The readers start in about a
    second (spawned: they import tokenmix and open the dataset again from its pickled form, so a dataset of one's own
    must pickle, and a script must guard its entry point with ``if __name__ == "__main__":``). Batches are the same
    whatever ``workers`` is. A reader that does not run at all for ``read_timeout_s`` seconds while its step is due
    (stopped by SIGSTOP or a debugger, frozen) is killed and the step raises a ``LoaderError`` naming it: the time
    counted is time without any sign of the reader running, so a slow read or a slow machine never reaches it.

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
        workers: int = 0,
        read_timeout_s: float = 300.0,
    ):
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 (batches kept ready ahead of the training loop), got {prefetch!r}")
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0 (processes that read batches; 0 reads in this process), got {workers!r}")
        if workers and not prefetch:
            raise ValueError("workers read ahead into prefetch slots each, so they need prefetch >= 1; set prefetch, or workers=0")
        if not isinstance(read_ahead, int) or read_ahead < 0:
            raise ValueError(f"read_ahead must be an int >= 0 (later steps whose reads start early), got {read_ahead!r}")
        if isinstance(read_timeout_s, bool) or not isinstance(read_timeout_s, (int, float)) or not read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be a number of seconds > 0 (how long a reader process may not run at all "
                             f"before its step fails), got {read_timeout_s!r}")
        self.dataset = dataset
        self.schedule = BatchSchedule.of(batch_size)
        self.mesh = mesh
        self.axis_mapping = dict(axis_mapping)
        self.prefetch = prefetch
        self.workers = workers
        self.read_timeout_s = float(read_timeout_s)
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
        self.reads = StepReads(dataset, self.schedule, {size: layout.rows for size, layout in self._layouts.items()}, read_ahead, fingerprint)
        """What each step reads, and reading it (no JAX: reader processes run it too)."""

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

    def steps_read_ahead(self) -> int:
        """How many steps past the last one taken this loader may already have read (``steps_read_ahead``)."""
        return steps_read_ahead(self.prefetch, self.workers, self.reads.read_ahead)

    def append_stage(self, start: int, weights: Mapping[str, float]) -> None:
        """Append a weight stage to the loader's mixture (``MixtureDataset.append_stage``), in this process and in the
        reader processes of every iterator. ``start`` must lie past what the loader may have read (more than
        ``steps_read_ahead()`` steps past the last step taken), or batches already read would not be those the log gives."""
        if not callable(getattr(self.dataset, "append_stage", None)):
            raise TypeError(f"{self.dataset!r} has no weight stages to append to: append_stage needs a MixtureDataset")
        self.dataset.append_stage(start, weights)  # type: ignore[attr-defined]
        for it in list(self._iterators):
            it._append_stage(start, dict(weights))

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
        try:
            placed = self._produce(step, threading.Event())
        except LoaderError as e:
            self._share_failure(e)
            raise
        if placed is END:
            raise IndexError(self.reads.past_end_message(step))
        return self._finish(placed)

    __getitem__ = batch

    def close(self) -> None:
        """Stop every iterator's prefetch thread or reader processes; the loader cannot iterate afterwards."""
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
            digests = placed.digests if layout.fully_addressable else self._gather_digests(layout, placed.step, placed.digests)
            fingerprint = combine(digests, layout.seq_len)
        return StepBatch(placed.step, placed.offset, placed.batch, fingerprint)

    def _gather_digests(self, layout: BatchLayout, step: int, digests: np.ndarray | None) -> np.ndarray:
        """Every process's row digests of ``step`` in global row order. A process whose step failed (``digests`` None)
        still joins the gather, flagged, so that the others raise a ``LoaderError`` naming it instead of waiting for it
        in the gather until the job is torn down."""
        local = np.zeros((len(layout.rows), DIGEST_BYTES + 1), np.uint8)
        if digests is None:
            local[:, DIGEST_BYTES] = 1
        else:
            local[:, :DIGEST_BYTES] = digests
        gathered = np.asarray(multihost_utils.process_allgather(local, tiled=False))
        failed = [p for p in range(len(gathered)) if gathered[p, :, DIGEST_BYTES].any()]
        if failed and digests is not None:
            raise LoaderError(f"step {step}: process{'es' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of "
                              f"{len(gathered)} failed to load {'their' if len(failed) > 1 else 'its'} rows of this step (its "
                              f"own LoaderError, in its log, names the examples and the cause); this process stops with it",
                              step, self.schedule.offset(step) + layout.rows, self.reads.sources_of(self.schedule.offset(step) + layout.rows))
        out = np.empty((layout.batch_size, DIGEST_BYTES), np.uint8)
        for rows, part in zip(layout.process_rows, gathered):
            out[rows] = part[:, :DIGEST_BYTES]
        return out

    def _share_failure(self, error: LoaderError) -> None:
        """Tell the other processes that this one's step failed, where they wait for its rows' digests (``_gather_digests``)."""
        if not self.reads.fingerprint:
            return
        layout = self._layout(self.schedule.batch_size(error.step))
        if not layout.fully_addressable:
            self._gather_digests(layout, error.step, None)

    # --- the worker's side (the prefetch thread, or the caller with prefetch=0) ---

    def _produce(self, step: int, stop: threading.Event, ahead: dict[int, Pending | Exception] | None = None) -> _Placed | object:
        """Step ``step``'s placed batch, or ``END``. ``ahead``: the reads an iterator started early (``StepReads.read``)."""
        read = self.reads.read(step, stop, ahead)
        return END if read is None else self._place_read(read)

    def _place_read(self, read: StepRead) -> _Placed:
        layout = self._layout(read.size)
        try:
            return _Placed(read.step, read.offset, layout, self._place(layout, read.data), read.digests)
        except Exception as e:
            raise self.reads.load_error(read.step, read.offset + layout.rows, e) from e

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


class BatchIterator(Iterator[StepBatch]):
    """Consecutive ``StepBatch``es from a start step, read ahead by a prefetch thread (or the loader's reader
    processes).

    The thread (or the processes) starts at once and stops on ``close()``, at the end of a ``with`` block, when the
    iterator is garbage-collected, or when its loader is closed. A read error is raised by ``next()``
    as a ``LoaderError``; the iterator is finished after it.
    """

    def __init__(self, loader: DataLoader, start: int):
        self._loader = loader
        source: Prefetcher[_Placed] | _WithProcesses
        if loader.workers:
            from tokenmix.loader.reader_processes import ReaderProcesses  # multiprocessing's 18 ms of imports: only when used

            processes = ReaderProcesses(loader.reads, start, loader.workers, loader.prefetch, loader.seq_len, loader.read_timeout_s)
            source = _WithProcesses(Prefetcher(partial(_take_from, processes, loader._place_read), start, loader.prefetch,
                                               name=f"tokenmix-loader-from-step-{start}"), processes)
        else:
            ahead: dict[int, Pending | Exception] = {}
            source = Prefetcher(partial(loader._produce, ahead=ahead), start, loader.prefetch, name=f"tokenmix-loader-from-step-{start}")
        self._prefetcher = source
        self._finalizer = weakref.finalize(self, source.close)  # the thread holds no reference to self

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> StepBatch:
        try:
            placed = self._prefetcher.get()
        except LoaderError as e:
            self._loader._share_failure(e)
            raise
        if placed is END:
            raise StopIteration
        assert isinstance(placed, _Placed)
        return self._loader._finish(placed)

    def close(self) -> None:
        """Stop the prefetch thread (or the reader processes) and wait for it."""
        self._finalizer()

    def _append_stage(self, start: int, weights: dict[str, float]) -> None:
        """Send a weight stage the loader's mixture was given to this iterator's reader processes (if it has any)."""
        if isinstance(self._prefetcher, _WithProcesses):
            self._prefetcher._processes.append_stage(start, weights)

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _take_from(processes: ReaderProcesses, place: Callable[[StepRead], _Placed], step: int, stop: threading.Event) -> _Placed | object:
    """Step ``step`` from the reader processes, placed; ``END`` after the last (the processes are then stopped)."""
    try:
        read = processes.get(step, stop)
        if read is None:
            processes.close()
            return END
        return place(read)
    except BaseException:
        processes.close()
        raise


class _WithProcesses:
    """A prefetch thread taking steps from reader processes, and the processes: ``get`` from the one, ``close`` both."""

    def __init__(self, prefetcher: Prefetcher[_Placed], processes: ReaderProcesses):
        self._prefetcher = prefetcher
        self._processes = processes

    def get(self) -> _Placed | object:
        return self._prefetcher.get()

    def close(self) -> None:
        self._prefetcher.close()
        self._processes.close()


def steps_read_ahead(prefetch: int, workers: int, read_ahead: int) -> int:
    """How many steps past the last one taken a loader with these settings may already have read: the ``prefetch`` queue,
    the step its thread is reading and the ``read_ahead`` steps started after it; with ``workers`` reader processes, the
    step its thread takes, then their ``prefetch`` slots each and each reader's ``read_ahead`` steps (every
    ``workers``-th) started after the last step in its slots."""
    return prefetch + 1 + workers * prefetch + max(workers, 1) * read_ahead
