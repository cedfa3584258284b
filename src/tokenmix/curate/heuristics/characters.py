"""The heuristic filters of a text's characters (code points; a byte that is not valid UTF-8 is one, U+FFFD): how many,
and what share are digits, layout, brackets or outside NeMo's alphanumeric set (Gopher). Each share is a ratio of the
batch's profile counts (``analyses.profile``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import as_utf8, profile
from tokenmix.curate.heuristics.scores import check_at_least, check_share, ratio


@DocumentFilter.register_subclass("char_length")
@dataclass(frozen=True)
class CharLengthFilter(DocumentFilter):
    """Number of characters (code points): bounds a document's size where words are not a good unit."""

    min_chars: int = 0
    """Fewest characters a kept document has."""
    max_chars: int | None = None
    """Most characters a kept document has; unset: no upper bound."""

    def __post_init__(self) -> None:
        check_at_least("min_chars", self.min_chars, 0)
        if self.max_chars is not None and self.max_chars < self.min_chars:
            raise ValueError(f"filter.max_chars must be >= min_chars ({self.min_chars}), got {self.max_chars}")

    def score(self, texts: pa.Array) -> pa.Array:
        return pc.utf8_length(as_utf8(texts)).cast(pa.int64())

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_chars, self.max_chars)


@DocumentFilter.register_subclass("non_alpha_numeric")
@dataclass(frozen=True)
class NonAlphaNumericFilter(DocumentFilter):
    """Share of characters outside ASCII letters, digits and ``\\n?!,.``: markup, tables and symbol soup (Gopher)."""

    max_non_alpha_numeric_to_text_ratio: float = 0.25
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_non_alpha_numeric_to_text_ratio", self.max_non_alpha_numeric_to_text_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        counts = profile(texts)
        return ratio(texts, counts["chars"] - counts["alphanumeric_chars"], "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_non_alpha_numeric_to_text_ratio)


@DocumentFilter.register_subclass("numbers")
@dataclass(frozen=True)
class NumbersFilter(DocumentFilter):
    """Share of characters that are ASCII digits: tables, logs and number dumps."""

    max_number_to_text_ratio: float = 0.15
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_number_to_text_ratio", self.max_number_to_text_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "digits", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_number_to_text_ratio)


@DocumentFilter.register_subclass("white_space")
@dataclass(frozen=True)
class WhiteSpaceFilter(DocumentFilter):
    """Share of characters that are space, tab, newline, carriage return or backspace: layout rather than text."""

    max_white_space_ratio: float = 0.25
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_white_space_ratio", self.max_white_space_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "layout_chars", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_white_space_ratio)


@DocumentFilter.register_subclass("parentheses")
@dataclass(frozen=True)
class ParenthesesFilter(DocumentFilter):
    """Share of characters that are brackets ``()[]{}⟨⟩``: code, markup and citation clutter."""

    max_parentheses_ratio: float = 0.1
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_parentheses_ratio", self.max_parentheses_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "brackets", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_parentheses_ratio)
