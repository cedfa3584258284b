"""The substring filter: whether a text holds a marker (a prefix, a tag, a phrase) at its start, its end or anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import as_utf8


@DocumentFilter.register_subclass("substring")
@dataclass(frozen=True)
class SubstringFilter(DocumentFilter):
    """1 if the text has ``substring`` at ``position``, else 0: keeps documents that carry a marker (a prefix, a tag)."""

    substring: str = ""
    """The text to look for."""
    position: Literal["prefix", "suffix", "any"] = "any"
    """Where: at the start, at the end, or anywhere."""

    def __post_init__(self) -> None:
        if not self.substring:
            raise ValueError("filter.substring: give the text to look for")
        if self.position not in ("prefix", "suffix", "any"):
            raise ValueError(f"filter.position must be one of prefix, suffix, any, got {self.position!r}")

    def score(self, texts: pa.Array) -> pa.Array:
        texts = as_utf8(texts)
        if self.position == "prefix":
            found = pc.starts_with(texts, self.substring)
        elif self.position == "suffix":
            found = pc.ends_with(texts, self.substring)
        else:
            found = pc.match_substring(texts, self.substring)
        return found.cast(pa.int64())

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, 1, None)
