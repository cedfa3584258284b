"""The encoding pool: where a cache build on this machine encodes chunks (threads of the driver for ``fastokens``,
worker processes for ``tokenizers``); one pool serves every cache built in one run. ``open_build_executor`` opens it, or
a cluster's executor for a build whose ``build.executor`` is Ray or Dask.

``fastokens`` releases the GIL, so its chunks are encoded by threads of the driver (one per core by default): nothing
is pickled or copied between processes, and the driver's reading, parsing and writing overlap the encoding. Left to
itself ``fastokens`` also spreads each batch over every core with threads of its own, which beside a thread per core
only add hand-offs and spinning (on 2 cores: 0.13 s more CPU and 0.05 s more wall time for the shared corpus's cold
build); so the pool gives each of its threads ``cores // threads`` of them (``FASTOKENS_BPE_THREADS``, which
``fastokens`` reads at its first encoding in a process: set by a pool of workers unless the user set it;
``num_workers: 0``, which encodes in the calling thread, leaves ``fastokens`` its own).
``tokenizers`` holds the GIL for much of its work, so its chunks go to worker processes, those of the execution floor's
pool (``tokenmix.execution.process_pool``: spawned, and gone when the driver dies).

Starting a worker process costs about a second (a fresh interpreter, imports), so a pool that will need them
(``build.tokenizer_backend: tokenizers``) starts them as soon as it is made, while the driver is still loading the
tokenizer; otherwise they start when the first chunk for ``tokenizers`` comes (a build whose ``fastokens`` check
failed). Encoder specs are registered afterwards, and a spec holds the
tokenizer definition (megabytes): it is pickled once into the pool's spec file, and a worker reads
it from there the first time a task names it, so a task carries only where it lies in the file.

The spec file has no name: a ``memfd_create`` file on Linux, an unlinked temporary file on other
POSIX systems. The pool opens it before its workers start and each worker gets its own descriptor
of it as it starts (the way the executor hands its workers the pipes of its queues), then reads it
with ``pread``. The system frees the file when the last process holding it exits, so nothing is
left behind when a build ends, when its workers fail to start, or when the driver is SIGKILLed and
no cleanup code runs at all. The alternatives leak in just that case: a scratch directory needs
cleanup code (or a sweep by a later run), a ``multiprocessing`` manager is a server process that
can outlive its owner, and a socket served by the driver needs a thread and an address. Where
descriptors cannot be handed to workers (Windows), each task carries the spec's pickle instead,
which a worker still unpickles only once. The functions at the end are what the workers run.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import IO

from tokenmix._child_fd import ChildFd
from tokenmix.cache.options import BuildOptions
from tokenmix.execution.configs import LocalExecutorConfig
from tokenmix.execution.process_pool import run_here, worker_process_pool
from tokenmix.execution.task_executor import TaskExecutor
from tokenmix.formats.backends import FAST, REFERENCE
from tokenmix.formats.encoder import DocumentEncoder, EncodedChunk
from tokenmix.formats.encoder_spec import EncoderSpec
from tokenmix.sources.shards import RawChunk

_PASSES_FDS = os.name == "posix"
"""Whether workers can be handed a descriptor of the spec file (``multiprocessing.reduction.DupFd``)."""

FAST_THREADS = "FASTOKENS_BPE_THREADS"
"""The threads ``fastokens`` spreads one batch over (default: every core); read once, at its first encoding."""

SpecLocation = tuple[int, int] | bytes
"""Where a worker finds a spec: ``(offset, size)`` of its pickle in the spec file, or the pickle itself."""


class EncoderPool:
    """``submit(spec, chunk)`` runs ``DocumentEncoder(spec).encode(chunk)`` in a driver thread (``fastokens`` specs) or in
    a worker process (``tokenizers`` specs).

    ``num_workers=None`` uses one worker per core; ``0`` encodes in the calling thread.
    """

    def __init__(self, num_workers: int | None = None):
        self.num_workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        if self.num_workers > 0:
            os.environ.setdefault(FAST_THREADS, str(self._cores_each()))
        self._specs: dict[EncoderSpec, tuple[int, SpecLocation]] = {}
        self._local: dict[EncoderSpec, DocumentEncoder] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._spec_file: IO[bytes] | None = None

    def _cores_each(self) -> int:
        """The cores each of the ``num_workers`` workers (at least one) has to itself: its library's own threads."""
        return max(1, (os.cpu_count() or 1) // self.num_workers)

    def start_processes(self) -> None:
        """Start the worker processes now, for a run known to encode with ``tokenizers`` (they take a second to start)."""
        if self.num_workers > 0:
            self._processes()

    def _processes(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._spec_file = _anonymous_file() if _PASSES_FDS else None
            threads = self._cores_each()
            self._pool = worker_process_pool(self.num_workers, init_worker,
                                             (threads, None if self._spec_file is None else ChildFd(self._spec_file.fileno())))
            for _ in range(self.num_workers):
                self._pool.submit(warm_up)
        return self._pool

    def _register(self, spec: EncoderSpec) -> tuple[int, SpecLocation]:
        """The spec's number in this pool and where workers find it; the first time, its pickle is written once."""
        known = self._specs.get(spec)
        if known is None:
            data = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
            location: SpecLocation = data
            if self._spec_file is not None:
                offset = self._spec_file.seek(0, os.SEEK_END)
                self._spec_file.write(data)
                self._spec_file.flush()
                location = (offset, len(data))
            known = self._specs[spec] = (len(self._specs), location)
        return known

    def _encoder(self, spec: EncoderSpec) -> DocumentEncoder:
        encoder = self._local.get(spec)
        if encoder is None:
            encoder = self._local[spec] = DocumentEncoder(spec)
        return encoder

    def submit(self, spec: EncoderSpec, chunk: RawChunk) -> Future[EncodedChunk]:
        """Start encoding ``chunk``; returns a future of its ``EncodedChunk``."""
        if self.num_workers == 0:
            return run_here(self._encoder(spec).encode, chunk)
        if spec.backend == FAST:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="tokenmix-encode")
            return self._threads.submit(self._encoder(spec).encode, chunk)
        pool = self._processes()
        index, location = self._register(spec)
        return pool.submit(encode_in_worker, index, location, chunk)

    def close(self, cancel: bool = False) -> None:
        """Stop the threads and workers (waiting for their tasks unless ``cancel``) and let go of the spec file."""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=cancel)
            self._threads = None
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None
        if self._spec_file is not None:
            self._spec_file.close()  # a worker still busy holds its own descriptor
            self._spec_file = None

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(cancel=exc_type is not None)


def open_build_executor(options: BuildOptions) -> EncoderPool | TaskExecutor:
    """Where a cache build's work runs (``build.executor``): this machine's encoding pool, its worker processes
    started at once when ``build.tokenizer_backend: tokenizers`` says they will be needed, or a cluster's executor."""
    if not isinstance(options.executor, LocalExecutorConfig):
        return options.executor.open(options.num_workers)
    pool = EncoderPool(options.num_workers)
    if options.tokenizer_backend == REFERENCE:
        pool.start_processes()  # while the driver loads the tokenizer
    return pool


def _anonymous_file() -> IO[bytes]:
    """A read-write file without a name, freed by the system when the last process holding it exits."""
    try:
        return open(os.memfd_create("tokenmix-specs", os.MFD_CLOEXEC), "w+b")
    except (AttributeError, OSError):  # not Linux, or a kernel without memfd
        return tempfile.TemporaryFile()


_worker_encoders: dict[int, DocumentEncoder] = {}
_spec_fd = -1
"""This worker's descriptor of the pool's spec file (-1: there is none, specs come with the tasks)."""


def init_worker(threads: int, spec_fd: int | None) -> None:
    """Process-pool initializer: keep the spec file's descriptor and cap the tokenizer's threads.

    ``threads`` caps the tokenizer's own thread pool so that workers do not oversubscribe cores.
    """
    global _spec_fd
    _spec_fd = -1 if spec_fd is None else spec_fd
    os.environ["RAYON_NUM_THREADS"] = str(threads)


def warm_up() -> None:
    """A no-op task that makes the pool start its processes (and their imports) right away."""


def encode_in_worker(spec_index: int, location: SpecLocation, chunk: RawChunk) -> EncodedChunk:
    """Process-pool task: encode a chunk with this worker's encoder for spec ``spec_index``, found at ``location``."""
    encoder = _worker_encoders.get(spec_index)
    if encoder is None:
        data = location if isinstance(location, bytes) else os.pread(_spec_fd, location[1], location[0])
        encoder = _worker_encoders[spec_index] = DocumentEncoder(pickle.loads(data))
    return encoder.encode(chunk)
