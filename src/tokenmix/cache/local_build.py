"""A build on this machine: the driver reads the shards in listed order and cuts them into chunks, the encoding pool
encodes them in parallel, and the driver takes them back in submission order and appends them.

At most ``2 x workers + 2`` chunks are in flight, which bounds memory. Reading needs no tokenizer, so the first chunks
are read while the tokenizer backend is still being chosen.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

from tokenmix.cache.appending import ShardAppender, ShardEnd
from tokenmix.cache.backend_choice import ChoosingBackend
from tokenmix.cache.encoding import EncoderPool
from tokenmix.formats.encoder import EncodedChunk
from tokenmix.sources.shards import RawChunk, ShardReadError


def build_on_pool(pool: EncoderPool, appender: ShardAppender, backend: ChoosingBackend) -> None:
    """Encode every unfinished shard on ``pool`` and append it, committing as the build goes and at the end."""
    try:
        _run(pool, appender, backend)
    except BrokenProcessPool as e:
        raise RuntimeError(
            "a tokenizing worker process died (out of memory, killed, or it could not start: a script that builds "
            "caches must guard its top level with `if __name__ == '__main__':`, or set build.num_workers: 0); "
            f"the {appender.ledger.rows} committed rows are kept and a re-run resumes"
        ) from e


def _run(pool: EncoderPool, appender: ShardAppender, backend: ChoosingBackend) -> None:
    max_in_flight = 2 * max(pool.num_workers, 1) + 2
    in_flight: deque[tuple[int, Future[EncodedChunk] | ShardEnd]] = deque()

    def drain(until: int) -> None:
        while in_flight and (len(in_flight) > until or isinstance(in_flight[0][1], ShardEnd) or in_flight[0][1].done()):
            index, pending = in_flight.popleft()
            if isinstance(pending, ShardEnd):
                appender.shard_end(pending)
            else:
                appender.chunk(index, pending.result())
            appender.commits.maybe_commit()

    events = _read(appender)
    read_ahead = []
    for event in events:  # reading needs no tokenizer: read while the backend is being chosen
        read_ahead.append(event)
        if backend.done() or len(read_ahead) >= max_in_flight:
            break
    spec = backend.encoder_spec()
    for index, event in itertools.chain(read_ahead, events):
        in_flight.append((index, pool.submit(spec, event) if isinstance(event, RawChunk) else event))
        drain(max_in_flight)
    drain(0)
    appender.commits.commit()


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
