"""Dataset formats (``format.type`` in YAML) and the plain-text format.

A format says how a record becomes a document. ``text`` reads one field; other formats
(supervised, chat, fill-in-the-middle) register themselves on ``LmDatasetFormatBase`` the same way.
Field and class names follow Levanter so that Levanter data configs parse unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any

import draccus


class BadRecordError(ValueError):
    """A record that cannot become a document; ``reason`` is the counter it is skipped under."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class LmDatasetFormatBase(abc.ABC, draccus.ChoiceRegistry):
    """How records of a source become documents; chosen in YAML with ``format: {type: ...}``."""

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "text"

    @abc.abstractmethod
    def extract_text(self, record: dict[str, Any]) -> str:
        """The document text of a record, or ``BadRecordError`` naming why there is none."""

    def identity(self) -> dict[str, Any]:
        """What goes into the cache fingerprint: the format's name and every option."""
        return {"type": self.get_choice_name(type(self)), **dataclasses.asdict(self)}


@LmDatasetFormatBase.register_subclass("text")
@dataclass(frozen=True)
class TextLmDatasetFormat(LmDatasetFormatBase):
    """Plain text in one field. A list of strings is joined with blank lines."""

    text_key: str = "text"

    def extract_text(self, record: dict[str, Any]) -> str:
        try:
            text = record[self.text_key]
        except KeyError:
            keys = ", ".join(sorted(map(str, record))[:8])
            raise BadRecordError("missing_field", f"no {self.text_key!r} field (fields: {keys}); set format.text_key") from None
        if isinstance(text, list):
            if not all(isinstance(part, str) for part in text):
                raise BadRecordError("wrong_type", f"{self.text_key!r} is a list with non-string items")
            text = "\n\n".join(text)
        elif not isinstance(text, str):
            raise BadRecordError("wrong_type", f"{self.text_key!r} is {type(text).__name__}, not a string")
        if not text or text.isspace():
            raise BadRecordError("empty_document", f"{self.text_key!r} is empty or only whitespace")
        return text
