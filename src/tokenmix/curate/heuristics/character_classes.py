"""What a character, a word and a line ending are to NeMo Curator's heuristic filters: the sets of characters their
scores count, the words and marks they look for, and which characters are letters.

Both scans count from these (``scan``: the compiled one through a table of classes per code point, the Python one
directly), so that a change here changes every score alike.
"""

from __future__ import annotations

import string
import unicodedata

WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
"""The characters ``str.split()`` and ``str.strip()`` treat as whitespace (``str.isspace``); Arrow's
``utf8_trim_whitespace`` uses the same set."""

ELLIPSIS_MARKS = ("...", "[...]", "\u2026", "(...)", "[\u2026]", "-\u00bb", "read more..", "read more")
"""NeMo's ellipsis marks: a word that is one counts as a symbol, a line that ends with one (lowercased) as an ellipsis line."""

SYMBOL_WORDS = tuple(mark for mark in ELLIPSIS_MARKS if not any(c in WHITESPACE for c in mark))
"""The ellipsis marks that can be a word on their own: such a word is a symbol."""

BULLETS = "\u2022\u2023\u2043\u204c\u204d\u2219\u25cb\u25cf\u25d8\u25e6\u29be\u29bf"
"""NeMo's bullet characters (C4): a line whose first non-space character is one is a bullet line."""

END_MARKS = ".?!\"'"
"""Characters that end a line of prose (C4's punctuation rule)."""

COMMON_ENGLISH_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
"""Gopher's stop words; matched in lowercase only, so that shouting in capitals does not count."""

URL_PATTERN = r"https?://[!$-_a-z]+"
"""NeMo's URL regex written as one character class: ``[$-_]`` already holds the digits, capitals, ``@.&+*(),%``."""

URL_CHARS = "!" + "".join(map(chr, range(ord("$"), ord("_") + 1))) + string.ascii_lowercase
"""``URL_PATTERN``'s class: what may follow ``http(s)://`` in a URL."""

ALPHANUMERIC = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789\n?!,."
"""What ``non_alpha_numeric`` does not count (NeMo's set)."""

DIGITS = "0123456789"
"""What ``numbers`` counts (ASCII digits, NeMo's ``[[:digit:]]``)."""

LAYOUT = "\t\n\r\b "
"""What ``white_space`` counts (NeMo's list: no other whitespace)."""

BRACKETS = "{}[]()\u27e8\u27e9"
"""What ``parentheses`` counts."""

_CIRCLED_LETTERS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))


def is_alphabetic(code: int) -> bool:
    """Whether the code point is a letter to ``words_without_alphabets``: ``str.isalpha``, a letter number, or a
    circled Latin letter."""
    char = chr(code)
    return char.isalpha() or unicodedata.category(char) == "Nl" or any(low <= code <= high for low, high in _CIRCLED_LETTERS)
