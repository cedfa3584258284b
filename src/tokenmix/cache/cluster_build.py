"""A build on a cluster (Ray, Dask): a task per unfinished shard, failed tasks retried, staged shards appended in order.

Each task reads and encodes a whole shard on a worker and leaves its tokens in the cache's staging area
(``shard_task.py``). The driver keeps at most the executor's in-flight limit of shards submitted ahead of the next one
to append, resubmits a failed task (a lost worker, storage) under a new attempt up to ``max_retries`` times, appends
finished shards' staged chunks in listed order exactly as locally encoded ones, and alone commits.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenmix.cache.appending import ShardAppender, ShardEnd
from tokenmix.cache.backend_choice import ChoosingBackend
from tokenmix.cache.progress import ClusterRates
from tokenmix.cache.shard_task import ShardJob, ShardResult, clear_staging, delete_staging, portable, portable_location, run_shard, staged_chunks
from tokenmix.execution.task_executor import TaskExecutor, TaskFuture

logger = logging.getLogger(__name__)


class ShardTaskError(RuntimeError):
    """A shard's task failed on every try on the cluster (worker lost, storage error, ...)."""


@dataclass
class _ShardTask:
    """A shard submitted to a cluster: its job, how many tries failed before it, and its result once fetched."""

    job: ShardJob
    failures: int
    future: TaskFuture
    result: ShardResult | None = None


def build_on_cluster(cluster: TaskExecutor, appender: ShardAppender, backend: ChoosingBackend) -> None:
    """Submit a task per unfinished shard (a bounded window ahead), retry failed ones, append results in shard order."""
    location = portable_location(appender.commits.location)
    label = appender.commits.location
    shards, ledger, options = appender.shards, appender.ledger, appender.options
    spec_value = backend.encoder_spec()
    spec = cluster.share(spec_value)
    spec_key = hashlib.sha256(pickle.dumps(spec_value)).hexdigest()[:16]
    todo = deque(i for i, p in enumerate(ledger.shards) if not p.finished)
    limit = cluster.in_flight_limit()
    rates = ClusterRates(label, len(todo))
    tasks: dict[int, _ShardTask] = {}
    order: deque[int] = deque()
    """Submitted shards not yet appended, in shard order: the head is the next to commit."""
    failed: dict[int, str] = {}
    cleanups: list[Any] = []
    logger.info("%s: %d shards to build on %s, at most %d in flight", label, len(todo), cluster.name, limit)

    def submit(index: int, failures: int) -> None:
        appender.sources.begin(ledger, index)
        job = ShardJob(index, portable(shards[index]), ledger.shards[index].position, location,
                       f"{index:06d}-{uuid.uuid4().hex[:12]}", spec_key, options.chunk_bytes, options.on_error == "raise")
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
                    _on_task_failure(cluster, shards[index].name, index, task, e, failed, submit)
            if head in failed:
                appender.commits.commit()
                raise ShardTaskError(
                    f"{shards[head].name}: its task failed {cluster.max_retries + 1} times on {cluster.name} "
                    f"(build.executor.max_retries: {cluster.max_retries}); last error: {failed[head]}\n"
                    f"The cache keeps the {ledger.rows} rows committed before it; re-run the build to resume at this "
                    "shard, and raise build.executor.max_retries if workers are being lost (memory, preemption)."
                )
            done = tasks[head].result
            if done is not None:
                order.popleft()
                del tasks[head]
                _append_staged(appender, done, location)
                cleanups.append(delete_staging(location, done.attempt))
                rates.shard_done(done.worker, done.documents, done.tokens, done.seconds)
                cleanups = [c for c in cleanups if not c.done()]
        appender.commits.commit()
    finally:
        _discard_staging(location, tasks.values(), cleanups)
    rates.log()


def _discard_staging(location: str, tasks: Any, cleanups: list[Any]) -> None:
    """Cancel tasks still out (after a failure) and remove the staging area; never masks the build's own error."""
    for task in tasks:
        task.future.cancel()
    try:
        for cleanup in cleanups:
            cleanup.result()
        clear_staging(location)
    except Exception as e:  # storage errors while tidying up must not hide why the build stopped
        logger.warning("%s: could not remove the staging area (the next build removes it): %s", location, e)


def _on_task_failure(cluster: TaskExecutor, name: str, index: int, task: _ShardTask, error: Exception, failed: dict[int, str],
                     submit: Callable[[int, int], None]) -> None:
    message = f"{type(error).__name__}: {error}"
    if task.failures < cluster.max_retries:
        logger.warning("%s: try %d of %d failed on %s, retrying: %s", name, task.failures + 1, cluster.max_retries + 1,
                       cluster.name, message)
        submit(index, task.failures + 1)
    else:
        logger.error("%s: try %d of %d failed on %s: %s", name, task.failures + 1, cluster.max_retries + 1, cluster.name, message)
        failed[index] = message


def _append_staged(appender: ShardAppender, result: ShardResult, location: str) -> None:
    """Append a finished shard task's staged chunks as the local path appends encoded chunks, then end the shard; the
    chunks of a shard whose end refuses its rows are not read."""
    end = ShardEnd(result.index, result.read_error(appender.shards[result.index].name))
    if not appender.keeps_no_row(end):
        for chunk in staged_chunks(result, location):
            appender.chunk(result.index, chunk)
            appender.commits.maybe_commit()
    if result.complete:
        appender.shard_end(end)
        appender.commits.maybe_commit()
