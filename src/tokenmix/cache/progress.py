"""Progress display for cache builds: input bytes with ETA, documents/s and tokens/s; per-worker rates on a cluster."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


class BuildProgress(Protocol):
    """What a cache build reports while it runs."""

    def start(self, total_bytes: int | None) -> None:
        """The build is about to read ``total_bytes`` of stored input (None: unknown)."""
        ...

    def update(self, documents: int, tokens: int, input_bytes: int) -> None:
        """More documents, tokens and input bytes are done."""
        ...

    def close(self) -> None:
        ...


class TqdmProgress:
    """A tqdm bar over input bytes (so the ETA is real) with document and token rates."""

    def __init__(self, description: str, disable: bool | None = None):
        self.description = description
        self.disable = disable
        self._bar: tqdm | None = None
        self._docs = 0
        self._tokens = 0
        self._t0 = time.monotonic()

    def start(self, total_bytes: int | None) -> None:
        from tqdm.auto import tqdm  # here: a build without bars does not pay its import (30-40 ms, importlib.metadata)

        self._t0 = time.monotonic()
        self._bar = tqdm(
            total=total_bytes, desc=self.description, unit="B", unit_scale=True, unit_divisor=1024,
            disable=self.disable, dynamic_ncols=True, mininterval=0.5,
        )

    def update(self, documents: int, tokens: int, input_bytes: int) -> None:
        self._docs += documents
        self._tokens += tokens
        if self._bar is None:
            return
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        self._bar.set_postfix_str(
            f"{self._docs:,} docs {self._docs / elapsed:,.0f} docs/s {self._tokens / elapsed / 1e6:.2f}M tok/s", refresh=False
        )
        self._bar.update(input_bytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class ClusterRates:
    """What a build on a cluster logs as shards finish: shards done, aggregate rates, and each worker's rate.

    The aggregate documents/s and tokens/s are over wall time since the build started; a worker's rate
    is over the time its tasks ran, so a slow machine stands out however many tasks it got. A line is
    logged at most every ``log_interval_s``, and once more at the end.
    """

    def __init__(self, label: str, shards: int, log_interval_s: float = 30.0):
        self.label = label
        self.shards = shards
        self.log_interval_s = log_interval_s
        self.done = 0
        self.documents = 0
        self.tokens = 0
        self.workers: dict[str, list[float]] = {}
        """Per worker (``host:pid``): shards, tokens, seconds its tasks ran."""
        self._t0 = time.monotonic()
        self._last_log = self._t0

    def shard_done(self, worker: str, documents: int, tokens: int, seconds: float) -> None:
        """A shard's task (run by ``worker`` in ``seconds``) has been committed."""
        self.done += 1
        self.documents += documents
        self.tokens += tokens
        account = self.workers.setdefault(worker, [0, 0, 0.0])
        account[0] += 1
        account[1] += tokens
        account[2] += seconds
        if time.monotonic() - self._last_log >= self.log_interval_s:
            self.log()

    def worker_rates(self) -> dict[str, float]:
        """Tokens per second of each worker while its tasks ran."""
        return {w: tokens / max(seconds, 1e-9) for w, (_, tokens, seconds) in self.workers.items()}

    def log(self) -> None:
        self._last_log = time.monotonic()
        if not self.shards:
            return
        elapsed = max(self._last_log - self._t0, 1e-9)
        rates = sorted(self.worker_rates().items(), key=lambda kv: kv[1])
        if len(rates) <= 8:
            per_worker = ", ".join(f"{w} {r / 1e6:.2f}M" for w, r in rates)
        else:
            per_worker = f"slowest {rates[0][0]} {rates[0][1] / 1e6:.2f}M, median {rates[len(rates) // 2][1] / 1e6:.2f}M, " \
                         f"fastest {rates[-1][0]} {rates[-1][1] / 1e6:.2f}M"
        logger.info("%s: %d/%d shards, %.0f docs/s, %.2fM tok/s from %d workers (tok/s each while busy: %s)",
                    self.label, self.done, self.shards, self.documents / elapsed, self.tokens / elapsed / 1e6, len(rates), per_worker)
