"""Connected components of a graph whose edges are in files, partition by partition, with no process holding the graph.

Documents are compact ids (``dedup_policy.pack``: task and row in one int64), so a range of ids is a range of
(task, row): ``DocRanges`` cuts the corpus into ranges of at most a given number of documents, from each task's record
count. The edges arrive as adjacency files (``node``, ``neighbor``; each edge once from each end), one set per range
of ``node``. Then min-label propagation, each round one task per range:

- round 0: each node's label is the least of its own id and its neighbors';
- round t: a range's labels take the least label sent to each of its nodes in round t - 1; each node whose label went
  down sends it to its neighbors, into message files by the neighbor's range.

When a round sends nothing, every node holds the least id of its component (its root). A last task per range sends
each (document, root) to the range of its root (``members``), so that one task per range finds every member of the
clusters rooted there. Clusters are numbered by their root in id order, as one pass over all edges would number them:
the driver holds one count of roots per range, and a cluster's number is the roots before its range plus its root's
place in the range.

A task holds its range's nodes and labels and one row group of a file it streams (``BYTES_PER_NODE`` a document of
the range at its peak); the driver holds a few numbers per range. Every file is written under a temporary name and
then renamed, and each task's statistics come last, so a killed round resumes at its unfinished tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmix.curate.dedup_policy import pack
from tokenmix.curate.shard_io import ShardWriter, local_or_url_join, read_table, row_groups, write_json, write_table

BYTES_PER_NODE = 256
"""A range task's peak memory per document of its range, measured with 1.5 M documents in one range: a labels round
174-188 bytes, members 136, clusters (one source) 248, removal 88; its arrays, the Arrow tables it reads and writes,
and numpy's sorts."""


@dataclass(frozen=True)
class DocRanges:
    """Ranges of compact document ids, each of at most about ``total / len(bounds)`` documents; ``bounds[q]`` is the
    first id of range ``q``."""

    bounds: tuple[int, ...]

    @classmethod
    def of(cls, records_of_task: list[int], per_range: int) -> DocRanges:
        """Ranges of at most ``per_range`` documents over tasks holding ``records_of_task`` rows each."""
        counts = np.asarray(records_of_task, dtype=np.int64)
        total = int(counts.sum())
        ranges = max(1, -(-total // max(per_range, 1)))
        starts = np.concatenate([[0], np.cumsum(counts)])
        positions = np.arange(1, ranges, dtype=np.int64) * total // ranges
        tasks = np.searchsorted(starts, positions, side="right") - 1
        return cls((0, *pack(tasks, positions - starts[tasks]).tolist()))

    def __len__(self) -> int:
        return len(self.bounds)

    def of_docs(self, docs: np.ndarray) -> np.ndarray:
        """The range of each document."""
        return np.searchsorted(np.asarray(self.bounds, dtype=np.int64), docs, side="right") - 1

    def of_task(self, task: int, records: int) -> range:
        """The ranges that hold task ``task``'s ``records`` rows."""
        if not records:
            return range(0)
        first, last = self.of_docs(pack(task, np.array([0, records - 1]))).tolist()
        return range(first, last + 1)


def scatter_by_range(columns: dict[str, np.ndarray], key: np.ndarray, ranges: DocRanges,
                     writer_for: Callable[[int], ShardWriter]) -> None:
    """Append each row of ``columns`` to the writer of its ``key``'s range, keeping the rows' order within a range."""
    which = ranges.of_docs(key)
    order = np.argsort(which, kind="stable")
    which = which[order]
    bounds = np.flatnonzero(np.diff(which)) + 1
    table = pa.table({name: pa.array(values[order]) for name, values in columns.items()})
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(which)], strict=True):
        if stop > start:
            writer_for(int(which[start])).write(table.slice(start, stop - start))


class RangeWriters:
    """One streaming Parquet writer per destination range, opened when first written to: ``<out_dir>/<src>-<dest>``."""

    def __init__(self, out_dir: str, source: int):
        self.out_dir, self.source = out_dir, source
        self.writers: dict[int, ShardWriter] = {}

    def __call__(self, dest: int) -> ShardWriter:
        if dest not in self.writers:
            self.writers[dest] = ShardWriter(range_file(self.out_dir, self.source, dest), "parquet", keep_hidden=True)
        return self.writers[dest]

    def close(self) -> dict[str, int]:
        """Rows written to each destination."""
        written = {str(d): w.records for d, w in sorted(self.writers.items())}
        for writer in self.writers.values():
            writer.close()
        return written

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()


def range_file(out_dir: str, source: int, dest: int) -> str:
    """The file a task of range (or partition) ``source`` writes for range ``dest``."""
    return local_or_url_join(out_dir, f"{source:05d}-{dest:05d}.parquet")


def chunks(urls: list[str], *columns: str) -> Iterator[tuple[np.ndarray, ...]]:
    """The named columns of each file, a row group at a time."""
    for url in urls:
        for table in row_groups(url):
            yield tuple(table.column(c).to_numpy() for c in columns)


@dataclass(frozen=True)
class LabelsTask:
    """One round of label propagation over one range of nodes."""

    range_index: int
    ranges: DocRanges
    adjacency_urls: list[str]
    previous_labels_url: str | None
    message_urls: list[str]
    labels_url: str
    messages_dir: str
    stats_url: str


def run_labels_task(task: LabelsTask) -> dict[str, Any]:
    """A range's labels after this round, and the messages its lowered labels send; returns how many went down, the
    messages per range and the range's roots so far."""
    if task.previous_labels_url is None:
        nodes = np.zeros(0, dtype=np.int64)
        for node, in chunks(task.adjacency_urls, "node"):
            nodes = np.union1d(nodes, node)
        before = nodes
        labels = nodes.copy()
        incoming = chunks(task.adjacency_urls, "node", "neighbor")
    else:
        previous = read_table(task.previous_labels_url)
        nodes, before = previous.column("node").to_numpy(), previous.column("label").to_numpy()
        labels = before.copy()
        incoming = chunks(task.message_urls, "node", "label")
    for node, label in incoming:
        np.minimum.at(labels, np.searchsorted(nodes, node), label)
    lowered = labels < before
    write_table(task.labels_url, pa.table({"node": pa.array(nodes, pa.int64()), "label": pa.array(labels, pa.int64())}))
    writers = RangeWriters(task.messages_dir, task.range_index)
    try:
        if lowered.any():
            for node, neighbor in chunks(task.adjacency_urls, "node", "neighbor"):
                at = np.searchsorted(nodes, node)
                send = lowered[at]
                scatter_by_range({"node": neighbor[send], "label": labels[at[send]]}, neighbor[send], task.ranges, writers)
    except BaseException:
        writers.abort()
        raise
    result = {"nodes": int(len(nodes)), "lowered": int(lowered.sum()), "messages": writers.close(),
              "roots": int((labels == nodes).sum()), "held_bytes": int(len(nodes)) * BYTES_PER_NODE}
    write_json(task.stats_url, result)
    return result


@dataclass(frozen=True)
class MembersTask:
    """A range's final labels sent to the ranges of their roots."""

    range_index: int
    ranges: DocRanges
    labels_url: str
    out_dir: str
    stats_url: str


def run_members_task(task: MembersTask) -> dict[str, Any]:
    """Each (document, root) of a range into the file of its root's range; returns the rows per range."""
    table = read_table(task.labels_url)
    nodes, labels = table.column("node").to_numpy(), table.column("label").to_numpy()
    writers = RangeWriters(task.out_dir, task.range_index)
    try:
        scatter_by_range({"doc": nodes, "root": labels}, labels, task.ranges, writers)
    except BaseException:
        writers.abort()
        raise
    result = {"members": writers.close()}
    write_json(task.stats_url, result)
    return result


@dataclass(frozen=True)
class Components:
    """Where the components are: per range, its final labels (its roots are the nodes labelled with themselves), the
    member files of the clusters rooted there (in range order, so their documents come sorted), and the number of the
    range's first cluster."""

    ranges: DocRanges
    labels_urls: list[str]
    member_urls: list[list[str]]
    first_cluster: list[int]
    rounds: int
    max_held_bytes: int


def find_components(ranges: DocRanges, adjacency_urls: list[list[str]], work: str,
                    run_phase: Callable[..., list[dict[str, Any]]]) -> Components:
    """Connected components of the adjacency files (``adjacency_urls[q]``: range ``q``'s), each round's tasks run
    through ``run_phase(fn, tasks, stats_urls, label)``; rounds already done by an interrupted run are not redone."""
    previous: list[dict[str, Any]] | None = None
    held = 0
    round_ = 0
    while True:
        here = local_or_url_join(work, f"round-{round_:04d}")
        tasks = []
        for q in range(len(ranges)):
            messages = ([] if previous is None else
                        [range_file(local_or_url_join(work, f"round-{round_ - 1:04d}", "messages"), r, q)
                         for r, result in enumerate(previous) if str(q) in result["messages"]])
            tasks.append(LabelsTask(q, ranges, adjacency_urls[q],
                                    None if previous is None else local_or_url_join(work, f"round-{round_ - 1:04d}", "labels", f"{q:05d}.parquet"),
                                    messages, local_or_url_join(here, "labels", f"{q:05d}.parquet"), local_or_url_join(here, "messages"),
                                    local_or_url_join(here, "stats", f"{q:05d}.json")))
        previous = run_phase(run_labels_task, tasks, [t.stats_url for t in tasks], f"components, round {round_ + 1}")
        held = max([held] + [r["held_bytes"] for r in previous])
        if not any(r["messages"] for r in previous):
            break
        round_ += 1
    labels_urls = [t.labels_url for t in tasks]
    members_dir = local_or_url_join(work, "members")
    member_tasks = [MembersTask(q, ranges, labels_urls[q], members_dir, local_or_url_join(members_dir, "stats", f"{q:05d}.json"))
                    for q in range(len(ranges))]
    members = run_phase(run_members_task, member_tasks, [t.stats_url for t in member_tasks], "components, members")
    member_urls = [[range_file(members_dir, q, r) for q, result in enumerate(members) if str(r) in result["members"]]
                   for r in range(len(ranges))]
    first = np.concatenate([[0], np.cumsum([r["roots"] for r in previous])]).tolist()
    return Components(ranges, labels_urls, member_urls, first[:-1], round_ + 1, held)
