"""The tokenizer settings every cache of a config shares, and the identity a cache records for them.

The identity (tokenizer fingerprint, vocabulary size, format and its options, BOS/EOS, dtype) is what
``TokenCache`` checks when a config opens a cache: a cache made with other settings is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.formats.encoder import PRETOKENIZED_KEY, EncoderSpec, format_context, token_dtype
from tokenmix.formats.tokenizer import TokenizerIdentity, describe_tokenizer, load_tokenizer
from tokenmix.formats.tokenizer_identity import remember, tokenizer_identity


@dataclass(frozen=True)
class TokenizationConfig:
    """The tokenizer and the special tokens every document gets; part of each cache's identity."""

    tokenizer: str | None = None
    """Hub name, local tokenizer directory, a ``tokenizer.json`` file (NeoX's encoder file), or a directory of GPT-2's
    ``vocab.json`` + ``merges.txt``."""
    enforce_eos: bool = True
    """Append the tokenizer's EOS id to every document."""
    enforce_bos: bool | None = None
    """Prepend BOS to every document; None follows the tokenizer's own habit."""
    vocab_size: int | None = None
    """Levanter's field (its pass-through tokenizer needs it): when set, it must be the tokenizer's vocabulary size."""

    def encoder_spec(self, fmt: LmDatasetFormatBase, where: str) -> tuple[EncoderSpec, dict[str, Any]]:
        """The encoder for a format, and the identity a cache made with it records (loads the tokenizer)."""
        name = self.tokenizer_name(where)
        info = describe_tokenizer(name)
        bos_id, eos_id = self._special_ids(remember(name, info), fmt, where)
        spec = EncoderSpec(
            tokenizer_json=info.backend_json,
            format=fmt,
            vocab_size=info.vocab_size,
            bos_id=bos_id,
            eos_id=eos_id,
            dtype=token_dtype(info.vocab_size),
            special_tokens=info.special_tokens,
            chat_template=info.chat_template,
        )
        try:
            fmt.bind(format_context(spec, load_tokenizer(info.name_or_path).backend_tokenizer.token_to_id))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return spec, self._identity(info.fingerprint, info.vocab_size, fmt, bos_id, eos_id)

    def cache_identity(self, fmt: LmDatasetFormatBase, where: str) -> dict[str, Any]:
        """The identity a cache of this format made with these settings records, as ``encoder_spec`` gives it, but
        without loading the tokenizer once its files have been described on this machine (``tokenizer_identity.py``):
        what opening a cache checks."""
        known = tokenizer_identity(self.tokenizer_name(where))
        bos_id, eos_id = self._special_ids(known, fmt, where)
        return self._identity(known.fingerprint, known.vocab_size, fmt, bos_id, eos_id)

    def pad_id(self) -> int:
        """The id packed examples are padded with: the tokenizer's pad token, else its EOS, else 0 (padding is never trained on)."""
        known = tokenizer_identity(self.tokenizer_name("the data config"))
        return next((i for i in (known.pad_id, known.eos_id) if i is not None), 0)

    def tokenizer_name(self, where: str) -> str:
        """The tokenizer's name, or an error naming ``where`` it is missing."""
        if not self.tokenizer:
            raise ValueError(f"{where}: `tokenizer` is not set; give a hub name or a local tokenizer directory")
        return self.tokenizer

    def _special_ids(self, known: TokenizerIdentity, fmt: LmDatasetFormatBase, where: str) -> tuple[int | None, int | None]:
        """The BOS and EOS ids put around each document (None: none), checked against ``vocab_size``."""
        if self.vocab_size is not None and self.vocab_size != known.vocab_size:
            raise ValueError(f"{where}: vocab_size is {self.vocab_size}, but tokenizer {self.tokenizer!r} has {known.vocab_size} "
                             "tokens; remove vocab_size (tokenmix reads it from the tokenizer) or give the tokenizer it belongs to")
        special = fmt.adds_special_tokens  # a chat template places its own
        use_bos = special and (known.adds_bos if self.enforce_bos is None else self.enforce_bos)
        use_eos = special and (self.enforce_eos or known.adds_eos)
        for wanted, token_id, what in ((use_bos, known.bos_id, "BOS"), (use_eos, known.eos_id, "EOS")):
            if wanted and token_id is None:
                raise ValueError(f"{where}: tokenizer {self.tokenizer!r} has no {what} token; set enforce_{what.lower()}: false")
        return known.bos_id if use_bos else None, known.eos_id if use_eos else None

    @staticmethod
    def _identity(fingerprint: str, vocab_size: int, fmt: LmDatasetFormatBase, bos_id: int | None, eos_id: int | None) -> dict[str, Any]:
        identity = {
            "tokenizer_fingerprint": fingerprint,
            "vocab_size": vocab_size,
            "format": fmt.identity(),
            "bos_id": bos_id,
            "eos_id": eos_id,
            "dtype": token_dtype(vocab_size),
            "pretokenized_key": PRETOKENIZED_KEY,
        }
        if fmt.masks_loss:
            identity["loss_spans"] = True
        return identity
