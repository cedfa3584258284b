"""The heuristic filters of repetition (Gopher): distinct lines and paragraphs, by count and by characters, from the
batch's line and paragraph counts (``analyses.lines``, ``analyses.paragraphs``); and the word n-grams that repeat,
scored in Python text by text, as NeMo does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, count
from operator import ne

import numpy as np
import pyarrow as pa

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import Pieces, as_utf8, lines, paragraphs
from tokenmix.curate.heuristics.scores import check_at_least, check_share, divide, finish


def _distinct_share(pieces: Pieces, by_chars: bool) -> np.ndarray:
    """Distinct pieces (or their characters) over all of them; 0 where there are none."""
    column = 2 if by_chars else 0
    return divide(pieces.counts[:, column + 1], pieces.counts[:, column], 0.0)


def _per_text(texts: pa.Array, score: Callable[[str], float]) -> pa.Array:
    """A score computed in Python for each non-null text."""
    values = [None if text is None else score(text) for text in as_utf8(texts).to_pylist()]
    return pa.array(values, type=pa.float64())


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


def _ngrams(words: list[str], n: int) -> zip[tuple[str, ...]]:
    return zip(*(words[k:] for k in range(n)))


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
        n = self.n

        def top_share(text: str) -> float:
            words = text.split()
            if len(words) < n:
                return 1.0
            # the first seen of the most frequent: NeMo takes whichever its set of n-grams yields first, which
            # changes with Python's hash seed
            ((gram, _),) = Counter(_ngrams(words, n)).most_common(1)
            top = " ".join(gram)
            return (len(text) - len(text.replace(top, ""))) / len(text)

        return _per_text(texts, top_share)

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
        n = self.n

        def duplicate_share(text: str) -> float:
            words = text.split()
            if len(words) < n:
                return 1.0
            first_seen: dict[tuple[str, ...], int] = {}
            firsts = map(first_seen.setdefault, _ngrams(words, n), count())
            covered_to = chars = 0
            # n-gram i repeats an earlier one where its first index is not i; the words it covers that an earlier
            # repeat did not are added, with the spaces before them (NeMo's count)
            for i in compress(count(), map(ne, firsts, count())):
                first_new = max(i, covered_to)
                chars += sum(map(len, words[first_new : i + n])) + min(i + n - first_new, n - 1)
                covered_to = i + n
            return chars / len(text)

        return _per_text(texts, duplicate_share)

    @property
    def reason(self) -> str:
        return f"{self.name}_{self.n}"

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_repeating_duplicate_ngram_ratio)
