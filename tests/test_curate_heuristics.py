"""NeMo Curator's heuristic filters and the text modifiers: scores and rewrites of tiny texts against values worked
out by hand, the keep rule at and just past each threshold, null texts, configs through draccus, bad thresholds,
and every filter over real documents."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import draccus
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmix.curate import (
    BoilerPlateStringFilter,
    BulletsFilter,
    CharLengthFilter,
    CommonEnglishWordsFilter,
    DocumentFilter,
    EllipsisFilter,
    LongWordFilter,
    MeanWordLengthFilter,
    NonAlphaNumericFilter,
    NumbersFilter,
    ParenthesesFilter,
    PornographicUrlsFilter,
    PunctuationFilter,
    RepeatedLinesByCharFilter,
    RepeatedLinesFilter,
    RepeatedParagraphsByCharFilter,
    RepeatedParagraphsFilter,
    RepeatingDuplicateNGramsFilter,
    RepeatingTopNGramsFilter,
    SubstringFilter,
    SymbolsToWordsFilter,
    UrlsFilter,
    WhiteSpaceFilter,
    WordCountFilter,
    WordsWithoutAlphabetsFilter,
)
from tokenmix.curate.heuristics import analyses, plain_scan, scan
from tokenmix.curate.heuristics import character_classes as chars
from tokenmix.curate.modifiers import (
    DocumentModifier,
    FunctionModifier,
    UnicodeFix,
    UnicodeNormalize,
    WhitespaceNormalize,
    WikitextDetokenize,
)
from tokenmix.curate.records import as_array
from tokenmix.curate.stages import ScoreFilter, ShardContext

REPO = Path(__file__).resolve().parents[1]

FILTER_NAMES = {
    "word_count", "char_length", "mean_word_length", "non_alpha_numeric", "symbols_to_words", "numbers", "urls", "bullets",
    "white_space", "parentheses", "long_word", "boilerplate_string", "repeated_lines", "repeated_paragraphs",
    "repeated_lines_by_char", "repeated_paragraphs_by_char", "repeating_top_ngrams", "repeating_duplicate_ngrams",
    "punctuation", "ellipsis", "common_english_words", "words_without_alphabets", "pornographic_urls", "substring",
}


def every_filter() -> list[DocumentFilter]:
    choices = DocumentFilter.get_known_choices()
    return [cls(substring="the") if cls is SubstringFilter else cls() for name, cls in choices.items() if name != "function"]


def scores(f: DocumentFilter, texts: list[str | None], string_type: pa.DataType | None = None) -> list:
    return f.score(pa.array(texts, string_type or pa.large_string())).to_pylist()


# (filter, texts, scores worked out by hand)
CASES = [
    (WordCountFilter(), ["one two  three\nfour", "", " \t\n", "a\u00a0b\u3000c"], [4, 0, 0, 3]),
    (CharLengthFilter(), ["h\u00e9llo", "", "\u65e5\u672c"], [5, 0, 2]),
    # (2 + 4) / 2; no words; (1 + 2 + 3 + 4) / 4
    (MeanWordLengthFilter(), ["ab abcd", "   ", "a bb ccc dddd"], [3.0, 0.0, 2.5]),
    # "ab, c!\n": of 7 characters only the space is outside [a-zA-Z0-9\n?!,.]; "é" is not ASCII
    (NonAlphaNumericFilter(), ["ab, c!\n", "@@ab", "\u00e91", ""], [1 / 7, 0.5, 0.5, 1.0]),
    # "#" (1 run / 1 char) and "..." of 4 words; "#a#" (2 runs / 3 chars) of 4, "##x" and "##" are not over half;
    # three marks of 6 words; "read more" is two words; no words at all
    (SymbolsToWordsFilter(), ["# a b ...", "##x ## #a# z", "x \u2026 y [...] -\u00bb z", "read more", "   "], [0.5, 0.25, 0.5, 0.0, 1.0]),
    # only ASCII digits count (NeMo's [[:digit:]]), not "٣"
    (NumbersFilter(), ["a1b2", "\u0663x", "", "12345abcde"], [0.5, 0.0, 1.0, 0.5]),
    # "http://a.b/c" is 12 of 18 characters; a URL stops at "é"
    (UrlsFilter(), ["see http://a.b/c d", "https://x.org", "no links", "", "http://a.com/\u00e9"], [2 / 3, 1.0, 0.0, 1.0, 13 / 14]),
    # non-blank lines "• one", "  ● two", "three"; "-" and "*" are not bullets; no lines; a bullet not first
    (BulletsFilter(), ["\u2022 one\n  \u25cf two\nthree\n\n", "- dash\n* star", "", "\n  \n", "x \u2022"], [2 / 3, 0.0, 1.0, 1.0, 0.0]),
    # space, tab, newline, carriage return of 8 characters; a no-break space is not in NeMo's list; backspace is
    (WhiteSpaceFilter(), ["a b\tc\nd\r", "a\u00a0b", "", "a\b"], [0.5, 0.0, 1.0, 0.5]),
    (ParenthesesFilter(), ["(a)[b]{c}\u27e8d\u27e9", "f(x) = y", ""], [8 / 12, 0.25, 1.0]),
    (LongWordFilter(), ["a bb ccc", "", "\u65e5\u672c\u8a9e ab", "x" * 1001], [3, 0, 3, 1001]),
    # one boilerplate paragraph of three; lorem ipsum anywhere; none; an empty paragraph between "\n\n"s counts;
    # "İ" lowercases to "i" and a combining dot, so "prİvacy" is not "privacy" (str.lower, as NeMo); the Kelvin sign
    # lowercases to "k"; a cookie that is no policy
    (
        BoilerPlateStringFilter(),
        [
            "Hello.\n\nRead our Privacy Policy.\n\nBye.",
            "Lorem Ipsum dolor\n\nfine",
            "nothing here",
            "a\n\n\n\nb",
            "PRIVACY POLICY",
            "pr\u0130vacy policy",
            "use of coo\u212aies\n\nok",
            "a cookie jar",
        ],
        [1 / 3, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.0],
    ),
    # lines "a", "b", "a", " c" (not stripped): 3 distinct of 4
    (RepeatedLinesFilter(), ["a\nb\na\n\n c", "", "x\nx"], [0.75, 0.0, 0.5]),
    (RepeatedParagraphsFilter(), ["a\n\nb\n\na", "", "x\n\nx\n\nx\n\nx"], [2 / 3, 1.0, 0.25]),
    # distinct "aaaa" and "b": 5 of 9 characters
    (RepeatedLinesByCharFilter(), ["aaaa\nb\naaaa", ""], [5 / 9, 0.0]),
    (RepeatedParagraphsByCharFilter(), ["aaaa\n\nb\n\naaaa", "\n\n", ""], [5 / 9, 0.0, 0.0]),
    # "a b" twice: 6 of 9 characters; all tied: the first, "x y", 3 of 7; one word; the n-gram is joined with one
    # space, so "a  b" does not hold it: 3 of 8
    (RepeatingTopNGramsFilter(), ["a b a b c", "x y z w", "one", "a  b a b"], [2 / 3, 3 / 7, 1.0, 3 / 8]),
    (RepeatingTopNGramsFilter(n=3), ["a b c a b c"], [10 / 11]),
    # the second "a b" covers "a b" (3 characters of 7); "a b c" again (5 of 11); overlapping repeats "a b a b" (7 of 11)
    (RepeatingDuplicateNGramsFilter(), ["a b a b", "a b c a b c", "a b a b a b", "x y", "one"], [3 / 7, 5 / 11, 7 / 11, 0.0, 1.0]),
    # lines "Hello.", "no end", "what?", "  quoted\"  ": one of four does not end in a mark
    (PunctuationFilter(), ['Hello.\nno end\nwhat?\n  quoted"  \n\n', ""], [0.25, 1.0]),
    # "wait...", "READ MORE", "more [...]", "…" of 5 lines; a mark inside a line does not count
    (EllipsisFilter(), ["wait...\nfine\nREAD MORE\nmore [...]\n\u2026", "", "a... b"], [0.8, 1.0, 0.0]),
    # "and", "the" (not "The"); counting stops at 2; "the," is not "the"
    (CommonEnglishWordsFilter(), ["The cat and the dog", "the the the the", "nothing here", "the, of."], [2, 2, 0, 0]),
    (CommonEnglishWordsFilter(stop_at_false=False), ["the of and to be that have with THE", "the the the the"], [8, 4]),
    # "abc", "x9" have letters, "123", "--" not; a CJK word, a roman numeral and a circled letter do, Arabic digits not
    (WordsWithoutAlphabetsFilter(), ["abc 123 x9 --", "\u65e5\u672c \u0661\u0662 \u216b \u24d0", ""], [0.5, 0.75, 0.0]),
    (PornographicUrlsFilter(), ["visit https://example.com/porn-site", "porn star", "http://a.com and porn", ""], [1, 0, 0, 0]),
    (SubstringFilter(substring="ab", position="prefix"), ["abc", "cab", "ab"], [1, 0, 1]),
    (SubstringFilter(substring="ab", position="suffix"), ["abc", "cab", "ab"], [0, 1, 1]),
    (SubstringFilter(substring="b", position="any"), ["abc", "xyz"], [1, 0]),
]


@pytest.mark.parametrize("f, texts, expected", CASES, ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)])
def test_scores_match_hand_computed_values(f, texts, expected):
    for string_type in (pa.string(), pa.large_string()):
        assert scores(f, texts, string_type) == pytest.approx(expected, rel=1e-12)
    # a slice of a longer array (offsets that do not start at 0) scores the same
    padded = pa.array(["pad one", *texts, "pad two"])
    assert f.score(padded.slice(1, len(texts))).to_pylist() == pytest.approx(expected, rel=1e-12)


# (filter, the last score kept, the first score past it)
THRESHOLDS = [
    (WordCountFilter(min_words=3, max_words=4), [3, 4], [2, 5]),
    (CharLengthFilter(min_chars=2, max_chars=5), [2, 5], [1, 6]),
    (MeanWordLengthFilter(), [3.0, 10.0], [2.99, 10.01]),
    (NonAlphaNumericFilter(), [0.25], [0.2501]),
    (SymbolsToWordsFilter(), [0.1], [0.1001]),
    (NumbersFilter(), [0.15], [0.1501]),
    (UrlsFilter(), [0.2], [0.2001]),
    (BulletsFilter(), [0.9], [0.9001]),
    (WhiteSpaceFilter(), [0.25], [0.2501]),
    (ParenthesesFilter(), [0.1], [0.1001]),
    (LongWordFilter(), [1000], [1001]),
    (BoilerPlateStringFilter(), [0.4], [0.4001]),
    (RepeatedLinesFilter(), [0.7], [0.6999]),
    (RepeatedParagraphsFilter(), [0.7], [0.6999]),
    (RepeatedLinesByCharFilter(), [0.8], [0.7999]),
    (RepeatedParagraphsByCharFilter(), [0.8], [0.7999]),
    (RepeatingTopNGramsFilter(), [0.2], [0.2001]),
    (RepeatingTopNGramsFilter(n=3, max_repeating_ngram_ratio=0.18), [0.18], [0.1801]),
    (RepeatingDuplicateNGramsFilter(), [0.2], [0.2001]),
    (PunctuationFilter(), [0.85], [0.8501]),
    (EllipsisFilter(), [0.3], [0.3001]),
    (CommonEnglishWordsFilter(), [2], [1]),
    (WordsWithoutAlphabetsFilter(), [0.8], [0.7999]),
    (PornographicUrlsFilter(), [0], [1]),
    (SubstringFilter(substring="x"), [1], [0]),
]


@pytest.mark.parametrize("f, kept, removed", THRESHOLDS, ids=[t[0].name for t in THRESHOLDS])
def test_keep_at_and_just_past_the_threshold(f, kept, removed):
    values = pa.array([*kept, *removed, None], type=pa.float64())
    assert f.keep(values).tolist() == [True] * len(kept) + [False] * len(removed) + [False]


@pytest.mark.parametrize("f", every_filter(), ids=lambda f: f.name)
def test_null_texts_score_null_and_are_not_kept(f):
    texts = [None, "The cat sat on the mat.\nIt was the best of times.", None]
    for string_type in (pa.string(), pa.large_string()):
        got = f.score(pa.array(texts, string_type))
        assert len(got) == 3 and got[0].as_py() is None and got[2].as_py() is None and got[1].as_py() is not None
        assert f.keep(got).tolist()[0::2] == [False, False]
    assert f.score(pa.array([None, None], pa.string())).to_pylist() == [None, None]
    assert f.score(pa.array([], pa.string())).to_pylist() == []


def test_every_heuristic_is_registered_under_its_name():
    assert FILTER_NAMES <= set(DocumentFilter.get_known_choices())
    assert {f.name for f in every_filter()} == FILTER_NAMES
    assert set(DocumentModifier.get_known_choices()) == {"unicode_fix", "unicode_normalize", "wikitext_detokenize", "whitespace", "function"}


MODIFIERS = [UnicodeFix("NFD"), UnicodeNormalize(), WikitextDetokenize(), WhitespaceNormalize(3), FunctionModifier("string:capwords")]


@pytest.mark.parametrize("f", [*every_filter(), *MODIFIERS], ids=lambda f: f.name)
def test_each_filter_and_modifier_round_trips_through_a_config_dict(f):
    base = DocumentModifier if isinstance(f, DocumentModifier) else DocumentFilter
    assert draccus.decode(base, {"type": f.name, **dataclasses.asdict(f)}) == f


def test_filters_and_modifiers_load_from_config_dicts():
    assert draccus.decode(DocumentFilter, {"type": "word_count", "min_words": 3}) == WordCountFilter(min_words=3)
    assert draccus.decode(DocumentFilter, {"type": "repeating_top_ngrams", "n": 3, "max_repeating_ngram_ratio": 0.18}) == RepeatingTopNGramsFilter(
        n=3, max_repeating_ngram_ratio=0.18
    )
    assert draccus.decode(DocumentFilter, {"type": "substring", "substring": "x", "position": "prefix"}) == SubstringFilter("x", "prefix")
    assert draccus.decode(DocumentFilter, {"type": "boilerplate_string", "remove_if_at_top_or_bottom": False}).remove_if_at_top_or_bottom is False
    assert draccus.decode(DocumentModifier, {"type": "unicode_fix", "normalization": "NFKC"}) == UnicodeFix("NFKC")
    assert draccus.decode(DocumentModifier, {"type": "whitespace", "max_blank_lines": 2}) == WhitespaceNormalize(2)
    with pytest.raises(Exception) as info:
        draccus.decode(DocumentFilter, {"type": "word_count", "min_words": -1})
    assert "filter.min_words must be >= 0, got -1" in str(info.value.__cause__)
    with pytest.raises(Exception, match="position"):
        draccus.decode(DocumentFilter, {"type": "substring", "substring": "x", "position": "middle"})


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: WordCountFilter(min_words=-1), "filter.min_words"),
        (lambda: WordCountFilter(min_words=10, max_words=5), "filter.max_words"),
        (lambda: CharLengthFilter(min_chars=-1), "filter.min_chars"),
        (lambda: CharLengthFilter(min_chars=5, max_chars=4), "filter.max_chars"),
        (lambda: MeanWordLengthFilter(min_mean_word_length=-1), "filter.min_mean_word_length"),
        (lambda: MeanWordLengthFilter(min_mean_word_length=5, max_mean_word_length=4), "filter.max_mean_word_length"),
        (lambda: NonAlphaNumericFilter(max_non_alpha_numeric_to_text_ratio=25), "filter.max_non_alpha_numeric_to_text_ratio"),
        (lambda: SymbolsToWordsFilter(max_symbol_to_word_ratio=-0.1), "filter.max_symbol_to_word_ratio"),
        (lambda: NumbersFilter(max_number_to_text_ratio=1.5), "filter.max_number_to_text_ratio"),
        (lambda: UrlsFilter(max_url_to_text_ratio=2), "filter.max_url_to_text_ratio"),
        (lambda: BulletsFilter(max_bullet_lines_ratio=-1), "filter.max_bullet_lines_ratio"),
        (lambda: WhiteSpaceFilter(max_white_space_ratio=1.1), "filter.max_white_space_ratio"),
        (lambda: ParenthesesFilter(max_parentheses_ratio=-0.5), "filter.max_parentheses_ratio"),
        (lambda: LongWordFilter(max_word_length=-1), "filter.max_word_length"),
        (lambda: BoilerPlateStringFilter(max_boilerplate_string_ratio=40), "filter.max_boilerplate_string_ratio"),
        (lambda: RepeatedLinesFilter(max_repeated_line_fraction=70), "filter.max_repeated_line_fraction"),
        (lambda: RepeatedParagraphsFilter(max_repeated_paragraphs_ratio=-1), "filter.max_repeated_paragraphs_ratio"),
        (lambda: RepeatedLinesByCharFilter(max_repeated_lines_char_ratio=2), "filter.max_repeated_lines_char_ratio"),
        (lambda: RepeatedParagraphsByCharFilter(max_repeated_paragraphs_char_ratio=2), "filter.max_repeated_paragraphs_char_ratio"),
        (lambda: RepeatingTopNGramsFilter(n=0), "filter.n"),
        (lambda: RepeatingTopNGramsFilter(max_repeating_ngram_ratio=3), "filter.max_repeating_ngram_ratio"),
        (lambda: RepeatingDuplicateNGramsFilter(n=0), "filter.n"),
        (lambda: RepeatingDuplicateNGramsFilter(max_repeating_duplicate_ngram_ratio=-1), "filter.max_repeating_duplicate_ngram_ratio"),
        (lambda: PunctuationFilter(max_num_sentences_without_endmark_ratio=85), "filter.max_num_sentences_without_endmark_ratio"),
        (lambda: EllipsisFilter(max_num_lines_ending_with_ellipsis_ratio=30), "filter.max_num_lines_ending_with_ellipsis_ratio"),
        (lambda: CommonEnglishWordsFilter(min_num_common_words=-2), "filter.min_num_common_words"),
        (lambda: WordsWithoutAlphabetsFilter(min_words_with_alphabets=80), "filter.min_words_with_alphabets"),
        (lambda: SubstringFilter(substring=""), "filter.substring"),
        (lambda: SubstringFilter(substring="x", position="middle"), "filter.position"),
        (lambda: UnicodeFix(normalization="NFX"), "modifier.normalization"),
        (lambda: UnicodeNormalize(normalization="none"), "modifier.normalization"),
        (lambda: WhitespaceNormalize(max_blank_lines=-1), "modifier.max_blank_lines"),
        (lambda: FunctionModifier(), "modifier.function"),
        (lambda: FunctionModifier(function="no_such_module_here:clean"), "modifier.function"),
    ],
)
def test_bad_settings_raise_naming_the_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


def test_words_split_on_exactly_the_whitespace_str_split_uses():
    """The byte-level word splitting agrees with ``str.split`` for every code point between two letters."""
    texts = ["a" + chr(code) + "b" for code in range(0x110000) if not 0xD800 <= code < 0xE000]
    counts = np.asarray(WordCountFilter().score(pa.array(texts)))
    assert counts.tolist() == [len(text.split()) for text in texts]


def test_boilerplate_at_top_or_bottom_can_be_left_out():
    text = "Terms of use\n\ntext\n\nUses cookies\n\nmore text\n\nCookie Policy"
    assert scores(BoilerPlateStringFilter(), [text]) == [pytest.approx(3 / 5)]
    # the leading and trailing notices are a banner and a footer; the one in the middle still counts
    assert scores(BoilerPlateStringFilter(remove_if_at_top_or_bottom=False), [text, "terms of use\n\nprivacy policy"]) == [pytest.approx(1 / 5), 1.0]


def webster_texts(limit: int) -> list[str]:
    shared = REPO.parent / "shared" / "corpus" / "webster"
    paths = sorted(shared.glob("*.jsonl.zst")) or sorted((REPO / "data" / "demo" / "webster").glob("*.jsonl.zst"))
    texts = []
    for path in paths:
        with open(path, "rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
        texts += [orjson.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    return texts[:limit]


def test_every_filter_runs_over_real_documents():
    texts = webster_texts(2000)
    assert len(texts) >= 300, "the shared corpus gives 2000 documents, the bundled demo slice (its fallback) 304"
    batch = pa.array([*texts, "", None])
    for f in [*every_filter(), RepeatingTopNGramsFilter(n=4), RepeatingDuplicateNGramsFilter(n=10), CommonEnglishWordsFilter(stop_at_false=False)]:
        got = f.score(batch).to_pylist()
        assert len(got) == len(batch) and got[-1] is None, f.name
        assert all(math.isfinite(s) for s in got[:-1]), f.name
        assert f.keep(f.score(batch)).shape == (len(batch),)


def test_unicode_fix_repairs_mojibake_and_normalizes():
    texts = pa.array(["The Mona Lisa doesn\u00c3\u00a2\u00e2\u201a\u00ac\u00e2\u201e\u00a2t have eyebrows.", "cafe\u0301", None, "&lt;3"])
    assert UnicodeFix().modify(texts).to_pylist() == ["The Mona Lisa doesn't have eyebrows.", "caf\u00e9", None, "<3"]
    assert UnicodeFix(normalization="NFD").modify(pa.array(["caf\u00e9"])).to_pylist() == ["cafe\u0301"]
    assert UnicodeFix(normalization="NFKC").modify(pa.array(["x\u00b2"])).to_pylist() == ["x2"]
    assert UnicodeFix(normalization="none").modify(pa.array(["cafe\u0301"])).to_pylist() == ["cafe\u0301"]
    assert UnicodeFix().modify(pa.array(["a"], pa.large_string())).type == pa.large_string()


def test_unicode_normalize_applies_the_form():
    texts = pa.array(["cafe\u0301", "\ufb01ne", None])
    assert UnicodeNormalize().modify(texts).to_pylist() == ["caf\u00e9", "\ufb01ne", None]
    assert UnicodeNormalize(normalization="NFKC").modify(texts).to_pylist() == ["caf\u00e9", "fine", None]
    assert UnicodeNormalize(normalization="NFD").modify(pa.array(["caf\u00e9"])).to_pylist() == ["cafe\u0301"]


def test_wikitext_detokenize_restores_ordinary_spacing():
    tokenized = ' = = History = = \n The road , 1 @,@ 000 km @-@ long ( approx . ) was built in 1990 @.@ 5 " quoted " ; it \'s done . \n'
    expected = ' == History ==\nThe road, 1,000 km-long (approx.) was built in 1990.5 "quoted"; it\'s done.\n'
    assert WikitextDetokenize().modify(pa.array([tokenized, None])).to_pylist() == [expected, None]
    assert WikitextDetokenize().modify(pa.array(["the boys ' toys , [ a ] { b } 5 \u00b0 C"])).to_pylist() == ["the boys' toys, [a] {b} 5\u00b0C"]


def test_whitespace_collapses_runs_keeps_indentation_and_caps_blank_lines():
    texts = pa.array(["  a  b\t\tc  \n\n\n\n  d \r\n\r\ne\rf", "x\n \n\t\n y", "   ", "a\u00a0\u00a0b", None])
    assert WhitespaceNormalize().modify(texts).to_pylist() == ["a b c\n\n  d\n\ne\nf", "x\n\n y", "", "a\u00a0\u00a0b", None]
    assert WhitespaceNormalize(max_blank_lines=0).modify(texts).to_pylist()[:2] == ["a b c\n  d\ne\nf", "x\n y"]
    assert WhitespaceNormalize(max_blank_lines=2).modify(pa.array(["a\n\n\n\n\nb"])).to_pylist() == ["a\n\n\nb"]


def test_function_modifier_applies_a_user_function():
    assert FunctionModifier(function="string:capwords").modify(pa.array(["hello  world", None])).to_pylist() == ["Hello World", None]
    with pytest.raises(TypeError, match="modifier.function: builtins:len returned int, not str"):
        FunctionModifier(function="builtins:len").modify(pa.array(["x"]))



def _python_repetition(text: str) -> tuple[float, float, float, float]:
    """NeMo's four repetition scores, restated in plain Python: lines (distinct, by chars), paragraphs (the same)."""
    lines = [line for line in text.split("\n") if line.strip()]
    paragraphs = text.split("\n\n")
    para_chars = sum(map(len, paragraphs))
    return (len(set(lines)) / len(lines) if lines else 0.0, sum(map(len, set(lines))) / sum(map(len, lines)) if lines else 0.0,
            len(set(paragraphs)) / len(paragraphs), sum(map(len, set(paragraphs))) / para_chars if para_chars else 0.0)


def test_batch_repetition_scores_equal_the_plain_python_definitions():
    tricky = ["", "\n", "a\n\n\nb\n\n\nb", "x\x1cy\n\x1c\n\u3000\nx\x1cy", "same\nsame\n  same  \nsame", "\n\n\n\n", "é\n\ne\u0301\n\né",
              "line one\r\nline one\r\n", "a\n\nb\n\na\n\nb\n\nc"]
    texts = tricky + webster_texts(600) + [None]
    filters = [RepeatedLinesFilter(), RepeatedLinesByCharFilter(), RepeatedParagraphsFilter(), RepeatedParagraphsByCharFilter()]
    for string_type in (pa.string(), pa.large_string()):
        array = pa.array(texts, string_type).slice(0)
        got = [f.score(array).to_pylist() for f in filters]
        for i, text in enumerate(texts):
            expected = (None,) * 4 if text is None else _python_repetition(text)
            assert tuple(g[i] for g in got) == expected, repr(text[:80] if text else text)


def _python_scores(text: str) -> dict[str, float]:
    """NeMo's definitions of the byte-level heuristics and of boilerplate, restated in plain Python over one text."""
    from tokenmix.curate.heuristics.boilerplate import POLICY_SUBSTRINGS
    from tokenmix.curate.heuristics.character_classes import BULLETS, COMMON_ENGLISH_WORDS, ELLIPSIS_MARKS, END_MARKS, URL_PATTERN, is_alphabetic

    words = text.split()
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    chars = len(text)
    marks = [mark for mark in ELLIPSIS_MARKS if not any(c.isspace() for c in mark)]
    alphanumeric = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789\n?!,."

    def share(count: int, total: int, empty: float) -> float:
        return count / total if total else empty

    lowered = text.lower()
    paragraphs = lowered.split("\n\n")
    return {
        "boilerplate_string": 1.0 if "lorem ipsum" in lowered else sum(any(s in p for s in POLICY_SUBSTRINGS) for p in paragraphs) / len(paragraphs),
        "word_count": len(words),
        "mean_word_length": share(sum(map(len, words)), len(words), 0.0),
        "long_word": max(map(len, words), default=0),
        "non_alpha_numeric": share(chars - sum(c in alphanumeric for c in text), chars, 1.0),
        "numbers": share(sum(c in "0123456789" for c in text), chars, 1.0),
        "white_space": share(sum(c in "\t\n\r\b " for c in text), chars, 1.0),
        "parentheses": share(sum(c in "{}[]()\u27e8\u27e9" for c in text), chars, 1.0),
        "symbols_to_words": share(sum(w in marks or 2 * len(re.findall("#+", w)) > len(w) for w in words), len(words), 1.0),
        "words_without_alphabets": share(sum(any(is_alphabetic(ord(c)) for c in w) for w in words), len(words), 0.0),
        "bullets": share(sum(line[0] in BULLETS for line in lines), len(lines), 1.0),
        "punctuation": share(sum(line[-1] not in END_MARKS for line in lines), len(lines), 1.0),
        "ellipsis": share(sum(line.lower().endswith(ELLIPSIS_MARKS) for line in lines), len(lines), 1.0),
        "urls": share(sum(map(len, re.findall(URL_PATTERN, text))), chars, 1.0),
        "common_english_words": min(sum(w in COMMON_ENGLISH_WORDS for w in words), 2),
    }


def _python_ngram_scores(text: str) -> dict[str, float]:
    """NeMo's n-gram scores, restated in plain Python over one text: the share of characters in the occurrences of
    the most frequent word n-gram (the first seen of those tied), and in the words of repeated n-grams."""
    words = text.split()
    scores = {}
    for n in TOP_SIZES:
        frequency: dict[tuple[str, ...], int] = {}
        for gram in zip(*(words[k:] for k in range(n))):
            frequency[gram] = frequency.get(gram, 0) + 1
        top = " ".join(max(frequency, key=frequency.__getitem__)) if frequency else ""
        scores[f"top_{n}"] = (len(text) - len(text.replace(top, ""))) / len(text) if len(words) >= n else 1.0
    for n in DUPLICATE_SIZES:
        seen: set[tuple[str, ...]] = set()
        covered_to = chars = 0
        for i, gram in enumerate(zip(*(words[k:] for k in range(n)))):
            if gram in seen:
                new = range(max(i, covered_to), i + n)
                chars += sum(len(words[k]) for k in new) + min(len(new), n - 1)
                covered_to = i + n
            seen.add(gram)
        scores[f"duplicate_{n}"] = chars / len(text) if len(words) >= n else 1.0
    return scores


TOP_SIZES = (1, 2, 3, 4)
DUPLICATE_SIZES = (1, 2, 5, 6, 7, 8, 9, 10)
NGRAM_FILTERS = {**{f"top_{n}": RepeatingTopNGramsFilter(n=n) for n in TOP_SIZES},
                 **{f"duplicate_{n}": RepeatingDuplicateNGramsFilter(n=n) for n in DUPLICATE_SIZES}}
"""Every n-gram filter of Gopher's sizes, and of sizes outside them (which get passes of their own)."""


def _ngram_scores(texts: pa.Array) -> dict[str, list]:
    return {name: f.score(texts).to_pylist() for name, f in NGRAM_FILTERS.items()}


def test_byte_level_scores_equal_the_plain_python_definitions():
    tricky = ["", " ", "\u3000a\u2003b\u00a0c\u0085d\u1680e\u2028f\u202fg\u205fh\x1ci", "## #a# ##x \u2026 [\u2026] -\u00bb (...) [...] ...",
              "\u2022 one\n \u25e6 two\n\t\u2219\nplain", "Read More\nsee READ MORE..\nwait\u2026 \n end \u00bb", "x\r\ny.\r\n\"q\"  \n'",
              "\u65e5\u672c\u8a9e \u0661\u0662 \u216b \u24d0 \U0001F170 \u00e9t\u00e9 123 --", "(a)[b]{c}\u27e8d\u27e9 \b\b", "a" * 3000 + " b",
              "\U0001F600\U0001F600 \U0001F600", "\n\n\n", "ab\u200bcd", "\x1f\x1e\x1d",
              "end." + " \u3000" * 100 + "\n" + " " * 200 + "\nno mark" + "\t" * 70, "\nstarts with a newline.\n",
              "see http://a.b/c?d=1&e#f, https://x.y/\u00e9 httpss://no http:// h http://ok", "the of The to be and that have with",
              "a b a b a b a b a b a b a b a b a b a b a b c", "xa b a b a bx", "a\u3000b a b\na b", " ".join(["w"] * 30),
              "the cat sat the cat sat on the cat sat on the mat the cat " * 3, " ".join(map(str, range(3000))) + " 1 2 3 4 5 6 7 8 9 10",
              "\ufffd \ufffd x \ufffd \ufffd x", "\u00e9t\u00e9 \u65e5\u672c \u00e9t\u00e9 \u65e5\u672c \u00e9t\u00e9",
              "Use of Coo\u212aies\n\nok", "PRIVACY POLICY\n\nx\n\nTerms Of Use", "LOREM IPSUM", "pr\u0130vacy policy", "cookies\n\n\ncookie"]
    texts = tricky + webster_texts(600) + [None]
    names = list(_python_scores("").keys())
    filters = {f.name: f for f in every_filter()}
    expected_ngrams = [{name: None for name in NGRAM_FILTERS} if text is None else _python_ngram_scores(text) for text in texts]
    for string_type in (pa.string(), pa.large_string()):
        array = pa.array(["pad", *texts], string_type).slice(1)
        got = {name: filters[name].score(array).to_pylist() for name in names}
        got_ngrams = _ngram_scores(array)
        for i, text in enumerate(texts):
            expected = {name: None for name in names} if text is None else _python_scores(text)
            assert {name: got[name][i] for name in names} == expected, repr(text[:80] if text else text)
            assert {name: got_ngrams[name][i] for name in NGRAM_FILTERS} == expected_ngrams[i], repr(text[:80] if text else text)


def test_invalid_utf8_from_a_parquet_shard_scores_as_replacement_characters(tmp_path):
    """Arrow does not check that a Parquet shard's strings are UTF-8. A byte that cannot start a UTF-8 sequence, or a
    sequence cut short by the text's end, scores as one U+FFFD (Python's ``errors="replace"``), and no text is read
    past its end."""
    raw = [b"a \xff\xfe word\n\xe2- \xe2\x80x", b"#\xff# http://a.b/\xfe.", b"tail cut short \xe2", b"\xf0\x9f\x98",
           b"x \xff y x \xfe y x \xef\xbf\xbd y"]
    offsets = np.cumsum([0, *map(len, raw)]).astype(np.int32)
    texts = pa.Array.from_buffers(pa.string(), len(raw), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(raw))])
    pq.write_table(pa.table({"text": texts}), tmp_path / "bad.parquet")
    read = pq.read_table(tmp_path / "bad.parquet").column("text")
    names = list(_python_scores("").keys())
    filters = {f.name: f for f in every_filter()}
    repetition = [RepeatedLinesFilter(), RepeatedLinesByCharFilter(), RepeatedParagraphsFilter(), RepeatedParagraphsByCharFilter()]
    got = {name: filters[name].score(read).to_pylist() for name in names}
    got_repetition = [f.score(read).to_pylist() for f in repetition]
    got_ngrams = _ngram_scores(read)
    for i, text in enumerate(raw):
        replaced = text.decode("utf-8", "replace")
        assert {name: got[name][i] for name in names} == _python_scores(replaced), text
        assert tuple(g[i] for g in got_repetition) == _python_repetition(replaced), text
        assert {name: got_ngrams[name][i] for name in NGRAM_FILTERS} == _python_ngram_scores(replaced), text


_PIECES = ["a", "Z", "é", "\u65e5", "\U0001F170", "\U0001F600", "1", "#", ".", "!", "'", "-", "\u00bb", "\u2026", "[", "]", "(", ")",
           "\u27e8", " ", "\t", "\n", "\n\n", "\r", "\x1c", "\u00a0", "\u3000", "\u2028", "\u0085", "\u2022", "\u25e6", "\b",
           "read more", "READ MORE..", "...", "\u216b", "\u0661", "http", "h", "s", "://", "https://x.io/A?b=1", "the", "The", "of", "with",
           "cookie", "COO", "\u212aie", "Privacy Policy", "pr\u0130vacy", "terms of use", "Lorem Ipsum", "use cookies"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join), min_size=1, max_size=8))
def test_compiled_scores_equal_the_plain_python_definitions_on_random_texts(texts):
    names = list(_python_scores("").keys())
    filters = {f.name: f for f in every_filter()}
    repetition = [RepeatedLinesFilter(), RepeatedLinesByCharFilter(), RepeatedParagraphsFilter(), RepeatedParagraphsByCharFilter()]
    array = pa.array(texts)
    got = {name: filters[name].score(array).to_pylist() for name in names}
    got_repetition = [f.score(array).to_pylist() for f in repetition]
    got_ngrams = _ngram_scores(array)
    for i, text in enumerate(texts):
        assert {name: got[name][i] for name in names} == _python_scores(text), repr(text)
        assert tuple(g[i] for g in got_repetition) == _python_repetition(text), repr(text)
        assert {name: got_ngrams[name][i] for name in NGRAM_FILTERS} == _python_ngram_scores(text), repr(text)


def test_a_column_of_one_chunk_is_taken_without_a_copy():
    """``combine_chunks`` copies even a single chunk; ``as_array`` hands the chunk itself over, and combines only
    several chunks."""
    texts = pa.array(["one two", "three"], pa.large_string())
    table = pa.table({"text": texts})
    taken = as_array(table.column("text"))
    assert [b.address for b in taken.buffers() if b] == [b.address for b in texts.buffers() if b]
    two = pa.chunked_array([texts, pa.array(["four"], pa.large_string())])
    assert as_array(two).to_pylist() == ["one two", "three", "four"]


def test_filter_stages_share_one_analysis_of_an_unchanged_batch():
    """Consecutive filter stages over a batch that the first leaves whole find the counts the first one's scan made
    (keyed by the texts' buffers), rather than scanning the batch again."""
    context = ShardContext("s", 0, 0, "text")
    table = pa.table({"text": pa.array(["a few plain words here", "and some more words there"], pa.large_string())})
    table, removed = ScoreFilter(WordCountFilter(min_words=2), score_field="words").apply(table, context)
    assert not removed
    profile = analyses._LAST_BATCH.batch.derived["profile"]
    table, removed = ScoreFilter(MeanWordLengthFilter(min_mean_word_length=1), score_field="mean").apply(table, context)
    assert not removed and analyses._LAST_BATCH.batch.derived["profile"] is profile
    assert table.column("mean").to_pylist() == pytest.approx([18 / 5, 21 / 5])


def test_the_ngram_filters_of_a_batch_share_one_pass():
    """The first n-gram filter to score a batch counts Gopher's nine sizes in one pass, which the other eight of them
    find, and makes the batch's profile from the same words, which the word filters find; a size outside them gets a
    pass of its own."""
    texts = pa.array(["a b c d e f g h i j k l a b c d e f g h i j k l", "one two", "x\u00e9 \u3000y \u2026 x\u00e9 y"], pa.large_string())
    RepeatingDuplicateNGramsFilter(n=7).score(texts)
    batch = analyses._LAST_BATCH.batch
    shared, profile = batch.derived["ngrams"], batch.derived["profile"]
    assert (shared.top_sizes, shared.duplicate_sizes) == ((2, 3, 4), (5, 6, 7, 8, 9, 10))
    for f in [*(RepeatingTopNGramsFilter(n=n) for n in (2, 3, 4)), *(RepeatingDuplicateNGramsFilter(n=n) for n in range(5, 11)),
              WordCountFilter(), SymbolsToWordsFilter()]:
        f.score(texts)
    assert analyses._LAST_BATCH.batch is batch and set(batch.derived) == {"ngrams", "profile"} and batch.derived["profile"] is profile
    assert profile.counts.tolist() == scan.profile_counts(*analyses.bytes_of(texts)).tolist()
    assert RepeatingDuplicateNGramsFilter(n=11).score(texts).to_pylist() == [23 / 47, 1.0, 1.0]
    assert set(batch.derived) == {"ngrams", "profile", ("ngrams", "duplicate", 11)} and batch.derived["ngrams"] is shared


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join), st.booleans(), st.booleans()), min_size=1,
                max_size=10))
def test_analyses_carried_past_removals_equal_analysing_again(rows):
    """After two stages remove texts, one after the other before any filter looks, every filter scores the kept batch
    from what was carried over from the first batch (``carry_analyses``: the profile, the line and paragraph counts),
    and the scores equal analysing the kept batch afresh."""
    texts = pa.array([text for text, _, _ in rows], pa.large_string())
    first = np.array([k for _, k, _ in rows])
    filters = every_filter()
    for f in filters:
        f.score(texts)
    kept = texts.filter(pa.array(first))
    analyses.carry_analyses(texts, first, kept)
    second = np.array([k2 for _, k, k2 in rows if k], dtype=bool)
    kept_again = kept.filter(pa.array(second))
    analyses.carry_analyses(kept, second, kept_again)
    carried = analyses._LAST_BATCH.batch
    assert carried.derived.keys() >= {"profile", "lines", "paragraphs"}
    got = [f.score(kept_again).to_pylist() for f in filters]
    assert analyses._LAST_BATCH.batch is carried
    analyses._LAST_BATCH.batch = None
    assert got == [f.score(kept_again).to_pylist() for f in filters]


def test_a_filter_stage_that_removes_texts_carries_the_counts_to_the_next():
    context = ShardContext("s", 0, 0, "text")
    table = pa.table({"text": pa.array(["a\na\nb", "x", "p\n\nq\n\np\nr s t u"], pa.large_string())})
    table, _ = ScoreFilter(RepeatedLinesFilter(max_repeated_line_fraction=0), score_field="lines").apply(table, context)
    table, removed = ScoreFilter(WordCountFilter(min_words=2)).apply(table, context)
    assert removed == {"word_count": 1}
    carried = analyses._LAST_BATCH.batch
    assert carried.derived["lines"].counts.tolist() == [[3, 2, 3, 2], [4, 3, 10, 9]]
    table, _ = ScoreFilter(RepeatedLinesByCharFilter(max_repeated_lines_char_ratio=0), score_field="chars").apply(table, context)
    assert analyses._LAST_BATCH.batch is carried
    assert table.column("chars").to_pylist() == pytest.approx([2 / 3, 0.9])


def test_lines_and_paragraphs_from_one_pass_are_those_str_split_cuts():
    """Paragraphs are cut where ``str.split("\\n\\n")`` cuts (left to right, not overlapping) though the one pass
    finds them from its lines: runs of newlines of every length, at either end, blank and repeated paragraphs."""
    texts = ["", "\n", "\n\n", "a\n\n", "a\n\n\n", "a\n\n\nb", "\n\n\n\n", "\n\n\n\n\nx", "x\n\ny\n\nx", "a\nb\n\na\nb\n",
             " \n\t\n\n \u00e9\n\n \u00e9", "a\n \n\nb\n\n\n\n\nc\n", "p\nq\n\np\nq\n\n\np\nq", "p\nq\n\npq"]
    data, bounds = analyses.bytes_of(pa.array(texts, pa.large_string()))
    lines, paragraphs = scan.line_and_paragraph_counts(data, bounds)

    def counts(pieces: list[str]) -> list[int]:
        return [len(pieces), len(set(pieces)), sum(map(len, pieces)), sum(map(len, set(pieces)))]

    assert lines.tolist() == [counts([p for p in t.split("\n") if p.strip()]) for t in texts]
    assert paragraphs.tolist() == [counts(t.split("\n\n")) for t in texts]


def _scans_agree(texts: pa.Array) -> None:
    """The plain-Python scan's counts equal the compiled scan's, for the profile, for lines and paragraphs (one pass
    of the compiled scan against two of the plain one), for word n-grams, alone and in one pass with the profile, and for the words boilerplate looks
    for."""
    compiled = pytest.importorskip("tokenmix.curate.heuristics._text_scan")
    assert plain_scan.PROFILE_FIELDS == compiled.PROFILE_FIELDS
    data, bounds = analyses.bytes_of(texts)
    assert plain_scan.profile(data, bounds).tolist() == scan.profile_counts(data, bounds).tolist()
    lines, paragraphs = scan.line_and_paragraph_counts(data, bounds)
    assert lines.tolist() == plain_scan.pieces(data, bounds, 1, True).tolist()
    assert paragraphs.tolist() == plain_scan.pieces(data, bounds, 2, False).tolist()
    sizes = (TOP_SIZES, DUPLICATE_SIZES)
    assert plain_scan.ngrams(data, bounds, *sizes).tolist() == scan.ngram_counts(data, bounds, *sizes).tolist()
    words = ("cookie", "privacy", "terms of use", "lorem ipsum", "in")
    assert plain_scan.mentions(data, bounds, words, ("\u212a",)).tolist() == scan.mention_flags(data, bounds, words, ("\u212a",)).tolist()
    together = scan.profile_and_ngram_counts(data, bounds, *sizes)
    assert [c.tolist() for c in together] == [plain_scan.profile(data, bounds).tolist(), plain_scan.ngrams(data, bounds, *sizes).tolist()]


def test_the_plain_python_scan_counts_as_the_compiled_one():
    """Where the compiled scan was not built (no C compiler at install), ``plain_scan`` makes the counts: the same, on
    real documents, on the tricky texts above and on bytes that are not valid UTF-8 (a Parquet shard's strings are not
    checked), cut off anywhere."""
    tricky = ["", " ", "\u3000a\u2003b\u00a0c\u0085d\u1680e\u2028f\u202fg\u205fh\x1ci", "## #a# ##x \u2026 [\u2026] -\u00bb (...) [...] ...",
              "\u2022 one\n \u25e6 two\n\t\u2219\nplain", "Read More\nsee READ MORE..\nwait\u2026 \n end \u00bb", "x\r\ny.\r\n\"q\"  \n'",
              "\u65e5\u672c\u8a9e \u0661\u0662 \u216b \u24d0 \U0001F170 \u00e9t\u00e9 123 --", "(a)[b]{c}\u27e8d\u27e9 \b\b", "a\n\n\nb\n\n\nb",
              "see http://a.b/c?d=1&e#f, https://x.y/\u00e9 httpss://no http:// h http://ok", "the of The to be and that have with",
              "x\x1cy\n\x1c\n\u3000\nx\x1cy", "same\nsame\n  same  \nsame", "\u00e9\n\ne\u0301\n\n\u00e9", "prefix ]^-\\ \u00e9\ufffd"]
    _scans_agree(pa.array([*tricky, *webster_texts(600), None], pa.large_string()))
    raw = [b"a \xff\xfe word\n\xe2- \xe2\x80x", b"#\xff# http://a.b/\xfe.", b"tail cut short \xe2", b"\xf0\x9f\x98", b"\xed\xa0\x80 \xc3\n\n\xc3",
           b"read more\xe2\x80\n\xc2\xbb\xe2\x80\xa6", "\u2022 \u00e9 \u65e5\n".encode() + b"\x80\x80\n\n\x80"]
    for cut in range(max(map(len, raw)) + 1):
        pieces = [r[:cut] for r in raw]
        offsets = np.cumsum([0, *map(len, pieces)]).astype(np.int32)
        _scans_agree(pa.Array.from_buffers(pa.string(), len(pieces), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(pieces))]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join), min_size=1, max_size=8),
       st.lists(st.binary(max_size=30), max_size=4))
def test_the_plain_python_scan_counts_as_the_compiled_one_on_random_texts(texts, binaries):
    raw = [text.encode() for text in texts] + binaries
    offsets = np.cumsum([0, *map(len, raw)]).astype(np.int64)
    _scans_agree(pa.Array.from_buffers(pa.large_string(), len(raw), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(raw))]))


_ASCII_PIECES = [p for p in _PIECES if p.isascii()] + ["abcdefghijklmnopqrstuvw", "        ", "\n    ", "x" * 70, "a#b##c", "###",
                                                      " ### ", "\n\n\n", "Read more...", " [...]\n", "END.\n", "\x1f", "\x0b"]
_LONG_PIECES = _ASCII_PIECES * 8 + _PIECES
"""Pieces of longer texts, mostly ASCII: runs that fill the compiled scan's 64-byte blocks, words longer than a block,
indentation, beside the characters outside ASCII that end a block early."""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_LONG_PIECES), min_size=10, max_size=200).map("".join), min_size=1, max_size=4))
def test_the_plain_python_scan_counts_as_the_compiled_one_on_long_random_texts(texts):
    _scans_agree(pa.array(texts, pa.large_string()))


def test_blank_lines_beside_long_lines_count_as_str_split_finds_them():
    """Lines are read 16 bytes at a time: a line of whitespace only is blank whatever follows its newline in the same 16
    bytes, a line of whitespace outside ASCII is blank too, and one of a single character outside ASCII is not."""
    texts = ["a\n   \nb c d e f g h i j k l m n o p q", "\t\t\x0b\n\x1c\x1f text after the blank line, long enough\n",
             "x\n\u3000\u00a0 \nsome more text here, past sixteen bytes\n\u00e9\n \n" + "y" * 40, " " * 40 + "\n" + "z" * 40 + "\n" + " " * 20]
    _scans_agree(pa.array(texts, pa.large_string()))


def test_the_most_frequent_ngram_counts_where_str_replace_finds_it():
    """The top n-gram is counted as str.replace finds its words joined with spaces: also where its first word ends a
    longer word or its last starts one, not where other whitespace parts its words, and not overlapping."""
    texts = ["a b c a b c xa b c a b cy", "q a b c d a b c d za b c dz a b c d", "a b c a  b c a\tb c a b c", "a a a a a a a a",
             "x y z x y z\nx y z\u00a0x y z", "\u00e9t\u00e9 a b \u00e9t\u00e9 a b z\u00e9t\u00e9 a b"]
    _scans_agree(pa.array(texts, pa.large_string()))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "ab", "ba", "aab", " ", " ", " ", "  ", "\t", "\n"]), min_size=3, max_size=80)
                .map("".join), min_size=1, max_size=4))
def test_ngrams_of_a_small_vocabulary_count_as_plain_python(texts):
    """Few words, so that the most frequent n-gram also occurs where its first word ends a longer word, its last starts
    one, other whitespace parts them, or its occurrences overlap: what str.replace counts, the compiled scan counts."""
    _scans_agree(pa.array(texts, pa.large_string()))


def test_without_the_compiled_scan_the_filters_count_in_python_and_say_so_once():
    """An install without a C compiler has no ``_text_scan``: every filter still scores, the same as with it, and the
    log says once why they are slower and what to install."""
    texts = ["The cat sat on the mat.\nIt was the best of times...", "\u2022 one\n\u2022 one\n\nhttp://x.y/z \u00e9t\u00e9", "", None]
    program = textwrap.dedent(f"""
        import json, logging, sys
        sys.modules["tokenmix.curate.heuristics._text_scan"] = None  # as if it had not been built
        logging.basicConfig(level=logging.WARNING)
        import pyarrow as pa
        from tokenmix.curate import DocumentFilter, SubstringFilter, ScoreFilter
        filters = [c(substring="the") if c is SubstringFilter else c() for n, c in DocumentFilter.get_known_choices().items() if n != "function"]
        texts = pa.array({texts!r})
        print(json.dumps({{f.name: [f.score(texts).to_pylist(), f.score(texts.slice(1)).to_pylist()] for f in filters}}))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    array = pa.array(texts)
    expected = {f.name: [f.score(array).to_pylist(), f.score(array.slice(1)).to_pylist()] for f in every_filter()}
    assert orjson.loads(done.stdout) == expected
    assert done.stderr.count("compiled text scan was not built") == 1, done.stderr
    assert "C compiler" in done.stderr


def test_a_compiled_scan_built_from_an_older_source_is_set_aside_for_plain_python_with_a_warning(monkeypatch, caplog):
    """A checkout updated without reinstalling keeps the extension its last install built: where that lacks a function
    this version calls, the filters count in plain Python and say how to rebuild, instead of failing mid-pipeline."""
    import sys
    import types

    from tokenmix.curate import heuristics
    from tokenmix.curate.heuristics import scan

    stale = types.ModuleType("tokenmix.curate.heuristics._text_scan")
    stale.profile = stale.ngrams = stale.mentions = lambda *args: None
    stale.__file__ = "/old/_text_scan.so"
    monkeypatch.setitem(sys.modules, "tokenmix.curate.heuristics._text_scan", stale)
    monkeypatch.setattr(heuristics, "_text_scan", stale, raising=False)
    scan.compiled.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=scan.__name__):
            assert scan.compiled() is None
        assert "lacks lines_and_paragraphs" in caplog.text and "pip install -e ." in caplog.text
    finally:
        scan.compiled.cache_clear()


def test_word_sets_that_cannot_share_one_lookup_table_are_looked_up_each_on_its_own():
    """The compiled profile finds symbols and stop words with one lookup in a table of both sets; where a string is
    longer than 8 bytes or two strings take the same slot, each set is searched on its own: the same counts."""
    compiled = scan.compiled()
    if compiled is None:
        pytest.skip("the compiled scan was not built")
    text = "the ... of # and-or readmoreplease with [\u2026] that have be to\nend"
    data = np.frombuffer(text.encode(), dtype=np.uint8)
    bounds = np.array([0, len(data)], dtype=np.int64)

    def counts(symbols: tuple[bytes, ...], common: tuple[bytes, ...]) -> dict[str, int]:
        out = np.empty((1, len(compiled.PROFILE_FIELDS)), dtype=np.int64)
        compiled.profile(data, bounds, scan._classes(), chars.is_alphabetic, symbols, common, scan._ELLIPSIS_BYTES, out)
        return dict(zip(compiled.PROFILE_FIELDS, out[0].tolist()))

    shared = counts(scan._SYMBOL_BYTES, scan._COMMON_BYTES)
    assert (shared["symbol_words"], shared["common_words"]) == (3, 7)
    assert counts(scan._SYMBOL_BYTES + (b"readmoreplease",), scan._COMMON_BYTES) == {**shared, "symbol_words": 4}
    assert counts(scan._SYMBOL_BYTES, scan._COMMON_BYTES + (b"and-or-longer",)) == shared
