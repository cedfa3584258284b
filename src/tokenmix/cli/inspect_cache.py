"""``tokenmix inspect CACHE_DIR``: a cache's ledger and statistics, its packing plans, and a few decoded documents."""

from __future__ import annotations

import json
import logging

from rich.table import Table

from tokenmix import TokenizerLoadError
from tokenmix.cache import stored_plans
from tokenmix.cache.ledger import ENCODING_KEY
from tokenmix.cache.packs import open_cache_at
from tokenmix.cli.console import make_console
from tokenmix.cli.parser import CommandParser, at_least
from tokenmix.formats import load_tokenizer

logger = logging.getLogger(__name__)


def run(argv: list[str]) -> int:
    parser = CommandParser("inspect", __doc__)
    parser.add_argument("cache_dir", help="a cache directory or URL (one source and split)")
    parser.add_argument("--samples", type=at_least(0, "documents to decode"), default=3, help="documents to decode")
    parser.add_argument("--chars", type=at_least(1, "characters shown per document"), default=300, help="characters shown per document")
    parser.add_argument("--tokenizer", help="tokenizer to decode with (default: the one recorded in the ledger)")
    parser.add_argument("--json", action="store_true", help="print ledger and statistics as JSON only")
    args = parser.parse_args(argv)
    cache = open_cache_at(args.cache_dir)
    ledger = cache.ledger
    stats = cache.stats()
    plans = stored_plans(args.cache_dir)
    if args.json:
        print(json.dumps({"ledger": ledger.to_json(), "stats": stats, "packing_plans": plans}, indent=1))
        return 0
    console = make_console()
    rows = cache.num_rows()
    state = "finished" if ledger.finished else "UNFINISHED (building, or interrupted: build-cache finishes it)"
    console.print(f"[bold]{args.cache_dir}[/bold]  fingerprint {ledger.fingerprint}  {state}  {rows:,} documents  "
                  f"{cache.num_tokens():,} tokens")
    console.print(f"made by: {json.dumps({k: v for k, v in ledger.info.items() if k != ENCODING_KEY})}")
    encoding = ledger.info.get(ENCODING_KEY)
    if isinstance(encoding, dict):
        console.print("encoded with: " + ", ".join(f"{name} {state.split()[0]}" for name, state in encoding.items() if state != "absent"))
    console.print(f"identity: {json.dumps(ledger.identity)}")
    shards = Table(title="shards")
    for col in ("shard", "position", "records", "documents", "tokens", "skipped", "state"):
        shards.add_column(col)
    for s in ledger.shards:
        state = "error" if s.error else ("done" if s.finished else ("partial" if s.position else "pending"))
        shards.add_row(s.name, f"{s.position:,}", f"{s.records:,}", f"{s.rows:,}", f"{s.tokens:,}",
                       ", ".join(f"{k}={v}" for k, v in s.skipped.items()) or "-", state)
    console.print(shards)
    if stats:
        summary = {k: v for k, v in stats.items() if k != "shards"}
        console.print("statistics:", json.dumps(summary, indent=1))
    if plans:
        console.print(plans_table(plans))
    tokenizer_name = args.tokenizer or ledger.info.get("tokenizer")
    decode = None
    if tokenizer_name:
        try:
            decode = load_tokenizer(tokenizer_name).decode
        except TokenizerLoadError as e:
            logger.warning("showing token ids, not text: %s", e)
    for row in range(min(args.samples, rows)):
        ids = cache[row]
        body = decode(ids.tolist()) if decode else str(ids[:64].tolist())
        console.rule(f"document {row} ({len(ids)} tokens)")
        console.print(body[: args.chars] + ("..." if len(body) > args.chars else ""), markup=False, highlight=False)
    return 0


def plans_table(plans: dict[str, dict]) -> Table:
    """One row per stored packing plan: its options and how well it packs."""
    table = Table(title="packing plans")
    for col in ("plan", "seq_len", "max segments", "long documents", "shuffle", "examples", "documents", "efficiency", "state"):
        table.add_column(col)
    for plan_id, plan in plans.items():
        options, stats = plan["options"], plan["stats"]
        capacity = plan["examples"] * options["seq_len"]
        efficiency = f"{stats['tokens'] / capacity:.3f}" if capacity else "-"
        table.add_row(plan_id, str(options["seq_len"]), str(options["max_segments_per_example"]), options["long_documents"],
                      str(options["shuffle"]), f"{plan['examples']:,}", f"{stats['documents']:,}", efficiency,
                      "complete" if plan["complete"] else "growing")
    return table
