"""Building a cache: tokenize in parallel, commit rows in listed-shard order.

With the local executor the driver reads shards in listed order and cuts them into chunks; worker
processes tokenize chunks in parallel; the driver takes results back in submission order, writes
them at the next free row, and commits (ledger, then ``offsets[0]``) every ``commit_interval_s``.
On a cluster (Ray, Dask) each task reads and encodes a whole shard and stages its tokens under the
cache (``shard_task.py``); the driver takes finished shards in listed order, appends their staged
chunks the same way and retries failed tasks. Either way rows are in listed-shard order whatever the
worker count, a killed build resumes from its ledger and rewrites exactly the bytes it would have
written, and readers see only committed rows. A shard whose records are verified only at its end
(a compressed file: ``Shard.verified_at_end``) is held: none of its rows is committed before its end,
and when its checksums fail there (or are never reached) its rows are taken back, never published.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import pickle
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from tokenmix.cache.encoding import EncoderPool, open_build_executor
from tokenmix.cache.input_digest import records_unchanged
from tokenmix.cache.ledger import CHECKED_END_REASONS, LEDGER_FILE, RETRIED_REASONS, CacheLedger, ShardProgress
from tokenmix.cache.lock import BuildLock, build_lock
from tokenmix.cache.options import BuildOptions
from tokenmix.cache.progress import BuildProgress, ClusterRates
from tokenmix.cache.shard_task import (
    ShardJob,
    ShardResult,
    clear_staging,
    delete_staging,
    portable,
    portable_location,
    run_shard,
    staged_chunks,
)
from tokenmix.cache.stats import STATS_FILE, compute_stats
from tokenmix.cache.store import (
    LOSS_SPANS_ARRAY,
    TOKENS_ARRAY,
    CacheWriteError,
    JaggedArray,
    JsonDocuments,
    remove_interrupted_writes,
    storage_cause,
    unwritable,
)
from tokenmix.execution.configs import LocalExecutorConfig
from tokenmix.execution.task_executor import TaskExecutor, TaskFuture
from tokenmix.formats.backends import FAST, REFERENCE, BackendChoice, choose_backend, preload_fast
from tokenmix.formats.base import FILTER_REASONS
from tokenmix.formats.encoder import DocumentEncoder, EncodedChunk, EncoderSpec, chunk_difference
from tokenmix.sources.shards import DIGEST_MASK, RawChunk, Shard, ShardReadError, approx_size

logger = logging.getLogger(__name__)

BACKEND_SAMPLE_BYTES = 64 << 10
"""Input bytes of the first shard left to read that both tokenizer backends encode before a build chooses between them."""


class BadInputError(ValueError):
    """A bad record or unreadable shard under ``on_error: raise``."""


class ShardTaskError(RuntimeError):
    """A shard's task failed on every try on the cluster (worker lost, storage error, ...)."""


@dataclass
class _ShardEnd:
    index: int
    error: ShardReadError | None


@dataclass
class _HeldShard:
    """A shard verified only at its end whose rows are being written: where the build stood before its first row, to go
    back to if its end refuses them. Nothing is committed while a shard is held."""

    index: int
    progress: ShardProgress
    rows: int
    tokens: int
    span_values: int


@dataclass
class _ShardTask:
    """A shard submitted to a cluster: its job, how many tries failed before it, and its result once fetched."""

    job: ShardJob
    failures: int
    future: TaskFuture
    result: ShardResult | None = None


class CacheBuilder:
    """Builds (or resumes, or extends) one cache from an ordered list of shards."""

    def __init__(
        self,
        location: str,
        shards: Sequence[Shard],
        spec: EncoderSpec,
        identity: dict[str, Any],
        options: BuildOptions = BuildOptions(),
        progress: BuildProgress | None = None,
        info: dict[str, Any] | None = None,
        executor: EncoderPool | TaskExecutor | None = None,
    ):
        """``executor``: a pool or cluster shared by several builds; None opens ``options.executor`` for this build."""
        self.location = location
        self.shards = list(shards)
        self.spec = spec
        self.identity = {**identity, **options.layout_identity()}
        self.options = options
        self.progress = progress
        self.info = info or {}
        self.executor = executor
        self._docs = JsonDocuments(location)
        self._skips_logged = 0
        self._spans: JaggedArray | None = None
        self._span_values = 0
        """Where the next document's loss spans go in the spans array."""
        self._last_commit = time.monotonic()
        self._lock: BuildLock | None = None
        self._published = 0
        """Rows readers see (``offsets[0]``): never lowered."""
        self._backend: Future = Future()
        """The tokenizer backend chosen for this build (``_choose_in_background``)."""
        self._held: _HeldShard | None = None

    def build(self) -> dict[str, Any]:
        """Run the build to the end and return the cache statistics (a finished cache is left untouched).

        Holds the cache's build lock throughout: a second builder of the same cache waits (``build.lock_timeout_s``)."""
        started = time.monotonic()
        if isinstance(self.executor, TaskExecutor) or (self.executor is None and not isinstance(self.options.executor, LocalExecutorConfig)):
            portable_location(self.location)  # refuses a location cluster workers cannot reach, before anything starts
        with build_lock(self.location, self.options.lock, self.options.lock_timeout_s, self.options.lock_lease_s) as lock:
            self._lock = lock
            return self._build(started)

    def _build(self, started: float) -> dict[str, Any]:
        ledger = self._open_ledger()
        refreshed = self._check_sources(ledger)
        if ledger.finished:
            stats = self._docs.read(STATS_FILE)
            if stats is not None:  # nothing to build: keep the record of the build that made the cache
                if refreshed:
                    self._docs.write(LEDGER_FILE, ledger.to_json())
                return stats
        removed = remove_interrupted_writes(self.location)
        if removed:
            logger.info("%s: removed %d partial objects that writes of a killed build left", self.location, removed)
        if self.options.tokenizer_backend != REFERENCE:
            preload_fast(self.spec.tokenizer_json)  # while the arrays are opened and the first chunks read
        try:
            array = JaggedArray.open(self.location, TOKENS_ARRAY, self.spec.dtype, create=True, compression=self.options.compression)
            if self.spec.format.masks_loss:
                self._spans = JaggedArray.open(self.location, LOSS_SPANS_ARRAY, "int64", create=True)
                self._span_values = int(self._spans.row_ends(ledger.rows - 1, ledger.rows)[0]) if ledger.rows else 0
            self._published = array.committed_rows(unwritten_is_empty=ledger.rows == 0)
            self._docs.write(LEDGER_FILE, ledger.to_json())
        except ValueError as e:  # tensorstore's storage errors
            raise unwritable(self.location, e) from None
        if ledger.rows < self._published:
            raise CacheWriteError(
                f"cache at {self.location} publishes {self._published:,} rows but its ledger accounts for {ledger.rows:,}: "
                "it was written by two builders at once (before tokenmix locked builds) or edited by hand. Delete it and rebuild."
            )
        self._publish(ledger, array)
        resumed_rows = ledger.rows
        backend = None
        if not ledger.finished:
            clear_staging(self.location)  # what tasks of an earlier, killed run left: never part of the cache
            self._backend = self._choose_in_background(ledger)
            if self.progress is not None:
                self.progress.start(self._remaining_bytes(ledger))
            try:
                self._run(ledger, array)
            finally:
                if self.progress is not None:
                    self.progress.close()
            backend = self._backend.result()
            ledger.finished = True
            self._commit(ledger, array, [])
        stats = compute_stats(ledger, array, time.monotonic() - started, resumed_rows)
        if backend is not None:
            stats["build"]["tokenizer_backend"] = {"name": backend.name, "reason": backend.reason}
        self._docs.write(STATS_FILE, stats)
        return stats

    def _choose_in_background(self, ledger: CacheLedger) -> Future:
        """Start choosing the tokenizer backend in a thread: the check (and loading ``fastokens``, about 0.15 s) overlaps
        the build's first reads, which need no tokenizer."""
        choice: Future = Future()

        def choose() -> None:
            try:
                choice.set_result(self._choose_backend(ledger))
            except BaseException as e:  # raised where the build waits for the choice
                choice.set_exception(e)

        threading.Thread(target=choose, name="tokenmix-backend-check").start()
        return choice

    def _use_chosen_backend(self) -> None:
        """Wait for the backend choice and encode with it from here on."""
        self.spec = dataclasses.replace(self.spec, backend=self._backend.result().name)

    def _choose_backend(self, ledger: CacheLedger) -> BackendChoice:
        """Pick the tokenizer backend on the first ``BACKEND_SAMPLE_BYTES`` of the first shard left to read: encoded by
        both backends into what the cache would hold, they must agree for ``fastokens`` to be used."""
        sample, sampled = None, "no sample"
        if self.options.tokenizer_backend != REFERENCE:
            sample, sampled = self._backend_sample(ledger)
        expected = DocumentEncoder(dataclasses.replace(self.spec, backend=REFERENCE)).encode(sample) if sample else None

        def sample_difference() -> str | None:
            if sample is None or expected is None:
                return None
            return chunk_difference(expected, DocumentEncoder(dataclasses.replace(self.spec, backend=FAST)).encode(sample))

        choice = choose_backend(self.spec.tokenizer_json, self.options.tokenizer_backend, sample_difference, sampled)
        log = logger.info if choice.name == FAST or self.options.tokenizer_backend == REFERENCE else logger.warning
        log("%s: encoding with %s (%s)", self.location, choice.name, choice.reason)
        return choice

    def _backend_sample(self, ledger: CacheLedger) -> tuple[RawChunk | None, str]:
        """The first records of the first shard left to read that can be read, and what they are (for the log)."""
        for shard, progress in zip(self.shards, ledger.shards):
            if progress.finished:
                continue
            try:
                first = next(iter(shard.read(progress.position, BACKEND_SAMPLE_BYTES)), None)
            except ShardReadError:
                continue  # the build reports it where it reads the shard
            if first is None:
                continue
            records, room = [], BACKEND_SAMPLE_BYTES
            for record in first.records:
                size = approx_size(record)
                if size <= room or not records and size <= 16 * BACKEND_SAMPLE_BYTES:  # a very long document waits for the build
                    records.append(record)
                    room -= size
            if records:
                return RawChunk(first.start, records), f"{len(records)} records sampled from {shard.name}"
        return None, "no sample (no record short enough for one)"

    def _remaining_bytes(self, ledger: CacheLedger) -> int | None:
        sizes = [shard.size_bytes() for shard, p in zip(self.shards, ledger.shards) if not p.finished]
        return None if any(size is None for size in sizes) else sum(sizes)  # type: ignore[misc]

    def _open_ledger(self) -> CacheLedger:
        names = [s.name for s in self.shards]
        existing = self._docs.read(LEDGER_FILE)
        if existing is None:
            return CacheLedger(identity=self.identity, shards=[ShardProgress(n) for n in names], info=self.info, runs=[])
        ledger = CacheLedger.from_json(existing)
        if ledger.runs is None and ledger.rows == 0:
            ledger.runs = []
        ledger.check_identity(self.identity, self.location)
        ledger.extend_shards(names, self.location)
        for shard in ledger.shards:
            if shard.retry is not None:
                logger.info("%s: trying %s again (the last build skipped it: %s); its rows follow those already in the cache",
                            self.location, shard.name, shard.retry)
                shard.skip(shard.retry, -1)
                shard.skipped = {k: v for k, v in shard.skipped.items() if v}
                shard.retry, shard.error, shard.finished, ledger.finished = None, None, False, False
        if ledger.rows and not ledger.finished:
            logger.info("%s: resuming at row %d (%d of %d shards finished)", self.location, ledger.rows,
                        sum(s.finished for s in ledger.shards), len(ledger.shards))
        return ledger

    def _source_of(self, index: int) -> dict[str, Any] | None:
        """Shard ``index``'s identity now, or None when it cannot be had (its absence is reported where it is read)."""
        shard = self.shards[index]
        try:
            return shard.identity()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            logger.warning("%s: cannot tell whether it changed (%s: %s)", shard.name, type(e).__name__, e)
            return None

    def _check_sources(self, ledger: CacheLedger) -> bool:
        """Refuse shards whose records read so far changed since the cache read them (identities fetched all at once);
        returns whether a shard's identity changed with its records the same (the ledger then takes the new one)."""
        begun = [i for i, p in enumerate(ledger.shards) if p.source is not None]
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(begun)))) as pool:
            current = list(pool.map(self._source_of, begun))
        return any([self._check_source(ledger, index, identity) for index, identity in zip(begun, current)])

    def _check_source(self, ledger: CacheLedger, index: int, identity: dict[str, Any] | None) -> bool:
        """Go on with a shard whose identity is unchanged (False), or whose records read so far read back the same (True,
        and its identity is updated); else raise ``ShardChangedError``."""
        error = ledger.changed_source(index, identity, self.location)
        if error is None:
            return False
        progress = ledger.shards[index]
        if not records_unchanged(self.shards[index], progress, self.options.chunk_bytes):
            raise error
        logger.info("%s changed (%s -> %s), but the %d records the cache read from it are the same; going on",
                    progress.name, progress.source, identity, progress.position)
        progress.source = identity
        return True

    def _begin_shard(self, ledger: CacheLedger, index: int) -> None:
        """Record what a shard is before its first record is read (and, from its start, a digest of what is read)."""
        progress = ledger.shards[index]
        if progress.source is None:
            progress.source = self._source_of(index)
            if progress.position == 0:
                progress.digest = 0

    def _run(self, ledger: CacheLedger, array: JaggedArray) -> None:
        if self.executor is not None:
            self._run_on(self.executor, ledger, array)
            return
        with open_build_executor(self.options) as executor:
            self._run_on(executor, ledger, array)

    def _run_on(self, executor: EncoderPool | TaskExecutor, ledger: CacheLedger, array: JaggedArray) -> None:
        if isinstance(executor, TaskExecutor):
            self._run_on_cluster(executor, ledger, array)
            return
        try:
            self._run_with(executor, ledger, array)
        except BrokenProcessPool as e:
            raise RuntimeError(
                "a tokenizing worker process died (out of memory, killed, or it could not start: a script that builds "
                "caches must guard its top level with `if __name__ == '__main__':`, or set build.num_workers: 0); "
                f"the {ledger.rows} committed rows are kept and a re-run resumes"
            ) from e

    def _run_with(self, pool: EncoderPool, ledger: CacheLedger, array: JaggedArray) -> None:
        pending_writes: list[Any] = []
        self._last_commit = time.monotonic()
        max_in_flight = 2 * max(pool.num_workers, 1) + 2
        in_flight: deque[tuple[int, Future[EncodedChunk] | _ShardEnd]] = deque()

        def drain(until: int) -> None:
            while in_flight and (len(in_flight) > until or isinstance(in_flight[0][1], _ShardEnd) or in_flight[0][1].done()):
                index, pending = in_flight.popleft()
                if isinstance(pending, _ShardEnd):
                    self._apply_shard_end(ledger, array, pending, pending_writes)
                else:
                    self._apply_chunk(ledger, array, index, pending.result(), pending_writes)
                self._maybe_commit(ledger, array, pending_writes)

        events = self._read_events(ledger)
        read_ahead = []
        for event in events:  # reading needs no tokenizer: read while the backend is being chosen
            read_ahead.append(event)
            if self._backend.done() or len(read_ahead) >= max_in_flight:
                break
        self._use_chosen_backend()
        for index, event in itertools.chain(read_ahead, events):
            in_flight.append((index, pool.submit(self.spec, event) if isinstance(event, RawChunk) else event))
            drain(max_in_flight)
        drain(0)
        self._commit(ledger, array, pending_writes)

    def _run_on_cluster(self, cluster: TaskExecutor, ledger: CacheLedger, array: JaggedArray) -> None:
        """Submit a task per unfinished shard (a bounded window ahead), retry failed ones, apply results in shard order."""
        location = portable_location(self.location)
        self._use_chosen_backend()
        spec = cluster.share(self.spec)
        spec_key = hashlib.sha256(pickle.dumps(self.spec)).hexdigest()[:16]
        todo = deque(i for i, p in enumerate(ledger.shards) if not p.finished)
        limit = cluster.in_flight_limit()
        rates = ClusterRates(self.location, len(todo))
        tasks: dict[int, _ShardTask] = {}
        order: deque[int] = deque()
        """Submitted shards not yet applied, in shard order: the head is the next to commit."""
        failed: dict[int, str] = {}
        cleanups: list[Any] = []
        writes: list[Any] = []
        self._last_commit = time.monotonic()
        logger.info("%s: %d shards to build on %s, at most %d in flight", self.location, len(todo), cluster.name, limit)

        def submit(index: int, failures: int) -> None:
            self._begin_shard(ledger, index)
            job = ShardJob(index, portable(self.shards[index]), ledger.shards[index].position, location,
                           f"{index:06d}-{uuid.uuid4().hex[:12]}", spec_key, self.options.chunk_bytes, self.options.on_error == "raise")
            tasks[index] = _ShardTask(job, failures, cluster.submit(run_shard, job, spec))

        try:
            while True:
                while todo and not failed and len(order) < limit:
                    order.append(todo.popleft())
                    submit(order[-1], 0)
                if not order:
                    break
                head = order[0]
                out = {id(t.future): (i, t) for i, t in tasks.items() if t.result is None and i not in failed}
                head_ready = head in failed or tasks[head].result is not None
                for future in cluster.finished([t.future for _, t in out.values()], timeout=0.0 if head_ready else 1.0):
                    index, task = out[id(future)]
                    try:
                        task.result = future.result()
                    except Exception as e:  # the engine's own types: a lost worker, a task error, a cancelled task
                        cleanups.append(delete_staging(location, task.job.attempt))
                        self._on_task_failure(cluster, index, task, e, failed, submit)
                if head in failed:
                    self._commit(ledger, array, writes)
                    raise ShardTaskError(
                        f"{self.shards[head].name}: its task failed {cluster.max_retries + 1} times on {cluster.name} "
                        f"(build.executor.max_retries: {cluster.max_retries}); last error: {failed[head]}\n"
                        f"The cache keeps the {ledger.rows} rows committed before it; re-run the build to resume at this "
                        "shard, and raise build.executor.max_retries if workers are being lost (memory, preemption)."
                    )
                done = tasks[head].result
                if done is not None:
                    order.popleft()
                    del tasks[head]
                    self._apply_staged(ledger, array, done, location, writes)
                    cleanups.append(delete_staging(location, done.attempt))
                    rates.shard_done(done.worker, done.documents, done.tokens, done.seconds)
                    cleanups = [c for c in cleanups if not c.done()]
            self._commit(ledger, array, writes)
        finally:
            self._discard_staging(location, tasks.values(), cleanups)
        rates.log()

    def _discard_staging(self, location: str, tasks: Any, cleanups: list[Any]) -> None:
        """Cancel tasks still out (after a failure) and remove the staging area; never masks the build's own error."""
        for task in tasks:
            task.future.cancel()
        try:
            for cleanup in cleanups:
                cleanup.result()
            clear_staging(location)
        except Exception as e:  # storage errors while tidying up must not hide why the build stopped
            logger.warning("%s: could not remove the staging area (the next build removes it): %s", location, e)

    def _on_task_failure(self, cluster: TaskExecutor, index: int, task: _ShardTask, error: Exception,
                         failed: dict[int, str], submit: Any) -> None:
        message = f"{type(error).__name__}: {error}"
        name = self.shards[index].name
        if task.failures < cluster.max_retries:
            logger.warning("%s: try %d of %d failed on %s, retrying: %s", name, task.failures + 1, cluster.max_retries + 1,
                           cluster.name, message)
            submit(index, task.failures + 1)
        else:
            logger.error("%s: try %d of %d failed on %s: %s", name, task.failures + 1, cluster.max_retries + 1, cluster.name, message)
            failed[index] = message

    def _apply_staged(self, ledger: CacheLedger, array: JaggedArray, result: ShardResult, location: str, writes: list) -> None:
        """Append a finished shard task's staged chunks as the local path appends encoded chunks, then end the shard; the
        chunks of a shard whose end refuses its rows are not read."""
        end = _ShardEnd(result.index, result.read_error(self.shards[result.index].name))
        if not self._keeps_no_row(end):
            for chunk in staged_chunks(result, location):
                self._apply_chunk(ledger, array, result.index, chunk, writes)
                self._maybe_commit(ledger, array, writes)
        if result.complete:
            self._apply_shard_end(ledger, array, end, writes)
            self._maybe_commit(ledger, array, writes)

    def _read_events(self, ledger: CacheLedger) -> Iterator[tuple[int, RawChunk | _ShardEnd]]:
        for index, (shard, progress) in enumerate(zip(self.shards, ledger.shards)):
            if progress.finished:
                continue
            self._begin_shard(ledger, index)
            try:
                for chunk in shard.read(progress.position, self.options.chunk_bytes):
                    yield index, chunk
            except ShardReadError as e:
                yield index, _ShardEnd(index, e)
                continue
            yield index, _ShardEnd(index, None)

    def _apply_chunk(self, ledger: CacheLedger, array: JaggedArray, index: int, chunk: EncodedChunk, writes: list) -> None:
        shard = ledger.shards[index]
        if self._held is None and self.shards[index].verified_at_end:
            self._held = _HeldShard(index, dataclasses.replace(shard, skipped=dict(shard.skipped)), ledger.rows, ledger.tokens,
                                    self._span_values)
        if chunk.skipped:
            self._on_skipped(ledger, array, index, chunk, writes)
        if len(chunk.lengths):
            ledger.note_rows(index, chunk.start, self._span_values)
        writes.extend(array.write_rows(ledger.rows, ledger.tokens, chunk.tokens, chunk.lengths))
        if self._spans is not None:
            writes.extend(self._spans.write_rows(ledger.rows, self._span_values, chunk.spans, chunk.span_counts))
            self._span_values += len(chunk.spans)
        ledger.rows += len(chunk.lengths)
        ledger.tokens += len(chunk.tokens)
        shard.position = chunk.start + chunk.positions
        shard.records += chunk.records
        shard.rows += len(chunk.lengths)
        shard.tokens += len(chunk.tokens)
        shard.chars += chunk.chars
        shard.utf8_bytes += chunk.utf8_bytes
        shard.loss_tokens += chunk.loss_tokens
        if shard.digest is not None:
            shard.digest = (shard.digest + chunk.source_digest) & DIGEST_MASK
        if self.progress is not None:
            self.progress.update(len(chunk.lengths), len(chunk.tokens), chunk.consumed_bytes)

    def _on_skipped(self, ledger: CacheLedger, array: JaggedArray, index: int, chunk: EncodedChunk, writes: list) -> None:
        shard_name = self.shards[index].name
        errors = [s for s in chunk.skipped if s[1] not in FILTER_REASONS]
        if errors and self.options.on_error == "raise":
            before = "this chunk"
            if self._held is not None:
                self._take_back(ledger, array, writes)
                before = "this shard (a compressed shard's rows are kept only once it was read and checked to its end)"
            self._commit(ledger, array, writes)
            position, reason, detail = errors[0]
            raise BadInputError(
                f"{self.shards[index].position_label(position)}: {reason}: {detail}\n"
                f"The cache keeps the {ledger.rows} rows before {before}. Fix the input, or set "
                "on_error: skip (CLI: --build.on_error skip) to count and skip bad records."
            )
        for position, reason, detail in chunk.skipped:
            ledger.shards[index].skip(reason)
            if self._skips_logged < self.options.log_skipped:
                self._skips_logged += 1
                logger.warning("skipping %s: %s: %s", self.shards[index].position_label(position), reason, detail)
        if self._skips_logged == self.options.log_skipped:
            self._skips_logged += 1
            logger.warning("further skipped records in %s are counted in the statistics, not logged", shard_name)

    def _keeps_no_row(self, end: _ShardEnd) -> bool:
        """Whether a shard ends in a failure that refuses all its rows: one verified only at its end whose checksums
        failed there or were never reached."""
        return end.error is not None and self.shards[end.index].verified_at_end and end.error.reason not in CHECKED_END_REASONS

    def _take_back(self, ledger: CacheLedger, array: JaggedArray, writes: list) -> None:
        """Take back the rows of the held shard: the ledger and the arrays go back to where they stood before its first row,
        so the next rows are written in its place (its tokens, written but never published, are erased)."""
        held, self._held = self._held, None
        assert held is not None
        try:
            for write in writes:
                write.result()
            writes.clear()
            array.rewind(held.rows, held.tokens)
            if self._spans is not None:
                self._spans.rewind(held.rows, held.span_values)
        except ValueError as e:  # tensorstore's storage errors
            raise self._write_failed(e) from e
        ledger.rows, ledger.tokens, self._span_values = held.rows, held.tokens, held.span_values
        ledger.shards[held.index] = held.progress
        if ledger.runs is not None:
            ledger.runs = [run for run in ledger.runs if run[2] < held.rows]

    def _apply_shard_end(self, ledger: CacheLedger, array: JaggedArray, end: _ShardEnd, writes: list) -> None:
        name = self.shards[end.index].name
        refused = self._keeps_no_row(end)
        if refused and self._held is not None:
            self._take_back(ledger, array, writes)
        self._held = None
        shard = ledger.shards[end.index]
        problem = None
        if end.error is not None:
            taken_back = end.error.position - shard.position if refused else 0
            problem = (end.error.reason, f"{name}: {end.error.reason} after {end.error.position} record positions: {end.error.detail}"
                       + (f"; none of the {taken_back} record positions read is kept, as a compressed shard's records are "
                          "trusted only once its checksums passed at its end" if taken_back > 0 else ""))
        elif shard.records == 0:
            problem = ("empty_shard", f"{name}: empty_shard: the shard holds no records")
        else:
            self._check_source(ledger, end.index, self._source_of(end.index))  # changed while it was read
        if problem is not None:
            reason, message = problem
            if self.options.on_error == "raise":
                self._commit(ledger, array, writes)
                raise BadInputError(message + "\nFix or remove the shard, or set on_error: skip to count it and go on.")
            retried = reason in RETRIED_REASONS
            logger.warning("skipping %s %s%s", "all of" if refused else "the rest of", message,
                           "; the next build tries it again" if retried else "")
            shard.skip(reason)
            shard.error = message
            shard.retry = reason if retried else None
        shard.finished = True

    def _maybe_commit(self, ledger: CacheLedger, array: JaggedArray, writes: list) -> None:
        if self._held is None and time.monotonic() - self._last_commit >= self.options.commit_interval_s:
            self._commit(ledger, array, writes)
            self._last_commit = time.monotonic()

    def _commit(self, ledger: CacheLedger, array: JaggedArray, writes: list) -> None:
        assert self._held is None, f"{self.location}: committing rows of {self.shards[self._held.index].name} before its end"
        if self._lock is not None:
            self._lock.check()
        try:
            writes.extend(array.flush())
            if self._spans is not None:
                writes.extend(self._spans.flush())
            for write in writes:
                write.result()
            writes.clear()
            self._docs.write(LEDGER_FILE, ledger.to_json())
            self._publish(ledger, array)
        except ValueError as e:  # tensorstore's storage errors: a full disk, lost permissions, an unreachable bucket
            raise self._write_failed(e) from e

    def _write_failed(self, error: ValueError) -> CacheWriteError:
        return CacheWriteError(
            f"writing the cache at {self.location} failed: {storage_cause(error)}. Its {self._published:,} committed "
            "rows are kept: fix the storage (free space, permissions) and re-run the build, which resumes from there."
        )

    def _publish(self, ledger: CacheLedger, array: JaggedArray) -> None:
        """Publish the ledger's rows: loss spans first, so a reader never sees a row without its spans; never fewer rows."""
        assert ledger.rows >= self._published, f"{self.location}: publishing {ledger.rows} rows after {self._published}"
        if self._spans is not None:
            self._spans.publish(ledger.rows)
        array.publish(ledger.rows)
        self._published = ledger.rows
