"""``tokenmix export --to KIND --output PATH (--cache DIR | --config_path CFG.yaml --source NAME [--split S])``.

Writes a finished cache as the files another stack trains from: ``megatron`` (``PATH.bin`` + ``PATH.idx``),
``datatrove`` (``PATH`` a ``.ds`` file, with ``.index``, ``.metadata`` and ``.loss``), ``nanoset`` (``PATH`` an
``*_input_ids.npy`` dump), ``levanter`` (``PATH`` a Levanter cache directory) or ``hdf5`` (``PATH`` a directory of
Cerebras ``.h5`` files; its options as ``--max_seq_length 2048 --pack_sequences false ...``). A source of a config may be
a source of token files, so Megatron files convert to Cerebras HDF5 (or any other target) in one command. With
``--config_path``, the config's fields may be overridden as for ``build-cache`` (``--cache_dir /tmp/c``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import typing
from collections.abc import Callable
from pathlib import Path

from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix import load_data_config, open_cache
from tokenmix.cache.packs import open_cache_at
from tokenmix.cli.parser import CommandParser
from tokenmix.config.sources import SPLITS
from tokenmix.export import EXPORT_KINDS, Hdf5ExportOptions, export_cache
from tokenmix.formats.tokenizer import TokenizerLoadError

logger = logging.getLogger(__name__)


def _parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _converter(kind: object) -> Callable[[str], object]:
    """How a command-line value becomes an option of type ``kind`` (``none`` or ``null`` is None where None is allowed)."""
    args = typing.get_args(kind)
    base = next((t for t in args if t is not type(None)), kind)
    convert = _parse_bool if base is bool else base if base in (int, float) else str
    if type(None) not in args:
        return convert  # type: ignore[return-value]
    return lambda text: None if text.lower() in ("none", "null") else convert(text)  # type: ignore[operator]


def _write_failure(error: OSError, output: str) -> str | None:
    """What stopped the export writing at ``output``, where ``error`` is about a path it writes (``output`` or a directory
    above it, or a file beside or below it); None where ``error`` is about another path (the cache's, say)."""
    if error.filename is None:
        return None
    failed, wanted = Path(os.fsdecode(error.filename)).absolute(), Path(output).absolute()
    if failed == wanted or failed in wanted.parents:
        blocking = next((path for path in (failed, *failed.parents) if path.is_file()), None)
        if blocking is not None:
            return f"{blocking} is a file, where a directory is needed"
    elif wanted.parent not in failed.parents and wanted not in failed.parents:
        return None
    return f"{error.strerror} ({failed})"


def _add_hdf5_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("hdf5 options (Cerebras's names)")
    hints = typing.get_type_hints(Hdf5ExportOptions)
    for f in dataclasses.fields(Hdf5ExportOptions):
        group.add_argument(f"--{f.name}", type=_converter(hints[f.name]), default=argparse.SUPPRESS, help=f"default: {f.default!r}")


def run(argv: list[str]) -> int:
    parser = CommandParser("export", __doc__)
    parser.add_argument("--to", required=True, choices=EXPORT_KINDS, help="the format to write")
    parser.add_argument("--output", required=True, help="where to write it (see above for each format)")
    parser.add_argument("--cache", help="a cache directory or URL (one source and split)")
    parser.add_argument("--config_path", help="a data config; with --source (and --split), export that source's cache or token files")
    parser.add_argument("--source", help="the config's source to export")
    parser.add_argument("--split", choices=SPLITS, help="the source's split to export (default: train)")
    parser.add_argument("--tokenizer", help="the cache's tokenizer: recorded by datatrove and Levanter targets, decodes the HDF5 "
                                            "samples (default: the config's, else the cache ledger's)")
    _add_hdf5_options(parser)
    args, overrides = parser.parse_known_args(argv)
    if bool(args.cache) == bool(args.config_path):
        parser.error("give either --cache DIR, or --config_path CFG.yaml with --source NAME")
    if overrides and not args.config_path:
        parser.error(f"unrecognized arguments: {' '.join(overrides)} (config overrides need --config_path)")
    if args.cache and (args.source or args.split):
        parser.error("--source and --split choose a config's cache, so they need --config_path; --cache names the cache itself")
    given = vars(args)
    hdf5 = Hdf5ExportOptions(**{f.name: given[f.name] for f in dataclasses.fields(Hdf5ExportOptions) if f.name in given})
    if args.cache:
        cache = open_cache_at(args.cache)
        tokenizer = args.tokenizer or cache.ledger.info.get("tokenizer")
    else:
        if not args.source:
            parser.error("--config_path needs --source NAME (the source to export)")
        config = load_data_config(args.config_path, overrides)
        try:
            cache = open_cache(config, args.source, args.split or "train")
        except KeyError as e:  # an unknown source: the message names the config's
            logger.error("%s", e.args[0])
            return 1
        tokenizer = args.tokenizer or config.tokenizer
    with logging_redirect_tqdm():
        try:
            result = export_cache(cache, args.to, args.output, tokenizer=tokenizer, hdf5=hdf5)
        except TokenizerLoadError as e:
            if not args.cache or args.tokenizer:
                raise
            raise TokenizerLoadError(f"{e}; {tokenizer!r} is the tokenizer recorded in the cache's ledger ({args.cache}) when it "
                                     "was built: if it has moved, give --tokenizer WHERE_IT_IS_NOW") from None
        except OSError as e:
            cause = _write_failure(e, args.output)
            if cause is None:
                raise
            logger.error("cannot write the %s export at %s: %s; choose an --output this user can write to", args.to, args.output, cause)
            return 1
    print(json.dumps(result, indent=1, default=str))
    return 0
