"""What the encoders and the backend check need of a tokenizer's serialization, remembered on this machine.

Four facts follow from a serialization alone: whether it encodes at random (a BPE with dropout, whose verdicts are never
remembered), its added tokens (the probes write them inside text), whether a long document may be cut at spaces
between words without changing its ids (``long_docs.split_text``), and how many bytes of text each token stands for
(``fastokens`` reports no character offsets; they follow from these, ``backends.char_offsets``). Each needs the
serialization parsed: megabytes of JSON, 20-30 ms holding the GIL, on a cold build's way from its start to its first
chunk encoded, where nothing else runs but imports, which hold the GIL too. So they are kept in a small file keyed by a
SHA-256 of the serialization and of this module's code (path, size, modification time: an edit or a reinstall is
another key), beside the remembered tokenizer descriptions (``tokenizer_identity.descriptions_dir``); a file that is
missing, unreadable or malformed is made again from the parsed serialization.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmix.formats.tokenizer_identity import code_version, descriptions_dir, remember_file

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

_FORMAT = 1
"""Version of the remembered facts' layout; part of the key."""


@dataclass(frozen=True, eq=False)
class TokenizerFacts:
    """What the encoders and the backend check read of one serialization."""

    encodes_at_random: bool
    """The ids may change from one encoding to the next (a BPE with dropout)."""
    added_tokens: tuple[str, ...]
    """The added tokens' texts (special or not), in the serialization's order."""
    exact_split: bool
    """Cutting a text at a space between two ASCII word characters leaves the ids of the pieces those of the whole."""
    byte_lengths: np.ndarray | None
    """How many bytes of text each token id stands for (``int64``, by id), where every token is a byte sequence
    (byte-level BPE without a normalizer, byte fallback or word affixes); None for other tokenizers."""


@functools.lru_cache(maxsize=4)
def serialization_digest(tokenizer_json: str) -> bytes:
    """The SHA-256 of a serialization (megabytes), once per process: the facts' key and the verdicts' keys need it."""
    return hashlib.sha256(tokenizer_json.encode("utf-8", "surrogatepass")).digest()


@functools.lru_cache(maxsize=4)
def tokenizer_facts(tokenizer_json: str) -> TokenizerFacts:
    """The facts of a serialized Hugging Face tokenizer: remembered ones where this machine has them, else derived from
    the parsed serialization and remembered."""
    digest = hashlib.sha256(f"{_FORMAT}\0{code_version(__file__)}\0".encode())
    digest.update(serialization_digest(tokenizer_json))
    path = descriptions_dir() / f"{digest.hexdigest()}.facts.json"
    known = _recall(path)
    if known is not None:
        return known
    facts = _derive(json.loads(tokenizer_json))
    remember_file(path, _serialized(facts))
    return facts


def _derive(spec: dict[str, Any]) -> TokenizerFacts:
    import numpy as np

    model = spec.get("model") or {}
    added_tokens = spec.get("added_tokens") or []
    pre = spec.get("pre_tokenizer") or {}
    steps = [pre, *(pre.get("pretokenizers") or [] if pre.get("type") == "Sequence" else [])]
    exact_split = (spec.get("normalizer") is None and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
                   and not pre.get("add_prefix_space", False)
                   and not any(t.get("lstrip") or t.get("rstrip") or " " in t.get("content", "") for t in added_tokens))
    lengths = None
    if (spec.get("normalizer") is None and model.get("type") == "BPE" and not model.get("byte_fallback")
            and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
            and any(step.get("type") == "ByteLevel" for step in steps)):
        added = {t["id"]: len(t["content"].encode("utf-8")) for t in added_tokens}
        vocab = model.get("vocab") or {}
        lengths = np.zeros(max([*vocab.values(), *added, -1]) + 1, np.int64)
        for token, i in vocab.items():
            lengths[i] = len(token)  # one character of the byte-level alphabet per byte
        for i, n in added.items():
            lengths[i] = n
    return TokenizerFacts(encodes_at_random=bool(model.get("dropout")),
                          added_tokens=tuple(t["content"] for t in added_tokens if t.get("content")),
                          exact_split=bool(exact_split), byte_lengths=lengths)


def _serialized(facts: TokenizerFacts) -> bytes:
    lengths = None
    if facts.byte_lengths is not None:
        lengths = base64.b64encode(facts.byte_lengths.astype("<u4").tobytes()).decode("ascii")
    return json.dumps({"encodes_at_random": facts.encodes_at_random, "added_tokens": list(facts.added_tokens),
                       "exact_split": facts.exact_split, "byte_lengths": lengths}).encode("utf-8")


def _recall(path: Path) -> TokenizerFacts | None:
    """The facts remembered at ``path``, or None (never remembered, or unreadable: they are derived again)."""
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
        flags = known["encodes_at_random"], known["exact_split"]
        added, lengths = known["added_tokens"], known["byte_lengths"]
        if (not all(isinstance(flag, bool) for flag in flags) or not isinstance(added, list)
                or not all(isinstance(token, str) for token in added) or not (lengths is None or isinstance(lengths, str))):
            raise TypeError(f"unexpected types in {sorted(known)}")
        if lengths is not None:
            import numpy as np

            raw = base64.b64decode(lengths, validate=True)
            if len(raw) % 4:  # empty for a tokenizer with no tokens
                raise ValueError(f"byte lengths of {len(raw)} bytes")
            lengths = np.frombuffer(raw, "<u4").astype(np.int64)
        return TokenizerFacts(encodes_at_random=flags[0], added_tokens=tuple(added), exact_split=flags[1], byte_lengths=lengths)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        logger.debug("ignoring the remembered tokenizer facts %s: %s", path, e)
        return None
