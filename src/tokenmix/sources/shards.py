"""Shards: one input file (or one Hugging Face split), opened at a record position, read in chunks.

A shard is read as a stream of ``RawChunk``s. Records stay raw here (a JSON line as bytes, a
parsed dict, or a whole text file as PlainText): decoding and validation happen in the tokenizing
workers, so the reading thread does only I/O and decompression. A record's *position* is its
index in the shard (for JSON lines: the line index, blank lines included; for a tar archive: the
index across its members, in archive order), which is how a build resumes: ``read(start=n)`` skips
to position n without handing earlier records on.

Shard-level failures (missing or unreadable file, truncated or corrupt compressed data, bytes after the last
compressed frame) raise ``ShardReadError`` after every record read before the failure has been yielded. A compressed
stream's checksums are checked at the end of each of its frames, so a shard's records are known to be sound only once
it was read to its end (``Shard.verified_at_end``). A UTF-8 byte order mark at the start of a text is skipped.
"""

from __future__ import annotations

import bisect
import codecs
import itertools
import logging
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import ijson
import orjson
import xxhash

from tokenmix._object_stores import open_url, url_to_fs
from tokenmix.sources.compression import (
    CorruptInputError,
    TrailingDataError,
    TruncatedInputError,
    compression_of,
    decompressing_reader,
    strip_compression_suffix,
)
from tokenmix.sources.urls import local_path

logger = logging.getLogger(__name__)


class PlainText(bytes):
    """The bytes of a whole plain-text file: one document, decoded by the worker."""


RawRecord = bytes | dict[str, Any] | Any
"""``bytes``: one JSON line; ``PlainText``: a whole text document; else a parsed JSON value."""

DEFAULT_CHUNK_BYTES = 1 << 20
DIGEST_MASK = (1 << 64) - 1
DEFAULT_CHUNK_RECORDS = 8192


@dataclass
class RawChunk:
    """Consecutive records of one shard, starting at position ``start``."""

    start: int
    records: list[RawRecord]
    consumed_bytes: int = 0
    """Bytes of the stored (possibly compressed) file consumed since the previous chunk."""

    def digest(self) -> int:
        """A digest of these records at their positions, 64 bits. Summed over a shard's chunks (mod 2**64) it gives one
        value for its first n records however they were chunked, so a build can tell whether what it read is unchanged."""
        total = 0
        for position, record in enumerate(self.records, self.start):
            data = record if isinstance(record, bytes) else orjson.dumps(record, option=orjson.OPT_SORT_KEYS, default=repr)
            total += xxhash.xxh3_64_intdigest(data, seed=position)
        return total & DIGEST_MASK


class ShardReadError(Exception):
    """A shard could not be read (further); ``position`` is where reading stopped."""

    def __init__(self, shard: str, position: int, reason: str, detail: str):
        self.shard = shard
        self.position = position
        self.reason = reason
        self.detail = detail
        super().__init__(f"{shard}: {reason} after {position} records: {detail}")


class Shard(Protocol):
    """One unit of input, read in order from a record position."""

    name: str
    verified_at_end: bool
    """Whether the shard's records are known to be sound only once it was read to its end (a compressed stream's
    checksums are checked there): a build commits none of its rows before its end, and keeps none when its checksums
    fail (``corrupt_shard``) or are never reached (``truncated_file``, ``missing_file``, ``unreadable_file``)."""

    def size_bytes(self) -> int | None:
        """Stored size, for progress and ETA; ``None`` when unknown."""
        ...

    def identity(self) -> dict[str, Any] | None:
        """What the stored input is now (size, and modification time or ETag / content hash), to tell a changed input
        from the one a cache was built from; ``None`` when the input cannot be described. Raises ``FileNotFoundError``."""
        ...

    def position_label(self, position: int) -> str:
        """A record position as a person finds it in the input (line or record number)."""
        ...

    def read(self, start: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[RawChunk]:
        """Yield chunks of records from position ``start`` to the end."""
        ...


@dataclass
class ChunkBuffer:
    start: int
    chunk_bytes: int
    records: list[RawRecord] = field(default_factory=list)
    nbytes: int = 0

    def add(self, record: RawRecord, nbytes: int) -> bool:
        self.records.append(record)
        self.nbytes += nbytes
        return self.nbytes >= self.chunk_bytes or len(self.records) >= DEFAULT_CHUNK_RECORDS

    def take(self, consumed_bytes: int) -> RawChunk:
        chunk = RawChunk(self.start, self.records, consumed_bytes)
        self.start += len(self.records)
        self.records = []
        self.nbytes = 0
        return chunk


_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "crc32c", "mtime", "LastModified", "last_modified", "updated", "created")
"""What object stores (s3fs, gcsfs, ...) report that changes when an object is rewritten, most specific first."""

_TAR_BUFSIZE = tarfile.RECORDSIZE
"""Bytes ``tarfile`` reads from the stream at a time; the tail kept to check an archive's end is twice this."""


class FileShard:
    """A file shard: JSON lines, JSON (array or lines), Parquet, plain text, or a tar archive of JSON-lines and text
    files (Cerebras' ``.jsonl.zst.tar``), maybe compressed."""

    def __init__(self, url: str):
        self.name = url
        self.compression = compression_of(url)
        base = strip_compression_suffix(url).lower()
        if base.endswith((".jsonl", ".ndjson")):
            self.kind = "jsonl"
        elif base.endswith(".json"):
            self.kind = "json"
        elif base.endswith(".parquet"):
            self.kind = "parquet"
        elif base.endswith(".txt"):
            self.kind = "txt"
        elif base.endswith(".tar"):
            self.kind = "tar"
        else:
            raise ValueError(
                f"{url}: unknown shard format; name files .jsonl, .json, .parquet or .txt (optionally .gz or .zst "
                "compressed), or .tar of .jsonl and .txt files"
            )
        self._is_array: bool | None = None
        self._members: dict[int, tuple[int, str, str]] = {}
        """A tar archive's files seen so far by their index in it: (position of their first record, name, kind). Readers
        running at once register the same entries (``setdefault``), so none is listed twice."""
        self._members_complete = False
        """Whether ``_members`` lists every member (the archive was read to its end)."""
        if self.kind == "parquet" and self.compression:
            raise ValueError(f"{url}: Parquet compresses internally; do not wrap it in {self.compression}")

    @property
    def verified_at_end(self) -> bool:
        """Compressed files, and tar archives (whose members may be compressed), are checked as they end."""
        return self.compression is not None or self.kind == "tar"

    def size_bytes(self) -> int | None:
        local = local_path(self.name)
        try:
            if local is not None:
                return os.path.getsize(local)
            fs, path = url_to_fs(self.name)
            return int(fs.size(path))
        except (OSError, ValueError):
            return None

    def identity(self) -> dict[str, Any] | None:
        """Size and ``mtime_ns`` of a local file; size and the first of ETag, generation, content hashes or modification
        time that an object store reports. ``FileNotFoundError`` when the input is missing."""
        local = local_path(self.name)
        if local is None:
            from fsspec.implementations.local import LocalFileSystem

            fs, local = url_to_fs(self.name)
            if not isinstance(fs, LocalFileSystem):
                info = fs.info(local)
                version = next(((key, str(info[key])) for key in _VERSION_KEYS if info.get(key) not in (None, "")), None)
                return {"size": int(info["size"]), **dict([version] if version else [])}
        stat = os.stat(local)
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}

    def position_label(self, position: int) -> str:
        """Where a record position is, as a person looks for it: a line, a tar member and its line, or a record index."""
        return f"{self.name}, {self._record_at(position)}"

    def _record_at(self, position: int, scan: bool = True) -> str:
        """A record position inside this file: ``line N`` (1-based) for JSON lines, ``member M, line N`` in a tar archive,
        else ``record N``. A tar member is looked up by reading the archive up to the position unless this shard has read
        past it already (or ``scan`` is false)."""
        if self.kind == "tar":
            member = self._tar_member_at(position, scan)
            if member is None:
                return f"record {position} (counted over every member)"
            first, name, kind = member
            return f"member {name}" if kind == "txt" else f"member {name}, line {position - first + 1}"
        if self.kind == "jsonl" or (self.kind == "json" and not self._json_is_array()):
            return f"line {position + 1}"
        return f"record {position}"

    def _tar_member_at(self, position: int, scan: bool) -> tuple[int, str, str] | None:
        """The tar member holding a record position, as ``_members`` lists it (read up to it first when ``scan``)."""
        if scan and not self._members_complete and (not self._members or self._members[len(self._members) - 1][0] <= position):
            try:
                with _open_input(self.name) as raw:
                    for _ in self._tar_records(self._stream(raw)):
                        if self._members[len(self._members) - 1][0] > position:
                            break
            except (OSError, ValueError, EOFError, tarfile.TarError):
                pass  # an unreadable archive is reported by ``read``; the label says what is known
        members = [self._members[index] for index in range(len(self._members))]
        found = bisect.bisect_right([first for first, _, _ in members], position) - 1
        return members[found] if found >= 0 else None

    def _json_is_array(self) -> bool:
        if self._is_array is None:
            try:
                with _open_input(self.name) as raw:
                    self._is_array = _starts_with_bracket(self._stream(raw))
            except (OSError, ValueError, EOFError):
                return False
        return self._is_array

    def read(self, start: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[RawChunk]:
        reader = {"jsonl": self._read_lines, "json": self._read_json, "parquet": self._read_parquet, "txt": self._read_txt,
                  "tar": self._read_tar}
        position = start
        try:
            with _open_input(self.name) as raw:
                stream = self._stream(raw)
                try:
                    for chunk in reader[self.kind](raw, stream, start, chunk_bytes):
                        position = chunk.start + len(chunk.records)
                        yield chunk
                except (ijson.JSONError, ValueError) as e:
                    if self.compression is not None and not isinstance(e, CorruptInputError | TrailingDataError):
                        _read_to_end(stream)  # corrupt data breaks the records' structure: then that is the failure
                    raise
                if self.compression is not None:
                    _read_to_end(stream)  # the last frame's checksum, and bytes after it, where records end before
        except FileNotFoundError as e:
            raise ShardReadError(self.name, position, "missing_file", str(e)) from e
        except TruncatedInputError as e:
            where = self._record_at(position, scan=False)
            what = "archive" if self.kind == "tar" else "compressed data"
            detail = (f"the {what} is cut short in {where} ({type(e).__name__}: {e}); every complete record before "
                      f"{where} was read, {where} itself is incomplete; copy the file again from its source")
            raise ShardReadError(self.name, position, "truncated_file", detail) from e
        except CorruptInputError as e:
            detail = (f"{e}, found while reading {self._record_at(position, scan=False)}; no record decoded from the file "
                      "can be trusted: copy it again from its source")
            raise ShardReadError(self.name, position, "corrupt_shard", detail) from e
        except TrailingDataError as e:
            detail = f"{e}; every record before them was read: copy the file again from its source, or cut those bytes off"
            raise ShardReadError(self.name, position, "trailing_junk", detail) from e
        except ijson.JSONError as e:
            raise ShardReadError(self.name, position, "malformed_json", f"JSON array is malformed: {e}") from e
        except (OSError, ValueError) as e:
            raise ShardReadError(self.name, position, "unreadable_file", f"{type(e).__name__}: {e}") from e

    def _stream(self, raw):
        """The decompressed bytes of the file (None for Parquet, which is read by its own reader)."""
        if self.kind == "parquet":
            return None
        stream = decompressing_reader(raw, self.compression)
        return stream if self.kind == "tar" else _without_bom(stream)

    def _tracked(self, raw):
        last = 0

        def consumed() -> int:
            nonlocal last
            try:
                pos = raw.tell()
            except (OSError, ValueError):
                return 0
            delta, last = pos - last, pos
            return delta

        return consumed

    def _read_lines(self, raw, stream, start: int, chunk_bytes: int) -> Iterator[RawChunk]:
        yield from chunked(itertools.islice(stream, start, None), len, ChunkBuffer(start, chunk_bytes), self._tracked(raw))

    def _read_json(self, raw, stream, start: int, chunk_bytes: int) -> Iterator[RawChunk]:
        if not _starts_with_bracket(stream):
            yield from self._read_lines(raw, stream, start, chunk_bytes)
            return
        items = itertools.islice(ijson.items(stream, "item", use_float=True), start, None)
        yield from chunked(items, approx_size, ChunkBuffer(start, chunk_bytes), self._tracked(raw))

    def _read_parquet(self, raw, stream, start: int, chunk_bytes: int) -> Iterator[RawChunk]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(raw)
        meta = pf.metadata
        passed = reported = 0
        """Compressed bytes of the row groups passed so far, and of those reported with a chunk."""

        def rows() -> Iterator[dict[str, Any]]:
            nonlocal passed
            position = 0
            for group in range(meta.num_row_groups):  # row groups before ``start`` are never read
                group_meta = meta.row_group(group)
                passed += sum(group_meta.column(c).total_compressed_size for c in range(group_meta.num_columns))
                if position + group_meta.num_rows > start:
                    yield from pf.read_row_group(group).slice(max(0, start - position)).to_pylist()
                position += group_meta.num_rows

        def consumed() -> int:
            nonlocal reported
            delta, reported = passed - reported, passed
            return delta

        yield from chunked(rows(), approx_size, ChunkBuffer(start, chunk_bytes), consumed)

    def _read_txt(self, raw, stream, start: int, chunk_bytes: int) -> Iterator[RawChunk]:
        data = stream.read()
        if start > 0:
            return
        yield RawChunk(0, [PlainText(data)], len(data))

    def _read_tar(self, raw, stream, start: int, chunk_bytes: int) -> Iterator[RawChunk]:
        records = self._tar_records(stream)
        yield from chunked(itertools.islice(records, start, None), len, ChunkBuffer(start, chunk_bytes), self._tracked(raw))

    def _tar_records(self, stream) -> Iterator[bytes]:
        """Every record of a tar archive, member after member in archive order, streamed (the archive is never seeked):
        each line of a JSON-lines member, each text member whole as ``PlainText``. Directories and links hold no records.

        ``tarfile`` ends a stream quietly where a header is missing, cut or corrupt, so a cut at a member boundary would
        lose the members after it without a word: the archive must end with its end-of-archive block, or
        ``TruncatedInputError`` is raised (``ValueError`` for a corrupt header)."""
        tail = _TailKeepingReader(stream, 2 * _TAR_BUFSIZE)
        position = 0
        name = None
        try:
            with tarfile.open(fileobj=tail, mode="r|", bufsize=_TAR_BUFSIZE) as tar:
                for index, member in enumerate(_files_of(tar)):
                    name = member.name
                    kind, compression = _tar_member_kind(name)
                    self._members.setdefault(index, (position, name, kind))
                    data = _without_bom(decompressing_reader(tar.extractfile(member), compression))
                    if kind == "txt":
                        position += 1
                        yield PlainText(data.read())
                    else:
                        for line in data:
                            position += 1
                            yield line
                end = tail.block_at(tar.offset, tarfile.BLOCKSIZE)
        except tarfile.ReadError as e:
            if tail.exhausted:
                raise TruncatedInputError(f"the archive ends {_in_member(name)} ({e})") from e
            raise ValueError(f"the tar archive is corrupt {_in_member(name)}: {e}") from e
        if len(end) < tarfile.BLOCKSIZE:
            raise TruncatedInputError(f"the archive ends {_after_member(name)} without its end-of-archive block")
        if end.count(0) != tarfile.BLOCKSIZE:
            raise ValueError(f"the tar archive is corrupt {_after_member(name)}: byte {tar.offset} is no tar header")
        self._members_complete = True


def _open_input(url: str) -> Any:
    """The input opened for reading bytes (a context manager giving the file): a local file directly, so that a build
    of local inputs never imports fsspec (30-50 ms of its start-up: the import scans every installed package's entry
    points), anything else through fsspec."""
    local = local_path(url)
    if local is not None:
        return open(local, "rb")
    return open_url(url)


def _files_of(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The regular files of a tar archive read as a stream, in archive order."""
    while (member := tar.next()) is not None:
        tar.members.clear()  # a stream keeps every header it passed otherwise: memory would grow with the member count
        if member.isreg():
            yield member


def _tar_member_kind(name: str) -> tuple[str, str | None]:
    """What a tar member holds (``jsonl`` or ``txt``) and its compression, from its name; ``ValueError`` for others."""
    base = strip_compression_suffix(name).lower()
    if base.endswith((".jsonl", ".ndjson")):
        return "jsonl", compression_of(name)
    if base.endswith(".txt"):
        return "txt", compression_of(name)
    raise ValueError(f"tar member {name!r} is neither JSON lines nor text; a tar shard holds .jsonl, .ndjson or .txt members "
                     "(optionally .gz or .zst compressed): repack the archive without it")


def _in_member(name: str | None) -> str:
    return "before its first file" if name is None else f"in or after member {name!r}"


def _after_member(name: str | None) -> str:
    return "before its first file" if name is None else f"after member {name!r}"


class _TailKeepingReader:
    """A binary stream's reads passed through, keeping the position, the last ``keep`` bytes read, and whether a read
    found nothing left: what is needed to check where ``tarfile`` stopped reading a stream. ``tarfile`` reads a stream
    ``bufsize`` bytes at a time, so the header block it stopped at lies in its last two reads: ``keep`` is twice that."""

    def __init__(self, stream, keep: int):
        self._stream = stream
        self._keep = keep
        self._tail = b""
        self.position = 0
        self.exhausted = False
        """Whether a read asked for bytes after the last one."""

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if size != 0 and not data:
            self.exhausted = True
        self.position += len(data)
        self._tail = (self._tail + data)[-self._keep :]
        return data

    def block_at(self, offset: int, size: int) -> bytes:
        """The bytes read at ``[offset, offset + size)``, fewer where the stream ended (``offset`` must still be kept)."""
        start = offset - (self.position - len(self._tail))
        assert start >= 0, f"byte {offset} is no longer kept"
        return self._tail[start : start + size]


def chunked(records: Iterator[RawRecord], size: Callable[[Any], int], buf: ChunkBuffer, consumed: Callable[[], int]) -> Iterator[RawChunk]:
    """``records`` in chunks of about ``buf.chunk_bytes`` (by ``size``), each with the input bytes ``consumed()`` so far.

    When ``records`` fails (a truncated or corrupt file), the records read before the failure are yielded first and the
    error is raised after them, so a shard's readable prefix is never lost with its last, partly filled chunk.
    """
    failure: Exception | None = None
    try:
        for record in records:
            if buf.add(record, size(record)):
                yield buf.take(consumed())
    except Exception as e:
        failure = e
    if buf.records:
        yield buf.take(consumed())
    if failure is not None:
        raise failure


def _without_bom(stream):
    """``stream`` past a leading UTF-8 byte order mark, which marks the encoding and is no part of the first record."""
    if stream.peek(len(codecs.BOM_UTF8))[: len(codecs.BOM_UTF8)] == codecs.BOM_UTF8:
        stream.read(len(codecs.BOM_UTF8))
    return stream


def _read_to_end(stream) -> None:
    """Read what is left of a decompressing stream, so that its last checksums are checked; raises its failure."""
    while stream.read(DEFAULT_CHUNK_BYTES):
        pass


def _starts_with_bracket(stream) -> bool:
    """Whether a JSON file holds an array (else: JSON lines), without consuming the stream."""
    head = stream.peek(256)
    return head.lstrip()[:1] == b"["


def approx_size(item: Any) -> int:
    if isinstance(item, dict):
        return sum(approx_size(v) for v in item.values())
    if isinstance(item, str | bytes):
        return len(item)
    if isinstance(item, list):
        return 8 * len(item) if item and isinstance(item[0], int) else sum(approx_size(v) for v in item)
    return 8
