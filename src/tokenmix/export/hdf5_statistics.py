"""The statistics Cerebras's ``create_hdf5_dataset.py`` records under ``h5_dataset_stats``, counted as it counts them:
from the samples of the files written, after the fact.

``num_sequences``: samples; ``num_tokens``: their positions; ``non_pad_tokens``: input positions holding neither the
EOS nor the pad id (so a document's EOS is not counted); ``loss_valid_tokens``: the sum of the mask row (with
``inverted_mask``, the positions *not* trained on, as Cerebras sums it); ``detokenized_bytes`` and ``detokenized_chars``:
the UTF-8 bytes and characters of each sample's input row decoded whole, padding and special tokens included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

KEYS = ("num_sequences", "num_tokens", "detokenized_bytes", "detokenized_chars", "non_pad_tokens", "loss_valid_tokens")


class SampleStatistics:
    """Running ``h5_dataset_stats`` of the samples added."""

    def __init__(self, eos_id: int | None, pad_id: int, decode_batch: Callable[[list[list[int]]], list[str]]):
        self._eos = eos_id
        self._pad = pad_id
        self._decode_batch = decode_batch
        self.counts = dict.fromkeys(KEYS, 0)

    def add(self, samples: np.ndarray) -> None:
        inputs = samples[:, 0]
        counts = self.counts
        counts["num_sequences"] += len(samples)
        counts["num_tokens"] += inputs.size
        real = inputs != self._pad
        if self._eos is not None:
            real &= inputs != self._eos
        counts["non_pad_tokens"] += int(real.sum())
        counts["loss_valid_tokens"] += int(samples[:, 1].sum())
        texts = self._decode_batch(inputs.tolist())
        counts["detokenized_chars"] += sum(map(len, texts))
        counts["detokenized_bytes"] += sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)

    def merge(self, other: SampleStatistics) -> None:
        for key, value in other.counts.items():
            self.counts[key] += value

    def empty(self) -> SampleStatistics:
        """New statistics counted the same way, from nothing."""
        return SampleStatistics(self._eos, self._pad, self._decode_batch)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.counts)
