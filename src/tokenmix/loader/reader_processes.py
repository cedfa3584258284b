"""Reading a loader's steps in processes of their own, so that reading takes none of the training program's GIL.

Reader ``w`` of ``N`` reads steps ``start + w``, ``start + w + N``, ... (``StepReads.read``, as the loader's own thread
would) into a ring of slots in a shared-memory block of its own, and tells the loader which slot holds which step over
a pipe. The loader takes the steps in order, copies each step's rows out of its slot into arrays of its own (on CPU
devices a placed array would use the slot's memory in place) and hands the slot back. Weight stages appended to the
loader's mixture during a run (``DataLoader.append_stage``) go down the same pipe, so a reader appends them to its copy
before it reads into any slot handed back after them. A reader holds at most as many
finished steps as it has slots, so it never gets further ahead than that.

A block's name is unlinked as soon as it is made: the reader gets the block's descriptor as it starts, and the
system frees the memory when the last process mapping it exits, so no kill, of the whole process group included,
leaves a file in /dev/shm. While it runs, a reader ticks a counter at the end of its block; a loader waiting for a
step sees the counter stand still when the reader does not run at all (stopped, frozen), and after ``read_timeout_s``
of that it kills the reader and raises the step's ``LoaderError``. A read that is merely slow ticks on.

Readers are spawned, not forked: the loader's process runs JAX's and tensorstore's threads, which a fork does not
carry over. A reader imports tokenmix's datasets (no JAX) and unpickles the loader's ``StepReads``: caches pickle as
their location and open again in the reader (``TokenCache.__reduce__``). Its errors come back as the ``LoaderError``
naming the step, with the reader's traceback as the cause; a reader that dies is reported with its exit code.
"""

from __future__ import annotations

import errno
import logging
import mmap
import multiprocessing
import os
import pickle
import queue
import signal
import struct
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from tokenmix._child_fd import ChildFd
from tokenmix.datasets.base import TokenBatch, aligned_bytes, aligned_views
from tokenmix.loader.step_reads import LoaderError, StepRead, StepReads

logger = logging.getLogger(__name__)

_POLL_S = 0.05
"""How often a wait on a reader checks that it is still alive, or that the loader is stopping."""
_STOP = -1
"""Put among a reader's free slots when it is told to stop, so that a wait for a slot ends at once."""
_JOIN_TIMEOUT_S = 10.0
"""How long ``close`` waits for all readers together before killing those still busy (a read that does not return)."""
_BEAT_S = 1.0
"""How often a reader ticks its counter: this, or a quarter of ``read_timeout_s`` where that is shorter."""
_POLL_COUNTED_MAX_S = 0.5
"""The most that one of the loader's polls adds to the time a reader stands still: time when the loader did not run
either (its whole process group stopped by Ctrl-Z, a suspended machine) is not held against a reader."""
_BEATS = struct.Struct("<Q")
"""The reader's counter, after the slots in its shared memory."""
_ORPHAN_GRACE_S = 5.0
"""How long a reader whose loader is gone (its pipe closed without a stop) may take to finish a read before it exits."""


class ReaderProcessError(RuntimeError):
    """What went wrong in a reader process: its own traceback, as text."""


@dataclass(frozen=True)
class _Slots:
    """Where things lie in a reader's shared memory: ``count`` slots of the largest batch this process reads (``rows``
    rows of ``seq_len`` tokens), each laid out as ``TokenBatch.empty`` lays out a batch, then the reader's counter."""

    rows: int
    seq_len: int
    count: int

    @property
    def slot_bytes(self) -> int:
        return aligned_bytes(TokenBatch.layout(self.rows, self.seq_len))

    @property
    def total_bytes(self) -> int:
        return self.count * self.slot_bytes + _BEATS.size

    def arrays(self, buffer: memoryview | mmap.mmap, slot: int, rows: int) -> list[np.ndarray]:
        """Slot ``slot``'s tokens, loss mask, segment ids and source ids, for a batch of ``rows`` rows."""
        size = self.slot_bytes
        views = aligned_views(np.frombuffer(buffer, np.uint8, size, slot * size), TokenBatch.layout(self.rows, self.seq_len))
        return [view[:rows] for view in views]

    def beats(self, buffer: memoryview | mmap.mmap) -> int:
        """How often the reader has ticked (0: it has not started yet)."""
        return _BEATS.unpack_from(buffer, self.count * self.slot_bytes)[0]

    def tick(self, buffer: mmap.mmap, beats: int) -> None:
        """Set the reader's counter (in the reader)."""
        _BEATS.pack_into(buffer, self.count * self.slot_bytes, beats)


class ReaderProcesses:
    """``workers`` reader processes reading the steps of ``reads`` from ``start`` on, ``depth`` slots each; ``get``
    returns them in step order, and fails a step whose reader has not run for ``read_timeout_s``. One thread takes
    them (the loader's prefetch thread)."""

    def __init__(self, reads: StepReads, start: int, workers: int, depth: int, seq_len: int, read_timeout_s: float):
        try:
            payload = pickle.dumps(reads)
        except Exception as e:
            raise TypeError(f"DataLoader(workers={workers}) sends the dataset to its reader processes by pickling it, and "
                            f"{reads.dataset!r} does not pickle ({type(e).__name__}: {e}); make it picklable, or use workers=0") from e
        self._reads = reads
        self._next = start
        self._start = start
        self._slots = _Slots(max(len(rows) for rows in reads.rows.values()), seq_len, depth)
        self._read_timeout_s = read_timeout_s
        self._memory: list[SharedMemory] = []
        self._pipes: list[Connection] = []
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._closed = False
        context = multiprocessing.get_context("spawn")
        try:
            for w in range(workers):
                memory = SharedMemory(create=True, size=self._slots.total_bytes)
                memory.unlink()  # its pages live on in every process that maps them, but no kill can leave its name behind
                self._memory.append(memory)
                _reserve(memory, workers, depth)
                ours, theirs = context.Pipe()
                args = (theirs, payload, start + w, workers, ChildFd(memory._fd), self._slots,  # type: ignore[attr-defined]
                        min(_BEAT_S, read_timeout_s / 4))
                process = context.Process(target=_reader_main, args=args, name=f"tokenmix-reader-{w}-from-step-{start}", daemon=True)
                process.start()
                theirs.close()
                self._pipes.append(ours)
                self._processes.append(process)
        except BaseException:
            self.close()
            raise

    def get(self, step: int, stop: threading.Event) -> StepRead | None:
        """Step ``step``'s rows (the step after the last one taken), or None after a finite dataset's last full batch or
        once ``stop`` is set. Raises the ``LoaderError`` of a step that failed."""
        if step != self._next:
            raise ValueError(f"reader processes give steps in order: step {self._next} is next, not {step}")
        w = (step - self._start) % len(self._processes)
        message = self._receive(w, step, stop)
        if message is None:
            return None
        kind = message[0]
        if kind == "end":
            return None
        if kind == "error":
            _, error, cause = message
            raise error from ReaderProcessError(cause)
        _, got, slot, offset, size, rows, digests = message
        assert got == step, f"reader {w} sent step {got} where step {step} was due"
        data = TokenBatch.empty(rows, self._slots.seq_len)
        _copy(self._slots.arrays(self._memory[w].buf, slot, rows), [data.tokens, data.loss_mask, data.segment_ids, data.source_ids])
        try:
            self._pipes[w].send(("free", slot))
        except OSError:  # the reader has stopped (it reached the dataset's end): it needs no slot back
            pass
        self._next += 1
        return StepRead(step, offset, size, data, digests)

    def _receive(self, w: int, step: int, stop: threading.Event) -> tuple | None:
        pipe, process, memory = self._pipes[w], self._processes[w], self._memory[w]
        beats, still, polled = -1, 0.0, 0.0
        while not stop.is_set():
            try:
                if pipe.poll(_POLL_S):
                    return pipe.recv()
            except (EOFError, OSError):
                pass
            if not process.is_alive():
                process.join()
                hint = (" (SIGBUS: its shared memory could not be backed; free space in /dev/shm, e.g. docker run --shm-size)"
                        if process.exitcode == -signal.SIGBUS else "")
                died = ReaderProcessError(f"reader process {process.name} (pid {process.pid}) exited with code {process.exitcode} "
                                          f"before sending it{hint}")
                raise self._failed(step, died) from died
            now, ticked = time.monotonic(), self._slots.beats(memory.buf)
            if ticked != beats:
                beats, still = ticked, 0.0
            else:
                still += min(now - polled, _POLL_COUNTED_MAX_S)
            polled = now
            if still < self._read_timeout_s:
                continue
            if not beats:  # still starting: a spawned interpreter imports the main module, as slowly as the machine is
                logger.warning("reader process %s (pid %d) has not started yet; step %d has waited another %g s (read_timeout_s) for it",
                               process.name, process.pid, step, self._read_timeout_s)
                still = 0.0
                continue
            process.kill()  # stopped or frozen: a SIGTERM would wait for it to run again
            process.join()
            stalled = ReaderProcessError(
                f"reader process {process.name} (pid {process.pid}) made no progress for {self._read_timeout_s:g} s (read_timeout_s) "
                "while the step was due: it did not run at all (stopped by SIGSTOP or a debugger, or frozen), so it was killed. "
                "Find what stopped it, or raise read_timeout_s if readers may be held that long")
            raise self._failed(step, stalled) from stalled
        return None

    def append_stage(self, start: int, weights: dict[str, float]) -> None:
        """Send every reader a weight stage to append to its copy of the mixture. A pipe delivers in order, so a reader
        has the stage before any slot handed back after it, and reads no step past those it could read before it."""
        for pipe in self._pipes:
            try:
                pipe.send(("stage", start, weights))
            except OSError:  # the reader has stopped (it reached the dataset's end): it reads nothing more
                pass

    def _failed(self, step: int, error: ReaderProcessError) -> LoaderError:
        """Step ``step``'s ``LoaderError``, its cause being what happened to its reader."""
        return self._reads.load_error(step, self._reads.schedule.offset(step) + self._reads.rows[self._reads.schedule.batch_size(step)], error)

    def close(self) -> None:
        """Stop the readers, wait for them, and free their shared memory; idempotent."""
        if self._closed:
            return
        self._closed = True
        for pipe in self._pipes:
            try:
                pipe.send(("stop",))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                logger.warning("reader process %s did not stop within %.0f s of close; killing it", process.name, _JOIN_TIMEOUT_S)
                process.kill()  # not SIGTERM, which a stopped reader would hold until it runs again
        for process in self._processes:
            process.join()
        for pipe in self._pipes:
            pipe.close()
        for memory in self._memory:
            memory.close()


def _reserve(memory: SharedMemory, workers: int, depth: int) -> None:
    """Back every page of ``memory`` now: a shared-memory file is sparse, and a reader writing a page that /dev/shm has
    no room for dies of SIGBUS, steps later."""
    if not hasattr(os, "posix_fallocate"):  # not on macOS: there a full /dev/shm shows as the reader's SIGBUS
        return
    try:
        os.posix_fallocate(memory._fd, 0, memory.size)  # type: ignore[attr-defined]  # POSIX SharedMemory's own descriptor
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise OSError(errno.ENOSPC, f"DataLoader(workers={workers}, prefetch={depth}) needs {memory.size / 2**20:.0f} MiB of shared "
                                    "memory per reader and /dev/shm has less free; free space there (in a container, e.g. docker "
                                    "run --shm-size), or use fewer workers, a smaller prefetch or workers=0") from None


def _copy(sources: list[np.ndarray], targets: list[np.ndarray]) -> None:
    """Each source array into its target (a function, so that no view of shared memory outlives the copy)."""
    for source, target in zip(sources, targets):
        np.copyto(target, source)


def _reader_main(pipe: Connection, payload: bytes, first: int, stride: int, memory_fd: int, slots: _Slots, beat_s: float) -> None:
    """A reader process: read steps ``first``, ``first + stride``, ... into free slots until told to stop, ticking the
    counter in its shared memory every ``beat_s`` while it runs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle; it stops the readers on close
    memory = mmap.mmap(memory_fd, slots.total_bytes)  # unmapped as the process exits, never before: the listener ticks to the end
    os.close(memory_fd)
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(slots.count):
        free.put(slot)
    stages: queue.SimpleQueue[tuple[int, dict[str, float]]] = queue.SimpleQueue()  # weight stages, applied before the next read
    stop = threading.Event()

    def listen() -> None:
        beats = 1
        try:
            while True:
                if pipe.poll(beat_s):
                    message = pipe.recv()
                    if message[0] == "free":
                        free.put(message[1])
                    elif message[0] == "stage":
                        stages.put((message[1], message[2]))
                    else:
                        stop.set()
                        free.put(_STOP)
                        return
                beats += 1
                slots.tick(memory, beats)
        except (EOFError, OSError):  # the loader is gone without a stop (killed): do not outlive it
            stop.set()
            free.put(_STOP)
            time.sleep(_ORPHAN_GRACE_S)
            os._exit(1)

    slots.tick(memory, 1)  # started, before anything is sent: from here on the loader times a counter that stands still
    threading.Thread(target=listen, name="tokenmix-reader-listener", daemon=True).start()
    step = first
    ahead: dict = {}
    try:
        reads: StepReads = pickle.loads(payload)
        while True:
            slot = free.get()
            if slot == _STOP or stop.is_set():
                return
            while not stages.empty():  # every stage sent before this slot came back
                reads.dataset.append_stage(*stages.get())  # type: ignore[attr-defined]
            try:
                read = reads.read(step, stop, ahead, stride)
            except LoaderError as e:
                pipe.send(("error", e, traceback.format_exc()))
                return
            if read is None:
                if not stop.is_set():
                    pipe.send(("end",))
                return
            if stop.is_set():
                return
            rows = len(read.data)
            _copy([read.data.tokens, read.data.loss_mask, read.data.segment_ids, read.data.source_ids], slots.arrays(memory, slot, rows))
            pipe.send(("batch", step, slot, read.offset, read.size, rows, read.digests))
            step += stride
    except BaseException as e:  # anything else (unpickling the dataset, a broken pipe) is reported against the step at hand
        try:
            pipe.send(("error", LoaderError(f"step {step}: the reader process failed: {type(e).__name__}: {e}", step,
                                            np.empty(0, np.int64), []), traceback.format_exc()))
        except (OSError, ValueError):
            pass
