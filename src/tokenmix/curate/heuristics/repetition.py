"""The heuristic filters of repetition (Gopher): distinct lines and paragraphs, by count and by characters, from the
batch's line and paragraph counts (``analyses.lines``, ``analyses.paragraphs``); and the word n-grams that repeat,
from the batch's n-gram counts (``analyses.ngram_shares``), as NeMo defines them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import Pieces, lines, ngram_shares, paragraphs
from tokenmix.curate.heuristics.scores import check_at_least, check_share, divide, finish


def _distinct_share(pieces: Pieces, by_chars: bool) -> np.ndarray:
    """Distinct pieces (or their characters) over all of them; 0 where there are none."""
    column = 2 if by_chars else 0
    return divide(pieces.counts[:, column + 1], pieces.counts[:, column], 0.0)


@DocumentFilter.register_subclass("repeated_lines")
@dataclass(frozen=True)
class RepeatedLinesFilter(DocumentFilter):
    """Distinct non-blank lines over all of them (0 without lines): repeated navigation and template lines (Gopher)."""

    max_repeated_line_fraction: float = 0.7
    """Lowest fraction of distinct lines a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        check_share("max_repeated_line_fraction", self.max_repeated_line_fraction)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(_distinct_share(lines(texts), by_chars=False), texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.max_repeated_line_fraction, None)


@DocumentFilter.register_subclass("repeated_paragraphs")
@dataclass(frozen=True)
class RepeatedParagraphsFilter(DocumentFilter):
    """Distinct paragraphs over all of them: pages built of a repeated block (Gopher)."""

    max_repeated_paragraphs_ratio: float = 0.7
    """Lowest fraction of distinct paragraphs a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        check_share("max_repeated_paragraphs_ratio", self.max_repeated_paragraphs_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(_distinct_share(paragraphs(texts), by_chars=False), texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.max_repeated_paragraphs_ratio, None)


@DocumentFilter.register_subclass("repeated_lines_by_char")
@dataclass(frozen=True)
class RepeatedLinesByCharFilter(DocumentFilter):
    """Characters in the distinct non-blank lines over characters in all of them (0 without lines): repetition
    weighted by length, so that long repeated lines weigh more (Gopher)."""

    max_repeated_lines_char_ratio: float = 0.8
    """Lowest ratio a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        check_share("max_repeated_lines_char_ratio", self.max_repeated_lines_char_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(_distinct_share(lines(texts), by_chars=True), texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.max_repeated_lines_char_ratio, None)


@DocumentFilter.register_subclass("repeated_paragraphs_by_char")
@dataclass(frozen=True)
class RepeatedParagraphsByCharFilter(DocumentFilter):
    """Characters in the distinct paragraphs over characters in all of them (0 when the paragraphs have none):
    repetition weighted by length (Gopher)."""

    max_repeated_paragraphs_char_ratio: float = 0.8
    """Lowest ratio a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        check_share("max_repeated_paragraphs_char_ratio", self.max_repeated_paragraphs_char_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(_distinct_share(paragraphs(texts), by_chars=True), texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.max_repeated_paragraphs_char_ratio, None)


@DocumentFilter.register_subclass("repeating_top_ngrams")
@dataclass(frozen=True)
class RepeatingTopNGramsFilter(DocumentFilter):
    """Share of characters taken by the most frequent word n-gram (its space-joined text removed from the document;
    1.0 with fewer than n words): text that says one phrase over and over (Gopher; 2-, 3-, 4-grams at 0.20, 0.18, 0.16)."""

    n: int = 2
    """Words per n-gram."""
    max_repeating_ngram_ratio: float = 0.2
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_at_least("n", self.n, 1)
        check_share("max_repeating_ngram_ratio", self.max_repeating_ngram_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(ngram_shares(texts, "top", self.n), texts)

    @property
    def reason(self) -> str:
        return f"{self.name}_{self.n}"

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_repeating_ngram_ratio)


@DocumentFilter.register_subclass("repeating_duplicate_ngrams")
@dataclass(frozen=True)
class RepeatingDuplicateNGramsFilter(DocumentFilter):
    """Share of characters in words covered by a repeat of an earlier word n-gram (words plus one space between
    covered neighbours; 1.0 with fewer than n words): boilerplate repeated at length (Gopher; 5- to 10-grams at
    0.15 down to 0.10)."""

    n: int = 2
    """Words per n-gram."""
    max_repeating_duplicate_ngram_ratio: float = 0.2
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_at_least("n", self.n, 1)
        check_share("max_repeating_duplicate_ngram_ratio", self.max_repeating_duplicate_ngram_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(ngram_shares(texts, "duplicate", self.n), texts)

    @property
    def reason(self) -> str:
        return f"{self.name}_{self.n}"

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_repeating_duplicate_ngram_ratio)
