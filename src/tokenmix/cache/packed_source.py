"""One source of a pack, read as a finished cache of its own.

A pack is one ordinary cache holding the documents of many small sources of one split, their shards in config order, so
that each source is one contiguous run of its rows and tokens. ``PackedSourceCache`` presents such a run exactly as the
cache of that source built alone would read: its own row and token numbers from 0, its own identity, fingerprint and
statistics, and its own location (where packing plans over it are kept). Every member of a pack opened in a process
reads through one shared ``TokenCache`` of the pack (``open_pack``), and the pack's row bounds are read once and shared,
so a reader of a thousand packed sources holds one set of tensorstore handles and no thread or file per source.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from tokenmix.cache.chunk_cache import SHARED, ChunkCache
from tokenmix.cache.damage import CacheDamagedError
from tokenmix.cache.ledger import CacheLedger, CacheMismatchError
from tokenmix.cache.reader import CacheNotFoundError, TokenCache, chosen_object_reads

_LOCK = threading.Lock()
_PACKS: weakref.WeakValueDictionary[tuple[str, ChunkCache, str], TokenCache] = weakref.WeakValueDictionary()
"""The packs open in this process, by location and how they are read: one ``TokenCache`` while any member reads it."""
_BOUNDS: weakref.WeakKeyDictionary[TokenCache, np.ndarray] = weakref.WeakKeyDictionary()
"""Each open pack's row bounds (``bounds[r]``: where row ``r`` begins), read once for all its members."""


class PackNotFoundError(CacheNotFoundError):
    """No cache where a source's member record says its pack is; the message names the source, the pack and the fix."""

    def __init__(self, member: str, location: str):
        super().__init__(f"{member}: its member record reads rows of the pack at {location}, where there is no cache (deleted?); "
                         "build the caches again (tokenmix build-cache): the sources packed there are built anew")


def open_pack(location: str, fingerprint: str, member: str, chunk_cache: ChunkCache = SHARED,
              object_reads: str | None = None) -> TokenCache:
    """The pack at ``location``, opened once in this process for every member reading it through ``chunk_cache``.

    ``fingerprint``: the pack's, as the record of ``member`` (the location of the source asking) says; a pack found there
    with another fingerprint (rebuilt since the record was written) raises ``CacheMismatchError``, and none there
    ``PackNotFoundError``, each naming the member and the fix. ``object_reads``: as for ``TokenCache`` (None takes
    ``$TOKENMIX_OBJECT_READS``)."""
    key = (location, chunk_cache, chosen_object_reads(object_reads))
    with _LOCK:
        pack = _PACKS.get(key)
        if pack is None or pack.fingerprint != fingerprint:
            try:
                pack = TokenCache(location, chunk_cache=chunk_cache, object_reads=key[2])
            except CacheNotFoundError:
                raise PackNotFoundError(member, location) from None
            if pack.fingerprint != fingerprint:
                raise CacheMismatchError(
                    f"{member}: its member record reads rows of the pack at {location} with fingerprint {fingerprint}, but the "
                    f"pack there has fingerprint {pack.fingerprint} (it was rebuilt after the record was written); delete both "
                    "(or use another cache_dir) and build the caches again")
            _PACKS[key] = pack
    return pack


def _pack_bounds(pack: TokenCache, rows: int) -> np.ndarray:
    """The row bounds of ``pack``, at least ``rows`` rows of them where committed: read once, again only if it grew."""
    with _LOCK:
        bounds = _BOUNDS.get(pack)
        if bounds is None or len(bounds) <= rows:
            bounds = np.concatenate([np.zeros(1, np.int64), pack.committed_row_ends(0)]).astype(np.int64)
            _BOUNDS[pack] = bounds
    return bounds


def _member_bounds(pack: TokenCache, rows: tuple[int, int]) -> tuple[np.ndarray | None, int, int]:
    """The bounds of ``rows`` ``[first, stop)`` of ``pack`` (``stop - first + 1`` values; None where the pack has fewer
    rows), and the pack's rows and committed tokens: a view of the pack's shared bounds, or, where the pack's row ends
    are damaged somewhere, those of ``rows`` read alone, so that only the member holding the damage fails, as only its
    own cache would."""
    first, stop = rows
    try:
        bounds = _pack_bounds(pack, stop)
    except CacheDamagedError:
        count = pack.num_rows()
        return pack.row_bounds(first, stop) if 0 <= first <= stop <= count else None, count, pack.ledger.tokens
    return bounds[first : stop + 1] if 0 <= first <= stop < len(bounds) else None, len(bounds) - 1, int(bounds[-1])


class PackedSourceCache:
    """One source's rows of a pack, read as a finished cache of their own."""

    def __init__(self, pack: TokenCache, location: str, rows: tuple[int, int], tokens: tuple[int, int],
                 identity: dict[str, Any], fingerprint: str, stats: dict[str, Any] | None, ledger: CacheLedger | None = None):
        """``location``: the source's own cache location (where its member record and packing plans are); ``rows`` and
        ``tokens``: its ``[first, stop)`` rows and tokens in the pack; ``identity``, ``fingerprint``, ``stats``: those of
        the source, as its member record holds them; ``ledger``: the finished ledger a cache of the source built alone
        would have (its shards' accounts; what ``tokenmix inspect`` and ``export`` show), if known. A pack whose rows do
        not begin and end at those tokens raises ``CacheMismatchError``."""
        self._pack = pack
        self.location = location
        self.identity = identity
        self.fingerprint = fingerprint
        self._stats = stats
        self._ledger = ledger
        self._first_row, self._stop_row = rows
        self._first_token, self._stop_token = tokens
        own, pack_rows, self._pack_tokens = _member_bounds(pack, rows)
        """``_pack_tokens``: the pack's committed tokens when this member opened: what reads through the pack are bounded
        by, the same for every member, so that the pack's one claim on the chunk cache serves them all."""
        if own is None or (int(own[0]), int(own[-1])) != tokens:
            found = f"holds tokens [{own[0]}, {own[-1]}) in those rows" if own is not None else f"has {pack_rows} rows"
            raise CacheMismatchError(
                f"{location}: its member record says rows {list(rows)} and tokens {list(tokens)} of the pack at {pack.location}, "
                f"which {found}; delete both (or use another cache_dir) and build the caches again")
        self._row_bounds = own
        """Where each of its rows begins in the pack's tokens, and where its last ends."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to a loader's reader process), a member is its record and its pack's location: there it opens the pack
        once for every member (checking the pack's fingerprint and the member's rows again)."""
        pack = self._pack
        return _reopen, (pack.location, pack.fingerprint, pack.chunk_cache, pack.object_reads, self.location,
                         (self._first_row, self._stop_row), (self._first_token, self._stop_token), self.identity,
                         self.fingerprint, self._stats, self._ledger)

    def __repr__(self) -> str:
        return f"PackedSourceCache({self.location!r}: rows [{self._first_row}, {self._stop_row}) of the pack at {self._pack.location!r})"

    @property
    def ledger(self) -> CacheLedger:
        """The finished ledger a cache of the source built alone would have (without runs)."""
        if self._ledger is None:
            raise ValueError(f"{self!r}: opened without its member record's ledger")
        return self._ledger

    @property
    def pack(self) -> TokenCache:
        """The pack this source's rows are read from."""
        return self._pack

    @property
    def dtype(self) -> np.dtype:
        return self._pack.dtype

    @property
    def has_loss_spans(self) -> bool:
        """Whether the format trains on some tokens only, so loss spans are stored with the tokens."""
        return self._pack.has_loss_spans

    def stats(self) -> dict[str, Any] | None:
        """The source's own statistics, as its member record holds them (a copy: a caller's changes stay its own, as with
        ``TokenCache.stats``, which reads them anew)."""
        return copy.deepcopy(self._stats)

    def num_rows(self) -> int:
        return self._stop_row - self._first_row

    def num_tokens(self) -> int:
        return self._stop_token - self._first_token

    def is_finished(self) -> bool:
        """Always: a member record is written once the pack holds all of the source."""
        return True

    def wait_for_rows(self, n: int, timeout: float | None = None) -> int:
        return self.num_rows()

    def wait_until_finished(self, timeout: float | None = None) -> int:
        return self.num_rows()

    def row_bounds(self, start: int, stop: int) -> np.ndarray:
        """Token boundaries of rows ``start`` to ``stop - 1`` (``stop - start + 1`` values), from the shared bounds."""
        self._check_rows(start, stop)
        return self._row_bounds[start : stop + 1] - self._first_token

    def committed_row_ends(self, start: int) -> np.ndarray:
        """Where each row from ``start`` on ends."""
        return self.row_ends(start, self.num_rows())

    def row_ends(self, start: int, stop: int) -> np.ndarray:
        """Where rows ``start`` to ``stop - 1`` end in the source's token stream."""
        self._check_rows(start, stop)
        return self._row_bounds[start + 1 : stop + 1] - self._first_token

    def loss_spans(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The loss spans of rows ``start`` to ``stop - 1``: each span's row, and its ``[begin, end)`` in that row."""
        if not self.has_loss_spans:
            raise ValueError(f"{self.location}: this cache has no loss spans (its format trains on every token)")
        self._check_rows(start, stop)
        rows, begins, ends = self._pack.loss_spans(self._first_row + start, self._first_row + stop)
        return rows - self._first_row, begins, ends

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start`` to ``stop - 1`` of the source's token stream."""
        if not 0 <= start <= stop <= self.num_tokens():
            raise IndexError(f"{self.location}: tokens [{start}, {stop}) are outside its {self.num_tokens()} tokens")
        return self._pack.read_tokens(self._first_token + start, self._first_token + stop)

    @property
    def chunk_tokens(self) -> int:
        """Tokens per block, the pack's: reads are cut where the source's blocks end, and each is read from the one or two
        blocks of the pack it lies in."""
        return self._pack.chunk_tokens

    @property
    def read_unit(self) -> int:
        """Tokens per unit of an exact read, the pack's: a range inside one unit of the source lies in at most two of the
        pack's, read as two ranges and joined."""
        return self._pack.read_unit

    def caches_blocks(self, committed_tokens: int) -> bool:
        """Whether reads go through the chunk cache: whether the pack, all its committed tokens, has room in it (one claim
        for all its members, so ``committed_tokens``, the member's, does not count)."""
        return self._pack.caches_blocks(self._pack_tokens)

    def read_ranges(self, begin: np.ndarray, size: np.ndarray, committed_tokens: int) -> Callable[[], list[np.ndarray]]:
        """Start reading token ranges ``[begin, begin + size)`` exactly, each inside one ``read_unit`` and below
        ``committed_tokens``; returns a function that waits and gives each range's tokens.

        The pack reads them in one go, a range that crosses one of the pack's units as its two pieces, joined here."""
        begin, size = np.asarray(begin, np.int64), np.asarray(size, np.int64)
        self._check_tokens(begin, size, committed_tokens)
        unit = self.read_unit
        if np.any((size > 0) & ((begin + size - 1) // unit != begin // unit)):
            bad = int(np.flatnonzero((size > 0) & ((begin + size - 1) // unit != begin // unit))[0])
            raise ValueError(f"{self.location}: token range [{begin[bad]}, {begin[bad] + size[bad]}) crosses a read unit of {unit} "
                             "tokens; cut ranges where read units end (datasets.cache_ranges.split_at_chunks)")
        start = begin + self._first_token
        cut = (start // unit + 1) * unit
        crossing = np.flatnonzero(start + size > cut)
        pieces = self._pack.read_ranges(np.concatenate([start, cut[crossing]]),
                                        np.concatenate([np.minimum(size, cut - start), start[crossing] + size[crossing] - cut[crossing]]),
                                        self._pack_tokens)
        if not len(crossing):
            return pieces
        count = len(begin)

        def joined() -> list[np.ndarray]:
            read = pieces()
            tokens = read[:count]
            for k, r in enumerate(crossing.tolist()):
                tokens[r] = np.concatenate([tokens[r], read[count + k]])
            return tokens

        return joined

    def read_chunks(self, chunks: Iterable[int], committed_tokens: int) -> Callable[[], dict[int, np.ndarray]]:
        """Start reading whole blocks of the source's token stream (their part below ``committed_tokens``) through the
        pack's blocks in the chunk cache; returns a function that waits and maps block number to tokens.

        A block of the source is a slice of one block of the pack, or of two joined. Damage in those blocks of the pack
        outside the source's tokens (another member's) is not the source's: its spans are then read alone, past it."""
        size = self.chunk_tokens
        committed = min(committed_tokens, self.num_tokens())
        wanted = sorted(set(int(c) for c in chunks))
        if wanted and (wanted[0] < 0 or wanted[-1] * size >= committed):
            bad = wanted[0] if wanted[0] < 0 else wanted[-1]
            raise IndexError(f"{self.location}: chunk {bad} is outside its {committed} committed tokens")
        spans = {c: (self._first_token + c * size, self._first_token + min((c + 1) * size, committed)) for c in wanted}
        blocks = sorted({b for lo, hi in spans.values() for b in (lo // size, (hi - 1) // size)})
        reading = self._pack.read_chunks(blocks, self._pack_tokens)

        def finish() -> dict[int, np.ndarray]:
            try:
                have = reading()
            except CacheDamagedError as e:
                if any(d.start < hi and lo < d.stop for d in e.chunks for lo, hi in spans.values()):
                    raise
                # the damage is another member's, in a block of the pack this member shares: its own cache would not
                # hold it, so its spans are read alone, past the damaged chunks
                return {c: self._pack.read_tokens(lo, hi) for c, (lo, hi) in spans.items()}
            out = {}
            for c, (lo, hi) in spans.items():
                first, last = lo // size, (hi - 1) // size
                head = have[first][lo - first * size : hi - first * size]
                out[c] = head if first == last else np.concatenate([head, have[last][: hi - last * size]])
            return out

        return finish

    def __getitem__(self, row: int) -> np.ndarray:
        return self.get_rows([row])[0]

    def get_rows(self, rows: Sequence[int]) -> list[np.ndarray]:
        """The tokens of each of ``rows``; all reads are issued together, then awaited. Taken by the member's bounds, with
        no read of the pack's row ends (which it shares with other members, their damage included)."""
        rows = [int(r) for r in rows]
        bad = [r for r in rows if not 0 <= r < self.num_rows()]
        if bad:
            raise IndexError(f"{self.location}: rows {bad[:5]} are outside its {self.num_rows()} rows")
        bounds = self._row_bounds
        return self._pack.read_spans([(int(bounds[r]), int(bounds[r + 1])) for r in rows])

    def _check_rows(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.num_rows():
            raise IndexError(f"{self.location}: rows [{start}, {stop}) are outside its {self.num_rows()} rows")

    def _check_tokens(self, begin: np.ndarray, size: np.ndarray, committed_tokens: int) -> None:
        limit = min(committed_tokens, self.num_tokens())
        outside = (begin < 0) | (size < 0) | (begin + size > limit)
        if np.any(outside):
            bad = int(np.flatnonzero(outside)[0])
            raise IndexError(f"{self.location}: token range [{begin[bad]}, {begin[bad] + size[bad]}) is outside its {limit} "
                             "committed tokens")


def _reopen(pack_location: str, pack_fingerprint: str, chunk_cache: ChunkCache, object_reads: str, location: str,
            rows: tuple[int, int], tokens: tuple[int, int], identity: dict[str, Any], fingerprint: str,
            stats: dict[str, Any] | None, ledger: CacheLedger | None) -> PackedSourceCache:
    pack = open_pack(pack_location, pack_fingerprint, location, chunk_cache, object_reads)
    return PackedSourceCache(pack, location, rows, tokens, identity, fingerprint, stats, ledger)
