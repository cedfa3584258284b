"""One run of builds over many caches on one executor: each cache's fixed costs overlap the encoding of the others.

A cache's build has costs of its own besides encoding: taking its lock, reading its ledger, opening (or creating) its
arrays, and at the end its final commit and statistics; a few milliseconds each, mostly waiting on storage. Paid one
cache after another they add up (a thousand small sources: about 50 ms each, more than their encoding). So on this
machine's encoding pool the run does them beside the encoding:

- a few threads (``SETUP_THREADS``) open the next caches ahead of the one whose chunks the driver reads, at most
  ``OPEN_AHEAD`` at a time, and as many others finish each cache once its last chunk was appended;
- the driver reads every cache's chunks in one stream (``local_build.build_on_pool``), so the pool's workers, each
  holding its tokenizer once for the whole run, never wait at a cache's boundary;
- the tokenizer backend is chosen once per encoder spec (``backend_choice.BackendChoices``).

So the locks, open files and threads of a run are bounded by ``OPEN_AHEAD`` and the pool's in-flight chunks, whatever
the number of caches. Two runs sharing caches (two processes building one config, or configs listing its sources in
other orders) must never each wait for a lock the other holds. A run holds the locks of the caches it opened ahead, and
of those whose chunks are in the stream, while it waits for the next cache's; so:

- the caches are built in the order of their locations, whatever the order given: both runs take locks in one order;
- before waiting for a cache's opening, the driver lets the stream end the caches in it (``None`` to
  ``build_on_pool``), whose chunks would otherwise wait for it; and caches are finished on threads of their own
  (``FINISH_THREADS``), never queued behind openings that wait for a lock.

A run then waits only for a cache the other is building, or finishing, or holds ahead of one it is waiting for, which
the first run has passed, ended and given back (``tests/test_many_sources_build.py``: two processes, one config and
its reverse). Each cache is written exactly as a build of it alone writes it (its own ledger, commits and lock), so its
bytes do not depend on the others. On a cluster executor (Ray, Dask), whose unit of work is already a shard of
any cache, the caches are built one after another.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tokenmix.cache.backend_choice import BackendChoices
from tokenmix.cache.builder import CacheBuilder, OpenBuild
from tokenmix.cache.encoding import EncoderPool
from tokenmix.cache.local_build import PoolBuild, build_on_pool
from tokenmix.execution.task_executor import TaskExecutor

SETUP_THREADS = 8
"""Threads that open caches beside the encoding (and as many finish them: ``FINISH_THREADS``). Their work is mostly waiting on storage (each cache's
lock, ledger, array creations and publications end in an fsync, or a request on an object store), so they are more
than the cores; 4 left the driver waiting for the next cache's opening on a loaded 2-core machine."""
FINISH_THREADS = SETUP_THREADS
"""Threads that finish caches (final commit, statistics, lock given back): as many as opened and finished them when both
shared ``SETUP_THREADS``, apart so that a finish never waits behind openings waiting for another process's lock."""
OPEN_AHEAD = 32
"""Caches opened (lock held, ledger and arrays open) ahead of the stream, at most: enough to keep ``SETUP_THREADS``
busy while the driver appends."""


def build_all(builders: Sequence[CacheBuilder], executor: EncoderPool | TaskExecutor) -> list[dict[str, Any]]:
    """Build every cache on ``executor``; returns their statistics in the order given.

    On this machine's pool the caches are built in the order of their locations, so that runs sharing caches take their
    locks in one order (above). The first error stops the run: the caches being built keep what they committed and give
    their locks back, and a re-run resumes each of them."""
    if isinstance(executor, TaskExecutor):
        return [builder.build() for builder in builders]
    order = sorted(range(len(builders)), key=lambda k: builders[k].location)
    results = _PoolRun([builders[k] for k in order], executor).run()
    return [stats for _, stats in sorted(zip(order, results), key=lambda pair: pair[0])]


class _PoolRun:
    """The state of one run on this machine's pool: caches being opened, built and finished."""

    def __init__(self, builders: Sequence[CacheBuilder], pool: EncoderPool):
        self.builders = builders
        self.pool = pool
        self.choices = BackendChoices()
        self.results: list[dict[str, Any] | None] = [None] * len(builders)
        self._opening: deque[Future[OpenBuild | dict[str, Any]]] = deque()
        self._finishing: list[Future[None]] = []
        self._open: set[OpenBuild] = set()
        """Caches whose lock this run holds."""
        self._held = threading.Lock()
        self._next = 0
        """The next builder to open."""

    def run(self) -> list[dict[str, Any]]:
        with (ThreadPoolExecutor(SETUP_THREADS, thread_name_prefix="tokenmix-cache-setup") as self._setup,
              ThreadPoolExecutor(FINISH_THREADS, thread_name_prefix="tokenmix-cache-finish") as self._finisher):
            try:
                build_on_pool(self.pool, self._builds())
                for future in self._finishing:
                    future.result()
            except BaseException:
                self._give_back()
                raise
        assert all(stats is not None for stats in self.results)
        return self.results  # type: ignore[return-value]

    def _builds(self) -> Iterator[PoolBuild | None]:
        """The caches to build, in order, each opened by the time it is reached (finished ones are only recorded); None
        before waiting for an opening, so that the caches in the stream end (and give their locks back) first."""
        for position in range(len(self.builders)):
            self._open_ahead(position)
            if not self._opening[0].done():
                yield None
            opened = self._opening.popleft().result()
            if isinstance(opened, dict):
                self.results[position] = opened
                continue
            if not opened.needs_building:  # finished, its statistics missing
                self._finish_later(position, opened)
                continue
            yield PoolBuild(opened.appender, opened.choose_backend(self.choices), begin=opened.start_progress,
                            end=lambda position=position, opened=opened: self._finish_later(position, opened))
            self._raise_finishing_errors()

    def _open_ahead(self, position: int) -> None:
        """Open the cache at ``position`` (if not yet) and the next ones, while fewer than ``OPEN_AHEAD`` are open."""
        while self._next < len(self.builders) and (self._next <= position or self._open_count() < OPEN_AHEAD):
            self._opening.append(self._setup.submit(self._open_one, self.builders[self._next]))
            self._next += 1

    def _open_count(self) -> int:
        with self._held:
            return len(self._open) + len(self._opening)

    def _open_one(self, builder: CacheBuilder) -> OpenBuild | dict[str, Any]:
        opened = builder.open()
        if isinstance(opened, OpenBuild):
            with self._held:
                self._open.add(opened)
        return opened

    def _finish_later(self, position: int, opened: OpenBuild) -> None:
        opened.close_progress()
        self._finishing.append(self._finisher.submit(self._finish_one, position, opened))

    def _finish_one(self, position: int, opened: OpenBuild) -> None:
        try:
            self.results[position] = opened.finish()
        finally:
            with self._held:
                self._open.discard(opened)

    def _raise_finishing_errors(self) -> None:
        """Raise the first error of a cache finished so far (a failed final commit stops the run at once)."""
        running = []
        for future in self._finishing:
            if future.done():
                future.result()
            else:
                running.append(future)
        self._finishing = running

    def _give_back(self) -> None:
        """After an error: wait for the caches being opened and finished, then give back every lock still held."""
        for future in [*self._opening, *self._finishing]:
            try:
                future.result()
            except BaseException:  # the run raises its first error; the others leave nothing to undo
                pass
        with self._held:
            opened, self._open = list(self._open), set()
        for build in opened:
            build.close_progress()
            build.close()
