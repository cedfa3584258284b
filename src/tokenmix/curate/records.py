"""Records as Arrow tables, and back, without changing a record's fields.

Curation stages work on ``pyarrow.Table`` batches, so filters run vectorized. A record's own fields must come out as
they went in, which a plain ``Table.from_pylist`` does not promise: records of one shard that lack a field would come
out with it set to null, and a field holding an int in one record and a string in another cannot be a column at all.
So a batch remembers both: the absent fields of each record (a hidden column, present only when records differ in
their fields) and the fields kept as JSON text because their values have no common Arrow type (in the schema's
metadata). ``table_rows`` undoes both.

Columns whose names start with ``__`` are the engine's own (a record's position in its input shard, its copies in a
blend) and never reach the output. A record field may have any name, those starting with ``__`` too, so such a field
is held in a column named ``__~`` + the rest of its name (``__index`` in ``__~index``, ``__~x`` in ``__~~x``) and
gets its own name back on the way out (``column_name``, ``field_name``): no field can take or hide an engine column.
Stages name fields, never columns: ``field_column`` and ``set_field`` take a field's name.
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
_ENGINE = "__"
_ESCAPED = "__~"


def as_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Values as one Arrow array: a chunked array's only chunk as it is, or its chunks combined. ``combine_chunks``
    copies even a single chunk, which would cost a pass over a batch's texts in every stage and give each stage new
    buffers, so that analyses kept for a batch of texts (``heuristics``, keyed by their buffers) were never found again."""
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def is_hidden(name: str) -> bool:
    """Whether a column is the engine's own rather than a record field."""
    return name.startswith(_ENGINE) and not name.startswith(_ESCAPED)


def column_name(field: str) -> str:
    """The column that holds the record field ``field``: its own name, unless that starts with ``__`` (the engine's)."""
    return _ESCAPED + field[len(_ENGINE):] if field.startswith(_ENGINE) else field


def field_name(column: str) -> str:
    """The record field a column holds (``column_name`` undone)."""
    return _ENGINE + column[len(_ESCAPED):] if column.startswith(_ESCAPED) else column


def field_column(table: pa.Table, field: str) -> pa.ChunkedArray:
    """The values of the record field ``field``; ``KeyError`` when no record has it."""
    return table.column(column_name(field))


def field_values(table: pa.Table, field: str) -> list[Any]:
    """The values of the record field ``field`` as the records hold them (a field kept as JSON text parsed), ``None``
    for a record without it: what a user's function is given."""
    column = column_name(field)
    if column not in table.column_names:
        return [None] * table.num_rows
    values = table.column(column).to_pylist()
    if column in json_fields(table):
        return [None if v is None else orjson.loads(v) for v in values]
    return values


def has_field(table: pa.Table, field: str) -> bool:
    """Whether some record of ``table`` has the field ``field``."""
    return column_name(field) in table.column_names


def set_field(table: pa.Table, field: str, values: pa.Array) -> pa.Table:
    """``table`` with the field ``field`` set to ``values`` in every record: replaced in place where the field is there
    (so a record keeps its fields' order), else added last. A record that lacked the field has it now, and a field
    that was carried as JSON text holds ``values`` as they are."""
    column = column_name(field)
    if column in table.column_names:
        table = table.set_column(table.column_names.index(column), column, values)
    else:
        table = table.append_column(column, values)
    if column in json_fields(table):
        table = _with_json_fields(table, json_fields(table) - {column})
    if ABSENT in table.column_names:
        lists = table.column(ABSENT).to_pylist()
        if any(a and column in a.split("\0") for a in lists):
            kept = ["\0".join(n for n in a.split("\0") if n != column) or None if a else None for a in lists]
            table = table.set_column(table.column_names.index(ABSENT), ABSENT, pa.array(kept, pa.string()))
    return table


def user_table(table: pa.Table) -> pa.Table:
    """The record fields of ``table`` under their own names, the engine's columns left out (fields carried as JSON text
    stay text, named in the schema's metadata)."""
    visible = table.select([n for n in table.column_names if not is_hidden(n)])
    return _renamed(visible, field_name)


def engine_table(table: pa.Table) -> pa.Table:
    """A table of record fields (a Parquet shard as read) with each field in its column (``column_name``)."""
    return _renamed(table, column_name)


def _renamed(table: pa.Table, rename: Any) -> pa.Table:
    names = [rename(n) for n in table.column_names]
    if names == table.column_names:
        return table
    renamed = table.rename_columns(names)
    as_json = json_fields(table)
    return _with_json_fields(renamed, {rename(n) for n in as_json}) if as_json else renamed


def _with_json_fields(table: pa.Table, names: set[str]) -> pa.Table:
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != JSON_FIELDS_KEY}
    if names:
        metadata[JSON_FIELDS_KEY] = "\0".join(sorted(names)).encode()
    return table.replace_schema_metadata(metadata or None)


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
        column = column_name(name)
        try:
            columns[column] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            json_fields.append(column)
            columns[column] = pa.array([None if v is None else orjson.dumps(v).decode() for v in values], pa.string())
    columns[POSITION] = pa.array(positions, pa.int64())
    if not uniform:
        columns[ABSENT] = pa.array(["\0".join(column_name(n) for n in names if n not in record) or None for record in records], pa.string())
    table = pa.table(columns)
    if json_fields:
        table = table.replace_schema_metadata({JSON_FIELDS_KEY: "\0".join(json_fields).encode()})
    return table


def json_fields(table: pa.Table) -> set[str]:
    """The fields of ``table`` stored as JSON text."""
    raw = (table.schema.metadata or {}).get(JSON_FIELDS_KEY)
    return set(raw.decode().split("\0")) if raw else set()


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The records of ``table`` as they were read (absent fields left out, JSON-text fields parsed, fields under their
    own names), with the fields stages added; the engine's columns dropped."""
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
    if any(field_name(n) != n for n in visible.column_names):
        rows = [{field_name(k): v for k, v in row.items()} for row in rows]
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
