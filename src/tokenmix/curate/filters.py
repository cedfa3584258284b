"""Document filters: a score per document, computed over a whole batch of texts, and the scores that keep it.

A filter is NeMo Curator's ``DocumentFilter`` (``score_document`` / ``keep_document``) turned to batches: ``score``
takes an Arrow array of texts and returns one score per text, so that filters written with ``pyarrow.compute`` run
vectorized; ``keep`` says which scores keep their document. Filters are draccus choices (``filter: {type: word_count,
min_words: 50}`` in YAML); ``ScoreFilter`` in ``stages.py`` applies one to a field and writes the score beside it.

The heuristics NeMo Curator ships live in ``heuristics/``; ``function`` takes any user function by import path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import draccus
import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class DocumentFilter(draccus.ChoiceRegistry):
    """A score per document and a rule on it; chosen in YAML with ``filter: {type: ...}``."""

    def score(self, texts: pa.Array) -> pa.Array:
        """One score per text (null texts score null); the same text always scores the same."""
        raise NotImplementedError

    def keep(self, scores: pa.Array) -> np.ndarray:
        """Which documents their scores keep: a bool array as long as ``scores`` (null scores are not kept)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The filter's registered name (``word_count``)."""
        return type(self).get_choice_name(type(self))

    @property
    def reason(self) -> str:
        """What its removals count under in the statistics: the name, with what tells two such filters apart."""
        return self.name


def resolve_function(path: str, field_name: str) -> Callable[..., Any]:
    """The callable named by ``package.module:function`` (or ``package.module.function``), for config fields that
    take a user function; the error names ``field_name`` and what to write."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{field_name}: {path!r} is not an import path; write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{field_name}: cannot import {module_name!r} ({e}); install it or put it on PYTHONPATH") from e
    try:
        function = getattr(module, attribute)
    except AttributeError as e:
        raise ValueError(f"{field_name}: module {module_name!r} has no {attribute!r}") from e
    if not callable(function):
        raise ValueError(f"{field_name}: {path!r} is not callable")
    return function


def bounds_keep(scores: pa.Array, low: float | None, high: float | None) -> np.ndarray:
    """``low <= score <= high`` (either bound may be absent); null scores are not kept."""
    values = scores.to_numpy(zero_copy_only=False)
    if scores.null_count:
        keep = ~np.asarray(scores.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        numeric = np.where(keep, values, 0).astype(np.float64)
    else:
        keep, numeric = np.ones(len(values), dtype=bool), values.astype(np.float64, copy=False)
    if low is not None:
        keep &= numeric >= low
    if high is not None:
        keep &= numeric <= high
    return keep


@DocumentFilter.register_subclass("function")
@dataclass(frozen=True)
class FunctionFilter(DocumentFilter):
    """A user function by import path (``package.module:score``) that scores one text; kept where ``min_score <=
    score <= max_score``, or where ``keep`` (another import path, called on the score) returns true."""

    score_function: str = ""
    """``package.module:function`` taking a text (str) and returning a number or bool."""
    keep_function: str | None = None
    """``package.module:function`` taking a score and returning whether to keep the document; unset: the bounds decide."""
    min_score: float | None = None
    max_score: float | None = None

    def __post_init__(self) -> None:
        if not self.score_function:
            raise ValueError("filter.score_function: give the scoring function as 'package.module:function'")
        resolve_function(self.score_function, "filter.score_function")
        if self.keep_function is not None:
            resolve_function(self.keep_function, "filter.keep_function")

    def score(self, texts: pa.Array) -> pa.Array:
        function = resolve_function(self.score_function, "filter.score_function")
        return pa.array([None if text is None else function(text) for text in texts.to_pylist()])

    def keep(self, scores: pa.Array) -> np.ndarray:
        if self.keep_function is None:
            if self.min_score is None and self.max_score is None:
                return np.array([bool(s) for s in scores.to_pylist()], dtype=bool)
            return bounds_keep(scores, self.min_score, self.max_score)
        function = resolve_function(self.keep_function, "filter.keep_function")
        return np.array([s is not None and bool(function(s)) for s in scores.to_pylist()], dtype=bool)
