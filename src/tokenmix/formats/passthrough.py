"""Levanter's passthrough tokenizer (``tokenizer: passthrough``): text of whitespace-separated integers read as token ids.

Levanter's ``PassthroughTokenizer(vocab_size)`` parses a document's text as integers and returns them as its ids, with no
BOS, EOS or other special token (so Levanter appends none, whatever ``enforce_eos`` says). tokenmix gives the same ids
through a ``tokenizer.json`` that maps the decimal text of each id in ``[0, vocab_size)`` to that id, split on
whitespace; it is written once per vocabulary size next to tokenmix's tokenizer descriptions, so every build and every
worker reads the same file. A word that is not the decimal form of such an id (``12.5``, ``007``, an id at or above
``vocab_size``) fails the build with the tokenizer's error, where Levanter would stop parsing the document there.
"""

from __future__ import annotations

import functools
import logging

from tokenmix.formats.tokenizer_identity import descriptions_dir, remember_file

logger = logging.getLogger(__name__)

PASSTHROUGH = "passthrough"
"""The tokenizer name Levanter reads as its passthrough tokenizer."""
_UNKNOWN = "[UNK]"


def passthrough_tokenizer_file(vocab_size: int | None, where: str) -> str:
    """The ``tokenizer.json`` of Levanter's passthrough tokenizer for ``vocab_size`` ids (written on first use), or an error
    naming ``where`` and ``vocab_size`` when it is not set."""
    if vocab_size is None or vocab_size < 1:
        raise ValueError(f"{where}: tokenizer: passthrough reads token ids written as text, and needs vocab_size (the number of "
                         f"ids, as Levanter's passthrough tokenizer does); set vocab_size, got {vocab_size!r}")
    path = descriptions_dir().parent / PASSTHROUGH / f"passthrough-{vocab_size}.tokenizer.json"
    serialization = _serialization(vocab_size)
    try:
        written = path.read_bytes()
    except OSError:  # not written yet, or not readable: written (again), or an error saying where it cannot be
        written = None
    if written != serialization:
        if written is not None:
            logger.warning("%s is not the passthrough tokenizer of %d ids (damaged): writing it again", path, vocab_size)
        if not remember_file(path, serialization):  # racing writers write the same bytes
            raise OSError(f"{where}: tokenizer: passthrough needs its tokenizer file at {path}, which cannot be written there. Fix: "
                          "free space there, or set TOKENMIX_CACHE_DIR to a writable directory")
    return str(path)


@functools.lru_cache(maxsize=4)
def _serialization(vocab_size: int) -> bytes:
    """The ``tokenizer.json`` of the passthrough tokenizer of ``vocab_size`` ids, made once per process (45 ms for GPT-2's
    50,257 ids): what its file must hold, compared at every use, as a file written once is trusted by every later build."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token=_UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer.to_str().encode("utf-8")
