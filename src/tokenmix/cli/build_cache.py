"""``tokenmix build-cache --config_path CFG.yaml [--overrides]``.

The YAML is a mixture config (it has ``configs:``), a single-dataset config, or either of those
under a ``data:`` key (as in a Levanter training config; other sections are ignored). Overrides
use draccus' dotted form: ``--cache_dir /tmp/c --build.on_error skip --build.num_workers 4``.

On a cluster: ``--build.executor.type ray|dask`` with ``--build.executor.address ADDRESS`` (unset: a
local Ray or Dask cluster), ``--build.executor.max_retries N`` and ``--build.executor.max_in_flight N``.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from typing import Any

import draccus
import yaml
from rich.table import Table
from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix.cache.builder import ShardTaskError
from tokenmix.cache.executor import MissingExtraError
from tokenmix.cli.console import make_console
from tokenmix.config import (
    DataConfig,
    LMDatasetConfig,
    LMMixtureDatasetConfig,
    build_caches,
)

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config file that cannot be used, with what to change."""


def load_data_config(config_path: str, overrides: list[str] | None = None) -> DataConfig:
    """Parse a data config YAML (mixture or single dataset, maybe under ``data:``) with overrides."""
    try:
        with open(config_path) as f:
            doc = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {config_path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{config_path} is not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{config_path}: the top level must be a mapping of config fields")
    if "data" in doc and isinstance(doc["data"], dict):
        doc = doc["data"]
    cls: type = LMMixtureDatasetConfig if "configs" in doc else LMDatasetConfig
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as tmp:
        yaml.safe_dump(doc, tmp)
    try:
        return draccus.parse(config_class=cls, config_path=tmp.name, args=list(overrides or []))
    except (draccus.utils.ParsingError, TypeError, ValueError) as e:
        raise ConfigError(f"{config_path} does not parse as {cls.__name__}: {_explain(e)}") from None
    finally:
        os.unlink(tmp.name)


def _explain(error: BaseException) -> str:
    """The error with the one at the bottom of its chain: draccus wraps a config's own message (which names
    the field and the fix) in "Couldn't instantiate class ...", and names the field of a bad value only outside."""
    inner = error
    while (inner.__cause__ or inner.__context__) is not None:
        inner = inner.__cause__ or inner.__context__  # type: ignore[assignment]
    outer, detail = str(error).strip(), str(inner).strip()
    return outer if inner is error or detail in outer else f"{outer.rstrip('.')}: {detail}"


def summary_table(results: dict[tuple[str, str], dict[str, Any]]) -> Table:
    """A table of what each cache holds and how fast it was built."""
    table = Table(title="caches")
    for col in ("source", "split", "documents", "tokens", "tokens/doc p50", "skipped", "seconds", "tokens/s"):
        table.add_column(col, justify="left" if col in ("source", "split") else "right")
    for (source, split), st in results.items():
        build = st["build"]
        table.add_row(
            source, split, f"{st['documents']:,}", f"{st['tokens']:,}",
            f"{st['document_length_tokens'].get('p50', 0):,.0f}", f"{st['skipped_records']:,}",
            f"{build['seconds']:.1f}", f"{build['tokens_per_second'] or 0:,.0f}",
        )
    return table


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tokenmix build-cache", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", required=True, help="data config YAML")
    parser.add_argument("--source", action="append", help="build only this source (repeatable)")
    args, overrides = parser.parse_known_args(argv)
    try:
        config = load_data_config(args.config_path, overrides)
        with logging_redirect_tqdm():
            results = build_caches(config, sources=args.source)
    except (ConfigError, ValueError, FileNotFoundError, MissingExtraError, ConnectionError, ShardTaskError) as e:
        logger.error("%s", e)
        return 1
    make_console().print(summary_table(results))
    return 0
