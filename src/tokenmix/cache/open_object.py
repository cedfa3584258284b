"""The one small object a reader opens a finished cache from.

Opening a cache from its parts reads its ledger, each array's zarr metadata and the row ends (an offsets shard index
and chunk): five requests on an object store, and the ledger carries the build's record (shards, runs) that reading
never uses. When a build finishes it writes, as ``OPEN_FILE``, what reading needs: the identity and counts of the
ledger, the stored zarr metadata of every array (tensorstore opens them without reading it again) and the row ends
(up to ``ROW_ENDS_HELD`` rows), zstd-compressed and followed by a crc32c of the bytes before it, so that a flipped bit
or a cut-short object is refused, never read as another cache. A cache without one (built before it existed, still
building, or being extended: its build removes it first) opens from its parts, checked as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
import tensorstore as ts
import zstandard

from tokenmix.cache.ledger import CacheLedger
from tokenmix.cache.shard_reads import ShardLayout
from tokenmix.cache.store import LOSS_SPANS_ARRAY, TOKENS_ARRAY, JaggedArray, open_kvstore

OPEN_FILE = "open.bin"
FORMAT = 1
ROW_ENDS_HELD = 1 << 16
"""Row ends the object holds at most (512 KiB before compression): past that a reader reads them from the offsets
array, as a cache without the object does, so that the object stays small."""
SHARD_INDEXES_HELD = 4
"""Token shards whose indexes the object holds: every one of a cache of at most this many (4 KiB each, mostly empty in
a small cache's one shard), so that a small source's first read fetches only its chunks; of a larger cache the last,
partial one only (a reader would otherwise fetch that shard whole), the others read once each when first touched."""
_ARRAYS = tuple(f"{name}/{part}" for name in (TOKENS_ARRAY, LOSS_SPANS_ARRAY) for part in ("data", "offsets"))


class OpenObjectDamagedError(OSError):
    """A cache's open object failed its check; the message names it and the fix."""

    def __init__(self, location: str, problem: str):
        self.location, self.problem = location, problem
        super().__init__(f"cache at {location}: its {OPEN_FILE} (what a reader opens a finished cache from) is damaged: "
                         f"{problem}. Delete {OPEN_FILE} (the cache then opens from its ledger and arrays, every read "
                         "checked), or delete the cache and build it again.")


@dataclass(frozen=True)
class OpenRecord:
    """What a reader needs to open a finished cache."""

    ledger: CacheLedger
    """The finished ledger's identity, rows and tokens (no shards, no runs: those are the build's)."""
    metadata: dict[str, dict[str, Any]]
    """Each stored array (``input_ids/data``, ...) by name: its zarr metadata as stored."""
    row_ends: np.ndarray | None
    """``offsets[1 : rows + 1]`` of the tokens, or None past ``ROW_ENDS_HELD`` rows."""
    shard_indexes: dict[int, bytes]
    """Stored indexes of shards of the tokens by shard (``SHARD_INDEXES_HELD``; none in a layout ``shard_reads.py`` does
    not read)."""


def write_open_object(location: str, ledger: CacheLedger, tokens: JaggedArray, deferred_sync: bool = False) -> None:
    """Store the open object of the cache at ``location``, once its build has committed ``ledger`` as finished
    (``tokens``: its token rows, to read the row ends from). ``deferred_sync``: written by a build, durable at its next
    ``store.make_durable``."""
    kv = open_kvstore(location, deferred_sync)
    metadata = {}
    for name in _ARRAYS:
        stored = kv.read(f"{name}/zarr.json").result()
        if stored.state == "value":
            metadata[name] = json.loads(bytes(stored.value))
    ends = tokens.row_ends(0, ledger.rows) if ledger.rows <= ROW_ENDS_HELD else None
    layout = ShardLayout.from_metadata(metadata.get(f"{TOKENS_ARRAY}/data", {}))
    shards = -(-ledger.tokens // layout.shard) if layout is not None else 0
    held = list(range(shards)) if shards <= SHARD_INDEXES_HELD else [shards - 1]
    reads = [kv.read(f"{TOKENS_ARRAY}/data/c/{s}", byte_range=slice(0, layout.index_bytes)) for s in held]  # type: ignore[union-attr]
    indexes = {s: bytes(read.result().value) for s, read in zip(held, reads)}
    head = json.dumps({"format": FORMAT, "identity": ledger.identity, "rows": ledger.rows, "tokens": ledger.tokens,
                       "metadata": metadata, "row_ends": None if ends is None else len(ends),
                       "shard_indexes": [[s, len(index)] for s, index in indexes.items()]}, sort_keys=True).encode("utf-8")
    body = (len(head).to_bytes(4, "little") + head + (b"" if ends is None else ends.astype("<i8").tobytes())
            + b"".join(indexes.values()))
    packed = zstandard.ZstdCompressor(level=3).compress(body)
    kv.write(OPEN_FILE, packed + google_crc32c.value(packed).to_bytes(4, "little")).result()


def forget_open_object(location: str, deferred_sync: bool = False) -> None:
    """Remove the open object before a build changes the cache (extends it): readers then open it from its parts.
    Looked for first: a delete is a write (on a local disk, a file created and renamed), and most caches have none.
    ``deferred_sync``: as ``write_open_object``'s."""
    kv = open_kvstore(location, deferred_sync)
    if kv.read(OPEN_FILE).result().state == "value":
        kv.write(OPEN_FILE, None).result()


def read_open_object(kv: ts.KvStore, location: str) -> OpenRecord | None:
    """The open object of the cache at ``location`` (``kv``: its store), None where there is none; a damaged one raises
    ``OpenObjectDamagedError``."""
    stored = kv.read(OPEN_FILE).result()
    if stored.state != "value":
        return None
    raw = bytes(stored.value)
    if len(raw) < 4 or google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise OpenObjectDamagedError(location, "checksum mismatch" if len(raw) >= 4 else "cut short")
    try:
        body = zstandard.ZstdDecompressor().decompress(raw[:-4])
        size = int.from_bytes(body[:4], "little")
        head = json.loads(body[4 : 4 + size])
    except (zstandard.ZstdError, ValueError) as e:
        raise OpenObjectDamagedError(location, f"undecodable ({e})") from None
    if head.get("format") != FORMAT:
        raise OpenObjectDamagedError(location, f"format {head.get('format')!r}, this tokenmix reads format {FORMAT}")
    at = 4 + size
    count = head["row_ends"]
    ends = None if count is None else np.frombuffer(body[at : at + 8 * count], "<i8")
    at += 0 if count is None else 8 * count
    indexes = {}
    for shard, length in head["shard_indexes"]:
        indexes[shard] = body[at : at + length]
        at += length
    if (ends is not None and len(ends) != count) or at != len(body):
        raise OpenObjectDamagedError(location, f"{len(body)} bytes where its header says {at}")
    ledger = CacheLedger(identity=head["identity"], shards=[], rows=head["rows"], tokens=head["tokens"], finished=True)
    return OpenRecord(ledger, head["metadata"], ends, indexes)
