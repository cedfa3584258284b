"""What each step of a loader reads, and reading it: the rows of a step's batch this process holds, waiting for a cache
that is still building, reading ahead, row digests, and the error that names the step. It imports no JAX, so it runs
in a reader process (``reader_processes.py``) as well as in the loader's own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from tokenmix._waiting import POLL_MAX_S, POLL_START_S
from tokenmix.datasets.base import Dataset, Pending, TokenBatch
from tokenmix.loader.batch_schedule import BatchSchedule
from tokenmix.loader.fingerprint import row_digests

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

    def __reduce__(self) -> tuple[type[LoaderError], tuple[str, int, np.ndarray, list[str]]]:
        return LoaderError, (str(self), self.step, self.indices, self.sources)


@dataclass(frozen=True)
class StepRead:
    """A step's rows of this process, read."""

    step: int
    offset: int
    """The step's first example."""
    size: int
    """The step's global batch size."""
    data: TokenBatch
    digests: np.ndarray | None
    """Each row's fingerprint digest, when the loader makes fingerprints."""


class StepReads:
    """Reads step ``s``'s rows of this process: examples ``schedule.offset(s) + rows[size]``, ``size`` being the
    step's batch size. ``rows`` holds every batch size of the schedule."""

    def __init__(self, dataset: Dataset, schedule: BatchSchedule, rows: dict[int, np.ndarray], read_ahead: int = 0,
                 fingerprint: bool = False):
        self.dataset = dataset
        self.schedule = schedule
        self.rows = rows
        self.read_ahead = read_ahead
        self.fingerprint = fingerprint

    def read(self, step: int, stop: threading.Event, ahead: dict[int, Pending | Exception] | None = None, stride: int = 1) -> StepRead | None:
        """Step ``step``'s rows, or None when the dataset ends before the step's last example (or ``stop`` is set while
        waiting for it). With ``ahead`` (reads started early, by step), the reads of the next ``read_ahead`` steps this
        reader will take (every ``stride``-th) are started before this one is awaited; a read started early that failed
        fails its own step. Raises ``LoaderError``."""
        size, offset = self.schedule.batch_size(step), self.schedule.offset(step)
        indices = offset + self.rows[size]
        try:
            started = ahead.pop(step, None) if ahead is not None else None
            if started is None:
                if not self.wait_for(step, offset + size, stop):
                    return None
                started = self.dataset.read(indices)
            if ahead is not None:
                self._read_ahead(step, ahead, stride)
            if isinstance(started, Exception):
                raise started
            data = _in_layout(started.result())
            return StepRead(step, offset, size, data, row_digests(data) if self.fingerprint else None)
        except Exception as e:
            raise self.load_error(step, indices, e) from e

    def _read_ahead(self, step: int, ahead: dict[int, Pending | Exception], stride: int) -> None:
        """Start the reads of the next ``read_ahead`` steps after ``step`` (every ``stride``-th) whose examples exist."""
        for later in range(step + stride, step + stride * (1 + self.read_ahead), stride):
            if later in ahead:
                continue
            offset, size = self.schedule.offset(later), self.schedule.batch_size(later)
            if self.ready(offset + size) is not True:
                return
            try:
                ahead[later] = self.dataset.read(offset + self.rows[size])
            except Exception as e:  # noqa: BLE001 - raised by that step, not this one
                ahead[later] = e

    def ready(self, end: int) -> bool | None:
        """True when examples below ``end`` can be read, False when the dataset ends before ``end``, None to wait."""
        ds = self.dataset
        if not ds.is_finite() or ds.current_len() >= end:
            return True
        final = ds.final_len()
        return None if final is None else end <= final

    def wait_for(self, step: int, end: int, stop: threading.Event) -> bool:
        """Wait until examples below ``end`` exist; False if the dataset ends first or ``stop`` is set.

        Polls with back-off on ``stop`` rather than calling ``dataset.wait_for_len``, whose wait cannot
        be interrupted: ``close()`` must not hang while a cache is still building.
        """
        ready = self.ready(end)
        if ready is None:
            start = time.monotonic()
            logger.info("step %d needs examples up to %d; %r has %d so far: waiting for its cache to grow",
                        step, end, self.dataset, self.dataset.current_len())
            delay = POLL_START_S
            while ready is None and not stop.wait(delay):
                delay = min(2 * delay, POLL_MAX_S)
                ready = self.ready(end)
            if ready is not None:
                logger.info("step %d: waited %.1f s for examples up to %d", step, time.monotonic() - start, end)
        if ready is False:
            logger.info("%s; iteration stops", self.past_end_message(step))
        return bool(ready)

    def past_end_message(self, step: int) -> str:
        final = self.dataset.final_len() or 0
        steps = self.schedule.steps_within(final)
        offset = self.schedule.offset(step)
        last = f"its last full batch is step {steps - 1}" if steps else "not even step 0 is a full batch"
        return f"step {step} needs examples [{offset}, {offset + self.schedule.batch_size(step)}) but {self.dataset!r} has {final}: {last}"

    def load_error(self, step: int, indices: np.ndarray, error: BaseException) -> LoaderError:
        sources = self.sources_of(indices)
        return LoaderError(
            f"step {step}: loading examples {_ranges(indices)} ({len(indices)} rows of this process) from {', '.join(sources)} failed: "
            f"{type(error).__name__}: {error}. Once the cause is fixed, resume with iter_from_step({step}).",
            step, indices, sources,
        )

    def sources_of(self, indices: np.ndarray) -> list[str]:
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


_FIELDS = ("tokens", "loss_mask", "segment_ids", "source_ids")


def _in_layout(data: TokenBatch) -> TokenBatch:
    """``data`` with the dtypes of ``TokenBatch.layout`` (int32 tokens, say, where a dataset gave uint32), as a reader
    process's slots hold it: so a batch has one dtype whatever ``workers`` is. Values the layout cannot hold are refused."""
    n, length = data.tokens.shape
    layout = TokenBatch.layout(n, length)
    if all(getattr(data, f).dtype == dtype for f, (_, dtype) in zip(_FIELDS, layout)):
        return data
    out = TokenBatch.empty(n, length)
    out.put(np.arange(n), data)
    for f, (_, dtype) in zip(_FIELDS, layout):
        if not np.array_equal(getattr(out, f), getattr(data, f)):
            raise ValueError(f"the dataset's {f} ({getattr(data, f).dtype}) hold values that {dtype} cannot: the loader's batches "
                             f"are {dtype}; give {f} that fit it")
    return out


def _ranges(indices: np.ndarray) -> str:
    """Ascending indices as half-open ranges: ``[0, 16), [32, 48)``."""
    if len(indices) == 0:
        return "(none)"
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(indices)]])
    parts = [f"[{int(indices[a])}, {int(indices[b - 1]) + 1})" for a, b in zip(starts, stops)]
    return ", ".join(parts) if len(parts) <= 8 else ", ".join(parts[:8]) + f", ... ({len(parts)} ranges)"
