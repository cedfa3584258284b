"""Reading a cache, finished or still building.

``TokenCache`` sees exactly the committed rows (``offsets[0]``), can wait for more of them or for
the end of the build, and reads many rows in one go by issuing every read before awaiting any.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn
from urllib.parse import urlparse

import numpy as np
import tensorstore as ts

from tokenmix._waiting import poll_until
from tokenmix.cache.chunk_cache import SHARED, ChunkCache
from tokenmix.cache.damage import CacheDamagedError, DamagedChunk
from tokenmix.cache.ledger import EMPTY_LEDGER, LEDGER_FILE, CacheLedger, CacheMismatchError, fingerprint_of
from tokenmix.cache.levanter import LEVANTER_LEDGER, check_levanter_identity, is_levanter, ledger_from_levanter
from tokenmix.cache.open_object import read_open_object
from tokenmix.cache.shard_reads import reads_for
from tokenmix.cache.stats import STATS_FILE
from tokenmix.cache.store import LOSS_SPANS_ARRAY, TOKENS_ARRAY, DocumentDamagedError, JaggedArray, JsonDocuments, write_unit


class CacheNotFoundError(FileNotFoundError):
    """No cache (no ledger) at the location."""


BLOCK_TOKENS = 1 << 18
"""The least a chunk-cache block holds. Stored chunks are small (2^13 tokens, for exact reads); caching them one by one
would cost a lookup per few thousand tokens, so the cache keeps blocks of 2^18, as it did when those were stored whole."""

OBJECT_READS_ENV = "TOKENMIX_OBJECT_READS"
"""How exact reads of a cache on object storage (gs://, s3://) fetch its bytes, unless a reader is told: ``tensorstore``
(its own drivers, the default) or ``fsspec`` (gcsfs, s3fs). Local caches are always read straight from their files."""


_REMOTE_READS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="tokenmix-object-reads")
"""Exact reads of caches on object storage through fsspec wait on the network, so each runs in a thread: the sources of
a batch, and the batches a loader reads ahead, fetch at once (reads through tensorstore's drivers issue their requests
and return, ``ShardedReads.start``, and need none)."""


def chosen_object_reads(object_reads: str | None) -> str:
    """How exact reads of a cache on object storage fetch bytes: ``object_reads``, or where None
    ``$TOKENMIX_OBJECT_READS``, else ``tensorstore``; anything but ``tensorstore`` or ``fsspec`` raises ``ValueError``."""
    object_reads = object_reads or os.environ.get(OBJECT_READS_ENV, "tensorstore")
    if object_reads not in ("tensorstore", "fsspec"):
        raise ValueError(f"object_reads (TOKENMIX_OBJECT_READS) must be tensorstore or fsspec, got {object_reads!r}")
    return object_reads


class TokenCache:
    """Random access to the committed documents of one cache."""

    def __init__(self, location: str, expected_identity: dict[str, Any] | None = None, chunk_cache: ChunkCache = SHARED,
                 object_reads: str | None = None):
        """``object_reads``: how exact reads of a cache on object storage fetch bytes, ``tensorstore`` or ``fsspec``;
        None takes ``$TOKENMIX_OBJECT_READS``, else ``tensorstore``."""
        object_reads = chosen_object_reads(object_reads)
        self.location = location
        self._remote = urlparse(location).scheme in ("gs", "s3")
        self._object_reads = object_reads
        self._chunk_cache = chunk_cache
        self._claimed: tuple[int, ...] | None = None
        """The committed tokens the chunk cache last gave room for, and its size then (empty: refused; None: never
        asked)."""
        self._docs = JsonDocuments(location)
        opened = read_open_object(self._docs.kv, location)
        ledger = opened.ledger if opened is not None else self._read_ledger()
        self._ends_at_open = opened.row_ends if opened is not None else None
        """The row ends of the build finished when the cache was opened, where its open object held them: the first
        ``committed_row_ends`` takes them instead of a read."""
        self._finished_at_open = ledger.finished
        """Whether the build had finished when the cache was opened: the first ``is_finished`` (a dataset opening over
        the cache asks at once) takes that answer instead of a request of its own."""
        self._rows_at_open = ledger.rows if ledger.finished else None
        """The rows of the build finished when the cache was opened: the first ``committed_row_ends`` reads the row
        count and the ends in one read (checking the count)."""
        self._finished_counts = (ledger.rows, ledger.tokens) if ledger.finished and not is_levanter(ledger.identity) else None
        """The rows and tokens of the build finished when the cache was opened, which row ends read from ``offsets`` up
        to its last row must end at: an object of row ends replaced by another whose checksums hold (another cache's)
        gives other ends. (Levanter's ledger does not count tokens.)"""
        if expected_identity is not None and is_levanter(ledger.identity):
            check_levanter_identity(ledger.identity, expected_identity, location)
        elif expected_identity is not None:
            ledger.check_identity(expected_identity, location)
        levanter = is_levanter(ledger.identity)  # Levanter's builder leaves out chunks of zeros: those read as zeros
        self._settled_tokens = int(ledger.tokens) if ledger.finished and self._remote else 0
        """On object storage, the tokens of the build finished when the cache was opened: committed tokens never change,
        so reads below this serve the chunks the cache pool holds without a request; a read past it (the cache was
        extended since) first opens the tokens again, asking the store each time."""
        metadata = opened.metadata if opened is not None else {}
        self._array = JaggedArray.open(location, TOKENS_ARRAY, ledger.identity["dtype"], strict=not levanter,
                                       settled=self._settled_tokens > 0, metadata=_parts(metadata, TOKENS_ARRAY))
        self.identity = {**ledger.identity, "dtype": self._array.dtype.name}
        self.fingerprint = fingerprint_of(self.identity)
        stored = int(self._array.data.chunk_layout.read_chunk.shape[0])
        self._chunk = stored * max(1, BLOCK_TOKENS // stored)
        self._itemsize = self._array.dtype.itemsize
        indexes = opened.shard_indexes if opened is not None else {}
        self._exact = reads_for(self._array.data.spec().to_json()["metadata"], location, f"{TOKENS_ARRAY}/data", object_reads,
                                by_range=bool(indexes))
        if self._exact is not None and self._exact.remote and indexes:
            self._exact.know_indexes(indexes, ledger.tokens)
        self._read_unit = stored if self._exact is not None else int(self._array.data.chunk_layout.write_chunk.shape[0])
        self._spans = (JaggedArray.open(location, LOSS_SPANS_ARRAY, "int64", strict=not levanter, metadata=_parts(metadata, LOSS_SPANS_ARRAY))
                       if self.has_loss_spans else None)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to a loader's reader process), a cache is its location: it opens again there, and must still be the
        cache it was (same identity fingerprint, and its documents so far ending where they ended; it may have grown)."""
        rows = self.num_rows()
        return _reopen, (self.location, self._chunk_cache, self._object_reads, self.fingerprint, rows, self.num_tokens())

    @property
    def chunk_cache(self) -> ChunkCache:
        """The chunk cache this reader keeps blocks in (where ``caches_blocks``)."""
        return self._chunk_cache

    @property
    def object_reads(self) -> str:
        """How exact reads of a cache on object storage fetch bytes: ``tensorstore`` or ``fsspec``."""
        return self._object_reads

    def _read_ledger(self) -> CacheLedger:
        doc = self._docs.read(LEDGER_FILE)
        if doc is not None:
            return CacheLedger.from_json(doc)
        levanter = self._docs.read(LEVANTER_LEDGER)
        if levanter is not None:
            return ledger_from_levanter(levanter)
        if self._docs.empty(LEDGER_FILE):
            raise DocumentDamagedError(self.location, LEDGER_FILE, EMPTY_LEDGER)
        raise CacheNotFoundError(f"no cache at {self.location} (no {LEDGER_FILE}, nor Levanter's {LEVANTER_LEDGER}); build it with "
                                 "`tokenmix build-cache`")

    @property
    def ledger(self) -> CacheLedger:
        """The build's ledger as stored now."""
        return self._read_ledger()

    @property
    def has_loss_spans(self) -> bool:
        """Whether the cache's format trains on some tokens only, so loss spans are stored with the tokens."""
        return bool(self.identity.get("loss_spans"))

    def loss_spans(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The loss spans of rows ``start`` to ``stop - 1``: each span's row, and its ``[begin, end)`` in that row.

        Spans are the token ranges trained on, sorted and disjoint within a row. A cache without loss spans
        (every token trained on) raises ``ValueError``.
        """
        if self._spans is None:
            raise ValueError(f"{self.location}: this cache has no loss spans (its format trains on every token)")
        self._check_rows(start, stop)
        bounds = self._spans.row_bounds(start, stop)
        counts = np.diff(bounds)
        odd = np.flatnonzero((counts < 0) | (counts % 2 != 0))
        if len(odd):
            row = start + int(odd[0])
            self._raise_bounds(self._spans, row, f"row {row:,} has {int(counts[odd[0]]):,} loss-span values, where they are pairs")
        values = self._spans.read_tokens(int(bounds[0]), int(bounds[-1])) if bounds[-1] > bounds[0] else np.empty(0, np.int64)
        rows = np.repeat(np.arange(start, stop, dtype=np.int64), np.diff(bounds) // 2)
        return rows, values[0::2], values[1::2]

    def stats(self) -> dict[str, Any] | None:
        """The statistics document, once the build has finished."""
        return self._docs.read(STATS_FILE)

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    def num_rows(self) -> int:
        """Documents committed so far (grows while the cache builds)."""
        try:
            return self._array.committed_rows()
        except CacheDamagedError:
            if self._read_ledger().rows == 0:  # a build that has not published yet: the count is not stored
                return self._array.committed_rows(unwritten_is_empty=True)
            return self._array.committed_rows()  # stored before the ledger had rows: the first commit came between the reads

    def num_tokens(self) -> int:
        """Tokens in the committed documents."""
        rows = self.num_rows()
        return int(self._checked_ends(rows - 1, self._array.row_ends(rows - 1, rows))[0]) if rows else 0

    def is_finished(self) -> bool:
        """Whether the build has finished (all committed; nothing more will be added)."""
        if self._finished_at_open:
            self._finished_at_open = False
            return True
        return self._read_ledger().finished

    def wait_for_rows(self, n: int, timeout: float | None = None) -> int:
        """Block until at least ``n`` rows are committed, or the build finished with fewer.

        Returns the committed row count. Raises ``TimeoutError`` when ``timeout`` passes first.
        """
        poll_until(
            lambda: self.num_rows() >= n or self.is_finished(),
            timeout,
            lambda: f"{self.location}: {self.num_rows()} of the {n} rows asked for are committed after {timeout} s",
        )
        return self.num_rows()

    def wait_until_finished(self, timeout: float | None = None) -> int:
        """Block until the build has finished; returns the final row count."""
        poll_until(
            self.is_finished,
            timeout,
            lambda: f"{self.location}: build not finished after {timeout} s ({self.num_rows()} rows so far)",
        )
        return self.num_rows()

    def row_bounds(self, start: int, stop: int) -> np.ndarray:
        """Token boundaries of rows ``start`` to ``stop - 1`` (``stop - start + 1`` values)."""
        self._check_rows(start, stop)
        return self._checked_ends(start - 1, self._array.row_bounds(start, stop))

    def committed_row_ends(self, start: int) -> np.ndarray:
        """Where each committed row from ``start`` on ends: the row count and the ends read once each, or, the first time
        on a cache finished when opened, in one read, or none where its open object held them."""
        known, self._rows_at_open = self._rows_at_open, None
        held, self._ends_at_open = self._ends_at_open, None
        if held is not None and known is not None and start <= known:
            return held[start:]
        if known is not None and start <= known:
            count_and_ends = self._array.read(self._array.offsets, 0, known + 1)
            if int(count_and_ends[0]) == known:
                return self._checked_ends(start, count_and_ends[start + 1 :])
        committed = self.num_rows()
        if not 0 <= start <= committed:
            raise IndexError(f"{self.location}: row {start} is outside the {committed} committed rows")
        return self._checked_ends(start, self._array.row_ends(start, committed))

    def _checked_ends(self, start: int, ends: np.ndarray) -> np.ndarray:
        """``ends`` of rows ``start...`` as read from ``offsets`` (row -1 ends at 0), their checksums held: ``CacheDamagedError``
        where a row ends before the one before it, or the last row of the build finished when the cache was opened does
        not end at its tokens (a stored object of row ends holding another's values)."""
        back = np.flatnonzero(np.diff(ends) < 0)
        if len(back):
            row = start + int(back[0]) + 1
            self._raise_bounds(self._array, row, f"row {row:,} ends at token {int(ends[row - start]):,}, before the row before it")
        if self._finished_counts is not None and len(ends) and start + len(ends) == self._finished_counts[0]:
            if int(ends[-1]) != self._finished_counts[1]:
                row, tokens = start + len(ends) - 1, self._finished_counts[1]
                self._raise_bounds(self._array, row, f"the last row ends at token {int(ends[-1]):,}, the ledger says {tokens:,}")
        return ends

    def _raise_bounds(self, jagged: JaggedArray, row: int, problem: str) -> NoReturn:
        """Raise the damage of row ``row``'s stored end in ``jagged`` (the tokens or the loss spans), whose checksums held
        but whose value is not the build's."""
        unit = write_unit(jagged.offsets)
        where = DamagedChunk(f"{jagged.name}/offsets", row + 1, row + 2, f"{problem}: it holds other values than the build "
                             "stored, its checksums intact (another cache's object copied over it?)", f"c/{(row + 1) // unit}")
        raise CacheDamagedError(self.location, [where], (row, row + 1))

    def row_ends(self, start: int, stop: int) -> np.ndarray:
        """Where rows ``start`` to ``stop - 1`` end in the token stream (one read)."""
        self._check_rows(start, stop)
        return self._checked_ends(start, self._array.row_ends(start, stop))

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start`` to ``stop - 1`` of the cache's token stream."""
        self._unsettle(stop)
        return self._array.read_tokens(start, stop)

    def _unsettle(self, end: int) -> None:
        """Before a read of tokens up to ``end``: past the settled tokens, reopen the tokens to ask the store each time."""
        if end > self._settled_tokens > 0:
            self._settled_tokens = 0
            self._array.data = JaggedArray.open(self.location, TOKENS_ARRAY, self._array.dtype.name, strict=not is_levanter(self.identity)).data

    @property
    def chunk_tokens(self) -> int:
        """Tokens per block: the unit of the chunk cache (whole stored chunks, at least ``BLOCK_TOKENS``); reads are cut
        where blocks end."""
        return self._chunk

    def caches_blocks(self, committed_tokens: int) -> bool:
        """Whether reads go through the chunk cache: when it can hold this cache's committed tokens beside the caches
        that claimed room in it first, so that repeated reads are memory copies. Otherwise a block read would
        decompress a whole block for each range and be evicted before it is read again, so ranges are read exactly
        (``read_ranges``). A cache on object storage is always read exactly: a block would fetch 2^18 tokens for each
        example of a cold start, and for each of the few rows a host of many reads; the stored chunks it fetches are
        kept in a pool bounded in bytes instead (``store.OBJECT_CACHE_BYTES``)."""
        if self._remote:
            return False
        asked = (committed_tokens, self._chunk_cache.max_bytes)
        if asked == self._claimed:  # room once given is kept while the cache does not grow (nor the chunk cache shrink)
            return True
        if self._claimed is None:
            weakref.finalize(self, self._chunk_cache.release, self.location, id(self))
        granted = self._chunk_cache.claim(self.location, committed_tokens * self._itemsize, id(self))
        self._claimed = asked if granted else ()
        return granted

    @property
    def read_unit(self) -> int:
        """Tokens per unit of an exact read: ``read_ranges`` takes ranges that stay inside one."""
        return self._read_unit

    def read_ranges(self, begin: np.ndarray, size: np.ndarray, committed_tokens: int) -> Callable[[], list[np.ndarray]]:
        """Start reading token ranges ``[begin, begin + size)`` exactly, each inside one ``read_unit`` and below
        ``committed_tokens``; returns a function that waits and gives each range's tokens.

        The stored bytes are read directly where this layout and store allow (``shard_reads.py``: a chunk that several
        ranges touch is read and decompressed once; by byte range through tensorstore's drivers, its requests issued
        before this returns), else through tensorstore in one storage batch."""
        if self._exact is not None and self._exact.issues_ahead:
            waiting = self._named(lambda: self._exact.start(begin, size, committed_tokens))  # type: ignore[union-attr]
            return lambda: self._named(waiting)
        if self._exact is not None and self._exact.remote:
            fetching = _REMOTE_READS.submit(self._exact.read, begin, size, committed_tokens)
            return lambda: self._named(fetching.result)
        if self._exact is not None:
            tokens = self._named(lambda: self._exact.read(begin, size, committed_tokens))  # type: ignore[union-attr]
            return lambda: tokens
        ranges = [(b, b + m) for b, m in zip(begin.tolist(), size.tolist())]
        self._unsettle(max((e for _, e in ranges), default=0))
        data = self._array.data
        with ts.Batch() as batch:
            reads = [data[b:e].read(batch=batch) for b, e in ranges]
        return lambda: self._array.awaited(data, ranges, reads)

    def _named(self, read: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
        """``read()``, its damage naming the rows it holds."""
        try:
            return read()
        except CacheDamagedError as e:
            raise e.with_rows(self._array.rows_holding(e.chunks)) from None

    def read_chunks(self, chunks: Iterable[int], committed_tokens: int) -> Callable[[], dict[int, np.ndarray]]:
        """Start reading whole chunks of the token stream (their committed part, below ``committed_tokens``).

        Chunks already in the chunk cache are not read again; every missing one is read at once and
        kept decompressed. Returns a function that waits for the reads and maps chunk number to tokens.
        """
        size = self._chunk
        wanted = dict.fromkeys(chunks, size)
        if wanted and (min(wanted) < 0 or max(wanted) * size >= committed_tokens):
            bad = min(wanted) if min(wanted) < 0 else max(wanted)
            raise IndexError(f"{self.location}: chunk {bad} is outside the {committed_tokens} committed tokens")
        last = committed_tokens // size  # the only chunk that may hold fewer committed tokens than a whole one
        if last in wanted:
            wanted[last] = committed_tokens - last * size
        have = self._chunk_cache.get(self.location, wanted)
        ranges = {c: (c * size, c * size + need) for c, need in wanted.items() if c not in have}
        self._unsettle(max((e for _, e in ranges.values()), default=0))
        data = self._array.data
        reads = [data[b:e].read() for b, e in ranges.values()]

        def finish() -> dict[int, np.ndarray]:
            for c, tokens in zip(ranges, self._array.awaited(data, list(ranges.values()), reads)):
                have[c] = tokens
                self._chunk_cache.put((self.location, c), tokens)
            return have

        return finish

    def __getitem__(self, row: int) -> np.ndarray:
        return self.get_rows([row])[0]

    def get_rows(self, rows: Sequence[int]) -> list[np.ndarray]:
        """The tokens of each of ``rows``; all reads are issued together, then awaited."""
        rows = [int(r) for r in rows]
        if not rows:
            return []
        committed = self.num_rows()
        bad = [r for r in rows if not 0 <= r < committed]
        if bad:
            raise IndexError(f"{self.location}: rows {bad[:5]} are outside the {committed} committed rows")
        offsets = self._array.offsets
        ends = self._array.awaited(offsets, [(r, r + 2) for r in rows], [offsets[r : r + 2].read() for r in rows])
        spans = [(0 if r == 0 else int(e[0]), int(e[1])) for r, e in zip(rows, ends)]
        pairs = np.array(spans, np.int64)
        last = self._finished_counts[0] - 1 if self._finished_counts is not None else -1
        for i in np.flatnonzero((pairs[:, 1] < pairs[:, 0]) | (np.array(rows) == last)).tolist():  # those _checked_ends may refuse
            self._checked_ends(rows[i] - 1, pairs[i])
        return self.read_spans(spans)

    def read_spans(self, spans: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """The tokens ``[start, stop)`` of each of ``spans`` of the token stream (committed tokens, such as whole rows);
        all reads are issued together, then awaited."""
        if not spans:
            return []
        self._unsettle(max(e for _, e in spans))
        data = self._array.data
        return self._array.awaited(data, list(spans), [data[s:e].read() for s, e in spans])

    def _check_rows(self, start: int, stop: int) -> None:
        committed = self.num_rows()
        if not 0 <= start <= stop <= committed:
            raise IndexError(f"{self.location}: rows [{start}, {stop}) are outside the {committed} committed rows")


def _parts(metadata: dict[str, dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """The stored metadata of jagged array ``name``'s ``data`` and ``offsets``, of those an open object holds."""
    return {part: metadata[f"{name}/{part}"] for part in ("data", "offsets") if f"{name}/{part}" in metadata}


def _reopen(location: str, chunk_cache: ChunkCache, object_reads: str, fingerprint: str, rows: int, tokens: int) -> TokenCache:
    cache = TokenCache(location, chunk_cache=chunk_cache, object_reads=object_reads)
    same = cache.fingerprint == fingerprint and cache.num_rows() >= rows and (not rows or int(cache.row_ends(rows - 1, rows)[0]) == tokens)
    if not same:
        raise CacheMismatchError(f"{location}: the cache was replaced while it was being read (it was {fingerprint} with {rows} "
                                 f"documents ending at token {tokens}); start the loader again")
    return cache
