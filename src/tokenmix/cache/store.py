"""Storage primitives on tensorstore: a jagged array of token rows and small JSON documents.

A cache location is a local path or a ``file://``, ``gs://``, ``s3://`` or ``memory://`` URL. The
jagged array is two zarr3 arrays: ``data`` (all tokens, row after row) and ``offsets`` (int64),
where ``offsets[0]`` is the number of committed rows and ``offsets[i + 1]`` the end of row ``i``.
Publishing rows is therefore one write of ``offsets[0]``, made only after the rows' tokens and
offsets are durable: a reader that trusts ``offsets[0]`` never sees a partly written row.

Both arrays are declared with a fixed capacity far beyond any real source, so they never need
resizing while readers hold them open; only written chunks exist on storage. A finished cache's
logical sizes are ``offsets[0]`` rows and ``offsets[offsets[0]]`` tokens.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import numpy as np
import orjson
import tensorstore as ts

from tokenmix._object_stores import s3_endpoint
from tokenmix.cache.damage import CacheDamagedError, DamagedChunk, locate, problem_of
from tokenmix.cache.durability import barriers_hold, can_sync_filesystem, sync_filesystem
from tokenmix.sources.urls import join_location

TOKENS_ARRAY = "input_ids"
LOSS_SPANS_ARRAY = "loss_spans"
"""Per document, the ``[start, end)`` token ranges trained on (relative to the document), as flat int64
pairs; present only in caches of formats that mask the loss (identity key ``loss_spans``)."""
CAPACITY = 1 << 48
DATA_SHARD, DATA_INNER = 1 << 20, 1 << 12
"""Tokens per stored object (a zarr3 shard: the unit of a write) and per chunk inside it (the unit of a read): a random
2048-token read touches one or two 8 KiB chunks, not a 512 KiB one, and a store holds few objects. 2^12 by measurement
(docs/design/cache.md): with zstd, 2^13 reads 20% slower and 2^11 25% faster for 4% more bytes; the build is the same."""
OFFSETS_SHARD, OFFSETS_INNER = 1 << 16, 1 << 10

_CONTEXT = ts.Context()
"""One context for the process, so ``memory://`` caches are shared by every opener in it."""
_DEFERRED_SYNC_CONTEXT = ts.Context({"file_io_sync": False})
"""Where a build writes local files where barriers hold (``durability.barriers_hold``): without tensorstore's two
fsyncs per object, made durable by ``make_durable`` at the steps of the commit protocol instead."""
OBJECT_CACHE_BYTES = int(os.environ.get("TOKENMIX_OBJECT_CACHE_BYTES", str(64 << 20)))
"""What a process keeps of what it fetched from caches on object storage (shard indexes, decoded chunks), in bytes."""
_REMOTE_READ_CONTEXT = ts.Context({"cache_pool": {"total_bytes_limit": OBJECT_CACHE_BYTES}})
"""Where tensorstore reads caches on object storage, one context for them all: its cache pool keeps the shard indexes
it has read, so that an exact read costs one request, not two (``docs/benchmarks.md``), and the chunks read lately, so
that a repeated read costs none; least recently used dropped past ``OBJECT_CACHE_BYTES``."""


class CacheWriteError(OSError):
    """The cache's storage refused a write (permissions, a full disk, ...); the message says what is kept and what to do."""


def unwritable(location: str, error: Exception) -> CacheWriteError:
    """A clear error for a cache location that cannot be written: the path, the cause, the fix."""
    cause = storage_cause(error)
    return CacheWriteError(f"cannot write the cache at {location}: {cause}. Choose a cache_dir this user can write to "
                           "(and check the bucket's credentials for gs:// and s3://).")


def storage_cause(error: Any) -> str:
    """The operating system's reason in a storage error, without tensorstore's spec dump or NUL-separated paths."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error)
    for reason in ("No space left on device", "Permission denied", "Read-only file system", "File too large", "Disk quota exceeded"):
        if reason in text:
            return reason
    return text.split("[", 1)[0].replace("\x00", "/").strip().rstrip(":") or type(error).__name__


def kvstore_spec(location: str) -> dict[str, Any]:
    """The tensorstore kvstore spec of a cache location (a directory, with a trailing slash; a bucket's root, with none)."""
    if "://" not in location:
        return {"driver": "file", "path": os.path.abspath(location).rstrip("/") + "/"}
    parsed = urlparse(location)
    path = (parsed.path.lstrip("/") if parsed.scheme in ("gs", "s3") else parsed.netloc + parsed.path).rstrip("/")
    if parsed.scheme == "file":
        return {"driver": "file", "path": "/" + path.lstrip("/") + "/"}
    if parsed.scheme == "memory":
        return {"driver": "memory", "path": path + "/"}
    prefix = path + "/" if path else ""  # a bucket's root: its keys are "ledger.json", not "/ledger.json"
    if parsed.scheme == "gs":
        return {"driver": "gcs", "bucket": parsed.netloc, "path": prefix}
    if parsed.scheme == "s3":
        return {"driver": "s3", "bucket": parsed.netloc, "path": prefix, **_s3_options(location)}
    raise ValueError(f"cache location {location!r}: scheme {parsed.scheme!r} is not supported; use a path, file://, gs://, s3:// or memory://")


def _s3_options(location: str) -> dict[str, Any]:
    """What the environment says about S3, as the AWS tools read it: an S3-compatible endpoint (MinIO, R2, a local
    server) from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, keys from ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY`` when they are set (one without the other is refused, naming both: tensorstore said only
    that "required environment variables could not be sourced", or went on without keys), and the bucket's region from
    ``AWS_REGION`` or ``AWS_DEFAULT_REGION``."""
    options: dict[str, Any] = {}
    endpoint = s3_endpoint()
    if endpoint:
        options["endpoint"] = endpoint
    keys = [name for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if os.environ.get(name)]
    if len(keys) == 1:
        missing = "AWS_SECRET_ACCESS_KEY" if keys[0] == "AWS_ACCESS_KEY_ID" else "AWS_ACCESS_KEY_ID"
        raise ValueError(f"{location}: {keys[0]} is set but {missing} is not; set both (with AWS_SESSION_TOKEN for "
                         "temporary keys), or neither to use the AWS config files or the machine's role")
    if keys:
        options["aws_credentials"] = {"type": "environment"}
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:  # else tensorstore asks the bucket for it, a request for every store it opens
        options["aws_region"] = region
    return options


def _subspec(location: str, sub: str) -> dict[str, Any]:
    spec = kvstore_spec(location)
    spec["path"] = spec["path"] + sub.strip("/") + "/"
    return spec


INTERRUPTED_WRITE_SUFFIX = ".__lock"
"""Tensorstore's file driver writes an object to ``<key>.__lock`` and renames it into place: a process killed between
the two leaves that file behind."""


def remove_interrupted_writes(location: str, keep: tuple[str, ...] = ()) -> int:
    """Delete the partial objects writes cut short left under a local cache: tensorstore's ``<key>.__lock`` files (a
    process killed mid-write), and empty objects, which no write makes whole but a power loss can leave of one renamed
    into place before its bytes reached the disk (a build's writes are durable only at its barriers: ``make_durable``).
    Files named in ``keep`` (at the cache's top) are left alone. Only a builder holding the cache's build lock may call
    this: no other write can be in flight. Returns how many there were."""
    spec = kvstore_spec(location)
    if spec["driver"] != "file":
        return 0
    top = spec["path"].rstrip("/")
    kept = {os.path.join(top, name) for name in keep}
    removed = 0
    for root, _, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(INTERRUPTED_WRITE_SUFFIX) or (path not in kept and os.path.getsize(path) == 0):
                os.remove(path)
                removed += 1
    return removed


def _write_context(location: str, deferred_sync: bool) -> ts.Context:
    """The context to write ``location`` through: ``deferred_sync`` (a build's writes) leaves local files unsynced until
    ``make_durable``; otherwise each write is durable when it completes."""
    spec = kvstore_spec(location)
    return _DEFERRED_SYNC_CONTEXT if deferred_sync and spec["driver"] == "file" and barriers_hold(spec["path"]) else _CONTEXT


def make_durable(location: str) -> None:
    """Return once every write completed so far to the cache at ``location`` is durable: one ``syncfs`` of its filesystem
    shared with the other builds calling now (``durability.sync_filesystem``). On object stores a write is durable once
    acknowledged, and a ``memory://`` cache never is: nothing to do."""
    spec = kvstore_spec(location)
    if spec["driver"] == "file" and barriers_hold(spec["path"]):
        sync_filesystem(spec["path"])


def write_rebuildable(location: str, objects: dict[str, bytes]) -> None:
    """Write objects under ``location`` that a later build makes again from what is durable already (a pack's member
    records, from the finished pack), all at once and without a fsync each, then one ``syncfs``: durable when this
    returns, on any local filesystem (the ordering that makes barriers unsafe on some, ``barriers_hold``, does not
    matter here). A power loss before the end leaves some missing, empty or cut short, which readers refuse
    (checksums) and the next build writes again. Without ``syncfs``, each is fsynced."""
    spec = kvstore_spec(location)
    unsynced = spec["driver"] == "file" and can_sync_filesystem()
    kv = ts.KvStore.open(spec, context=_DEFERRED_SYNC_CONTEXT if unsynced else _CONTEXT).result()
    for write in [kv.write(key, value) for key, value in objects.items()]:
        write.result()
    if unsynced:
        sync_filesystem(spec["path"])


def open_kvstore(location: str, deferred_sync: bool = False) -> ts.KvStore:
    """The key-value store of a location: keys are paths relative to it, and each write replaces a key atomically.
    ``deferred_sync``: a build's, whose local writes are durable at its next ``make_durable``, not each on its own."""
    return ts.KvStore.open(kvstore_spec(location), context=_write_context(location, deferred_sync)).result()


class DocumentDamagedError(ValueError):
    """A stored JSON document that is not JSON (cut short, garbled); the message names it and the fix."""

    def __init__(self, location: str, key: str, problem: str):
        self.location, self.key, self.problem = location, key, problem
        super().__init__(f"{join_location(location, key)} is damaged: {problem}. Delete the cache and build it again (a "
                         "cache's stats.json, or a packed source's packed.json: delete that file alone, and a build writes it "
                         "again)")


class JsonDocuments:
    """Small JSON files beside the arrays (ledger, statistics); each write replaces a file atomically."""

    def __init__(self, location: str, deferred_sync: bool = False):
        """``deferred_sync``: written by a build, whose local writes are durable at its next ``make_durable``."""
        self.location = location
        self.kv = open_kvstore(location, deferred_sync)
        """The location's store (keys relative to it)."""

    def read(self, key: str) -> dict[str, Any] | None:
        """The document at ``key``; None where there is none, or only the empty file a power loss leaves of a write whose
        bytes never reached the disk (a build's writes are durable at its barriers; its next run writes it again)."""
        return self.read_many([key])[0]

    def read_many(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        """``read`` of each key, the reads issued together (a thousand small documents on an object store: one round
        trip's wait, not a thousand). A document that is not JSON raises ``DocumentDamagedError`` naming it."""
        return [None if raw is None else self.parse(key, raw) for key, raw in zip(keys, self.read_bytes(keys))]

    def read_bytes(self, keys: Sequence[str]) -> list[bytes | None]:
        """The stored bytes at each key, the reads issued together; None where there are none, or an empty file."""
        pending = [self.kv.read(key) for key in keys]
        return [bytes(r.value) if r.state == "value" and len(r.value) else None for r in (p.result() for p in pending)]

    def empty(self, key: str) -> bool:
        """Whether ``key`` holds an empty file, which ``read`` takes for none (a write a power loss cut short)."""
        stored = self.kv.read(key).result()
        return stored.state == "value" and not len(stored.value)

    def parse(self, key: str, raw: bytes) -> dict[str, Any]:
        """The document stored as ``raw`` at ``key``; ``DocumentDamagedError`` where it is not JSON."""
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise DocumentDamagedError(self.location, key, f"not a JSON document ({e})") from None

    def write(self, key: str, doc: dict[str, Any]) -> None:
        """Replace the document at ``key`` (indented, keys sorted: orjson, 25x the standard library's indenting encoder
        on a pack's ledger of a thousand shards, rewritten at every commit)."""
        self.kv.write(key, orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS) + b"\n").result()

    def keys(self) -> list[str]:
        """Every key stored under this location, sorted (files in subdirectories too, as ``dir/name``)."""
        return sorted(k.decode("utf-8") for k in self.kv.list().result())


CHUNK_CODECS: dict[str, list[dict[str, Any]]] = {
    "zstd": [{"name": "zstd", "configuration": {"level": 1}}],
    "lz4": [{"name": "blosc", "configuration": {"cname": "lz4hc", "clevel": 1, "shuffle": "noshuffle"}}],
    "none": [],
}
"""The zarr3 codecs after ``bytes`` that store a chunk, by ``build.compression``. ``lz4``: LZ4 blocks in a blosc
container, made by the LZ4HC compressor at level 1 (0.72x the bytes of raw uint16 tokens against zstd's 0.62x, and
decoded 3.7x as fast; level 5 saved 2.4% more bytes and compressed 22% slower, docs/benchmarks.md); blosc's byte
shuffle left off (chunks no smaller, decoding 2.5x slower)."""


CHECKSUM_CODEC = {"name": "crc32c"}
"""The last codec of every chunk: a crc32c of its stored bytes, checked by every read (tensorstore's and
``shard_reads.py``'s), so that bit rot is an error, never other tokens."""

_READ_TRIES = 3
"""Reads of a range whose failure passed when each chunk was read alone (a build writing beside the reader)."""

READER_OPTIONS = {"fill_missing_data_reads": False}
"""How an array is read: a chunk missing from storage is an error, not the fill value (token 0)."""

WRITER_OPTIONS = {**READER_OPTIONS, "store_data_equal_to_fill_value": True}
"""How a builder opens an array: every chunk it writes is stored, zeros included (tensorstore leaves out a chunk equal
to the fill value by default), so that a chunk missing from storage is damage, never a run of zeros."""


def _array_spec(location: str, sub: str, dtype: str, shard: int, inner: int, compression: str) -> dict[str, Any]:
    """A new 1-d array of ``shard``-element objects, each a zarr3 shard of ``inner``-element chunks compressed apart and
    checksummed."""
    codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}, *CHUNK_CODECS[compression], CHECKSUM_CODEC]
    index_codecs = [{"name": "bytes", "configuration": {"endian": "little"}}, CHECKSUM_CODEC]
    return {
        "driver": "zarr3",
        "kvstore": _subspec(location, sub),
        **WRITER_OPTIONS,
        "metadata": {
            "shape": [CAPACITY],
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shard]}},
            "codecs": [{"name": "sharding_indexed",
                        "configuration": {"chunk_shape": [inner], "codecs": codecs, "index_codecs": index_codecs,
                                          "index_location": "start"}}],
            "fill_value": 0,
        },
    }


def _open_array(location: str, sub: str, dtype: str | None, shard: int, inner: int, create: bool,
                compression: str = "zstd", strict: bool = True, settled: bool = False,
                metadata: dict[str, Any] | None = None, deferred_sync: bool = False) -> ts.TensorStore:
    """An existing array with the layout it was made with (caches of every tokenmix layout open), or, with ``create``, a
    new one in today's layout, its chunks stored as ``compression`` says (``CHUNK_CODECS``). Opened to write
    (``create``), every chunk is stored; opened to read, a missing chunk is an error unless ``strict`` is off (arrays
    another program wrote, which may leave out chunks of zeros). ``settled``: read from object storage, the chunks the
    process's cache pool holds serve again without asking the store (only for values that can no longer change).
    ``metadata``: the array's stored zarr metadata, known already (a cache's open object): opened to read without
    reading it again. ``deferred_sync`` (with ``create``): a build's, whose local writes are durable at its next
    ``make_durable``."""
    remote_read = not create and urlparse(location).scheme in ("gs", "s3")
    options = WRITER_OPTIONS if create else READER_OPTIONS if strict else {}
    if remote_read and settled:
        options = {**options, "recheck_cached_data": False}
    context = _REMOTE_READ_CONTEXT if remote_read else _write_context(location, deferred_sync and create)
    try:
        if metadata is not None and not create:
            array = ts.open({"driver": "zarr3", "kvstore": _subspec(location, sub), "metadata": metadata, **options},
                            context=context, open=True, assume_metadata=True).result()
        else:
            array = ts.open({"driver": "zarr3", "kvstore": _subspec(location, sub), **options}, context=context, open=True).result()
    except ValueError as e:
        unreadable = _METADATA_UNREADABLE.search(str(e))
        if unreadable is not None:
            raise DocumentDamagedError(location, f"{sub}/{ZARR_METADATA}", f"not an array's metadata ({unreadable.group(1)})") from None
        if not create or "NOT_FOUND" not in str(e):
            raise
        return ts.open(_array_spec(location, sub, dtype, shard, inner, compression), context=context, create=True).result()
    if dtype is not None and array.dtype.numpy_dtype != np.dtype(dtype):
        raise DocumentDamagedError(location, f"{sub}/{ZARR_METADATA}", f"it says the array holds {array.dtype.numpy_dtype} values, "
                                   f"the cache's are {dtype}")
    return array


ZARR_METADATA = "zarr.json"
"""Where a zarr3 array stores its metadata, under its prefix."""

_METADATA_UNREADABLE = re.compile(r'^(?:DATA_LOSS|FAILED_PRECONDITION): Error opening "zarr3" driver: Error reading [^"]*"[^"]*/'
                                  + re.escape(ZARR_METADATA) + r'": (.*?)(?: \[tensorstore_spec=.*)?$', re.DOTALL)
"""Tensorstore's words for an array's stored metadata that is not JSON, or not a zarr3 array's (cut short, garbled)."""


def _new_array(location: str, sub: str, dtype: str, shard: int, inner: int, compression: str,
               deferred_sync: bool = False) -> ts.TensorStore | None:
    """A new array in today's layout (``_open_array``), or None where one exists already: its ``zarr.json`` written
    only where there is none (the very bytes tensorstore's creation writes: ``_new_metadata``), and the array opened on
    it without reading it back. A third of the CPU of tensorstore's creation, which a small cache paid twice."""
    context = _write_context(location, deferred_sync)
    metadata = _new_metadata(dtype, shard, inner, compression)
    kv = ts.KvStore.open(_subspec(location, sub), context=context).result()
    absent = kv.read(ZARR_METADATA).result()
    if absent.state == "value" or not kv.write(ZARR_METADATA, metadata, if_equal=absent.stamp.generation).result().generation:
        return None
    spec = {"driver": "zarr3", "kvstore": _subspec(location, sub), **WRITER_OPTIONS, "metadata": json.loads(metadata)}
    return ts.open(spec, context=context, open=True, assume_metadata=True).result()


@functools.cache
def _new_metadata(dtype: str, shard: int, inner: int, compression: str) -> bytes:
    """The ``zarr.json`` tensorstore writes when it creates an array of this layout (it creates one in memory)."""
    context = ts.Context()
    ts.open(_array_spec("memory://tokenmix-layout", "array", dtype, shard, inner, compression), context=context,
            create=True).result()
    kv = ts.KvStore.open(_subspec("memory://tokenmix-layout", "array"), context=context).result()
    return bytes(kv.read(ZARR_METADATA).result().value)


class _ChunkAligned:
    """Appends to a 1-d zarr array in whole stored objects (shards): values wait in memory until their object is full,
    so each is compressed and written once instead of once per append (a partial object is read back, merged and
    recompressed). ``flush`` writes the partial last one too, keeping it, so that the values can be committed."""

    def __init__(self, array: ts.TensorStore, chunk: int, start: int, context: ts.Context):
        self.array = array
        self.context = context
        """The context ``array`` was opened in (so that erasing writes as it does)."""
        self.chunk = chunk
        self.start = start
        """Where the first waiting value goes."""
        self.waiting: list[np.ndarray] = []
        self.count = 0
        self.written = start
        """The end of what this appender has written to storage."""

    @property
    def end(self) -> int:
        return self.start + self.count

    def append(self, values: np.ndarray) -> list[ts.Future]:
        self.waiting.append(values)
        self.count += len(values)
        boundary = self.end - self.end % self.chunk
        if boundary <= self.start:
            return []
        data = np.concatenate(self.waiting) if len(self.waiting) > 1 else self.waiting[0]
        split = boundary - self.start
        write = self.array[self.start : boundary].write(data[:split])
        self.written = boundary
        rest = data[split:]
        self.start, self.waiting, self.count = boundary, [rest] if len(rest) else [], len(rest)
        return [write]

    def flush(self) -> list[ts.Future]:
        if not self.count or self.written >= self.end:  # nothing waiting, or all of it written by the last flush
            return []
        self.waiting = [np.concatenate(self.waiting)] if len(self.waiting) > 1 else self.waiting
        self.written = max(self.written, self.end)
        return [self.array[self.start : self.end].write(self.waiting[0])]

    def rewind(self, end: int) -> None:
        """Forget the values from ``end`` on, waiting or written: storage ends as it would had they never been appended.
        Written ones are reset to the fill value: up to the end of the chunk holding ``end`` through this handle (which
        stores that chunk, its values before ``end`` included, whatever they are), and the whole chunks after it through
        one that stores no chunk holding only the fill value (``_erasing``), so those chunks, and objects left empty,
        are removed. Values before ``end`` are never missing meanwhile. Writes of the forgotten values must have
        completed first."""
        dtype = self.array.dtype.numpy_dtype
        kept = np.concatenate(self.waiting)[: max(0, end - self.start)] if self.waiting else np.empty(0, dtype)
        self.start = min(self.start, end)
        self.waiting, self.count = ([kept] if len(kept) else []), len(kept)
        if self.written <= end:
            return
        inner = int(self.array.chunk_layout.read_chunk.shape[0])
        boundary = min(-(-end // inner) * inner, self.written)
        if boundary > end:
            self.array[end:boundary].write(np.zeros((), dtype)).result()
        if self.written > boundary:
            _erasing(self.array, self.context)[boundary : self.written].write(np.zeros((), dtype)).result()
        self.written = end


def _erasing(array: ts.TensorStore, context: ts.Context) -> ts.TensorStore:
    """``array`` opened in ``context`` to drop every chunk that a write leaves holding only the fill value (a builder's
    own handle stores them, so that a missing chunk always means damage)."""
    spec = array.spec().to_json()
    spec["store_data_equal_to_fill_value"] = False
    return ts.open(spec, open=True, context=context).result()


def write_unit(array: ts.TensorStore) -> int:
    """Elements per stored object: what a write should cover whole (a shard, or a plain chunk in older caches)."""
    return int(array.chunk_layout.write_chunk.shape[0])


class JaggedArray:
    """Rows of tokens stored as ``data`` + ``offsets`` zarr3 arrays under ``location/name``.

    Every read either returns the stored values or raises ``CacheDamagedError`` naming the chunks that failed their
    check and the rows they hold; a storage error that is not about the bytes (an unreachable store) is raised as it is.
    """

    def __init__(self, data: ts.TensorStore, offsets: ts.TensorStore, location: str = "", name: str = TOKENS_ARRAY,
                 created: bool = False, context: ts.Context = _CONTEXT):
        self.data = data
        self.offsets = offsets
        self.location = location
        self.name = name
        self.created = created
        """Whether opening it created both arrays: nothing of them is stored yet, ``offsets[0]`` included."""
        self.context = context
        """The context its arrays were opened to write in."""
        self._tokens: _ChunkAligned | None = None
        self._ends: _ChunkAligned | None = None

    @classmethod
    def open(cls, location: str, name: str, dtype: str | None, create: bool = False, compression: str = "zstd",
             strict: bool = True, settled: bool = False, fresh: bool = False,
             metadata: dict[str, dict[str, Any]] | None = None, deferred_sync: bool = False) -> JaggedArray:
        """Open (or, with ``create``, create if absent) the jagged array ``name`` at ``location``; ``compression`` says
        how new values are stored (``CHUNK_CODECS``; row ends are always zstd). ``dtype`` None opens values of any type
        (not with ``create``). ``strict`` off reads a missing chunk as zeros (for arrays another program wrote).
        ``settled``: the values on object storage are read through the cache pool without asking the store again
        whether a chunk it holds changed: only for reads of values committed when this was opened (``_open_array``).
        ``fresh`` (with ``create``): most likely absent (a cache without a ledger yet), so created without trying to open
        it first; ``created`` says whether it was. ``metadata``: the stored zarr metadata of ``data`` and ``offsets`` by
        those names, known already (not read again). ``deferred_sync`` (with ``create``): written by a build, whose
        local writes are durable at its next ``make_durable``."""
        deferred_sync = deferred_sync and create
        context = _write_context(location, deferred_sync)
        if create and fresh and dtype is not None:
            data = _new_array(location, f"{name}/data", dtype, DATA_SHARD, DATA_INNER, compression, deferred_sync)
            offsets = _new_array(location, f"{name}/offsets", "int64", OFFSETS_SHARD, OFFSETS_INNER, "zstd", deferred_sync)
            if data is not None and offsets is not None:
                return cls(data, offsets, location, name, created=True, context=context)
        metadata = metadata or {}
        data = _open_array(location, f"{name}/data", dtype, DATA_SHARD, DATA_INNER, create, compression, strict, settled,
                           metadata.get("data"), deferred_sync)
        offsets = _open_array(location, f"{name}/offsets", "int64", OFFSETS_SHARD, OFFSETS_INNER, create, strict=strict,
                              metadata=metadata.get("offsets"), deferred_sync=deferred_sync)
        return cls(data, offsets, location, name, context=context)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype.numpy_dtype)

    @property
    def checksummed(self) -> bool:
        """Whether every stored chunk carries a checksum (arrays made before checksums do not)."""
        return all(CHECKSUM_CODEC in _chunk_codecs(a) for a in (self.data, self.offsets))

    def committed_rows(self, unwritten_is_empty: bool = False) -> int:
        """The number of published rows (``offsets[0]``), read fresh from storage. Before the first publication that
        value is not stored: ``unwritten_is_empty`` (the ledger holds no rows) reads it as 0, else it is damage."""
        try:
            return int(self.read(self.offsets, 0, 1)[0])
        except CacheDamagedError as e:
            if unwritten_is_empty and all(c.problem == "missing" for c in e.chunks):
                return 0
            raise

    def write_rows(self, first_row: int, first_token: int, tokens: np.ndarray, lengths: np.ndarray) -> list[ts.Future]:
        """Start writing rows ``first_row...`` whose tokens begin at ``first_token``; not yet published. Appended tokens
        and row ends are written a whole chunk at a time: ``flush`` writes the rest."""
        ends = first_token + np.cumsum(lengths, dtype=np.int64)
        futures = []
        if len(tokens):
            if self._tokens is None or self._tokens.end != first_token:
                futures.extend(self._tokens.flush() if self._tokens is not None else [])
                self._tokens = _ChunkAligned(self.data, write_unit(self.data), first_token, self.context)
            futures.extend(self._tokens.append(tokens))
        if len(lengths):
            if self._ends is None or self._ends.end != first_row + 1:
                futures.extend(self._ends.flush() if self._ends is not None else [])
                self._ends = _ChunkAligned(self.offsets, write_unit(self.offsets), first_row + 1, self.context)
            futures.extend(self._ends.append(ends))
        return futures

    def flush(self) -> list[ts.Future]:
        """Start writing the tokens and row ends ``write_rows`` holds back until their chunk is full; a commit waits for
        these writes before its ledger says the rows exist."""
        return [write for appending in (self._tokens, self._ends) if appending is not None for write in appending.flush()]

    def rewind(self, rows: int, values: int) -> None:
        """Forget the rows from ``rows`` on, whose values begin at ``values`` (written by ``write_rows``, never published):
        the next rows are written there, and storage ends as if the forgotten rows had never been written. Writes of
        those rows still in flight must have completed first."""
        for appending, end in ((self._tokens, values), (self._ends, rows + 1)):
            if appending is not None:
                appending.rewind(end)

    def check_rewritten(self, rows: int, values: int) -> None:
        """Raise ``CacheDamagedError`` where a stored object that appending after ``rows`` rows of ``values`` values
        rewrites in part holds a damaged chunk: the first object of the row ends (each publication writes their count
        there) and the last, partial object of each array. Tensorstore reads such an object back to write into it, and
        fails on the damage with an error that is no storage failure a re-run gets past."""
        for array, stored, first_too in ((self.offsets, rows + 1 if rows else 0, True), (self.data, values, False)):
            unit = write_unit(array)
            ranges = {(stored - stored % unit, stored)} if stored % unit else set()
            if first_too and stored:
                ranges.add((0, min(unit, stored)))
            self.awaited(array, sorted(ranges), [array[start:stop].read() for start, stop in sorted(ranges)])

    def publish(self, rows: int) -> None:
        """Make the first ``rows`` rows visible to readers. Their writes must already be complete (tokens held back
        are written first)."""
        for write in self.flush():
            write.result()
        self.offsets[0].write(np.int64(rows)).result()

    def row_ends(self, start: int, stop: int) -> np.ndarray:
        """``offsets[start + 1 : stop + 1]``: the end position of rows ``start`` to ``stop - 1``."""
        if stop <= start:
            return np.empty(0, np.int64)
        return self.read(self.offsets, start + 1, stop + 1)

    def row_bounds(self, start: int, stop: int) -> np.ndarray:
        """Token boundaries of rows ``start`` to ``stop - 1``: ``stop - start + 1`` positions."""
        ends = self.row_ends(start, stop)
        first = np.zeros(1, np.int64) if start == 0 else self.row_ends(start - 1, start)
        return np.concatenate([first, ends])

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        return self.read(self.data, start, stop)

    def read(self, array: ts.TensorStore, start: int, stop: int) -> np.ndarray:
        """Elements ``[start, stop)`` of ``data`` or ``offsets``, checked."""
        return self.awaited(array, [(start, stop)], [array[start:stop].read()])[0]

    def awaited(self, array: ts.TensorStore, ranges: list[tuple[int, int]], reads: list[Any]) -> list[np.ndarray]:
        """The results of reads issued together, one per ``(start, stop)`` range of ``array``; a read that failed on
        damaged bytes raises ``CacheDamagedError`` for every damaged chunk of the ranges, with the rows they hold."""
        tries = 1
        while True:
            try:
                return [np.asarray(r.result()) for r in reads]
            except ValueError as e:
                if problem_of(e) is None:
                    raise
                damage = self.damage(array, ranges)
                if damage.chunks:
                    raise damage from None
                if tries == _READ_TRIES:
                    raise
            # every chunk read alone: the failure passed (a build stored or replaced an object meanwhile); read again
            tries += 1
            reads = [array[start:stop].read() for start, stop in ranges]

    def damage(self, array: ts.TensorStore, ranges: list[tuple[int, int]]) -> CacheDamagedError:
        """The damage among ``ranges`` of ``array`` (each chunk read alone), naming the rows it holds."""
        chunks = list({c: None for start, stop in ranges for c in self.locate(array, start, stop)})
        return CacheDamagedError(self.location, chunks, self.rows_holding(chunks))

    def locate(self, array: ts.TensorStore, start: int, stop: int) -> list[DamagedChunk]:
        """The damaged chunks among elements ``[start, stop)`` of ``data`` or ``offsets``, each chunk read alone."""
        name = f"{self.name}/{'data' if array is self.data else 'offsets'}"
        return locate(name, start, stop, int(array.chunk_layout.read_chunk.shape[0]), lambda a, b: array[a:b].read().result())

    def rows_holding(self, chunks: list[DamagedChunk]) -> tuple[int, int] | None:
        """The rows whose values (``data``) or bounds (``offsets``) are in ``chunks``, or None where the row bounds
        needed to tell cannot be read."""
        try:
            published: int | None = int(np.asarray(self.offsets[0].read().result()))
        except ValueError:
            published = None
        firsts, stops = [], []
        for chunk in chunks:
            if chunk.array.endswith("/offsets"):  # offsets[i] is where row i - 1 ends
                firsts.append(max(0, chunk.start - 1))
                stops.append(chunk.stop - 1 if published is None else min(chunk.stop - 1, published))
                continue
            if published is None:
                return None
            try:
                firsts.append(self._row_of(chunk.start, published))
                stops.append(min(self._row_of(chunk.stop - 1, published) + 1, published))
            except ValueError:
                return None
        return (min(firsts), max(stops)) if firsts else None

    def _row_of(self, token: int, published: int) -> int:
        """The row holding token ``token`` (a binary search over row ends, one read a step)."""
        lo, hi = 0, published
        while lo < hi:
            mid = (lo + hi) // 2
            if int(np.asarray(self.offsets[mid + 1].read().result())) <= token:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _chunk_codecs(array: ts.TensorStore) -> list[dict[str, Any]]:
    """The codecs each stored chunk of ``array`` passes through (inside its shard, for a sharded array)."""
    codecs = array.spec().to_json()["metadata"]["codecs"]
    if len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed":
        return codecs[0]["configuration"]["codecs"]
    return codecs
