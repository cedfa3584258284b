"""Decoding a mapping of many config entries (a mixture's sources) to the objects draccus would make, without paying
draccus's cost per entry.

draccus resolves a dataclass's type hints every time it decodes one (each string annotation compiled and evaluated):
about 0.3-0.5 ms a source, most of a second for a mixture of a thousand sources, paid by every process that opens the
mixture. Most entries are plain: their fields hold strings, booleans, integers or lists of strings, of exactly the type
the field takes. Such an entry is made directly, with the values draccus would give it (the same types, nothing
converted). Every other entry, and any entry its class refuses, is decoded by draccus itself at the same path, so what
it makes and the errors it raises are draccus's, word for word.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Any

import draccus
from draccus.parsers.decoding import decode_dict, get_decoding_fn
from draccus.utils import DecodingError, ParsingError, canonicalize_union


class _NotPlain(Exception):
    """A value draccus would convert or check: the entry is left to draccus."""


def register_plain_mapping(value_type: type) -> None:
    """Make draccus decode ``dict[str, value_type]`` fields through ``decode_plain_mapping``."""
    mapping = canonicalize_union(dict[str, value_type])  # type: ignore[valid-type]  # draccus looks types up as typing.Dict[...]
    draccus.decode.register(mapping, decode_plain_mapping, include_subclasses=True)


def decode_plain_mapping(mapping_type: Any, raw: Any, path: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``raw`` decoded as ``mapping_type`` (``dict[str, V]``, V a dataclass): plain entries made directly, the others (and
    anything but a mapping of string keys) by draccus's own decoders."""
    value_type = typing.get_args(mapping_type)[1]
    if type(raw) is not dict or any(type(k) is not str for k in raw):
        return decode_dict(str, value_type)(raw, path)
    decode_value = get_decoding_fn(value_type)
    out = {}
    for name, entry in raw.items():
        made = _plain(value_type, entry)
        out[name] = made if made is not None else _decoded(decode_value, entry, (*tuple(path), name))
    return out


def _decoded(decode_value: Callable[[Any, tuple[str, ...]], Any], entry: Any, path: tuple[str, ...]) -> Any:
    """draccus's decoding of ``entry`` at ``path``; where the class refuses its arguments, draccus's message names no field,
    so it is given the entry's path (the name of the source among a thousand)."""
    try:
        return decode_value(entry, path)
    except DecodingError:
        raise
    except ParsingError as e:
        raise DecodingError(path, str(e)) from e.__cause__


def _plain(cls: type, entry: Any) -> Any | None:
    """``cls`` made from a plain ``entry``, or None when draccus must decode it."""
    fields = _plain_fields(cls)
    if type(entry) is not dict or not fields.required <= entry.keys():
        return None
    try:
        kwargs = {name: fields.convert[name](value) for name, value in entry.items()}
    except (KeyError, _NotPlain):
        return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError):  # refused by the class: draccus raises it, with its path and wording
        return None


@dataclasses.dataclass(frozen=True)
class _PlainFields:
    convert: dict[str, Callable[[Any], Any]]
    """Per init field of a plain type: the value draccus would make of a raw one (raising ``_NotPlain`` otherwise)."""
    required: frozenset[str]
    """The fields without a default."""


@functools.cache
def _plain_fields(cls: type) -> _PlainFields:
    hints = typing.get_type_hints(cls)
    convert = {}
    for f in dataclasses.fields(cls):
        check = _converter(hints[f.name]) if f.init else None
        if check is not None:
            convert[f.name] = check
    required = frozenset(f.name for f in dataclasses.fields(cls)
                         if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return _PlainFields(convert, required)


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    """For a field of type ``hint``, what draccus makes of a raw value of exactly that type (``X | None``: None too), or
    None for a type this module leaves to draccus."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _converter(next(a for a in args if a is not type(None)))
        return None if inner is None else (lambda v: None if v is None else inner(v))
    if hint in (str, bool, int):
        return functools.partial(_exactly, hint)
    if typing.get_origin(hint) is list and args == (str,):
        return _strings
    return None


def _exactly(kind: type, value: Any) -> Any:
    if type(value) is not kind:
        raise _NotPlain
    return value


def _strings(value: Any) -> list[str]:
    if type(value) is not list or any(type(v) is not str for v in value):
        raise _NotPlain
    return list(value)
