"""The per-text counts every word, character, line, repetition and n-gram heuristic is a ratio of, for a whole batch at once:
by the compiled scan (``_text_scan.c``, a CPython extension that ``pip install`` builds where it finds a C compiler),
or, where it was not built, by the same counts in plain Python (``plain_scan``), with a warning in the log.

The compiled scan reads what a character is from a table of classes per code point (``_classes``), filled from
``character_classes``; a letter outside ASCII is decided by ``is_alphabetic`` the first time the scan meets it, and
kept in the table.
"""

from __future__ import annotations

import functools
import logging
import string
from types import ModuleType

import numpy as np

from tokenmix.curate.heuristics import character_classes as chars
from tokenmix.curate.heuristics import plain_scan

logger = logging.getLogger(__name__)

_SYMBOL_BYTES = tuple(word.encode() for word in chars.SYMBOL_WORDS)
_COMMON_BYTES = tuple(sorted(word.encode() for word in chars.COMMON_ENGLISH_WORDS))
_ELLIPSIS_BYTES = tuple(mark.encode() for mark in chars.ELLIPSIS_MARKS)


_COMPILED_NAMES = ("profile", "ngrams", "lines_and_paragraphs", "mentions")
"""What this version of the package calls in the compiled scan: a module built from an older source lacks some."""


@functools.cache
def compiled() -> ModuleType | None:
    """The compiled scan, or None (said once) where it was not built."""
    try:
        from tokenmix.curate.heuristics import _text_scan
    except ImportError as e:
        logger.warning("the heuristic filters' compiled text scan was not built when tokenmix was installed (%s): they count in "
                       "plain Python instead, and a pipeline of them takes two to three times as long. To build it, install "
                       "tokenmix again where a C compiler and the Python headers are found (gcc and python3-dev)", e)
        return None
    missing = [name for name in _COMPILED_NAMES if not hasattr(_text_scan, name)]
    if missing:
        logger.warning("the heuristic filters' compiled text scan at %s was built from an older _text_scan.c (it lacks %s): they "
                       "count in plain Python instead. To rebuild it, install tokenmix again (pip install -e . in a checkout)",
                       _text_scan.__file__, ", ".join(missing))
        return None
    return _text_scan


def profile_fields() -> tuple[str, ...]:
    """The columns of ``profile_counts``."""
    return (compiled() or plain_scan).PROFILE_FIELDS


def profile_counts(data: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per text ``data[bounds[t]:bounds[t + 1]]``, the counts ``profile_fields`` names: words, characters by class,
    the longest word, symbol, stop and lettered words, non-blank lines by how they start and end, URL characters."""
    scan = compiled()
    if scan is None:
        return plain_scan.profile(data, bounds)
    counts = np.empty((len(bounds) - 1, len(scan.PROFILE_FIELDS)), dtype=np.int64)
    scan.profile(data, bounds, _classes(), chars.is_alphabetic, _SYMBOL_BYTES, _COMMON_BYTES, _ELLIPSIS_BYTES, counts)
    return counts


def line_and_paragraph_counts(data: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per text, its non-blank ``\\n``-separated lines, the distinct ones, the characters in all of them and in the
    distinct ones; and the same of its ``\\n\\n``-separated paragraphs, blank ones too: from one pass over the texts."""
    scan = compiled()
    if scan is None:
        return plain_scan.pieces(data, bounds, 1, True), plain_scan.pieces(data, bounds, 2, False)
    lines = np.empty((len(bounds) - 1, 4), dtype=np.int64)
    paragraphs = np.empty((len(bounds) - 1, 4), dtype=np.int64)
    scan.lines_and_paragraphs(data, bounds, _classes(), lines, paragraphs)
    return lines, paragraphs


def ngram_counts(data: np.ndarray, bounds: np.ndarray, top_sizes: tuple[int, ...], duplicate_sizes: tuple[int, ...]) -> np.ndarray:
    """Per text: words, characters, then for each n of ``top_sizes`` the characters in the occurrences of its most
    frequent word n-gram, and for each n of ``duplicate_sizes`` the characters of its repeated word n-grams (0 where
    it has fewer than n words)."""
    scan = compiled()
    if scan is None:
        return plain_scan.ngrams(data, bounds, top_sizes, duplicate_sizes)
    counts = _ngram_out(bounds, top_sizes, duplicate_sizes)
    scan.ngrams(data, bounds, _classes(), np.array(top_sizes, np.int64), np.array(duplicate_sizes, np.int64), counts)
    return _not_utf8_in_python(counts, data, bounds, top_sizes, duplicate_sizes)


def profile_and_ngram_counts(data: np.ndarray, bounds: np.ndarray, top_sizes: tuple[int, ...],
                             duplicate_sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``profile_counts`` and ``ngram_counts`` together, from one split of the texts into words."""
    scan = compiled()
    if scan is None:
        return plain_scan.profile(data, bounds), plain_scan.ngrams(data, bounds, top_sizes, duplicate_sizes)
    counts = np.empty((len(bounds) - 1, len(scan.PROFILE_FIELDS)), dtype=np.int64)
    ngrams = _ngram_out(bounds, top_sizes, duplicate_sizes)
    scan.profile(data, bounds, _classes(), chars.is_alphabetic, _SYMBOL_BYTES, _COMMON_BYTES, _ELLIPSIS_BYTES, counts,
                 np.array(top_sizes, np.int64), np.array(duplicate_sizes, np.int64), ngrams)
    return counts, _not_utf8_in_python(ngrams, data, bounds, top_sizes, duplicate_sizes)


def _ngram_out(bounds: np.ndarray, top_sizes: tuple[int, ...], duplicate_sizes: tuple[int, ...]) -> np.ndarray:
    return np.empty((len(bounds) - 1, 2 + len(top_sizes) + len(duplicate_sizes)), dtype=np.int64)


def _not_utf8_in_python(counts: np.ndarray, data: np.ndarray, bounds: np.ndarray, top_sizes: tuple[int, ...],
                        duplicate_sizes: tuple[int, ...]) -> np.ndarray:
    """The compiled n-gram counts, with the rows it left (-1 words: the text is not valid UTF-8) counted in plain
    Python, where two different bad bytes read as the same word (``errors="replace"``)."""
    for t in np.flatnonzero(counts[:, 0] < 0):
        text = data[bounds[t] : bounds[t + 1]]
        counts[t] = plain_scan.ngrams(text, np.array([0, len(text)]), top_sizes, duplicate_sizes)[0]
    return counts


def mention_flags(data: np.ndarray, bounds: np.ndarray, words: tuple[str, ...], raw: tuple[str, ...]) -> np.ndarray:
    """Per text, whether it holds one of ``words`` (lowercase ASCII, two characters or more) with its ASCII letters in
    either case, or one of the ``raw`` strings as they are."""
    if short := [word for word in words if len(word) < 2]:
        raise ValueError(f"mention_flags: words of two characters or more, got {short}")
    scan = compiled()
    if scan is None:
        return plain_scan.mentions(data, bounds, words, raw)
    found = np.empty(len(bounds) - 1, dtype=np.uint8)
    anchors = tuple(min(range(len(word) - 1), key=lambda k: _rank(word[k]) + _rank(word[k + 1])) for word in words)
    scan.mentions(data, bounds, tuple(w.encode() for w in words), anchors, tuple(r.encode() for r in raw), found)
    return found.view(bool)


_RARE_FIRST = "zqxjkvbpygfwmucldrhsnioate"
"""English letters, the rarest in text first: the compiled scan looks for a word from the two neighbouring characters
of it that are, together, the rarest (anything but a letter ranked after every letter)."""


def _rank(char: str) -> int:
    return _RARE_FIRST.find(char) % (len(_RARE_FIRST) + 1)


@functools.cache
def _classes() -> np.ndarray:
    """Each code point's classes for the compiled scan (its bits), from ``character_classes``. Whether a character
    outside ASCII is a letter is decided, and kept here, when a scan first meets it."""
    scan = compiled()
    classes = np.zeros(scan.MAX_CODE, dtype=np.uint16)
    for members, bit in ((chars.WHITESPACE, scan.SPACE), (chars.ALPHANUMERIC, scan.ALNUM), (chars.DIGITS, scan.DIGIT), (chars.LAYOUT, scan.LAYOUT),
                         (chars.BRACKETS, scan.BRACKET), (string.ascii_letters, scan.LETTER), (chars.BULLETS, scan.BULLET),
                         (chars.END_MARKS, scan.END_MARK), (chars.URL_CHARS, scan.URL), ("#", scan.HASH)):
        classes[[ord(c) for c in members]] |= np.uint16(bit)
    classes[:0x80] |= np.uint16(scan.KNOWN)
    return classes
