"""Tokenizing worker processes, shared by every cache built in one run.

Starting a worker costs about a second (a fresh interpreter, imports), so the pool starts its
workers as soon as it is made, while the driver is still loading the tokenizer, and one pool
serves every cache of a run. Encoder specs are registered afterwards: each is written once to
the pool's scratch directory and read by a worker the first time it meets that spec, instead of
shipping the tokenizer definition (megabytes) with every task. The functions at the end are what the
workers run.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tokenmix.formats.encoder import DocumentEncoder, EncodedChunk, EncoderSpec
from tokenmix.sources.shards import RawChunk


class Completed:
    """An already-finished stand-in for a future."""

    def __init__(self, value: Any):
        self._value = value

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        return self._value


class EncoderPool:
    """``submit(spec, chunk)`` runs ``DocumentEncoder(spec).encode(chunk)`` in a worker process.

    ``num_workers=None`` uses one worker per core; ``0`` encodes in the calling process.
    """

    def __init__(self, num_workers: int | None = None):
        self.num_workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        self._index: dict[EncoderSpec, int] = {}
        self._local: dict[int, DocumentEncoder] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._spec_dir: str | None = None
        if self.num_workers > 0:
            self._spec_dir = tempfile.mkdtemp(prefix="tokenmix-specs-")
            threads = max(1, (os.cpu_count() or 1) // self.num_workers)
            self._pool = ProcessPoolExecutor(
                max_workers=self.num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker,
                initargs=(os.getpid(), threads),
            )
            for _ in range(self.num_workers):
                self._pool.submit(warm_up)

    def _spec_index(self, spec: EncoderSpec) -> int:
        index = self._index.get(spec)
        if index is None:
            index = self._index[spec] = len(self._index)
            if self._spec_dir is not None:
                with open(os.path.join(self._spec_dir, f"{index}.pkl"), "wb") as f:
                    pickle.dump(spec, f)
            else:
                self._local[index] = DocumentEncoder(spec)
        return index

    def submit(self, spec: EncoderSpec, chunk: RawChunk) -> Any:
        """Start encoding ``chunk``; returns a future (or a completed stand-in) of ``EncodedChunk``."""
        index = self._spec_index(spec)
        if self._pool is None:
            return Completed(self._local[index].encode(chunk))
        return self._pool.submit(encode_in_worker, self._spec_dir, index, chunk)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None
        if self._spec_dir is not None:
            shutil.rmtree(self._spec_dir, ignore_errors=True)
            self._spec_dir = None

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(cancel=exc_type is not None)


_worker_encoders: dict[int, DocumentEncoder] = {}


def init_worker(parent_pid: int, threads: int) -> None:
    """Process-pool initializer: cap the tokenizer's threads, and exit if the driver dies.

    ``threads`` caps the tokenizer's own thread pool so that workers do not oversubscribe cores.
    """
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def warm_up() -> None:
    """A no-op task that makes the pool start its processes (and their imports) right away."""


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def encode_in_worker(spec_dir: str, spec_index: int, chunk: RawChunk) -> EncodedChunk:
    """Process-pool task: encode a chunk with this worker's encoder for spec ``spec_index``."""
    encoder = _worker_encoders.get(spec_index)
    if encoder is None:
        with open(os.path.join(spec_dir, f"{spec_index}.pkl"), "rb") as f:
            encoder = _worker_encoders[spec_index] = DocumentEncoder(pickle.load(f))
    return encoder.encode(chunk)
