"""What a cache's encoding is made of (``EncoderSpec``: the tokenizer, the format, BOS/EOS, dtype), apart from the
encoding itself (``encoder.py``): a config makes the spec when it is read, without the encoder's numpy."""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from typing import Any

from tokenmix.formats.backends import REFERENCE
from tokenmix.formats.base import FormatContext, LmDatasetFormatBase

PRETOKENIZED_KEY = "input_ids"
DEFAULT_LONG_DOC_CHARS = 100_000
BACKEND_PACKAGES = ("fastokens", "tokenizers")
"""The libraries that encode text into ids (``backends.py``)."""
TEXT_LIBRARIES = ("numpy", "orjson", "ftfy", "jinja2", "transformers")
"""Libraries that make the text the backends encode, or assemble what a cache holds: ``orjson`` parses the records,
``ftfy`` repairs their text (``use_ftfy``), ``jinja2`` and ``transformers`` render a chat template, ``numpy`` assembles
the ids."""


@functools.cache
def encoding_modules() -> tuple[str, ...]:
    """The files of ``tokenmix.formats``: the code that decides what a record encodes to, with either backend."""
    return tuple(sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))))


@dataclass(frozen=True)
class EncoderSpec:
    """Everything a worker needs to encode records the same way as every other worker."""

    tokenizer_json: str
    format: LmDatasetFormatBase
    vocab_size: int
    bos_id: int | None
    """Token id put before every document, or None for none."""
    eos_id: int | None
    """Token id put after every document, or None for none."""
    dtype: str
    long_doc_chars: int = DEFAULT_LONG_DOC_CHARS
    special_tokens: tuple[tuple[str, str], ...] = ()
    """The tokenizer's named special tokens (``bos_token``, ...), as a chat template sees them."""
    chat_template: str | None = None
    """The tokenizer's own chat template."""
    backend: str = REFERENCE
    """The library that encodes text (``fastokens`` or ``tokenizers``): the same ids either way (``backends.py``)."""


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id of a vocabulary of this size."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def format_context(spec: EncoderSpec, token_to_id: Any) -> FormatContext:
    """What the spec's format may ask of the tokenizer (``token_to_id`` is the backend tokenizer's)."""
    return FormatContext(token_to_id, spec.vocab_size, dict(spec.special_tokens), spec.chat_template)
