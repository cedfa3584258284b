"""Progress display for cache builds: input bytes with ETA, documents/s and tokens/s."""

from __future__ import annotations

import time
from typing import Protocol

from tqdm.auto import tqdm


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
