"""NeMo Curator's heuristic document filters (Gopher, Rae et al. 2021, and C4), scoring a whole batch of texts at once.

The scores follow ``nemo_curator/filters/heuristic_filter.py``: a word is a run of non-whitespace characters
(``str.split()``; NeMo splits Chinese and Japanese with jieba and MeCab, which is not done here), a line is a
``\\n``-separated piece that is not blank, a paragraph a ``\\n\\n``-separated piece, a length counts characters.

The common filters work on the texts' UTF-8 bytes with numpy, a few passes over one buffer for the whole batch:
no byte of a multi-byte character is below 0x80, so an ASCII character class is counted byte by byte, and the few
non-ASCII characters a definition names (Unicode spaces, bullets, ``…``) are found by their byte sequences. That is
exact and several times faster than per-document Python or Arrow's regex kernels. Lines end where the bytes say
(each non-blank line's last non-whitespace byte, for punctuation and ellipsis); bullet lines and line and paragraph
repetition use Arrow's string kernels, and the n-gram scores loop over the documents in Python.

Where NeMo divides by zero (a text without words or lines), the score is the one that removes the document, as
NeMo's own convention for empty texts does: 1.0 for a ratio that must stay low, 0.0 for one that must stay high.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, count
from operator import ne
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
"""Characters that end a line of prose (C4's punctuation rule); all ASCII, so a line ends with one exactly when its last
byte that is not whitespace is one (``_END_MARK_BYTES``)."""
_END_MARK_BYTES = np.zeros(256, dtype=bool)
_END_MARK_BYTES[[ord(c) for c in END_MARKS]] = True

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
_HASH_RUNS = re.compile("#+")
_WS = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]"
"""``WHITESPACE`` as an RE2 character class."""
_CIRCLED_LETTERS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))
_FIRST_WORDS = 64
"""Words ``common_english_words`` looks at first; it doubles the chunk until it has counted enough."""
_LONGEST_WALK = 64
"""Bytes a walk takes for all its items together (``all_unmarked`` over candidate words, ``_find_line_ends`` back over
lines' trailing whitespace); the few items still undecided are then done one by one."""
_SPARSE_MARKS = 64
"""``per_word`` places marks one by one (a binary search each) when fewer than one byte in this many is marked, and
takes a running sum over all bytes otherwise."""
_LOOP_TEXTS_FROM_BYTES = 1024
"""Per-text sums loop over the texts (one ``count_nonzero`` each) when they average at least this many bytes, and
take one ``reduceat`` pass otherwise: the loop costs about a microsecond a text, the pass about half a nanosecond a byte."""


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


def _finish(values: np.ndarray, texts: pa.Array) -> pa.Array:
    """Scores as an Arrow array, null where the text is null."""
    return pa.array(values, mask=np.asarray(texts.is_null(), dtype=bool) if texts.null_count else None)


class _Utf8:
    """A batch of texts as one numpy array of UTF-8 bytes and each text's byte range (null texts are empty)."""

    def __init__(self, texts: pa.Array | pa.ChunkedArray) -> None:
        texts = _as_utf8(texts)
        self.texts = texts
        if texts.null_count:
            texts = pc.fill_null(texts, "")
        _, offsets_buffer, data_buffer = texts.buffers()
        width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
        offsets = np.zeros(1, np.int64)
        if len(texts):
            offsets = np.frombuffer(offsets_buffer, dtype=width)[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
        self.bounds = offsets - offsets[0]
        size = int(self.bounds[-1])
        self.data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[0] + size] if size else np.zeros(0, np.uint8)
        self.ascii = not size or int(self.data.max()) < 0x80
        self.nonempty_starts = self.bounds[:-1][self.bounds[:-1] < self.bounds[1:]]

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @cached_property
    def leads(self) -> np.ndarray:
        """Positions of the first bytes of multi-byte characters, found once for every class that names some."""
        return np.flatnonzero(self.data >= 0xC0)

    @cached_property
    def char_counts(self) -> np.ndarray:
        """Characters per text."""
        return np.asarray(pc.fill_null(pc.utf8_length(self.texts), 0), dtype=np.int64)

    def count_positions(self, positions: np.ndarray) -> np.ndarray:
        """How many of the byte ``positions`` fall in each text."""
        return np.bincount(np.searchsorted(self.bounds, positions, side="right") - 1, minlength=len(self))

    def text_end(self, position: int) -> int:
        """Where the text that holds byte ``position`` ends."""
        return int(self.bounds[np.searchsorted(self.bounds, position, side="right")])

    def finish(self, values: np.ndarray) -> pa.Array:
        """The scores as an Arrow array, null where the text is null."""
        return _finish(values, self.texts)

    def sum_per_text(self, mask: np.ndarray) -> np.ndarray:
        """How many of each text's bytes ``mask`` marks."""
        if len(self) and len(self.data) >= _LOOP_TEXTS_FROM_BYTES * len(self):
            bounds = self.bounds.tolist()
            return np.fromiter((np.count_nonzero(mask[s:e]) for s, e in zip(bounds[:-1], bounds[1:])), dtype=np.int64, count=len(self))
        sums = np.zeros(len(self), dtype=np.int64)
        if len(self.nonempty_starts):
            sums[self.bounds[:-1] < self.bounds[1:]] = np.add.reduceat(mask, self.nonempty_starts, dtype=np.int64)
        return sums

    def _occurrences(self, chars: list[str]) -> list[tuple[np.ndarray, int]]:
        """Where the non-ASCII ``chars`` occur: (start positions, bytes) per group of characters that share a first
        byte and a length, whose other bytes are looked up in one table."""
        groups: dict[tuple[int, int], list[bytes]] = {}
        for char in chars:
            encoded = char.encode()
            groups.setdefault((encoded[0], len(encoded)), []).append(encoded)
        found = []
        lead_bytes = self.data[self.leads]
        for (lead, width), members in groups.items():
            positions = self.leads[lead_bytes == lead]
            payload = np.zeros(len(positions), dtype=np.int64)
            for k in range(1, width):
                payload = payload << 6 | (self.data[positions + k] & 0x3F)
            table = np.zeros(1 << 6 * (width - 1), dtype=bool)
            table[[_payload(e[1:]) for e in members]] = True
            found.append((positions[table[payload]], width))
        return found

    def char_mask(self, chars: str, whole: bool = False) -> np.ndarray:
        """Marks the first byte of every occurrence of any of ``chars`` (every byte of it with ``whole``)."""
        data = self.data
        ranges = _ranges(sorted(ord(c) for c in chars if ord(c) < 0x80))
        mask = np.zeros(len(data), dtype=bool)
        scratch, hit = np.empty(len(data), dtype=np.uint8), np.empty(len(data), dtype=bool)
        if (ord("A"), ord("Z")) in ranges and (ord("a"), ord("z")) in ranges:  # both cases of a letter: one comparison
            ranges = [r for r in ranges if r not in ((ord("A"), ord("Z")), (ord("a"), ord("z")))]
            np.bitwise_or(data, np.uint8(0x20), out=scratch)
            scratch -= np.uint8(ord("a"))
            np.less(scratch, np.uint8(26), out=mask)
        for low, high in ranges:
            if low == high:
                np.equal(data, np.uint8(low), out=hit)
            else:
                np.subtract(data, np.uint8(low), out=scratch)
                np.less_equal(scratch, np.uint8(high - low), out=hit)
            mask |= hit
        if not self.ascii:
            for positions, width in self._occurrences([c for c in chars if ord(c) >= 0x80]):
                for k in range(width if whole else 1):
                    mask[positions + k] = True
        return mask

    def first_bytes_of_texts(self, mask: np.ndarray, value: np.ndarray) -> None:
        """Sets ``mask`` at each non-empty text's first byte to ``value`` there (to undo a shift across texts)."""
        mask[self.nonempty_starts] = value[self.nonempty_starts]


@dataclass
class _Batch:
    """A batch of texts and what filters derived from it, kept for the next filter while the batch is the same: a
    stage that removes nothing passes its table on unchanged, and word splits, character classes and line counts are
    shared by several filters. Word splits and line and paragraph counts also outlive a stage that removes texts
    (``carry_analyses``). The batch is held so that its buffers' addresses, the key, stay its own."""

    key: tuple
    texts: pa.Array
    derived: dict


_LAST_BATCH = threading.local()


def _key(texts: pa.Array) -> tuple:
    return (texts.type, texts.offset, len(texts), *(0 if b is None else b.address for b in texts.buffers()))


@dataclass(frozen=True)
class _Cut:
    """An analysis of an earlier batch, cut down to its ``keep`` rows when a filter first asks for it: stages that
    remove texts one after another compose their ``keep``s, and only what is used is cut, once."""

    value: Any
    keep: np.ndarray


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
    elif isinstance(value, _Cut):
        value = batch.derived[name] = value.value.kept(value.keep, batch.derived["utf8"])
    return value


def carry_analyses(texts: pa.Array, keep: np.ndarray, kept: pa.Array) -> None:
    """Tells the filters that a stage kept the ``keep`` rows of the batch ``texts`` as the batch ``kept``: the word split
    (its whitespace and word-start masks, copied run by run of kept texts, several times cheaper than splitting again),
    the line ends and the line and paragraph counts are cut down to the kept rows when next asked for. The rest is
    dropped: word positions and line splits cost about as much to cut down as to make again."""
    batch = getattr(_LAST_BATCH, "batch", None)
    if batch is None or batch.key != _key(_as_utf8(texts)):
        return
    kept = _as_utf8(kept)
    keep = np.asarray(keep, dtype=bool)
    carried: dict[object, Any] = {"utf8": _Utf8(kept)}
    for name, value in batch.derived.items():
        if isinstance(value, _Cut):
            composed = value.keep.copy()
            composed[composed] = keep
            carried[name] = _Cut(value.value, composed)
        elif isinstance(value, (_Words, _LineEnds, _Pieces)):
            carried[name] = _Cut(value, keep)
    _LAST_BATCH.batch = _Batch(_key(kept), kept, carried)


def _utf8(texts: pa.Array) -> _Utf8:
    return _derived(texts, "utf8", _Utf8)


def _words(texts: pa.Array) -> _Words:
    return _derived(texts, "words", lambda t: _Words(_utf8(t)))


def _payload(continuation: bytes) -> int:
    """The 6 bits each continuation byte of a UTF-8 character carries, in order."""
    value = 0
    for byte in continuation:
        value = value << 6 | byte & 0x3F
    return value


def _ranges(codes: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for code in codes:
        if out and out[-1][1] == code - 1:
            out[-1] = (out[-1][0], code)
        else:
            out.append((code, code))
    return out


class _Words:
    """The whitespace-separated words of a batch: how many each text has, where each starts and ends, their bytes."""

    def __init__(self, u: _Utf8) -> None:
        self.u = u
        self.space = u.char_mask(WHITESPACE, whole=True)
        self.starts_mask = np.empty(len(self.space), dtype=bool)
        if len(self.space):
            self.starts_mask[0] = not self.space[0]
            np.greater(self.space[:-1], self.space[1:], out=self.starts_mask[1:])
            u.first_bytes_of_texts(self.starts_mask, ~self.space)
        self.counts = u.sum_per_text(self.starts_mask)

    def kept(self, keep: np.ndarray, after: _Utf8) -> _Words:
        """The words of the ``keep`` texts, as ``_Words(after)`` finds them in ``after``, their bytes."""
        edges = np.diff(np.concatenate(([0], keep.view(np.int8), [0])))
        bounds = self.u.bounds
        runs = list(zip(bounds[np.flatnonzero(edges == 1)].tolist(), bounds[np.flatnonzero(edges == -1)].tolist()))
        def cut(values: np.ndarray) -> np.ndarray:
            return np.concatenate([values[start:end] for start, end in runs] or [values[:0]])

        words = _Words.__new__(_Words)
        words.u = after
        words.space, words.starts_mask = cut(self.space), cut(self.starts_mask)
        words.counts = self.counts[keep]
        return words

    @cached_property
    def starts(self) -> np.ndarray:
        """Byte position of every word's first byte, in order."""
        return np.flatnonzero(self.starts_mask)

    @cached_property
    def ends(self) -> np.ndarray:
        """Byte position of every word's last byte, in order."""
        ends = np.empty(len(self.space), dtype=bool)
        if len(self.space):
            np.greater(self.space[1:], self.space[:-1], out=ends[:-1])
            ends[-1] = not self.space[-1]
            last = self.u.bounds[1:][self.u.bounds[:-1] < self.u.bounds[1:]] - 1
            ends[last] = ~self.space[last]
        return np.flatnonzero(ends)

    @cached_property
    def byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes in each word."""
        return self.ends - self.starts + 1

    def per_word(self, mask: np.ndarray) -> np.ndarray:
        """How many bytes ``mask`` marks in each word (``mask`` marks no whitespace)."""
        if np.count_nonzero(mask) * _SPARSE_MARKS < len(mask):
            word = np.searchsorted(self.starts, np.flatnonzero(mask), side="right") - 1
            return np.bincount(word, minlength=len(self.starts))
        before = np.cumsum(mask, dtype=np.int64 if len(mask) >= 2**31 else np.int32)
        return before[self.ends] - before[self.starts] + mask[self.starts]

    def nonspace_chars(self) -> np.ndarray:
        """Marks the first byte of every character that is not whitespace."""
        nonspace = ~self.space
        if not self.u.ascii:
            nonspace &= (self.u.data & 0xC0) != 0x80
        return nonspace

    def char_lengths(self) -> np.ndarray:
        """Characters in each word."""
        if self.u.ascii:
            return self.byte_lengths
        return self.byte_lengths - self.per_word(((self.u.data & 0xC0) == 0x80) & ~self.space)

    def per_text(self, values: np.ndarray, reduce: np.ufunc, empty: float) -> np.ndarray:
        """``reduce`` of each text's word values; ``empty`` for a text without words."""
        out = np.full(len(self.counts), empty, dtype=np.result_type(values.dtype, type(empty)))
        has = self.counts > 0
        if has.any():
            first = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
            out[has] = reduce.reduceat(values, first[has])
        return out

    @cached_property
    def breaks(self) -> np.ndarray:
        """Whether a word cannot go on at each byte position (one past the end too): whitespace or a text's start."""
        breaks = np.ones(len(self.space) + 1, dtype=bool)
        breaks[:-1] = self.space
        breaks[self.u.bounds] = True
        return breaks

    def all_unmarked(self, marked: np.ndarray) -> np.ndarray:
        """Start positions of the words none of whose bytes ``marked`` marks. Only words that begin unmarked are
        candidates; they are walked a byte at a time, all together, until a break (no mark: found) or a mark (not),
        and the few still undecided after ``_LONGEST_WALK`` bytes are checked whole, one by one."""
        positions = np.flatnonzero(self.starts_mask & ~marked)
        found = [np.zeros(0, dtype=np.int64)]
        offset = 1
        while len(positions) and offset <= _LONGEST_WALK:
            at = positions + offset
            ended = self.breaks[at]
            found.append(positions[ended])
            positions = positions[~ended & ~marked[np.minimum(at, len(marked) - 1)]]
            offset += 1
        if len(positions):
            ends = self.ends[np.searchsorted(self.starts, positions)]
            found.append(np.array([s for s, e in zip(positions.tolist(), ends.tolist()) if not marked[s : e + 1].any()], dtype=np.int64))
        return np.concatenate(found)

    def one_of(self, options: tuple[str, ...] | frozenset[str]) -> np.ndarray:
        """Start positions of the words that are exactly one of ``options`` (each at most 8 UTF-8 bytes, no whitespace)."""
        data, starts = self.u.data, self.starts
        encoded = [option.encode() for option in options]
        firsts = np.zeros(256, dtype=bool)
        firsts[[e[0] for e in encoded]] = True
        index = np.flatnonzero(firsts[data[starts]])
        candidates = starts[index]
        following = np.where(index + 1 < len(starts), starts[np.minimum(index + 1, len(starts) - 1)], len(data))
        windows = _windows(data, candidates)
        found = []
        for e in encoded:
            hit = (windows & np.uint64((1 << 8 * len(e)) - 1)) == np.uint64(int.from_bytes(e, "little"))
            after = candidates[hit] + len(e)
            # the bytes match and a break follows; a word start in between would mean they ran on into the next text
            found.append(candidates[hit][self.breaks[after] & (following[hit] >= after)])
        return np.concatenate(found)


def _windows(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The 8 bytes from each position as a little-endian integer (zero bytes past the end of ``data``)."""
    out = np.zeros(len(positions), dtype=np.uint64)
    inside = positions <= len(data) - 8
    if len(data) >= 8:
        out[inside] = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))[positions[inside]]
    for i in np.flatnonzero(~inside):
        out[i] = int.from_bytes(data[positions[i] :].tobytes(), "little")
    return out


def _divide(numerator: np.ndarray, denominator: np.ndarray, empty: float) -> np.ndarray:
    """``numerator / denominator``, and ``empty`` where the denominator is 0."""
    out = np.full(len(denominator), empty, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _char_ratio(texts: pa.Array, chars: str) -> pa.Array:
    """The share of each text's characters that are in ``chars`` (1.0 for an empty text, as NeMo)."""
    u = _utf8(texts)
    return u.finish(_divide(u.sum_per_text(u.char_mask(chars)), u.char_counts, 1.0))


def _blank(texts: pa.Array) -> np.ndarray:
    """Whether each text is empty or only whitespace (Arrow's ``utf8_is_space`` is ``str.isspace``); true for nulls."""
    space = pc.or_kleene(pc.utf8_is_space(texts), pc.equal(pc.binary_length(texts), 0))
    return np.asarray(pc.fill_null(space, True), dtype=bool)


def _split_texts(texts: pa.Array, separator: str) -> tuple[pa.Array, np.ndarray]:
    """The pieces of the texts between ``separator``s (a null text is one empty piece) and the index of each one's text."""
    pieces = pc.split_pattern(pc.fill_null(texts, "") if texts.null_count else texts, separator)
    return pc.list_flatten(pieces), np.asarray(pc.list_parent_indices(pieces), dtype=np.int64)


def _split(texts: pa.Array, separator: str) -> tuple[pa.Array, np.ndarray]:
    return _derived(texts, ("split", separator), lambda t: _split_texts(t, separator))


def _matching(texts: pa.Array, *patterns: str) -> np.ndarray:
    """Indices of the texts that any of the ``patterns`` matches somewhere."""
    found = np.zeros(len(texts), dtype=bool)
    for pattern in patterns:
        found |= np.asarray(pc.fill_null(pc.match_substring_regex(texts, pattern), False), dtype=bool)
    return np.flatnonzero(found)


def _holding(texts: pa.Array, chars: str) -> np.ndarray:
    """Indices of the texts that hold any of the non-ASCII ``chars``, found in the batch's bytes (an RE2 class of
    multi-byte characters scans about five times slower)."""
    u = _utf8(texts)
    if u.ascii:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(u.count_positions(np.concatenate([positions for positions, _ in u._occurrences(list(chars))])))


def _line_ratio(texts: pa.Array, pattern: str, chosen: np.ndarray) -> pa.Array:
    """The share of each text's non-blank lines that match ``pattern`` (1.0 without lines). The pattern needs a
    character other than whitespace and allows for the whitespace around a line's text (``_WS``), so that lines need no
    stripping. Only the ``chosen`` texts (indices) are split into lines; the others have no such line."""
    texts = _as_utf8(texts)
    has_text = ~_blank(texts)
    scores = np.where(has_text, 0.0, 1.0)
    if len(chosen):
        some = texts if len(chosen) == len(texts) else texts.take(pa.array(chosen))
        # a subset is split uncached: caching it would push the whole batch, which the next filter reads, out of the cache
        lines, parents = _split(some, "\n") if some is texts else _split_texts(some, "\n")
        counts = np.bincount(parents[~_blank(lines)], minlength=len(some))
        hits = np.bincount(parents[np.asarray(pc.match_substring_regex(lines, pattern), dtype=bool)], minlength=len(some))
        scores[chosen] = _divide(hits, counts, 1.0)
    return _finish(scores, texts)


@dataclass(frozen=True)
class _LineEnds:
    """Where each non-blank line of a batch's texts ends: the position of its last byte that is not whitespace, and
    the index of its text, in order. A line is a ``\\n``-separated piece of a text; blank means only whitespace."""

    first: np.ndarray
    """Position of each line's first byte (whitespace or not)."""
    last: np.ndarray
    text: np.ndarray

    before: _Utf8
    """The texts' bytes."""

    def kept(self, keep: np.ndarray, after: _Utf8) -> _LineEnds:
        """The lines of the ``keep`` texts, at their positions in ``after``, the kept texts' bytes."""
        mine = keep[self.text]
        text = (np.cumsum(keep) - 1)[self.text[mine]]
        shift = self.before.bounds[self.text[mine]] - after.bounds[text]
        return _LineEnds(self.first[mine] - shift, self.last[mine] - shift, text, after)

    def ending_with(self, data: np.ndarray, mark: bytes) -> np.ndarray:
        """Indices of the lines whose text (without the whitespace around it) ends with ``mark``; its ASCII letters
        match either case (``str.lower`` turns nothing else into an ASCII letter but ``İ``, into ``i`` and a combining
        mark, and the Kelvin sign, into ``k``; no mark here ends in the one or holds the other)."""
        lines = np.flatnonzero(self.last - self.first + 1 >= len(mark))
        for back, byte in enumerate(reversed(mark)):
            found = data[self.last[lines] - back]
            if chr(byte).isascii() and chr(byte).isalpha():
                found = found | np.uint8(0x20)
            lines = lines[found == byte]
        return lines


def _line_ends(texts: pa.Array) -> _LineEnds:
    return _derived(texts, "line ends", _find_line_ends)


def _find_line_ends(texts: pa.Array) -> _LineEnds:
    """Lines end at each newline and at each text's end; from each end, step back over the whitespace (``_Words``'
    mask, so the same set ``str.strip`` removes) until a byte that is not whitespace, or the line's start (blank)."""
    words = _words(texts)
    u, space = words.u, words.space
    newlines = np.flatnonzero(u.data == ord("\n"))
    text_ends = u.bounds[1:]
    # merged in order of position; a text ending at position v comes before a newline at v (the next text's first byte)
    at_newline = np.arange(len(newlines)) + np.searchsorted(text_ends, newlines, side="right")
    at_text_end = np.arange(len(u)) + np.searchsorted(newlines, text_ends, side="left")
    ends = np.empty(len(newlines) + len(u), dtype=np.int64)
    ends[at_newline], ends[at_text_end] = newlines, text_ends
    text = np.empty(len(ends), dtype=np.int64)
    text[at_newline], text[at_text_end] = np.searchsorted(u.bounds, newlines, side="right") - 1, np.arange(len(u))
    after_newline = np.zeros(len(ends), dtype=bool)
    after_newline[at_newline] = True
    starts = np.concatenate(([0], ends[:-1] + after_newline[:-1]))
    last = ends - 1
    walking = np.flatnonzero(last >= starts)
    for _ in range(_LONGEST_WALK):
        walking = walking[space[last[walking]]]
        if not len(walking):
            break
        last[walking] -= 1
        walking = walking[last[walking] >= starts[walking]]
    for line in walking.tolist():  # lines still in whitespace after _LONGEST_WALK bytes: found one by one
        solid = np.flatnonzero(~space[starts[line] : last[line] + 1])
        last[line] = starts[line] + solid[-1] if len(solid) else starts[line] - 1
    nonblank = last >= starts
    return _LineEnds(starts[nonblank], last[nonblank], text[nonblank], u)


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
        words = _words(texts)
        return words.u.finish(words.counts)

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
        words = _words(texts)
        u = words.u
        return u.finish(_divide(u.sum_per_text(words.nonspace_chars()), words.counts, 0.0))

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
        u = _utf8(texts)
        chars = u.char_counts
        return u.finish(_divide(chars - u.sum_per_text(u.char_mask(_ALPHANUMERIC)), chars, 1.0))

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
        words = _words(texts)
        u = words.u
        symbols = [words.one_of(tuple(mark for mark in ELLIPSIS_MARKS if not any(c in WHITESPACE for c in mark)))]
        hashes = np.flatnonzero(u.data == ord("#"))
        if len(hashes):
            starts = words.starts
            with_hash = np.unique(np.searchsorted(starts, hashes, side="right") - 1)
            for start, limit in zip(starts[with_hash].tolist(), np.append(starts, len(u.data))[with_hash + 1].tolist()):
                word = u.data[start : min(limit, u.text_end(start))].tobytes().decode().split(maxsplit=1)[0]
                if 2 * len(_HASH_RUNS.findall(word)) > len(word):
                    symbols.append(np.array([start]))
        return u.finish(_divide(u.count_positions(np.concatenate(symbols)), words.counts, 1.0))

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
        return _char_ratio(texts, _DIGITS)

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
        u = _utf8(texts)
        chars = u.char_counts
        rest = np.asarray(pc.fill_null(pc.utf8_length(pc.replace_substring_regex(u.texts, URL_PATTERN, "")), 0), dtype=np.int64)
        return u.finish(_divide(chars - rest, chars, 1.0))

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
        return _line_ratio(texts, f"^{_WS}*[{BULLETS}]", _holding(texts, BULLETS))

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
        return _char_ratio(texts, _SPACE_CHARS)

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
        return _char_ratio(texts, _PARENTHESES)

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
        words = _words(texts)
        u = words.u
        return u.finish(words.per_text(words.char_lengths(), np.maximum, 0))

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


@dataclass(frozen=True)
class _Pieces:
    """Each text cut at a separator: per text, how many pieces and characters, and how many of them are distinct."""

    total: np.ndarray
    distinct: np.ndarray
    total_chars: np.ndarray
    distinct_chars: np.ndarray

    def kept(self, keep: np.ndarray, after: _Utf8) -> _Pieces:
        """The counts of the ``keep`` texts."""
        return _Pieces(self.total[keep], self.distinct[keep], self.total_chars[keep], self.distinct_chars[keep])


def _pieces(texts: pa.Array, separator: str, skip_blank: bool) -> _Pieces:
    return _derived(texts, ("pieces", separator, skip_blank), lambda t: _count_pieces(t, separator, skip_blank))


def _count_pieces(texts: pa.Array, separator: str, skip_blank: bool) -> _Pieces:
    """The pieces of each text between ``separator``s (blank ones left out with ``skip_blank``, blank meaning only
    Python's whitespace), counted in one pass over the batch: a piece's identity is its dictionary code, so a text's
    distinct pieces are its distinct (text, code) pairs."""
    pieces, parents = _split(texts, separator)
    encoded = pc.dictionary_encode(pieces)
    codes = np.asarray(encoded.indices, dtype=np.int64)
    if skip_blank:
        nonblank = ~_blank(encoded.dictionary)[codes]
        codes, parents = codes[nonblank], parents[nonblank]
    _, first = np.unique(parents * (int(codes.max()) + 1 if len(codes) else 1) + codes, return_index=True)
    chars = np.asarray(pc.utf8_length(encoded.dictionary), dtype=np.int64)[codes]
    n = len(texts)
    return _Pieces(np.bincount(parents, minlength=n), np.bincount(parents[first], minlength=n),
                   np.bincount(parents, weights=chars, minlength=n), np.bincount(parents[first], weights=chars[first], minlength=n))


@DocumentFilter.register_subclass("repeated_lines")
@dataclass(frozen=True)
class RepeatedLinesFilter(DocumentFilter):
    """Distinct non-blank lines over all of them (0 without lines): repeated navigation and template lines (Gopher)."""

    max_repeated_line_fraction: float = 0.7
    """Lowest fraction of distinct lines a kept document has (NeMo's name; the score must be at least this)."""

    def __post_init__(self) -> None:
        _ratio_check("max_repeated_line_fraction", self.max_repeated_line_fraction)

    def score(self, texts: pa.Array) -> pa.Array:
        lines = _pieces(texts, "\n", skip_blank=True)
        return _finish(_divide(lines.distinct, lines.total, 0.0), _as_utf8(texts))

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
        paragraphs = _pieces(texts, "\n\n", skip_blank=False)
        return _finish(_divide(paragraphs.distinct, paragraphs.total, 0.0), _as_utf8(texts))

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
        lines = _pieces(texts, "\n", skip_blank=True)
        return _finish(_divide(lines.distinct_chars, lines.total_chars, 0.0), _as_utf8(texts))

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
        paragraphs = _pieces(texts, "\n\n", skip_blank=False)
        return _finish(_divide(paragraphs.distinct_chars, paragraphs.total_chars, 0.0), _as_utf8(texts))

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
        lines = _line_ends(texts)
        u = _utf8(texts)
        counts = np.bincount(lines.text, minlength=len(u))
        hits = np.bincount(lines.text[~_END_MARK_BYTES[u.data[lines.last]]], minlength=len(u))
        return u.finish(_divide(hits, counts, 1.0))

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
        lines = _line_ends(texts)
        u = _utf8(texts)
        ending = np.zeros(len(lines.text), dtype=bool)
        for mark in ELLIPSIS_MARKS:
            ending[lines.ending_with(u.data, mark.encode())] = True
        counts = np.bincount(lines.text, minlength=len(u))
        return u.finish(_divide(np.bincount(lines.text[ending], minlength=len(u)), counts, 1.0))

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
        enough = self.min_num_common_words if self.stop_at_false else None
        return _per_text(texts, lambda text: _count_common_words(text, enough), integers=True)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_num_common_words, None)


def _count_common_words(text: str, enough: int | None) -> int:
    """Common English words in ``text``, counting no further than ``enough``: the words are split off a growing
    chunk at a time, so that a text that has enough early is not split whole."""
    if enough is None:
        return sum(map(COMMON_ENGLISH_WORDS.__contains__, text.split()))
    count, chunk = 0, _FIRST_WORDS
    while text and count < enough:
        words = text.split(maxsplit=chunk)
        text = words.pop() if len(words) > chunk else ""
        count += sum(map(COMMON_ENGLISH_WORDS.__contains__, words))
        chunk *= 2
    return min(count, enough)


def _is_alphabetic(code: int) -> bool:
    char = chr(code)
    return char.isalpha() or unicodedata.category(char) == "Nl" or any(low <= code <= high for low, high in _CIRCLED_LETTERS)


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
        words = _words(texts)
        u = words.u
        alphabetic = ((u.data | np.uint8(0x20)) - np.uint8(ord("a"))) < np.uint8(26)
        if not u.ascii:
            leads = np.flatnonzero(u.data >= 0xC0)
            codes = _decode(u.data, leads)
            table = np.zeros(0x110000, dtype=bool)
            table[codes] = True
            distinct = np.flatnonzero(table)
            table[distinct] = [_is_alphabetic(code) for code in distinct.tolist()]
            alphabetic[leads] = table[codes]
        return u.finish(_divide(words.counts - u.count_positions(words.all_unmarked(alphabetic)), words.counts, 0.0))

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, self.min_words_with_alphabets, None)


def _decode(data: np.ndarray, leads: np.ndarray) -> np.ndarray:
    """The code points of the multi-byte characters that start at ``leads``."""
    first = data[leads]
    codes = np.empty(len(leads), dtype=np.int64)
    for width, low, high in ((2, 0xC0, 0xE0), (3, 0xE0, 0xF0), (4, 0xF0, 0x100)):
        chosen = np.flatnonzero((first >= low) & (first < high))
        at = leads[chosen]
        value = (data[at] & (0x7F >> width)).astype(np.int64)
        for k in range(1, width):
            value = value << 6 | (data[at + k] & 0x3F)
        codes[chosen] = value
    return codes


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
