"""The heuristic filters' per-text counts in plain Python, for an install where the compiled scan (``_text_scan.c``)
was not built: the same counts as its ``profile`` and ``lines_and_paragraphs``, from the same definitions (``character_classes``),
through Python's string methods, text by text: 12 times the compiled scan's time for the profile, 4-5 times for
lines and paragraphs (docs/benchmarks.md); and the word n-gram counts of the repetition filters (``ngrams``), as NeMo
defines them.

A text's bytes are read as the compiled scan reads them: what is not valid UTF-8 (Arrow does not check a Parquet
shard's strings) as Python's ``errors="replace"`` reads it, and lines and paragraphs compared by their bytes.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import compress, count
from operator import itemgetter, ne

import numpy as np

from tokenmix.curate.heuristics.character_classes import (
    ALPHANUMERIC,
    BRACKETS,
    BULLETS,
    COMMON_ENGLISH_WORDS,
    DIGITS,
    ELLIPSIS_MARKS,
    END_MARKS,
    LAYOUT,
    SYMBOL_WORDS,
    URL_PATTERN,
    is_alphabetic,
)

PROFILE_FIELDS = ("words", "chars", "nonspace_chars", "alphanumeric_chars", "digits", "layout_chars", "brackets", "longest_word",
                  "words_with_letters", "symbol_words", "common_words", "lines", "lines_without_end_mark", "ellipsis_lines",
                  "bullet_lines", "url_chars")
"""The compiled scan's ``PROFILE_FIELDS``, in its order."""

_URL = re.compile(URL_PATTERN)
_HASH_RUNS = re.compile("#+")
_SYMBOLS = frozenset(SYMBOL_WORDS)
_END_MARKS = frozenset(END_MARKS)
_BULLETS = frozenset(BULLETS)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ELLIPSIS_ENDS = frozenset(mark[-1] for mark in ELLIPSIS_MARKS) | frozenset(mark[-1].upper() for mark in ELLIPSIS_MARKS)
_ELLIPSIS_LONGEST = max(map(len, ELLIPSIS_MARKS))
_LETTERS: dict[str, bool] = {}
"""Whether each character met so far is a letter (``is_alphabetic``), decided once per process."""
_ASCII_SPACES = bytes.maketrans(b"\x1c\x1d\x1e\x1f", b"    ")
"""The ASCII whitespace of ``str.isspace`` that ``bytes.split`` does not split at, as a space."""
_ASCII_NEITHER = bytes(b for b in range(0x80) if not chr(b).isspace() and not is_alphabetic(b))
"""The ASCII bytes that are neither a letter nor whitespace."""


def _counter(chars: str) -> tuple[bytes, tuple[str, ...]]:
    """How ``_count`` counts ``chars``: the bytes that are not their ASCII members (to delete), their other members."""
    ascii_members = {ord(c) for c in chars if c.isascii()}
    return bytes(b for b in range(256) if b not in ascii_members), tuple(c for c in chars if not c.isascii())


def _count(raw: bytes, text: str, counter: tuple[bytes, tuple[str, ...]]) -> int:
    """How many characters of ``text`` (``raw`` decoded) are in the set of ``counter``. An ASCII byte is the same
    character however the bytes around it decode, so those are counted in the bytes."""
    others, wide = counter
    count = len(raw.translate(None, others))
    if wide and not raw.isascii():
        count += sum(map(text.count, wide))
    return count


_ALPHANUMERIC, _DIGITS, _LAYOUT, _BRACKETS = map(_counter, (ALPHANUMERIC, DIGITS, LAYOUT, BRACKETS))


def _words_with_letters(raw: bytes, text: str, words: list[str]) -> int:
    """Words that hold a letter: the words left once every character that is neither a letter nor whitespace is deleted."""
    if not words:
        return 0
    if raw.isascii():
        return len(raw.translate(_ASCII_SPACES, _ASCII_NEITHER).split())
    present = set(text)
    for char in present.difference(_LETTERS):
        _LETTERS[char] = is_alphabetic(ord(char))
    neither = "".join(c for c in present if not _LETTERS[c] and not c.isspace())
    return len(re.sub(f"[{re.escape(neither)}]+", "", text).split()) if neither else len(words)


def _symbol_words(text: str, words: list[str]) -> int:
    """Words that are an ellipsis mark, or more runs of ``#`` than half their length (no mark holds a ``#``)."""
    marks = sum(map(_SYMBOLS.__contains__, words))
    if "#" not in text:
        return marks
    return marks + sum(2 * len(_HASH_RUNS.findall(word)) > len(word) for word in words if "#" in word)


def _ends_with_ellipsis(tail: str) -> bool:
    """Whether the end of a line ends with an ellipsis mark, its ASCII letters in either case (``str.lower`` is that
    for ASCII)."""
    return (tail.lower() if tail.isascii() else tail.translate(_ASCII_LOWER)).endswith(ELLIPSIS_MARKS)


def _line_counts(text: str) -> tuple[int, int, int, int]:
    """Non-blank lines; those that do not end with an end mark, that end with an ellipsis mark (its ASCII letters in
    either case), that start with a bullet."""
    lines = list(filter(None, map(str.strip, text.split("\n"))))
    last = list(map(itemgetter(-1), lines))
    ellipsis = sum(map(_ends_with_ellipsis, (line[-_ELLIPSIS_LONGEST:] for line, end in zip(lines, last) if end in _ELLIPSIS_ENDS)))
    return (len(lines), len(lines) - sum(map(_END_MARKS.__contains__, last)), ellipsis,
            sum(map(_BULLETS.__contains__, map(itemgetter(0), lines))))


def profile(data: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``PROFILE_FIELDS`` of each text ``data[bounds[t]:bounds[t + 1]]``, one row per text."""
    out = np.zeros((len(bounds) - 1, len(PROFILE_FIELDS)), dtype=np.int64)
    for t in range(len(bounds) - 1):
        raw = data[bounds[t] : bounds[t + 1]].tobytes()
        text = raw.decode("utf-8", "replace")
        words = text.split()
        lengths = list(map(len, words))
        url_chars = sum(map(len, _URL.findall(text))) if "://" in text else 0
        out[t] = (len(words), len(text), sum(lengths), _count(raw, text, _ALPHANUMERIC), _count(raw, text, _DIGITS),
                  _count(raw, text, _LAYOUT), _count(raw, text, _BRACKETS), max(lengths, default=0), _words_with_letters(raw, text, words),
                  _symbol_words(text, words), sum(map(COMMON_ENGLISH_WORDS.__contains__, words)), *_line_counts(text), url_chars)
    return out


def pieces(data: np.ndarray, bounds: np.ndarray, separator: int, skip_blank: bool) -> np.ndarray:
    """Per text, its pieces between ``separator`` newlines (as ``str.split``), the distinct ones (by their bytes), and
    the characters in each (one row per text); with ``skip_blank``, pieces of only whitespace are left out."""
    out = np.zeros((len(bounds) - 1, 4), dtype=np.int64)
    for t in range(len(bounds) - 1):
        chars: dict[bytes, int] = {}
        count = total = 0
        for piece in data[bounds[t] : bounds[t + 1]].tobytes().split(b"\n" * separator):
            text = piece.decode("utf-8", "replace")
            if skip_blank and not text.strip():
                continue
            count += 1
            total += len(text)
            chars.setdefault(piece, len(text))
        out[t] = (count, len(chars), total, sum(chars.values()))
    return out


def _ngrams(words: list[str], n: int) -> zip[tuple[str, ...]]:
    return zip(*(words[k:] for k in range(n)))


def _top_ngram_chars(text: str, words: list[str], n: int) -> int:
    """Characters in the occurrences of the most frequent word n-gram, joined with one space, in ``text`` (as
    ``str.replace`` finds them). Of n-grams tied, the first seen: NeMo takes whichever its set of n-grams yields
    first, which changes with Python's hash seed."""
    ((gram, _),) = Counter(_ngrams(words, n)).most_common(1)
    top = " ".join(gram)
    return len(text) - len(text.replace(top, ""))


def _duplicate_ngram_chars(words: list[str], n: int) -> int:
    """Characters in the words covered by a repeat of an earlier word n-gram, plus one space between covered
    neighbours (NeMo's count)."""
    first_seen: dict[tuple[str, ...], int] = {}
    firsts = map(first_seen.setdefault, _ngrams(words, n), count())
    covered_to = chars = 0
    # n-gram i repeats an earlier one where its first index is not i; the words it covers that an earlier repeat did
    # not are added, with the spaces before them
    for i in compress(count(), map(ne, firsts, count())):
        first_new = max(i, covered_to)
        chars += sum(map(len, words[first_new : i + n])) + min(i + n - first_new, n - 1)
        covered_to = i + n
    return chars


def ngrams(data: np.ndarray, bounds: np.ndarray, top_sizes: tuple[int, ...], duplicate_sizes: tuple[int, ...]) -> np.ndarray:
    """Per text ``data[bounds[t]:bounds[t + 1]]``: its words and characters, then for each n of ``top_sizes`` the
    characters in the occurrences of its most frequent word n-gram, and for each n of ``duplicate_sizes`` the
    characters of its repeated word n-grams (0 where it has fewer than n words), one row per text."""
    out = np.zeros((len(bounds) - 1, 2 + len(top_sizes) + len(duplicate_sizes)), dtype=np.int64)
    for t in range(len(bounds) - 1):
        text = data[bounds[t] : bounds[t + 1]].tobytes().decode("utf-8", "replace")
        words = text.split()
        row = out[t]
        row[0], row[1] = len(words), len(text)
        for k, n in enumerate(top_sizes):
            if len(words) >= n:
                row[2 + k] = _top_ngram_chars(text, words, n)
        for k, n in enumerate(duplicate_sizes, start=2 + len(top_sizes)):
            if len(words) >= n:
                row[k] = _duplicate_ngram_chars(words, n)
    return out


def mentions(data: np.ndarray, bounds: np.ndarray, words: tuple[str, ...], raw: tuple[str, ...]) -> np.ndarray:
    """Per text, whether it holds one of ``words`` (lowercase ASCII) with its ASCII letters in either case
    (``bytes.lower`` lowers ASCII only), or one of the ``raw`` strings as they are."""
    folded, exact = tuple(w.encode() for w in words), tuple(r.encode() for r in raw)
    out = np.zeros(len(bounds) - 1, dtype=bool)
    for t in range(len(bounds) - 1):
        text = data[bounds[t] : bounds[t + 1]].tobytes()
        lowered = text.lower()
        out[t] = any(w in lowered for w in folded) or any(r in text for r in exact)
    return out
