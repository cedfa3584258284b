"""Running a list of independent tasks on a ``TaskExecutor``, retrying those the engine lost.

``run_tasks`` submits the tasks, keeps at most the executor's in-flight limit running, reports each result as it
arrives, and tries a task that failed for a reason other than its input (a lost worker, storage) again, up to the
executor's ``max_retries`` times. A task whose input is bad raises ``TaskInputError``: trying it again would fail the
same way, so it fails the run at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from tokenmix.execution.task_executor import TaskExecutor

logger = logging.getLogger(__name__)


class TaskInputError(ValueError):
    """A task's input is bad (a record, a file): trying the task again would fail the same way, so it is never retried."""


def run_tasks(executor: TaskExecutor, fn: Callable[[Any], Any], tasks: list[Any]) -> Iterator[tuple[int, Any]]:
    """Run ``fn(task)`` for every task, yielding ``(task index, result)`` as results arrive."""
    limit = executor.in_flight_limit()
    pending = list(range(len(tasks)))[::-1]
    tries = dict.fromkeys(range(len(tasks)), 0)
    running: dict[Any, int] = {}
    try:
        while pending or running:
            while pending and len(running) < limit:
                index = pending.pop()
                running[executor.submit(fn, tasks[index])] = index
            for future in executor.finished(list(running), timeout=1.0):
                index = running.pop(future)
                try:
                    result = future.result()
                except TaskInputError:
                    raise
                except Exception as e:
                    tries[index] += 1
                    if tries[index] > executor.max_retries:
                        raise
                    logger.warning("%s: task %d failed (%s: %s); trying again (%d of %d)", executor.name, index, type(e).__name__, e,
                                   tries[index], executor.max_retries)
                    pending.append(index)
                    continue
                yield index, result
    finally:
        for future in running:
            future.cancel()
