"""What configs set of the datasets, and its checks: shuffles, packing of long documents, mixture weight schedules and
stop strategies.

A config checks these when it is read, and every build and training launch reads one; so this module needs no numpy
(nor anything that does), and the datasets that act on the settings (``order.py``, ``block_shuffle.py``,
``packing.py``, ``mixture.py``) import them from here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class BlockShuffle:
    """Levanter's ``BlockShuffleConfig`` (``shuffle: {io_block_size, window_blocks, perm_type}``)."""

    io_block_size: int
    """Consecutive examples that stay together as a block."""
    window_blocks: int
    """Blocks whose examples are permuted together."""
    perm_type: Literal["feistel", "linear"] = "feistel"
    """Accepted: tokenmix's permutations are keyed Feistel permutations."""

    def __post_init__(self) -> None:
        if not isinstance(self.io_block_size, int) or self.io_block_size < 1:
            raise ValueError(f"shuffle.io_block_size must be a positive number of examples, got {self.io_block_size!r}")
        if not isinstance(self.window_blocks, int) or self.window_blocks < 1:
            raise ValueError(f"shuffle.window_blocks must be a positive number of blocks, got {self.window_blocks!r}")
        if self.perm_type not in ("feistel", "linear"):
            raise ValueError(f"shuffle.perm_type must be feistel or linear, got {self.perm_type!r}")


Shuffle = bool | int | BlockShuffle
"""False: in order; True: a full permutation per epoch; an int: permute within eras of that many examples; a
``BlockShuffle``: blocks permuted, then examples within windows of blocks."""


def check_shuffle(shuffle: Shuffle, where: str) -> None:
    """Reject a shuffle setting that is neither a bool, a positive era length nor a block shuffle."""
    if isinstance(shuffle, BlockShuffle):
        return
    if not isinstance(shuffle, bool) and (not isinstance(shuffle, int) or shuffle < 1):
        raise ValueError(f"{where}: `shuffle` must be true, false, a positive era length or a block shuffle "
                         f"({{io_block_size, window_blocks}}), got {shuffle!r}")


LongDocuments = Literal["truncate", "truncate_start", "split"]
LONG_DOCUMENTS = ("truncate", "truncate_start", "split")


def check_packing(max_segments: int | None, long_documents: str, seq_len: int | None = None) -> None:
    """Refuse packing settings that cannot work, naming the setting."""
    if seq_len is not None and seq_len < 2:
        raise ValueError(f"packing: seq_len must be >= 2, got {seq_len}")
    if max_segments is not None and max_segments < 1:
        raise ValueError(f"packing: max_segments_per_example must be >= 1 (or null for no cap), got {max_segments}")
    if long_documents not in LONG_DOCUMENTS:
        raise ValueError(f"packing: long_documents must be one of {LONG_DOCUMENTS}, got {long_documents!r}")


StopStrategy = Literal["restart", "first_exhausted", "all_exhausted"]
STOP_STRATEGIES = ("restart", "first_exhausted", "all_exhausted")

Weights = Mapping[str, float]
WeightSchedule = Weights | Sequence[tuple[int, Weights]]
"""A dict of weights, or ``[(start_index, weights), ...]`` stages starting at index 0."""


def is_weight(value: object) -> bool:
    """Whether ``value`` can weigh a mixture source: a real number, finite and >= 0 (numpy's numbers included)."""
    if type(value) is float:  # the usual case, without the numbers ABCs' cost
        return 0 <= value < math.inf
    return isinstance(value, numbers.Real) and bool(value >= 0) and (isinstance(value, numbers.Rational) or math.isfinite(value))


def normalize_schedule(weights: WeightSchedule, names: Sequence[str], *, unit: str = "index") -> list[tuple[int, dict[str, float]]]:
    """Check a weight schedule against the source names and return it as a list of stages.

    ``unit`` is what the stage starts count (``index``: examples, or ``step`` in a config), for the messages.
    """
    stages = schedule_stages(weights, unit)
    known = set(names)
    for start, stage in stages:
        check_stage(stage, names, stage_name(start, not isinstance(weights, Mapping), unit), known)
    return [(start, dict(stage)) for start, stage in stages]


def schedule_stages(weights: WeightSchedule, unit: str = "index") -> list[tuple[int, Weights]]:
    """A weight schedule's stages, their starts checked (the first at 0, then increasing) but not their weights: the
    mappings given, not copies, so that a long log costs one list."""
    stages = [(0, weights)] if isinstance(weights, Mapping) else [(int(s), w) for s, w in weights]
    if not stages:
        raise ValueError("train_weights: at least one stage is needed")
    if stages[0][0] != 0:
        raise ValueError(f"train_weights: the first stage must start at {unit} 0, not {stages[0][0]}")
    for (a, _), (b, _) in zip(stages, stages[1:]):
        if b <= a:
            raise ValueError(f"train_weights: stage starts must increase, got {unit} {a} then {b}")
    for start, stage in stages:
        if not isinstance(stage, Mapping):
            raise ValueError(f"train_weights (the stage from {unit} {start}): give the weights as a mapping of source name to "
                             f"weight, not {type(stage).__name__}")
    return stages


def stage_name(start: int, staged: bool, unit: str = "index") -> str:
    """How messages name the stage from ``start``: ``train_weights`` alone when it is the only one, given as a dict."""
    return f"train_weights (the stage from {unit} {start})" if staged else "train_weights"


def check_stage(stage: Mapping[str, float], names: Sequence[str], where: str, known: set[str] | None = None) -> None:
    """Refuse a stage's weights that name an unknown source, are not finite numbers >= 0, or are all 0; ``where`` names
    the stage in the message."""
    known = known if known is not None else set(names)
    if stage.keys() <= known and _plainly_valid(stage.values()):
        return
    unknown = sorted(set(stage) - known)
    if unknown:
        raise ValueError(f"{where}: unknown source(s) {unknown}; the sources are {sorted(names)}")
    for name, value in stage.items():
        if not is_weight(value):
            raise ValueError(f"{where}: source {name!r} has weight {value!r}; give it a finite number >= 0 (0 leaves it out)")
    if sum(stage.values()) <= 0:
        raise ValueError(f"{where}: at least one weight must be positive")


def _plainly_valid(values: Iterable[object]) -> bool:
    """Whether ``values`` are plain Python numbers, finite, >= 0, not all 0: the usual stage, of a thousand sources as of
    three, checked in one pass; anything else goes through ``is_weight`` one value at a time."""
    positive = False
    for value in values:
        kind = type(value)
        if not (kind is float and 0 <= value < math.inf or kind is int and value >= 0):
            return False
        positive = positive or value > 0
    return positive
