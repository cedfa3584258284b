"""MinHash signatures of documents' shingle sets: the first step of fuzzy deduplication (Zyda-2's recipe, NeMo
Curator's fuzzy dedup), before LSH buckets, connected components and removal.

Two documents whose shingle sets have Jaccard similarity ``J`` agree in each signature position with probability
about ``J``, so LSH over signatures finds near-duplicate pairs without comparing every pair of documents. Signatures
are written by one pass and compared by another, possibly on other machines and in other runs, so every value here is
defined exactly, with no Python ``hash()`` and no per-process state, and a document's signature is the same whichever
batch it is in:

- **Shingles.** ``char``: ``ngram`` consecutive Unicode code points (not bytes). ``word``: ``ngram`` consecutive
  words of ``str.split()``, the shingle's text being those words joined by single spaces. A document's shingles are a
  set: a shingle that repeats counts once, which needs no deduplication since a minimum is the same however often a
  value repeats. A text with fewer than ``ngram`` units is short (``MinHashConfig.short_documents``); a text with no
  units (empty; in ``word`` mode also only whitespace) and a null get no signature.
- **Shingle hash** of a shingle text ``s`` with code points ``c_0 .. c_{m-1}``, with ``p = 2**61 - 1``::

      poly(s) = sum((c_k + 1) * BASE**(m - 1 - k) for k in range(m)) % p      # BASE = 0x9E3779B97F4A7C15 % p
      x(s)    = fmix64(poly(s)) >> 3                                           # a value in [0, 2**61)

  ``fmix64`` is MurmurHash3's 64-bit finalizer (a fixed bijection of 64-bit values, arithmetic mod ``2**64``): it
  breaks the polynomial's linear structure before the linear permutations below. The polynomial is what lets the
  hashes of all shingles of a batch be computed at once from prefix sums, with no Python call per shingle.
- **Permutations** ``h_k(x) = (a_k * x + b_k) % p`` for ``k < num_perm``, where ``rng = numpy.random.default_rng(seed)``,
  ``a = rng.integers(1, p, num_perm, dtype=numpy.uint64)``, then ``b = rng.integers(0, p, num_perm, dtype=numpy.uint64)``
  (numpy does not promise these streams forever; ``tests/test_curate_minhash.py`` pins their first values).
  Signature position ``k`` is ``min(h_k(x(s)) for s in shingles)``: with ``bits=64`` that value (below ``p``, as
  uint64); with ``bits=32`` its low 32 bits (uint32). A document without a signature has all ones in its row.

Speed, one core, character 25-grams, 128 permutations (docs/benchmarks.md): the default ``backend="numba"`` runs
compiled loops (``minhash_kernels``), the permutations in SIMD lanes; ``backend="jax"`` computes the permutations with
XLA, for accelerators (on a CPU it is slower than numba). Libraries were measured on the same texts and not taken:
datasketch is several times slower (a SHA-1 call per shingle), and rensa's R-MinHash is another sketch (seeded
buckets, not these permutations) whose values change with its algorithm version.

Memory: documents are hashed in groups of about ``GROUP_CODE_POINTS`` code points (a longer document in pieces, a
long text normalized into words a group at a time), so that besides the batch's texts and the ``[n, num_perm]``
output ``signatures`` holds about 4 MB: about 90 bytes per code point of one group and 1 MB of cached powers of ``BASE``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np
import pyarrow as pa

from tokenmix.curate.records import as_array

MERSENNE = (1 << 61) - 1
"""The prime ``p = 2**61 - 1`` of the shingle polynomial and of the permutations."""
BASE = 0x9E3779B97F4A7C15 % MERSENNE
"""The shingle polynomial's base: the 64-bit golden-ratio constant reduced mod ``p``. Large, since with a base ``B``
below ``0x110000`` the code points ``(0, B)`` and ``(1, 0)`` would have the same polynomial."""
GROUP_CODE_POINTS = 1 << 15
"""Code points hashed at a time: documents are grouped up to about this many, and a longer document is cut into
pieces whose shingles start within this many code points (pieces overlap by ``ngram - 1`` units, so that their
shingles are exactly the document's). Small enough that a group's arrays stay in the CPU's cache."""
JAX_ROW = 256
"""jax backend: shingles of one piece in a row (a piece's last row is padded with its first shingle, which changes no
minimum), ``JAX_ROWS`` rows a kernel call."""
JAX_ROWS = 16

_U64 = np.uint64
_M31, _M32 = _U64((1 << 31) - 1), _U64((1 << 32) - 1)
_ALL_ONES = _U64((1 << 64) - 1)
_WHITESPACE = re.compile(r"\s+")
"""A run of what ``str.split()`` splits at (both match ``str.isspace``)."""


@dataclass(frozen=True)
class MinHashConfig:
    """What a document's MinHash signature is: its shingles, the number of permutations, their seed and the value size.

    Signatures are comparable only when made with equal configs. The defaults are Zyda-2's (character 25-grams, 128
    permutations); ``nemo()`` gives NeMo Curator's current defaults."""

    shingle: Literal["char", "word"] = "char"
    """``char``: ``ngram`` consecutive code points; ``word``: ``ngram`` consecutive whitespace-separated words."""
    ngram: int = 25
    """Units (code points or words) in a shingle."""
    num_perm: int = 128
    """Signature length: one permutation, and one minimum, per position."""
    bits: Literal[32, 64] = 64
    """64: the whole minimum (below ``2**61``); 32: its low 32 bits, half the storage for a ``2**-32`` chance that
    two different minima agree."""
    seed: int = 42
    """Seed of ``numpy.random.default_rng`` that draws the permutations."""
    short_documents: Literal["whole", "skip"] = "whole"
    """A text with fewer than ``ngram`` units: ``whole`` makes the whole text (its words joined by single spaces in
    ``word`` mode) its one shingle, so a short text is a duplicate only of the same short text; ``skip`` gives it no
    signature, so it is never a duplicate."""

    def __post_init__(self) -> None:
        if self.shingle not in ("char", "word"):
            raise ValueError(f"minhash.shingle must be 'char' or 'word', got {self.shingle!r}")
        for name in ("ngram", "num_perm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"minhash.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.bits, bool) or self.bits not in (32, 64):
            raise ValueError(f"minhash.bits must be 32 or 64, got {self.bits!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"minhash.seed must be an integer >= 0, got {self.seed!r}")
        if self.short_documents not in ("whole", "skip"):
            raise ValueError(f"minhash.short_documents must be 'whole' or 'skip', got {self.short_documents!r}")

    @classmethod
    def zyda2(cls) -> MinHashConfig:
        """Zyda-2's signatures: character 25-grams, 128 permutations."""
        return cls(shingle="char", ngram=25, num_perm=128)

    @classmethod
    def nemo(cls) -> MinHashConfig:
        """NeMo Curator's current fuzzy-dedup defaults: character 24-grams, 260 permutations (20 bands of 13 rows)."""
        return cls(shingle="char", ngram=24, num_perm=260)


def signatures(texts: pa.Array | pa.ChunkedArray, config: MinHashConfig,
               backend: Literal["numba", "jax"] = "numba") -> tuple[np.ndarray, np.ndarray]:
    """The MinHash signature of each text: ``(sigs, has_signature)``, ``sigs`` ``[len(texts), num_perm]`` (uint64, or
    uint32 with ``bits=32``) and ``has_signature`` a bool mask, false for nulls, texts with no shingles and, under
    ``short_documents="skip"``, short texts (their rows are all ones). A text's signature does not depend on the other
    texts of the batch. Both backends give the same signatures: ``numba`` (compiled once, then cached on disk) is the
    faster on CPUs, ``jax`` runs the permutations on an accelerator when JAX has one."""
    texts = as_array(texts)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise TypeError(f"minhash: texts must be a string array, got {texts.type}")
    if backend not in _BACKENDS:
        raise ValueError(f"minhash backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
    a, b = permutations(config)
    mins = np.full((len(texts), config.num_perm), _ALL_ONES, dtype=np.uint64)
    has_signature = np.zeros(len(texts), dtype=bool)
    for pieces, docs, whole in _groups(texts.to_pylist(), config):
        hashes, offsets = _shingle_hashes(pieces, whole, config)
        np.minimum.at(mins, docs, _BACKENDS[backend](hashes, offsets, a, b))
        has_signature[docs] = True
    if config.bits == 32:
        return (mins & _M32).astype(np.uint32), has_signature
    return mins, has_signature


def permutations(config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """The permutations' ``a`` and ``b`` (uint64, ``num_perm`` each), for code that checks or recomputes a
    signature: ``h_k(x) = (a[k] * x + b[k]) % (2**61 - 1)``."""
    rng = np.random.default_rng(config.seed)
    a = rng.integers(1, MERSENNE, config.num_perm, dtype=np.uint64)
    b = rng.integers(0, MERSENNE, config.num_perm, dtype=np.uint64)
    return a, b


def jaccard(a: str, b: str, config: MinHashConfig) -> float:
    """The exact Jaccard similarity of two texts' shingle sets, shingled and hashed as ``signatures`` shingles them
    (the sets their signatures estimate); 0.0 when either text has no shingles (a document without a signature is no
    duplicate)."""
    return set_jaccard(*shingle_sets([a, b], config))


def shingle_sets(texts: list[str], config: MinHashConfig) -> list[np.ndarray]:
    """Each text's shingle set as the sorted, distinct 61-bit hashes ``minhash`` gives its shingles (empty for a text
    with no shingles)."""
    out = [np.zeros(0, dtype=np.uint64) for _ in texts]
    parts: dict[int, list[np.ndarray]] = {}
    for pieces, docs, whole in _groups(list(texts), config):
        hashes, offsets = _shingle_hashes(pieces, whole, config)
        for k, doc in enumerate(docs.tolist()):
            parts.setdefault(doc, []).append(hashes[offsets[k]:offsets[k + 1]])
    for doc, found in parts.items():
        values = np.sort(np.concatenate(found))
        out[doc] = values[np.r_[True, values[1:] != values[:-1]]]
    return out


def set_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """The Jaccard of two sorted distinct hash sets; 0.0 when either is empty (as ``jaccard``)."""
    if not len(a) or not len(b):
        return 0.0
    at = np.minimum(np.searchsorted(a, b), len(a) - 1)
    both = int(np.count_nonzero(a[at] == b))
    return both / (len(a) + len(b) - both)


def lsh_threshold(bands: int, rows: int) -> float:
    """The similarity ``(1 / bands) ** (1 / rows)`` around which LSH with ``bands`` bands of ``rows`` signature
    positions goes from rarely to almost always making two documents candidates (its curve is steepest near it)."""
    _check_bands(bands, rows)
    return (1.0 / bands) ** (1.0 / rows)


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The probability ``1 - (1 - s**rows) ** bands`` that two documents of Jaccard similarity ``s`` share an LSH
    bucket (all ``rows`` positions of some band equal), to choose bands and rows for a similarity threshold."""
    _check_bands(bands, rows)
    if not 0.0 <= similarity <= 1.0:
        raise ValueError(f"similarity must be in [0, 1], got {similarity!r}")
    return 1.0 - (1.0 - similarity**rows) ** bands


def _check_bands(bands: int, rows: int) -> None:
    if bands < 1 or rows < 1:
        raise ValueError(f"bands and rows must be >= 1, got bands={bands}, rows={rows}")


def _groups(texts: list[str | None], config: MinHashConfig) -> Iterator[tuple[list[str], np.ndarray, np.ndarray]]:
    """The texts that get signatures as groups of about ``GROUP_CODE_POINTS`` code points: (pieces, the document of
    each, whether each is a short document's whole text). Word pieces are their words joined by single spaces."""
    n, word = config.ngram, config.shingle == "word"
    pieces: list[str] = []
    docs: list[int] = []
    whole: list[bool] = []
    size = 0
    for index, text in enumerate(texts):
        if text is None:
            continue
        if word:
            text = _normalized_words(text)
            units = text.count(" ") + 1 if text else 0
        else:
            units = len(text)
        if units == 0 or (units < n and config.short_documents == "skip"):
            continue
        if units < n or len(text) <= GROUP_CODE_POINTS:
            cut: Iterable[str] = [text]
        elif word:
            cut = _word_pieces(text, n)
        else:
            cut = (text[start : start + GROUP_CODE_POINTS + n - 1] for start in range(0, units - n + 1, GROUP_CODE_POINTS))
        for piece in cut:
            if pieces and size + len(piece) > GROUP_CODE_POINTS:
                yield pieces, np.array(docs, dtype=np.int64), np.array(whole, dtype=bool)
                pieces, docs, whole, size = [], [], [], 0
            pieces.append(piece)
            docs.append(index)
            whole.append(units < n)
            size += len(piece)
    if pieces:
        yield pieces, np.array(docs, dtype=np.int64), np.array(whole, dtype=bool)


def _normalized_words(text: str) -> str:
    """``" ".join(text.split())``; a long text a group's length at a time, cut at the ends of whitespace runs, so that
    there are never more word objects at once than a group's."""
    if len(text) <= GROUP_CODE_POINTS:
        return " ".join(text.split())
    parts = []
    start = 0
    while start < len(text):
        run = _WHITESPACE.search(text, start + GROUP_CODE_POINTS)
        end = len(text) if run is None else run.end()
        parts.append(" ".join(text[start:end].split()))
        start = end
    return " ".join(part for part in parts if part)


def _word_pieces(text: str, n: int) -> Iterator[str]:
    """A long document's pieces (``text`` normalized: words joined by single spaces) whose shingles start within about
    ``GROUP_CODE_POINTS`` code points each, found without a Python object per word."""
    start = 0
    while start < len(text):
        space = text.find(" ", start + GROUP_CODE_POINTS - 1)
        following = len(text) + 1 if space == -1 else space + 1  # the next piece's first word
        end = following - 1
        for _ in range(n - 1):  # this piece's last shingle ends n - 1 words after its last first word
            found = text.find(" ", end + 1) if end < len(text) else -1
            end = len(text) if found == -1 else found
        end = min(end, len(text))
        if end < len(text) or text.count(" ", start, end) + 1 >= n:
            yield text[start:end]
        start = following


def _shingle_hashes(pieces: list[str], whole: np.ndarray, config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """``x(s)`` of every shingle of every piece, piece after piece, and where each piece's shingles start."""
    code_points = np.frombuffer("".join(pieces).encode("utf-32-le"), dtype="<u4")
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    starts = np.cumsum(lengths) - lengths
    if config.shingle == "word":
        spaces = np.flatnonzero(code_points == 32)
        word_begin = np.sort(np.concatenate([starts, spaces + 1]))
        word_end = np.sort(np.concatenate([spaces, starts + lengths]))
        first_unit = np.searchsorted(word_begin, starts)
        units = np.diff(np.append(first_unit, len(word_begin)))
    else:
        first_unit, units = starts, lengths
    width = np.where(whole, units, config.ngram)
    counts = units - width + 1
    offsets = np.concatenate([[0], np.cumsum(counts)])
    first = np.repeat(first_unit - offsets[:-1], counts) + np.arange(offsets[-1])
    last = first + np.repeat(width - 1, counts)
    begin, end = (word_begin[first], word_end[last]) if config.shingle == "word" else (first, last + 1)
    inverse, powers = _power_tables(len(code_points))
    return _kernels().shingle_hashes(code_points, begin, end, inverse, powers), offsets


_POWER_TABLES: list[tuple[np.ndarray, np.ndarray]] = []


def _power_tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    """``BASE**-j`` and ``BASE**j`` mod ``p`` for at least ``j < size``: one pair of tables, grown to the next power of
    two when a group needs more, so that groups of every size share it."""
    tables = _POWER_TABLES[0] if _POWER_TABLES else None
    if tables is None or len(tables[0]) < size:
        count = max(1 << max(size - 1, 1).bit_length(), 2 * GROUP_CODE_POINTS)
        kernels = _kernels()
        tables = (kernels.powers(pow(BASE, MERSENNE - 2, MERSENNE), count), kernels.powers(BASE, count))
        _POWER_TABLES[:] = [tables]  # threads that race may leave a smaller pair here; each uses the pair it checked
    return tables


def _jax_min_hashes(hashes: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``minhash_kernels.piece_minima`` by one XLA kernel over rows of ``JAX_ROW`` shingles of one piece each."""
    try:
        from jax import enable_x64
    except ImportError:  # jax before enable_x64 moved out of jax.experimental
        from jax.experimental import enable_x64

    counts = np.diff(offsets)
    rows = -(-counts // JAX_ROW)
    first_row = np.cumsum(rows) - rows
    piece = np.repeat(np.arange(len(counts)), rows)
    index = (offsets[:-1] - first_row * JAX_ROW)[piece, None] + (np.arange(len(piece)) * JAX_ROW)[:, None] + np.arange(JAX_ROW)
    index = np.where(index < offsets[1:][piece, None], index, offsets[:-1][piece, None])
    padded = -(-len(piece) // JAX_ROWS) * JAX_ROWS
    grid = np.full((padded, JAX_ROW), hashes[0], dtype=np.uint64)
    grid[: len(piece)] = hashes[index]
    out = np.empty((padded, len(a)), dtype=np.uint64)
    kernel = _jax_kernel()
    with enable_x64(True):
        for row in range(0, padded, JAX_ROWS):
            out[row : row + JAX_ROWS] = kernel(grid[row : row + JAX_ROWS], a & _M31, a >> _U64(31), b)
    return np.minimum.reduceat(out[: len(piece)], first_row, axis=0)


@functools.cache
def _jax_kernel() -> Callable:
    """``(a * x + b) % p`` as ``minhash_kernels.piece_minima`` computes it, for ``[rows, JAX_ROW]`` shingles and all
    permutations, and the minimum of each row (compiled)."""
    import jax
    import jax.numpy as jnp

    def kernel(rows, a0, a1, b):
        u = jnp.uint64
        x0, x1 = (rows & u(2**31 - 1))[..., None], (rows >> u(31))[..., None]
        middle = a0 * x1 + a1 * x0
        total = a0 * x0 + ((a1 * x1) << u(1)) + (middle >> u(30)) + ((middle & u(2**30 - 1)) << u(31)) + b
        total = (total & u(MERSENNE)) + (total >> u(61))
        return jnp.minimum(total, total - u(MERSENNE)).min(axis=1)

    return jax.jit(kernel)


def _numba_min_hashes(hashes: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _kernels().piece_minima(hashes, offsets, a, b)


def _kernels() -> ModuleType:
    """``minhash_kernels``, imported when signatures are first computed: importing numba takes 0.2 s, which a process
    that only configures or runs other stages should not pay."""
    from tokenmix.curate import minhash_kernels

    return minhash_kernels


_BACKENDS = {"numba": _numba_min_hashes, "jax": _jax_min_hashes}
