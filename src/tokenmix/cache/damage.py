"""Damaged storage, named: which cache, which array, which stored chunks, which rows, and what to do.

Every chunk of a cache's arrays carries a crc32c (zarr3's ``crc32c`` codec, ``store.py``) and every stored object an
index with its own crc32c, so bit rot, a truncated or deleted object and a missing chunk are all caught where the bytes
are read. Tensorstore reports such a failure as one error for a whole read; ``locate`` finds the chunks behind it by
reading each chunk of the range alone, which costs nothing until something is damaged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_NAMED = 5
"""Damaged chunks named one by one in a message; more are counted."""


def element_range(start: int, stop: int) -> str:
    """The elements ``[start, stop)`` in words: ``element 64`` or ``elements 64-127``."""
    return f"element {start:,}" if stop == start + 1 else f"elements {start:,}-{stop - 1:,}"


@dataclass(frozen=True)
class DamagedChunk:
    """One stored chunk whose bytes cannot be trusted."""

    array: str
    """The array under the cache, e.g. ``input_ids/data``."""
    start: int
    stop: int
    """The elements ``[start, stop)`` of the array the chunk holds (tokens of ``data``, row ends of ``offsets``)."""
    problem: str
    """``checksum mismatch``, ``missing``, ``cut short``, ``damaged index`` or ``undecodable``."""
    stored: str = ""
    """The stored object (relative to the array, e.g. ``c/3``) and the chunk's place in it, when known."""

    def describe(self) -> str:
        elements = f" {element_range(self.start, self.stop)}" if self.stop > self.start else ""  # none: a document
        where = f" ({self.stored})" if self.stored else ""
        return f"{self.array}{elements}{where}: {self.problem}"


class CacheDamagedError(OSError):
    """Stored bytes of a cache failed their check: a checksum mismatch, a missing or cut-short object, a damaged index.

    The message names the cache, the array, the chunks, the rows they hold and the fix; never other tokens or zeros."""

    def __init__(self, location: str, chunks: list[DamagedChunk], rows: tuple[int, int] | None = None):
        self.location = location
        self.chunks = chunks
        self.rows = rows
        """The rows ``[first, stop)`` whose tokens or bounds are in the damaged chunks, where the row bounds could be read."""
        named = "; ".join(c.describe() for c in chunks[:MAX_NAMED])
        more = f"; and {len(chunks) - MAX_NAMED} more chunks" if len(chunks) > MAX_NAMED else ""
        held = f" They hold rows {rows[0]:,}-{rows[1] - 1:,}." if rows is not None and rows[1] > rows[0] else ""
        super().__init__(f"cache at {location} is damaged: {named}{more}.{held} Run `tokenmix verify {location} --repair` to "
                         "rebuild the damaged rows from their inputs (a finished cache), or delete the cache and build it again.")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return CacheDamagedError, (self.location, self.chunks, self.rows)

    def with_rows(self, rows: tuple[int, int] | None) -> CacheDamagedError:
        """The same damage, naming the rows it holds."""
        return CacheDamagedError(self.location, self.chunks, rows)


_PROBLEMS = (
    ("shard index", "damaged index"),
    ("Digest mismatch", "checksum mismatch"),
    ("is missing", "missing"),
    ("is not valid for value of size", "cut short"),
    ("Data corruption", "undecodable"),
    ("ZSTD_", "undecodable"),
    ("Blosc error", "undecodable"),
    ("Error decoding", "undecodable"),
)
"""Tensorstore's words for damaged bytes, most specific first. A decoder's error (blosc, zstd) comes before the chunk's
checksum is compared, which tensorstore does once the decoder has read the whole chunk."""
_CODES = {"NOT_FOUND": "missing", "OUT_OF_RANGE": "cut short", "DATA_LOSS": "undecodable"}
"""Status codes that speak of the stored bytes themselves, where no phrase above says more."""
_QUOTED = re.compile(r'"[^"]*"')
"""Quoted paths in a message: a cache named ``zstd-caches`` must not read as damage."""


def problem_of(error: BaseException) -> str | None:
    """What a storage read error says about the stored bytes (``checksum mismatch``, ``missing``, ...), or None for an
    error that is not about them (an unreachable store, a permission)."""
    text = _QUOTED.sub('""', str(error))
    found = next((problem for marker, problem in _PROBLEMS if marker in text), None)
    return found or _CODES.get(text.split(":", 1)[0].strip())


_STORED = re.compile(r'shard entry \{(\d+)\}/\{(\d+)\}.*?"[^"]*?/(c/\d+)"')


def stored_place(error: BaseException) -> str:
    """``c/N, chunk k of n`` as tensorstore names a sharded array's object and entry in a read error, or ``""``."""
    found = _STORED.search(str(error))
    return f"{found.group(3)}, chunk {found.group(1)} of {found.group(2)}" if found else ""


def locate(array: str, start: int, stop: int, unit: int, read: Callable[[int, int], Any]) -> list[DamagedChunk]:
    """The damaged chunks among elements ``[start, stop)`` of an array stored in chunks of ``unit`` elements: each chunk
    is read alone with ``read(begin, end)``, which raises a storage error for damaged bytes."""
    found = []
    first = start - start % unit
    for begin in range(first, stop, unit):
        lo, hi = max(begin, start), min(begin + unit, stop)
        try:
            read(lo, hi)
        except (OSError, ValueError) as e:
            problem = problem_of(e)
            if problem is None:
                raise
            found.append(DamagedChunk(array, begin, begin + unit, problem, stored_place(e)))
    return found
