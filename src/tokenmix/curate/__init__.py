"""Curation, before tokenizing: sharded document pipelines that read, filter, modify, deduplicate (exactly, and fuzzily
with MinHash-LSH and removal by source rank), score quality, blend, shuffle and write, resumably, on this machine or
on Ray or Dask. A curated directory feeds ``build-cache`` as it is.

Two faces over one engine (``pipeline.py``): a ``CurationConfig`` (YAML, ``tokenmix curate``), and NeMo Curator's
``DocumentDataset`` calls (``read_json``, ``ScoreFilter(WordCountFilter(min_words=80))(dataset)``, ``blend_datasets``,
``Shuffle``, ``to_json``, ``get_all_files_paths_under``, ``Filter``), with NeMo's names for the heuristic filters and
modifiers: NeMo Curator code runs with its imports changed to ``from tokenmix.curate import ...`` (or ``import
tokenmix.curate as nc``).
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.curate.document_dataset import DocumentDataset, Shuffle, blend_datasets
    from tokenmix.curate.filters import DocumentFilter, FunctionFilter
    from tokenmix.curate.fuzzy_dedup import FuzzyDedup
    from tokenmix.curate.heuristics.boilerplate import BoilerPlateStringFilter
    from tokenmix.curate.heuristics.characters import CharLengthFilter, NonAlphaNumericFilter, NumbersFilter, ParenthesesFilter, WhiteSpaceFilter
    from tokenmix.curate.heuristics.lines import BulletsFilter, EllipsisFilter, PunctuationFilter
    from tokenmix.curate.heuristics.repetition import (
        RepeatedLinesByCharFilter,
        RepeatedLinesFilter,
        RepeatedParagraphsByCharFilter,
        RepeatedParagraphsFilter,
        RepeatingDuplicateNGramsFilter,
        RepeatingTopNGramsFilter,
    )
    from tokenmix.curate.heuristics.substrings import SubstringFilter
    from tokenmix.curate.heuristics.urls import PornographicUrlsFilter, UrlsFilter
    from tokenmix.curate.heuristics.words import (
        CommonEnglishWordsFilter,
        LongWordFilter,
        MeanWordLengthFilter,
        SymbolsToWordsFilter,
        WordCountFilter,
        WordsWithoutAlphabetsFilter,
    )
    from tokenmix.curate.listing import get_all_files_paths_under
    from tokenmix.curate.minhash import MinHashConfig
    from tokenmix.curate.modifiers import (
        DocumentModifier,
        FunctionModifier,
        UnicodeFix,
        UnicodeNormalize,
        WhitespaceNormalize,
        WikitextDetokenize,
    )
    from tokenmix.curate.pipeline import load_curation_config, run_curation
    from tokenmix.curate.pipeline_config import BlendConfig, CurationConfig, CurationError, CurationOutput, CurationSource, ShuffleConfig
    from tokenmix.curate.quality import QualityClassifier
    from tokenmix.curate.remaining import get_batched_files, get_remaining_files
    from tokenmix.curate.shard_io import CurationInputError
    from tokenmix.curate.stages import AddId, ExactDedup, FieldFilter, Filter, Modify, Score, ScoreFilter, Stage

__all__ = [
    "AddId",
    "BlendConfig",
    "BoilerPlateStringFilter",
    "BulletsFilter",
    "CharLengthFilter",
    "CommonEnglishWordsFilter",
    "CurationConfig",
    "CurationError",
    "CurationInputError",
    "CurationOutput",
    "CurationSource",
    "DocumentDataset",
    "DocumentFilter",
    "DocumentModifier",
    "EllipsisFilter",
    "ExactDedup",
    "FieldFilter",
    "Filter",
    "FunctionFilter",
    "FunctionModifier",
    "FuzzyDedup",
    "LongWordFilter",
    "MeanWordLengthFilter",
    "MinHashConfig",
    "Modify",
    "NonAlphaNumericFilter",
    "NumbersFilter",
    "ParenthesesFilter",
    "PornographicUrlsFilter",
    "PunctuationFilter",
    "QualityClassifier",
    "RepeatedLinesByCharFilter",
    "RepeatedLinesFilter",
    "RepeatedParagraphsByCharFilter",
    "RepeatedParagraphsFilter",
    "RepeatingDuplicateNGramsFilter",
    "RepeatingTopNGramsFilter",
    "Score",
    "ScoreFilter",
    "Shuffle",
    "ShuffleConfig",
    "Stage",
    "SubstringFilter",
    "SymbolsToWordsFilter",
    "UnicodeFix",
    "UnicodeNormalize",
    "UrlsFilter",
    "WhiteSpaceFilter",
    "WhitespaceNormalize",
    "WikitextDetokenize",
    "WordCountFilter",
    "WordsWithoutAlphabetsFilter",
    "blend_datasets",
    "get_all_files_paths_under",
    "get_batched_files",
    "get_remaining_files",
    "load_curation_config",
    "run_curation",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
