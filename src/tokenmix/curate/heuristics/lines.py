"""The heuristic filters of a text's lines (``\\n``-separated pieces that are not blank): what share start with a
bullet, end without an end mark, or end with an ellipsis (C4). Each share is a ratio of the batch's profile counts
(``analyses.profile``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.scores import check_share, ratio


@DocumentFilter.register_subclass("bullets")
@dataclass(frozen=True)
class BulletsFilter(DocumentFilter):
    """Share of non-blank lines that start with a bullet character: menus and link lists (Gopher)."""

    max_bullet_lines_ratio: float = 0.9
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_bullet_lines_ratio", self.max_bullet_lines_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "bullet_lines", "lines", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_bullet_lines_ratio)


@DocumentFilter.register_subclass("punctuation")
@dataclass(frozen=True)
class PunctuationFilter(DocumentFilter):
    """Share of non-blank lines that do not end in ``. ? ! " '`` (1.0 without lines): menus, titles and fragments (C4)."""

    max_num_sentences_without_endmark_ratio: float = 0.85
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_num_sentences_without_endmark_ratio", self.max_num_sentences_without_endmark_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "lines_without_end_mark", "lines", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_num_sentences_without_endmark_ratio)


@DocumentFilter.register_subclass("ellipsis")
@dataclass(frozen=True)
class EllipsisFilter(DocumentFilter):
    """Share of non-blank lines that end in an ellipsis mark ("...", "…", "read more", ...; 1.0 without lines):
    teaser and snippet pages (C4)."""

    max_num_lines_ending_with_ellipsis_ratio: float = 0.3
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_num_lines_ending_with_ellipsis_ratio", self.max_num_lines_ending_with_ellipsis_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "ellipsis_lines", "lines", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_num_lines_ending_with_ellipsis_ratio)
