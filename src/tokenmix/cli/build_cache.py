"""``tokenmix build-cache --config_path CFG.yaml [--overrides]``.

The YAML is a mixture config (it has ``configs:``), a single-dataset config, or either of those
under a ``data:`` key (as in a Levanter training config; other sections are ignored). Overrides
use draccus' dotted form: ``--cache_dir /tmp/c --build.on_error skip --build.num_workers 4`` (in a training config,
its sections' names too: ``--data.cache_dir /tmp/c --trainer.train_batch_size 16``).

On a cluster: ``--build.executor.type ray|dask`` with ``--build.executor.address ADDRESS`` (unset: a
local Ray or Dask cluster), ``--build.executor.max_retries N`` and ``--build.executor.max_in_flight N``.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix import build_caches, load_data_config
from tokenmix.cache.stats import ALREADY_BUILT
from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser


def summary_table(results: dict[tuple[str, str], dict[str, Any]]) -> Table:
    """A table of what each cache holds and how fast this run built it ("-" for a cache that was finished already;
    a source built in a pack with others has the pack's seconds, and no rate of its own)."""
    already = [st.get(ALREADY_BUILT, False) for st in results.values()]
    packed = [not built_before and "pack" in st["build"] for st, built_before in zip(results.values(), already)]
    if results and all(already):
        table = Table(title="caches: nothing needed building, every cache was finished already")
    else:
        notes = []
        if any(already):
            notes.append("-: finished already, nothing built")
        if any(packed):
            notes.append("packed: built in one pack with other small sources; its seconds are the pack's")
        table = Table(title="caches", caption="\n".join(notes) or None)
    for col in ("source", "split", "documents", "tokens", "tokens/doc p50", "skipped", "seconds", "tokens/s"):
        table.add_column(col, justify="left" if col in ("source", "split") else "right")
    for ((source, split), st), built_before, in_pack in zip(results.items(), already, packed):
        build = st["build"]
        rate = "-" if built_before else "packed" if in_pack else f"{build['tokens_per_second'] or 0:,.0f}"
        table.add_row(
            source, split, f"{st['documents']:,}", f"{st['tokens']:,}",
            f"{st['document_length_tokens'].get('p50', 0):,.0f}", f"{st['skipped_records']:,}",
            "-" if built_before else f"{build['seconds']:.1f}", rate,
        )
    return table


def run(argv: list[str]) -> int:
    parser = CommandParser("build-cache", __doc__)
    parser.add_argument("--config_path", required=True, help="data config YAML")
    parser.add_argument("--source", action="append", help="build only this source (repeatable)")
    args, overrides = parser.parse_known_args(argv)
    config = load_data_config(args.config_path, overrides)
    with logging_redirect_tqdm():
        results = build_caches(config, sources=args.source)
    make_console().print(summary_table(results))
    return 0
