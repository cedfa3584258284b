"""What the heuristic filters derive from a batch of texts before scoring it, made once per batch and shared: the
per-text counts of one scan (``profile``), of each text's lines and paragraphs (``lines``, ``paragraphs``: one pass), and of its
repeated word n-grams (``ngram_shares``: Gopher's sizes all in one pass, which makes the profile too where none was
made yet).

The counts are kept for every filter that asks while the batch is the same (the same buffers, offset and length: a
stage that removes nothing passes its table on unchanged, and stages take a column's single chunk as it is,
``records.as_array``), and cut down to the kept texts when a filter stage removes some (``carry_analyses``), so a
pipeline of these filters reads each batch's text about twice (the scan, with the n-grams where a filter asks for
them; lines and paragraphs in one pass).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.heuristics import scan
from tokenmix.curate.records import as_array


def as_utf8(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The texts as one Arrow string array (``string`` or ``large_string``, as they come)."""
    texts = as_array(texts)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())
    return texts


def bytes_of(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
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
class Profile:
    """Per text, the counts one scan makes (``scan.profile_fields``: words, characters by class, lines by how they start
    and end, ...), from which every word, character and line heuristic is a ratio."""

    counts: np.ndarray

    def __getitem__(self, field: str) -> np.ndarray:
        return self.counts[:, scan.profile_fields().index(field)]

    def kept(self, keep: np.ndarray) -> Profile:
        return Profile(self.counts[keep])


@dataclass(frozen=True)
class Pieces:
    """Each text cut at a separator: per text, how many pieces and characters, and how many of them are distinct."""

    counts: np.ndarray
    """Per text: pieces, distinct pieces, characters in the pieces, characters in the distinct ones."""

    def kept(self, keep: np.ndarray) -> Pieces:
        return Pieces(self.counts[keep])


TOP_NGRAM_SIZES = (2, 3, 4)
"""The sizes of Gopher's top n-gram filters, counted in the first n-gram pass over a batch whichever filter asks."""
DUPLICATE_NGRAM_SIZES = (5, 6, 7, 8, 9, 10)
"""The sizes of Gopher's duplicate n-gram filters, counted in that pass too."""


@dataclass(frozen=True)
class NGrams:
    """Per text, words, characters, and the characters its repeated word n-grams take, for each size counted."""

    top_sizes: tuple[int, ...]
    duplicate_sizes: tuple[int, ...]
    counts: np.ndarray
    """Per text: words, characters, then a column per size of ``top_sizes``, then one per size of ``duplicate_sizes``."""

    def has(self, kind: str, n: int) -> bool:
        return n in (self.top_sizes if kind == "top" else self.duplicate_sizes)

    def share(self, kind: str, n: int) -> np.ndarray:
        """Characters counted for the ``kind`` (``top`` or ``duplicate``) n-grams of size ``n`` over the text's
        characters; 1.0 where the text has fewer than ``n`` words."""
        column = 2 + (self.top_sizes.index(n) if kind == "top" else len(self.top_sizes) + self.duplicate_sizes.index(n))
        out = np.ones(len(self.counts), dtype=np.float64)
        np.divide(self.counts[:, column], self.counts[:, 1], out=out, where=self.counts[:, 0] >= n)
        return out

    def kept(self, keep: np.ndarray) -> NGrams:
        return NGrams(self.top_sizes, self.duplicate_sizes, self.counts[keep])


@dataclass
class _Batch:
    """A batch of texts and what filters derived from it, kept for the next filter while the batch is the same. The
    batch is held so that its buffers' addresses, the key, stay its own."""

    key: tuple
    texts: pa.Array
    derived: dict


_LAST_BATCH = threading.local()


def _key(texts: pa.Array) -> tuple:
    return (texts.type, texts.offset, len(texts), *(0 if b is None else b.address for b in texts.buffers()))


def _derived(texts: pa.Array, name: object, compute: Callable[[pa.Array], Any]) -> Any:
    """``compute(texts)``, or what it gave for the same batch (the same buffers, offset and length) just before."""
    texts = as_utf8(texts)
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
    if batch is None or batch.key != _key(as_utf8(texts)):
        return
    keep = np.asarray(keep, dtype=bool)
    kept = as_utf8(kept)
    _LAST_BATCH.batch = _Batch(_key(kept), kept, {name: value.kept(keep) for name, value in batch.derived.items()})


def profile(texts: pa.Array) -> Profile:
    """The batch's ``Profile``."""
    return _derived(texts, "profile", lambda t: Profile(scan.profile_counts(*bytes_of(t))))


def _lines_and_paragraphs(texts: pa.Array) -> Pieces:
    """The batch's lines; and its paragraphs from the same pass, kept for the filters that ask next."""
    line_counts, paragraph_counts = scan.line_and_paragraph_counts(*bytes_of(texts))
    _LAST_BATCH.batch.derived["paragraphs"] = Pieces(paragraph_counts)
    return Pieces(line_counts)


def lines(texts: pa.Array) -> Pieces:
    """The batch's non-blank ``\\n``-separated lines (the first of lines and paragraphs asked counts both in one pass)."""
    return _derived(texts, "lines", _lines_and_paragraphs)


def paragraphs(texts: pa.Array) -> Pieces:
    """The batch's ``\\n\\n``-separated paragraphs, blank ones too (counted with the lines)."""
    lines(texts)
    return _LAST_BATCH.batch.derived["paragraphs"]


def _ngrams(texts: pa.Array, top_sizes: tuple[int, ...], duplicate_sizes: tuple[int, ...]) -> NGrams:
    return NGrams(top_sizes, duplicate_sizes, scan.ngram_counts(*bytes_of(texts), top_sizes, duplicate_sizes))


def _ngrams_and_profile(texts: pa.Array, top_sizes: tuple[int, ...], duplicate_sizes: tuple[int, ...]) -> NGrams:
    """The batch's n-grams; and its ``Profile`` from the same split into words, kept for the filters that ask next,
    unless one was made already (the filters that count n-grams, Gopher's, come with those that divide the profile)."""
    derived = _LAST_BATCH.batch.derived
    if "profile" in derived:
        return _ngrams(texts, top_sizes, duplicate_sizes)
    profile_counts, ngram_counts = scan.profile_and_ngram_counts(*bytes_of(texts), top_sizes, duplicate_sizes)
    derived["profile"] = Profile(profile_counts)
    return NGrams(top_sizes, duplicate_sizes, ngram_counts)


def ngram_shares(texts: pa.Array, kind: str, n: int) -> np.ndarray:
    """Per text, the share of its characters that its ``kind`` (``top``: the most frequent; ``duplicate``: repeated)
    word n-grams of size ``n`` take; 1.0 with fewer than ``n`` words. The batch's first n-gram filter counts Gopher's
    sizes (``TOP_NGRAM_SIZES``, ``DUPLICATE_NGRAM_SIZES``) and its own in one pass, which the others share, and makes
    the batch's ``Profile`` in the same pass; a size outside them that a later filter asks for gets a pass of its own."""
    top, duplicate = (n,) if kind == "top" else (), (n,) if kind == "duplicate" else ()
    found = _derived(texts, "ngrams", lambda t: _ngrams_and_profile(t, tuple(sorted({*TOP_NGRAM_SIZES, *top})),
                                                                      tuple(sorted({*DUPLICATE_NGRAM_SIZES, *duplicate}))))
    if not found.has(kind, n):
        found = _derived(texts, ("ngrams", kind, n), lambda t: _ngrams(t, top, duplicate))
    return found.share(kind, n)
