"""What every format shares: the base class ``format: {type: ...}`` chooses from, what a format renders a
record into, what it may ask of the tokenizer, and the errors and skip reasons of bad records.

A format says how a record becomes a document: which pieces of text (or literal token ids) it is made
of and which of its tokens are trained on (the loss-mask targets). Each format registers on
``LmDatasetFormatBase`` in its own module; names follow Levanter so its data configs parse unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import draccus

if TYPE_CHECKING:
    import numpy as np

FILTER_REASONS = frozenset({"too_long", "too_short", "empty_preference_pair"})
"""Skip reasons that are a format's deliberate filters (counted and logged), not bad input: they never
stop a build under ``on_error: raise``."""


class BadRecordError(ValueError):
    """A record that cannot become a document; ``reason`` is the counter it is skipped under."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass
class Rendered:
    """A record as the pieces its document is made of, before tokenizing.

    ``pieces`` are texts to tokenize (each on its own) or literal token ids, in document order.
    ``targets`` says per piece whether its tokens are trained on; None means every token is.
    ``char_targets`` is for a record rendered as a single text (chat): the target tokens are those
    overlapping these ``[start, end)`` character spans of it.
    """

    pieces: list[str | list[int]]
    targets: list[bool] | None = None
    char_targets: list[tuple[int, int]] | None = None
    chars: int = 0
    """Characters of the record's own text (for statistics)."""
    utf8_bytes: int = 0


def text_size(*texts: str) -> tuple[int, int]:
    """Characters and UTF-8 bytes of some texts, for statistics."""
    return sum(map(len, texts)), sum(len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts)


@dataclass(frozen=True)
class FormatContext:
    """What a format may need from the tokenizer besides encoding text."""

    token_to_id: Callable[[str], int | None]
    """The id of a token given by its string (sentinels, separators), or None when it has none."""
    vocab_size: int
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    """``bos_token``, ``eos_token``, ... as a chat template sees them."""
    chat_template: str | None = None
    """The tokenizer's own chat template."""


RecordRenderer = Callable[[dict[str, Any]], "Rendered | list[Rendered]"]
"""A record to its document, or to several (a preference pair is two, in cache order)."""

Pack = bool | int | Literal["pad"] | None
"""Levanter's ``pack`` (a dataset option, not part of what a cache holds): true packs whole documents into examples (at
most 64 a example), an int packs at most that many, ``pad`` puts one document in each example (padded), false cuts a
text stream into windows (one document per example for formats of separate examples), None is the format's default."""


@dataclass(frozen=True)
class LmDatasetFormatBase(abc.ABC, draccus.ChoiceRegistry):
    """How records of a source become documents; chosen in YAML with ``format: {type: ...}``."""

    adds_special_tokens: ClassVar[bool] = True
    """Whether BOS/EOS (``enforce_bos``/``enforce_eos``) go around each document; a chat template places its own."""
    reads_token_ids: ClassVar[bool] = False
    """Whether the format reads records' token ids itself (``prebuilt``), rather than the encoder taking any record with an
    ``input_ids`` field as already tokenized."""
    default_pack: ClassVar[Pack] = None
    """How examples are made when ``pack`` is unset (Levanter's defaults): windows of the token stream."""
    dataset_options: ClassVar[tuple[str, ...]] = ()
    """Fields that choose how the cache is read (e.g. Levanter's ``pack``), not what it holds: left out of
    the cache identity."""

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "text"

    @abc.abstractmethod
    def bind(self, context: FormatContext) -> RecordRenderer:
        """A function turning a record into ``Rendered`` pieces (``BadRecordError`` when it cannot).

        Raises ``ValueError`` when the format cannot work with this tokenizer (a missing sentinel token,
        a chat template that cannot mark assistant turns): called when a config is resolved, so a
        misconfigured format fails before any record is read.
        """

    @property
    def masks_loss(self) -> bool:
        """Whether only some tokens are trained on, so the cache stores loss-mask spans."""
        return False

    def plain_text_record(self, text: str) -> dict[str, Any]:
        """The record a whole plain-text file (``.txt`` shard) stands for."""
        raise BadRecordError("wrong_type", f"a plain-text file has no fields; format {self.get_choice_name(type(self))!r} needs JSON records")

    def length_limits(self) -> tuple[int | None, int | None]:
        """(shortest, longest) document in tokens that is kept; others are skipped as too_short/too_long."""
        return None, None

    def identity(self) -> dict[str, Any]:
        """What goes into the cache fingerprint: the format's name and every option that changes its tokens."""
        options = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.dataset_options}
        return {"type": self.get_choice_name(type(self)), **options}


def token_ids(value: Any, key: str, vocab_size: int) -> np.ndarray:
    """A record's list of token ids as int64, or ``BadRecordError`` (``wrong_type``, ``empty_document``,
    ``token_out_of_range``) naming the field ``key``."""
    import numpy as np  # here: a config's formats are read without numpy

    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BadRecordError("wrong_type", f"{key!r} must be a non-empty list of integers")
    if not value:
        raise BadRecordError("empty_document", f"{key!r} is empty: it must be a non-empty list of integers")
    low, high = min(value), max(value)  # checked before the int64 array, which an id past 2**63 would overflow
    if low < 0 or high >= vocab_size:
        raise BadRecordError("token_out_of_range", f"{key!r} holds ids outside [0, {vocab_size}): min {low}, max {high}")
    return np.asarray(value, dtype=np.int64)


def record_field(record: dict[str, Any], key: str, option: str) -> Any:
    """``record[key]``, or ``BadRecordError(missing_field)`` naming the record's fields and the option to set."""
    try:
        return record[key]
    except KeyError:
        keys = ", ".join(sorted(map(str, record))[:8])
        raise BadRecordError("missing_field", f"no {key!r} field (fields: {keys}); set format.{option}") from None
