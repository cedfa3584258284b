"""``text``: plain text in one field of each record (Levanter's ``TextLmDatasetFormat``), with Cerebras' ``LMData``
options: text repairs before tokenizing (``use_ftfy``, ``ftfy_normalizer``, ``wikitext_detokenize``) and a shortest
document kept (``min_sequence_len``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, Pack, RecordRenderer, Rendered, record_field, text_size
from tokenmix.formats.text_fixes import normal_form, text_fixer, without_unused_repairs


@LmDatasetFormatBase.register_subclass("text")
@dataclass(frozen=True)
class TextLmDatasetFormat(LmDatasetFormatBase):
    """Plain text in one field of each record (a list of strings is joined with blank lines)."""

    text_key: str = "text"
    pack: Pack = None
    """Newer Levanter: pack whole documents into examples (true, or at most this many a example; ``pad``: one a example)
    instead of cutting the token stream into windows (unset or false)."""
    use_ftfy: bool = False
    """Cerebras: repair the text with ftfy (mojibake, HTML entities, control characters) before tokenizing."""
    ftfy_normalizer: str | None = "NFC"
    """Cerebras: the Unicode normal form ftfy leaves the text in (NFC, NFKC, NFD, NFKD; None: none). Only with ``use_ftfy``."""
    wikitext_detokenize: bool = False
    """Cerebras: undo wikitext-103's tokenization (``1 @,@ 000`` -> ``1,000``, ``word , word`` -> ``word, word``), after ftfy."""
    min_sequence_len: int | None = None
    """Cerebras: skip (and count as ``too_short``) documents of fewer tokens than this, BOS and EOS included. Unset keeps
    every document (Cerebras' own default is 10)."""

    dataset_options = ("pack",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ftfy_normalizer", normal_form(self.ftfy_normalizer, "format text: ftfy_normalizer"))
        if self.min_sequence_len is not None and self.min_sequence_len < 1:
            raise ValueError(f"format text: min_sequence_len must be a positive number of tokens, got {self.min_sequence_len}")

    def extract_text(self, record: dict[str, Any]) -> str:
        """The document text of a record, or ``BadRecordError`` naming why there is none."""
        text = record_field(record, self.text_key, "text_key")
        if isinstance(text, list):
            if not all(isinstance(part, str) for part in text):
                raise BadRecordError("wrong_type", f"{self.text_key!r} is a list with non-string items")
            text = "\n\n".join(text)
        elif not isinstance(text, str):
            raise BadRecordError("wrong_type", f"{self.text_key!r} is {type(text).__name__}, not a string")
        if not text or text.isspace():
            raise BadRecordError("empty_document", f"{self.text_key!r} is empty or only whitespace")
        return text

    def plain_text_record(self, text: str) -> dict[str, Any]:
        return {self.text_key: text}

    def length_limits(self) -> tuple[int | None, int | None]:
        return self.min_sequence_len, None

    def identity(self) -> dict[str, Any]:
        """The base identity with the Cerebras options only where they change the tokens (a repair that is on, a
        ``min_sequence_len`` that is set), so text caches made before the options existed keep theirs."""
        identity = without_unused_repairs(super().identity(), self.use_ftfy, self.wikitext_detokenize)
        if self.min_sequence_len is None:
            del identity["min_sequence_len"]
        return identity

    def bind(self, context: FormatContext) -> RecordRenderer:
        read = self.text_reader()

        def render(record: dict[str, Any]) -> Rendered:
            text, size = read(record)
            return Rendered([text], None, None, *size)

        return render

    def text_reader(self) -> Callable[[dict[str, Any]], tuple[str, tuple[int, int]]]:
        """A record's text, repaired as ``use_ftfy`` and ``wikitext_detokenize`` say, with the size (``text_size``) of the
        text as read; ``BadRecordError`` where there is none, or nothing but whitespace is left once repaired."""
        fix = text_fixer(self.use_ftfy, self.ftfy_normalizer, self.wikitext_detokenize)

        def read(record: dict[str, Any]) -> tuple[str, tuple[int, int]]:
            text = self.extract_text(record)
            size = text_size(text)
            if fix is not None:
                text = fix(text)
                if not text or text.isspace():
                    raise BadRecordError("empty_document", f"{self.text_key!r} is only whitespace once use_ftfy/wikitext_detokenize repaired it")
            return text, size

        return read
