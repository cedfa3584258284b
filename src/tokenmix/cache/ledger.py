"""The ledger: what a cache was made from and how far its build has got.

The ledger is the build's commit record. It holds the cache's identity (tokenizer fingerprint,
format, options) and, for every listed input shard in order, how many record positions have been
consumed and what became of them. It is rewritten atomically after the rows it counts are
durable, and before they are published, so a resumed build continues exactly where the ledger
says and a crash between the two steps only delays publication.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenmix.sources.urls import shard_name

LEDGER_FILE = "ledger.json"
EMPTY_LEDGER = "empty (a write of it cut short, by a power loss)"
"""What is wrong with a ledger left empty beside the arrays (whose fix is to delete the cache and build it again: a build
refuses rows published that no ledger accounts for)."""
LEDGER_VERSION = 1


class CacheMismatchError(ValueError):
    """An existing cache was made with a different tokenizer, format or options."""


class ShardListMismatchError(ValueError):
    """The configured shard list is not an extension of the one the cache was built from."""


class ShardChangedError(ValueError):
    """An input shard is not what the cache was built from: its size, modification time or ETag changed."""


RETRIED_REASONS = frozenset({"missing_file", "unreadable_file"})
"""Shard failures that may pass (a file not there yet, storage briefly unreachable): under ``on_error: skip`` such a
shard is tried again by the next build. Bad content (truncated, corrupt, malformed, trailing junk) is not: it is skipped
for good."""
CHECKED_END_REASONS = frozenset({"malformed_json", "trailing_junk"})
"""Shard failures found with the shard's compressed stream read and checked to its end: a shard whose records are
verified only at its end (``Shard.verified_at_end``) keeps the rows read before them. After any other failure
(``corrupt_shard``, ``truncated_file``, a retried one) its checksums failed or were never reached, and it keeps none."""


def fingerprint_of(identity: dict[str, Any]) -> str:
    """A short stable hash of a cache identity."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:16]


@dataclass
class ShardProgress:
    """The account of one input shard: positions consumed and what they became."""

    name: str
    position: int = 0
    records: int = 0
    rows: int = 0
    tokens: int = 0
    chars: int = 0
    utf8_bytes: int = 0
    loss_tokens: int = 0
    """Positions trained on (formats that mask the loss): target tokens that do not start their document."""
    skipped: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    finished: bool = False
    source: dict[str, Any] | None = None
    """The input's identity (``Shard.identity``: size and mtime, ETag or hash) when its reading began."""
    digest: int | None = None
    """``RawChunk.digest`` summed over the records read so far (positions before ``position``): when ``source`` changes,
    the build reads them again and goes on only if they are the same. None where reading began before digests were kept."""
    retry: str | None = None
    """The transient failure (``missing_file``, ``unreadable_file``) this shard was skipped for under ``on_error: skip``:
    the next build tries it again, appending its rows after those already in the cache."""

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def to_json(self) -> dict[str, Any]:
        """The account as JSON: ``dataclasses.asdict`` without its deep copy (a ledger of a thousand shards is written at
        every commit)."""
        return {**vars(self), "skipped": dict(self.skipped), "source": None if self.source is None else dict(self.source)}


@dataclass(frozen=True)
class Run:
    """Consecutive rows read from one shard: where they start and stop in the rows, tokens and loss-span values."""

    shard: int
    position: int
    """The first record position they were read from."""
    row: int
    stop_row: int
    token: int
    stop_token: int
    span: int
    stop_span: int | None
    """None for the last run: where the loss-span values end is not in the ledger."""


ENCODING_KEY = "encoding"
"""The ledger ``info`` entry naming the libraries and code that encoded the cache's rows (``encoding_continuity.py``)."""


@dataclass
class CacheLedger:
    """The commit record of one cache (one source, one split)."""

    identity: dict[str, Any]
    shards: list[ShardProgress]
    rows: int = 0
    tokens: int = 0
    finished: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """What made the cache, for people (tokenizer path, source, split), and under ``ENCODING_KEY`` the libraries and code
    that encoded its rows, which a build adding rows checks (``encoding_continuity.py``); not compared on open."""
    version: int = LEDGER_VERSION
    runs: list[list[int]] | None = None
    """Where the rows came from, in row order: ``[shard, position, row, token, span]`` for each run of consecutive rows
    read from one shard (its index), from record ``position`` on, starting at ``row``, ``token`` and loss-span value
    ``span``. One run per shard, unless a shard skipped for a passing failure was read again after others (its rows then
    follow theirs). What ``tokenmix verify`` checks the row bounds against and ``--repair`` re-reads. None in caches built
    before runs were kept."""

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.identity)

    def to_json(self) -> dict[str, Any]:
        doc = {**vars(self), "identity": json.loads(json.dumps(self.identity)), "shards": [s.to_json() for s in self.shards],
               "info": dict(self.info), "runs": None if self.runs is None else [list(run) for run in self.runs]}
        doc["fingerprint"] = self.fingerprint
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CacheLedger:
        return cls(
            identity=doc["identity"],
            shards=[ShardProgress(**s) for s in doc["shards"]],
            rows=doc["rows"],
            tokens=doc["tokens"],
            finished=doc["finished"],
            info=doc.get("info", {}),
            version=doc["version"],
            runs=doc.get("runs"),
        )

    def copy(self) -> CacheLedger:
        return CacheLedger.from_json(json.loads(json.dumps(self.to_json())))

    def check_identity(self, identity: dict[str, Any], location: str) -> None:
        """Refuse to reuse this cache for a different tokenizer, format or options."""
        if identity == self.identity:
            return
        changed = sorted(k for k in set(identity) | set(self.identity) if identity.get(k) != self.identity.get(k))
        lines = [f"  {k}: cache has {self.identity.get(k)!r}, config asks for {identity.get(k)!r}" for k in changed]
        raise CacheMismatchError(
            f"cache at {location} was built with fingerprint {self.fingerprint}, but the config gives "
            f"{fingerprint_of(identity)}:\n" + "\n".join(lines) + "\nUse another cache_dir, or delete the cache to rebuild it."
        )

    def extend_shards(self, names: list[str], location: str) -> None:
        """Accept a shard list equal to, or extending, the one this cache was built from, shard by shard the same file
        (``shard_name``: a ledger written before local paths were named absolute holds relative ones, resolved here
        against the current directory, as the build that wrote them resolved them). The ledger takes the names given."""
        known = [shard_name(s.name) for s in self.shards]
        if [shard_name(n) for n in names[: len(known)]] != known:
            first = next((i for i, (a, b) in enumerate(zip(known, names)) if a != shard_name(b)), min(len(known), len(names)))
            raise ShardListMismatchError(
                f"cache at {location} was built from {len(known)} shards; the config lists {len(names)} and differs "
                f"at shard {first} (cache: {known[first] if first < len(known) else 'none'!r}, config: "
                f"{names[first] if first < len(names) else 'none'!r}). Shards can only be appended; "
                "use another cache_dir to build from a different list."
            )
        for shard, name in zip(self.shards, names):
            shard.name = name
        if len(names) > len(known):
            self.shards.extend(ShardProgress(n) for n in names[len(known) :])
            self.finished = False

    def changed_source(self, index: int, current: dict[str, Any] | None, location: str) -> ShardChangedError | None:
        """The error for a shard whose input is not what the cache began reading (``current``: its identity now), else None."""
        shard = self.shards[index]
        if shard.source is None or current is None or current == shard.source:
            return None
        changed = ", ".join(f"{k} {shard.source.get(k)!r} -> {current.get(k)!r}" for k in sorted(set(shard.source) | set(current))
                            if shard.source.get(k) != current.get(k))
        state = "was built from" if shard.finished else f"has read the first {shard.position:,} record positions of"
        return ShardChangedError(
            f"{shard.name} changed since the cache at {location} {state} it ({changed}), and the records it read are not the "
            f"same any more: its {shard.rows:,} rows in the cache came from the old content. Restore the original file, or delete "
            "the cache (or use another cache_dir) to rebuild it from the new one."
        )

    def run_extents(self) -> list[Run]:
        """The runs with where each one stops (the next one's start, or the ledger's totals)."""
        runs = self.runs or []
        out = []
        for k, (shard, position, row, token, span) in enumerate(runs):
            last = k + 1 == len(runs)
            stop_row, stop_token, stop_span = (self.rows, self.tokens, None) if last else (runs[k + 1][2], runs[k + 1][3], runs[k + 1][4])
            out.append(Run(shard, position, row, stop_row, token, stop_token, span, stop_span))
        return out

    def note_rows(self, shard: int, position: int, span: int) -> None:
        """Record that the rows about to be appended (at ``rows``, ``tokens`` and loss-span value ``span``) are read
        from shard ``shard``, from record ``position`` on: a new run unless the last rows came from that shard too."""
        if self.runs is not None and (not self.runs or self.runs[-1][0] != shard):
            self.runs.append([shard, position, self.rows, self.tokens, span])


def skipped_totals(shards: Iterable[ShardProgress]) -> dict[str, int]:
    """Skipped records by reason over ``shards``."""
    totals: dict[str, int] = {}
    for shard in shards:
        for reason, n in shard.skipped.items():
            totals[reason] = totals.get(reason, 0) + n
    return dict(sorted(totals.items()))
