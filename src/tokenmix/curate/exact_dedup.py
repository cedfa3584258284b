"""Exact deduplication across every input: which records to remove, decided from the hashes the shards wrote.

Each shard task of the pass before ``exact_dedup`` writes, beside its records, a 128-bit hash of each record's
(normalized) text and the record's row. Then tasks on the executor decide, among records with the same hash, by the
stage's policy (``dedup_policy.py``): ``one_per_cluster`` keeps the first, first meaning the lowest task, which is the
highest-ranked source (the sources' list order), then its first shard, then its first row; ``cross_source`` keeps
every record of the highest-ranked source that has the text (Zyda-2's rule). The others are written to removal files,
read by the next pass's tasks.

Memory is bounded by ``memory_bytes``: records are decided in passes over hash ranges (``h mod passes``), one task per
pass holding only its range (its expected peak is half of ``memory_bytes``, so that the ranges' spread fits); a range that does not
fit (one text copied very many times) is refused, naming the setting. The removal files are one per pass, each written
with its statistics last, so an interrupted decision resumes at its unfinished passes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmix.curate.dedup_policy import pack, removals
from tokenmix.curate.shard_io import local_or_url_join, read_table, row_groups, write_json, write_table
from tokenmix.execution.retrying import TaskInputError

logger = logging.getLogger(__name__)

BYTES_PER_RECORD = 176
"""A deciding task's peak memory per record, measured at 174 with 2 M records: two 64-bit hash halves, a 32-bit task
and a 64-bit row, their sort order and sorted copies, the removal table (numpy arrays, no per-record objects)."""


def write_hashes(url: str, hashes: np.ndarray, rows: np.ndarray) -> None:
    """A shard's hashes and rows, as Parquet (written whole under a temporary name, then renamed)."""
    write_table(url, pa.table({"h1": pa.array(hashes[:, 0], pa.uint64()), "h2": pa.array(hashes[:, 1], pa.uint64()),
                               "row": pa.array(rows, pa.int64())}))


class MemoryBoundError(TaskInputError):
    """A decision that cannot hold in the memory its stage is given; trying again would not help."""


@dataclass(frozen=True)
class PassTask:
    """The records of one hash range: which of them to remove."""

    index: int
    passes: int
    hash_urls: list[str]
    rank_of_task: list[int]
    policy: str
    memory_bytes: int
    out_url: str
    stats_url: str


def decide(hash_urls: list[str], out_dir: str, total_records: int, memory_bytes: int, rank_of_task: list[int],
           policy: str, run_phase: Callable[..., list[dict[str, Any]]]) -> list[str]:
    """Removal files for the duplicates ``policy`` removes; ``hash_urls[t]`` is task ``t``'s hashes, ``rank_of_task[t]``
    the rank of its source. The passes run as tasks through ``run_phase(fn, tasks, stats_urls, label)``.

    Returns the removal files' URLs (one per pass); passes already decided by an interrupted run are not redone.
    """
    passes = max(1, -(-2 * total_records * BYTES_PER_RECORD // max(memory_bytes, 1)))
    tasks = [PassTask(index, passes, hash_urls, rank_of_task, policy, memory_bytes,
                      local_or_url_join(out_dir, f"removed-{index:04d}-of-{passes:04d}.parquet"),
                      local_or_url_join(out_dir, "stats", f"{index:04d}-of-{passes:04d}.json")) for index in range(passes)]
    run_phase(run_pass_task, tasks, [t.stats_url for t in tasks], "exact dedup")
    return [t.out_url for t in tasks]


def run_pass_task(task: PassTask) -> dict[str, Any]:
    """Decide one hash range: read its records' hashes from every shard's file (a row group at a time), group equal
    hashes, write the removed (task, row) sorted; returns the counts."""
    h1s, h2s, tasks, rows = [], [], [], []
    held = 0
    for t, hash_url in enumerate(task.hash_urls):
        for table in row_groups(hash_url):
            h1 = table.column("h1").to_numpy()
            mine = h1 % np.uint64(task.passes) == np.uint64(task.index) if task.passes > 1 else np.ones(len(h1), dtype=bool)
            held += int(mine.sum()) * BYTES_PER_RECORD
            if held > task.memory_bytes:
                raise MemoryBoundError(f"exact_dedup.memory_bytes ({task.memory_bytes:,}) cannot hold hash range {task.index} of "
                                       f"{task.passes}: more than {held:,} bytes at {BYTES_PER_RECORD} bytes a record (its records are "
                                       "mostly one text copied many times, which no range splits); raise exact_dedup.memory_bytes")
            h1s.append(h1[mine])
            h2s.append(table.column("h2").to_numpy()[mine])
            rows.append(table.column("row").to_numpy()[mine])
            tasks.append(np.full(int(mine.sum()), t, dtype=np.int32))
    h1, h2, task_of, row = (np.concatenate(a) if a else np.empty(0) for a in (h1s, h2s, tasks, rows))
    order = np.lexsort((row, task_of, h2, h1))
    h1, h2, task_of, row = h1[order], h2[order], task_of[order], row[order]
    same = np.zeros(len(h1), dtype=bool)
    same[1:] = (h1[1:] == h1[:-1]) & (h2[1:] == h2[:-1])
    duplicate = removals(pack(task_of, row), np.cumsum(~same) - 1, np.asarray(task.rank_of_task, dtype=np.int64), task.policy)
    removed = np.lexsort((row[duplicate], task_of[duplicate]))
    write_table(task.out_url, pa.table({"task": pa.array(task_of[duplicate][removed], pa.int32()),
                                        "row": pa.array(row[duplicate][removed], pa.int64())}), statistics=True)
    logger.info("exact dedup pass %d of %d: %d records, %d duplicates removed, %d kept (%s)", task.index + 1, task.passes, len(h1),
                int(duplicate.sum()), int(same.sum() - duplicate.sum()), task.policy)
    result = {"records": int(len(h1)), "removed": int(duplicate.sum()), "held_bytes": held}
    write_json(task.stats_url, result)
    return result


def removed_rows(removal_urls: list[str], task: int) -> np.ndarray:
    """The rows of task ``task``'s records that the decision removes, sorted."""
    parts = []
    for url in removal_urls:
        table = read_table(url, filters=[("task", "==", task)], columns=["row"])
        parts.append(table.column("row").to_numpy())
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)

