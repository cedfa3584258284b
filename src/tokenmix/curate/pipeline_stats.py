"""``curation_stats.json``: a pipeline's accounting of every input record, per source and stage: read, bad (by
reason), removed by each stage (by reason), blended, written; and whether they add up."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from tokenmix.curate.pipeline_tasks import ShardRef

if TYPE_CHECKING:
    from tokenmix.curate.pipeline_config import CurationConfig

logger = logging.getLogger(__name__)


def curation_statistics(config: CurationConfig, shards: list[ShardRef], map_results: list[list[dict[str, Any]]],
                        blend_stats: dict[str, Any] | None, outputs: list[str], seconds: float) -> dict[str, Any]:
    """``curation_stats.json``: per source and stage, records in, out and removed by reason; and the accounting check."""
    names = [s.name for s in config.sources]
    per_source = {n: {"read": 0, "bad": Counter(), "shards_failed": Counter(), "after_stages": 0} for n in names}
    stage_rows: list[dict[str, Any]] = [
        {"stage": stage.label, "in": 0, "out": 0, "removed": Counter(),
         "per_source": {n: {"in": 0, "out": 0, "removed": Counter()} for n in names}}
        for stage in config.stages]
    for k, results in enumerate(map_results):
        for shard, result in zip(shards, results, strict=True):
            source = per_source[shard.source]
            if k == 0:
                source["read"] += result["read"]
                source["bad"].update(result["bad"])
                if result.get("failed"):
                    source["shards_failed"][result["failed"]] += 1
            if k == len(map_results) - 1:
                source["after_stages"] += result["written"]
            for j, s in enumerate(result["stages"]):
                row = stage_rows[result["first_stage"] + j]
                for target in (row, row["per_source"][shard.source]):
                    target["in"] += s["in"]
                    target["out"] += s["out"]
                    target["removed"].update(s["removed"])
    accounted = True
    for name in names:
        src = per_source[name]
        removed = sum(sum(row["per_source"][name]["removed"].values()) for row in stage_rows)
        src["removed_by_stages"] = removed
        if src["read"] - sum(src["bad"].values()) - removed != src["after_stages"]:
            accounted = False
            logger.error("source %s: %d read, %d bad, %d removed, but %d left: records are unaccounted for", name, src["read"],
                         sum(src["bad"].values()), removed, src["after_stages"])
    written = sum(b["blended"] for b in blend_stats.values()) if blend_stats else sum(s["after_stages"] for s in per_source.values())
    return json.loads(json.dumps({
        "sources": per_source, "stages": stage_rows, "blend": blend_stats, "accounted": accounted,
        "output": {"records": written, "files": len(outputs), "format": config.output.format, "path": config.output.path},
        "seconds": round(seconds, 3),
    }))
