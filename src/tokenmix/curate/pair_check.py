"""The exact Jaccard check of fuzzy dedup's candidate pairs, holding texts and shingle sets within a memory bound.

The pairs' left ends are taken in groups whose shingle sets fill half the bound; for each group, the right ends of its
pairs are streamed in chunks that fill the other half. A document is read a row group at a time from its shard's
intermediate output and costs, before it is shingled, an upper bound of its text and its set (``document_bytes``), so a
group is closed before it can overflow. The result is each pair's Jaccard against the threshold, whatever the grouping.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from tokenmix._object_stores import open_url
from tokenmix.curate.dedup_policy import pack, unpack
from tokenmix.curate.minhash import MinHashConfig, set_jaccard, shingle_sets
from tokenmix.curate.pipeline_config import CurationError
from tokenmix.curate.records import column_name

SHINGLE_BATCH = 256
"""Texts shingled together: one vectorized hashing per batch."""
SET_OVERHEAD = 112
"""A shingle set's array object, besides its 8 bytes per shingle (``sys.getsizeof`` of an empty ``uint64`` array)."""


def document_bytes(text: str) -> int:
    """An upper bound of what one document holds in the check: its text, and its shingle set (at most one 8-byte hash
    per character: a text has no more shingles than characters)."""
    return sys.getsizeof(text) + 8 * len(text) + SET_OVERHEAD


@dataclass(frozen=True)
class PairCheck:
    """What the check reads and where its bound comes from."""

    intermediate_urls: list[str]
    text_fields: list[str]
    minhash: MinHashConfig
    threshold: float
    budget_bytes: int
    """What the edges task's bucket entries leave of ``fuzzy_dedup.memory_bytes``: half for a group of left ends, half
    for a chunk of right ends."""
    partition: int


@dataclass
class CheckStats:
    """How the check held its texts: left groups, right chunks, and the most bytes of both at once."""

    groups: int = 0
    chunks: int = 0
    peak_bytes: int = 0


def similar_pairs(edges: np.ndarray, check: PairCheck) -> tuple[np.ndarray, CheckStats]:
    """Whether each ``[m, 2]`` edge's two texts reach the Jaccard threshold, with the check's statistics."""
    keep = np.zeros(len(edges), dtype=bool)
    stats = CheckStats()
    order = np.argsort(edges[:, 0], kind="stable")
    lefts = edges[order, 0]
    half = check.budget_bytes // 2
    for group_docs, group_sets, group_bytes in _shingled(np.unique(lefts), check, half):
        stats.groups += 1
        mine = order[np.searchsorted(lefts, group_docs[0], side="left"):np.searchsorted(lefts, group_docs[-1], side="right")]
        rights = edges[mine, 1]
        at_left = np.searchsorted(group_docs, edges[mine, 0])
        for chunk_docs, chunk_sets, chunk_bytes in _shingled(np.unique(rights), check, half):
            stats.chunks += 1
            stats.peak_bytes = max(stats.peak_bytes, group_bytes + chunk_bytes)
            at = np.minimum(np.searchsorted(chunk_docs, rights), len(chunk_docs) - 1)
            inside = np.flatnonzero(chunk_docs[at] == rights)
            keep[mine[inside]] = [set_jaccard(group_sets[a], chunk_sets[b]) >= check.threshold
                                  for a, b in zip(at_left[inside].tolist(), at[inside].tolist(), strict=True)]
            del chunk_sets  # before the next chunk is read, not after
        del group_sets
    return keep, stats


def _shingled(docs: np.ndarray, check: PairCheck, limit: int) -> Iterator[tuple[np.ndarray, list[np.ndarray], int]]:
    """The shingle sets of sorted ``docs`` in groups of at most ``limit`` bytes (``document_bytes``): each group's
    documents, their sets, and its bytes."""
    texts: list[str] = []
    held: list[int] = []
    total = 0
    for doc, text in _texts(docs, check):
        cost = document_bytes(text)
        if cost > limit:
            task, row = (int(v[0]) for v in unpack(np.array([doc], dtype=np.int64)))
            raise CurationError(f"fuzzy_dedup.memory_bytes leaves {check.budget_bytes:,} bytes to the jaccard_check of LSH partition "
                                f"{check.partition} after its bucket entries, half of it for each side of a pair; row {row} of "
                                f"{check.intermediate_urls[task]} ({len(text):,} characters) needs {cost:,} bytes for its text and "
                                "shingle set; raise fuzzy_dedup.memory_bytes")
        if total + cost > limit:
            yield _group(held, texts, total, check)
            texts, held, total = [], [], 0
        texts.append(text)
        held.append(doc)
        total += cost
    if held:
        yield _group(held, texts, total, check)


def _group(docs: list[int], texts: list[str], total: int, check: PairCheck) -> tuple[np.ndarray, list[np.ndarray], int]:
    sets: list[np.ndarray] = []
    for start in range(0, len(texts), SHINGLE_BATCH):
        sets += shingle_sets(texts[start:start + SHINGLE_BATCH], check.minhash)
    return np.asarray(docs, dtype=np.int64), sets, total


def _texts(docs: np.ndarray, check: PairCheck) -> Iterator[tuple[int, str]]:
    """Each of sorted ``docs`` with its text, read a row group at a time (only the groups that hold one)."""
    tasks, rows = unpack(docs)
    for task in np.unique(tasks).tolist():
        wanted = rows[tasks == task]
        with open_url(check.intermediate_urls[task]) as raw:
            parquet = pq.ParquetFile(raw)
            starts = np.cumsum([0] + [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)])
            group_of = np.searchsorted(starts, wanted, side="right") - 1
            for group in np.unique(group_of).tolist():
                local = wanted[group_of == group]
                column = parquet.read_row_group(group, columns=[column_name(check.text_fields[task])]).column(0)
                texts = column.take(local - starts[group]).to_pylist()
                del column
                yield from zip(pack(task, local).tolist(), texts, strict=True)
