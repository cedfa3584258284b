"""One line of a JSON lines shard read as Python's ``json`` reads it: orjson's speed where it can, and, where orjson
refuses a line, ``json.loads``, which also takes ``NaN``, ``Infinity`` and ``-Infinity`` (Python's ``json.dumps``
writes them; pandas, and so NeMo Curator, and Arrow's JSON reader take them too) and integers of any size."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

BIG = float(2**63)
"""The magnitude from which a float orjson gives may be an integer it could not hold in 64 bits."""


class JsonLineError(ValueError):
    """A line that is not a JSON value; ``reason`` is the counter it is skipped under (``invalid_utf8``,
    ``malformed_json``)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def parse_json_line(line: bytes, parse_int: Callable[[str], Any] | None = None, max_depth: int | None = None) -> Any:
    """The value of one JSON line. With ``parse_int`` (as ``json.loads`` takes it), integers are exact: a line orjson
    refused, or that may hold an integer beyond 64 bits (which orjson reads as a float), is read again by ``json.loads``
    with it, and a ``ValueError`` it raises makes the line malformed. With ``max_depth``, a value nested deeper (the line's
    own object or array is level 1) is malformed. A value holding a string no tokenizer or writer can take (a lone
    surrogate escape) is malformed too."""
    try:
        value = orjson.loads(line)
        if parse_int is None and max_depth is None:
            return value
        depth, big = _shape(value)
        if not big or parse_int is None:
            return _within(value, depth, max_depth)
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
    except RecursionError:  # nested deeper than the interpreter's stack: orjson refuses past 1,024 levels too
        raise JsonLineError("malformed_json", refused) from None
    except ValueError as e:  # json.JSONDecodeError, UnicodeEncodeError, parse_int's refusal
        detail = str(e) if parse_int is not None and not isinstance(e, (json.JSONDecodeError, UnicodeEncodeError)) else refused
        raise JsonLineError("malformed_json", detail) from None
    return value if max_depth is None else _within(value, _shape(value)[0], max_depth)


def _within(value: Any, depth: int, max_depth: int | None) -> Any:
    if max_depth is not None and depth > max_depth:
        raise JsonLineError("malformed_json", f"nested {depth:,} levels deep, over the {max_depth:,} a record may have")
    return value


def _shape(value: Any) -> tuple[int, bool]:
    """How deep ``value`` nests (a scalar 0, an object or array 1 more than its deepest member), and whether it holds a
    float of a magnitude an integer past 64 bits is read as by orjson; a walk without recursion (orjson reads 1,024
    levels, more than Python's stack takes)."""
    if type(value) is not dict and type(value) is not list:
        return 0, type(value) is float and abs(value) >= BIG
    deepest, big = 0, False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        for member in item.values() if type(item) is dict else item:
            kind = type(member)
            if kind is float:
                big = big or abs(member) >= BIG
            elif kind is dict or kind is list:
                stack.append((member, depth + 1))
    return deepest, big
