"""The tokenizer settings every cache of a config shares, and the identity a cache records for them.

The identity (tokenizer fingerprint, vocabulary size, format and its options, BOS/EOS, dtype) is what
``TokenCache`` checks when a config opens a cache: a cache made with other settings is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.formats.encoder import PRETOKENIZED_KEY, EncoderSpec, format_context, token_dtype
from tokenmix.formats.tokenizer import describe_tokenizer, load_tokenizer


@dataclass(frozen=True)
class TokenizationConfig:
    """The tokenizer and the special tokens every document gets; part of each cache's identity."""

    tokenizer: str | None = None
    """Hub name or local directory of a Hugging Face tokenizer."""
    enforce_eos: bool = True
    """Append the tokenizer's EOS id to every document."""
    enforce_bos: bool | None = None
    """Prepend BOS to every document; None follows the tokenizer's own habit."""
    vocab_size: int | None = None
    """Levanter's field (its pass-through tokenizer needs it): when set, it must be the tokenizer's vocabulary size."""

    def encoder_spec(self, fmt: LmDatasetFormatBase, where: str) -> tuple[EncoderSpec, dict[str, Any]]:
        """The encoder for a format, and the identity a cache made with it records."""
        if not self.tokenizer:
            raise ValueError(f"{where}: `tokenizer` is not set; give a hub name or a local tokenizer directory")
        info = describe_tokenizer(self.tokenizer)
        if self.vocab_size is not None and self.vocab_size != info.vocab_size:
            raise ValueError(f"{where}: vocab_size is {self.vocab_size}, but tokenizer {self.tokenizer!r} has {info.vocab_size} "
                             "tokens; remove vocab_size (tokenmix reads it from the tokenizer) or give the tokenizer it belongs to")
        special = fmt.adds_special_tokens  # a chat template places its own
        use_bos = special and (info.adds_bos if self.enforce_bos is None else self.enforce_bos)
        use_eos = special and (self.enforce_eos or info.adds_eos)
        for wanted, token_id, what in ((use_bos, info.bos_id, "BOS"), (use_eos, info.eos_id, "EOS")):
            if wanted and token_id is None:
                raise ValueError(f"{where}: tokenizer {self.tokenizer!r} has no {what} token; set enforce_{what.lower()}: false")
        spec = EncoderSpec(
            tokenizer_json=info.backend_json,
            format=fmt,
            vocab_size=info.vocab_size,
            bos_id=info.bos_id if use_bos else None,
            eos_id=info.eos_id if use_eos else None,
            dtype=token_dtype(info.vocab_size),
            special_tokens=info.special_tokens,
            chat_template=info.chat_template,
        )
        try:
            fmt.bind(format_context(spec, load_tokenizer(self.tokenizer).backend_tokenizer.token_to_id))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        identity = {
            "tokenizer_fingerprint": info.fingerprint,
            "vocab_size": info.vocab_size,
            "format": fmt.identity(),
            "bos_id": spec.bos_id,
            "eos_id": spec.eos_id,
            "dtype": spec.dtype,
            "pretokenized_key": PRETOKENIZED_KEY,
        }
        if fmt.masks_loss:
            identity["loss_spans"] = True
        return spec, identity

    def pad_id(self) -> int:
        """The id packed examples are padded with: the tokenizer's pad token, else its EOS, else 0 (padding is never trained on)."""
        if not self.tokenizer:
            raise ValueError("`tokenizer` is not set; give a hub name or a local tokenizer directory")
        info = describe_tokenizer(self.tokenizer)
        return next((i for i in (info.pad_id, info.eos_id) if i is not None), 0)
