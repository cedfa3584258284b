"""Scrubbing a cache: every stored byte read and checked, the row bounds held against the ledger, the inputs against
the digests the ledger keeps.

The scrub reads every stored chunk of a cache's arrays (tokens, row ends, loss spans, packing plans), which checks each
chunk's crc32c and that every committed chunk is there; it holds the row ends to be monotonic and to agree with the
ledger (the published row count, the total tokens, and where each run of rows from one shard begins), and reads the
inputs that are still reachable to check them against the record digests the ledger keeps. A finished cache's open
object (what readers open it from, in place of its ledger and row ends) is checked against the ledger and the arrays.
It only reads, so it runs
beside readers and beside a build (it checks the rows published when it starts). ``repair.py`` mends what it finds.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from tokenmix.cache.damage import CacheDamagedError, DamagedChunk, problem_of
from tokenmix.cache.input_digest import records_unchanged
from tokenmix.cache.ledger import EMPTY_LEDGER, LEDGER_FILE, CacheLedger
from tokenmix.cache.open_object import OPEN_FILE, OpenObjectDamagedError, read_open_object
from tokenmix.cache.plans import PLAN_ARRAY, plan_location, stored_plans
from tokenmix.cache.reader import CacheNotFoundError
from tokenmix.cache.stats import STATS_FILE
from tokenmix.cache.store import (
    LOSS_SPANS_ARRAY,
    TOKENS_ARRAY,
    ZARR_METADATA,
    DocumentDamagedError,
    JaggedArray,
    JsonDocuments,
    open_kvstore,
    write_unit,
)
from tokenmix.sources.shards import DEFAULT_CHUNK_BYTES, FileShard, Shard
from tokenmix.sources.urls import join_location

READS_IN_FLIGHT = 4
"""Stored objects read at once by the scrub."""


@dataclass
class InputCheck:
    """What the scrub found of one input shard against the ledger's digest of the records read from it."""

    shard: str
    state: str
    """``same``, ``changed``, ``unreachable`` or ``not checked`` (no digest kept, or not a file)."""
    detail: str = ""


@dataclass
class CacheReport:
    """What ``verify_cache`` found (and repaired) in one cache."""

    location: str
    rows: int = 0
    """Rows published when the scrub started (what it checked)."""
    tokens: int = 0
    finished: bool = False
    checksummed: bool = True
    """Whether every array's chunks carry checksums (caches made before checksums do not: bit rot goes unseen there)."""
    chunks: int = 0
    """Stored chunks read and checked."""
    damaged: list[DamagedChunk] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Row bounds or counts that disagree with each other or with the ledger, in words."""
    other_values: list[DamagedChunk] = field(default_factory=list)
    """Row ends or loss-span bounds that disagree with each other or with the ledger, their checksums intact: a stored
    object holding them holds other values than the build stored (another object copied over it). Each is in
    ``problems`` too, in the words of its ``problem``; a repair compares the objects holding them with their inputs."""
    inputs: list[InputCheck] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    """What a repair rewrote, in words."""

    @property
    def ok(self) -> bool:
        """Whether nothing is damaged, inconsistent or changed under the cache."""
        return not self.damaged and not self.problems and not any(i.state == "changed" for i in self.inputs)

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "ok": self.ok, "rows": self.rows, "tokens": self.tokens, "finished": self.finished,
                "checksummed": self.checksummed, "chunks": self.chunks,
                "damaged": [_chunk_json(c) for c in self.damaged], "problems": self.problems,
                "other_values": [_chunk_json(c) for c in self.other_values], "inputs": [vars(i) for i in self.inputs],
                "repaired": self.repaired}


def _chunk_json(chunk: DamagedChunk) -> dict[str, Any]:
    return {"array": chunk.array, "start": chunk.start, "stop": chunk.stop, "problem": chunk.problem, "stored": chunk.stored}


def scrub(location: str, shards: Sequence[Shard] | None = None, inputs: bool = True, progress: bool = True,
          chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> CacheReport:
    """Check every stored byte of the cache at ``location`` (see the module's docstring). ``shards``: its input shards
    in ledger order, to check against the ledger's digests (None: files named as the ledger names them); ``inputs``
    False leaves the inputs unread."""
    try:
        tokens = JaggedArray.open(location, TOKENS_ARRAY, stored_ledger(location).identity.get("dtype"))
    except DocumentDamagedError as e:
        report = CacheReport(location, finished=stored_ledger(location).finished)
        report.problems.append(f"{e.key}: {e.problem}; nothing more can be checked")
        return report
    for _ in range(2):  # a count missing before a ledger with rows: the first commit came between the reads, so again
        try:
            published: int | None = tokens.committed_rows()
        except CacheDamagedError as e:
            published, unreadable = None, e
        ledger = stored_ledger(location)  # read after the count: a build writes its ledger before it publishes, so this is as new
        if published is not None or ledger.rows == 0:
            break
    report = CacheReport(location, finished=ledger.finished)
    if published is not None:
        report.rows = published
    elif ledger.rows == 0 and all(c.problem == "missing" for c in unreadable.chunks):
        report.rows = 0  # a build that has not published yet
    elif ledger.finished:  # a finished cache publishes the ledger's rows; the damage is scrubbed below
        report.rows = ledger.rows
    else:
        report.damaged += unreadable.chunks
        report.problems.append(f"{TOKENS_ARRAY}/offsets: the published row count cannot be read; nothing more can be checked")
        return report
    arrays = [(tokens, report.rows, "tokens")]
    opening = [(location, LOSS_SPANS_ARRAY, report.rows, "spans")] if ledger.identity.get("loss_spans") else []
    opening += [(plan_location(location, plan_id), PLAN_ARRAY, int(plan.get("examples", 0)), "plan")
                for plan_id, plan in stored_plans(location).items()]
    for at, name, values, kind in opening:
        try:
            arrays.append((JaggedArray.open(at, name, "int64"), values, kind))
        except DocumentDamagedError as e:
            under = at.removeprefix(location).strip("/")  # a packing plan's directory
            report.problems.append(f"{under + '/' if under else ''}{e.key}: {e.problem}")
    report.checksummed = all(array.checksummed for array, _, _ in arrays)
    with tqdm(total=None, desc=f"verify {location}", unit=" values", unit_scale=True, disable=not progress, dynamic_ncols=True,
              mininterval=0.5) as bar:
        starts = {kind: {0} | {run[2] for run in ledger.runs or []} for kind in ("tokens", "spans")}
        bounds = {}
        for array, rows, kind in arrays:
            wanted = starts.get(kind, set()) | {rows}
            bounds[kind] = _scan_bounds(array, rows, wanted, report, bar)
            values = bounds[kind].get(rows)
            if values is None and kind == "tokens" and rows == ledger.rows:  # the row ends are damaged: the ledger knows
                values = ledger.tokens
            if kind == "tokens":
                report.tokens = values or 0
            if values is None and not any(c.array == f"{array.name}/offsets" for c in report.damaged):
                report.problems.append(f"{array.name}/data: where its values end cannot be read, so they were not checked")
            elif values is not None:
                vocab = ledger.identity.get("vocab_size") if kind == "tokens" else None
                _scan_values(array, values, vocab, report, bar)
    _check_ledger(ledger, report, bounds)
    _check_open_object(location, ledger, tokens, report)
    _check_stats(location, report)
    if inputs:
        report.inputs = _check_inputs(ledger, shards, chunk_bytes, progress)
    return report


def stored_ledger(location: str) -> CacheLedger:
    """The ledger of the cache at ``location``; damage or its absence named (``DocumentDamagedError`` for an empty one)."""
    docs = JsonDocuments(location)
    try:
        doc = docs.read(LEDGER_FILE)
    except ValueError as e:
        raise CacheDamagedError(location, [DamagedChunk(LEDGER_FILE, 0, 0, f"unreadable ({e})")]) from None
    if doc is None and docs.empty(LEDGER_FILE):  # as a reader names it: no repair mends it, it reads the ledger
        raise DocumentDamagedError(location, LEDGER_FILE, EMPTY_LEDGER)
    if doc is None:
        raise CacheNotFoundError(f"no tokenmix cache at {location} (no {LEDGER_FILE}); a cache Levanter built carries no checksums "
                                 "to verify")
    return CacheLedger.from_json(doc)


def _read_objects(jagged: JaggedArray, array: ts.TensorStore, stop: int, report: CacheReport, bar: Any) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, values)`` of each stored object of ``array`` below ``stop``, in order, a few reads in flight; the damaged
    chunks of an object that fails are added to the report and the object is left out."""
    inner = int(array.chunk_layout.read_chunk.shape[0])
    pending: deque[tuple[int, int, Any]] = deque()
    unit = write_unit(array)
    objects = ((begin, min(begin + unit, stop)) for begin in range(0, stop, unit))
    while True:
        for begin, end in objects:
            pending.append((begin, end, array[begin:end].read()))
            if len(pending) >= READS_IN_FLIGHT:
                break
        if not pending:
            return
        begin, end, read = pending.popleft()
        report.chunks += -(-(end - begin) // inner)
        bar.update(end - begin)
        try:
            yield begin, np.asarray(read.result())
        except ValueError as e:
            if problem_of(e) is None:
                raise
            report.damaged += jagged.locate(array, begin, end)


def _scan_bounds(jagged: JaggedArray, rows: int, wanted: set[int], report: CacheReport, bar: Any) -> dict[int, int]:
    """Scrub ``offsets[0 : rows + 1]``: rows must not end before they start (and loss spans come in pairs). Returns where
    each wanted row starts (``offsets[row]``; 0 for row 0), for those that could be read."""
    name = f"{jagged.name}/offsets"
    pairs = jagged.name == LOSS_SPANS_ARRAY
    found = {0: 0} if 0 in wanted else {}
    previous = (0, 0)
    """The last offsets index read and its value (index 0 stands for the start of row 0)."""
    for begin, values in _read_objects(jagged, jagged.offsets, rows + 1, report, bar):
        if begin == 0:
            if int(values[0]) < rows:
                report.problems.append(f"{name}: the published row count went down from {rows:,} to {int(values[0]):,} while it was read")
            values, begin = values[1:], 1
        if not len(values):
            continue
        joined = previous[0] == begin - 1
        lengths = np.diff(np.concatenate([[previous[1]], values]) if joined else values)
        bad = np.flatnonzero((lengths < 0) | (pairs & (lengths % 2 != 0)))
        if len(bad):
            row = begin - 1 + int(bad[0]) + (0 if joined else 1)
            _other_values(report, name, row, row + 2, f"{name}: row {row:,} has length {int(lengths[bad[0]]):,} (a row ends where "
                          f"it starts or later{'; loss spans are pairs' if pairs else ''})")
        for row in wanted:
            if begin <= row < begin + len(values):
                found[row] = int(values[row - begin])
        previous = (begin + len(values) - 1, int(values[-1]))
    return found


def _scan_values(jagged: JaggedArray, stop: int, vocab: int | None, report: CacheReport, bar: Any) -> None:
    """Scrub ``data[0 : stop]``; token ids must be below the vocabulary size."""
    for begin, values in _read_objects(jagged, jagged.data, stop, report, bar):
        if vocab is not None and len(values) and int(values.max()) >= vocab:
            at = begin + int(np.argmax(values >= vocab))
            report.problems.append(f"{jagged.name}/data: token {at:,} is {int(values[at - begin]):,}, outside the vocabulary of {vocab:,}")


def _check_ledger(ledger: CacheLedger, report: CacheReport, bounds: dict[str, dict[int, int]]) -> None:
    """The published rows and tokens against the ledger, and each run's first row against where the ledger says it starts."""
    if report.rows > ledger.rows or (ledger.finished and report.rows != ledger.rows):
        report.problems.append(f"{report.rows:,} rows are published, the ledger accounts for {ledger.rows:,}")
    if report.rows == ledger.rows and report.rows in bounds["tokens"] and report.tokens != ledger.tokens:
        _other_values(report, f"{TOKENS_ARRAY}/offsets", report.rows, report.rows + 1,
                      f"the rows end at token {report.tokens:,}, the ledger accounts for {ledger.tokens:,} tokens")
    if sum(s.rows for s in ledger.shards) != ledger.rows or sum(s.tokens for s in ledger.shards) != ledger.tokens:
        report.problems.append("the ledger's shards do not add up to its rows and tokens")
    if ledger.runs is None:
        return
    runs = ledger.run_extents()
    for run in runs:
        for kind, array, expected, what in (("tokens", TOKENS_ARRAY, run.token, "token"),
                                            ("spans", LOSS_SPANS_ARRAY, run.span, "loss-span value")):
            found = bounds.get(kind, {}).get(run.row) if run.row <= report.rows else None
            if found is not None and found != expected:
                _other_values(report, f"{array}/offsets", run.row, run.row + 1, f"row {run.row:,} (the first read from "
                              f"{ledger.shards[run.shard].name}) starts at {what} {found:,}, the ledger says {expected:,}")
    for index, shard in enumerate(ledger.shards):
        rows = sum(r.stop_row - r.row for r in runs if r.shard == index)
        tokens = sum(r.stop_token - r.token for r in runs if r.shard == index)
        if (rows, tokens) != (shard.rows, shard.tokens):
            report.problems.append(f"the ledger's runs give {shard.name} {rows:,} rows and {tokens:,} tokens, its account says "
                                   f"{shard.rows:,} and {shard.tokens:,}")


def _other_values(report: CacheReport, array: str, start: int, stop: int, words: str) -> None:
    """Elements ``[start, stop)`` of ``array`` (an ``offsets``) disagree with each other or with the ledger (``words``)."""
    report.problems.append(words)
    report.other_values.append(DamagedChunk(array, start, stop, words))


def _check_open_object(location: str, ledger: CacheLedger, tokens: JaggedArray, report: CacheReport) -> None:
    """The open object, where there is one, against the ledger and the stored arrays: a reader trusts it in their place.
    Its problems are named ``open.bin: ...`` (a repair writes it again)."""
    kv = open_kvstore(location)
    try:
        record = read_open_object(kv, location)
    except OpenObjectDamagedError as e:
        report.problems.append(f"{OPEN_FILE}: {e.problem}")
        return
    if record is None:
        return
    found = []
    if not ledger.finished:
        if stored_ledger(location).finished:  # the build finished while this scrub read what it had published before
            return
        found.append("present while the build is unfinished: readers would take the cache as finished")
    elif (record.ledger.identity, record.ledger.rows, record.ledger.tokens) != (ledger.identity, ledger.rows, ledger.tokens):
        found.append(f"its identity, rows or tokens ({record.ledger.rows:,} rows, {record.ledger.tokens:,} tokens) differ from "
                     f"the ledger's ({ledger.rows:,} rows, {ledger.tokens:,} tokens)")
    stored_metadata = JsonDocuments(location).read_bytes([f"{name}/{ZARR_METADATA}" for name in record.metadata])
    for (name, metadata), stored in zip(record.metadata.items(), stored_metadata):
        if stored is None or _parsed(stored) != metadata:
            found.append(f"its metadata of {name} differs from the stored {name}/{ZARR_METADATA}")
    offsets = f"{tokens.name}/offsets"
    if record.row_ends is not None and report.rows == ledger.rows and not any(c.array == offsets for c in report.damaged):
        if not np.array_equal(record.row_ends, tokens.row_ends(0, report.rows)):
            found.append(f"its row ends differ from the stored {offsets}")
    data = open_kvstore(join_location(location, TOKENS_ARRAY, "data"))
    for shard, index in record.shard_indexes.items():
        try:
            stored = data.read(f"c/{shard}", byte_range=slice(0, len(index))).result()
        except ValueError as e:  # the object is shorter than its index: the scan of the tokens names it damaged
            if problem_of(e) != "cut short":
                raise
            stored = None
        if stored is None or stored.state != "value" or bytes(stored.value) != index:
            found.append(f"its index of {TOKENS_ARRAY}/data c/{shard} differs from the stored one")
    report.problems += [f"{OPEN_FILE}: {f}" for f in found]


STATS_FIX = "delete it, and `tokenmix build-cache` writes it again from the ledger"
"""Ends the scrub's words for a damaged statistics document: what mends it (a repair cannot: it holds the build's times)."""


def _check_stats(location: str, report: CacheReport) -> None:
    """The statistics document, where there is one, must be JSON: ``inspect`` and the build's summary read it."""
    try:
        JsonDocuments(location).read(STATS_FILE)
    except DocumentDamagedError as e:
        report.problems.append(f"{STATS_FILE}: {e.problem}; {STATS_FIX}")


def _parsed(raw: bytes) -> Any:
    """The JSON ``raw`` holds, or None where it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def ledger_shards(ledger: CacheLedger) -> list[Shard | None]:
    """The ledger's shards as readers of the files it names (None where a name is no file: a Hugging Face dataset)."""
    out: list[Shard | None] = []
    for progress in ledger.shards:
        try:
            out.append(None if progress.name.startswith("hf://") else FileShard(progress.name))
        except ValueError:
            out.append(None)
    return out


def _check_inputs(ledger: CacheLedger, shards: Sequence[Shard] | None, chunk_bytes: int, progress: bool) -> list[InputCheck]:
    checks = []
    readers = list(shards) if shards is not None else ledger_shards(ledger)
    for progress_, shard in tqdm(list(zip(ledger.shards, readers)), desc="verify inputs", unit=" shards", disable=not progress,
                                 dynamic_ncols=True, mininterval=0.5):
        if shard is None or progress_.digest is None:
            checks.append(InputCheck(progress_.name, "not checked", "the ledger keeps no digest of it" if shard else "not a file"))
            continue
        if progress_.position == 0:
            checks.append(InputCheck(progress_.name, "same", "no record read from it"))
            continue
        try:
            shard.identity()
        except FileNotFoundError:
            checks.append(InputCheck(progress_.name, "unreachable", "the file is gone"))
            continue
        except (OSError, ValueError) as e:
            checks.append(InputCheck(progress_.name, "unreachable", f"{type(e).__name__}: {e}"))
            continue
        same = records_unchanged(shard, progress_, chunk_bytes)
        checks.append(InputCheck(progress_.name, "same" if same else "changed",
                                 "" if same else f"its first {progress_.position:,} records are not those the cache read"))
    return checks


