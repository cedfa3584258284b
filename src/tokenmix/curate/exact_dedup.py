"""Exact deduplication across every input: which records to remove, decided from the hashes the shards wrote.

Each shard task of the pass before ``exact_dedup`` writes, beside its records, a 128-bit hash of each record's
(normalized) text and the record's row. Here the driver decides, among records with the same hash, by the stage's
policy (``dedup_policy.py``): ``one_per_cluster`` keeps the first, first meaning the lowest task, which is the
highest-ranked source (the sources' list order), then its first shard, then its first row; ``cross_source`` keeps
every record of the highest-ranked source that has the text (Zyda-2's rule). The others are written to removal files,
read by the next pass's tasks.

Memory is bounded by ``memory_bytes``: records are decided in passes over hash ranges (``h mod passes``), each pass
holding only its range; the removal files are one per pass, so an interrupted decision resumes at its next pass.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from tokenmix.curate.dedup_policy import pack, removals
from tokenmix.curate.shard_io import exists, local_or_url_join, read_table, write_table

logger = logging.getLogger(__name__)

BYTES_PER_RECORD = 24
"""Two 64-bit hash halves, a 32-bit task and a 64-bit row, held while deciding (numpy arrays, no per-record objects)."""


def write_hashes(url: str, hashes: np.ndarray, rows: np.ndarray) -> None:
    """A shard's hashes and rows, as Parquet (written whole under a temporary name, then renamed)."""
    write_table(url, pa.table({"h1": pa.array(hashes[:, 0], pa.uint64()), "h2": pa.array(hashes[:, 1], pa.uint64()),
                               "row": pa.array(rows, pa.int64())}))


def decide(hash_urls: list[str], out_dir: str, total_records: int, memory_bytes: int, rank_of_task: list[int],
           policy: str) -> list[str]:
    """Removal files for the duplicates ``policy`` removes; ``hash_urls[t]`` is task ``t``'s hashes, ``rank_of_task[t]``
    the rank of its source.

    Returns the removal files' URLs (one per pass); passes already decided by an interrupted run are not redone.
    """
    passes = max(1, -(-total_records * BYTES_PER_RECORD // max(memory_bytes, 1)))
    urls = []
    for index in range(passes):
        url = local_or_url_join(out_dir, f"removed-{index:04d}-of-{passes:04d}.parquet")
        urls.append(url)
        if exists(url):
            continue
        h1s, h2s, tasks, rows = [], [], [], []
        for task, hash_url in enumerate(hash_urls):
            table = read_table(hash_url)
            h1 = table.column("h1").to_numpy()
            mine = h1 % np.uint64(passes) == np.uint64(index) if passes > 1 else np.ones(len(h1), dtype=bool)
            h1s.append(h1[mine])
            h2s.append(table.column("h2").to_numpy()[mine])
            rows.append(table.column("row").to_numpy()[mine])
            tasks.append(np.full(int(mine.sum()), task, dtype=np.int32))
        h1, h2, task, row = (np.concatenate(a) if a else np.empty(0) for a in (h1s, h2s, tasks, rows))
        order = np.lexsort((row, task, h2, h1))
        h1, h2, task, row = h1[order], h2[order], task[order], row[order]
        same = np.zeros(len(h1), dtype=bool)
        same[1:] = (h1[1:] == h1[:-1]) & (h2[1:] == h2[:-1])
        duplicate = removals(pack(task, row), np.cumsum(~same) - 1, np.asarray(rank_of_task, dtype=np.int64), policy)
        removed = np.lexsort((row[duplicate], task[duplicate]))
        table = pa.table({"task": pa.array(task[duplicate][removed], pa.int32()), "row": pa.array(row[duplicate][removed], pa.int64())})
        write_table(url, table, statistics=True)
        logger.info("exact dedup pass %d of %d: %d records, %d duplicates removed, %d kept (%s)", index + 1, passes, len(h1),
                    int(duplicate.sum()), int(same.sum() - duplicate.sum()), policy)
    return urls


def removed_rows(removal_urls: list[str], task: int) -> np.ndarray:
    """The rows of task ``task``'s records that the decision removes, sorted."""
    parts = []
    for url in removal_urls:
        table = read_table(url, filters=[("task", "==", task)], columns=["row"])
        parts.append(table.column("row").to_numpy())
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)

