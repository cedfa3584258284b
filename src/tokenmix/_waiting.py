"""Waiting for a cache that another process or thread is still building: polling with back-off."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_START_S = 0.05
POLL_MAX_S = 2.0


def poll_until(
    done: Callable[[], bool],
    timeout: float | None,
    timeout_message: Callable[[], str],
    on_first_wait: Callable[[], None] | None = None,
) -> None:
    """Return once ``done()`` is true, polling with exponential back-off.

    ``on_first_wait`` runs once, the first time ``done()`` is false (to log why we wait). Raises
    ``TimeoutError`` with ``timeout_message()`` when ``timeout`` seconds pass first.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay, waited = POLL_START_S, False
    while not done():
        if not waited and on_first_wait is not None:
            on_first_wait()
        waited = True
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(timeout_message())
        time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, POLL_MAX_S)
