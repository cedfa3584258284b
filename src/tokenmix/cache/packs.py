"""Packs: many small sources of one split built as one cache, each source read back as a cache of its own.

A cache per source has fixed costs besides encoding: its directory tree (about a dozen files and directories), its lock,
ledger, arrays, open object and statistics, about 10 ms of CPU in all; a thousand sources of 70 k tokens paid four times
their encoding in them. So where one build has at least ``build.pack_min_sources`` small sources of a split to build
(inputs of at most ``build.pack_below_bytes``), it builds them as packs. A pack is an ordinary cache, at
``<cache_dir>/_packs/<split>-<pack id>``, whose shards are its sources' shards in config order, so that each source's
documents are one run of its rows and tokens. Once the pack is finished and durable, each source gets a member record
at its own cache location (``packed.json``): where the pack is (relative to the source's location, so that a cache_dir
can be moved), the pack's fingerprint, the source's rows and tokens in it, the source's identity (what its own cache's
ledger would hold), its shards' accounts and its statistics, with a crc32c of all of it. A reader
(``config.caches.open_cache``) opens a source from its member record as a ``PackedSourceCache`` over the pack, which
every member opened in a process shares.

The pack id is a fingerprint of the pack's identity (its members' encoder identity, the split, and the members with
their shard names), so a re-run of the same build finds the same pack: a pack killed while building resumes from its
ledger, and a pack finished before its member records were all written gets the missing ones. A source whose inputs
changed (a shard appended, another list) no longer matches its record: it is built again (in a new pack with the other
sources left to build, or alone) and its record replaced or removed; the old pack stays for its other members. A source
with a shard skipped for a passing failure (to be tried again), or whose rows in the pack are not one run (such a shard
read again after the others), gets no record: the same build builds it alone, where its shard is tried again as a cache
of its own tries it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from tokenmix.cache.ledger import LEDGER_FILE, CacheLedger, ShardProgress, fingerprint_of
from tokenmix.cache.levanter import LEVANTER_LEDGER, built_by_levanter
from tokenmix.cache.options import PACK_BELOW_BYTES, BuildOptions
from tokenmix.cache.source_checks import SourceChecks
from tokenmix.cache.stats import ALREADY_BUILT, STATS_FILE, stats_document
from tokenmix.cache.store import DocumentDamagedError, JsonDocuments, write_rebuildable
from tokenmix.sources.urls import join_location, local_path

if TYPE_CHECKING:
    from tokenmix.cache.packed_source import PackedSourceCache
    from tokenmix.cache.reader import TokenCache
    from tokenmix.cache.targets import CacheTarget

logger = logging.getLogger(__name__)

PACKS_DIR = "_packs"
"""Under a config's cache_dir: its packs, each at ``<split>-<pack id>``."""
MEMBER_FILE = "packed.json"
"""At a packed source's cache location: its member record."""
MEMBER_FORMAT = 1
PACK_SHARDS = 4096
"""Input shards a pack holds at most: its ledger, rewritten at every commit, lists each of them."""


class MemberDamagedError(OSError):
    """A source's member record failed its check; the message names it and the fix."""

    def __init__(self, location: str, problem: str):
        super().__init__(f"cache at {location}: its {MEMBER_FILE} (where the source's rows are in a pack) is damaged: {problem}. "
                         f"Delete {MEMBER_FILE} and build the caches again: the source is built anew.")


@dataclass(frozen=True)
class MemberRecord:
    """Where a packed source's rows are, and what its own cache would have said of them."""

    pack: str
    """The pack's location relative to the source's cache location (``../../_packs/train-<id>``)."""
    pack_fingerprint: str
    """The fingerprint of the pack's identity: a pack found there with another is not this source's."""
    rows: tuple[int, int]
    """The source's rows ``[start, stop)`` in the pack."""
    tokens: tuple[int, int]
    """Their tokens ``[start, stop)`` in the pack."""
    identity: dict[str, Any]
    """The source's identity: what a cache of it built alone would hold in its ledger."""
    shards: list[ShardProgress]
    """The accounts of the source's shards, as the pack's ledger keeps them."""
    stats: dict[str, Any]
    """The source's statistics, as a cache of it built alone would hold them in ``stats.json``."""
    info: dict[str, Any]
    """What made it, for people (tokenizer, source, split, the pack), as a ledger's ``info``."""

    def ledger(self) -> CacheLedger:
        """The finished ledger a cache of the source built alone would have (without runs)."""
        return CacheLedger(self.identity, [dataclasses.replace(s) for s in self.shards], rows=self.rows[1] - self.rows[0],
                           tokens=self.tokens[1] - self.tokens[0], finished=True, info=dict(self.info))

    def pack_location(self, location: str) -> str:
        """The pack's location, for the source's cache at ``location``."""
        return _resolve(location, self.pack)

    def document(self) -> bytes:
        """The record as stored: its fields as JSON (keys sorted), then their crc32c."""
        body = json.dumps({"format": MEMBER_FORMAT, "pack": self.pack, "pack_fingerprint": self.pack_fingerprint, "rows": list(self.rows),
                           "tokens": list(self.tokens), "identity": self.identity, "shards": [s.to_json() for s in self.shards],
                           "stats": self.stats, "info": self.info}, sort_keys=True)
        return f'{body[:-1]}, "crc32c": {google_crc32c.value(body.encode("utf-8"))}}}\n'.encode()

    @classmethod
    def from_json(cls, doc: dict[str, Any], location: str) -> MemberRecord:
        body = {k: v for k, v in doc.items() if k != "crc32c"}
        if doc.get("crc32c") != _checksum(body):
            raise MemberDamagedError(location, "its checksum does not match its contents")
        if body.get("format") != MEMBER_FORMAT:
            raise MemberDamagedError(location, f"format {body.get('format')!r}, this tokenmix reads {MEMBER_FORMAT}")
        return cls(body["pack"], body["pack_fingerprint"], tuple(body["rows"]), tuple(body["tokens"]), body["identity"],  # type: ignore[arg-type]
                   [ShardProgress(**s) for s in body["shards"]], body["stats"], body["info"])


def _checksum(doc: dict[str, Any]) -> int:
    return google_crc32c.value(json.dumps(doc, sort_keys=True).encode("utf-8"))


def _resolve(location: str, relative: str) -> str:
    """``relative`` (a path with ``..``) taken from ``location``, a path or URL."""
    scheme, sep, path = location.partition("://")
    if not sep:
        return posixpath.normpath(posixpath.join(location, relative))
    return f"{scheme}://{posixpath.normpath(posixpath.join('/' + path, relative)).lstrip('/')}"


def _relative(location: str, target: str) -> str:
    """``target``'s path from ``location`` (both under one cache_dir)."""
    return posixpath.relpath(target.partition("://")[2] or target, location.partition("://")[2] or location)


def read_member(location: str, docs: JsonDocuments | None = None) -> MemberRecord | None:
    """The member record at a source's cache location, or None where there is none."""
    docs = docs or JsonDocuments(location)
    raw = docs.read_bytes([MEMBER_FILE])[0]
    return None if raw is None else _member_record(docs, MEMBER_FILE, raw, location)


def _member_record(docs: JsonDocuments, key: str, raw: bytes, location: str) -> MemberRecord:
    """The member record stored as ``raw`` at ``key`` of ``docs``, the record of the source at ``location``:
    ``MemberDamagedError`` where it is not one (not JSON, cut short, its checksum failed)."""
    try:
        doc = docs.parse(key, raw)
    except DocumentDamagedError as e:
        raise MemberDamagedError(location, e.problem) from None
    return MemberRecord.from_json(doc, location)


def open_member(location: str, record: MemberRecord, identity: dict[str, Any]) -> PackedSourceCache:
    """The packed source at ``location`` as a finished cache, refused (``CacheMismatchError``) where its identity is not
    ``identity``, the one the config asks for."""
    from tokenmix.cache.packed_source import PackedSourceCache, open_pack

    ledger = record.ledger()
    ledger.check_identity(identity, location)
    pack = open_pack(record.pack_location(location), record.pack_fingerprint, location)
    return PackedSourceCache(pack, location, record.rows, record.tokens, record.identity, ledger.fingerprint, record.stats, ledger)


def open_cache_at(location: str, identity: dict[str, Any] | None = None) -> TokenCache | PackedSourceCache:
    """The cache at a location, whatever it is: a cache of its own, or a source's rows in a pack, refused
    (``CacheMismatchError``) where its identity is not ``identity`` (None: not checked, there being no config to check
    it against). The member record is read only where there is no cache of its own."""
    from tokenmix.cache.reader import CacheNotFoundError, TokenCache

    try:
        return TokenCache(location, expected_identity=identity)
    except CacheNotFoundError:
        record = read_member(location)
        if record is None:
            raise
        return open_member(location, record, record.identity if identity is None else identity)


def stored_cache_of(location: str) -> str:
    """Where the cache at ``location`` is stored: the location itself, or the pack holding its source (what ``tokenmix
    verify`` reads and repairs)."""
    docs = JsonDocuments(location)
    if docs.read(LEDGER_FILE) is not None:
        return location
    record = read_member(location, docs)
    return location if record is None else record.pack_location(location)


@dataclass
class Pack:
    """Sources of one split built as one cache: to build, or finished already with some members left without a record."""

    root: str
    """The directory holding the pack (under ``_packs``) and its members' caches."""
    location: str
    split: str
    identity: dict[str, Any]
    """The pack's identity (its fingerprint is its id): the members' encoder identity, the split, and how many members
    and a fingerprint of their names and shard names."""
    sources: list[str]
    """Every member, in the pack's order."""
    first_shards: list[int]
    """Where each member's shards begin among the pack's, and (last) their number."""
    member_identity: dict[str, Any]
    """Each member's identity (the encoder's and the storage layout's)."""
    targets: dict[str, CacheTarget]
    """The members this build writes records for, by source: all of a pack to build."""
    stats: dict[str, Any] | None = None
    """A finished pack's statistics; None for a pack to build."""

    @property
    def shards(self) -> list[Any]:
        """The pack's input shards (of a pack to build): its members', in order."""
        return [shard for source in self.sources for shard in self.targets[source].shards]

    def info(self, tokenizer: str) -> dict[str, Any]:
        """What its ledger records for people, and for a later build finding members it holds: each member with where
        its shards begin."""
        return {"tokenizer": tokenizer, "pack": self.split, "sources": [[s, f] for s, f in zip(self.sources, self.first_shards)]}


@dataclass
class PackPlan:
    """What a build does with the caches of a config: the ones built alone, the packs to build, the finished packs
    holding sources without a record, the packed sources that are built already (their statistics), and the finished
    caches Levanter built, read as they are (of those under a root; ``config.caches`` asks of the others)."""

    alone: list[CacheTarget]
    packs: list[Pack]
    finished: list[Pack]
    built: dict[tuple[str, str], dict[str, Any]]
    levanter: list[CacheTarget]


def plan_packs(targets: Sequence[CacheTarget], options: BuildOptions) -> PackPlan:
    """Sort a build's caches: those with a cache of their own, or too large, or too few to pack, are built alone; packed
    sources whose record still matches their inputs are built already; small ones without a record that a finished
    pack holds (a build stopped before writing every record) get theirs from it; the other small ones go into packs, in
    config order, those of one encoder identity together (at least ``pack_min_sources`` of them, else built alone). A
    stale member record of a source built alone is removed."""
    alone: list[CacheTarget] = [t for t in targets if t.pack_root is None]
    read_as_levanter: list[CacheTarget] = []
    small: dict[tuple[str, str, str], list[CacheTarget]] = {}
    """Small sources to build, by root, split and encoder identity: a pack is encoded with one encoder."""
    built: dict[tuple[str, str], dict[str, Any]] = {}
    recorded: set[int] = set()
    """Small sources holding a stale or damaged record."""
    layout = options.layout_identity()
    for root in dict.fromkeys(t.pack_root for t in targets if t.pack_root is not None):
        below = pack_below_bytes(options, root)
        docs = JsonDocuments(root)
        members = [t for t in targets if t.pack_root == root]
        keys = [f"{_key(t)}/{name}" for t in members for name in (LEDGER_FILE, LEVANTER_LEDGER, MEMBER_FILE)]
        stored = docs.read_bytes(keys)  # a damaged ledger raises; a damaged member record is only built again
        found = [raw if raw is None or k % 3 == 2 else docs.parse(key, raw) for k, (key, raw) in enumerate(zip(keys, stored))]
        records = {k: _record_or_none(docs, keys[3 * k + 2], found[3 * k + 2], t.location) for k, t in enumerate(members)
                   if found[3 * k : 3 * k + 2] == [None, None]}
        packs_there = _finished_pack_fingerprints(root, docs, [r.pack_location(members[k].location) for k, r in records.items() if r])
        for k, target in enumerate(members):
            ledger, levanter, member = found[3 * k : 3 * k + 3]
            if built_by_levanter(ledger, levanter, target.location):
                read_as_levanter.append(target)
                continue
            if ledger is not None:
                alone.append(target)
                continue
            record = records.get(k)
            if (record is not None and packs_there[record.pack_location(target.location)] == record.pack_fingerprint
                    and _still_matches(record, target, {**target.identity, **layout}, options, docs)):
                built[(target.source, target.split)] = {**record.stats, ALREADY_BUILT: True}
                continue
            sizes = [shard.size_bytes() for shard in target.shards]
            if below and None not in sizes and sum(sizes) <= below:  # type: ignore[arg-type]
                small.setdefault((root, target.split, fingerprint_of(target.identity)), []).append(target)
                if member is not None:
                    recorded.add(id(target))
                continue
            if member is not None:
                _remove_record(target)
            alone.append(target)
    packs: list[Pack] = []
    finished: list[Pack] = []
    for (root, split, _), members in small.items():
        recovered = _finished_packs(root, split, members, layout)
        finished.extend(recovered)
        held = {source for pack in recovered for source in pack.targets}
        members = [m for m in members if m.source not in held]
        if len(members) < options.pack_min_sources:
            for member in members:
                if id(member) in recorded:
                    _remove_record(member)
            alone.extend(members)
            continue
        group: list[CacheTarget] = []
        for member in members:
            if group and sum(len(m.shards) for m in group) + len(member.shards) > PACK_SHARDS:
                packs.append(_pack(root, split, group, layout))
                group = []
            group.append(member)
        packs.append(_pack(root, split, group, layout))
    order = {id(t): k for k, t in enumerate(targets)}
    alone.sort(key=lambda t: order[id(t)])
    return PackPlan(alone, packs, finished, built, read_as_levanter)


def pack_below_bytes(options: BuildOptions, root: str) -> int:
    """The input size under which a source under ``root`` is small (``build.pack_below_bytes``; null: ``PACK_BELOW_BYTES``
    for a local root, 0 on object storage)."""
    if options.pack_below_bytes is not None:
        return options.pack_below_bytes
    return PACK_BELOW_BYTES if local_path(root) is not None else 0


def _record_or_none(docs: JsonDocuments, key: str, raw: bytes | None, location: str) -> MemberRecord | None:
    """The member record stored as ``raw`` at ``key``; None where there is none, or a damaged one (logged: the source is
    built again)."""
    if raw is None:
        return None
    try:
        return _member_record(docs, key, raw, location)
    except (MemberDamagedError, KeyError, TypeError) as e:
        logger.warning("%s; building the source again", e)
        return None


def _finished_pack_fingerprints(root: str, docs: JsonDocuments, packs: list[str]) -> dict[str, str | None]:
    """The fingerprint of each finished pack at ``packs`` (locations under ``root``, read together); None for one that is
    not there (deleted) or not finished (being built again): its members' records are stale."""
    where = list(dict.fromkeys(packs))
    found = docs.read_many([f"{_relative(root, pack)}/{LEDGER_FILE}" for pack in where])
    return {pack: doc["fingerprint"] if doc is not None and doc.get("finished") else None for pack, doc in zip(where, found)}


def _remove_record(target: CacheTarget) -> None:
    """Remove the stale record of a source to build alone, so that its own cache is what opens."""
    assert target.pack_root is not None
    JsonDocuments(target.pack_root).kv.write(f"{_key(target)}/{MEMBER_FILE}", None).result()


def _key(target: CacheTarget) -> str:
    """A packable cache's location relative to its root: ``<source>/<split>``."""
    assert target.pack_root is not None and target.location == join_location(target.pack_root, target.source, target.split)
    return f"{target.source}/{target.split}"


def _still_matches(record: MemberRecord, target: CacheTarget, identity: dict[str, Any], options: BuildOptions, docs: JsonDocuments) -> bool:
    """Whether a member record is of the target as configured: the same identity and shards, each shard's records the
    ones the pack read (``SourceChecks``: a shard whose identity changed with its records the same is taken, and the
    record updated; one whose records changed raises ``ShardChangedError``, as for a cache built alone)."""
    if record.identity != identity or [s.name for s in record.shards] != [s.name for s in target.shards]:
        return False
    ledger = record.ledger()
    if SourceChecks(target.location, target.shards, options.chunk_bytes).check_begun(ledger):
        docs.kv.write(f"{_key(target)}/{MEMBER_FILE}", dataclasses.replace(record, shards=ledger.shards).document()).result()
    return True


def _pack(root: str, split: str, members: list[CacheTarget], layout: dict[str, Any]) -> Pack:
    sources = fingerprint_of({"sources": [[m.source, [s.name for s in m.shards]] for m in members]})
    identity = {**members[0].identity, "pack": {"split": split, "members": len(members), "sources": sources}}
    pack_id = fingerprint_of({**identity, **layout})
    first = np.cumsum([0, *(len(m.shards) for m in members)]).tolist()
    return Pack(root, join_location(root, PACKS_DIR, f"{split}-{pack_id}"), split, identity, [m.source for m in members], first,
                {**members[0].identity, **layout}, {m.source: m for m in members})


def _finished_packs(root: str, split: str, members: list[CacheTarget], layout: dict[str, Any]) -> list[Pack]:
    """The finished packs of ``split`` under ``root`` holding some of ``members`` (sources without a valid record) as
    they are configured now: the same shard names and identity. Each pack lists its members in its ledger's ``info``."""
    names = _pack_names(root, split)
    if not names:
        return []
    docs = JsonDocuments(join_location(root, PACKS_DIR))
    found = docs.read_many([f"{name}/{key}" for name in names for key in (LEDGER_FILE, STATS_FILE)])
    wanted = {m.source: m for m in members}
    packs = []
    for k, name in enumerate(names):
        ledger, stats = found[2 * k : 2 * k + 2]
        if ledger is None or stats is None or not ledger["finished"] or "sources" not in ledger.get("info", {}):
            continue
        identity = {key: v for key, v in ledger["identity"].items() if key != "pack"}
        sources, first = zip(*ledger["info"]["sources"])
        bounds = [*first, len(ledger["shards"])]
        held = {}
        for j, source in enumerate(sources):
            target = wanted.get(source)
            if target is None or {**target.identity, **layout} != identity:
                continue
            if [s["name"] for s in ledger["shards"][bounds[j] : bounds[j + 1]]] == [s.name for s in target.shards]:
                held[source] = target
        if held:
            for source in held:
                del wanted[source]
            packs.append(Pack(root, join_location(root, PACKS_DIR, name), split, ledger["identity"], list(sources), bounds, identity,
                              held, stats))
    return packs


def _pack_names(root: str, split: str) -> list[str]:
    """The packs of ``split`` under ``root`` (their directory names)."""
    where = join_location(root, PACKS_DIR)
    local = local_path(where)
    if local is not None:
        names = os.listdir(local) if os.path.isdir(local) else []
    else:
        names = list(dict.fromkeys(key.split("/", 1)[0] for key in JsonDocuments(where).keys()))
    return sorted(n for n in names if n.startswith(f"{split}-"))


def member_records(pack: Pack, ledger: CacheLedger, row_bounds: np.ndarray, pack_stats: dict[str, Any]) -> dict[str, MemberRecord]:
    """The record of each member of a finished pack (by source), from the pack's ledger and its row bounds
    (``row_bounds[i]``: where row i begins, and last the tokens); a member whose rows are not one run, or one of whose
    shards is to be tried again, gets none."""
    extents: dict[int, list[Any]] = {}
    pack_runs = ledger.run_extents()
    members = np.searchsorted(np.asarray(pack.first_shards), [run.shard for run in pack_runs], side="right") - 1
    for run, member in zip(pack_runs, members.tolist()):
        extents.setdefault(member, []).append(run)
    build = {key: pack_stats["build"][key] for key in ("seconds", "tokenizer_backend") if key in pack_stats.get("build", {})}
    records = {}
    pack_fingerprint, member_fingerprint = ledger.fingerprint, fingerprint_of(pack.member_identity)
    previous_stop = 0
    for k, source in enumerate(pack.sources):
        shards = ledger.shards[pack.first_shards[k] : pack.first_shards[k + 1]]
        runs = extents.get(k, [])
        rows = (runs[0].row, runs[-1].stop_row) if runs else (previous_stop, previous_stop)
        previous_stop = rows[1]
        target = pack.targets.get(source)
        if target is None:
            continue
        one_run = all(a.stop_row == b.row for a, b in zip(runs, runs[1:])) and [r.shard for r in runs] == sorted(r.shard for r in runs)
        if not one_run or rows[1] - rows[0] != sum(s.rows for s in shards) or any(s.retry for s in shards):
            logger.info("%s: its rows in the pack %s are not one run of its shards; it is built alone",
                        target.location, pack.location)
            continue
        tokens = (int(row_bounds[rows[0]]), int(row_bounds[rows[1]]))
        lengths = np.diff(row_bounds[rows[0] : rows[1] + 1])
        relative = _relative(target.location, pack.location)
        stats = stats_document(pack.member_identity, member_fingerprint, shards, lengths, {**build, "pack": relative})
        info = {"tokenizer": ledger.info.get("tokenizer"), "source": source, "split": pack.split, "pack": relative}
        records[source] = MemberRecord(relative, pack_fingerprint, rows, tokens, pack.member_identity, list(shards), stats, info)
    return records


def write_member_records(pack: Pack, pack_stats: dict[str, Any], chunk_bytes: int) -> dict[tuple[str, str], dict[str, Any]]:
    """Once a pack is finished (and durable): write each member's record at its location, durable when this returns;
    returns the members' statistics by (source, split). A member left without a record (``member_records``) is not in
    them. The members of a pack finished by an earlier build have their shards checked first, as ``plan_packs`` checks
    a record's (``SourceChecks``: one whose records changed since raises ``ShardChangedError``)."""
    from tokenmix.cache.reader import TokenCache

    ledger = CacheLedger.from_json(JsonDocuments(pack.location).read(LEDGER_FILE) or {})
    row_bounds = TokenCache(pack.location).row_bounds(0, ledger.rows)
    records = member_records(pack, ledger, row_bounds, pack_stats)
    if pack.stats is not None:
        for source, record in records.items():
            member = record.ledger()
            if SourceChecks(pack.targets[source].location, pack.targets[source].shards, chunk_bytes).check_begun(member):
                records[source] = dataclasses.replace(record, shards=member.shards)
    write_rebuildable(pack.root, {f"{_key(pack.targets[source])}/{MEMBER_FILE}": record.document() for source, record in records.items()})
    already = {ALREADY_BUILT: True} if pack_stats.get(ALREADY_BUILT) else {}
    return {(source, pack.split): {**record.stats, **already} for source, record in records.items()}
