"""Loading a tokenizer and describing it: identity fingerprint, special tokens, default BOS/EOS.

The fingerprint hashes the tokenizer's full serialized definition (vocabulary, merges,
normalizer, pre-tokenizer, added tokens) plus its special-token settings and chat template, so
the same tokenizer loaded by hub name or from a local copy gets the same fingerprint, and any
change to what it produces gets a different one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class _NoTorchAdvice(logging.Filter):
    """Drops transformers' "PyTorch was not found" advice: tokenmix uses its tokenizers only, never its models."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found")


_NO_TORCH_ADVICE = _NoTorchAdvice()


def import_transformers() -> None:
    """Import ``transformers`` (for its tokenizers and chat templates) without its advice to install PyTorch."""
    logging.getLogger("transformers").addFilter(_NO_TORCH_ADVICE)
    import transformers  # noqa: F401


class TokenizerLoadError(ValueError):
    """The tokenizer named in a config could not be loaded."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What the cache needs to know about a tokenizer, picklable for worker processes."""

    name_or_path: str
    fingerprint: str
    backend_json: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    adds_bos: bool
    """Whether the tokenizer's own post-processor puts a BOS at the start of a sequence."""
    adds_eos: bool
    """Whether the tokenizer's own post-processor puts an EOS at the end of a sequence."""
    special_tokens: tuple[tuple[str, str], ...] = ()
    """Named special tokens (``bos_token``, ``eos_token``, ...) as a chat template sees them."""
    chat_template: str | None = None


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str) -> Any:
    """Load a Hugging Face tokenizer by hub name or local directory (offline needs a local path)."""
    import_transformers()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        hint = (
            "the directory exists but holds no loadable tokenizer (need tokenizer.json or vocab files)"
            if os.path.isdir(name_or_path)
            else "no such local directory, and the hub could not provide it; offline, give a local path"
        )
        raise TokenizerLoadError(f"tokenizer {name_or_path!r} could not be loaded: {hint} ({e})") from e


def describe_tokenizer(name_or_path: str) -> TokenizerInfo:
    """Load a tokenizer and describe it (fingerprint, vocabulary size, special ids, BOS/EOS habits)."""
    tok = load_tokenizer(name_or_path)
    backend = tok.backend_tokenizer
    backend_json = backend.to_str()
    identity = {
        "backend_sha256": hashlib.sha256(backend_json.encode("utf-8")).hexdigest(),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "chat_template": getattr(tok, "chat_template", None),
    }
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()
    probe = backend.encode("a", add_special_tokens=True).ids
    plain = backend.encode("a", add_special_tokens=False).ids
    bos_id, eos_id = tok.bos_token_id, tok.eos_token_id
    adds_bos = bos_id is not None and len(probe) > len(plain) and probe[0] == bos_id
    adds_eos = eos_id is not None and len(probe) > len(plain) and probe[-1] == eos_id
    return TokenizerInfo(
        name_or_path=name_or_path,
        fingerprint=fingerprint,
        backend_json=backend_json,
        vocab_size=len(tok),
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=tok.pad_token_id,
        adds_bos=adds_bos,
        adds_eos=adds_eos,
        special_tokens=tuple(sorted((k, str(v)) for k, v in tok.special_tokens_map.items() if isinstance(v, str))),
        chat_template=identity["chat_template"] if isinstance(identity["chat_template"], str) else None,
    )
