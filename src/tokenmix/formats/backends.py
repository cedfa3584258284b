"""Which library turns text into token ids: ``fastokens`` where it gives exactly the ids Hugging Face ``tokenizers``
gives, ``tokenizers`` (the reference) otherwise.

``fastokens`` reads the same ``tokenizer.json`` and encodes a batch into one flat buffer, about 20x faster than
``tokenizers``' ``encode_batch_fast`` on byte-level BPE; it does not load every tokenizer (no NFKC, Metaspace or
WordPiece, for instance) and does not report character offsets. Exactness is checked rather than assumed: before a
build, a sample of its input (encoded into what the cache would hold: ids, lengths, loss spans) and a set of probes
(every added token written inside text, whitespace, Unicode) are encoded by both, and any difference keeps the build
on ``tokenizers``. Character offsets, which chat loss masks need, are derived from the ids for byte-level BPE
(``tokenizer_facts.TokenizerFacts.byte_lengths``), and checked the same way. The backend never enters a cache's identity:
the ids are the same, so caches built either way are byte-identical.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tokenmix.formats.probe_verdicts import ProbeVerdict, recall_verdict, remember_verdict, verdict_key
from tokenmix.formats.tokenizer_facts import tokenizer_facts

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

TokenizerBackend = Literal["auto", "fastokens", "tokenizers"]
FAST = "fastokens"
REFERENCE = "tokenizers"

_PROBES = (
    "Hello, world! It's 2026-11-23; x=1+2*3.",
    "  leading spaces, trailing tabs\t\t\nnew lines\r\n\n\n  and   runs   of   spaces  ",
    "Ünïcödé: naïve café, ﬁ ligature, ① ２, ÀÉÎ, ß, İ, Ω, 中文字符, 日本語のテキスト, 한국어, العربية, עברית",
    "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧, zero\u200bwidth, soft\u00adhyphen, nbsp\u00a0here, combining e\u0301",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n\tindented\n",
    "1234567890 3.14159 1,000,000 0xDEADBEEF",
)
"""Texts every backend check encodes, besides the sample of the input and the added tokens written inside text."""


class FastBackendUnavailable(RuntimeError):
    """``fastokens`` cannot load this tokenizer (or is not installed)."""


@dataclass(frozen=True)
class BackendChoice:
    """The backend a build uses, and why (for the log and ``stats.json``)."""

    name: str
    reason: str


_MAX_LOADED = 4
_loaded: dict[str, Future] = {}
_loaded_lock = threading.Lock()


def preload_fast(tokenizer_json: str) -> Future:
    """Start loading the ``fastokens.Tokenizer`` of a serialized tokenizer in a background thread (it takes about 0.15 s),
    so that the load overlaps the work before a build needs it; a tokenizer already loaded or loading is not loaded again.
    The thread is not a daemon: native code still running when the interpreter exits would abort it."""
    with _loaded_lock:
        future = _loaded.get(tokenizer_json)
        if future is None:
            if len(_loaded) >= _MAX_LOADED:
                _loaded.pop(next(iter(_loaded)))
            future = _loaded[tokenizer_json] = Future()
            threading.Thread(target=_load_into, args=(tokenizer_json, future), name="tokenmix-fastokens-load").start()
    return future


def load_fast(tokenizer_json: str) -> Any:
    """The ``fastokens.Tokenizer`` of a serialized Hugging Face tokenizer (loaded once per process), or
    ``FastBackendUnavailable`` saying why there is none."""
    return preload_fast(tokenizer_json).result()


def forget_loaded() -> None:
    """Drop the loaded ``fastokens`` tokenizers, so that the next build loads its own (a benchmark's cold start)."""
    with _loaded_lock:
        _loaded.clear()


def _load_into(tokenizer_json: str, future: Future) -> None:
    try:
        import fastokens
    except ImportError as e:
        future.set_exception(FastBackendUnavailable(f"fastokens is not installed ({e})"))
        return
    try:
        future.set_result(fastokens.Tokenizer.from_json_str(tokenizer_json))
    except (ValueError, RuntimeError) as e:
        future.set_exception(FastBackendUnavailable(f"fastokens cannot load this tokenizer: {e}"))


def fast_ids(tokenizer: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts' token ids from a ``fastokens.Tokenizer``, one after another (``uint32``), text ``i``'s at
    ``ids[bounds[i]:bounds[i + 1]]``: special tokens recognised in the text and none added, as ``tokenizers``'
    ``encode(text, add_special_tokens=False)`` gives them."""
    import numpy as np  # in each function that uses it: a config names the backends, and reading one imports no numpy

    ids, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False)
    return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)


def char_offsets(ids: np.ndarray, text: str, byte_lengths: np.ndarray) -> np.ndarray | None:
    """Each token's ``[start, end)`` in characters of ``text`` (a token covering part of a character covers all of it),
    as ``tokenizers`` reports offsets; None when the tokens' bytes do not add up to the text's."""
    import numpy as np

    raw = np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
    sizes = byte_lengths[ids]
    if not len(ids) or sizes.min() <= 0 or int(sizes.sum()) != len(raw):
        return None
    char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
    ends = np.cumsum(sizes)
    return np.stack([char_of_byte[ends - sizes], char_of_byte[ends - 1] + 1], axis=1)


@functools.lru_cache(maxsize=4)
def probe_texts(tokenizer_json: str) -> tuple[str, ...]:
    """The fixed probes, and each added token (special or not) written inside text, alone and next to words."""
    added = tokenizer_facts(tokenizer_json).added_tokens
    inside = [f"text {a} more text{a}tail\n{a}" for a in added]
    return (*_PROBES, *inside, "".join(added))


@functools.lru_cache(maxsize=4)
def load_reference(tokenizer_json: str) -> Any:
    """The ``tokenizers.Tokenizer`` of a serialized Hugging Face tokenizer, kept per definition."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


@functools.lru_cache(maxsize=4)
def probe_difference(tokenizer_json: str) -> str | None:
    """Where ``fastokens`` and ``tokenizers`` first disagree on the probes, or None: the same for every build with this
    tokenizer and these libraries, so found once per process, and remembered on this machine (``probe_verdicts.py``)
    unless the tokenizer encodes at random."""
    key = None if tokenizer_facts(tokenizer_json).encodes_at_random else verdict_key(tokenizer_json, _PROBES, [__file__])
    known = recall_verdict(key) if key is not None else None
    if known is not None:
        return known.difference
    difference = _difference(tokenizer_json, load_fast(tokenizer_json), list(probe_texts(tokenizer_json)))
    if key is not None:
        remember_verdict(key, ProbeVerdict(difference))
    return difference


def _difference(tokenizer_json: str, fast: Any, texts: list[str]) -> str | None:
    import numpy as np

    expected = load_reference(tokenizer_json).encode_batch_fast(texts, add_special_tokens=False)
    ids, bounds = fast_ids(fast, texts)
    for n, (text, want, a, b) in enumerate(zip(texts, expected, bounds[:-1].tolist(), bounds[1:].tolist())):
        got = ids[a:b]
        if not np.array_equal(np.asarray(want.ids, np.int64), got.astype(np.int64)):
            at = next((i for i, (x, y) in enumerate(zip(want.ids, got.tolist())) if x != y), min(len(want.ids), len(got)))
            return (f"probe text {n} ({text[:40]!r}...) differs at token {at}: "
                    f"tokenizers gives {want.ids[at:at + 3]}, fastokens {got[at:at + 3].tolist()}")
    return None


def choose_backend(tokenizer_json: str, requested: TokenizerBackend, sample_difference: Callable[[], str | None],
                   sampled: str) -> BackendChoice:
    """The backend to build with: ``requested`` when it is one, else ``fastokens`` when it loads this tokenizer and
    gives the reference's results on the probes and on a sample of the input (``sample_difference()``: where the
    sample's encodings differ, or None; ``sampled`` says what the sample was), else ``tokenizers``.

    A forced ``fastokens`` that cannot load the tokenizer raises ``FastBackendUnavailable``; one that differs is used
    all the same, with a warning that its caches will not hold ``tokenizers``' ids.
    """
    if requested == REFERENCE:
        return BackendChoice(REFERENCE, "build.tokenizer_backend: tokenizers")
    try:
        load_fast(tokenizer_json)
    except FastBackendUnavailable as e:
        if requested == FAST:
            raise FastBackendUnavailable(f"build.tokenizer_backend: fastokens, but {e}. Fix: set build.tokenizer_backend: auto "
                                         "(or tokenizers) to build with Hugging Face tokenizers") from None
        return BackendChoice(REFERENCE, str(e))
    difference = probe_difference(tokenizer_json) or sample_difference()
    if difference is None:
        checked = f"{sampled} and the probes encode identically"
        return BackendChoice(FAST, "build.tokenizer_backend: fastokens; " + checked if requested == FAST else checked)
    if requested == FAST:
        logger.warning("build.tokenizer_backend: fastokens is forced although it differs from tokenizers: %s. The cache will "
                       "not hold the ids Hugging Face tokenizers gives; set build.tokenizer_backend: auto to be safe", difference)
        return BackendChoice(FAST, "build.tokenizer_backend: fastokens (forced; differs from tokenizers: " + difference + ")")
    return BackendChoice(REFERENCE, "fastokens differs from tokenizers: " + difference)
