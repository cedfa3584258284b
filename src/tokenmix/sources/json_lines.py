"""One line of a JSON lines shard read as Python's ``json`` reads it: orjson's speed where it can, and, where orjson
refuses a line, ``json.loads``, which also takes ``NaN``, ``Infinity`` and ``-Infinity`` (Python's ``json.dumps``
writes them; pandas, and so NeMo Curator, and Arrow's JSON reader take them too) and integers of any size."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


class JsonLineError(ValueError):
    """A line that is not a JSON value; ``reason`` is the counter it is skipped under (``invalid_utf8``,
    ``malformed_json``)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def parse_json_line(line: bytes, parse_int: Callable[[str], Any] | None = None) -> Any:
    """The value of one JSON line. With ``parse_int`` (as ``json.loads`` takes it), integers are exact: a line orjson
    refused, or that may hold an integer beyond 64 bits (which orjson reads as a float), is read again by ``json.loads``
    with it, and a ``ValueError`` it raises makes the line malformed. A value holding a string no tokenizer or writer can
    take (a lone surrogate escape) is malformed too."""
    try:
        value = orjson.loads(line)
        if parse_int is None or not _may_hold_a_big_integer(value):
            return value
        refused = "an integer beyond 64 bits"
    except orjson.JSONDecodeError as e:
        refused = str(e)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as u:
        raise JsonLineError("invalid_utf8", f"byte {u.start} of the line is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_int=parse_int)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError for a lone surrogate
        return value
    except ValueError as e:  # json.JSONDecodeError, UnicodeEncodeError, parse_int's refusal
        detail = str(e) if parse_int is not None and not isinstance(e, (json.JSONDecodeError, UnicodeEncodeError)) else refused
        raise JsonLineError("malformed_json", detail) from None


BIG = float(2**63)
"""The magnitude from which a float orjson gives may be an integer it could not hold in 64 bits."""


def _may_hold_a_big_integer(value: Any) -> bool:
    if isinstance(value, float):
        return abs(value) >= BIG
    if isinstance(value, dict):
        return any(_may_hold_a_big_integer(v) for v in value.values() if not isinstance(v, str))
    if isinstance(value, list):
        return any(_may_hold_a_big_integer(v) for v in value if not isinstance(v, str))
    return False
