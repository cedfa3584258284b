"""Which members of a group of duplicates to remove, by the sources' ranks: the rule exact and fuzzy dedup share.

A group is the records of one text (exact dedup) or one connected component of near-duplicates (fuzzy dedup). A
document is named by ``task << 32 | row``, its input shard's task and its row there; tasks are numbered in the sources'
list order (their rank), then shard by shard.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

ROW_BITS = 32

Policy = Literal["cross_source", "one_per_cluster"]
"""``cross_source`` (Zyda-2): keep every member of the group's highest-ranked source and remove the others' members, so
duplicates inside one source stay; ``one_per_cluster``: keep only the first member (best rank, then shard, then row)."""
POLICIES = ("cross_source", "one_per_cluster")


def pack(task: int | np.ndarray, row: int | np.ndarray) -> np.ndarray:
    """A document's name: its task and its row in one int64."""
    return (np.asarray(task, dtype=np.int64) << ROW_BITS) | np.asarray(row, dtype=np.int64)


def unpack(doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The task and row of packed document names."""
    return doc >> ROW_BITS, doc & ((1 << ROW_BITS) - 1)


def member_keys(nodes: np.ndarray, rank_of_task: np.ndarray, policy: str) -> np.ndarray:
    """What a group keeps its least of: the node itself (``one_per_cluster``) or its source's rank (``cross_source``)."""
    if policy == "one_per_cluster":
        return nodes
    if policy != "cross_source":
        raise ValueError(f"dedup policy {policy!r} is not one of {', '.join(POLICIES)}")
    return rank_of_task[unpack(nodes)[0]]


def removals(nodes: np.ndarray, clusters: np.ndarray, rank_of_task: np.ndarray, policy: str) -> np.ndarray:
    """Which grouped documents to remove (a bool per node; ``clusters`` numbers each node's group): ``cross_source``
    removes members of every source ranked below the group's best, ``one_per_cluster`` all but the first member."""
    keys = member_keys(nodes, rank_of_task, policy)
    best = np.full(clusters.max() + 1 if len(clusters) else 0, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, clusters, keys)
    return keys > best[clusters]
