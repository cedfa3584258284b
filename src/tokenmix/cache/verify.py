"""Scrubbing a cache, and repairing what the scrub found from the cache's own inputs.

The scrub reads every stored chunk of a cache's arrays (tokens, row ends, loss spans, packing plans), which checks each
chunk's crc32c and that every committed chunk is there; it holds the row ends to be monotonic and to agree with the
ledger (the published row count, the total tokens, and where each run of rows from one shard begins), and reads the
inputs that are still reachable to check them against the record digests the ledger keeps. It only reads, so it runs
beside readers and beside a build (it checks the rows published when it starts).

The repair rewrites each damaged stored object whole, from the rows of the runs that fill it, read again from their
inputs (which must be unchanged) and encoded as the build encoded them; before anything is written, the rows read again
must match the ledger's counts and every intact chunk of the objects rewritten, so a repair never writes tokens other
than the build's. It holds the cache's build lock while it writes.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from tokenmix.cache.damage import CacheDamagedError, DamagedChunk, problem_of
from tokenmix.cache.input_digest import records_unchanged
from tokenmix.cache.ledger import LEDGER_FILE, CacheLedger
from tokenmix.cache.lock import build_lock
from tokenmix.cache.plans import PLAN_ARRAY, plan_location, stored_plans
from tokenmix.cache.reader import CacheNotFoundError
from tokenmix.cache.store import LOSS_SPANS_ARRAY, TOKENS_ARRAY, JaggedArray, JsonDocuments, join_location, open_kvstore, write_unit
from tokenmix.formats.encoder import DocumentEncoder, EncoderSpec
from tokenmix.sources.shards import DEFAULT_CHUNK_BYTES, FileShard, RawChunk, Shard, ShardReadError

logger = logging.getLogger(__name__)

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
                "damaged": [{"array": c.array, "start": c.start, "stop": c.stop, "problem": c.problem, "stored": c.stored}
                            for c in self.damaged],
                "problems": self.problems, "inputs": [vars(i) for i in self.inputs], "repaired": self.repaired}


def scrub(location: str, shards: Sequence[Shard] | None = None, inputs: bool = True, progress: bool = True,
          chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> CacheReport:
    """Check every stored byte of the cache at ``location`` (see the module's docstring). ``shards``: its input shards
    in ledger order, to check against the ledger's digests (None: files named as the ledger names them); ``inputs``
    False leaves the inputs unread."""
    tokens = JaggedArray.open(location, TOKENS_ARRAY, _ledger(location).identity.get("dtype"))
    try:
        published: int | None = tokens.committed_rows()
    except CacheDamagedError as e:
        published, unreadable = None, e
    ledger = _ledger(location)  # read after the count: a build writes its ledger before it publishes, so this is as new
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
    if ledger.identity.get("loss_spans"):
        arrays.append((JaggedArray.open(location, LOSS_SPANS_ARRAY, "int64"), report.rows, "spans"))
    for plan_id, plan in stored_plans(location).items():
        arrays.append((JaggedArray.open(plan_location(location, plan_id), PLAN_ARRAY, "int64"), int(plan.get("examples", 0)), "plan"))
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
    if inputs:
        report.inputs = _check_inputs(ledger, shards, chunk_bytes, progress)
    return report


def _ledger(location: str) -> CacheLedger:
    try:
        doc = JsonDocuments(location).read(LEDGER_FILE)
    except ValueError as e:
        raise CacheDamagedError(location, [DamagedChunk(LEDGER_FILE, 0, 0, f"unreadable ({e})")]) from None
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
            report.problems.append(f"{name}: row {row:,} has length {int(lengths[bad[0]]):,} (a row ends where it starts or later"
                                   f"{'; loss spans are pairs' if pairs else ''})")
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


def runs_of(ledger: CacheLedger) -> list[Run]:
    """The ledger's runs with where each one stops (the next one's start, or the ledger's totals)."""
    runs = ledger.runs or []
    out = []
    for k, (shard, position, row, token, span) in enumerate(runs):
        last = k + 1 == len(runs)
        stop_row, stop_token, stop_span = (ledger.rows, ledger.tokens, None) if last else (runs[k + 1][2], runs[k + 1][3], runs[k + 1][4])
        out.append(Run(shard, position, row, stop_row, token, stop_token, span, stop_span))
    return out


def _check_ledger(ledger: CacheLedger, report: CacheReport, bounds: dict[str, dict[int, int]]) -> None:
    """The published rows and tokens against the ledger, and each run's first row against where the ledger says it starts."""
    if report.rows > ledger.rows or (ledger.finished and report.rows != ledger.rows):
        report.problems.append(f"{report.rows:,} rows are published, the ledger accounts for {ledger.rows:,}")
    if report.rows == ledger.rows and report.rows in bounds["tokens"] and report.tokens != ledger.tokens:
        report.problems.append(f"the rows end at token {report.tokens:,}, the ledger accounts for {ledger.tokens:,} tokens")
    if sum(s.rows for s in ledger.shards) != ledger.rows or sum(s.tokens for s in ledger.shards) != ledger.tokens:
        report.problems.append("the ledger's shards do not add up to its rows and tokens")
    if ledger.runs is None:
        return
    runs = runs_of(ledger)
    for run in runs:
        for kind, expected, what in (("tokens", run.token, "token"), ("spans", run.span, "loss-span value")):
            found = bounds.get(kind, {}).get(run.row) if run.row <= report.rows else None
            if found is not None and found != expected:
                report.problems.append(f"row {run.row:,} (the first read from {ledger.shards[run.shard].name}) starts at {what} "
                                       f"{found:,}, the ledger says {expected:,}")
    for index, shard in enumerate(ledger.shards):
        rows = sum(r.stop_row - r.row for r in runs if r.shard == index)
        tokens = sum(r.stop_token - r.token for r in runs if r.shard == index)
        if (rows, tokens) != (shard.rows, shard.tokens):
            report.problems.append(f"the ledger's runs give {shard.name} {rows:,} rows and {tokens:,} tokens, its account says "
                                   f"{shard.rows:,} and {shard.tokens:,}")


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


class RepairError(RuntimeError):
    """A cache that cannot be repaired from its inputs; the message says why and what to do instead."""


@dataclass
class _Encoded:
    """The rows of one run, read again and encoded: values and row lengths of the tokens and of the loss spans."""

    tokens: np.ndarray
    lengths: np.ndarray
    spans: np.ndarray
    span_counts: np.ndarray


def repair(location: str, report: CacheReport, shards: Sequence[Shard], spec: EncoderSpec, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
           progress: bool = True) -> CacheReport:
    """Rewrite the damaged stored objects ``report`` names from the cache's inputs (``shards``, in ledger order, encoded
    by ``spec``), then scrub again; returns the new report, with what was rewritten. Raises ``RepairError`` where that
    cannot be done exactly (inputs changed or gone, a ledger without runs, damage that is not in the stored chunks)."""
    if report.ok:
        return report
    with build_lock(location, timeout=0):
        ledger = _ledger(location)
        _can_repair(location, ledger, report)
        runs = runs_of(ledger)
        arrays = {TOKENS_ARRAY: JaggedArray.open(location, TOKENS_ARRAY, spec.dtype, create=True)}
        if ledger.identity.get("loss_spans"):
            arrays[LOSS_SPANS_ARRAY] = JaggedArray.open(location, LOSS_SPANS_ARRAY, "int64", create=True)
        objects = _damaged_objects(report, arrays, runs)
        needed = {o: _runs_over(runs, *o) for o in objects}
        wanted = sorted({k for ks in needed.values() for k in ks})
        unchanged = {i.shard for i in report.inputs if i.state == "same"}
        stale = sorted({ledger.shards[runs[k].shard].name for k in wanted} - unchanged)
        if stale:
            raise RepairError(f"cannot repair {location}: the rows to rebuild come from inputs that are changed, gone or unchecked: "
                              f"{', '.join(stale[:5])}. Restore them (or delete the cache and build it again).")
        encoded = {k: _encode_run(location, ledger, runs[k], shards, spec, chunk_bytes)
                   for k in tqdm(wanted, desc="repair: reading runs again", unit=" runs", disable=not progress, dynamic_ncols=True)}
        writes = []
        for name, which, begin, end in objects:
            values = _values(runs, encoded, needed[(name, which, begin, end)], name, which, begin, end, report.rows)
            _check_intact(location, arrays[name], which, begin, values, report)
            writes.append((name, which, begin, end, values, len({runs[k].shard for k in needed[(name, which, begin, end)]})))
        for name, which, begin, end, values, inputs in writes:
            array = getattr(arrays[name], which)
            key = f"c/{begin // write_unit(array)}"
            open_kvstore(join_location(location, name, which)).write(key, None).result()
            array[begin:end].write(values).result()
            report.repaired.append(f"{name}/{which} {key}: elements {begin:,}-{end - 1:,} rewritten from {inputs} input shard(s)")
            logger.info("%s: %s", location, report.repaired[-1])
    repaired = report.repaired
    report = scrub(location, shards, inputs=False, progress=progress, chunk_bytes=chunk_bytes)
    report.repaired = repaired
    return report


def _can_repair(location: str, ledger: CacheLedger, report: CacheReport) -> None:
    if not ledger.finished:
        raise RepairError(f"cannot repair {location}: its build is unfinished, and a build does not go on over damaged rows; "
                          "delete the cache and build it again")
    if ledger.runs is None:
        raise RepairError(f"cannot repair {location}: it was built before tokenmix recorded where its rows came from; delete it "
                          "and build it again")
    outside = [c for c in report.damaged if not c.array.startswith((TOKENS_ARRAY + "/", LOSS_SPANS_ARRAY + "/"))]
    if outside or report.problems:
        what = "; ".join([c.describe() for c in outside] + report.problems)
        plans = " (a damaged packing plan: delete its directory under packing/, and readers plan again)" if outside else ""
        raise RepairError(f"cannot repair {location} from its inputs: {what}. Delete the cache and build it again{plans}")


def _damaged_objects(report: CacheReport, arrays: dict[str, JaggedArray], runs: list[Run]) -> list[tuple[str, str, int, int]]:
    """``(array, data|offsets, start, stop)`` of each stored object holding a damaged chunk, its committed part only."""
    spans = 0
    if LOSS_SPANS_ARRAY in arrays and report.rows:
        try:
            spans = int(arrays[LOSS_SPANS_ARRAY].row_ends(report.rows - 1, report.rows)[0])
        except CacheDamagedError:
            raise RepairError(f"cannot repair {report.location}: where its loss spans end is damaged too, so what the last "
                              "rows hold cannot be placed; delete the cache and build it again") from None
    totals = {(TOKENS_ARRAY, "data"): report.tokens, (TOKENS_ARRAY, "offsets"): report.rows + 1,
              (LOSS_SPANS_ARRAY, "data"): spans, (LOSS_SPANS_ARRAY, "offsets"): report.rows + 1}
    objects = set()
    for chunk in report.damaged:
        name, which = chunk.array.rsplit("/", 1)
        unit = write_unit(getattr(arrays[name], which))
        for first in range(chunk.start - chunk.start % unit, chunk.stop, unit):
            if first < totals[(name, which)]:
                objects.add((name, which, first, min(first + unit, totals[(name, which)])))
    return sorted(objects)


def _runs_over(runs: list[Run], name: str, which: str, begin: int, end: int) -> list[int]:
    """The runs whose rows fill elements ``[begin, end)`` of an array (consecutive runs, in order)."""
    if which == "offsets":  # index i holds the end of row i - 1; index 0 the row count
        return [k for k, r in enumerate(runs) if r.row < end - 1 and r.stop_row > begin - 1]
    if name == TOKENS_ARRAY:
        return [k for k, r in enumerate(runs) if r.token < end and r.stop_token > begin]
    return [k for k, r in enumerate(runs) if r.span < end and (r.stop_span is None or r.stop_span > begin)]


def _encode_run(location: str, ledger: CacheLedger, run: Run, shards: Sequence[Shard], spec: EncoderSpec, chunk_bytes: int) -> _Encoded:
    """A run's rows, read again from its shard (from its first record to where the next run of that shard, or the shard's
    reading, begins) and encoded; they must be as many rows and tokens as the ledger says."""
    progress = ledger.shards[run.shard]
    later = [r[1] for r in ledger.runs or [] if r[0] == run.shard and r[1] > run.position]
    stop = min(later) if later else progress.position
    encoder = DocumentEncoder(spec)
    parts = []
    try:
        for chunk in shards[run.shard].read(run.position, chunk_bytes):
            records = chunk.records[: max(0, stop - chunk.start)]
            if records:
                parts.append(encoder.encode(RawChunk(chunk.start, records)))
            if chunk.start + len(chunk.records) >= stop:
                break
    except ShardReadError as e:
        raise RepairError(f"cannot repair {location}: {progress.name} cannot be read again ({e})") from None
    encoded = _Encoded(*(np.concatenate([getattr(p, f) for p in parts] or [np.empty(0, t)])
                         for f, t in (("tokens", np.dtype(spec.dtype)), ("lengths", np.int64), ("spans", np.int64), ("span_counts", np.int64))))
    expected = (run.stop_row - run.row, run.stop_token - run.token)
    if (len(encoded.lengths), len(encoded.tokens)) != expected or (run.stop_span is not None and len(encoded.spans) != run.stop_span - run.span):
        raise RepairError(f"cannot repair {location}: {progress.name}, read again from record {run.position:,}, gives "
                          f"{len(encoded.lengths):,} rows of {len(encoded.tokens):,} tokens where the cache holds {expected[0]:,} of "
                          f"{expected[1]:,}: its input or the tokenizer is not what built the cache. Delete the cache and build it again.")
    return encoded


def _values(runs: list[Run], encoded: dict[int, _Encoded], needed: list[int], name: str, which: str, begin: int, end: int,
            rows: int) -> np.ndarray:
    """What elements ``[begin, end)`` of an array hold, made from the runs that fill them."""
    first = runs[needed[0]]
    tokens = name == TOKENS_ARRAY
    if which == "data":
        values = np.concatenate([encoded[k].tokens if tokens else encoded[k].spans for k in needed])
        base = first.token if tokens else first.span
        return values[begin - base : end - base]
    ends = np.concatenate([(runs[k].token if tokens else runs[k].span)
                           + np.cumsum(encoded[k].lengths if tokens else encoded[k].span_counts, dtype=np.int64) for k in needed])
    index = np.arange(begin, end)
    out = np.empty(len(index), np.int64)
    out[index == 0] = rows
    out[index > 0] = ends[index[index > 0] - 1 - first.row]
    return out


def _check_intact(location: str, jagged: JaggedArray, which: str, begin: int, values: np.ndarray, report: CacheReport) -> None:
    """Every chunk of the object to rewrite that is not damaged must hold what the repair would write."""
    array = getattr(jagged, which)
    inner = int(array.chunk_layout.read_chunk.shape[0])
    name = f"{jagged.name}/{which}"
    for start in range(begin, begin + len(values), inner):
        stop = min(start + inner, begin + len(values))
        if any(c.array == name and c.start < stop and c.stop > start for c in report.damaged):
            continue
        stored = np.asarray(array[start:stop].read().result())
        if which == "offsets" and start == 0:
            stored, expected = stored[1:], values[1 : stop - begin]
        else:
            expected = values[start - begin : stop - begin]
        if not np.array_equal(stored, expected):
            raise RepairError(f"cannot repair {location}: {name} elements {start:,}-{stop - 1:,} are intact but differ "
                              "from what reading their inputs again gives: the inputs or the tokenizer are not what built the cache. "
                              "Delete the cache and build it again.")
