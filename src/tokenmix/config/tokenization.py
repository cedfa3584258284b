"""The tokenizer settings every cache of a config shares, and the identity a cache records for them.

The identity (tokenizer fingerprint, vocabulary size, format and its options, BOS/EOS, dtype) is what
``TokenCache`` checks when a config opens a cache: a cache made with other settings is refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from tokenmix.formats.backends import load_reference
from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.formats.encoder_spec import PRETOKENIZED_KEY, EncoderSpec, format_context, token_dtype
from tokenmix.formats.passthrough import PASSTHROUGH, passthrough_tokenizer_file
from tokenmix.formats.tokenizer import TokenizerIdentity
from tokenmix.formats.tokenizer_identity import tokenizer_identity, tokenizer_info

logger = logging.getLogger(__name__)

LEVANTER_DEFAULT_TOKENIZER = "gpt2"
"""What a data config without ``tokenizer`` means, as in Levanter; found only in the local Hugging Face cache."""
_TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json", "config.json"]


@dataclass(frozen=True)
class TokenizationConfig:
    """The tokenizer and the special tokens every document gets; part of each cache's identity."""

    tokenizer: str | None = None
    """Hub name, local tokenizer directory, a ``tokenizer.json`` file (NeoX's encoder file), or a directory of GPT-2's
    ``vocab.json`` + ``merges.txt``, or ``passthrough`` (Levanter's: text of integers read as ids; needs ``vocab_size``).
    Unset means Levanter's default, ``gpt2``, taken from the local Hugging Face cache
    (never downloaded) when a cache is built or opened."""
    enforce_eos: bool = True
    """Append the tokenizer's EOS id to every document."""
    enforce_bos: bool | None = None
    """Prepend BOS to every document; None follows the tokenizer's own habit."""
    vocab_size: int | None = None
    """Levanter's field: the passthrough tokenizer's number of ids; with any other tokenizer, when set, it must be the
    tokenizer's vocabulary size."""
    chat_template: str | None = None
    """Levanter's field: the chat template of every chat source whose format gives none (else the tokenizer's)."""

    def encoder_spec(self, fmt: LmDatasetFormatBase, where: str) -> tuple[EncoderSpec, dict[str, Any]]:
        """The encoder for a format, and the identity a cache made with it records (loads the tokenizer, unless its files
        were described before on this machine: ``tokenizer_identity.py``)."""
        fmt = self.source_format(fmt)
        name = self.tokenizer_name(where)
        info = tokenizer_info(name)
        bos_id, eos_id = self._special_ids(info.identity(), fmt, where)
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
            # the backend loads only for a format that asks for an id (FIM): a build's backend check loads it in a thread
            fmt.bind(format_context(spec, lambda token: load_reference(info.backend_json).token_to_id(token)))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return spec, self._identity(info.fingerprint, info.vocab_size, fmt, bos_id, eos_id)

    def cache_identity(self, fmt: LmDatasetFormatBase, where: str) -> dict[str, Any]:
        """The identity a cache of this format made with these settings records, as ``encoder_spec`` gives it, but
        without loading the tokenizer once its files have been described on this machine (``tokenizer_identity.py``):
        what opening a cache checks."""
        fmt = self.source_format(fmt)
        known = tokenizer_identity(self.tokenizer_name(where))
        bos_id, eos_id = self._special_ids(known, fmt, where)
        return self._identity(known.fingerprint, known.vocab_size, fmt, bos_id, eos_id)

    def source_format(self, fmt: LmDatasetFormatBase) -> LmDatasetFormatBase:
        """A source's format with the config's ``chat_template`` where the format takes a template and gives none."""
        if self.chat_template is None or getattr(fmt, "chat_template", self.chat_template) is not None:
            return fmt
        return replace(fmt, chat_template=self.chat_template)  # type: ignore[type-var]

    def pad_id(self) -> int:
        """The id packed examples are padded with: the tokenizer's pad token, else its EOS, else 0 (padding is never trained on)."""
        known = tokenizer_identity(self.tokenizer_name("the data config"))
        return next((i for i in (known.pad_id, known.eos_id) if i is not None), 0)

    def tokenizer_name(self, where: str) -> str:
        """The tokenizer's name; unset, the local Hugging Face cache's copy of Levanter's default (``gpt2``), or an error
        naming ``where``, the field and the fix when that cache does not hold it."""
        if self.tokenizer == PASSTHROUGH:
            return passthrough_tokenizer_file(self.vocab_size, where)
        if self.tokenizer:
            return self.tokenizer
        return default_tokenizer(where)

    def _special_ids(self, known: TokenizerIdentity, fmt: LmDatasetFormatBase, where: str) -> tuple[int | None, int | None]:
        """The BOS and EOS ids put around each document (None: none), checked against ``vocab_size``."""
        if self.vocab_size is not None and self.vocab_size != known.vocab_size:
            raise ValueError(f"{where}: vocab_size is {self.vocab_size}, but tokenizer {self.tokenizer!r} has {known.vocab_size} "
                             "tokens; remove vocab_size (tokenmix reads it from the tokenizer) or give the tokenizer it belongs to")
        special = fmt.adds_special_tokens  # a chat template places its own
        if self.tokenizer == PASSTHROUGH:  # Levanter's has no special tokens, so it appends none whatever enforce_* say
            if special and (self.enforce_eos or self.enforce_bos):
                logger.info("%s: tokenizer: passthrough has no BOS or EOS token: none is added (as Levanter)", where)
            return None, None
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


def default_tokenizer(where: str) -> str:
    """The local directory of Levanter's default tokenizer in the Hugging Face cache, never downloaded: a config that
    names no tokenizer must not fetch one behind its user's back, nor fail later for want of a network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(LEVANTER_DEFAULT_TOKENIZER, allow_patterns=_TOKENIZER_FILES, local_files_only=True)
    except LocalEntryNotFoundError:
        raise ValueError(
            f"{where}: `tokenizer` is not set, so it is Levanter's default, {LEVANTER_DEFAULT_TOKENIZER!r}, which tokenmix takes "
            "only from the local Hugging Face cache, and that cache holds no copy of it. Fix: set `tokenizer:` to a hub id or a "
            f"local tokenizer directory, or put {LEVANTER_DEFAULT_TOKENIZER!r} in the cache once "
            f"(`huggingface-cli download {LEVANTER_DEFAULT_TOKENIZER}`)") from None
    logger.info("%s: `tokenizer` is not set: Levanter's default, %r, from the local Hugging Face cache (%s)", where,
                LEVANTER_DEFAULT_TOKENIZER, path)
    return path
