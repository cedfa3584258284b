"""The heuristic filters of a text's links (``http(s)://`` URLs, NeMo's ``URL_PATTERN``): the share of characters
inside them (from the batch's profile counts, ``analyses.profile``), and whether one points at pornography."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import as_utf8
from tokenmix.curate.heuristics.character_classes import URL_PATTERN
from tokenmix.curate.heuristics.scores import check_share, ratio


@DocumentFilter.register_subclass("urls")
@dataclass(frozen=True)
class UrlsFilter(DocumentFilter):
    """Share of characters inside ``http(s)://`` URLs: link farms and navigation pages."""

    max_url_to_text_ratio: float = 0.2
    """Highest share a kept document has."""

    def __post_init__(self) -> None:
        check_share("max_url_to_text_ratio", self.max_url_to_text_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        return ratio(texts, "url_chars", "chars", 1.0)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_url_to_text_ratio)


@DocumentFilter.register_subclass("pornographic_urls")
@dataclass(frozen=True)
class PornographicUrlsFilter(DocumentFilter):
    """1 if a URL in the text contains "porn", else 0: a cheap adult-content signal."""

    def score(self, texts: pa.Array) -> pa.Array:
        # NeMo looks for "porn" in each URL match; a URL run that reaches "porn" after http(s):// is the same thing
        found = pc.match_substring_regex(as_utf8(texts), URL_PATTERN.removesuffix("+") + "*porn")
        return found.cast(pa.int64())

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, 0)
