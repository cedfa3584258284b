"""Produce items for consecutive steps ahead of the consumer, in a background thread with a bounded buffer.

The thread hands each item over as soon as it is made, so the consumer's first ``get`` returns when
the first item is ready, never after the buffer fills. At most ``depth`` finished items wait in the
queue (one more may be in the making). An exception in the producer is handed over in its place and
re-raised by ``get``; the thread then stops. ``close`` stops the thread and waits for it, so no thread
outlives its prefetcher. ``depth=0`` produces synchronously in ``get`` and starts no thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

END = object()
"""What a producer returns when there is nothing at this step or after it (a finite dataset's end)."""

_PUT_POLL_S = 0.1
_GET_POLL_S = 0.5
_JOIN_TIMEOUT_S = 60.0


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher(Generic[T]):
    """Calls ``produce(step, stop)`` for ``step = start, start + 1, ...`` ahead of ``get``.

    ``produce`` returns the step's item, or ``END`` when iteration is over; it should return soon after
    ``stop`` is set (it is passed so that long waits can be abandoned on ``close``).
    """

    def __init__(self, produce: Callable[[int, threading.Event], T | object], start: int, depth: int, name: str = "tokenmix-prefetch"):
        if depth < 0:
            raise ValueError(f"prefetch must be >= 0, got {depth}")
        self._produce = produce
        self._steps = itertools.count(start)
        self._stop = threading.Event()
        self._done = False
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        for step in self._steps:
            if self._stop.is_set():
                return
            try:
                item = self._produce(step, self._stop)
            except BaseException as e:  # every failure must reach the consumer, or it would wait forever
                item = _Failure(e)
            if not self._put(item) or item is END or isinstance(item, _Failure):
                return

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> T | object:
        """The next step's item, or ``END``; re-raises the producer's exception (after which it returns ``END``)."""
        if self._done:
            return END
        if self._thread is None:
            try:
                item = self._produce(next(self._steps), self._stop)
            except BaseException:
                self._done = True
                raise
        else:
            item = self._take()
        if item is END or isinstance(item, _Failure):
            self._done = True
            self.close()
        if isinstance(item, _Failure):
            raise item.error
        return item

    def _take(self) -> object:
        assert self._thread is not None
        while True:
            try:
                return self._queue.get(timeout=_GET_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    if self._stop.is_set():
                        return END
                    raise RuntimeError("the prefetch thread stopped without handing over a result") from None

    def close(self) -> None:
        """Stop producing and wait for the thread to finish; idempotent, safe from any thread.

        A producer blocked on the full queue sees the stop within ``_PUT_POLL_S``; one in the middle of a
        step finishes that step first (reads are short, and the loader's waits for a growing cache poll
        the stop event).
        """
        self._stop.set()
        self._done = True
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout=_JOIN_TIMEOUT_S)
        if thread.is_alive():
            logger.warning("the prefetch thread is still busy %.0f s after close (a read that does not return); it is a daemon thread",
                           _JOIN_TIMEOUT_S)
