"""The boilerplate filter (after C4): the share of a text's ``\\n\\n``-separated paragraphs that hold a cookie or
policy notice, found with Arrow's string kernels (RE2) over the few texts that can hold one (``scan.mention_flags``:
a pass of the compiled scan)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.filters import DocumentFilter, bounds_keep
from tokenmix.curate.heuristics.analyses import as_utf8, bytes_of
from tokenmix.curate.heuristics.scan import mention_flags
from tokenmix.curate.heuristics.scores import check_share, finish

POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "privacy overview",
    "use of cookies",
    "use cookies",
    "privacy & cookies policy",
    "privacy and cookies policy",
    "this website uses cookies to improve your experience while you navigate through the website. out of these cookies, the cookies "
    "that are categorized as necessary are stored on your browser as they are essential for the working of basic functionalities of "
    "the website. we also use third-party cookies that help us analyze and understand how you use this website. these cookies will be "
    "stored in your browser only with your consent. you also have the option to opt-out of these cookies. but opting out of some of "
    "these cookies may have an effect on your browsing experience.",
    "necessary cookies are absolutely essential for the website to function properly. this category only includes cookies that "
    "ensures basic functionalities and security features of the website. these cookies do not store any personal information.",
    "any cookies that may not be particularly necessary for the website to function and is used specifically to collect user personal "
    "data via analytics, ads, other embedded contents are termed as non-necessary cookies. it is mandatory to procure user consent prior "
    "to running these cookies on your website.",
    "this site uses cookies, including for analytics, personalization, and advertising purposes. for more information or to change "
    "your cookie settings, click here.",
    "if you continue to browse this site without changing your cookie settings, you agree to this use. acceptread more",
)
"""NeMo's boilerplate strings (after C4), lowercase: a paragraph that contains one (lowercased) is boilerplate."""

CANDIDATE_WORDS = ("cookie", "privacy", "terms of use", "lorem ipsum")
"""What every text whose lowercase holds one of ``POLICY_SUBSTRINGS`` or "lorem ipsum" holds: one of these words, its
ASCII letters in either case, unless its ``k`` is a Kelvin sign (``KELVIN``), the one other character that lowercases
to one of their letters; ``İ`` lowercases to ``i`` and a combining dot, and no ``i`` here ends a word."""
KELVIN = "\u212a"
"""The Kelvin sign, which lowercases to ``k``: a text that holds one is a candidate too."""


def _literal(text: str) -> str:
    """``text`` as an RE2 pattern that matches it literally."""
    return rf"\Q{text}\E"


def _matching(texts: pa.Array, *patterns: str) -> np.ndarray:
    """Indices of the texts that any of the ``patterns`` matches somewhere."""
    found = np.zeros(len(texts), dtype=bool)
    for pattern in patterns:
        found |= np.asarray(pc.fill_null(pc.match_substring_regex(texts, pattern), False), dtype=bool)
    return np.flatnonzero(found)


@DocumentFilter.register_subclass("boilerplate_string")
@dataclass(frozen=True)
class BoilerPlateStringFilter(DocumentFilter):
    """Share of paragraphs that hold a cookie or policy notice (1.0 with "lorem ipsum" anywhere): pages that are
    mostly site furniture (after C4)."""

    max_boilerplate_string_ratio: float = 0.4
    """Highest share a kept document has."""
    remove_if_at_top_or_bottom: bool = True
    """Count boilerplate paragraphs at the top or bottom too (NeMo takes this setting but always counts them); false:
    a leading or trailing run of them (a banner, a footer) does not count, unless every paragraph is boilerplate."""

    def __post_init__(self) -> None:
        check_share("max_boilerplate_string_ratio", self.max_boilerplate_string_ratio)

    def score(self, texts: pa.Array) -> pa.Array:
        texts = as_utf8(texts)
        policy = "|".join(map(_literal, POLICY_SUBSTRINGS))
        scores = np.zeros(len(texts), dtype=np.float64)
        chosen = np.flatnonzero(mention_flags(*bytes_of(texts), CANDIDATE_WORDS, (KELVIN,)))
        if len(chosen):
            # str.lower() turns İ into i and a combining dot where Arrow's has a plain i: one match fewer, never more
            lowered = pc.utf8_lower(pc.replace_substring(texts.take(pa.array(chosen)), "\u0130", "i\u0307"))
            holding = _matching(lowered, f"lorem ipsum|{policy}")  # only these have a paragraph to count
            chosen, lowered = chosen[holding], lowered.take(pa.array(holding))
        if len(chosen):
            paragraphs = pc.split_pattern(lowered, "\n\n")
            boiler = np.asarray(pc.match_substring_regex(pc.list_flatten(paragraphs), policy), dtype=bool)
            offsets = np.asarray(paragraphs.offsets, dtype=np.int64)
            if self.remove_if_at_top_or_bottom:
                counts = np.add.reduceat(boiler, offsets[:-1], dtype=np.int64)
            else:
                counts = np.array([_inner_count(boiler[s:e]) for s, e in zip(offsets[:-1], offsets[1:])], dtype=np.int64)
            lorem = np.asarray(pc.match_substring(lowered, "lorem ipsum"), dtype=bool)
            scores[chosen] = np.where(lorem, 1.0, counts / np.diff(offsets))
        return finish(scores, texts)

    def keep(self, scores: pa.Array) -> np.ndarray:
        return bounds_keep(scores, None, self.max_boilerplate_string_ratio)


def _inner_count(flags: np.ndarray) -> int:
    """Flagged paragraphs, leaving out a leading and a trailing run of them unless all are flagged."""
    if flags.all():
        return len(flags)
    first = int(np.argmin(flags))
    last = len(flags) - int(np.argmin(flags[::-1]))
    return int(np.count_nonzero(flags[first:last]))
