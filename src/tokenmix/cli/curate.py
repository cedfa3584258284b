"""``tokenmix curate --config_path pipeline.yaml [--overrides]``: run (or resume) a curation pipeline.

The YAML is a ``CurationConfig``: ``sources`` (name, paths, text_field), ``stages``, optional ``blend`` and
``shuffle``, ``output`` (path, format, write_to_filename or partitions). Overrides use draccus' dotted form:
``--output.path /tmp/curated --num_workers 4 --executor.type dask``. Run it again after an interruption: finished
shards are kept, the rest is redone, and the output is the same, byte for byte.
"""

from __future__ import annotations

import logging
from typing import Any

from rich.table import Table
from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser

logger = logging.getLogger(__name__)


def summary_table(stats: dict[str, Any]) -> Table:
    """Records in, out and removed (by reason) at each stage, and what each source gave."""
    table = Table(title=f"curation: {stats['output']['records']:,} records in {stats['output']['files']} files ({stats['seconds']:.1f} s)")
    for col in ("stage", "in", "out", "removed"):
        table.add_column(col, justify="left" if col in ("stage", "removed") else "right")
    for name, source in stats["sources"].items():
        bad = ", ".join(f"{k} {v:,}" for k, v in source["bad"].items())
        table.add_row(f"read {name}", f"{source['read']:,}", f"{source['read'] - sum(source['bad'].values()):,}", bad)
    for row in stats["stages"]:
        removed = ", ".join(f"{k} {v:,}" for k, v in row["removed"].items())
        table.add_row(row["stage"], f"{row['in']:,}", f"{row['out']:,}", removed)
    for name, blend in (stats.get("blend") or {}).items():
        table.add_row(f"blend {name}", f"{blend['records']:,}", f"{blend['blended']:,}", "")
    return table


def run(argv: list[str]) -> int:
    parser = CommandParser("curate", __doc__)
    parser.add_argument("--config_path", required=True, help="curation pipeline YAML")
    args, overrides = parser.parse_known_args(argv)
    from tokenmix.curate import load_curation_config, run_curation

    config = load_curation_config(args.config_path, overrides)
    with logging_redirect_tqdm():
        stats = run_curation(config)
    make_console().print(summary_table(stats))
    if not stats["accounted"]:
        logger.error("some records are unaccounted for; see curation_stats.json")
        return 1
    return 0
