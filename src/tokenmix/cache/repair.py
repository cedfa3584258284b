"""Repairing what a scrub found damaged, from the cache's own inputs.

The repair rewrites each damaged stored object whole, from the rows of the runs that fill it, read again from their
inputs (which must be unchanged) and encoded as the build encoded them; before anything is written, the rows read again
must match the ledger's counts and every intact chunk of the objects rewritten, so a repair never writes tokens other
than the build's. An object of row ends whose checksums hold but whose ends disagree with their neighbours or the ledger
(another object copied over it) is rewritten the same way where it differs from what the inputs give, once the tokens
(or loss spans) those inputs give are found equal to the stored ones. A finished cache's open object is written again
from the repaired ledger and arrays when the scrub found it wrong or anything was rewritten. It holds the cache's build
lock while it writes, and scrubs the cache again after.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from tokenmix.cache.damage import CacheDamagedError, DamagedChunk, element_range
from tokenmix.cache.ledger import CacheLedger, Run
from tokenmix.cache.lock import build_lock
from tokenmix.cache.open_object import OPEN_FILE, forget_open_object, write_open_object
from tokenmix.cache.scrub import STATS_FIX, CacheReport, scrub, stored_ledger
from tokenmix.cache.store import LOSS_SPANS_ARRAY, TOKENS_ARRAY, JaggedArray, open_kvstore, write_unit
from tokenmix.formats.encoder import DocumentEncoder
from tokenmix.formats.encoder_spec import EncoderSpec
from tokenmix.sources.shards import DEFAULT_CHUNK_BYTES, RawChunk, Shard, ShardReadError
from tokenmix.sources.urls import join_location

logger = logging.getLogger(__name__)


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
        ledger = stored_ledger(location)
        _can_repair(location, ledger, report)
        runs = ledger.run_extents()
        arrays = {TOKENS_ARRAY: JaggedArray.open(location, TOKENS_ARRAY, spec.dtype, create=True)}
        if ledger.identity.get("loss_spans"):
            arrays[LOSS_SPANS_ARRAY] = JaggedArray.open(location, LOSS_SPANS_ARRAY, "int64", create=True)
        objects = _damaged_objects(report, arrays, runs)
        suspects = [o for o in _objects_holding(report.other_values, arrays, report.rows) if o not in objects]
        needed = {o: _runs_over(runs, *o) for o in objects + suspects}
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
        for name, which, begin, end in suspects:  # whole and checksummed: rewritten where they differ from their inputs
            values = _values(runs, encoded, needed[(name, which, begin, end)], name, which, begin, end, report.rows)
            stored = np.asarray(getattr(arrays[name], which)[begin:end].read().result())
            if np.array_equal(stored[1:] if begin == 0 else stored, values[1:] if begin == 0 else values):
                continue
            _check_bounded_values(location, arrays[name], runs, encoded, needed[(name, which, begin, end)], report)
            writes.append((name, which, begin, end, values, len({runs[k].shard for k in needed[(name, which, begin, end)]})))
        for name, which, begin, end, values, inputs in writes:
            array = getattr(arrays[name], which)
            key = f"c/{begin // write_unit(array)}"
            open_kvstore(join_location(location, name, which)).write(key, None).result()
            array[begin:end].write(values).result()
            report.repaired.append(f"{name}/{which} {key}: {element_range(begin, end)} rewritten from {inputs} input shard(s)")
            logger.info("%s: %s", location, report.repaired[-1])
        if writes or _open_object_problems(report):
            forget_open_object(location)
            write_open_object(location, ledger, arrays[TOKENS_ARRAY])
            report.repaired.append(f"{OPEN_FILE}: written again from the ledger and the arrays")
            logger.info("%s: %s", location, report.repaired[-1])
    repaired, inputs = report.repaired, report.inputs
    report = scrub(location, shards, inputs=False, progress=progress, chunk_bytes=chunk_bytes)
    report.repaired, report.inputs = repaired, inputs  # the inputs as found: a repair does not make a changed one the same
    return report


def _can_repair(location: str, ledger: CacheLedger, report: CacheReport) -> None:
    if not ledger.finished:
        raise RepairError(f"cannot repair {location}: its build is unfinished, and a build does not go on over damaged rows; "
                          "delete the cache and build it again")
    if ledger.runs is None:
        raise RepairError(f"cannot repair {location}: it was built before tokenmix recorded where its rows came from; delete it "
                          "and build it again")
    outside = [c for c in report.damaged if not c.array.startswith((TOKENS_ARRAY + "/", LOSS_SPANS_ARRAY + "/"))]
    mended = set(_open_object_problems(report)) | {c.problem for c in report.other_values}
    problems = [p for p in report.problems if p not in mended and not p.endswith(STATS_FIX)]
    if outside or problems:
        what = "; ".join([c.describe() for c in outside] + problems)
        plans = " (a damaged packing plan: delete its directory under packing/, and readers plan again)" if outside else ""
        raise RepairError(f"cannot repair {location} from its inputs: {what}. Delete the cache and build it again{plans}")


def _open_object_problems(report: CacheReport) -> list[str]:
    """What the scrub found wrong with the open object alone: mended by writing it again."""
    return [p for p in report.problems if p.startswith(f"{OPEN_FILE}: ")]


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


def _objects_holding(chunks: list[DamagedChunk], arrays: dict[str, JaggedArray], rows: int) -> list[tuple[str, str, int, int]]:
    """``(array, offsets, start, stop)`` of each stored object of row ends holding an element of ``chunks``."""
    objects = set()
    for chunk in chunks:
        name = chunk.array.rsplit("/", 1)[0]
        unit = write_unit(arrays[name].offsets)
        for element in range(chunk.start, min(chunk.stop, rows + 1)):
            first = element - element % unit
            objects.add((name, "offsets", first, min(first + unit, rows + 1)))
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


def _check_bounded_values(location: str, jagged: JaggedArray, runs: list[Run], encoded: dict[int, _Encoded], needed: list[int],
                          report: CacheReport) -> None:
    """The values the runs ``needed`` give ``jagged``'s data (tokens or loss spans) must be those stored (where their chunks
    are not damaged): row ends made from them are then the build's, those stored being checksummed but other values."""
    tokens = jagged.name == TOKENS_ARRAY
    values = np.concatenate([encoded[k].tokens if tokens else encoded[k].spans for k in needed])
    _check_intact(location, jagged, "data", runs[needed[0]].token if tokens else runs[needed[0]].span, values, report)


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
            raise RepairError(f"cannot repair {location}: {name} {element_range(start, stop)}, intact, hold other values than "
                              "reading their inputs again gives: the inputs or the tokenizer are not what built the cache. "
                              "Delete the cache and build it again.")
