"""The commit protocol of a build: rows written at the next free row, committed and published in order, never fewer.

A build writes each chunk's rows at the next free row and token as they come. Every ``commit_interval_s``, at the end
and before a build raises, a commit awaits the pending writes, makes them durable, writes the ledger, makes it durable,
then publishes the ledger's rows (``offsets[0]``, loss spans first): what readers see only grows, and never holds rows
whose bytes a power loss could take back. Local writes are made without fsyncs and made durable at those two steps by a
barrier shared with the other caches committing then (``store.make_durable``). A shard verified only at its end
(``Shard.verified_at_end``: a compressed file) is *held* from its first row: nothing is committed until its end, and if
its end refuses its rows they are taken back (the arrays rewound, the ledger as it stood before them), so the next rows
are written in their place and nothing of them was ever published.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from tokenmix.cache.ledger import LEDGER_FILE, CacheLedger, ShardProgress
from tokenmix.cache.lock import BuildLock
from tokenmix.cache.store import (
    LOSS_SPANS_ARRAY,
    TOKENS_ARRAY,
    CacheWriteError,
    JaggedArray,
    JsonDocuments,
    make_durable,
    storage_cause,
)
from tokenmix.formats.encoder import EncodedChunk
from tokenmix.formats.encoder_spec import EncoderSpec


@dataclass
class _HeldShard:
    """A shard verified only at its end whose rows are being written: where the build stood before its first row, to go
    back to if its end refuses them. Nothing is committed while a shard is held."""

    index: int
    progress: ShardProgress
    rows: int
    tokens: int
    span_values: int


class CacheCommits:
    """The arrays and ledger of one build, what of them is committed and published, and the held shard if any."""

    def __init__(self, location: str, ledger: CacheLedger, spec: EncoderSpec, compression: str, commit_interval_s: float,
                 lock: BuildLock | None, fresh: bool = False):
        """Open (or create) the cache's arrays for ``ledger``; ``fresh``: the cache had no ledger, so its arrays are most
        likely absent (``JaggedArray.open``). Raises tensorstore's ``ValueError`` when storage refuses."""
        self.location = location
        self.ledger = ledger
        self.array = JaggedArray.open(location, TOKENS_ARRAY, spec.dtype, create=True, compression=compression, fresh=fresh,
                                      deferred_sync=True)
        self.spans: JaggedArray | None = None
        self.span_values = 0
        """Where the next document's loss spans go in the spans array."""
        if spec.format.masks_loss:
            self.spans = JaggedArray.open(location, LOSS_SPANS_ARRAY, "int64", create=True, fresh=fresh, deferred_sync=True)
            self.span_values = int(self.spans.row_ends(ledger.rows - 1, ledger.rows)[0]) if ledger.rows else 0
        self.published = 0 if self.array.created else self.array.committed_rows(unwritten_is_empty=ledger.rows == 0)
        """Rows readers see (``offsets[0]``): never lowered."""
        if not self.array.created:  # resumed or extended: the objects its writes read back must be sound
            self.array.check_rewritten(ledger.rows, ledger.tokens)
            if self.spans is not None:
                self.spans.check_rewritten(ledger.rows, self.span_values)
        self._docs = JsonDocuments(location, deferred_sync=True)
        self._interval_s = commit_interval_s
        self._lock = lock
        self._writes: list[Any] = []
        self._held: _HeldShard | None = None
        self._last_commit = time.monotonic()

    def write(self, index: int, chunk: EncodedChunk) -> None:
        """Write a chunk of shard ``index`` at the next free row and token (not yet committed)."""
        ledger = self.ledger
        if len(chunk.lengths):
            ledger.note_rows(index, chunk.start, self.span_values)
        self._writes.extend(self.array.write_rows(ledger.rows, ledger.tokens, chunk.tokens, chunk.lengths))
        if self.spans is not None:
            self._writes.extend(self.spans.write_rows(ledger.rows, self.span_values, chunk.spans, chunk.span_counts))
            self.span_values += len(chunk.spans)
        ledger.rows += len(chunk.lengths)
        ledger.tokens += len(chunk.tokens)

    @property
    def holding(self) -> bool:
        """Whether a shard's rows are held (written, not to be committed before its end)."""
        return self._held is not None

    def hold(self, index: int) -> None:
        """Hold shard ``index`` from here, about to write its first row (a shard already held stays held)."""
        if self._held is None:
            shard = self.ledger.shards[index]
            self._held = _HeldShard(index, dataclasses.replace(shard, skipped=dict(shard.skipped)), self.ledger.rows,
                                    self.ledger.tokens, self.span_values)

    def release(self) -> None:
        """The held shard's end keeps its rows: they may be committed."""
        self._held = None

    def take_back(self) -> None:
        """Take back the rows of the held shard: the ledger and the arrays go back to where they stood before its first row,
        so the next rows are written in its place (its tokens, written but never published, are erased)."""
        held, self._held = self._held, None
        assert held is not None
        try:
            for write in self._writes:
                write.result()
            self._writes.clear()
            self.array.rewind(held.rows, held.tokens)
            if self.spans is not None:
                self.spans.rewind(held.rows, held.span_values)
        except ValueError as e:  # tensorstore's storage errors
            raise self.write_failed(e) from e
        ledger = self.ledger
        ledger.rows, ledger.tokens, self.span_values = held.rows, held.tokens, held.span_values
        ledger.shards[held.index] = held.progress
        if ledger.runs is not None:
            ledger.runs = [run for run in ledger.runs if run[2] < held.rows]

    def maybe_commit(self) -> None:
        """Commit if ``commit_interval_s`` has passed since the last commit and no shard is held."""
        if self._held is None and time.monotonic() - self._last_commit >= self._interval_s:
            self.commit()
            self._last_commit = time.monotonic()

    def commit(self) -> None:
        """Await every pending write and make it durable, write the ledger and make it durable, then publish its rows."""
        assert self._held is None, f"{self.location}: committing rows of {self._held.progress.name} before its end"
        if self._lock is not None:
            self._lock.check()
        try:
            self._writes.extend(self.array.flush())
            if self.spans is not None:
                self._writes.extend(self.spans.flush())
            for write in self._writes:
                write.result()
            self._writes.clear()
            make_durable(self.location)  # the rows' tokens and ends, before the ledger says they exist
            self._docs.write(LEDGER_FILE, self.ledger.to_json())
            make_durable(self.location)  # the ledger, before readers see its rows (a resumed build republishes from it)
            self.publish()
        except (ValueError, OSError) as e:  # a full disk, lost permissions, an unreachable bucket, a failed writeback
            raise self.write_failed(e) from e

    def make_durable(self) -> None:
        """Return once every write made so far to the cache is durable (``store.make_durable``); ``CacheWriteError`` when
        the storage fails to make it so."""
        try:
            make_durable(self.location)
        except OSError as e:
            raise self.write_failed(e) from e

    def write_failed(self, error: ValueError | OSError) -> CacheWriteError:
        """The error a failed write of the cache raises: what is kept and what to do."""
        return CacheWriteError(
            f"writing the cache at {self.location} failed: {storage_cause(error)}. Its {self.published:,} committed "
            "rows are kept: fix the storage (free space, permissions) and re-run the build, which resumes from there."
        )

    def publish(self) -> None:
        """Publish the ledger's rows: loss spans first, so a reader never sees a row without its spans; never fewer rows."""
        rows = self.ledger.rows
        assert rows >= self.published, f"{self.location}: publishing {rows} rows after {self.published}"
        if self.spans is not None:
            self.spans.publish(rows)
        self.array.publish(rows)
        self.published = rows
