"""Document modifiers: each text of a batch rewritten (NeMo Curator's ``DocumentModifier``), as draccus choices.

A modifier is chosen in YAML with ``modifier: {type: unicode_fix}``; the ``modify`` stage in ``stages.py`` applies
it to a field. ``modify`` takes an Arrow array of texts and returns one as long, null where the text was null, so
that the modifiers written with ``pyarrow.compute`` (normalizing Unicode or whitespace) run vectorized; ftfy, the
wikitext detokenizer and user functions go text by text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import draccus
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.filters import resolve_function
from tokenmix.formats.text_fixes import NORMALIZATIONS, fix_unicode, wikitext_detokenize


@dataclass(frozen=True)
class DocumentModifier(draccus.ChoiceRegistry):
    """A rewrite of each document's text; chosen in YAML with ``modifier: {type: ...}``."""

    def modify(self, texts: pa.Array) -> pa.Array:
        """The rewritten texts, as many as given and of the same type (null texts stay null)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The modifier's registered name (``unicode_fix``), for logs and stage descriptions."""
        return type(self).get_choice_name(type(self))


def _check_normalization(value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"modifier.normalization must be one of {', '.join(allowed)}, got {value!r}")


def _per_text(texts: pa.Array, rewrite: Callable[[str], str]) -> pa.Array:
    """``rewrite`` applied to each non-null text, as an array of the input's type."""
    return pa.array([None if text is None else rewrite(text) for text in texts.to_pylist()], type=texts.type)


@DocumentModifier.register_subclass("unicode_fix")
@dataclass(frozen=True)
class UnicodeFix(DocumentModifier):
    """Repairs mojibake, HTML entities, control characters and the like with ftfy's ``fix_text`` (its default
    fixes, as Cerebras' preprocessing uses them), then normalizes Unicode: text scraped in mixed encodings becomes
    one consistent form."""

    normalization: Literal["NFC", "NFKC", "NFD", "NFKD", "none"] = "NFC"
    """Unicode normal form of the result; ftfy normalizes with it between its fixes too. ``none``: leave as fixed."""

    def __post_init__(self) -> None:
        _check_normalization(self.normalization, (*NORMALIZATIONS, "none"))

    def modify(self, texts: pa.Array) -> pa.Array:
        return _per_text(texts, functools.partial(fix_unicode, normalization=None if self.normalization == "none" else self.normalization))


@DocumentModifier.register_subclass("unicode_normalize")
@dataclass(frozen=True)
class UnicodeNormalize(DocumentModifier):
    """Brings the text to one Unicode normal form, so that the same characters are the same code points (and,
    for the compatibility forms, look-alike variants the same letters)."""

    normalization: Literal["NFC", "NFKC", "NFD", "NFKD"] = "NFC"
    """The normal form."""

    def __post_init__(self) -> None:
        _check_normalization(self.normalization, NORMALIZATIONS)

    def modify(self, texts: pa.Array) -> pa.Array:
        return pc.utf8_normalize(texts, self.normalization)


@DocumentModifier.register_subclass("wikitext_detokenize")
@dataclass(frozen=True)
class WikitextDetokenize(DocumentModifier):
    """Undoes wikitext-103's tokenization (``1 @,@ 000`` -> ``1,000``, ``word , word`` -> ``word, word``, ``= = Heading
    = =`` -> ``== Heading ==``), so that the text reads like the prose a model will meet."""

    def modify(self, texts: pa.Array) -> pa.Array:
        return _per_text(texts, wikitext_detokenize)


@DocumentModifier.register_subclass("whitespace")
@dataclass(frozen=True)
class WhitespaceNormalize(DocumentModifier):
    """Tidies whitespace: line breaks become ``\\n``; a run of spaces and tabs between two characters of a line
    becomes one space (indentation stays); spaces and tabs at line ends go; no more than ``max_blank_lines`` blank
    lines in a row; no whitespace at either end. Layout noise from scraping stops costing tokens."""

    max_blank_lines: int = 1
    """Most consecutive blank lines kept (0: none, paragraphs then run together line after line)."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_blank_lines <= 998:
            raise ValueError(f"modifier.max_blank_lines must be between 0 and 998, got {self.max_blank_lines}")

    def modify(self, texts: pa.Array) -> pa.Array:
        texts = pc.replace_substring_regex(texts, r"\r\n?", "\n")
        texts = pc.replace_substring_regex(texts, r"[ \t]+\n", "\n")
        texts = pc.replace_substring_regex(texts, r"([^ \t\n])[ \t]+", r"\1 ")
        texts = pc.replace_substring_regex(texts, rf"\n{{{self.max_blank_lines + 2},}}", "\n" * (self.max_blank_lines + 1))
        return pc.utf8_trim_whitespace(texts)


@DocumentModifier.register_subclass("function")
@dataclass(frozen=True)
class FunctionModifier(DocumentModifier):
    """A user function by import path (``package.module:clean``) that takes one text and returns its new text."""

    function: str = ""
    """``package.module:function`` taking a text (str) and returning a str."""

    def __post_init__(self) -> None:
        if not self.function:
            raise ValueError("modifier.function: give the function as 'package.module:function'")
        resolve_function(self.function, "modifier.function")

    def modify(self, texts: pa.Array) -> pa.Array:
        function = resolve_function(self.function, "modifier.function")

        def rewrite(text: str) -> str:
            result = function(text)
            if not isinstance(result, str):
                raise TypeError(f"modifier.function: {self.function} returned {type(result).__name__}, not str")
            return result

        return _per_text(texts, rewrite)
