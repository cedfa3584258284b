"""Records as Arrow tables, and back, without changing a record's fields.

Curation stages work on ``pyarrow.Table`` batches, so filters run vectorized. A record's own fields must come out as
they went in, which a plain ``Table.from_pylist`` does not promise: records of one shard that lack a field would come
out with it set to null, and a field holding an int in one record and a string in another cannot be a column at all.
So a batch remembers both: the absent fields of each record (a hidden column, present only when records differ in
their fields) and the fields kept as JSON text because their values have no common Arrow type (in the schema's
metadata). ``table_rows`` undoes both.

Columns whose names start with ``__`` are the engine's own (a record's position in its input shard, its copies in a
blend) and never reach the output.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

POSITION = "__position"
"""A record's position in its input shard (a JSON line index, a row index), carried through every stage."""
ABSENT = "__absent"
"""The fields a record did not have, NUL-separated; null where it had them all."""
JSON_FIELDS_KEY = b"tokenmix.json_fields"
"""Schema metadata: the fields stored as JSON text (NUL-separated), because their values have no common Arrow type."""


def as_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Values as one Arrow array: a chunked array's only chunk as it is, or its chunks combined. ``combine_chunks``
    copies even a single chunk, which would cost a pass over a batch's texts in every stage and give each stage new
    buffers, so that analyses kept for a batch of texts (``heuristics``, keyed by their buffers) were never found again."""
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def is_hidden(name: str) -> bool:
    """Whether a column is the engine's own rather than a record field."""
    return name.startswith("__")


def records_table(records: list[dict[str, Any]], positions: list[int]) -> pa.Table:
    """A table of ``records`` (dicts as parsed from JSON or Parquet), with their positions."""
    names: dict[str, None] = {}
    uniform = True
    first_keys = records[0].keys() if records else None
    for record in records:
        if record.keys() != first_keys:
            uniform = False
        names.update(dict.fromkeys(record))
    columns: dict[str, pa.Array] = {}
    json_fields: list[str] = []
    for name in names:
        values = [record.get(name) for record in records]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            json_fields.append(name)
            columns[name] = pa.array([None if v is None else orjson.dumps(v).decode() for v in values], pa.string())
    columns[POSITION] = pa.array(positions, pa.int64())
    if not uniform:
        columns[ABSENT] = pa.array(["\0".join(n for n in names if n not in record) or None for record in records], pa.string())
    table = pa.table(columns)
    if json_fields:
        table = table.replace_schema_metadata({JSON_FIELDS_KEY: "\0".join(json_fields).encode()})
    return table


def json_fields(table: pa.Table) -> set[str]:
    """The fields of ``table`` stored as JSON text."""
    raw = (table.schema.metadata or {}).get(JSON_FIELDS_KEY)
    return set(raw.decode().split("\0")) if raw else set()


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The records of ``table`` as they were read (absent fields left out, JSON-text fields parsed), with the fields
    stages added; hidden columns dropped."""
    as_json = json_fields(table)
    absent = table.column(ABSENT).to_pylist() if ABSENT in table.column_names else None
    visible = table.select([n for n in table.column_names if not is_hidden(n)])
    rows = visible.to_pylist()
    for i, row in enumerate(rows):
        if absent is not None and absent[i]:
            for name in absent[i].split("\0"):
                row.pop(name, None)
        for name in as_json:
            if row.get(name) is not None:
                row[name] = orjson.loads(row[name])
    return rows


def concat(tables: list[pa.Table]) -> pa.Table:
    """One table of batches whose schemas may differ (a field null throughout one batch, absent from another)."""
    if len(tables) == 1:
        return tables[0]
    merged_json = set().union(*(json_fields(t) for t in tables)) | _conflicting_fields(tables)
    names = list(dict.fromkeys(n for t in tables for n in t.column_names if not is_hidden(n)))
    aligned = []
    for table in tables:
        own_json = json_fields(table)
        for name in merged_json - own_json:
            if name in table.column_names:
                values = [None if v is None else orjson.dumps(v).decode() for v in table.column(name).to_pylist()]
                table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.string()))
        missing = [n for n in names if n not in table.column_names]
        if missing or ABSENT in table.column_names:
            before = table.column(ABSENT).to_pylist() if ABSENT in table.column_names else [None] * table.num_rows
            after = ["\0".join(([b] if b else []) + missing) or None for b in before]
            table = table.drop_columns([ABSENT]) if ABSENT in table.column_names else table
            table = table.append_column(ABSENT, pa.array(after, pa.string()))
        aligned.append(table.replace_schema_metadata(None))
    out = pa.concat_tables(aligned, promote_options="permissive")
    return out.replace_schema_metadata({JSON_FIELDS_KEY: "\0".join(sorted(merged_json)).encode()} if merged_json else None)


def _conflicting_fields(tables: list[pa.Table]) -> set[str]:
    """Fields whose Arrow types differ between ``tables`` in a way no promotion reconciles (an int here, a string there)."""
    types: dict[str, list[pa.DataType]] = {}
    for table in tables:
        for field in table.schema:
            if not is_hidden(field.name) and field.name not in json_fields(table) and not pa.types.is_null(field.type):
                types.setdefault(field.name, []).append(field.type)
    conflicting = set()
    for name, seen in types.items():
        try:
            pa.unify_schemas([pa.schema([(name, t)]) for t in seen], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            conflicting.add(name)
    return conflicting
