"""Fuzzy deduplication: MinHash signatures, LSH buckets, duplicate edges, clusters, and removal by source rank.

The Zyda-2 recipe, on CPUs, every step a set of tasks on the executor with memory bounded by ``memory_bytes``, not by
the corpus. The pass before a ``fuzzy_dedup`` stage writes each shard's MinHash signatures (``minhash.py``). Then,
each step an artifact of its own, written under a temporary name and renamed, so an interrupted run resumes at the
step (and the task) it was in:

1. lsh (one task per shard): each signature cut into ``bands`` bands of ``rows`` values, each band hashed to 64 bits;
   every (band, hash, document) goes to one of ``partitions`` bucket files by its hash.
2. edges (one task per partition): documents with the same value in the same band share a bucket; each member is
   joined to the bucket's first (never all pairs, so a huge bucket costs its size, not its square), and with
   ``jaccard_check`` each edge is kept only when the true shingle Jaccard of its two texts reaches ``jaccard_threshold``
   (``pair_check.py``: the texts read in groups within what the entries leave of ``memory_bytes``).
   Each edge goes, from each of its ends, to the adjacency file of that end's range of document ids.
3. components (one task per range and round, ``components.py``): min-label propagation until no label changes; each
   document then goes to the range of its cluster's root (its least document).
4. clusters (one task per range): the clusters rooted in the range, numbered by their root as one pass over all
   edges would number them, each document with its cluster id (``clusters.parquet/``, a file per range); per cluster the
   documents of each source (``cluster_counts.parquet/``, Zyda-2's ``compute_counts``); and which to remove.
   ``cross_source`` keeps every member of the cluster's highest-ranked source (the sources' list order) and removes the
   members of the others, so duplicates inside a source stay (Zyda-2); ``one_per_cluster`` keeps only the first member
   (highest rank, then shard, then row). A cluster's members are streamed twice: its best, then the removals.
5. removal (one task per range): the removed documents of the range, sorted (``removed/``); the next pass's task for a
   shard reads the files of the ranges its rows fall in and drops what they list.

A document is named by ``task << 32 | row``: its input shard's task and its row in that shard's intermediate output, so
ranges of names are ranges of (task, row) and sorted lists of them join by streaming. The driver holds a few numbers
per shard, partition and range, never one per document.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from tokenmix.curate.components import BYTES_PER_NODE, DocRanges, RangeWriters, chunks, find_components, range_file, scatter_by_range
from tokenmix.curate.dedup_policy import Policy, member_keys, pack, unpack
from tokenmix.curate.minhash import MinHashConfig
from tokenmix.curate.pair_check import CheckStats, PairCheck, similar_pairs
from tokenmix.curate.pipeline_config import CurationError
from tokenmix.curate.records import as_array
from tokenmix.curate.scatter import mix64
from tokenmix.curate.shard_io import ShardWriter, local_or_url_join, read_table, write_json, write_table
from tokenmix.curate.stages import ShardContext, Stage

logger = logging.getLogger(__name__)

BYTES_PER_ENTRY = 128
"""An edges task's peak memory per bucket entry (a document in one band), measured at 120 with 2 M entries: the
entries, their sort, the edges and both directions of them."""
BYTES_PER_PAIR = 48
"""A clusters task's memory per (cluster, source) pair it counts: key and count, and their merge with each chunk's."""


@Stage.register_subclass("fuzzy_dedup")
@dataclass(frozen=True)
class FuzzyDedup(Stage):
    """MinHash-LSH fuzzy deduplication across every input, removing by source rank (Zyda-2's recipe). Needs every
    shard before it can decide, so the pipeline runs it between passes."""

    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    """Shingles and permutations (default: character 25-grams, 128 permutations, as Zyda-2)."""
    bands: int = 8
    rows: int = 16
    """``bands * rows`` must be ``minhash.num_perm``; 8 x 16 puts the threshold near Jaccard 0.85 (Zyda-2)."""
    policy: Policy = "cross_source"
    """``cross_source``: in a cluster keep every member of its highest-ranked source, remove the others' (duplicates
    inside a source stay); ``one_per_cluster``: keep only the first member (``dedup_policy.py``)."""
    jaccard_check: bool = False
    """Check each candidate pair's exact shingle Jaccard against ``jaccard_threshold`` (off, as in Zyda-2). The texts
    and shingle sets it holds stay within what an edges task's bucket entries leave of ``memory_bytes`` (read in
    groups, ``pair_check.py``); a document too large for half of that is refused, naming ``memory_bytes``."""
    jaccard_threshold: float = 0.8
    text_field: str | None = None
    """Unset: the source's ``text_field``."""
    memory_bytes: int = 256 << 20
    """The peak memory of one task of the corpus-wide steps: an edges task's bucket entries (128 bytes per document and
    band) and, with ``jaccard_check``, the texts and shingle sets it checks in what they leave; a components, clusters
    or removal task's range of documents (256 bytes each, and 48 per source). Less means more partitions and ranges,
    never more memory; a bucket too large for it (at 256 MiB, about 1 M documents sharing one band: one text copied
    that often, which exact dedup removes first), or a document too large for half of what the entries leave to the
    check, is refused, naming this field."""
    backend: Literal["numba", "jax"] = "numba"
    """What computes signatures: ``numba`` (compiled loops, the fastest on CPUs) or ``jax`` (for an accelerator; about
    1.3 s to start in each worker process); both give the same bits."""

    def __post_init__(self) -> None:
        if self.bands < 1 or self.rows < 1 or self.bands * self.rows != self.minhash.num_perm:
            raise ValueError(f"fuzzy_dedup: bands x rows ({self.bands} x {self.rows}) must equal minhash.num_perm ({self.minhash.num_perm})")
        if not 0.0 <= self.jaccard_threshold <= 1.0:
            raise ValueError(f"fuzzy_dedup.jaccard_threshold must be between 0 and 1, got {self.jaccard_threshold}")

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        raise TypeError("fuzzy_dedup runs between passes of the pipeline, not on one batch")


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``[n, bands]`` 64-bit hashes, each of one band's ``rows`` signature values (equal bands, equal hashes)."""
    values = signatures.astype(np.uint64).reshape(len(signatures), bands, rows)
    out = np.zeros((len(signatures), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for r in range(rows):
            out = mix64(out ^ values[:, :, r], r)
    return out


def bucket_edges(bands: np.ndarray, hashes: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """``[m, 2]`` edges joining each member of a bucket (same band, same hash) to the bucket's first (lowest) document;
    a pair found in several bands is given once."""
    order = np.lexsort((docs, hashes, bands))
    bands, hashes, docs = bands[order], hashes[order], docs[order]
    starts = np.ones(len(docs), dtype=bool)
    starts[1:] = (bands[1:] != bands[:-1]) | (hashes[1:] != hashes[:-1])
    first = np.maximum.accumulate(np.where(starts, np.arange(len(docs)), 0))
    member = ~starts
    edges = np.stack([docs[first[member]], docs[member]], axis=1)
    if not len(edges):
        return edges.reshape(0, 2)
    return np.unique(edges, axis=0)


@dataclass(frozen=True)
class LshTask:
    """One shard's signatures into bucket files by band hash."""

    task: int
    signatures_url: str
    bands: int
    rows: int
    partitions: int
    out_dir: str
    stats_url: str


@dataclass(frozen=True)
class EdgesTask:
    """One partition's buckets into edges (checked against the texts when asked), sent to the ranges of their ends."""

    partition: int
    bucket_urls: list[str]
    ranges: DocRanges
    out_dir: str
    stats_url: str
    check: FuzzyDedup | None
    intermediate_urls: list[str]
    text_fields: list[str]


@dataclass(frozen=True)
class ClustersTask:
    """The clusters rooted in one range: their numbers, source counts and removals."""

    range_index: int
    labels_url: str
    member_urls: list[str]
    first_cluster: int
    ranges: DocRanges
    rank_of_task: list[int]
    sources: list[str]
    policy: Policy
    clusters_url: str
    counts_url: str
    removed_dir: str
    stats_url: str


@dataclass(frozen=True)
class RemovalTask:
    """One range's removed documents, as one sorted list."""

    range_index: int
    urls: list[str]
    out_url: str
    stats_url: str


def write_signatures(url: str, signatures: np.ndarray, present: np.ndarray) -> None:
    """A shard's signatures (rows without one left out), as Parquet, written whole and then renamed."""
    rows = np.flatnonzero(present).astype(np.int64)
    kept = signatures[present]
    flat = pa.array(kept.reshape(-1))
    signature = pa.FixedSizeListArray.from_arrays(flat, kept.shape[1])
    table = pa.table({"row": pa.array(rows, pa.int64()), "signature": signature})
    write_table(url, table)


def _bucket_url(out_dir: str, task: int, partition: int) -> str:
    return local_or_url_join(out_dir, f"{task:06d}-{partition:04d}.parquet")


def run_lsh_task(task: LshTask) -> dict[str, Any]:
    """Band hashes of a shard's signatures, scattered to the partitions' bucket files."""
    table = read_table(task.signatures_url)
    rows = table.column("row").to_numpy()
    width = task.bands * task.rows
    sigs = as_array(table.column("signature")).flatten().to_numpy(zero_copy_only=False).reshape(len(rows), width) if len(rows) \
        else np.zeros((0, width), dtype=np.uint64)
    hashes = band_hashes(sigs, task.bands, task.rows)
    band = np.broadcast_to(np.arange(task.bands, dtype=np.int16), hashes.shape).reshape(-1)
    docs = np.repeat(pack(task.task, rows), task.bands)
    flat = hashes.reshape(-1)
    partition = (flat % np.uint64(task.partitions)).astype(np.int64)
    written = {}
    for p in np.unique(partition).tolist():
        mine = partition == p
        write_table(_bucket_url(task.out_dir, task.task, p), pa.table({"band": pa.array(band[mine]), "hash": pa.array(flat[mine]),
                                                                        "doc": pa.array(docs[mine])}))
        written[str(p)] = int(mine.sum())
    result = {"partitions": written}
    write_json(task.stats_url, result)
    return result


def run_edges_task(task: EdgesTask) -> dict[str, Any]:
    """The edges of one partition's buckets, checked against the texts with ``jaccard_check`` (within what the bucket
    entries leave of ``memory_bytes``), written from each end to the adjacency file of its range."""
    entries, edges = _candidate_edges(task.bucket_urls)
    candidates = len(edges)
    held = entries * BYTES_PER_ENTRY
    checked = CheckStats()
    if task.check is not None and len(edges):
        keep, checked = similar_pairs(edges, PairCheck(task.intermediate_urls, task.text_fields, task.check.minhash,
                                                       task.check.jaccard_threshold, task.check.memory_bytes - held, task.partition))
        edges = edges[keep]
    writers = RangeWriters(task.out_dir, task.partition)
    try:
        both = np.concatenate([edges, edges[:, ::-1]])
        scatter_by_range({"node": both[:, 0], "neighbor": both[:, 1]}, both[:, 0], task.ranges, writers)
    except BaseException:
        writers.abort()
        raise
    result = {"candidates": candidates, "edges": int(len(edges)), "adjacency": writers.close(), "held_bytes": held + checked.peak_bytes,
              "check": {"groups": checked.groups, "chunks": checked.chunks, "held_bytes": checked.peak_bytes}}
    write_json(task.stats_url, result)
    return result


def _candidate_edges(bucket_urls: list[str]) -> tuple[int, np.ndarray]:
    """A partition's bucket entries and its candidate edges (the entries freed before the check reads texts)."""
    parts = [read_table(url) for url in bucket_urls]
    if not parts:
        return 0, np.zeros((0, 2), dtype=np.int64)
    table = pa.concat_tables(parts)
    return table.num_rows, bucket_edges(table.column("band").to_numpy(), table.column("hash").to_numpy(), table.column("doc").to_numpy())


def run_clusters_task(task: ClustersTask) -> dict[str, Any]:
    """Number the clusters rooted in a range, count their sources, decide their removals (members streamed twice:
    each cluster's best, then who is below it); returns the range's share of the decision's statistics."""
    labels = read_table(task.labels_url)
    nodes = labels.column("node").to_numpy()
    roots = nodes[labels.column("label").to_numpy() == nodes]
    rank_of_task = np.asarray(task.rank_of_task, dtype=np.int64)
    n_sources = len(task.sources)
    best = np.full(len(roots), np.iinfo(np.int64).max, dtype=np.int64)
    for doc, root in chunks(task.member_urls, "doc", "root"):
        np.minimum.at(best, np.searchsorted(roots, root), member_keys(doc, rank_of_task, task.policy))
    names = pa.array(task.sources, pa.string())
    pair_keys, pair_counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    in_clusters = np.zeros(n_sources, dtype=np.int64)
    removed_by = np.zeros(n_sources, dtype=np.int64)
    clusters = ShardWriter(task.clusters_url, "parquet", keep_hidden=True)
    removed_writers = RangeWriters(task.removed_dir, task.range_index)
    try:
        for doc, root in chunks(task.member_urls, "doc", "root"):
            at = np.searchsorted(roots, root)
            removed = member_keys(doc, rank_of_task, task.policy) > best[at]
            source = rank_of_task[unpack(doc)[0]]
            clusters.write(pa.table({"doc": pa.array(doc, pa.int64()), "cluster": pa.array(task.first_cluster + at, pa.int64()),
                                     "source": names.take(pa.array(source)), "removed": pa.array(removed)}))
            scatter_by_range({"doc": doc[removed]}, doc[removed], task.ranges, removed_writers)
            keys, inverse = np.unique(np.concatenate([pair_keys, at * n_sources + source]), return_inverse=True)
            pair_counts = np.bincount(inverse, weights=np.concatenate([pair_counts, np.ones(len(doc), dtype=np.int64)]),
                                      minlength=len(keys)).astype(np.int64)
            pair_keys = keys
            in_clusters += np.bincount(source, minlength=n_sources)
            removed_by += np.bincount(source[removed], minlength=n_sources)
    except BaseException:
        clusters.abort()
        removed_writers.abort()
        raise
    if clusters.records:
        clusters.close()
    else:
        clusters.abort()
        write_table(task.clusters_url, pa.table({"doc": pa.array([], pa.int64()), "cluster": pa.array([], pa.int64()),
                                                 "source": pa.array([], pa.string()), "removed": pa.array([], pa.bool_())}))
    cluster_of_pair, source_of_pair = pair_keys // max(n_sources, 1), pair_keys % max(n_sources, 1)
    write_table(task.counts_url, pa.table({"cluster": pa.array(task.first_cluster + cluster_of_pair, pa.int64()),
                                           "source": names.take(pa.array(source_of_pair)), "documents": pa.array(pair_counts, pa.int64())}))
    mixes: Counter[str] = Counter()
    starts = np.flatnonzero(np.r_[True, cluster_of_pair[1:] != cluster_of_pair[:-1]]) if len(pair_keys) else np.zeros(0, dtype=np.int64)
    for members in np.split(source_of_pair, starts[1:]) if len(starts) else []:
        mixes["+".join(sorted(task.sources[s] for s in members.tolist()))] += 1
    result = {"clusters": int(len(roots)), "documents": int(in_clusters.sum()), "clusters_by_sources": dict(mixes),
              "in_clusters": in_clusters.tolist(), "removed": removed_by.tolist(), "removed_to": removed_writers.close(),
              "held_bytes": int(len(nodes)) * BYTES_PER_NODE + int(len(pair_keys)) * BYTES_PER_PAIR}
    write_json(task.stats_url, result)
    return result


def run_removal_task(task: RemovalTask) -> dict[str, Any]:
    """A range's removed documents as one list sorted by (task, row), with row-group statistics so that the task of a
    shard reads only its own."""
    docs = np.sort(np.concatenate([read_table(url).column("doc").to_numpy() for url in task.urls] or [np.zeros(0, dtype=np.int64)]))
    tasks, rows = unpack(docs)
    write_table(task.out_url, pa.table({"task": pa.array(tasks, pa.int32()), "row": pa.array(rows, pa.int64())}), statistics=True)
    result = {"removed": int(len(docs)), "held_bytes": int(len(docs)) * BYTES_PER_NODE}
    write_json(task.stats_url, result)
    return result


def partition_count(stage: FuzzyDedup, total_records: int) -> int:
    """Bucket partitions for ``total_records`` documents: an edges task's expected entries fill half of ``memory_bytes``
    (buckets fall to partitions by hash, so a partition's share varies)."""
    return max(1, -(-2 * total_records * stage.bands * BYTES_PER_ENTRY // max(stage.memory_bytes, 1)))


def documents_per_range(stage: FuzzyDedup, sources: int) -> int:
    """Documents in a range of ids: a range task peaks at ``BYTES_PER_NODE`` per document, and a clusters task adds
    its (cluster, source) pairs, at most ``sources`` per root and one root per document (the other members may be in
    other ranges)."""
    return max(1, stage.memory_bytes // (BYTES_PER_NODE + BYTES_PER_PAIR * sources))


def decide(stage: FuzzyDedup, run_phase: Callable[..., list[dict[str, Any]]], signature_urls: list[str], intermediate_urls: list[str],
           text_fields: list[str], sources: list[str], source_of_task: list[int], records_of_task: list[int],
           work: str) -> tuple[list[list[str]], dict[str, Any]]:
    """Run every step on the executor (through ``run_phase``); returns, for each task, the removal files its next pass
    reads (the next pass drops what they list), and the statistics (clusters, per-cluster source counts, removed)."""
    total = sum(records_of_task)
    partitions = partition_count(stage, total)
    ranges = DocRanges.of(records_of_task, documents_per_range(stage, len(sources)))
    lsh_dir = local_or_url_join(work, "lsh")
    lsh_tasks = [LshTask(t, url, stage.bands, stage.rows, partitions, local_or_url_join(lsh_dir, "buckets"),
                         local_or_url_join(lsh_dir, "stats", f"{t:06d}.json")) for t, url in enumerate(signature_urls)]
    scattered = run_phase(run_lsh_task, lsh_tasks, [t.stats_url for t in lsh_tasks], "lsh buckets")
    entries = [sum(r["partitions"].get(str(p), 0) for r in scattered) for p in range(partitions)]
    largest = max(entries, default=0)
    if largest * BYTES_PER_ENTRY > stage.memory_bytes:
        raise CurationError(f"fuzzy_dedup.memory_bytes ({stage.memory_bytes:,}) cannot hold LSH partition {entries.index(largest)}: "
                            f"{largest:,} bucket entries of {BYTES_PER_ENTRY} bytes, {largest * BYTES_PER_ENTRY:,} bytes (its largest buckets "
                            "are one text copied many times, which no partitioning splits); raise fuzzy_dedup.memory_bytes")
    edge_tasks = []
    for p in range(partitions):
        urls = [_bucket_url(local_or_url_join(lsh_dir, "buckets"), t.task, p) for t, r in zip(lsh_tasks, scattered, strict=True)
                if str(p) in r["partitions"]]
        edge_tasks.append(EdgesTask(p, urls, ranges, local_or_url_join(work, "edges"), local_or_url_join(work, "edges", "stats", f"{p:04d}.json"),
                                    stage if stage.jaccard_check else None, intermediate_urls, text_fields))
    found = run_phase(run_edges_task, edge_tasks, [t.stats_url for t in edge_tasks], "lsh edges")
    adjacency = [[range_file(local_or_url_join(work, "edges"), p, q) for p, r in enumerate(found) if str(q) in r["adjacency"]]
                 for q in range(len(ranges))]
    components = find_components(ranges, adjacency, local_or_url_join(work, "components"), run_phase)
    removed_dir = local_or_url_join(work, "removed")
    cluster_tasks = [ClustersTask(r, components.labels_urls[r], components.member_urls[r], components.first_cluster[r], ranges,
                                  source_of_task, sources, stage.policy, local_or_url_join(work, "clusters.parquet", f"{r:05d}.parquet"),
                                  local_or_url_join(work, "cluster_counts.parquet", f"{r:05d}.parquet"), local_or_url_join(removed_dir, "scatter"),
                                  local_or_url_join(work, "clusters", "stats", f"{r:05d}.json")) for r in range(len(ranges))]
    decided = run_phase(run_clusters_task, cluster_tasks, [t.stats_url for t in cluster_tasks], "clusters")
    removal_tasks = [RemovalTask(q, [range_file(local_or_url_join(removed_dir, "scatter"), r, q) for r, d in enumerate(decided)
                                     if str(q) in d["removed_to"]],
                                 local_or_url_join(removed_dir, f"{q:05d}.parquet"), local_or_url_join(removed_dir, "stats", f"{q:05d}.json"))
                     for q in range(len(ranges))]
    removals = run_phase(run_removal_task, removal_tasks, [t.stats_url for t in removal_tasks], "removal")
    removal_of_task = [[removal_tasks[q].out_url for q in ranges.of_task(t, n)] for t, n in enumerate(records_of_task)]
    decision = summary(found, decided, sources)
    decision["bounds"] = {"memory_bytes": stage.memory_bytes, "partitions": partitions, "ranges": len(ranges), "rounds": components.rounds,
                          "max_task_bytes": max([r["held_bytes"] for r in (*found, *decided, *removals)] + [components.max_held_bytes])}
    logger.info("fuzzy dedup: %d clusters, %d documents in them, %d removed; %d partitions, %d ranges, %d rounds of components",
                decision["clusters"], decision["documents_in_clusters"], sum(decision["removed_by_source"].values()), partitions,
                len(ranges), components.rounds)
    return removal_of_task, decision


def summary(edge_stats: list[dict[str, Any]], cluster_stats: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    """Statistics of a decision, from its tasks' shares: clusters, their documents, which sources they mix, what each
    source loses (sources in rank order)."""
    mixes: Counter[str] = Counter()
    for s in cluster_stats:
        mixes.update(s["clusters_by_sources"])
    in_clusters = np.sum([s["in_clusters"] for s in cluster_stats], axis=0, dtype=np.int64) if cluster_stats else np.zeros(len(sources))
    removed = np.sum([s["removed"] for s in cluster_stats], axis=0, dtype=np.int64) if cluster_stats else np.zeros(len(sources))
    return {
        "candidate_pairs": sum(s["candidates"] for s in edge_stats), "edges": sum(s["edges"] for s in edge_stats),
        "clusters": sum(s["clusters"] for s in cluster_stats), "documents_in_clusters": sum(s["documents"] for s in cluster_stats),
        "clusters_by_sources": dict(sorted(mixes.items())),
        "in_clusters_by_source": {name: int(n) for name, n in zip(sources, in_clusters.tolist(), strict=True) if n},
        "removed_by_source": {name: int(n) for name, n in zip(sources, removed.tolist(), strict=True) if n},
    }
