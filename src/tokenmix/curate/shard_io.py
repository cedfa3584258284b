"""Reading a shard as Arrow batches, and writing a shard so that only a complete one ever has its name.

Reading goes through ``sources.FileShard`` (the cache builder's reader: formats, compression, fsspec, truncation
checks), a batch of about ``chunk_bytes`` at a time, so memory does not grow with the shard. Parquet shards are read
by row group, already Arrow. A record that cannot be a document (bad JSON, no text field) is a ``BadRecord``: under
``on_error: raise`` the error names the file, the line and the fix; under ``skip`` it is counted by reason.

Writing goes to a hidden temporary name beside the target and is renamed when the shard is complete, so a run killed
at any moment leaves either no output shard or a whole one, and the same input always gives the same bytes (gzip
without a timestamp, zstd and Parquet with fixed settings).
"""

from __future__ import annotations

import gzip
import json
import os
import posixpath
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tokenmix._object_stores import open_url, url_to_fs
from tokenmix.curate.partial_files import PartialFile
from tokenmix.curate.records import (
    POSITION,
    concat,
    engine_table,
    field_column,
    field_name,
    has_field,
    is_hidden,
    records_table,
    set_field,
    table_rows,
    user_table,
)
from tokenmix.execution.retrying import TaskInputError
from tokenmix.sources.json_lines import JsonLineError, parse_json_line
from tokenmix.sources.shards import FileShard, PlainText, ShardReadError

OutputFormat = Literal["jsonl", "jsonl.gz", "jsonl.zst", "parquet"]
MAX_RECORD_DEPTH = 254
"""Levels of nesting a record may have (its own object is level 1): the most orjson writes back (past it, "Recursion
limit reached"), where the output is JSON lines and where a field of mixed types is carried as JSON text."""
OUTPUT_FORMATS: tuple[str, ...] = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")
BATCH_BYTES = 4 << 20
"""Input bytes per batch of records. Each stage costs a fixed few hundred microseconds a batch (numpy and Arrow calls,
whatever the batch's size), so batches four times the cache builder's 1 MiB run NeMo's heuristic filters about a fifth
faster (docs/benchmarks.md), for a few tens of MB of memory per worker."""
INPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst", ".ndjson", ".parquet", ".txt", ".txt.gz", ".txt.zst")


class CurationInputError(TaskInputError):
    """A bad record or an unreadable shard under ``on_error: raise``; the message names the file and the line."""


@dataclass
class ShardBatches:
    """What reading a shard found besides its records: bad records by reason (``on_error: skip``)."""

    bad: Counter[str] = field(default_factory=Counter)
    read: int = 0
    """Records read, bad ones included (blank JSON lines are not records)."""
    failed: str | None = None
    """Why the shard could not be read to its end (``on_error: skip``): the records before that point were read."""


def output_suffix(fmt: str) -> str:
    """The file suffix of an output format (``.jsonl.zst``)."""
    return "." + fmt


def shard_stem(url: str) -> str:
    """A shard's base name without its format and compression suffix: ``books_00`` for ``.../books_00.jsonl.zst``."""
    name = posixpath.basename(url.rstrip("/"))
    lower = name.lower()
    for suffix in sorted(INPUT_SUFFIXES, key=len, reverse=True):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name


def read_batches(url: str, text_field: str, filename_field: str | None, on_error: str, found: ShardBatches,
                 chunk_bytes: int = BATCH_BYTES) -> Iterator[pa.Table]:
    """The records of one shard, in order, as tables with their positions, and ``filename_field`` set to the shard's
    base name when given (NeMo Curator's ``add_filename``): a record that already has that field gets the name of the
    shard it is read from now, as NeMo does. In a chain of steps, each writing its shards under their input's names
    and the next reading them, the field then names the file the record was read from, which is the file the step
    writes it to. Bad records are raised or counted in ``found`` as ``on_error`` says."""
    shard = FileShard(url)
    batches = _parquet_batches(shard) if shard.kind == "parquet" else _record_batches(shard, text_field, on_error, found, chunk_bytes)
    name = posixpath.basename(url.rstrip("/"))
    try:
        for table in batches:
            if shard.kind == "parquet":
                found.read += table.num_rows
                table = _check_text_column(table, shard, text_field, on_error, found)
            if filename_field is not None and table.num_rows:
                table = set_field(table, filename_field, pa.array([name] * table.num_rows, pa.string()))
            if table.num_rows:
                yield table
    except ShardReadError as e:
        if on_error == "raise":
            raise CurationInputError(f"{e}\nFix or remove the shard, or set on_error: skip to count it and go on.") from e
        found.failed = e.reason


def _record_batches(shard: FileShard, text_field: str, on_error: str, found: ShardBatches, chunk_bytes: int) -> Iterator[pa.Table]:
    for chunk in shard.read(0, chunk_bytes):
        records: list[dict[str, Any]] = []
        positions: list[int] = []
        for position, raw in enumerate(chunk.records, chunk.start):
            record, reason, detail = _parse(raw, text_field)
            if record is None and reason is None:
                continue
            found.read += 1
            if reason is not None:
                if on_error == "raise":
                    raise CurationInputError(
                        f"{shard.position_label(position)}: {reason.replace('_', ' ')}{detail}; fix the record, set text_field to the field "
                        "that holds the text, or set on_error: skip to count such records and go on")
                found.bad[reason] += 1
                continue
            records.append(record)
            positions.append(position)
        if records:
            yield records_table(records, positions)


def _parse(raw: Any, text_field: str) -> tuple[dict[str, Any] | None, str | None, str]:
    """A record from what the shard reader gave, or the reason it is bad and what was wrong where the reason does not
    say it (``" (...)"`` or empty); ``(None, None, "")`` for a blank line."""
    if isinstance(raw, PlainText):
        try:
            return {text_field: raw.decode("utf-8")}, None, ""
        except UnicodeDecodeError:
            return None, "invalid_utf8", ""
    if isinstance(raw, bytes):
        if not raw.strip():
            return None, None, ""
        try:
            raw = parse_json_line(raw, parse_int=_int64, max_depth=MAX_RECORD_DEPTH)
        except JsonLineError as e:
            return None, e.reason, f" ({e.detail})" if e.reason == "malformed_json" else ""
    if not isinstance(raw, dict):
        return None, "not_an_object", ""
    if not isinstance(raw.get(text_field), str):
        return None, "missing_text" if raw.get(text_field) is None else "text_not_a_string", ""
    return raw, None, ""


def row_groups(url: str) -> Iterator[pa.Table]:
    """A Parquet file (local or fsspec URL) a row group at a time, so memory holds one group, not the file."""
    with open_url(url) as raw:
        parquet = pq.ParquetFile(raw)
        for group in range(parquet.metadata.num_row_groups):
            yield parquet.read_row_group(group)


def _parquet_batches(shard: FileShard) -> Iterator[pa.Table]:
    try:
        position = 0
        for table in row_groups(shard.name):
            yield engine_table(table).append_column(POSITION, pa.array(range(position, position + table.num_rows), pa.int64()))
            position += table.num_rows
    except FileNotFoundError as e:
        raise ShardReadError(shard.name, 0, "missing_file", str(e)) from e
    except (OSError, pa.ArrowInvalid) as e:
        raise ShardReadError(shard.name, 0, "unreadable_file", f"{type(e).__name__}: {e}") from e


def _check_text_column(table: pa.Table, shard: FileShard, text_field: str, on_error: str, found: ShardBatches) -> pa.Table:
    table = _text_as_strings(table, text_field)
    if not has_field(table, text_field) or not (pa.types.is_string(field_column(table, text_field).type)
                                                or pa.types.is_large_string(field_column(table, text_field).type)):
        reason = "missing_text" if not has_field(table, text_field) else "text_not_a_string"
        if on_error == "raise":
            raise CurationInputError(f"{shard.name}: column {text_field!r} {'is missing' if reason == 'missing_text' else 'is not text'}; "
                                     f"columns are {[field_name(n) for n in table.column_names if not is_hidden(n)]}; set text_field to "
                                     "the text column")
        found.bad[reason] += table.num_rows
        return table.slice(0, 0)
    nulls = field_column(table, text_field).is_null()
    count = pa.compute.sum(nulls).as_py() or 0
    if count:
        if on_error == "raise":
            first = table.column(POSITION).filter(nulls)[0].as_py()
            raise CurationInputError(f"{shard.position_label(first)}: the text field {text_field!r} is null; fix the record or set on_error: skip")
        found.bad["missing_text"] += count
        table = table.filter(pa.compute.invert(nulls))
    return _drop_invalid_utf8(table, shard, text_field, on_error, found)


def _text_as_strings(table: pa.Table, text_field: str) -> pa.Table:
    """The table with a text column that Parquet stored dictionary-encoded (pandas' categories, Arrow dictionaries) or
    as string views made plain strings: the same texts, which the stages, dedups and writers take as strings."""
    if not has_field(table, text_field):
        return table
    kind = field_column(table, text_field).type
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if str(value) == "string_view":
        value = pa.large_string()
    if value == kind or not (pa.types.is_string(value) or pa.types.is_large_string(value)):
        return table
    return set_field(table, text_field, field_column(table, text_field).cast(value))


def _drop_invalid_utf8(table: pa.Table, shard: FileShard, text_field: str, on_error: str, found: ShardBatches) -> pa.Table:
    """The table less its records whose text is not UTF-8 (Arrow reads a Parquet string column without checking), as a
    JSON line whose text is not is bad: stages, dedup and JSON output all need text."""
    texts = field_column(table, text_field)
    try:
        texts.validate(full=True)
        return table
    except pa.ArrowInvalid:
        pass
    valid = pa.array([_is_utf8(t) for t in texts.cast(pa.large_binary()).to_pylist()])
    if on_error == "raise":
        first = table.column(POSITION).filter(pa.compute.invert(valid))[0].as_py()
        raise CurationInputError(f"{shard.position_label(first)}: the text field {text_field!r} is not valid UTF-8; fix the record or set "
                                 "on_error: skip")
    found.bad["invalid_utf8"] += len(valid) - (pa.compute.sum(valid).as_py() or 0)
    return table.filter(valid)


def _int64(digits: str) -> int:
    """An integer of a JSON line read again by ``json.loads`` (orjson refused the line, or may have read an integer as a
    float), where a record field can hold it: Arrow's and pandas' (NeMo Curator's) integers are 64 bits, and pandas
    refuses a larger one ("Value is too big")."""
    value = int(digits)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"the integer {digits[:40]} is beyond 64 bits, which a record field cannot hold")
    return value


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def temporary_path(path: str) -> str:
    """The hidden name an output shard is written under until complete: ``.<name>.partial`` beside it."""
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.partial")


class ShardWriter:
    """Writes one output shard under a temporary name (``partial_files``); ``close`` renames it to ``url`` once every
    batch is in and returns its size and digest.

    ``keep_hidden`` keeps the engine's columns (for the intermediate shards between a pipeline's phases).
    """

    def __init__(self, url: str, fmt: str, keep_hidden: bool = False):
        if fmt not in OUTPUT_FORMATS:
            raise ValueError(f"output format {fmt!r} is not one of {list(OUTPUT_FORMATS)}")
        self.url, self.fmt, self.keep_hidden = url, fmt, keep_hidden
        self.fs, self.path = url_to_fs(url)
        parent = posixpath.dirname(self.path)
        self.tmp_path = temporary_path(self.path)
        self.fs.makedirs(parent, exist_ok=True)
        self.records = 0
        self._file = PartialFile(self.fs, self.tmp_path)
        self._stream: Any = None
        self._parquet: pq.ParquetWriter | None = None
        if fmt == "jsonl.gz":
            self._stream = gzip.GzipFile(filename="", mode="wb", fileobj=self._file, mtime=0)
        elif fmt == "jsonl.zst":
            self._stream = zstandard.ZstdCompressor(level=3).stream_writer(self._file, closefd=False)
        elif fmt == "jsonl":
            self._stream = self._file

    def write(self, table: pa.Table) -> None:
        """Append a batch of records."""
        if not table.num_rows:
            return
        self.records += table.num_rows
        if self.fmt == "parquet":
            self._write_parquet(table)
            return
        self._stream.write(b"".join(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE) for row in table_rows(table)))

    def _write_parquet(self, table: pa.Table) -> None:
        """Append a batch (the engine's columns); a batch whose fields differ from the file's rewrites the file so far
        under one schema of both."""
        out = table if self.keep_hidden else user_table(table)
        if self._parquet is not None and out.schema.remove_metadata() != self._parquet.schema.remove_metadata():
            self._parquet.close()
            self._file.close()
            with self.fs.open(self.tmp_path, "rb") as f:
                written = pq.ParquetFile(f).read()
            self._file.discard()
            merged = concat([written if self.keep_hidden else engine_table(written), table])
            out = merged if self.keep_hidden else user_table(merged)
            self._file = PartialFile(self.fs, self.tmp_path)
            self._parquet = None
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self._file, out.schema, compression="zstd", write_statistics=False)
        self._parquet.write_table(out, row_group_size=max(1, out.num_rows))

    def close(self) -> dict[str, Any]:
        """Finish the file and give it its name; its size and digest (``partial_files.damage`` checks them)."""
        if self.fmt == "parquet":
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self._file, pa.schema([]), compression="zstd")
            self._parquet.close()
        elif self._stream is not self._file:
            self._stream.close()
        self._file.publish(self.path)
        return self._file.record()

    def remove_earlier(self) -> None:
        """Remove the output shard an earlier run of this pipeline wrote at this name, where this run writes none."""
        if self.fs.exists(self.path):
            self.fs.rm_file(self.path)

    def abort(self) -> None:
        """Give up on the shard: its temporary file is removed, no output shard appears."""
        for close in (self._parquet.close if self._parquet is not None else None,
                      self._stream.close if self._stream is not None and self._stream is not self._file else None,
                      self._file.discard):
            try:
                if close is not None:
                    close()
            except (OSError, ValueError, pa.ArrowException):
                pass


def write_whole(url: str, write: Any) -> None:
    """Write a small file whole: ``write(f)`` fills ``<url>.partial`` (``partial_files``), which is then renamed to
    ``url``, so the name only ever holds a complete file (statistics, decisions, artifacts)."""
    fs, path = url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    partial = PartialFile(fs, path + ".partial")
    try:
        write(partial)
    except BaseException:
        partial.discard()
        raise
    partial.publish(path)


def write_table(url: str, table: pa.Table, statistics: bool = False) -> None:
    """An Arrow table as one Parquet file, written whole (``write_whole``)."""
    write_whole(url, lambda f: pq.write_table(table, f, compression="zstd", write_statistics=statistics))


def read_table(url: str, **kwargs: Any) -> pa.Table:
    """A Parquet file (local or fsspec URL) as a table; ``kwargs`` go to ``pyarrow.parquet.read_table``."""
    with open_url(url) as f:
        return pq.read_table(f, **kwargs)


def write_json(url: str, value: Any) -> None:
    """A JSON file, written whole (``write_whole``), keys sorted so that equal values give equal bytes."""
    write_whole(url, lambda f: f.write(json.dumps(value, indent=1, sort_keys=True).encode()))


def read_json(url: str) -> Any | None:
    """A JSON file's value, or ``None`` when it is not there."""
    fs, path = url_to_fs(url)
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        return json.loads(f.read())


def exists(url: str) -> bool:
    """Whether a file is there (local path or fsspec URL)."""
    fs, path = url_to_fs(url)
    return bool(fs.exists(path))


def local_or_url_join(base: str, *parts: str) -> str:
    """``base/part/...`` for a local directory or an fsspec URL."""
    return posixpath.join(base, *parts) if "://" in base else os.path.join(base, *parts)
