"""``tokenmix verify CACHE... | --config_path CFG.yaml [--source NAME]``: check every stored byte of caches, and repair.

Reads every chunk of each cache (tokens, row ends, loss spans, packing plans), which checks its checksum and that it is
there; holds the row ends against the ledger; reads the inputs still reachable and checks them against the digests of
the records the cache read. Prints a report per cache and exits 1 if any cache is damaged (0 when all are sound).

``--repair`` rewrites the damaged rows from their inputs, when those are unchanged, and checks again. The inputs and
the encoder come from ``--config_path`` (the config that built the caches) or, without one, from each cache's ledger.
"""

from __future__ import annotations

import json
import logging

from tqdm.contrib.logging import logging_redirect_tqdm

from tokenmix import (
    CacheDamagedError,
    CacheLockedError,
    CacheNotFoundError,
    CacheReport,
    RepairError,
    TokenizerLoadError,
    UnsafeFileError,
    load_data_config,
    verify_cache,
)
from tokenmix.cache.packed_source import PackNotFoundError
from tokenmix.cache.packs import stored_cache_of
from tokenmix.cache.store import DocumentDamagedError
from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser
from tokenmix.config.caches import cache_targets

logger = logging.getLogger(__name__)

SHOWN = 10
"""Damaged chunks, problems and inputs listed per cache; more are counted."""


def _parser(caches: bool) -> CommandParser:
    """The command's options; with ``--config_path`` there are no cache arguments, so that the config's overrides
    (``--seed 3``) keep their values."""
    parser = CommandParser("verify", __doc__)
    if caches:
        parser.add_argument("caches", nargs="*", help="cache directories or URLs (one source and split each)")
    parser.add_argument("--config_path", help="a data config: verify its caches (all, or --source), and repair from its inputs")
    parser.add_argument("--source", action="append", help="with --config_path: only this source's caches (repeatable)")
    parser.add_argument("--repair", action="store_true", help="rewrite damaged rows from their inputs when those are unchanged")
    parser.add_argument("--no_inputs", action="store_true", help="do not read the inputs to check them against the ledger")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    return parser


def run(argv: list[str]) -> int:
    parser = _parser(caches=True)
    args, overrides = parser.parse_known_args(argv)
    if args.config_path:
        parser = _parser(caches=False)
        args, overrides = parser.parse_known_args(argv)
    elif not args.caches:
        parser.error("give cache directories, or --config_path")
    elif args.source:
        parser.error("--source chooses a config's caches, so it needs --config_path")
    elif overrides:
        parser.error(f"unrecognized arguments: {' '.join(overrides)} (config overrides need --config_path)")
    config = load_data_config(args.config_path, overrides) if args.config_path else None
    given = [t.location for t in cache_targets(config, args.source)] if config else list(args.caches)
    stored = {location: stored_cache_of(location) for location in given}
    locations = list(dict.fromkeys(stored.values()))  # a pack once for its sources
    reports: list[CacheReport] = []
    listed: list[dict] = []  # for --json: each report, or the error that stopped its cache's check or repair
    for location in locations:
        error: Exception | None = None
        try:
            with logging_redirect_tqdm():
                reports.append(verify_cache(location, repair=args.repair, inputs=not args.no_inputs,
                                            config=config if location in given else None))  # a pack: from its ledger
            listed.append(reports[-1].to_json())
        except CacheNotFoundError as e:
            member = next((source for source, at in stored.items() if at == location and source != location), None)
            error = e if member is None else PackNotFoundError(member, location)
        except (CacheDamagedError, DocumentDamagedError, RepairError, CacheLockedError, TokenizerLoadError, UnsafeFileError) as e:
            error = e
        if error is not None:
            logger.error("%s", error)
            listed.append({"location": location, "ok": False, "error": str(error)})
    failed = len(listed) - len(reports)
    if args.json:
        print(json.dumps(listed, indent=1))
    else:
        console = make_console()
        for report in reports:
            _print(console, report)
    return 1 if failed or not all(r.ok for r in reports) else 0


def _print(console, report: CacheReport) -> None:
    state = "[green]OK[/green]" if report.ok else "[red]DAMAGED[/red]"
    building = "" if report.finished else " (build unfinished: the published rows were checked)"
    console.print(f"[bold]{report.location}[/bold]  {state}  {report.rows:,} rows  {report.tokens:,} tokens  "
                  f"{report.chunks:,} chunks read{building}")
    if not report.checksummed:
        console.print("  [yellow]built before chunk checksums: bit rot in it cannot be seen; build it again to have them[/yellow]")
    for chunk in report.damaged[:SHOWN]:
        console.print(f"  damaged: {chunk.describe()}")
    for problem in report.problems[:SHOWN]:
        console.print(f"  inconsistent: {problem}")
    hidden = max(0, len(report.damaged) - SHOWN) + max(0, len(report.problems) - SHOWN)
    if hidden:
        console.print(f"  ... and {hidden:,} more (--json lists them all)")
    states: dict[str, list[str]] = {}
    for check in report.inputs:
        states.setdefault(check.state, []).append(f"{check.shard}" + (f" ({check.detail})" if check.detail else ""))
    if states:
        console.print("  inputs: " + ", ".join(f"{len(v):,} {k}" for k, v in states.items()))
    for state in ("changed", "unreachable"):
        for line in states.get(state, [])[:SHOWN]:
            console.print(f"  input {state}: {line}")
    for line in report.repaired:
        console.print(f"  repaired: {line}")
    if not report.ok and not report.repaired:
        fix = ("restore the changed inputs, or delete the cache and build it again" if not report.damaged and not report.problems
               else f"`tokenmix verify {report.location} --repair` rewrites the damaged rows from unchanged inputs")
        console.print(f"  to fix: {fix}")
