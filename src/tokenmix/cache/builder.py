"""Building a cache: tokenize in parallel, commit rows in listed-shard order.

``CacheBuilder`` runs one build from start to end: it takes the cache's build lock, opens (or starts) the ledger and
checks the shards read so far, opens the arrays (``open``, giving an ``OpenBuild``), then runs the build where
``build.executor`` says and writes the statistics (``OpenBuild.finish``). The two halves are apart so that a run over
many caches (``build_run.py``) can open the next caches and finish the last ones beside one stream of chunks. The
parts, one module each:

- ``local_build.py``: on this machine, the driver reads shards in listed order and cuts them into chunks, which the
  encoding pool (``encoding.py``) tokenizes in parallel; they are taken back in submission order.
- ``cluster_build.py``: on a cluster (Ray, Dask) each task reads and encodes a whole shard and stages its tokens under
  the cache (``shard_task.py``); the driver takes finished shards in listed order and retries failed tasks.
- ``appending.py``: either way, each chunk is appended at the next free row and each shard ended, with the bad-input
  policy; ``commits.py`` commits (ledger, then ``offsets[0]``) every ``commit_interval_s`` and holds a shard verified
  only at its end (a compressed file: ``Shard.verified_at_end``) until then, taking its rows back when its checksums
  fail there (or are never reached).
- ``backend_choice.py``: the tokenizer backend, chosen on a sample while the first shards are read;
  ``source_checks.py``: that the shards read so far have not changed.

So rows are in listed-shard order whatever the worker count, a killed build resumes from its ledger and rewrites
exactly the bytes it would have written, and readers see only committed rows.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from tokenmix.cache.appending import ShardAppender
from tokenmix.cache.backend_choice import BackendChoices, ChoosingBackend
from tokenmix.cache.cluster_build import build_on_cluster
from tokenmix.cache.commits import CacheCommits
from tokenmix.cache.encoding import EncoderPool, open_build_executor
from tokenmix.cache.encoding_continuity import check_encoding, encoding_state
from tokenmix.cache.ledger import ENCODING_KEY, LEDGER_FILE, CacheLedger, ShardProgress
from tokenmix.cache.local_build import PoolBuild, build_on_pool
from tokenmix.cache.lock import LOCK_FILE, BuildLock, build_lock
from tokenmix.cache.open_object import forget_open_object, write_open_object
from tokenmix.cache.options import BuildOptions
from tokenmix.cache.progress import BuildProgress
from tokenmix.cache.shard_task import clear_staging, portable_location
from tokenmix.cache.source_checks import SourceChecks
from tokenmix.cache.stats import ALREADY_BUILT, STATS_FILE, compute_stats
from tokenmix.cache.store import CacheWriteError, JsonDocuments, make_durable, remove_interrupted_writes, unwritable
from tokenmix.execution.configs import LocalExecutorConfig
from tokenmix.execution.task_executor import TaskExecutor
from tokenmix.formats.backends import FAST, REFERENCE, preload_fast
from tokenmix.formats.encoder_spec import EncoderSpec
from tokenmix.sources.shards import Shard

logger = logging.getLogger(__name__)


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
        self._sources = SourceChecks(location, self.shards, options.chunk_bytes)

    def build(self) -> dict[str, Any]:
        """Run the build to the end and return the cache statistics (a finished cache is left untouched).

        Holds the cache's build lock throughout: a second builder of the same cache waits (``build.lock_timeout_s``)."""
        opened = self.open()
        if isinstance(opened, dict):
            return opened
        try:
            if opened.needs_building:
                opened.start_progress()
                try:
                    self._run(opened.appender, opened.choose_backend(BackendChoices()))
                finally:
                    opened.close_progress()
            return opened.finish()
        finally:
            opened.close()

    def open(self) -> OpenBuild | dict[str, Any]:
        """Take the build lock and open the ledger and arrays: the ``OpenBuild`` that takes the cache's chunks and holds
        its lock until closed; or, for a cache finished already, its stored statistics (the lock given back at once)."""
        started = time.monotonic()
        if isinstance(self.executor, TaskExecutor) or (self.executor is None and not isinstance(self.options.executor, LocalExecutorConfig)):
            portable_location(self.location)  # refuses a location cluster workers cannot reach, before anything starts
        lock = build_lock(self.location, self.options.lock, self.options.lock_timeout_s, self.options.lock_lease_s)
        lock.acquire()
        try:
            opened = self._open(lock, started)
        except BaseException:
            lock.release()
            raise
        if isinstance(opened, dict):
            lock.release()
        return opened

    def _open(self, lock: BuildLock, started: float) -> OpenBuild | dict[str, Any]:
        removed = remove_interrupted_writes(self.location, keep=(LOCK_FILE,))
        if removed:
            logger.info("%s: removed %d partial objects that interrupted writes left (a killed build, a power loss)",
                        self.location, removed)
        docs = JsonDocuments(self.location, deferred_sync=True)
        ledger, fresh = self._open_ledger(docs)
        refreshed = self._sources.check_begun(ledger)
        if ledger.finished:
            stats = docs.read(STATS_FILE)
            if stats is not None:  # nothing to build: keep the record of the build that made the cache
                if refreshed:
                    docs.write(LEDGER_FILE, ledger.to_json())
                    make_durable(self.location)
                logger.info("%s: finished already, nothing to build", self.location)
                return {**stats, ALREADY_BUILT: True}
        encoding = encoding_state()
        if not ledger.rows or not ledger.finished and check_encoding(  # rows to add to: encoded as they were?
                self.location, ledger, self.shards, self.spec, encoding, self.options.chunk_bytes,
                FAST if self.options.tokenizer_backend == FAST else REFERENCE):
            ledger.info[ENCODING_KEY] = encoding
        if self.options.tokenizer_backend != REFERENCE:
            preload_fast(self.spec.tokenizer_json)  # while the arrays are opened and the first chunks read
        if not ledger.finished:  # being extended, or resumed: readers open it from its parts until it finishes again
            forget_open_object(self.location, deferred_sync=True)
        try:
            commits = CacheCommits(self.location, ledger, self.spec, self.options.compression, self.options.commit_interval_s, lock,
                                   fresh)
            if ledger.rows < commits.published:
                raise CacheWriteError(
                    f"cache at {self.location} publishes {commits.published:,} rows but its ledger accounts for {ledger.rows:,}: "
                    "it was written by two builders at once (before tokenmix locked builds) or edited by hand. Delete it and rebuild."
                )
            commits.publish()  # before the ledger (whose rows are stored already): whoever finds a ledger finds the row count
            docs.write(LEDGER_FILE, ledger.to_json())  # made durable, with the arrays, by the first commit's barrier
        except ValueError as e:  # tensorstore's storage errors
            raise unwritable(self.location, e) from None
        if not ledger.finished:
            logger.info("%s: building from %d shards", self.location, len(self.shards))
            clear_staging(self.location)  # what tasks of an earlier, killed run left: never part of the cache
        appender = ShardAppender(self.shards, self.options, commits, self._sources, self.progress)
        return OpenBuild(self, lock, docs, appender, started)

    def _run(self, appender: ShardAppender, backend: ChoosingBackend) -> None:
        """Run the build on the executor given, or on one opened for this build."""
        opened = contextlib.nullcontext(self.executor) if self.executor is not None else open_build_executor(self.options)
        with opened as executor:
            if isinstance(executor, TaskExecutor):
                build_on_cluster(executor, appender, backend)
            else:
                build_on_pool(executor, [PoolBuild(appender, backend)])

    def remaining_bytes(self, ledger: CacheLedger) -> int | None:
        """Input bytes of the shards left to read (None when a shard cannot tell its size)."""
        sizes = [shard.size_bytes() for shard, p in zip(self.shards, ledger.shards) if not p.finished]
        return None if any(size is None for size in sizes) else sum(sizes)  # type: ignore[misc]

    def _open_ledger(self, docs: JsonDocuments) -> tuple[CacheLedger, bool]:
        """The cache's ledger, and whether it is new (the cache has none yet)."""
        names = [s.name for s in self.shards]
        existing = docs.read(LEDGER_FILE)
        if existing is None:
            return CacheLedger(identity=self.identity, shards=[ShardProgress(n) for n in names], info=self.info, runs=[]), True
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
        return ledger, False


class OpenBuild:
    """One cache being built: its build lock held, its ledger and arrays open, taking encoded chunks through its
    ``appender`` until ``finish`` marks it finished and writes its statistics; ``close`` gives the lock back."""

    def __init__(self, builder: CacheBuilder, lock: BuildLock, docs: JsonDocuments, appender: ShardAppender, started: float):
        self.builder = builder
        self.appender = appender
        self.backend: ChoosingBackend | None = None
        self._lock: BuildLock | None = lock
        self._docs = docs
        self._started = started
        self._resumed_rows = appender.ledger.rows

    @property
    def needs_building(self) -> bool:
        """Whether shards are left to build (else the ledger says finished and only the statistics are missing)."""
        return not self.appender.ledger.finished

    def choose_backend(self, choices: BackendChoices) -> ChoosingBackend:
        """The tokenizer backend of this build, from ``choices``: chosen on this cache's sample if it is the first of its
        encoder spec to ask (a run asks in the order of the caches' locations, so which cache is sampled does not depend on timing)."""
        b = self.builder
        self.backend = choices.choose(b.location, b.shards, self.appender.ledger, b.spec, b.options.tokenizer_backend)
        return self.backend

    def start_progress(self) -> None:
        """Start the cache's progress bar (if it has one) over the input bytes left to read."""
        if self.builder.progress is not None:
            self.builder.progress.start(self.builder.remaining_bytes(self.appender.ledger))

    def close_progress(self) -> None:
        """Close the cache's progress bar (if it has one)."""
        if self.builder.progress is not None:
            self.builder.progress.close()

    def finish(self) -> dict[str, Any]:
        """Once every chunk was appended: mark the cache finished, commit, write and return its statistics, and give
        the lock back."""
        try:
            ledger, commits = self.appender.ledger, self.appender.commits
            choice = None
            if self.needs_building:
                assert self.backend is not None, f"{self.builder.location}: finished without a tokenizer backend"
                choice = self.backend.result()
                ledger.finished = True
                commits.commit()
            write_open_object(self.builder.location, ledger, commits.array, deferred_sync=True)  # of durable rows
            stats = compute_stats(ledger, commits.array, time.monotonic() - self._started, self._resumed_rows)
            if choice is not None:
                stats["build"]["tokenizer_backend"] = {"name": choice.name, "reason": choice.reason}
            commits.make_durable()  # the publication and open object, before the statistics that say nothing is left to build
            self._docs.write(STATS_FILE, stats)  # durable at the next barrier: lost, a re-run writes both again
            return stats
        finally:
            self.close()

    def close(self) -> None:
        """Give the build lock back (once); what was committed stays, and a later build resumes from it."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
