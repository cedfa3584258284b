"""Text repairs applied to a document before it is tokenized: ftfy's fixes with Unicode normalization, and undoing
wikitext-103's tokenization (Cerebras' ``use_ftfy``, ``ftfy_normalizer`` and ``wikitext_detokenize``).

Plain functions from a text to a text, so that the formats (in the tokenizing workers) and the curation stage's
modifiers (``curate/modifiers.py``, over Arrow arrays) rewrite a text the same way.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

NORMALIZATIONS = ("NFC", "NFKC", "NFD", "NFKD")
"""The Unicode normal forms, as ``unicodedata`` and ftfy name them."""


def fix_unicode(text: str, normalization: str | None = "NFC") -> str:
    """Repairs mojibake, HTML entities, control characters and the like with ftfy's ``fix_text`` (its default fixes,
    as Cerebras' preprocessing uses them), then brings the whole text to the normal form ``normalization`` (None:
    leave it as fixed). ftfy normalizes line by line, and a long line in pieces, so the whole text is normalized once
    more to join them."""
    import ftfy

    fixed = ftfy.fix_text(text, ftfy.TextFixerConfig(normalization=normalization, explain=False))
    return fixed if normalization is None else unicodedata.normalize(normalization, fixed)


_WIKITEXT_REPLACEMENTS = (
    ("s '", "s'"),
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),
    (" : ", ": "),
    (" ; ", "; "),
    (" . ", ". "),
    (" ! ", "! "),
    (" ? ", "? "),
    (" , ", ", "),
)
"""Number separators and punctuation, replaced first."""
_WIKITEXT_BRACKETS = (
    (re.compile(r"\(\s*([^\)]*?)\s*\)"), r"(\1)"),
    (re.compile(r"\[\s*([^\]]*?)\s*\]"), r"[\1]"),
    (re.compile(r"{\s*([^}]*?)\s*}"), r"{\1}"),
    (re.compile(r'"\s*([^"]*?)\s*"'), r'"\1"'),
    (re.compile(r"'\s*([^']*?)\s*'"), r"'\1'"),
)
"""Spaces inside brackets and quotes go: ``( a b )`` -> ``(a b)``."""
_WIKITEXT_AFTER = (
    ("= = = =", "===="),
    ("= = =", "==="),
    ("= =", "=="),
    (" \u00b0 ", "\u00b0"),
    (" \n", "\n"),
    ("\n ", "\n"),
    (" N ", " 1 "),
    (" 's", "'s"),
)
"""Headings, degrees, line ends and contractions, replaced last."""


def wikitext_detokenize(text: str) -> str:
    """One text of wikitext-103's tokenized form back to ordinary spacing, step by step as Megatron-LM's
    ``wikitext_detokenizer`` does (number separators, punctuation, brackets and quotes, headings, contractions).
    Its one other step, ``re.sub(r"/' [0-9]/", r"/'[0-9]/", ...)``, would write a regex into the text where a
    literal ``/' 5/`` occurs, and is left out."""
    for old, new in _WIKITEXT_REPLACEMENTS:
        text = text.replace(old, new)
    for pattern, replacement in _WIKITEXT_BRACKETS:
        text = pattern.sub(replacement, text)
    for old, new in _WIKITEXT_AFTER:
        text = text.replace(old, new)
    return text


def normal_form(value: str | None, where: str) -> str | None:
    """Cerebras' ``ftfy_normalizer`` as a normal form: one of ``NORMALIZATIONS``, or None for none (YAML's ``None`` is
    the string ``"None"``). ``ValueError`` naming ``where`` (the option) otherwise."""
    if value is None or value in ("None", "none"):
        return None
    if value not in NORMALIZATIONS:
        raise ValueError(f"{where} must be one of {', '.join(NORMALIZATIONS)} or None (no normalization), got {value!r}")
    return value


def text_fixer(use_ftfy: bool, ftfy_normalizer: str | None, wikitext: bool) -> Callable[[str], str] | None:
    """The repairs a format's options ask for, as one function from a text to a text, in Cerebras' order (ftfy, then
    the wikitext detokenizer); None when they ask for none. ``ftfy_normalizer`` counts only with ``use_ftfy``."""
    if not use_ftfy and not wikitext:
        return None

    def fix(text: str) -> str:
        if use_ftfy:
            text = fix_unicode(text, ftfy_normalizer)
        if wikitext:
            text = wikitext_detokenize(text)
        return text

    return fix


REPAIR_OPTIONS = ("use_ftfy", "ftfy_normalizer", "wikitext_detokenize")
"""The repair options a format (``text``, ``supervised``, ``fim``) takes, under Cerebras' names."""


def without_unused_repairs(identity: dict[str, Any], use_ftfy: bool, wikitext: bool) -> dict[str, Any]:
    """A format's identity without the repair options that are off (``ftfy_normalizer`` counts only with ``use_ftfy``),
    so that caches made before the options existed keep their identity."""
    unused = {"use_ftfy": not use_ftfy, "ftfy_normalizer": not use_ftfy, "wikitext_detokenize": not wikitext}
    return {k: v for k, v in identity.items() if not unused.get(k, False)}
