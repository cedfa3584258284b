"""``fim``: fill-in-the-middle on text documents (Cerebras' and the FIM paper's semantics).

With probability ``fim_rate`` a document's text is cut at two character positions, drawn uniformly
from ``[0, len]`` and sorted, into prefix, middle and suffix (each may be empty), which are tokenized
each on its own and laid out, with probability ``spm_rate``, as SPM, else as PSM:

    PSM:  [BOS] <fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle [EOS]
    SPM:  [BOS] <fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle [EOS]

(SPM is variant 2 of the FIM paper, as in Cerebras' and Megatron's preprocessing.) Other documents
stay plain text. Every token is trained on. The draws come from a hash of the seed and the document's
text, not from a stream of random numbers, so a document gets the same transform whatever the worker
count, the chunking or an interrupted build: the same cache built twice is byte-identical.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import FormatContext, LmDatasetFormatBase, RecordRenderer, Rendered
from tokenmix.formats.text import TextLmDatasetFormat
from tokenmix.formats.text_fixes import normal_form, without_unused_repairs

_ONE = 1 << 64


@LmDatasetFormatBase.register_subclass("fim")
@dataclass(frozen=True)
class FimLmDatasetFormat(LmDatasetFormatBase):
    """Text in one field, fill-in-the-middle transformed with probability ``fim_rate``."""

    text_key: str = "text"
    fim_rate: float = 0.5
    """Probability that a document is transformed."""
    spm_rate: float = 0.5
    """Probability that a transformed document is laid out SPM rather than PSM."""
    fim_prefix_tok: str = "<fim_prefix>"
    fim_middle_tok: str = "<fim_middle>"
    fim_suffix_tok: str = "<fim_suffix>"
    seed: int = 0
    """Which transforms documents get; the same seed gives the same transform to the same text."""
    use_ftfy: bool = False
    """Cerebras (FIM mode): repair the text with ftfy before it is cut and tokenized."""
    ftfy_normalizer: str | None = "NFC"
    """Cerebras: the Unicode normal form ftfy leaves the text in (NFC, NFKC, NFD, NFKD; None: none). Only with ``use_ftfy``."""
    wikitext_detokenize: bool = False
    """Cerebras: undo wikitext-103's tokenization, after ftfy."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ftfy_normalizer", normal_form(self.ftfy_normalizer, "format fim: ftfy_normalizer"))
        for name in ("fim_rate", "spm_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"format fim: {name} must be a probability in [0, 1], got {value}")

    def plain_text_record(self, text: str) -> dict[str, Any]:
        return {self.text_key: text}

    def identity(self) -> dict[str, Any]:
        """The base identity with the text repairs only when they are on, so FIM caches made before keep theirs."""
        return without_unused_repairs(super().identity(), self.use_ftfy, self.wikitext_detokenize)

    def bind(self, context: FormatContext) -> RecordRenderer:
        ids = {}
        for option in ("fim_prefix_tok", "fim_middle_tok", "fim_suffix_tok"):
            token = getattr(self, option)
            ids[option] = context.token_to_id(token)
            if ids[option] is None:
                raise ValueError(
                    f"format fim: the tokenizer has no token {token!r} ({option}); set {option} to the sentinel token "
                    "your tokenizer uses for that part"
                )
        prefix_id, middle_id, suffix_id = ids["fim_prefix_tok"], ids["fim_middle_tok"], ids["fim_suffix_tok"]
        read = TextLmDatasetFormat(self.text_key, use_ftfy=self.use_ftfy, ftfy_normalizer=self.ftfy_normalizer,
                                   wikitext_detokenize=self.wikitext_detokenize).text_reader()

        def render(record: dict[str, Any]) -> Rendered:
            text, size = read(record)
            transform = self.draw(text)
            if transform is None:
                return Rendered([text], None, None, *size)
            spm, lo, hi = transform
            prefix, middle, suffix = text[:lo], text[lo:hi], text[hi:]
            if spm:
                return Rendered([[prefix_id, suffix_id], suffix, [middle_id], prefix, middle], None, None, *size)
            return Rendered([[prefix_id], prefix, [suffix_id], suffix, [middle_id], middle], None, None, *size)

        return render

    def draw(self, text: str) -> tuple[bool, int, int] | None:
        """The transform a document gets: None (plain text), or (SPM?, first cut, second cut) in characters."""
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32, key=self.seed.to_bytes(16, "little", signed=True))
        fim, spm, a, b = struct.unpack("<4Q", digest.digest())
        if fim >= int(self.fim_rate * _ONE):
            return None
        cut_a, cut_b = a % (len(text) + 1), b % (len(text) + 1)
        return spm < int(self.spm_rate * _ONE), min(cut_a, cut_b), max(cut_a, cut_b)
