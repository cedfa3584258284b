"""``text``: plain text in one field of each record (Levanter's ``TextLmDatasetFormat``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, Pack, RecordRenderer, Rendered, record_field, text_size


@LmDatasetFormatBase.register_subclass("text")
@dataclass(frozen=True)
class TextLmDatasetFormat(LmDatasetFormatBase):
    """Plain text in one field of each record (a list of strings is joined with blank lines)."""

    text_key: str = "text"
    pack: Pack = None
    """Newer Levanter: pack whole documents into examples (true, or at most this many a example; ``pad``: one a example)
    instead of cutting the token stream into windows (unset or false)."""

    dataset_options = ("pack",)

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

    def bind(self, context: FormatContext) -> RecordRenderer:
        def render(record: dict[str, Any]) -> Rendered:
            text = self.extract_text(record)
            return Rendered([text], None, None, *text_size(text))

        return render
