"""The heuristic filters of a text's words (runs of non-whitespace characters, ``str.split()``; NeMo splits Chinese and
Japanese with jieba and MeCab, which is not done here): how many, how long, and how many are symbols, stop words or
hold a letter (Gopher, C4). Each score is a ratio of the batch's profile counts (``analyses.profile``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import profile
from tokenmix.curate.heuristics.scores import check_at_least, check_share, finish, ratio


@DocumentFilter.register_subclass("word_count")
@dataclass(frozen=True)
class WordCountFilter(DocumentFilter):
    """Number of whitespace-separated words: drops stubs and giant dumps that are rarely prose."""

    min_words: int = 50
    """Fewest words a kept document has."""
    max_words: int | None = 100000
    """Most words a kept document has; unset: no upper bound."""

    def __post_init__(self) -> None:
        check_at_least("min_words", self.min_words, 0)
        if self.max_words is not None and self.max_words < self.min_words:
            raise ValueError(f"filter.max_words must be >= min_words ({self.min_words}), got {self.max_words}")

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(profile(texts)["words"], texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_words, self.max_words)


@DocumentFilter.register_subclass("mean_word_length")
@dataclass(frozen=True)
class MeanWordLengthFilter(DocumentFilter):
    """Mean characters per word (0 without words): very short or long means point to lists, code or gibberish (Gopher)."""

    min_mean_word_length: float = 3.0
    """Lowest mean word length a kept document has."""
    max_mean_word_length: float = 10.0
    """Highest mean word length a kept document has."""

    def __post_init__(self) -> None:
        check_at_least("min_mean_word_length", self.min_mean_word_length, 0)
        if self.max_mean_word_length < self.min_mean_word_length:
            raise ValueError(
                f"filter.max_mean_word_length must be >= min_mean_word_length ({self.min_mean_word_length}), got {self.max_mean_word_length}"
            )

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "nonspace_chars", "words", 0.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_mean_word_length, self.max_mean_word_length)


@DocumentFilter.register_subclass("symbols_to_words")
@dataclass(frozen=True)
class SymbolsToWordsFilter(DocumentFilter):
    """Share of words that are an ellipsis mark or mostly ``#`` (more ``#`` runs than half the word's length):
    hashtag spam and truncated teasers (Gopher)."""

    max_symbol_to_word_ratio: float = 0.1
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_symbol_to_word_ratio", self.max_symbol_to_word_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "symbol_words", "words", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_symbol_to_word_ratio)


@DocumentFilter.register_subclass("long_word")
@dataclass(frozen=True)
class LongWordFilter(DocumentFilter):
    """Characters in the longest word (0 without words): minified code, base64 and other unbroken blobs (C4)."""

    max_word_length: int = 1000
    """Longest word a kept document has."""

    def __post_init__(self) -> None:
        check_at_least("max_word_length", self.max_word_length, 0)

    def score(self, texts: pa.Array) -> pa.Array:
        return finish(profile(texts)["longest_word"], texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_word_length)


@DocumentFilter.register_subclass("common_english_words")
@dataclass(frozen=True)
class CommonEnglishWordsFilter(DocumentFilter):
    """Number of words that are one of Gopher's lowercase stop words (the, be, to, of, and, that, have, with): prose
    in English has them, lists, code and other languages do not."""

    min_num_common_words: int = 2
    """Fewest such words a kept document has."""
    stop_at_false: bool = True
    """Stop counting at ``min_num_common_words`` (NeMo's default; the score is then at most that, and a text of
    English is decided from its first words); false: the full count."""

    def __post_init__(self) -> None:
        check_at_least("min_num_common_words", self.min_num_common_words, 0)

    def score(self, texts: pa.Array) -> pa.Array:
        common = profile(texts)["common_words"]
        return finish(np.minimum(common, self.min_num_common_words) if self.stop_at_false else common, texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_num_common_words, None)


@DocumentFilter.register_subclass("words_without_alphabets")
@dataclass(frozen=True)
class WordsWithoutAlphabetsFilter(DocumentFilter):
    """Share of words with at least one alphabetic character (0 without words): number tables, symbol runs,
    encoded data (Gopher). Alphabetic: a letter (``str.isalpha``), a letter number or a circled Latin letter."""

    min_words_with_alphabets: float = 0.8
    """Lowest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("min_words_with_alphabets", self.min_words_with_alphabets)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "words_with_letters", "words", 0.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_words_with_alphabets, None)
