"""Exact reads of a sharded token array straight from its bytes: the chunks a batch touches are sliced from memory-mapped
shard files (uncompressed) or read by byte range (compressed; on object storage in one concurrent call), and decompressed
in one call.

A cache's tokens are a zarr3 array of shards (``store.DATA_SHARD`` tokens per object), each holding small chunks
(``store.DATA_INNER``) compressed apart, with the shard's index of chunk byte ranges at its start. Tensorstore reads
such an array exactly, but at a fixed cost per read that caps a batch of 64 shuffled 2048-token examples near a tenth
of a memory-mapped gather. Here an uncompressed local shard is a memory map: reading a chunk is a slice, as in a raw
memmap gather. Compressed chunks are read by range and handed to zstd or LZ4 (in blosc's container): they are copied
when decompressed anyway, so a map would only hold a file descriptor and resident pages per shard read.

Tensorstore replaces an object as a whole (a file is renamed over), so a mapped or fetched shard is one version of it.
Complete shards are never written again; the last, partly filled one is mapped again when its file was replaced, read
whole each time when compressed, and on object storage (where versions cannot be told apart cheaply) read whole, index
and chunks in one request, and kept until more tokens are committed: every version stored after a commit holds the
tokens committed then.
"""

from __future__ import annotations

import errno
import functools
import mmap
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
import zstandard

from tokenmix._object_stores import url_to_fs
from tokenmix.cache.damage import CacheDamagedError, DamagedChunk
from tokenmix.sources.urls import local_path

Fetch = list[tuple[str, int, "int | None"]]
"""Byte ranges of stored objects to fetch: ``(key, start, stop)``, ``stop`` None to the object's end."""

MISSING = np.uint64(2**64 - 1)
"""A shard index entry for a chunk that was never written."""
CRC32C_RESIDUE = 0x48674BC7
"""The crc32c of any bytes followed by their own crc32c (little-endian): a chunk is checked with one pass over it."""
_crc32c = google_crc32c.value


@dataclass(frozen=True)
class ShardLayout:
    """What reading a sharded 1-d array by byte range needs from its zarr3 metadata."""

    shard: int
    inner: int
    dtype: np.dtype
    codec: str | None
    """The chunks' compression codec (``zstd``, ``blosc``), None for raw values."""
    checksummed: bool = False
    """Whether each stored chunk ends with a crc32c of the bytes before it (zarr3's ``crc32c`` codec)."""

    @property
    def chunks_per_shard(self) -> int:
        return self.shard // self.inner

    @property
    def index_bytes(self) -> int:
        """The shard index: ``(offset, nbytes)`` uint64 pairs per chunk and a crc32c of them."""
        return self.chunks_per_shard * 16 + 4

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> ShardLayout | None:
        """The layout of a 1-d zarr3 array whose shards this module reads (index at the start, little-endian values, zstd,
        blosc or no compression, with or without a crc32c per chunk), or None for any other layout (tensorstore reads
        those)."""
        codecs = metadata.get("codecs", [])
        if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed" or metadata.get("chunk_key_encoding", {}).get("name") != "default":
            return None
        sharding = codecs[0]["configuration"]
        names = [c["name"] for c in sharding["codecs"]]
        checksummed = names[-1:] == ["crc32c"]
        names = names[:-1] if checksummed else names
        index_names = [c["name"] for c in sharding.get("index_codecs", [])]
        endians = [c.get("configuration", {}).get("endian", "little") for c in sharding["codecs"][:1] + sharding["index_codecs"][:1]]
        if (sharding.get("index_location") != "start" or names not in (["bytes"], ["bytes", "zstd"], ["bytes", "blosc"])
                or index_names != ["bytes", "crc32c"] or set(endians) != {"little"}):
            return None
        (shard,) = metadata["chunk_grid"]["configuration"]["chunk_shape"]
        (inner,) = sharding["chunk_shape"]
        return cls(int(shard), int(inner), np.dtype(metadata["data_type"]).newbyteorder("<"), names[1] if len(names) > 1 else None,
                   checksummed)


OPEN_SHARDS = 4096
"""Shards whose index (and, on object storage, a partial shard's bytes) is kept per array: a bound on entries, not on
reads. The mappings of local shards are kept by ``MAPPED``, bounded in files and bytes for the whole process."""
MAPPED_BYTES = int(os.environ.get("TOKENMIX_MAPPED_BYTES", str(64 << 30)))
"""Bytes of shard files a process keeps memory-mapped, every cache together (``TOKENMIX_MAPPED_BYTES``, 64 GiB): address
space, whose pages are the page cache's (clean, dropped by the kernel under pressure) though those reads touched count
in the process's resident memory."""
MAPPED_FILES = int(os.environ.get("TOKENMIX_MAPPED_FILES", str(min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4))))
"""Shard files a process keeps mapped, every cache together (``TOKENMIX_MAPPED_FILES``; by default a quarter of the
process's limit on open files, at most 4,096): each mapping holds a file descriptor of its own, so without this bound a
reader of a thousand sources would hold a thousand descriptors (and past the usual limit of 1,024, fail to open more);
well under the shards a shuffled read of a large uncompressed corpus touches, it would map them again and again (256
files for 400 shards of 2^20 tokens halved the reads: 0.117x of a memmap gather against 0.254x)."""


class MappedShards:
    """The process's memory-mapped shard files, ``path -> (inode, bytes)``, least recently used first: at most
    ``max_files`` of them, their sizes summing to at most ``max_bytes`` (a file larger than that is mapped for its read
    and not kept). A reader of few shards keeps them all mapped; one of more maps a shard again when it comes back to it
    (about 20 us, page cache warm)."""

    def __init__(self, max_bytes: int, max_files: int):
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._maps: OrderedDict[str, tuple[int, np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str, check: bool) -> tuple[int, np.ndarray]:
        """``(inode, bytes)`` of the file at ``path``: the mapping held, unless there is none or ``check`` finds its file
        replaced since (then mapped again)."""
        with self._lock:
            held = self._maps.get(path)
            if held is not None:
                self._maps.move_to_end(path)
        if held is not None and not check:
            return held
        try:
            inode = os.stat(path).st_ino
            if held is not None and held[0] == inode:
                return held
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                mapped = (stat.st_ino, np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8) if stat.st_size
                          else np.empty(0, np.uint8))  # cut to nothing: nothing to map, and its index is reported missing
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
        with self._lock:
            old = self._maps.pop(path, None)
            self._bytes -= 0 if old is None else old[1].nbytes
            if mapped[1].nbytes <= self.max_bytes:
                self._maps[path] = mapped
                self._bytes += mapped[1].nbytes
            while self._bytes > self.max_bytes or len(self._maps) > self.max_files:
                self._bytes -= self._maps.popitem(last=False)[1][1].nbytes
        return mapped


MAPPED = MappedShards(MAPPED_BYTES, MAPPED_FILES)


class LocalShards:
    """Shard files under a directory, mapped through ``MAPPED``; ``get`` maps a shard again when its file was replaced
    (a partial shard the build rewrote)."""

    def __init__(self, root: str):
        self.root = root

    def get(self, key: str, check: bool) -> tuple[int, np.ndarray]:
        """``(inode, bytes)`` of shard ``key``; ``check``: make sure it is the file there now (a shard still written)."""
        try:
            return MAPPED.get(os.path.join(self.root, key), check)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no such file", key) from None


class LocalRanges:
    """Shard files under a directory read by byte range (``os.pread``), nothing held between reads: how compressed
    chunks are read, which are decompressed into memory of their own anyway, so that a map would save no copy while
    holding a descriptor and the pages it touched. A batch's ranges of one file are read through one descriptor."""

    def __init__(self, root: str):
        self.root = root

    def read_ranges(self, requests: Sequence[tuple[str, int, int | None]]) -> list[bytes]:
        """The bytes ``[start, stop)`` of each ``(key, start, stop)``; ``stop`` None reads to the file's end."""
        out = []
        files: dict[str, int] = {}
        try:
            for key, start, stop in requests:
                fd = files.get(key)
                if fd is None:
                    try:
                        fd = files[key] = os.open(os.path.join(self.root, key), os.O_RDONLY)
                    except FileNotFoundError:
                        raise FileNotFoundError(errno.ENOENT, "no such file", key) from None
                end = os.fstat(fd).st_size if stop is None else stop
                out.append(os.pread(fd, max(end - start, 0), start))
        finally:
            for fd in files.values():
                os.close(fd)
        return out


class RemoteShards:
    """Objects read through an fsspec filesystem (s3fs, gcsfs, ...): the ranges of a batch in one concurrent
    ``cat_ranges`` call."""

    def __init__(self, url: str):
        self.fs, self.root = url_to_fs(url)

    def read_ranges(self, requests: Sequence[tuple[str, int, int | None]]) -> list[bytes]:
        """The bytes ``[start, stop)`` of each ``(key, start, stop)``; ``stop`` None reads to the object's end."""
        paths = [f"{self.root.rstrip('/')}/{key}" for key, _, _ in requests]
        results = self.fs.cat_ranges(paths, [s for _, s, _ in requests], [e for _, _, e in requests], on_error="return")
        for (key, _, _), result in zip(requests, results):
            if isinstance(result, FileNotFoundError):
                raise FileNotFoundError(errno.ENOENT, "no such object", key)
            if isinstance(result, BaseException):
                raise result
        return results


class FetchedRanges:
    """Byte ranges fetched from object storage, kept up to ``max_bytes`` in all, least recently used dropped first: a
    range read again (a later epoch, a batch read twice) costs no request. Keyed by the version of the object they were
    read from (``ShardedReads``), so that a range of an object written again since is never served."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._held: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> np.ndarray | None:
        with self._lock:
            value = self._held.get(key)
            if value is not None:
                self._held.move_to_end(key)
            return value

    def forget(self, location: str, array: str, shards: set[int]) -> None:
        """Drop the ranges held of ``shards`` of an array (keys ``(location, array, shard, ...)``)."""
        with self._lock:
            for key in [k for k in self._held if k[:2] == (location, array) and k[2] in shards]:
                self._bytes -= self._held.pop(key).nbytes

    def put(self, key: tuple[Any, ...], value: np.ndarray) -> None:
        if value.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._held:
                return
            self._held[key] = value
            self._bytes += value.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._held.popitem(last=False)[1].nbytes


FETCHED = FetchedRanges(int(os.environ.get("TOKENMIX_OBJECT_CACHE_BYTES", str(64 << 20))))
"""The chunks of caches on object storage this process keeps (``$TOKENMIX_OBJECT_CACHE_BYTES``, as ``store.py``'s
tensorstore cache pool)."""


class StoreShards:
    """Objects read through tensorstore's own drivers (gs://, s3://) by byte range: the ranges of a batch issued at once,
    those of one object that touch or overlap fetched as one range (the consecutive chunks an example spans)."""

    def __init__(self, url: str):
        from tokenmix.cache.store import open_kvstore

        self.kv = open_kvstore(url)

    def read_ranges(self, requests: Sequence[tuple[str, int, int | None]]) -> list[bytes]:
        """The bytes ``[start, stop)`` of each ``(key, start, stop)``; ``stop`` None reads to the object's end. A range
        past the object's end reads as the bytes there are (none), so the chunk's check reports it cut short."""
        return self.start_ranges(requests)()

    def start_ranges(self, requests: Sequence[tuple[str, int, int | None]]) -> Callable[[], list[bytes]]:
        """Issue ``read_ranges(requests)`` now; returns a function that waits for the bytes (no thread waits meanwhile)."""
        merged: list[tuple[str, int, int | None]] = []
        where: list[tuple[int, int]] = []
        for i in sorted(range(len(requests)), key=lambda i: (requests[i][0], requests[i][1])):
            key, start, stop = requests[i]
            last = merged[-1] if merged else None
            if last is not None and last[0] == key and last[2] is not None and start <= last[2]:
                merged[-1] = (key, last[1], None if stop is None else max(stop, last[2]))
            else:
                merged.append((key, start, stop))
            where.append((i, len(merged) - 1))
        fetches = [self.kv.read(key, byte_range=slice(start, stop)) for key, start, stop in merged]

        def wait() -> list[bytes]:
            got = [self._bytes(key, fetch) for (key, _, _), fetch in zip(merged, fetches)]
            out: list[bytes] = [b""] * len(requests)
            for i, m in where:
                _, start, stop = requests[i]
                at = start - merged[m][1]
                out[i] = got[m][at : None if stop is None else at + stop - start]
            return out

        return wait

    @staticmethod
    def _bytes(key: str, fetch: Any) -> bytes:
        try:
            result = fetch.result()
        except ValueError as e:
            if "OUT_OF_RANGE" in str(e) or "not valid for value of size" in str(e):
                return b""
            raise
        if result.state != "value":
            raise FileNotFoundError(errno.ENOENT, "no such object", key)
        return bytes(result.value)


class ShardedReads:
    """Exact token reads of one sharded array, safe to share between threads. Every chunk read is checked (its crc32c,
    and that its bytes are all there); damaged storage raises ``CacheDamagedError`` naming the chunks."""

    def __init__(self, layout: ShardLayout, source: LocalShards | LocalRanges | RemoteShards | StoreShards, location: str, array: str):
        """``location``: the cache; ``array``: the array under it (``input_ids/data``), for messages."""
        self.layout = layout
        self.source = source
        self.location = location
        self.array = array
        self._shards: OrderedDict[int, tuple[Any, np.ndarray, np.ndarray | None]] = OrderedDict()
        """shard -> (version, chunk byte ranges, the shard's bytes where held in memory), least recently used first.
        Version None: a complete shard, never written again; else the file's inode, or the committed token count when
        the object was read."""
        self._lock = threading.Lock()

    @property
    def remote(self) -> bool:
        """Whether reads wait on a network (worth running beside other work) rather than on memory."""
        return isinstance(self.source, (RemoteShards, StoreShards))

    def know_indexes(self, indexes: dict[int, bytes], committed: int) -> None:
        """Take stored indexes of shards (by shard; each checked, as if read), valid while ``committed`` tokens are: a
        finished cache's open object holds them, so that its first reads fetch only chunks."""
        for s, raw in indexes.items():
            complete = (s + 1) * self.layout.shard <= committed
            self._shards[s] = (None if complete else ("committed", committed), self._index(raw, s), None)

    @property
    def issues_ahead(self) -> bool:
        """Whether ``start`` issues a read's requests at once and waits only when asked (no thread waits meanwhile)."""
        return isinstance(self.source, StoreShards)

    def read(self, begin: np.ndarray, size: np.ndarray, committed: int) -> list[np.ndarray]:
        """Tokens ``[begin[p], begin[p] + size[p])`` for each piece ``p``, each inside one chunk (``layout.inner``) and
        below ``committed``. Pieces of an uncompressed local cache are views of its memory maps."""
        return self.start(begin, size, committed)()

    def start(self, begin: np.ndarray, size: np.ndarray, committed: int) -> Callable[[], list[np.ndarray]]:
        """``read``, its first requests issued now where the source can (``issues_ahead``); returns a function that
        waits for them and gives the pieces."""
        steps = self._read(begin, size, committed)
        done, value = self._advance(next, steps)
        if done:
            return lambda: value
        if self.issues_ahead:
            pending = self._step(functools.partial(self.source.start_ranges, value))  # type: ignore[union-attr]
        else:
            pending = functools.partial(self.source.read_ranges, value)  # type: ignore[union-attr]

        def finish() -> list[np.ndarray]:
            fetch = pending
            while True:
                done, value = self._advance(steps.send, self._step(fetch))
                if done:
                    return value
                fetch = functools.partial(self.source.read_ranges, value)  # type: ignore[union-attr]

        return finish

    def _advance(self, step: Callable[..., Any], arg: Any) -> tuple[bool, Any]:
        """One step of a read: ``(False, the byte ranges it needs next)``, or ``(True, its pieces)`` once it has ended."""
        try:
            return False, self._step(functools.partial(step, arg))
        except StopIteration as ended:
            return True, ended.value

    def _step(self, step: Callable[[], Any]) -> Any:
        """``step()``, a stored object found missing raised as damage naming it. The shards damage was found in are
        forgotten, so that a later read takes them as stored then (repaired, say), not as this reader last saw them."""
        try:
            try:
                return step()
            except FileNotFoundError as e:  # a stored object gone (every source names it by its key)
                if not str(e.filename).startswith("c/"):
                    raise
                raise self._damaged_object(int(str(e.filename).removeprefix("c/")), "missing") from None
        except CacheDamagedError as e:
            self._forget({c.start // self.layout.shard for c in e.chunks})
            raise

    def _forget(self, shards: set[int]) -> None:
        """Drop what is kept of ``shards``: their indexes (a mapping is then checked against the file at its path) and the
        ranges fetched of them."""
        with self._lock:
            for s in shards:
                self._shards.pop(s, None)
        FETCHED.forget(self.location, self.array, shards)

    def _read(self, begin: np.ndarray, size: np.ndarray, committed: int) -> Generator[Fetch, list[bytes], list[np.ndarray]]:
        """The pieces ``read`` gives, as steps: each yields the byte ranges it needs fetched (``(key, start, stop)``) and
        takes their bytes; local shards need none."""
        if not len(begin):  # zstd's batch decompression of no frames kills the process (SIGFPE)
            return []
        layout = self.layout
        chunk = begin // layout.inner
        shard = chunk // layout.chunks_per_shard
        shards = yield from self._get(np.unique(shard).tolist(), committed)
        within = (chunk % layout.chunks_per_shard).tolist()
        shard_ids = shard.tolist()
        entries = np.array([shards[s][1][w] for s, w in zip(shard_ids, within)], np.uint64).reshape(-1, 2)
        if np.any(entries[:, 0] == MISSING):
            raise self._damaged(np.unique(chunk[entries[:, 0] == MISSING]).tolist(), "missing")
        offset, nbytes = entries[:, 0].astype(np.int64), entries[:, 1].astype(np.int64)
        item = layout.dtype.itemsize
        first = (begin - chunk * layout.inner) * item
        if layout.codec is None and not layout.checksummed:
            pieces = yield from self._bytes(shard_ids, shards, (offset + first).tolist(), (offset + first + size * item).tolist())
            return [p.view(layout.dtype) for p in pieces]
        if layout.codec is None:  # each piece's chunk checked (a chunk two pieces share, twice), the piece a view of it
            frames = yield from self._bytes(shard_ids, shards, offset.tolist(), (offset + nbytes).tolist())
            self._check(frames, nbytes, chunk)
            return [f[a:b].view(layout.dtype) for f, a, b in zip(frames, first.tolist(), (first + size * item).tolist())]
        _, at, piece_chunk = np.unique(chunk, return_index=True, return_inverse=True)
        frames = yield from self._bytes(shard[at].tolist(), shards, offset[at].tolist(), (offset[at] + nbytes[at]).tolist())
        if layout.checksummed:
            self._check(frames, nbytes[at], chunk[at])
            frames = [frame[:-4] for frame in frames]
        if layout.codec == "zstd":
            try:
                decoded = [np.frombuffer(b, layout.dtype) for b in zstandard.ZstdDecompressor().multi_decompress_to_buffer(frames, threads=1)]
            except zstandard.ZstdError:
                raise self._damaged(chunk[at].tolist(), "undecodable") from None
        else:
            import blosc2  # 0.16 s to import: paid by readers of blosc caches only, not by every cold start

            decoded = np.empty((len(frames), layout.inner), layout.dtype)
            for frame, row, c in zip(frames, decoded, chunk[at].tolist()):
                if blosc2.get_cbuffer_sizes(frame)[:2] != (row.nbytes, len(frame)):
                    raise self._damaged([c], "undecodable")
                blosc2.decompress(frame, dst=row)
        return [decoded[c][f // item : f // item + m] for c, f, m in zip(piece_chunk.tolist(), first.tolist(), size.tolist())]

    def _check(self, frames: list[np.ndarray], nbytes: np.ndarray, chunks: np.ndarray) -> None:
        """Raise ``CacheDamagedError`` unless each stored chunk's bytes are all there and match its crc32c."""
        lengths = np.fromiter(map(len, frames), np.int64, len(frames))
        if np.any((lengths != nbytes) | (nbytes < 4)):
            raise self._damaged(np.unique(chunks[(lengths != nbytes) | (nbytes < 4)]).tolist(), "cut short")
        sums = list(map(_crc32c, frames))
        if sums.count(CRC32C_RESIDUE) != len(sums):
            raise self._damaged(np.unique(chunks[np.array(sums) != CRC32C_RESIDUE]).tolist(), "checksum mismatch")

    def _damaged(self, chunks: list[int], problem: str) -> CacheDamagedError:
        """The error for damaged chunks of this array (rows are named by the cache, which reads the row bounds)."""
        per_shard = self.layout.chunks_per_shard
        inner = self.layout.inner
        return CacheDamagedError(self.location, [DamagedChunk(self.array, c * inner, (c + 1) * inner, problem,
                                                              f"c/{c // per_shard}, chunk {c % per_shard} of {per_shard}") for c in chunks])

    def _damaged_object(self, shard: int, problem: str) -> CacheDamagedError:
        """The error for a stored object (a whole shard) that is missing or whose index is damaged."""
        size = self.layout.shard
        return CacheDamagedError(self.location, [DamagedChunk(self.array, shard * size, (shard + 1) * size, problem, f"c/{shard}")])

    def _get(self, shards: list[int], committed: int) -> Generator[Fetch, list[bytes], dict[int, tuple[Any, np.ndarray, np.ndarray | None]]]:
        """Each shard's entry, mapping or fetching what is missing or stale."""
        with self._lock:
            have = {s: self._shards.get(s) for s in shards}
        complete = {s: (s + 1) * self.layout.shard <= committed for s in shards}
        if isinstance(self.source, LocalShards):
            for s in shards:
                entry = have[s]
                inode, data = self.source.get(f"c/{s}", check=entry is None or entry[0] is not None)  # unknown, or partial when last seen
                index = entry[1] if entry is not None and entry[0] in (None, inode) else self._index(data, s)
                have[s] = (None if complete[s] else inode, index, data)
        else:
            # a partial shard is read whole (its index and chunks one version of it) and, from object storage, kept while
            # the committed tokens stay the same: any version of it stored since holds those tokens, so what was read
            # keeps serving them. A local one is read again each time (a copy from the page cache), so that memory does
            # not hold the last shard of every source read
            indexes = [s for s in shards if complete[s] and (have[s] is None or have[s][0] is not None)]
            whole = [s for s in shards if not complete[s] and (have[s] is None or have[s][0] != ("committed", committed))]
            needed: Fetch = [(f"c/{s}", 0, self.layout.index_bytes) for s in indexes] + [(f"c/{s}", 0, None) for s in whole]
            raw = (yield needed) if needed else []
            for s, data in zip(indexes + whole, raw):
                index = self._index(data, s)
                have[s] = (None, index, None) if complete[s] else (("committed", committed), index, np.frombuffer(data, np.uint8))
        with self._lock:
            for s in shards:
                if isinstance(self.source, LocalShards):
                    self._shards[s] = (*have[s][:2], None)  # a mapping is held by ``MAPPED`` alone
                elif complete[s] or not isinstance(self.source, LocalRanges):
                    self._shards[s] = have[s]
                else:
                    continue
                self._shards.move_to_end(s)
            while len(self._shards) > OPEN_SHARDS:
                self._shards.popitem(last=False)
        return have  # type: ignore[return-value]

    def _bytes(self, shard: list[int], shards: dict[int, tuple[Any, np.ndarray, np.ndarray | None]], start: list[int],
               stop: list[int]) -> Generator[Fetch, list[bytes], list[np.ndarray]]:
        """Byte ranges of shards: slices of those held in memory, or kept from an earlier fetch from object storage
        (``FETCHED``, by the shard's version), the rest fetched in one batch."""
        out: list[np.ndarray] = []
        requests, slots, keys = [], [], []
        keep = self.remote  # local files are read again, checked each time, from the page cache
        for s, a, b in zip(shard, start, stop):
            data = shards[s][2]
            if data is not None:
                out.append(data[a:b])
                continue
            key = (self.location, self.array, s, shards[s][0], a, b)
            held = FETCHED.get(key) if keep else None
            if held is not None:
                out.append(held)
                continue
            requests.append((f"c/{s}", a, b))
            slots.append(len(out))
            keys.append(key)
            out.append(data)
        for i, key, raw in zip(slots, keys, (yield requests) if requests else []):
            out[i] = np.frombuffer(raw, np.uint8)
            if keep:
                FETCHED.put(key, out[i])
        return out

    def _index(self, raw: bytes | np.ndarray, shard: int) -> np.ndarray:
        layout = self.layout
        head = bytes(raw[: layout.index_bytes])
        if len(head) < layout.index_bytes:
            raise self._damaged_object(shard, "cut short")
        if google_crc32c.value(head[:-4]) != int.from_bytes(head[-4:], "little"):
            raise self._damaged_object(shard, "damaged index")
        return np.frombuffer(head[:-4], "<u8").reshape(-1, 2)


def make_source(url: str, via: str, layout: ShardLayout, by_range: bool = False) -> LocalShards | LocalRanges | RemoteShards | StoreShards | None:
    """Where an array at ``url`` is read from: its files for a path or ``file://`` (mapped when its chunks are raw values,
    read by range when they are compressed), fsspec for a remote URL when ``via`` is ``fsspec``; else, for gs:// and
    s3://, tensorstore's drivers by byte range where ``by_range`` (the shard indexes are known, so a read costs only its
    chunks), or None where tensorstore should read the array itself (``memory://`` too)."""
    path = local_path(url)
    if path is not None:
        return (LocalShards if layout.codec is None else LocalRanges)(path)
    if url.startswith("memory://"):
        return None
    if via == "fsspec":
        return RemoteShards(url)
    return StoreShards(url) if by_range else None


def reads_for(metadata: dict[str, Any], location: str, array: str, via: str, by_range: bool = False) -> ShardedReads | None:
    """The exact reader of ``array`` (e.g. ``input_ids/data``) of the cache at ``location``, or None when tensorstore
    reads it (another layout, or a store read through tensorstore); ``by_range``: read gs:// and s3:// by byte range
    through tensorstore's drivers (``make_source``)."""
    layout = ShardLayout.from_metadata(metadata)
    source = make_source(f"{location.rstrip('/')}/{array}", via, layout, by_range) if layout is not None else None
    if layout is None or source is None:
        return None
    return ShardedReads(layout, source, location, array)
