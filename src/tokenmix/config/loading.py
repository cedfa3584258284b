"""Reading a data config from a YAML file or a mapping, with command-line overrides, into config objects.

The document is a mixture config (it has ``configs:``, or newer Levanter's ``components:``), a single-dataset config,
either of those under a ``data:`` key (as in a Levanter training config; its other sections are ignored), or a Nanotron
config's ``data_stages`` (``nanotron.py``). A YAML file
may pull in others with ``!include path`` (or merge one with ``<<: !include path``), each path taken
relative to the file that names it, as draccus and Levanter resolve them. The document is decoded by
draccus straight from the mapping: nothing is written to disk.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import logging
import os
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import draccus
import yaml
from draccus.parsers.yaml_loader import ConstructorWithGoodInclusion, SafeLoaderWithInclusion, include_constructor
from yaml.resolver import Resolver

from tokenmix.config.mixture import DataConfig, LMDatasetConfig, LMMixtureDatasetConfig
from tokenmix.config.nanotron import is_nanotron, nanotron_mixture

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A data config that cannot be used; the message names the file and field, and what to change."""


def load_data_config(config: str | os.PathLike[str] | Mapping[str, Any], overrides: Sequence[str] | None = None) -> DataConfig:
    """Load a data config (mixture or single dataset) from a YAML file or a mapping, with overrides.

    ``overrides`` are draccus' dotted command-line form, ``--cache_dir /tmp/c`` or ``--build.num_workers=4``
    (values are read as YAML), and win over the document. In a training config they name its sections, as draccus reads
    it (``--data.cache_dir``, ``--trainer.train_batch_size``); one naming no section is the data section's
    (``--cache_dir``). Raises ``ConfigError`` naming the file and field.
    """
    if isinstance(config, Mapping):
        where, doc = "the data config", copy.deepcopy(dict(config))
    else:
        where = os.fspath(config)
        doc = read_yaml(where)
    pairs = parse_overrides(overrides or ())
    if is_nanotron(doc):
        try:
            doc = nanotron_mixture(doc, where)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    elif isinstance(doc.get("data"), dict):
        sections = [(key, value) for key, value in pairs if key.split(".", 1)[0] in doc]
        for key, value in sections:
            set_path(doc, key, value)
        pairs = [pair for pair in pairs if pair not in sections]
        if not isinstance(doc["data"], dict):
            raise ConfigError(f"{where}: an override replaced the data section with {doc['data']!r}; override its fields "
                              "(--data.cache_dir DIR)")
        return data_section_config(_with_trainer_batch_size(doc["data"], doc.get("trainer")), f"{where}'s data section", pairs)
    return data_section_config(doc, where, pairs)


def data_section_config(doc: dict[str, Any], where: str, overrides: Sequence[tuple[str, Any]] = ()) -> DataConfig:
    """The data config a document (a data config, or a training config's data section) holds, with parsed ``overrides``
    applied; a mixture when it has ``configs:`` or ``components:``. A ``ConfigError`` names ``where`` and the field."""
    cls: type[DataConfig] = LMMixtureDatasetConfig if "configs" in doc or "components" in doc else LMDatasetConfig
    for key, value in overrides:
        set_path(doc, key, value)
    if not doc:
        raise ConfigError(f"{where} holds no config fields: a data config gives `configs:` (a mixture) or `train_urls:`/`id:` "
                          "(one dataset), with `tokenizer:` and `cache_dir:`")
    return decode_document(cls, doc, None, where, cls.__name__)


def decode_document(cls: type[Any], doc: dict[str, Any], overrides: Sequence[str] | None, where: str, what: str,
                    roots: tuple[type, ...] = (LMMixtureDatasetConfig, LMDatasetConfig)) -> Any:
    """``doc`` with ``overrides`` applied, decoded as ``cls``; a ``ConfigError`` names ``where``, ``what`` it should be
    and the field, with the closest names in ``roots`` when a name is unknown."""
    try:
        for key, value in parse_overrides(overrides or ()):
            set_path(doc, key, value)
        return draccus.decode(cls, doc)
    except (draccus.utils.ParsingError, TypeError, ValueError) as e:
        raise ConfigError(f"{where} does not parse as {what}: {explain_error(e, roots)}") from None


def _with_trainer_batch_size(data: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """A training config's data section, with a mixture's ``batch_size`` taken from ``trainer.train_batch_size`` (an int
    or Levanter's schedule ``[{start, value}, ...]``) when the section sets none, as Levanter turns weight stages into
    examples with the trainer's batch size."""
    size = trainer.get("train_batch_size") if isinstance(trainer, dict) else None
    if ("configs" not in data and "components" not in data) or "batch_size" in data or size is None:
        return data
    if isinstance(size, list) and all(isinstance(s, dict) and set(s) == {"start", "value"} for s in size):
        size = [[s["start"], s["value"]] for s in size]
    elif not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        logger.info("trainer.train_batch_size %r is not a batch size of its own (Levanter derives it from the devices); "
                    "set data.batch_size if train_weights has stages", size)
        return data
    logger.info("batch_size %s taken from trainer.train_batch_size", size)
    return {**data, "batch_size": size}


def parse_overrides(args: Sequence[str]) -> list[tuple[str, Any]]:
    """``--a.b value`` / ``--a.b=value`` pairs as (dotted key, value read as YAML; an empty value is the empty string, as
    draccus reads it)."""
    pairs = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"override {arg!r} is not of the form --field value or --field=value (dotted fields: --build.num_workers 4)")
        key, eq, text = arg[2:].partition("=")
        if not eq:
            if not rest or rest[0].startswith("--"):
                raise ConfigError(f"override --{key} has no value; write --{key} VALUE or --{key}=VALUE")
            text = rest.pop(0)
        try:
            pairs.append((key, yaml.safe_load(text) if text else ""))
        except yaml.YAMLError as e:
            raise ConfigError(f"override --{key}: {text!r} is not a valid YAML value: {_yaml_problem(e, '<unicode string>')}") from None
    return pairs


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set the field at ``dotted`` in ``doc``; a mapping is merged into the one there, as draccus merges an override into
    the file. The mappings on the way are copied first: one that a YAML alias shares with another field (``code: *web``)
    changes under this field alone."""
    *parents, leaf = dotted.split(".")
    node = doc
    for part in parents:
        child = node.get(part)
        node[part] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    node[leaf] = _merged(node.get(leaf), value)


def _merged(old: Any, new: Any) -> Any:
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    return {**old, **{key: _merged(old.get(key), value) for key, value in new.items()}}


class _WarnsOfKeysGivenTwice:
    """A loader's mappings, with a warning for each key given twice in one: YAML keeps the last silently (and so do draccus
    and Levanter), so a source given twice is one source, and a field set twice takes the second value."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    logger.warning("%s, line %d: %r is given twice in one mapping; the last is used, as draccus and Levanter "
                                   "read it: remove the other", key.start_mark.name, key.start_mark.line + 1, key.value)
                seen.add(key.value)
        return super().construct_mapping(node, deep)  # type: ignore[misc]


if yaml.__with_libyaml__:
    from yaml.cyaml import CParser

    class _IncludingLoader(CParser, _WarnsOfKeysGivenTwice, ConstructorWithGoodInclusion, Resolver):
        """draccus' loader (``!include``, merges of included mappings) on libyaml's parser: a config of a thousand sources
        reads in 23 ms instead of 170."""

        def __init__(self, stream: Any):
            CParser.__init__(self, stream)
            ConstructorWithGoodInclusion.__init__(self)
            Resolver.__init__(self)
            self.stream = stream  # where draccus' !include resolves relative paths from

    _IncludingLoader.add_constructor("!include", include_constructor)
else:
    class _IncludingLoader(_WarnsOfKeysGivenTwice, SafeLoaderWithInclusion):  # type: ignore[no-redef]
        """draccus' loader, in pure Python where PyYAML has no libyaml."""


def read_yaml(path: str) -> dict[str, Any]:
    """The YAML document at ``path``, with its ``!include``s resolved (relative to the file that names each)."""
    try:
        with open(path) as f:
            doc = yaml.load(f, Loader=_IncludingLoader) or {}
    except (FileNotFoundError, IsADirectoryError) as e:
        what = "does not exist" if isinstance(e, FileNotFoundError) else "is a directory, not a YAML file"
        if os.path.abspath(str(e.filename)) == os.path.abspath(path):
            raise ConfigError(f"config file {path} {what}") from None
        raise ConfigError(f"{path}: an !include names {e.filename}, which {what} (an included path is taken relative "
                          "to the file that includes it)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not a text file (byte {e.object[e.start]:#x} at offset {e.start} is not UTF-8); give the "
                          "YAML data config") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {_yaml_problem(e, path)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config fields")
    return doc


def _yaml_problem(error: yaml.YAMLError, path: str) -> str:
    """A YAML error on one line: where (the file when it is an included one, the line and column), what, and while doing
    what (PyYAML's own text spreads these over several lines)."""
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return _one_line(str(error))

    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark = error.problem_mark
    elsewhere = os.path.abspath(mark.name) != os.path.abspath(path)
    text = f"{f'in {mark.name}, ' if elsewhere else ''}{at(mark)}: {error.problem}"
    if error.context:
        same = error.context_mark is not None and error.context_mark.name == mark.name
        text += f" ({error.context}{f' from {at(error.context_mark)}' if same else ''})"
    return text


def explain_error(error: BaseException, roots: tuple[type, ...] = (LMMixtureDatasetConfig, LMDatasetConfig)) -> str:
    """The error with the one at the bottom of its chain, on one line: draccus wraps a config's own message (which names
    the field and the fix) in "Couldn't instantiate class ...", names the field of a bad value only outside, and spreads
    some messages over several lines. An unknown field or choice gets the closest valid name among the config classes
    reachable from ``roots``."""
    inner = error
    while (below := _below(inner)) is not None:
        inner = below
    outer, detail = _one_line(str(error)), _one_line(str(inner))
    text = outer if inner is error or detail in outer else f"{outer.rstrip('.')}: {detail}"
    return text + _closest(text, roots)


def _below(error: BaseException) -> BaseException | None:
    """The error ``error`` was raised from or while handling, unless it was raised ``from None`` (its own message says
    what the one it replaced did)."""
    return error.__cause__ if error.__cause__ is not None or error.__suppress_context__ else error.__context__


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _closest(message: str, roots: tuple[type, ...]) -> str:
    """" (did you mean: ...?)" for the unknown fields or choice names a draccus message names that are close to a valid one,
    " (the choices are ...)" for a choice name close to none, or nothing."""
    names = _config_names(roots)
    hints: list[str] = []
    choices: list[str] = []
    for fields, owner in re.findall(r"The fields? `([^`]+)` (?:are|is) not valid for (\w+)", message):
        for name in (f.strip() for f in fields.split(",")):
            close = difflib.get_close_matches(name, names.get(owner, ()), n=1)
            if close and f"{name} -> {close[0]}" not in hints:
                hints.append(f"{name} -> {close[0]}")
    for choice, owner in re.findall(r"Couldn't find a choice class for '([^']+)' in <class '[\w.]+\.(\w+)'>", message):
        close = difflib.get_close_matches(choice, names.get(owner, ()), n=1)
        if close:
            hints.append(f"{choice} -> {close[0]}")
        else:
            choices.append(f"the choices are {', '.join(sorted(names.get(owner, ())))}")
    parts = ([f"did you mean: {'; '.join(hints)}?"] if hints else []) + choices
    return f" ({'; '.join(parts)})" if parts else ""


@functools.lru_cache(maxsize=8)
def _config_names(roots: tuple[type, ...]) -> dict[str, tuple[str, ...]]:
    """Per config class reachable from ``roots``: its field names, or for a choice type its choice names."""
    names: dict[str, tuple[str, ...]] = {}
    pending: list[Any] = list(roots)
    while pending:
        cls = pending.pop()
        if not isinstance(cls, type) or cls.__name__ in names:
            continue
        choices = cls.get_known_choices() if issubclass(cls, draccus.ChoiceRegistry) else {}
        if choices and cls not in choices.values():  # a choice type: its names are the choices'
            names[cls.__name__] = tuple(choices)
            pending.extend(choices.values())
            continue
        if dataclasses.is_dataclass(cls):
            names[cls.__name__] = tuple(f.name for f in dataclasses.fields(cls))
            for hint in typing.get_type_hints(cls).values():
                pending.extend(_classes_in(hint))
    return names


def _classes_in(hint: Any) -> list[type]:
    args = typing.get_args(hint)
    return [hint] if not args and isinstance(hint, type) else [c for a in args for c in _classes_in(a)]
