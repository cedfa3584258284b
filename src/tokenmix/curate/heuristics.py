"""NeMo Curator's heuristic document filters (Gopher, Rae et al. 2021, and C4), scoring a whole batch of texts at once.

The scores follow ``nemo_curator/filters/heuristic_filter.py``: a word is a run of non-whitespace characters
(``str.split()``; NeMo splits Chinese and Japanese with jieba and MeCab, which is not done here), a line is a
``\\n``-separated piece that is not blank, a paragraph a ``\\n\\n``-separated piece, a length counts characters.

The word, character and line filters are ratios of per-text counts that one pass of compiled code over the batch's
UTF-8 bytes makes for all of them (``_text_scan.c``: words, characters by class, lines by how they start and end,
URL characters), and the four repetition filters of counts that one more pass makes for lines and one for paragraphs
(distinct pieces by a hash of their bytes, compared byte by byte where hashes meet). The counts are made once per
batch and kept for every filter that asks while the batch is the same, and cut down to the kept texts when a filter
removes some, so a pipeline of these filters reads each batch's text about three times (the scan, lines,
paragraphs). What a character is comes from this module's constants (``_classes``). Characters are counted as
Arrow's ``utf8_length`` counts them; a byte that does not start a valid UTF-8 sequence (Arrow does not check a
Parquet shard's strings) is one character, U+FFFD, and no text is read past its end. Boilerplate paragraphs use
Arrow's string kernels, and the n-gram scores loop over the documents in Python.

Where NeMo divides by zero (a text without words or lines), the score is the one that removes the document, as
NeMo's own convention for empty texts does: 1.0 for a ratio that must stay low, 0.0 for one that must stay high.
"""

from __future__ import annotations

import functools
import string
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, count
from operator import ne
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate import _text_scan
from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.records import as_array

WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
"""The characters ``str.split()`` and ``str.strip()`` treat as whitespace (``str.isspace``); Arrow's
``utf8_trim_whitespace`` uses the same set."""

ELLIPSIS_MARKS = ("...", "[...]", "\u2026", "(...)", "[\u2026]", "-\u00bb", "read more..", "read more")
"""NeMo's ellipsis marks: a word that is one counts as a symbol, a line that ends with one (lowercased) as an ellipsis line."""

BULLETS = "\u2022\u2023\u2043\u204c\u204d\u2219\u25cb\u25cf\u25d8\u25e6\u29be\u29bf"
"""NeMo's bullet characters (C4): a line whose first non-space character is one is a bullet line."""

END_MARKS = ".?!\"'"
"""Characters that end a line of prose (C4's punctuation rule)."""

COMMON_ENGLISH_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
"""Gopher's stop words; matched in lowercase only, so that shouting in capitals does not count."""

POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "privacy overview",
    "use of cookies",
    "use cookies",
    "privacy & cookies policy",
    "privacy and cookies policy",
    "this website uses cookies to improve your experience while you navigate through the website. out of these cookies, the cookies "
    "that are categorized as necessary are stored on your browser as they are essential for the working of basic functionalities of "
    "the website. we also use third-party cookies that help us analyze and understand how you use this website. these cookies will be "
    "stored in your browser only with your consent. you also have the option to opt-out of these cookies. but opting out of some of "
    "these cookies may have an effect on your browsing experience.",
    "necessary cookies are absolutely essential for the website to function properly. this category only includes cookies that "
    "ensures basic functionalities and security features of the website. these cookies do not store any personal information.",
    "any cookies that may not be particularly necessary for the website to function and is used specifically to collect user personal "
    "data via analytics, ads, other embedded contents are termed as non-necessary cookies. it is mandatory to procure user consent prior "
    "to running these cookies on your website.",
    "this site uses cookies, including for analytics, personalization, and advertising purposes. for more information or to change "
    "your cookie settings, click here.",
    "if you continue to browse this site without changing your cookie settings, you agree to this use. acceptread more",
)
"""NeMo's boilerplate strings (after C4), lowercase: a paragraph that contains one (lowercased) is boilerplate."""

BOILERPLATE_CANDIDATES = ("(?i:cookie)", "(?i:privacy)", "(?i:terms of use)", "(?i:lorem ipsum)")
"""What every text whose lowercase holds one of ``POLICY_SUBSTRINGS`` or "lorem ipsum" holds one of. RE2's case folding
matches all that lowercases to these letters (the Kelvin sign too); the one other character that lowercases to ASCII,
``İ``, lowercases to ``i`` and a combining dot, and no word here ends in ``i``. RE2 finds each alone by a fast literal
search, where their alternation takes a byte-by-byte scan."""

URL_PATTERN = r"https?://[!$-_a-z]+"
"""NeMo's URL regex written as one character class: ``[$-_]`` already holds the digits, capitals, ``@.&+*(),%``."""

_ALPHANUMERIC = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789\n?!,."
_SPACE_CHARS = "\t\n\r\b "
_PARENTHESES = "{}[]()\u27e8\u27e9"
_DIGITS = "0123456789"
_URL_CHARS = "!" + "".join(map(chr, range(ord("$"), ord("_") + 1))) + string.ascii_lowercase
"""``URL_PATTERN``'s class: what may follow ``http(s)://`` in a URL."""
_SYMBOL_WORDS = tuple(mark.encode() for mark in ELLIPSIS_MARKS if not any(c in WHITESPACE for c in mark))
"""The ellipsis marks that can be a word on their own: such a word is a symbol."""
_COMMON_WORDS = tuple(sorted(word.encode() for word in COMMON_ENGLISH_WORDS))
_ELLIPSIS_MARKS = tuple(mark.encode() for mark in ELLIPSIS_MARKS)
_CIRCLED_LETTERS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))
_PROFILE_FIELD = {name: i for i, name in enumerate(_text_scan.PROFILE_FIELDS)}


def _ratio_check(field: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"filter.{field} must be between 0 and 1, got {value}")


def _at_least(field: str, value: float, low: float) -> None:
    if value < low:
        raise ValueError(f"filter.{field} must be >= {low}, got {value}")


def _literal(text: str) -> str:
    """``text`` as an RE2 pattern that matches it literally."""
    return rf"\Q{text}\E"


def _as_utf8(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    texts = as_array(texts)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())
    return texts


def _finish(values: np.ndarray, texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Scores as an Arrow array, null where the text is null."""
    return pa.array(values, mask=np.asarray(texts.is_null(), dtype=bool) if texts.null_count else None)


def _divide(numerator: np.ndarray, denominator: np.ndarray, empty: float) -> np.ndarray:
    """``numerator / denominator``, and ``empty`` where the denominator is 0."""
    out = np.full(len(denominator), empty, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _is_alphabetic(code: int) -> bool:
    char = chr(code)
    return char.isalpha() or unicodedata.category(char) == "Nl" or any(low <= code <= high for low, high in _CIRCLED_LETTERS)


@functools.cache
def _classes() -> np.ndarray:
    """Each code point's classes for ``_text_scan`` (its bits), from this module's constants. Whether a character
    outside ASCII is a letter (``_is_alphabetic``) is decided, and kept here, when a scan first meets it."""
    classes = np.zeros(_text_scan.MAX_CODE, dtype=np.uint16)
    for chars, bit in ((WHITESPACE, _text_scan.SPACE), (_ALPHANUMERIC, _text_scan.ALNUM), (_DIGITS, _text_scan.DIGIT),
                       (_SPACE_CHARS, _text_scan.LAYOUT), (_PARENTHESES, _text_scan.BRACKET), (string.ascii_letters, _text_scan.LETTER),
                       (BULLETS, _text_scan.BULLET), (END_MARKS, _text_scan.END_MARK), (_URL_CHARS, _text_scan.URL), ("#", _text_scan.HASH)):
        classes[[ord(c) for c in chars]] |= np.uint16(bit)
    classes[:0x80] |= np.uint16(_text_scan.KNOWN)
    return classes


def _bytes_of(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The texts' UTF-8 bytes as one array, and where each text starts and ends in it (null texts are empty)."""
    if texts.null_count:
        texts = pc.fill_null(texts, "")
    _, offsets_buffer, data_buffer = texts.buffers()
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.zeros(1, np.int64)
    if len(texts):
        offsets = np.frombuffer(offsets_buffer, dtype=width)[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
    size = int(offsets[-1] - offsets[0])
    data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[0] + size] if size else np.zeros(0, np.uint8)
    return data, offsets - offsets[0]


@dataclass(frozen=True)
class _Profile:
    """Per text, the counts ``_text_scan.profile`` makes in one pass (``PROFILE_FIELDS``: words, characters by class,
    lines by how they start and end, ...), from which every word, character and line heuristic is a ratio."""

    counts: np.ndarray

    def __getitem__(self, field: str) -> np.ndarray:
        return self.counts[:, _PROFILE_FIELD[field]]

    def kept(self, keep: np.ndarray) -> _Profile:
        return _Profile(self.counts[keep])


def _scan_profile(texts: pa.Array) -> _Profile:
    data, bounds = _bytes_of(texts)
    counts = np.empty((len(texts), len(_PROFILE_FIELD)), dtype=np.int64)
    _text_scan.profile(data, bounds, _classes(), _is_alphabetic, _SYMBOL_WORDS, _COMMON_WORDS, _ELLIPSIS_MARKS, counts)
    return _Profile(counts)


@dataclass(frozen=True)
class _Pieces:
    """Each text cut at a separator: per text, how many pieces and characters, and how many of them are distinct."""

    counts: np.ndarray
    """Per text: pieces, distinct pieces, characters in the pieces, characters in the distinct ones."""

    def share(self, by_chars: bool) -> np.ndarray:
        """Distinct pieces (or their characters) over all of them; 0 where there are none."""
        column = 2 if by_chars else 0
        return _divide(self.counts[:, column + 1], self.counts[:, column], 0.0)

    def kept(self, keep: np.ndarray) -> _Pieces:
        return _Pieces(self.counts[keep])


def _count_pieces(texts: pa.Array, newlines: int, skip_blank: bool) -> _Pieces:
    data, bounds = _bytes_of(texts)
    counts = np.empty((len(texts), 4), dtype=np.int64)
    _text_scan.pieces(data, bounds, _classes(), newlines, skip_blank, counts)
    return _Pieces(counts)


@dataclass
class _Batch:
    """A batch of texts and what filters derived from it, kept for the next filter while the batch is the same: a
    stage that removes nothing passes its table on unchanged, and one scan serves many filters. What was derived also
    outlives a stage that removes texts, cut down to the kept ones (``carry_analyses``). The batch is held so that its
    buffers' addresses, the key, stay its own."""

    key: tuple
    texts: pa.Array
    derived: dict


_LAST_BATCH = threading.local()


def _key(texts: pa.Array) -> tuple:
    return (texts.type, texts.offset, len(texts), *(0 if b is None else b.address for b in texts.buffers()))


def _derived(texts: pa.Array, name: object, compute: Callable[[pa.Array], Any]) -> Any:
    """``compute(texts)``, or what it gave for the same batch (the same buffers, offset and length) just before."""
    texts = _as_utf8(texts)
    key = _key(texts)
    batch = getattr(_LAST_BATCH, "batch", None)
    if batch is None or batch.key != key:
        batch = _LAST_BATCH.batch = _Batch(key, texts, {})
    value = batch.derived.get(name)
    if value is None:
        value = batch.derived[name] = compute(texts)
    return value


def carry_analyses(texts: pa.Array, keep: np.ndarray, kept: pa.Array) -> None:
    """Tells the filters that a stage kept the ``keep`` rows of the batch ``texts`` as the batch ``kept``: what they
    derived from ``texts`` (per-text counts) is cut down to the kept rows instead of scanning the kept texts again."""
    batch = getattr(_LAST_BATCH, "batch", None)
    if batch is None or batch.key != _key(_as_utf8(texts)):
        return
    keep = np.asarray(keep, dtype=bool)
    kept = _as_utf8(kept)
    _LAST_BATCH.batch = _Batch(_key(kept), kept, {name: value.kept(keep) for name, value in batch.derived.items()})


def _profile(texts: pa.Array) -> _Profile:
    return _derived(texts, "profile", _scan_profile)


def _pieces(texts: pa.Array, newlines: int, skip_blank: bool) -> _Pieces:
    return _derived(texts, ("pieces", newlines, skip_blank), lambda t: _count_pieces(t, newlines, skip_blank))


def _lines(texts: pa.Array) -> _Pieces:
    """Non-blank ``\\n``-separated lines."""
    return _pieces(texts, 1, skip_blank=True)


def _paragraphs(texts: pa.Array) -> _Pieces:
    """``\\n\\n``-separated paragraphs, blank ones too."""
    return _pieces(texts, 2, skip_blank=False)


def _ratio(texts: pa.Array, counted: str | np.ndarray, total: str, empty: float) -> pa.Array:
    """Each text's ``counted`` (a profile field, or counts) over its ``total``; ``empty`` where the total is 0."""
    profile = _profile(texts)
    numerator = profile[counted] if isinstance(counted, str) else counted
    return _finish(_divide(numerator, profile[total], empty), texts)


def _matching(texts: pa.Array, *patterns: str) -> np.ndarray:
    """Indices of the texts that any of the ``patterns`` matches somewhere."""
    found = np.zeros(len(texts), dtype=bool)
    for pattern in patterns:
        found |= np.asarray(pc.fill_null(pc.match_substring_regex(texts, pattern), False), dtype=bool)
    return np.flatnonzero(found)


def _per_text(texts: pa.Array, score: Callable[[str], float], integers: bool = False) -> pa.Array:
    """A score computed in Python for each non-null text."""
    values = [None if text is None else score(text) for text in _as_utf8(texts).to_pylist()]
    return pa.array(values, type=pa.int64() if integers else pa.float64())


@DocumentFilter.register_subclass("word_count")
@dataclass(frozen=True)
class WordCountFilter(DocumentFilter):
    """Number of whitespace-separated words: drops stubs and giant dumps that are rarely prose."""

    min_words: int = 50
    """Fewest words a kept document has."""
    max_words: int | None = 100000
    """Most words a kept document has; unset: no upper bound."""

    def __post_init__(self) -> None:
        _at_least("min_words", self.min_words, 0)
        if self.max_words is not None and self.max_words < self.min_words:
            raise ValueError(f"filter.max_words must be >= min_words ({self.min_words}), got {self.max_words}")

    def score(self, texts: pa.Array) -> pa.Array:
        return _finish(_profile(texts)["words"], texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_words, self.max_words)


@DocumentFilter.register_subclass("char_length")
@dataclass(frozen=True)
class CharLengthFilter(DocumentFilter):
    """Number of characters (code points): bounds a document's size where words are not a good unit."""

    min_chars: int = 0
    """Fewest characters a kept document has."""
    max_chars: int | None = None
    """Most characters a kept document has; unset: no upper bound."""

    def __post_init__(self) -> None:
        _at_least("min_chars", self.min_chars, 0)
        if self.max_chars is not None and self.max_chars < self.min_chars:
            raise ValueError(f"filter.max_chars must be >= min_chars ({self.min_chars}), got {self.max_chars}")

    def score(self, texts: pa.Array) -> pa.Array:
        return pc.utf8_length(_as_utf8(texts)).cast(pa.int64())

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_chars, self.max_chars)


@DocumentFilter.register_subclass("mean_word_length")
@dataclass(frozen=True)
class MeanWordLengthFilter(DocumentFilter):
    """Mean characters per word (0 without words): very short or long means point to lists, code or gibberish (Gopher)."""

    min_mean_word_length: float = 3.0
    """Lowest mean word length a kept document has."""
    max_mean_word_length: float = 10.0
    """Highest mean word length a kept document has."""

    def __post_init__(self) -> None:
        _at_least("min_mean_word_length", self.min_mean_word_length, 0)
        if self.max_mean_word_length < self.min_mean_word_length:
            raise ValueError(
                f"filter.max_mean_word_length must be >= min_mean_word_length ({self.min_mean_word_length}), got {self.max_mean_word_length}"
            )

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "nonspace_chars", "words", 0.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_mean_word_length, self.max_mean_word_length)


@DocumentFilter.register_subclass("non_alpha_numeric")
@dataclass(frozen=True)
class NonAlphaNumericFilter(DocumentFilter):
    """Share of characters outside ASCII letters, digits and ``\\n?!,.``: markup, tables and symbol soup (Gopher)."""

    max_non_alpha_numeric_to_text_ratio: float = 0.25
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_non_alpha_numeric_to_text_ratio", self.max_non_alpha_numeric_to_text_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        profile = _profile(texts)
        return _ratio(texts, profile["chars"] - profile["alphanumeric_chars"], "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_non_alpha_numeric_to_text_ratio)


@DocumentFilter.register_subclass("symbols_to_words")
@dataclass(frozen=True)
class SymbolsToWordsFilter(DocumentFilter):
    """Share of words that are an ellipsis mark or mostly ``#`` (more ``#`` runs than half the word's length):
    hashtag spam and truncated teasers (Gopher)."""

    max_symbol_to_word_ratio: float = 0.1
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_symbol_to_word_ratio", self.max_symbol_to_word_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "symbol_words", "words", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_symbol_to_word_ratio)


@DocumentFilter.register_subclass("numbers")
@dataclass(frozen=True)
class NumbersFilter(DocumentFilter):
    """Share of characters that are ASCII digits: tables, logs and number dumps."""

    max_number_to_text_ratio: float = 0.15
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_number_to_text_ratio", self.max_number_to_text_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "digits", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_number_to_text_ratio)


@DocumentFilter.register_subclass("urls")
@dataclass(frozen=True)
class UrlsFilter(DocumentFilter):
    """Share of characters inside ``http(s)://`` URLs: link farms and navigation pages."""

    max_url_to_text_ratio: float = 0.2
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_url_to_text_ratio", self.max_url_to_text_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "url_chars", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_url_to_text_ratio)


@DocumentFilter.register_subclass("bullets")
@dataclass(frozen=True)
class BulletsFilter(DocumentFilter):
    """Share of non-blank lines that start with a bullet character: menus and link lists (Gopher)."""

    max_bullet_lines_ratio: float = 0.9
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_bullet_lines_ratio", self.max_bullet_lines_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "bullet_lines", "lines", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_bullet_lines_ratio)


@DocumentFilter.register_subclass("white_space")
@dataclass(frozen=True)
class WhiteSpaceFilter(DocumentFilter):
    """Share of characters that are space, tab, newline, carriage return or backspace: layout rather than text."""

    max_white_space_ratio: float = 0.25
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_white_space_ratio", self.max_white_space_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "layout_chars", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_white_space_ratio)


@DocumentFilter.register_subclass("parentheses")
@dataclass(frozen=True)
class ParenthesesFilter(DocumentFilter):
    """Share of characters that are brackets ``()[]{}⟨⟩``: code, markup and citation clutter."""

    max_parentheses_ratio: float = 0.1
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_parentheses_ratio", self.max_parentheses_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "brackets", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_parentheses_ratio)


@DocumentFilter.register_subclass("long_word")
@dataclass(frozen=True)
class LongWordFilter(DocumentFilter):
    """Characters in the longest word (0 without words): minified code, base64 and other unbroken blobs (C4)."""

    max_word_length: int = 1000
    """Longest word a kept document has."""

    def __post_init__(self) -> None:
        _at_least("max_word_length", self.max_word_length, 0)

    def score(self, texts: pa.Array) -> pa.Array:
        return _finish(_profile(texts)["longest_word"], texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_word_length)


@DocumentFilter.register_subclass("boilerplate_string")
@dataclass(frozen=True)
class BoilerPlateStringFilter(DocumentFilter):
    """Share of paragraphs that hold a cookie or policy notice (1.0 with "lorem ipsum" anywhere): pages that are
    mostly site furniture (after C4)."""

    max_boilerplate_string_ratio: float = 0.4
    """Highest share a kept document has."""
    remove_if_at_top_or_bottom: bool = True
    """Count boilerplate paragraphs at the top or bottom too (NeMo takes this setting but always counts them); false:
    a leading or trailing run of them (a banner, a footer) does not count, unless every paragraph is boilerplate."""

    def __post_init__(self) -> None:
        _ratio_check("max_boilerplate_string_ratio", self.max_boilerplate_string_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        texts = _as_utf8(texts)
        policy = "|".join(map(_literal, POLICY_SUBSTRINGS))
        scores = np.zeros(len(texts), dtype=np.float64)
        chosen = _matching(texts, *BOILERPLATE_CANDIDATES)
        if len(chosen):
            # str.lower() turns İ into i and a combining dot where Arrow's has a plain i: one match fewer, never more
            lowered = pc.utf8_lower(pc.replace_substring(texts.take(pa.array(chosen)), "\u0130", "i\u0307"))
            holding = _matching(lowered, f"lorem ipsum|{policy}")  # only these have a paragraph to count
            chosen, lowered = chosen[holding], lowered.take(pa.array(holding))
        if len(chosen):
            paragraphs = pc.split_pattern(lowered, "\n\n")
            boiler = np.asarray(pc.match_substring_regex(pc.list_flatten(paragraphs), policy), dtype=bool)
            offsets = np.asarray(paragraphs.offsets, dtype=np.int64)
            if self.remove_if_at_top_or_bottom:
                counts = np.add.reduceat(boiler, offsets[:-1], dtype=np.int64)
            else:
                counts = np.array([_inner_count(boiler[s:e]) for s, e in zip(offsets[:-1], offsets[1:])], dtype=np.int64)
            lorem = np.asarray(pc.match_substring(lowered, "lorem ipsum"), dtype=bool)
            scores[chosen] = np.where(lorem, 1.0, counts / np.diff(offsets))
        return _finish(scores, texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_boilerplate_string_ratio)


def _inner_count(flags: np.ndarray) -> int:
    """Flagged paragraphs, leaving out a leading and a trailing run of them unless all are flagged."""
    if flags.all():
        return len(flags)
    first = int(np.argmin(flags))
    last = len(flags) - int(np.argmin(flags[::-1]))
    return int(np.count_nonzero(flags[first:last]))


@DocumentFilter.register_subclass("repeated_lines")
@dataclass(frozen=True)
class RepeatedLinesFilter(DocumentFilter):
    """Distinct non-blank lines over all of them (0 without lines): repeated navigation and template lines (Gopher)."""

    max_repeated_line_fraction: float = 0.7
    """Lowest fraction of distinct lines a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        _ratio_check("max_repeated_line_fraction", self.max_repeated_line_fraction)

    def score(self, texts: pa.Array) -> pa.Array:
        return _finish(_lines(texts).share(by_chars=False), texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.max_repeated_line_fraction, None)


@DocumentFilter.register_subclass("repeated_paragraphs")
@dataclass(frozen=True)
class RepeatedParagraphsFilter(DocumentFilter):
    """Distinct paragraphs over all of them: pages built of a repeated block (Gopher)."""

    max_repeated_paragraphs_ratio: float = 0.7
    """Lowest fraction of distinct paragraphs a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        _ratio_check("max_repeated_paragraphs_ratio", self.max_repeated_paragraphs_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _finish(_paragraphs(texts).share(by_chars=False), texts)

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
        _ratio_check("max_repeated_lines_char_ratio", self.max_repeated_lines_char_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _finish(_lines(texts).share(by_chars=True), texts)

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
        _ratio_check("max_repeated_paragraphs_char_ratio", self.max_repeated_paragraphs_char_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _finish(_paragraphs(texts).share(by_chars=True), texts)

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
        _at_least("n", self.n, 1)
        _ratio_check("max_repeating_ngram_ratio", self.max_repeating_ngram_ratio)

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
        _at_least("n", self.n, 1)
        _ratio_check("max_repeating_duplicate_ngram_ratio", self.max_repeating_duplicate_ngram_ratio)

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


@DocumentFilter.register_subclass("punctuation")
@dataclass(frozen=True)
class PunctuationFilter(DocumentFilter):
    """Share of non-blank lines that do not end in ``. ? ! " '`` (1.0 without lines): menus, titles and fragments (C4)."""

    max_num_sentences_without_endmark_ratio: float = 0.85
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_num_sentences_without_endmark_ratio", self.max_num_sentences_without_endmark_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "lines_without_end_mark", "lines", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_num_sentences_without_endmark_ratio)


@DocumentFilter.register_subclass("ellipsis")
@dataclass(frozen=True)
class EllipsisFilter(DocumentFilter):
    """Share of non-blank lines that end in an ellipsis mark ("...", "…", "read more", ...; 1.0 without lines):
    teaser and snippet pages (C4)."""

    max_num_lines_ending_with_ellipsis_ratio: float = 0.3
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        _ratio_check("max_num_lines_ending_with_ellipsis_ratio", self.max_num_lines_ending_with_ellipsis_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "ellipsis_lines", "lines", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_num_lines_ending_with_ellipsis_ratio)


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
        _at_least("min_num_common_words", self.min_num_common_words, 0)

    def score(self, texts: pa.Array) -> pa.Array:
        common = _profile(texts)["common_words"]
        return _finish(np.minimum(common, self.min_num_common_words) if self.stop_at_false else common, texts)

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
        _ratio_check("min_words_with_alphabets", self.min_words_with_alphabets)

    def score(self, texts: pa.Array) -> pa.Array:
        return _ratio(texts, "words_with_letters", "words", 0.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_words_with_alphabets, None)


@DocumentFilter.register_subclass("pornographic_urls")
@dataclass(frozen=True)
class PornographicUrlsFilter(DocumentFilter):
    """1 if a URL in the text contains "porn", else 0: a cheap adult-content signal."""

    def score(self, texts: pa.Array) -> pa.Array:
        # NeMo looks for "porn" in each URL match; a URL run that reaches "porn" after http(s):// is the same thing
        found = pc.match_substring_regex(_as_utf8(texts), URL_PATTERN.removesuffix("+") + "*porn")
        return found.cast(pa.int64())

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, 0)


@DocumentFilter.register_subclass("substring")
@dataclass(frozen=True)
class SubstringFilter(DocumentFilter):
    """1 if the text has ``substring`` at ``position``, else 0: keeps documents that carry a marker (a prefix, a tag)."""

    substring: str = ""
    """The text to look for."""
    position: Literal["prefix", "suffix", "any"] = "any"
    """Where: at the start, at the end, or anywhere."""

    def __post_init__(self) -> None:
        if not self.substring:
            raise ValueError("filter.substring: give the text to look for")
        if self.position not in ("prefix", "suffix", "any"):
            raise ValueError(f"filter.position must be one of prefix, suffix, any, got {self.position!r}")

    def score(self, texts: pa.Array) -> pa.Array:
        texts = _as_utf8(texts)
        if self.position == "prefix":
            found = pc.starts_with(texts, self.substring)
        elif self.position == "suffix":
            found = pc.ends_with(texts, self.substring)
        else:
            found = pc.match_substring(texts, self.substring)
        return found.cast(pa.int64())

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, 1, None)
