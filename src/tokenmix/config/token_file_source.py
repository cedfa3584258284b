"""A source of token files another stack wrote (Megatron ``.bin/.idx``, datatrove ``.ds``, Nanoset ``.npy``, Cerebras HDF5), as users
write it: ``token_files: {kind: megatron, tokenizer: ...}`` on a source whose ``train_urls`` name the files.

The files are read in place (``cache/token_files_cache.py``). Their identity records the tokenizer the user declares they
were made with; one whose vocabulary differs from the mixture's tokenizer is refused, since its ids would mean other
tokens (or none) to the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from tokenmix.datasets.splits import parse_split
from tokenmix.formats.tokenizer_identity import tokenizer_identity
from tokenmix.sources.token_file_base import TokenFile, TokenFileError
from tokenmix.sources.token_file_kinds import TOKEN_FILE_KINDS, open_token_files

logger = logging.getLogger(__name__)

VOCAB_CHECK_TOKENS = 1 << 20
"""Tokens of each file checked against the vocabulary on open: a wrong declaration shows at once, at the cost of a
small read (a full scan would read the whole corpus)."""


@dataclass(frozen=True)
class TokenFilesConfig:
    """Token files read in place instead of text: which stack wrote them and what they were tokenized with."""

    kind: str = "megatron"
    """megatron (``prefix.bin`` + ``prefix.idx``; name the prefix or either file), datatrove (``.ds`` files or folders of
    them), nanoset (Nanotron's ``*_input_ids.npy`` token dumps), or hdf5 (directories of Cerebras HDF5 samples)."""
    tokenizer: str | None = None
    """The tokenizer the files were made with (hub name or local directory); unset: the config's tokenizer."""
    dtype: str | None = None
    """Token type where the files do not record it: a headerless Nanoset dump (uint16 or int32), datatrove files
    without ``.metadata`` (uint16 or uint32)."""
    eos_id: int | None = None
    """Nanoset files hold one stream without document boundaries: a document ends after each of these ids (unset:
    the stream is one document). Cerebras HDF5: the EOS its documents end with, where data_params.json does not say."""
    split: str | None = None
    """Nanotron's and Megatron's ``949,50,1``: train, validation and test by ratio of this source's examples (or, with
    ``split_by: documents``, of its documents), each a contiguous range."""
    split_by: Literal["examples", "documents"] = "examples"
    """What ``split`` divides: examples (as Nanoset does: a document may straddle two parts) or whole documents."""

    def __post_init__(self) -> None:
        if self.kind not in TOKEN_FILE_KINDS:
            raise ValueError(f"token_files.kind: {self.kind!r} is not a kind tokenmix reads; choose one of {list(TOKEN_FILE_KINDS)}")
        if self.split is not None:
            parse_split(self.split, "token_files.split")
        if self.split_by not in ("examples", "documents"):
            raise ValueError(f"token_files.split_by must be examples or documents, got {self.split_by!r}")
        if self.eos_id is not None and self.kind not in ("nanoset", "hdf5"):
            raise ValueError(f"token_files.eos_id splits Nanoset streams into documents; {self.kind} files record their documents, "
                             "so remove eos_id")

    def split_weights(self) -> tuple[float, ...] | None:
        return None if self.split is None else parse_split(self.split, "token_files.split")

    def open(self, urls: list[str], where: str) -> list[TokenFile]:
        """The files of ``urls``, opened as this kind (errors name the source)."""
        try:
            return open_token_files(self.kind, urls, self.dtype, self.eos_id)
        except TokenFileError as e:
            raise TokenFileError(f"{where}: {e}") from None

    def identity(self, config_tokenizer: str, where: str) -> dict[str, Any]:
        """What a cache over these files is: their kind, the declared tokenizer, and its vocabulary size, refusing a
        tokenizer whose vocabulary is not the config's."""
        declared = tokenizer_identity(self.tokenizer or config_tokenizer)
        if self.tokenizer and self.tokenizer != config_tokenizer:
            mixture = tokenizer_identity(config_tokenizer)
            if declared.vocab_size != mixture.vocab_size:
                raise ValueError(f"{where}: token_files.tokenizer {self.tokenizer!r} has {declared.vocab_size} tokens but the config's "
                                 f"tokenizer {config_tokenizer!r} has {mixture.vocab_size}: the ids of these files would mean other "
                                 "tokens to the model. Mix only sources tokenized with the same vocabulary (re-tokenize the text, "
                                 "or train with the files' tokenizer)")
            if declared.fingerprint != mixture.fingerprint:
                logger.warning("%s: declared tokenizer %r is not the config's %r (same vocabulary size, %d, but other tokens or "
                               "merges); its ids are read as they are", where, self.tokenizer, config_tokenizer, declared.vocab_size)
        return {"token_files": self.kind, "tokenizer_fingerprint": declared.fingerprint, "vocab_size": declared.vocab_size,
                "eos_id": self.eos_id if self.kind in ("nanoset", "hdf5") else declared.eos_id}


def check_vocabulary(files: list[TokenFile], vocab_size: int, where: str) -> None:
    """Refuse files whose first tokens fall outside the vocabulary (a wrong tokenizer declaration, or the wrong dtype)."""
    import numpy as np  # here: reading a config imports no numpy

    for f in files:
        head = np.asarray(f.tokens[:VOCAB_CHECK_TOKENS])
        if head.size and (int(head.max()) >= vocab_size or int(head.min()) < 0):
            bad = int(head.max()) if int(head.max()) >= vocab_size else int(head.min())
            raise ValueError(f"{where}: {f.path} holds token id {bad}, outside the {vocab_size}-token vocabulary declared for it; "
                             "declare the tokenizer the files were made with (token_files.tokenizer), or the right dtype")
