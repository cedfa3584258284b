"""Levanter's passthrough tokenizer (``tokenizer: passthrough``): text of whitespace-separated integers read as token ids.

Levanter's ``PassthroughTokenizer(vocab_size)`` parses a document's text as integers and returns them as its ids, with no
BOS, EOS or other special token (so Levanter appends none, whatever ``enforce_eos`` says). tokenmix gives the same ids
through a ``tokenizer.json`` that maps the decimal text of each id in ``[0, vocab_size)`` to that id, split on
whitespace; it is written once per vocabulary size next to tokenmix's tokenizer descriptions, so every build and every
worker reads the same file. A word that is not the decimal form of such an id (``12.5``, ``007``, an id at or above
``vocab_size``) fails the build with the tokenizer's error, where Levanter would stop parsing the document there.
"""

from __future__ import annotations

import os
import tempfile

from tokenmix.formats.tokenizer_identity import descriptions_dir

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
    if not path.exists():
        from tokenizers import Tokenizer, models, pre_tokenizers

        tokenizer = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token=_UNKNOWN))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(tokenizer.to_str())
        os.replace(tmp, path)  # racing writers write the same bytes
    return str(path)
