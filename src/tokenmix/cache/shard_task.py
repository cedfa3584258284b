"""Shard tasks: what a cluster worker does with one input shard, and the staged tokens it leaves.

On a cluster (Ray, Dask) the unit of work is a shard, from the record position the ledger says: the
worker reads it itself (the driver never touches the raw input), encodes it chunk by chunk exactly as
the local pool would, and writes each chunk's arrays to one key under the cache's staging area,
``<cache>/.staging/<attempt>/<chunk>``. It returns only the account of every chunk (counts,
positions, skipped records): tokens travel through storage, not through the engine.

The driver appends the staged chunks of each shard to the cache in listed-shard order, writing them
at the next free row and token as if its own pool had encoded them, and commits the ledger as
usual. So the staging area is never part of the cache: readers never look at it, a shard is
visible only once the driver has committed it, a killed worker's half-written attempt is never read
(every attempt stages under its own name, and only a finished task's result names it), and the
driver, restarted, resubmits every shard the ledger does not hold as finished, from its position.
"""

from __future__ import annotations

import dataclasses
import io
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import tensorstore as ts
import zstandard

from tokenmix.cache.store import kvstore_spec, open_kvstore
from tokenmix.formats.base import FILTER_REASONS
from tokenmix.formats.encoder import DocumentEncoder, EncodedChunk
from tokenmix.formats.encoder_spec import EncoderSpec
from tokenmix.sources.shards import FileShard, Shard, ShardReadError
from tokenmix.sources.urls import join_location

STAGING_DIR = ".staging"
"""Under a cache location: where cluster workers leave encoded shards for the driver (never read by readers)."""

_STAGED_ARRAYS = ("tokens", "lengths", "spans", "span_counts")
_WRITES_IN_FLIGHT = 4
_PREFETCH = 4


@dataclass(frozen=True)
class ShardJob:
    """One shard task: encode ``shard`` from record position ``start`` into staging attempt ``attempt``."""

    index: int
    """The shard's place in the cache's shard list."""
    shard: Shard
    start: int
    location: str
    """The cache location, as every worker can reach it (an absolute path or a URL)."""
    attempt: str
    """Name of this submission's staging directory: unique per try, so a retry never meets a dead try's keys."""
    spec_key: str
    """Identifies the encoder spec, so a worker builds its tokenizer once per spec, not once per task."""
    chunk_bytes: int
    stop_at_bad_record: bool
    """``on_error: raise``: stop after the first chunk with a bad record (the build stops there anyway)."""

    @property
    def staging(self) -> str:
        return join_location(self.location, STAGING_DIR, self.attempt)


@dataclass
class StagedChunk:
    """A chunk encoded by a worker: its account, with the arrays left out (they are staged under ``key``)."""

    key: str
    account: EncodedChunk
    rows: int
    tokens: int


@dataclass
class ShardResult:
    """What a shard task returns to the driver: the staged chunks in order, and how the shard ended."""

    index: int
    attempt: str
    chunks: list[StagedChunk]
    complete: bool
    """False when the task stopped early at a bad record (``stop_at_bad_record``)."""
    error: tuple[int, str, str] | None = None
    """A shard-level read failure after the chunks: (position, reason, detail) of ``ShardReadError``."""
    worker: str = ""
    """``host:pid`` of the worker process that ran the task."""
    seconds: float = 0.0
    documents: int = field(init=False)
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.documents = sum(c.rows for c in self.chunks)
        self.tokens = sum(c.tokens for c in self.chunks)

    def read_error(self, shard_name: str) -> ShardReadError | None:
        if self.error is None:
            return None
        position, reason, detail = self.error
        return ShardReadError(shard_name, position, reason, detail)


def portable(shard: Shard) -> Shard:
    """The shard as a worker elsewhere can open it: a relative file path made absolute (workers have their own cwd)."""
    if isinstance(shard, FileShard) and "://" not in shard.name and not os.path.isabs(shard.name):
        return FileShard(os.path.abspath(shard.name))
    return shard


def portable_location(location: str) -> str:
    """A cache location as a worker elsewhere reaches it; ``memory://`` lives in the driver's process and cannot be."""
    if location.startswith("memory://"):
        raise ValueError(
            f"cache location {location}: a memory:// cache lives in the driver process, so cluster workers cannot write to it; "
            "use a path on a filesystem every worker mounts, gs:// or s3:// (or build.executor.type: local)"
        )
    return location if "://" in location else os.path.abspath(location)


_encoders: dict[str, DocumentEncoder] = {}


def _encoder(key: str, spec: EncoderSpec) -> DocumentEncoder:
    encoder = _encoders.get(key)
    if encoder is None:
        # one task per CPU slot: the tokenizer's own thread pool gets one thread (read when it first starts)
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        if len(_encoders) >= 8:
            _encoders.clear()
        encoder = _encoders[key] = DocumentEncoder(spec)
    return encoder


def run_shard(job: ShardJob, spec: EncoderSpec) -> ShardResult:
    """The task a cluster worker runs: encode one shard from ``job.start`` and stage its chunks.

    Every staged write has completed when this returns, so a result names only whole staged chunks.
    """
    started = time.monotonic()
    encoder = _encoder(job.spec_key, spec)
    staging = open_kvstore(job.staging)
    compressor = zstandard.ZstdCompressor(level=1)
    chunks: list[StagedChunk] = []
    writes: list[ts.Future] = []
    error = None
    complete = True
    try:
        for n, raw in enumerate(job.shard.read(job.start, job.chunk_bytes)):
            encoded = encoder.encode(raw)
            key = f"{n:08d}"
            writes.append(staging.write(key, compressor.compress(_pack(encoded))))
            chunks.append(StagedChunk(key, _without_arrays(encoded), len(encoded.lengths), len(encoded.tokens)))
            while len(writes) > _WRITES_IN_FLIGHT:
                writes.pop(0).result()
            if job.stop_at_bad_record and any(reason not in FILTER_REASONS for _, reason, _ in encoded.skipped):
                complete = False
                break
    except ShardReadError as e:
        error = (e.position, e.reason, e.detail)
    for write in writes:
        write.result()
    return ShardResult(job.index, job.attempt, chunks, complete, error, f"{socket.gethostname()}:{os.getpid()}",
                       time.monotonic() - started)


def _pack(chunk: EncodedChunk) -> bytes:
    out = io.BytesIO()
    np.savez(out, **{name: getattr(chunk, name) for name in _STAGED_ARRAYS})
    return out.getvalue()


def _without_arrays(chunk: EncodedChunk) -> EncodedChunk:
    empty = np.empty(0, np.int64)
    return dataclasses.replace(chunk, tokens=chunk.tokens[:0], lengths=empty, spans=empty, span_counts=empty)


def staged_chunks(result: ShardResult, location: str) -> Iterator[EncodedChunk]:
    """The chunks of a finished shard task, arrays read back from staging, in order (a few reads ahead)."""
    staging = open_kvstore(join_location(location, STAGING_DIR, result.attempt))
    decompressor = zstandard.ZstdDecompressor()
    reads = [staging.read(c.key) for c in result.chunks[:_PREFETCH]]
    for i, chunk in enumerate(result.chunks):
        if i + _PREFETCH < len(result.chunks):
            reads.append(staging.read(result.chunks[i + _PREFETCH].key))
        read = reads[i].result()
        reads[i] = None
        if read.state != "value":
            raise RuntimeError(f"{location}: staged chunk {result.attempt}/{chunk.key} is missing: was the staging area "
                               f"{STAGING_DIR}/ removed while the build ran?")
        with np.load(io.BytesIO(decompressor.decompress(bytes(read.value))), allow_pickle=False) as arrays:
            yield dataclasses.replace(chunk.account, **{name: arrays[name] for name in _STAGED_ARRAYS})


def delete_staging(location: str, attempt: str | None = None) -> ts.Future:
    """Start deleting one attempt's staged chunks, or (``attempt=None``) the whole staging area."""
    prefix = STAGING_DIR + "/" + (attempt + "/" if attempt else "")
    return open_kvstore(location).delete_range(ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord("/") + 1)))


def clear_staging(location: str) -> None:
    """Remove the staging area (leftovers of tasks whose results were never used) and, on a filesystem, its directory."""
    delete_staging(location).result()
    spec = kvstore_spec(location)
    if spec["driver"] == "file":
        try:
            os.rmdir(os.path.join(spec["path"], STAGING_DIR))
        except OSError:
            pass
