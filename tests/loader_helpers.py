"""Helpers shared by tests/test_loader.py and the multi-process worker (tests/loader_worker.py).

Importing this module does not import JAX, so the worker can set its device count first.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenmix import Dataset, TokenBatch
from tokenmix.datasets import Pending

DEMO_CORPUS = Path(__file__).resolve().parents[1] / "data" / "demo"
TOKENIZER = str(Path(__file__).resolve().parents[1] / "data" / "tokenizer")
SEQ_LEN = 128

MIXTURE_YAML = f"""
tokenizer: {TOKENIZER}
cache_dir: CACHE
mixture_block_size: 64
seed: 3
train_weights: {{linux_doc: 0.5, python_doc: 0.3, webster: 0.2}}
configs:
  linux_doc:
    train_urls: ["{DEMO_CORPUS}/linux_doc/train-{{00..01}}-of-02.jsonl.zst"]
  python_doc:
    train_urls: ["{DEMO_CORPUS}/python_doc/train-*.jsonl.zst"]
  webster:
    train_urls: ["{DEMO_CORPUS}/webster/train-{{00..01}}-of-02.jsonl.zst"]
build: {{num_workers: 0}}
"""


def mixture_yaml(cache_dir: str | Path) -> str:
    """The test mixture (three real sources of the bundled corpus slice) with its caches under ``cache_dir``."""
    return MIXTURE_YAML.replace("CACHE", str(cache_dir))


class Wrapped(Dataset):
    """A dataset that passes everything to ``base`` (and a mixture's ``names`` / ``locate``)."""

    def __init__(self, base: Dataset):
        self.base = base
        self.tokens_per_example = base.tokens_per_example

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r})"

    @property
    def names(self) -> list[str]:
        return self.base.names  # type: ignore[attr-defined]

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.base.locate(indices)  # type: ignore[attr-defined]

    def is_finite(self) -> bool:
        return self.base.is_finite()

    def current_len(self) -> int:
        return self.base.current_len()

    def final_len(self) -> int | None:
        return self.base.final_len()

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        return self.base.read(indices)


class CountingDataset(Wrapped):
    """Records the indices of every ``read`` call."""

    def __init__(self, base: Dataset):
        super().__init__(base)
        self.reads: list[np.ndarray] = []
        self._lock = threading.Lock()

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        with self._lock:
            self.reads.append(np.asarray(indices, np.int64).copy())
        return self.base.read(indices)
