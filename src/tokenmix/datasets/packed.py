"""Packed examples: whole documents laid side by side in ``seq_len`` tokens, each its own segment.

``PackedDataset`` plugs into ``MixtureDataset`` (and the loader) like ``TokenSeqDataset``: same
``Dataset`` protocol, ``tokens_per_example``, reads written straight into a ``TokenBatch``. An
example holds the pieces of one packing plan entry (``packing.py``): the segment ids number them from
0, padding after them has segment id -1, the pad token and no loss, and ``TokenBatch.positions()``
restarts at 0 in every segment. Position i is trained on when token i + 1 is in the same piece and,
where the cache stores loss spans (supervised, chat), is one the format trains on.

Documents are packed in cache order, or shuffled (a full permutation, which needs the finished cache,
or permutations within eras of ``shuffle`` documents, which a growing cache's prefix allows). The plan
is computed from the offsets with vectorized numpy and kept next to the cache (``cache/plans.py``),
growing with the cache and reused by every run with the same options; the plan id is a hash of the
cache fingerprint and every option, and the options are checked again when a plan is opened.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from tokenmix.cache.damage import CacheDamagedError
from tokenmix.cache.ledger import fingerprint_of
from tokenmix.cache.plans import PlanStore, plan_location
from tokenmix.cache.reader import TokenCache
from tokenmix.cache.store import DocumentDamagedError
from tokenmix.datasets.base import DirectDataset, TokenBatch
from tokenmix.datasets.cache_ranges import checked_subset, copy_ranges, keep_targets, split_at_chunks
from tokenmix.datasets.documents import CacheDocuments
from tokenmix.datasets.order import SourceOrder, resolvable
from tokenmix.datasets.packing import document_pieces, next_fit
from tokenmix.datasets.segments import expand_counts
from tokenmix.datasets.settings import LongDocuments, Shuffle, check_packing, check_shuffle

logger = logging.getLogger(__name__)

PAD_SEGMENT = -1


class PackedDataset(DirectDataset):
    """Examples of ``seq_len`` tokens packed from whole documents of a cache, with segment ids and loss masks."""

    def __init__(
        self,
        cache: TokenCache,
        seq_len: int,
        source_id: int = 0,
        *,
        pad_id: int,
        max_segments_per_example: int | None = 64,
        long_documents: LongDocuments = "truncate",
        shuffle: Shuffle = False,
        key: int = 0,
        documents: np.ndarray | None = None,
        persist: bool = True,
    ):
        """``documents``: sorted row numbers to pack (the cache must be finished); None packs every row.
        ``persist``: keep the plan next to the cache (and reuse one found there)."""
        check_packing(max_segments_per_example, long_documents, seq_len)
        check_shuffle(shuffle, f"packing {cache.location}")
        self.cache = cache
        self.seq_len = seq_len
        self.source_id = source_id
        self.pad_id = pad_id
        self.max_segments = max_segments_per_example
        self.long_documents = long_documents
        self.shuffle = shuffle
        self.key = key
        self._docs = CacheDocuments(cache)
        self._subset = None if documents is None else checked_subset(self._docs, documents)
        self.options = {
            "cache_fingerprint": cache.fingerprint,
            "seq_len": seq_len,
            "max_segments_per_example": max_segments_per_example,
            "long_documents": long_documents,
            "shuffle": shuffle,
            "key": key,
            "documents": None if self._subset is None else _digest(self._subset),
        }
        self.plan_id = fingerprint_of(self.options)
        self.location = plan_location(cache.location, self.plan_id)
        self._example_bounds = np.zeros(1, np.int64)
        """Piece index where each planned example begins, and where the last one ends."""
        self._piece_row = np.empty(0, np.int64)
        self._piece_start = np.empty(0, np.int64)
        self._piece_size = np.empty(0, np.int64)
        self._next = (0, 0)
        """Where the open example begins: (position in the document order, piece of that document)."""
        self._complete = False
        self._planning = threading.Lock()
        self._stats = {"documents": 0, "pieces": 0, "tokens": 0, "truncated_tokens": 0, "loss_valid_tokens": 0}
        self._bounds_hash = hashlib.blake2b(digest_size=16)
        self._bounds_hashed = 0
        """How many document bounds ``_bounds_hash`` has taken in (it grows with the cache, hashing each once)."""
        self._persist = persist
        self._store: PlanStore | None = PlanStore(self.location, self.options) if persist else None
        if self._store is not None:
            self._load()
        self._extend()

    def __repr__(self) -> str:
        return f"PackedDataset({self.cache.location!r}, seq_len={self.seq_len}, plan {self.plan_id})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to a loader's reader process), a packed dataset is how it was made: the other side opens the cache
        again and loads the stored plan (or plans the same again, without ``persist``), never a copy of the plan."""
        made = partial(PackedDataset, pad_id=self.pad_id, max_segments_per_example=self.max_segments, long_documents=self.long_documents,
                       shuffle=self.shuffle, key=self.key, documents=self._subset, persist=self._persist)
        return made, (self.cache, self.seq_len, self.source_id)

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        self._extend()
        return len(self._example_bounds) - 1

    def final_len(self) -> int | None:
        self._extend()
        return len(self._example_bounds) - 1 if self._complete else None

    def stats(self) -> dict[str, Any]:
        """Packing statistics of the examples planned so far: efficiency is real tokens over example tokens."""
        examples = len(self._example_bounds) - 1
        capacity = examples * self.seq_len
        out: dict[str, Any] = {"examples": examples, **self._stats, "padding_tokens": capacity - self._stats["tokens"]}
        out["packing_efficiency"] = self._stats["tokens"] / capacity if capacity else 0.0
        out["segments_per_example"] = self._stats["pieces"] / examples if examples else 0.0
        out["complete"] = self._complete
        return out

    # planning

    def _available(self) -> int:
        """Positions of the document order that can be resolved now."""
        if self._subset is not None:
            return len(self._subset)
        rows = self._docs.rows
        return rows if self._docs.finished else resolvable(self.shuffle, rows)

    def _order(self, positions: np.ndarray) -> np.ndarray:
        """The cache rows at positions of the document order."""
        if self.shuffle is False:
            picked = positions
        else:
            total = len(self._subset) if self._subset is not None else (self._docs.rows if self._docs.finished else None)
            picked = SourceOrder(total, self.key, self.shuffle)(positions)
        return picked if self._subset is None else self._subset[picked]

    def _extend(self) -> None:
        """Plan the examples the documents committed since the last look allow."""
        if self._complete:
            return
        with self._planning:
            if not self._complete:
                self._plan_more()

    def _plan_more(self) -> None:
        self._docs.refresh()
        available = self._available()
        complete = self._docs.finished
        position, skip = self._next
        if available <= position and not complete:
            return
        rows = self._order(np.arange(position, available, dtype=np.int64)) if available > position else np.empty(0, np.int64)
        bounds = self._docs.bounds
        owner, offset, size = document_pieces(bounds[rows + 1] - bounds[rows], self.seq_len, self.long_documents)
        if skip:  # pieces of the first document already placed in closed examples
            keep = (owner > 0) | (offset >= skip * self.seq_len)
            owner, offset, size = owner[keep], offset[keep], size[keep]
        starts, open_at = next_fit(size, self.seq_len, self.max_segments, complete)
        added = self._add(rows, owner[:open_at], offset[:open_at], size[:open_at], starts, open_at)
        if open_at < len(size):
            self._next = (position + int(owner[open_at]), int(offset[open_at]) // self.seq_len if self.long_documents == "split" else 0)
        else:
            self._next = (available, 0)
        self._complete = complete
        if self._store is not None and (added or complete):
            self._save(len(starts))
        if complete:
            stats = self.stats()
            logger.info("%s: %d examples of %d tokens packed from %d documents, packing efficiency %.3f (%d segments, %d tokens truncated)",
                        self, stats["examples"], self.seq_len, stats["documents"], stats["packing_efficiency"], stats["pieces"],
                        stats["truncated_tokens"])

    def _add(self, rows: np.ndarray, owner: np.ndarray, offset: np.ndarray, size: np.ndarray, starts: np.ndarray, end: int) -> int:
        """Append closed examples (pieces ``[0, end)`` of the new ones, examples beginning at ``starts``) to the plan."""
        if not len(starts):
            return 0
        bounds = self._docs.bounds
        piece_row = rows[owner]
        piece_start = bounds[piece_row] + offset
        base = len(self._piece_row)
        self._count(piece_row, offset, piece_start, size)
        # pieces before examples: a reader that sees an example sees its pieces
        self._piece_row = np.concatenate([self._piece_row, piece_row])
        self._piece_start = np.concatenate([self._piece_start, piece_start])
        self._piece_size = np.concatenate([self._piece_size, size])
        self._example_bounds = np.concatenate([self._example_bounds[:-1], starts + base, [end + base]])
        return len(starts)

    def _count(self, piece_row: np.ndarray, offset: np.ndarray, piece_start: np.ndarray, size: np.ndarray) -> None:
        bounds = self._docs.bounds
        first = offset == 0 if self.long_documents == "split" else np.ones(len(offset), bool)
        lengths = bounds[piece_row + 1] - bounds[piece_row]
        self._stats["documents"] += int(first.sum())
        self._stats["pieces"] += len(size)
        self._stats["tokens"] += int(size.sum())
        if self.long_documents != "split":
            self._stats["truncated_tokens"] += int((lengths - size).sum())
        self._stats["loss_valid_tokens"] += int(self._docs.target_counts(piece_start + 1, piece_start + size).sum())

    # the plan next to the cache

    def _load(self) -> None:
        """Take the stored plan where it is this cache's. A damaged one is planned again, as one that does not match: a
        plan is made from the cache alone, so no reader needs it repaired."""
        assert self._store is not None
        try:
            plan = self._store.read()
        except DocumentDamagedError as e:
            return self._planning_past(e)
        if plan is None:
            return
        rows_seen = plan["rows_seen"]
        self._docs.refresh()
        if rows_seen > self._docs.rows or _digest(self._docs.bounds[: rows_seen + 1]) != plan["rows_digest"]:
            logger.warning("%s: the stored packing plan does not match the cache's documents (rebuilt in place?); planning again",
                           self.location)
            return
        if plan["complete"] and not (self._docs.finished and self._docs.rows == rows_seen):
            logger.info("%s: the cache has grown since its packing plan was completed; planning again", self.location)
            return
        examples, pieces = plan["examples"], plan["pieces"]
        try:
            example_bounds, piece_row = self._store.read_arrays(examples, pieces)
        except (CacheDamagedError, DocumentDamagedError) as e:
            return self._planning_past(e)
        bounds = self._docs.bounds
        lengths = bounds[piece_row + 1] - bounds[piece_row]
        if self.long_documents == "split":
            new_run = np.ones(len(piece_row), bool)
            new_run[1:] = piece_row[1:] != piece_row[:-1]
            index = np.arange(len(piece_row))
            offset = (index - np.maximum.accumulate(np.where(new_run, index, 0))) * self.seq_len
        elif self.long_documents == "truncate_start":
            offset = np.maximum(lengths - self.seq_len, 0)
        else:
            offset = np.zeros(len(piece_row), np.int64)
        self._example_bounds = example_bounds
        self._piece_row = piece_row
        self._piece_start = bounds[piece_row] + offset
        self._piece_size = np.minimum(lengths - offset, self.seq_len)
        self._next = (plan["next_position"], plan["next_piece"])
        self._complete = plan["complete"]
        self._stats = dict(plan["stats"])

    def _planning_past(self, damage: OSError | ValueError) -> None:
        logger.warning("%s: the stored packing plan is damaged (%s); planning again (where it cannot be stored over the damage, "
                       "delete %s to have it stored anew)", self.location, damage, self.location)

    def _save(self, new_examples: int) -> None:
        assert self._store is not None
        examples = len(self._example_bounds) - 1
        first = examples - new_examples
        piece_counts = np.diff(self._example_bounds[first:])
        plan = {
            "examples": examples,
            "pieces": len(self._piece_row),
            "next_position": self._next[0],
            "next_piece": self._next[1],
            "complete": self._complete,
            "rows_seen": self._docs.rows,
            "rows_digest": self._bounds_digest(),
            "stats": self._stats,
        }
        written = self._store.write(first, int(self._example_bounds[first]), self._piece_row[self._example_bounds[first]:], piece_counts, plan)
        if not written:
            self._store = None

    def _bounds_digest(self) -> str:
        """``_digest`` of the document bounds seen so far, hashing only the ones new since the last call."""
        bounds = self._docs.bounds
        self._bounds_hash.update(np.ascontiguousarray(bounds[self._bounds_hashed :], np.int64).tobytes())
        self._bounds_hashed = len(bounds)
        return self._bounds_hash.copy().hexdigest()

    # reading

    def _write(self, idx: np.ndarray, out: TokenBatch, rows: np.ndarray) -> Callable[[], None]:
        length = self.seq_len
        example_bounds = self._example_bounds  # then the piece arrays, at least as long (see _add)
        first = example_bounds[idx]
        counts = example_bounds[idx + 1] - first
        example, segment = expand_counts(counts)
        piece = first[example] + segment
        start, size = self._piece_start[piece], self._piece_size[piece]
        before = np.cumsum(size) - size
        column = before - before[np.cumsum(counts) - counts][example]
        out.tokens[rows] = self.pad_id
        sub, chunk_begin, chunk_size = split_at_chunks(start, size, self.cache.chunk_tokens)
        dest = rows[example[sub]] * length + column[sub] + chunk_begin - start[sub]
        finish = copy_ranges(self.cache, chunk_begin, chunk_size, dest, out, int(self._docs.bounds[-1]))
        # segment k begins at its column: a mark there and a running sum number the segments; padding follows
        filled = np.add.reduceat(size, np.cumsum(counts) - counts) if len(idx) else np.zeros(0, np.int64)
        at = example * length + column
        segment_ids = np.zeros((len(idx), length), np.int32)
        segment_ids.reshape(-1)[at[segment > 0]] = 1
        np.cumsum(segment_ids, axis=1, out=segment_ids)
        padding = np.arange(length) >= filled[:, None]
        segment_ids[padding] = PAD_SEGMENT
        # position i of a piece learns token i + 1 of the same piece, where the format trains on it
        loss_mask = ~padding
        loss_mask.reshape(-1)[at + size - 1] = False
        keep_targets(self._docs, loss_mask, at, start, size - 1)
        out.segment_ids[rows] = segment_ids
        out.loss_mask[rows] = loss_mask
        out.source_ids[rows] = self.source_id
        return finish


def _digest(values: np.ndarray) -> str:
    """A short hash of an int64 array (document bounds, a document subset)."""
    return hashlib.blake2b(np.ascontiguousarray(values, np.int64).tobytes(), digest_size=16).hexdigest()
