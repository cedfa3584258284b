"""Builds on this machine: the driver reads the shards of each cache in turn, in listed order, and cuts them into
chunks; the encoding pool encodes them in parallel; the driver takes them back in submission order and appends each to
its cache.

One stream of chunks serves every cache of a run, so the pool stays busy across the caches' boundaries: the chunks of
the next caches are read and encoded while the last chunks of one are appended, and a cache whose last chunk was
appended is handed to ``PoolBuild.end`` (its final commit and statistics run beside the stream). At most
``2 x workers + 2`` chunks (and caches' ends) are in flight, which bounds memory. Reading needs no tokenizer, so the first chunks are read
while the tokenizer backend is still being chosen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from tokenmix.cache.appending import ShardAppender, ShardEnd
from tokenmix.cache.backend_choice import ChoosingBackend
from tokenmix.cache.encoding import EncoderPool
from tokenmix.formats.encoder import EncodedChunk
from tokenmix.sources.shards import RawChunk, ShardReadError


@dataclass
class PoolBuild:
    """One cache's part of a run on the pool: where its chunks go, how they are encoded, and what is called when its
    first chunk is about to be read (``begin``) and once its last one was appended (``end``)."""

    appender: ShardAppender
    backend: ChoosingBackend
    begin: Callable[[], None] | None = None
    end: Callable[[], None] | None = None


@dataclass
class _CacheEnd:
    """Marks the end of a cache's chunks in the stream."""

    build: PoolBuild


def build_on_pool(pool: EncoderPool, builds: Iterable[PoolBuild | None]) -> None:
    """Encode every unfinished shard of each build on ``pool`` and append it, committing as each build goes.

    ``builds`` is taken lazily, one build at a time, as the stream reaches it; None in it: the next build is not ready
    (its cache still being opened, maybe waiting for a lock another process holds), so every chunk in flight is appended
    and its build ended first, none held unfinished meanwhile. A build's final commit is its ``end``'s."""
    try:
        _run(pool, builds)
    except BrokenProcessPool as e:
        raise RuntimeError(
            "a tokenizing worker process died (out of memory, killed, or it could not start: a script that builds "
            "caches must guard its top level with `if __name__ == '__main__':`, or set build.num_workers: 0); "
            "the committed rows are kept and a re-run resumes"
        ) from e


def _run(pool: EncoderPool, builds: Iterable[PoolBuild | None]) -> None:
    max_in_flight = 2 * max(pool.num_workers, 1) + 2
    in_flight: deque[tuple[PoolBuild, int, Future[EncodedChunk] | ShardEnd | _CacheEnd]] = deque()
    chunks = 0
    """Chunks and cache ends in flight (not shard ends: a cache's shards are bounded by its own list)."""

    def drain(until: int) -> None:
        nonlocal chunks
        while in_flight and (chunks > until or not isinstance(in_flight[0][2], Future) or in_flight[0][2].done()):
            build, index, pending = in_flight.popleft()
            if isinstance(pending, _CacheEnd):
                chunks -= 1
                if build.end is not None:
                    build.end()
                continue
            if isinstance(pending, ShardEnd):
                build.appender.shard_end(pending)
            else:
                chunks -= 1
                build.appender.chunk(index, pending.result())
            build.appender.commits.maybe_commit()

    for build in builds:
        if build is None:
            drain(0)
            continue
        if build.begin is not None:
            build.begin()
        events = _read(build.appender)
        read_ahead = []
        for event in events:  # reading needs no tokenizer: read while the backend is being chosen
            read_ahead.append(event)
            if build.backend.done() or len(read_ahead) >= max_in_flight:
                break
        spec = build.backend.encoder_spec()
        for events_so_far in (read_ahead, events):
            for index, event in events_so_far:
                if isinstance(event, RawChunk):
                    in_flight.append((build, index, pool.submit(spec, event)))
                    chunks += 1
                else:
                    in_flight.append((build, index, event))
                drain(max_in_flight)
        in_flight.append((build, -1, _CacheEnd(build)))
        chunks += 1
        drain(max_in_flight)
    drain(0)


def _read(appender: ShardAppender) -> Iterator[tuple[int, RawChunk | ShardEnd]]:
    """The chunks of every unfinished shard in listed order, each shard followed by its end."""
    ledger = appender.ledger
    for index, (shard, progress) in enumerate(zip(appender.shards, ledger.shards)):
        if progress.finished:
            continue
        appender.sources.begin(ledger, index)
        try:
            for chunk in shard.read(progress.position, appender.options.chunk_bytes):
                yield index, chunk
        except ShardReadError as e:
            yield index, ShardEnd(index, e)
            continue
        yield index, ShardEnd(index, None)
