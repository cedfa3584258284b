"""``ul2r``: marin's Levanter format for UL2R denoising, read with its meaning.

marin's ``lib/levanter`` configs (``gpt2_nano_ul2r.yaml``, ``gpt2_eval_ul2r.yaml``) name ``format: {type: ul2r}`` with
``task_configs`` (per task: ``type: rx``, R/X-denoising with ``mask_prob``, ``mean_span_length``, ``random_roll``, or
``type: s``, S-denoising; each with its ``task_token_id``), ``task_probs`` (the share of documents each task gets, keyed
like ``task_configs``), ``rng_seed`` and the sentinel ids ``sentinel_token_id_start`` .. ``+ sentinel_token_id_count``.
What it caches is plain text tokenized as the ``text`` format does (Levanter's ``Ul2rDataset`` reads a text cache's
``input_ids``); the denoising happens when examples are read (``datasets/ul2r_denoising.py``): a task drawn per
document, noise spans replaced by sentinels, the task token first, loss on the targets only.

The YAMLs feed a format class that no stored marin commit holds, so tokenmix gives the fields the meaning of
``Ul2rDataset``'s arguments: the key is ``PRNGKey(rng_seed)``, the sentinels are ``sentinel_token_id_start`` and the
``sentinel_token_id_count - 1`` ids after it, tasks keep the order of ``task_configs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import draccus

from tokenmix.formats.base import FormatContext, LmDatasetFormatBase, RecordRenderer
from tokenmix.formats.text import TextLmDatasetFormat

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class DenoisingTaskConfig(draccus.ChoiceRegistry):
    """One UL2R task, chosen with ``type:`` (``rx`` or ``s``)."""

    task_token_id: int = -1
    """The token put first in the task's examples."""


@DenoisingTaskConfig.register_subclass("rx")
@dataclass(frozen=True)
class RXDenoisingTaskConfig(DenoisingTaskConfig):
    """R/X-denoising: spans of a document replaced by sentinels, the model writes them out."""

    mask_prob: float = 0.15
    """Share of the document's tokens in noise spans (``r`` in the UL2 paper)."""
    mean_span_length: float = 3.0
    """Mean length of a noise span (``mu`` in the paper)."""
    random_roll: bool = False
    """Roll the noise mask by a random offset, so that every mask is equally likely."""


@DenoisingTaskConfig.register_subclass("s")
@dataclass(frozen=True)
class SDenoisingTaskConfig(DenoisingTaskConfig):
    """S-denoising: a prefix of the document given, the rest to continue."""


@LmDatasetFormatBase.register_subclass("ul2r")
@dataclass(frozen=True)
class Ul2rLmDatasetFormat(TextLmDatasetFormat):
    """Text records for UL2R denoising (the cache is the text format's; the task table says how examples are made)."""

    task_configs: dict[str, DenoisingTaskConfig] = field(default_factory=dict)
    task_probs: dict[str, float] = field(default_factory=dict)
    rng_seed: int = 0
    sentinel_token_id_start: int | None = None
    sentinel_token_id_count: int = 100

    dataset_options = ("pack", "task_configs", "task_probs", "rng_seed", "sentinel_token_id_start", "sentinel_token_id_count")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.task_configs:
            raise ValueError("format ul2r: task_configs is empty; give at least one task ({type: rx, mask_prob, mean_span_length, "
                             "random_roll, task_token_id} or {type: s, task_token_id})")
        if set(self.task_probs) != set(self.task_configs):
            raise ValueError(f"format ul2r: task_probs keys {sorted(self.task_probs)} must be task_configs keys "
                             f"{sorted(self.task_configs)} (as Levanter requires)")
        if any(p < 0 for p in self.task_probs.values()) or not sum(self.task_probs.values()) > 0:
            raise ValueError(f"format ul2r: task_probs must be non-negative with a positive sum, got {self.task_probs}")
        for name, task in self.task_configs.items():
            if isinstance(task, RXDenoisingTaskConfig) and not (0 < task.mask_prob < 1 and task.mean_span_length > 0):
                raise ValueError(f"format ul2r: task_configs.{name}: mask_prob must be in (0, 1) and mean_span_length positive")
        if self.sentinel_token_id_start is None:
            raise ValueError("format ul2r: sentinel_token_id_start is not set; give the first of the sentinel token ids")
        if self.sentinel_token_id_count < 1:
            raise ValueError(f"format ul2r: sentinel_token_id_count must be at least 1, got {self.sentinel_token_id_count}: noise "
                             "spans are replaced by sentinels; give how many sentinel ids follow sentinel_token_id_start")

    def task_table(self) -> list[tuple[str, int, float, float, bool]]:
        """Each task in ``task_configs`` order as (kind, task token id, mask_prob, mean_span_length, random_roll)."""
        return [("rx", t.task_token_id, t.mask_prob, t.mean_span_length, t.random_roll) if isinstance(t, RXDenoisingTaskConfig)
                else ("s", t.task_token_id, 0.0, 0.0, False) for t in self.task_configs.values()]

    def probabilities(self) -> list[float]:
        """``task_probs`` in ``task_configs`` order."""
        return [self.task_probs[name] for name in self.task_configs]

    def sentinel_ids(self) -> np.ndarray:
        """The sentinel ids, in the order spans use them."""
        import numpy as np  # here: a config's formats are read without numpy

        return np.arange(self.sentinel_token_id_start, self.sentinel_token_id_start + self.sentinel_token_id_count)  # type: ignore[operator]

    def __hash__(self) -> int:  # the task tables are dicts; a format keys the encoders a build keeps
        return hash(repr(self))

    def bind(self, context: FormatContext) -> RecordRenderer:
        ids = {f"task_configs.{n}.task_token_id": t.task_token_id for n, t in self.task_configs.items()}
        ids["sentinel ids (sentinel_token_id_start + sentinel_token_id_count - 1)"] = \
            self.sentinel_token_id_start + self.sentinel_token_id_count - 1  # type: ignore[operator]
        ids["sentinel_token_id_start"] = self.sentinel_token_id_start  # type: ignore[assignment]
        for what, token_id in ids.items():
            if not 0 <= token_id < context.vocab_size:
                raise ValueError(f"format ul2r: {what} is {token_id}, outside the tokenizer's {context.vocab_size} ids; give the "
                                 "ids of tokens the tokenizer has (Levanter's configs add them to the tokenizer first)")
        return super().bind(context)
