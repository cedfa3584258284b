"""The tasks of a curation pipeline's passes, each a plain function of plain arguments that a worker runs (locally, on
Ray or on Dask): a map task runs the record stages over one input shard, a scatter task sends one shard's records (and
blend copies) to their buckets, a gather task writes one output partition from its buckets. Each writes its files
under temporary names, renames them when complete, then writes its statistics (``pipeline.py`` runs them, and
counts a task as done once its statistics are there and its files are as it wrote them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmix.curate import blend as blending
from tokenmix.curate import exact_dedup, fuzzy_dedup, minhash, scatter
from tokenmix.curate.records import as_array, concat, field_column
from tokenmix.curate.shard_io import (
    ShardBatches,
    ShardWriter,
    local_or_url_join,
    read_batches,
    read_table,
    row_groups,
    write_json,
)
from tokenmix.curate.stages import ExactDedup, ShardContext, Stage, apply_stages, text_hashes

INDEX = "__index"
"""A record copy's place in the (blended) output sequence, carried from scatter to gather."""


@dataclass(frozen=True)
class ShardRef:
    """An input shard of the pipeline: task ``index`` reads shard ``shard_index`` of source ``source``."""

    index: int
    source: str
    source_rank: int
    shard_index: int
    url: str
    text_field: str


@dataclass(frozen=True)
class MapTask:
    """One shard through one map pass."""

    shard: ShardRef
    input_url: str
    from_intermediate: bool
    stages: list[Stage]
    first_stage: int
    removal_urls: list[str]
    """The files listing the removed rows of this shard, among others' (after a dedup decision)."""
    removal_reason: str
    """Why the listed rows go (``exact_duplicate``, ``fuzzy_duplicate``); empty before any dedup."""
    output_url: str
    output_format: str
    keep_hidden: bool
    artifact_url: str | None
    barrier: Stage | None
    """The ``exact_dedup`` or ``fuzzy_dedup`` that ends this pass: each record's hash or signature goes to ``artifact_url``."""
    stats_url: str
    filename_field: str | None
    on_error: str
    chunk_bytes: int


@dataclass(frozen=True)
class ScatterTask:
    """One shard's records (and blend copies) to their buckets."""

    index: int
    input_url: str
    plan: blending.SourcePlan
    first: int
    seed: int | None
    buckets: int
    partitions: int
    total: int
    out_dir: str
    stats_url: str


@dataclass(frozen=True)
class GatherTask:
    """One output partition from its buckets."""

    partition: int
    buckets: list[tuple[int, list[str]]]
    seed: int | None
    output_url: str
    output_format: str
    stats_url: str


def run_map_task(task: MapTask) -> dict[str, Any]:
    """Read a shard (or an intermediate), run the stages, write the output and the hashes; returns the task's stats."""
    shard = task.shard
    context = ShardContext(shard.source, shard.source_rank, shard.shard_index, shard.text_field)
    found = ShardBatches()
    stage_stats = [{"in": 0, "out": 0, "removed": Counter()} for _ in range(len(task.stages) + (1 if task.removal_reason else 0))]
    removed = exact_dedup.removed_rows(task.removal_urls, shard.index) if task.removal_reason else None
    writer = ShardWriter(task.output_url, task.output_format, keep_hidden=task.keep_hidden)
    artifacts: list[Any] = []
    written = nbytes = 0
    try:
        batches = (_intermediate_batches(task.input_url, found) if task.from_intermediate
                   else read_batches(task.input_url, shard.text_field, task.filename_field, task.on_error, found, task.chunk_bytes))
        row = 0
        for table in batches:
            offset = 0
            if removed is not None:
                rows = np.arange(row, row + table.num_rows)
                row += table.num_rows
                keep = ~np.isin(rows, removed)
                stage_stats[0]["in"] += table.num_rows
                stage_stats[0]["removed"][task.removal_reason] += int((~keep).sum())
                table = table.filter(pa.array(keep))
                stage_stats[0]["out"] += table.num_rows
                offset = 1
            table, counts = apply_stages(task.stages, table, context)
            for stats, count in zip(stage_stats[offset:], counts):
                stats["in"] += count.records_in
                stats["removed"].update(count.removed)
                stats["out"] += count.records_out
            if task.barrier is not None and table.num_rows:
                artifacts.append(_artifact(task.barrier, as_array(field_column(table, task.barrier.text_field or shard.text_field))))
            writer.write(table)
            written += table.num_rows
            nbytes += table.nbytes
    except BaseException:
        writer.abort()
        raise
    if written or task.keep_hidden:
        files = {task.output_url: writer.close()}
    else:  # a final output with no record left is not written, as NeMo Curator writes none for a file whose rows are gone
        writer.abort()
        writer.remove_earlier()
        files = {}
    if isinstance(task.barrier, ExactDedup) and task.artifact_url is not None:
        all_hashes = np.concatenate(artifacts) if artifacts else np.empty((0, 2), dtype=np.uint64)
        exact_dedup.write_hashes(task.artifact_url, all_hashes, np.arange(written, dtype=np.int64))
    elif isinstance(task.barrier, fuzzy_dedup.FuzzyDedup) and task.artifact_url is not None:
        width = task.barrier.minhash.num_perm
        sigs = np.concatenate([a[0] for a in artifacts]) if artifacts else np.zeros((0, width), dtype=np.uint64)
        present = np.concatenate([a[1] for a in artifacts]) if artifacts else np.zeros(0, dtype=bool)
        fuzzy_dedup.write_signatures(task.artifact_url, sigs, present)
    result = {"read": found.read, "bad": dict(found.bad), "failed": found.failed,
              "stages": [{**s, "removed": dict(s["removed"])} for s in stage_stats],
              "first_stage": task.first_stage - (1 if task.removal_reason else 0), "written": written, "bytes": nbytes,
              "files": files}
    write_json(task.stats_url, result)
    return result


def _artifact(barrier: Stage, texts: pa.Array) -> Any:
    """What a pass ending in ``barrier`` keeps of each record for the decision: a text hash, or a MinHash signature."""
    if isinstance(barrier, ExactDedup):
        return text_hashes(texts, barrier.normalize)
    assert isinstance(barrier, fuzzy_dedup.FuzzyDedup)
    return minhash.signatures(texts, barrier.minhash, backend=barrier.backend)


def _intermediate_batches(url: str, found: ShardBatches) -> Any:
    for table in row_groups(url):
        found.read += table.num_rows
        yield table


def run_scatter_task(task: ScatterTask) -> dict[str, Any]:
    """Write a shard's record copies into bucket files ``<out_dir>/<task>-<bucket>.parquet``, a row group of the shard
    at a time; returns rows per bucket."""
    writers: dict[int, ShardWriter] = {}
    written = 0
    try:
        first = task.first
        for table in row_groups(task.input_url):
            rows, indices = blending.emitted_indices(task.plan, first, table.num_rows)
            first += table.num_rows
            if task.seed is None:
                buckets = scatter.ordered_buckets(indices, task.total, task.partitions)
            else:
                buckets = scatter.shuffled_buckets(indices, task.seed, task.buckets)
            order = np.argsort(buckets, kind="stable")
            rows, indices, buckets = rows[order], indices[order], buckets[order]
            copies = table.take(pa.array(rows)).append_column(INDEX, pa.array(indices, pa.int64()))
            bounds = np.flatnonzero(np.diff(buckets)) + 1
            for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(buckets)], strict=True):
                if stop > start:
                    bucket = int(buckets[start])
                    if bucket not in writers:
                        writers[bucket] = ShardWriter(bucket_url(task.out_dir, task.index, bucket), "parquet", keep_hidden=True)
                    writers[bucket].write(copies.slice(start, stop - start))
            written += len(rows)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    files = {w.url: w.close() for _, w in sorted(writers.items())}
    result = {"buckets": {str(b): w.records for b, w in sorted(writers.items())}, "written": written, "files": files}
    write_json(task.stats_url, result)
    return result


def bucket_url(out_dir: str, task: int, bucket: int) -> str:
    """The file scatter task ``task`` writes ``bucket``'s records to."""
    return local_or_url_join(out_dir, f"{task:06d}-{bucket:05d}.parquet")


def run_gather_task(task: GatherTask) -> dict[str, Any]:
    """Write one output partition: its buckets in turn, each in order (or in a seeded random order)."""
    writer = ShardWriter(task.output_url, task.output_format)
    written = largest = 0
    try:
        for bucket, urls in task.buckets:
            parts = [read_table(url) for url in urls]
            if not parts:
                continue
            table = concat(parts)
            largest = max(largest, table.nbytes)
            order = scatter.bucket_order(table.column(INDEX).to_numpy(), task.seed, bucket)
            table = table.take(pa.array(order))
            writer.write(table)
            written += table.num_rows
    except BaseException:
        writer.abort()
        raise
    result = {"written": written, "max_bucket_bytes": largest, "files": {task.output_url: writer.close()}}
    write_json(task.stats_url, result)
    return result
