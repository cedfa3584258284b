"""Fuzzy deduplication: MinHash signatures, LSH buckets, duplicate edges, clusters, and removal by source rank.

The Zyda-2 recipe, on CPUs and with memory bounded by an on-disk shuffle. The pass before a ``fuzzy_dedup`` stage
writes each shard's MinHash signatures (``minhash.py``). Then, each step an artifact of its own, written under a
temporary name and renamed, so an interrupted run resumes at the step it was in:

1. lsh (one task per shard): each signature cut into ``bands`` bands of ``rows`` values, each band hashed to 64 bits;
   every (band, hash, document) goes to one of ``partitions`` bucket files by its hash.
2. edges (one task per partition): documents with the same value in the same band share a bucket; each member is
   joined to the bucket's first (never all pairs, so a huge bucket costs its size, not its square), and with
   ``jaccard_check`` each edge is kept only when the true shingle Jaccard of its two texts reaches ``jaccard_threshold``.
3. clusters (the driver): connected components of the edges (``scipy.sparse.csgraph``), each document in a cluster
   with its cluster id (``clusters.parquet``); per cluster the documents of each source (``cluster_counts.parquet``,
   Zyda-2's ``compute_counts``).
4. removal (the driver): ``cross_source`` keeps every member of the cluster's highest-ranked source (the sources'
   list order) and removes the members of the others, so duplicates inside a source stay (Zyda-2); ``one_per_cluster``
   keeps only the first member (highest rank, then shard, then row). The next pass drops the removed records.

A document is named by ``task << 32 | row``: its input shard's task and its row in that shard's intermediate output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from tokenmix.curate.dedup_policy import Policy, pack, removals, unpack
from tokenmix.curate.minhash import MinHashConfig, jaccard
from tokenmix.curate.records import as_array, column_name
from tokenmix.curate.scatter import mix64
from tokenmix.curate.shard_io import exists, local_or_url_join, read_table, write_json, write_table
from tokenmix.curate.stages import ShardContext, Stage


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
    """Check each candidate pair's true shingle Jaccard against ``jaccard_threshold`` (off, as in Zyda-2)."""
    jaccard_threshold: float = 0.8
    text_field: str | None = None
    """Unset: the source's ``text_field``."""
    memory_bytes: int = 1 << 30
    """Memory for the bucket entries an edges task holds (24 bytes per document and band); more means more partitions."""
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


def components(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documents that have an edge, sorted, and the cluster of each (clusters numbered by their first document)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes, index = np.unique(edges.reshape(-1), return_inverse=True)
    if not len(nodes):
        return nodes, nodes.copy()
    index = index.reshape(-1, 2)
    graph = coo_matrix((np.ones(len(index), dtype=np.int8), (index[:, 0], index[:, 1])), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(graph, directed=False)
    first_of = np.full(labels.max() + 1, len(nodes), dtype=np.int64)
    np.minimum.at(first_of, labels, np.arange(len(nodes)))
    renumbered = np.argsort(np.argsort(first_of, kind="stable"), kind="stable")
    return nodes, renumbered[labels]


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
    """One partition's buckets into edges (checked against the texts when asked)."""

    partition: int
    bucket_urls: list[str]
    out_url: str
    stats_url: str
    check: FuzzyDedup | None
    intermediate_urls: list[str]
    text_fields: list[str]


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
    """The edges of one partition's buckets, checked against the texts with ``jaccard_check``."""
    parts = [read_table(url) for url in task.bucket_urls]
    if parts:
        table = pa.concat_tables(parts)
        edges = bucket_edges(table.column("band").to_numpy(), table.column("hash").to_numpy(), table.column("doc").to_numpy())
    else:
        edges = np.zeros((0, 2), dtype=np.int64)
    candidates = len(edges)
    if task.check is not None and len(edges):
        edges = edges[_similar(edges, task)]
    write_table(task.out_url, pa.table({"a": pa.array(edges[:, 0], pa.int64()), "b": pa.array(edges[:, 1], pa.int64())}))
    result = {"candidates": candidates, "edges": int(len(edges))}
    write_json(task.stats_url, result)
    return result


def _similar(edges: np.ndarray, task: EdgesTask) -> np.ndarray:
    """Whether each edge's two texts reach the Jaccard threshold; each shard's texts are read once."""
    assert task.check is not None
    docs = np.unique(edges.reshape(-1))
    tasks, rows = unpack(docs)
    texts: dict[int, str] = {}
    for t in np.unique(tasks).tolist():
        wanted = rows[tasks == t]
        column = read_table(task.intermediate_urls[t], columns=[column_name(task.text_fields[t])]).column(0)
        for doc, text in zip(pack(t, wanted).tolist(), column.take(pa.array(wanted)).to_pylist(), strict=True):
            texts[doc] = text
    return np.array([jaccard(texts[a], texts[b], task.check.minhash) >= task.check.jaccard_threshold for a, b in edges.tolist()], dtype=bool)


def decide(stage: FuzzyDedup, run_phase: Callable[..., list[dict[str, Any]]], signature_urls: list[str], intermediate_urls: list[str],
           text_fields: list[str], sources: list[str], source_of_task: list[int], total_records: int, work: str) -> tuple[list[str], dict[str, Any]]:
    """Run lsh and edges on the executor (through ``run_phase``), then clusters and removal here; returns the removal
    files (the next pass drops what they list) and the statistics (clusters, per-cluster source counts, removed)."""
    partitions = max(1, -(-total_records * stage.bands * 24 // max(stage.memory_bytes, 1)))
    lsh_dir = local_or_url_join(work, "lsh")
    lsh_tasks = [LshTask(t, url, stage.bands, stage.rows, partitions, local_or_url_join(lsh_dir, "buckets"),
                         local_or_url_join(lsh_dir, "stats", f"{t:06d}.json")) for t, url in enumerate(signature_urls)]
    scattered = run_phase(run_lsh_task, lsh_tasks, [t.stats_url for t in lsh_tasks], "lsh buckets")
    edge_tasks = []
    for p in range(partitions):
        urls = [_bucket_url(local_or_url_join(lsh_dir, "buckets"), t.task, p) for t, r in zip(lsh_tasks, scattered, strict=True)
                if str(p) in r["partitions"]]
        edge_tasks.append(EdgesTask(p, urls, local_or_url_join(work, "edges", f"{p:04d}.parquet"),
                                    local_or_url_join(work, "edges", "stats", f"{p:04d}.json"), stage if stage.jaccard_check else None,
                                    intermediate_urls, text_fields))
    found = run_phase(run_edges_task, edge_tasks, [t.stats_url for t in edge_tasks], "lsh edges")
    clusters_url = local_or_url_join(work, "clusters.parquet")
    removal_url = local_or_url_join(work, "removed.parquet")
    if not exists(removal_url):
        edges = np.concatenate([np.stack([t.column("a").to_numpy(), t.column("b").to_numpy()], axis=1)
                                for t in (read_table(e.out_url) for e in edge_tasks)] or [np.zeros((0, 2), dtype=np.int64)])
        nodes, clusters = components(edges)
        rank_of_task = np.asarray(source_of_task, dtype=np.int64)
        removed = removals(nodes, clusters, rank_of_task, stage.policy)
        tasks, rows = unpack(nodes)
        write_table(clusters_url, pa.table({"doc": pa.array(nodes, pa.int64()), "cluster": pa.array(clusters, pa.int64()),
                                             "source": pa.array([sources[s] for s in rank_of_task[tasks].tolist()], pa.string()),
                                             "removed": pa.array(removed)}))
        sources_of_nodes = rank_of_task[tasks]
        pairs, counts = np.unique(np.stack([clusters, sources_of_nodes], axis=1), axis=0, return_counts=True) if len(nodes) \
            else (np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64))
        write_table(local_or_url_join(work, "cluster_counts.parquet"), pa.table({
            "cluster": pa.array(pairs[:, 0], pa.int64()), "source": pa.array([sources[s] for s in pairs[:, 1].tolist()], pa.string()),
            "documents": pa.array(counts, pa.int64())}))
        order = np.lexsort((rows[removed], tasks[removed]))
        write_table(removal_url, pa.table({"task": pa.array(tasks[removed][order], pa.int32()), "row": pa.array(rows[removed][order], pa.int64())}))
    return [removal_url], summary(read_table(clusters_url), found)


def summary(clusters: pa.Table, edge_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Statistics of a decision: clusters, their documents, which sources they mix, what each source loses."""
    cluster = clusters.column("cluster").to_numpy()
    source = clusters.column("source").to_pylist()
    removed = clusters.column("removed").to_numpy()
    mixes: Counter[str] = Counter()
    members: dict[int, Counter[str]] = {}
    for c, s in zip(cluster.tolist(), source, strict=True):
        members.setdefault(c, Counter())[s] += 1
    for counts in members.values():
        mixes["+".join(sorted(counts))] += 1
    return {
        "candidate_pairs": sum(s["candidates"] for s in edge_stats), "edges": sum(s["edges"] for s in edge_stats),
        "clusters": len(members), "documents_in_clusters": int(len(cluster)),
        "clusters_by_sources": dict(sorted(mixes.items())),
        "in_clusters_by_source": dict(Counter(source)),
        "removed_by_source": dict(Counter(s for s, r in zip(source, removed.tolist(), strict=True) if r)),
    }
