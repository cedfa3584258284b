"""The stages of a curation pipeline that work record by record: ids, filters, modifiers; and the exact-dedup marker.

Each stage is a small frozen dataclass, a draccus choice (``stages: [{type: score_filter, filter: {type: word_count,
min_words: 50}}, ...]`` in YAML), and usable from Python as it is. ``apply`` takes one Arrow batch of one shard and
returns the batch it keeps with the number of records removed by reason, which ``curation_stats.json`` adds up.

``exact_dedup`` is the one stage that needs every shard before it can decide; the pipeline splits its run there
(``pipeline.py``, ``exact_dedup.py``).
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import draccus
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmix.curate.dedup_policy import POLICIES, Policy
from tokenmix.curate.filters import DocumentFilter, resolve_function
from tokenmix.curate.heuristics import registry  # noqa: F401  (registers the heuristic filters as choices of DocumentFilter)
from tokenmix.curate.heuristics.analyses import carry_analyses
from tokenmix.curate.modifiers import DocumentModifier
from tokenmix.curate.records import POSITION, as_array, field_column, field_values, has_field, set_field


@dataclass(frozen=True)
class ShardContext:
    """Where a batch comes from: its source (name and rank in the pipeline's list) and its shard (index in the source)."""

    source: str
    source_rank: int
    shard_index: int
    text_field: str


@dataclass(frozen=True)
class Stage(draccus.ChoiceRegistry):
    """One step of a curation pipeline; chosen in YAML with ``{type: ...}``."""

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        """The records of ``table`` this stage keeps (changed as it changes them), and those removed by reason."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """How the stage is named in statistics and progress."""
        return type(self).get_choice_name(type(self))

    def written_fields(self) -> tuple[str, ...]:
        """The record fields this stage sets beside the text (which ``modify`` changes on purpose): a pipeline refuses one
        that holds a text, which it would replace."""
        return ()

    def __call__(self, dataset: Any) -> Any:
        """``stage(dataset)``, as NeMo Curator's modules are called: the ``DocumentDataset`` with this stage applied."""
        return dataset.apply(self)


@Stage.register_subclass("add_id")
@dataclass(frozen=True)
class AddId(Stage):
    """A stable id per record, ``<prefix>-<shard>-<row>`` (as Zyda-2 gives every document an id that says where it came
    from), so that later stages and later jobs can find a record in its input: the row is its position in the input
    shard, so ids do not change when earlier filters change."""

    id_field: str = "id"
    id_prefix: str | None = None
    """Unset: the source's name."""

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        prefix = f"{self.id_prefix or context.source}-{context.shard_index:05d}-"
        positions = table.column(POSITION).to_numpy()
        ids = pa.array([f"{prefix}{p:09d}" for p in positions.tolist()], pa.string())
        return set_field(table, self.id_field, ids), Counter()

    def written_fields(self) -> tuple[str, ...]:
        return (self.id_field,)


@Stage.register_subclass("score_filter")
@dataclass(frozen=True)
class ScoreFilter(Stage):
    """Scores each record's text with a filter and keeps those its rule keeps (NeMo Curator's ``ScoreFilter``); the
    score is written to ``score_field`` when one is given. Removed records count under the filter's ``reason`` (its
    name, and ``n`` for the n-gram filters: ``repeating_top_ngrams_3``)."""

    filter: DocumentFilter
    text_field: str | None = None
    """Unset: the source's ``text_field``."""
    score_field: str | None = None
    """Where the score is written; unset: not written."""
    invert: bool = False
    """Keep what the rule would remove instead."""

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        table, keep = self.mark(table, context)
        return _keep_texts(table, keep, self.filter.reason, self.text_field or context.text_field)

    def mark(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, np.ndarray]:
        """``table`` with the scores written where asked, and which of its records the rule keeps, none removed."""
        scores = self.filter.score(as_array(field_column(table, self.text_field or context.text_field)))
        if self.score_field is not None:
            table = set_field(table, self.score_field, scores)
        keep = np.asarray(self.filter.keep(scores), dtype=bool)
        return table, ~keep if self.invert else keep

    def written_fields(self) -> tuple[str, ...]:
        return () if self.score_field is None else (self.score_field,)

    @property
    def label(self) -> str:
        return f"score_filter({self.filter.reason}{', inverted' if self.invert else ''})"


@Stage.register_subclass("score")
@dataclass(frozen=True)
class Score(Stage):
    """Writes a filter's score of each record's text to a field and removes nothing (NeMo Curator's ``Score``), for a
    later ``field_filter``, or to look at a corpus before choosing thresholds. Its arguments come in NeMo's order
    (``Score(filter, "score_field")`` writes ``score_field``)."""

    filter: DocumentFilter
    score_field: str | None = None
    """Unset: the filter's reason (``word_count``, ``repeating_top_ngrams_3``)."""
    text_field: str | None = None
    """Unset: the source's ``text_field``."""

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        scores = self.filter.score(as_array(field_column(table, self.text_field or context.text_field)))
        return set_field(table, self.score_field or self.filter.reason, scores), Counter()

    def written_fields(self) -> tuple[str, ...]:
        return (self.score_field or self.filter.reason,)

    @property
    def label(self) -> str:
        return f"score({self.filter.reason})"


_OPERATORS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq, "!=": operator.ne}


@Stage.register_subclass("field_filter")
@dataclass(frozen=True)
class FieldFilter(Stage):
    """Keeps records whose ``field`` compares true with ``value`` (``int_score >= 3``, Zyda-2's FineWeb-Edu step;
    a quality label ``== "High"``); records without the field are removed. NeMo Curator's ``Filter`` over a field."""

    field: str = ""
    op: Literal[">=", ">", "<=", "<", "==", "!="] = ">="
    value: Any = 0

    def __post_init__(self) -> None:
        if not self.field:
            raise ValueError("field_filter.field: name the field to compare, e.g. field: int_score")
        if self.op not in _OPERATORS:
            raise ValueError(f"field_filter.op: {self.op!r} is not one of {list(_OPERATORS)}")

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        if not has_field(table, self.field):
            return _keep(table, np.zeros(table.num_rows, dtype=bool), self.label)
        values = field_column(table, self.field).to_pylist()
        compare = _OPERATORS[self.op]
        keep = np.array([v is not None and _compares(compare, v, self.value) for v in values], dtype=bool)
        return _keep(table, keep, self.label)

    @property
    def label(self) -> str:
        return f"{self.field} {self.op} {self.value}"


@Stage.register_subclass("filter")
@dataclass(frozen=True)
class Filter(Stage):
    """Keeps the records whose ``filter_field`` a function keeps (NeMo Curator's ``Filter``): it filters on a field
    already there (a score, a label), computing nothing from the text. ``filter_fn`` is a function of one value that
    returns true to keep the record, or a ``DocumentFilter``, whose rule is applied to the field as its score; in YAML,
    a function's import path (``package.module:function``). A record without the field gives the function ``None``.

    The function runs in the worker processes, so it must be importable there: a ``def`` at the top level of a module
    or of the script, not a lambda or a function defined inside another."""

    filter_fn: Any = None
    """A function of one field value (or its import path), or a ``DocumentFilter``."""
    filter_field: str = ""
    invert: bool = False
    """Keep what the function would remove instead."""

    def __post_init__(self) -> None:
        if not self.filter_field:
            raise ValueError("Filter.filter_field: name the field to filter on, e.g. Filter(keep, filter_field='quality_pred')")
        if isinstance(self.filter_fn, str):
            resolve_function(self.filter_fn, "Filter.filter_fn")
        elif not isinstance(self.filter_fn, DocumentFilter):
            if not callable(self.filter_fn):
                raise ValueError(f"Filter.filter_fn: {self.filter_fn!r} is neither a function nor a DocumentFilter")
            name = getattr(self.filter_fn, "__qualname__", "")
            if "<lambda>" in name or "<locals>" in name:
                raise ValueError(f"Filter.filter_fn: {name} cannot reach the worker processes (they import functions by name); "
                                 "define it with def at the top level of a module or of the script")

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        if isinstance(self.filter_fn, DocumentFilter):
            values = field_column(table, self.filter_field) if has_field(table, self.filter_field) else pa.nulls(table.num_rows)
            keep = self.filter_fn.keep(as_array(values))
        else:
            function = resolve_function(self.filter_fn, "Filter.filter_fn") if isinstance(self.filter_fn, str) else self.filter_fn
            keep = np.array([bool(function(v)) for v in field_values(table, self.filter_field)], dtype=bool)
        return _keep(table, ~keep if self.invert else keep, self.label)

    @property
    def label(self) -> str:
        function = self.filter_fn.reason if isinstance(self.filter_fn, DocumentFilter) else getattr(self.filter_fn, "__name__", self.filter_fn)
        return f"filter({function} on {self.filter_field}{', inverted' if self.invert else ''})"


def _compares(compare: Any, value: Any, threshold: Any) -> bool:
    try:
        return bool(compare(value, threshold))
    except TypeError:
        return False


@Stage.register_subclass("modify")
@dataclass(frozen=True)
class Modify(Stage):
    """Rewrites each record's text with a modifier (NeMo Curator's ``Modify``): unicode fixes, detokenizing, whitespace."""

    modifier: DocumentModifier
    text_field: str | None = None
    """Unset: the source's ``text_field``."""

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        name = self.text_field or context.text_field
        return set_field(table, name, self.modifier.modify(as_array(field_column(table, name)))), Counter()

    @property
    def label(self) -> str:
        return f"modify({self.modifier.name})"


@Stage.register_subclass("exact_dedup")
@dataclass(frozen=True)
class ExactDedup(Stage):
    """Removes records whose normalized text another record has: by default all but the first by source rank (the
    sources' list order), then shard, then row; with ``policy: cross_source`` (Zyda-2's rule) only the copies in
    sources ranked below the best source holding the text, so duplicates inside one source stay. Needs every shard
    before it can decide, so the pipeline runs it between passes."""

    text_field: str | None = None
    """Unset: the source's ``text_field``."""
    normalize: bool = True
    """Compare texts after Unicode NFC, lower-casing, collapsing whitespace and trimming; off: byte for byte."""
    memory_bytes: int = 256 << 20
    """The peak memory of a task deciding one hash range (176 bytes a record); more records are decided in more ranges,
    and a range too large for it (one text copied very many times: at 256 MiB, more than about 750 k copies) is
    refused, naming this field."""
    policy: Policy = "one_per_cluster"
    """``one_per_cluster``: of the records of one text keep only the first; ``cross_source``: keep every record of the
    highest-ranked source holding the text and remove the others' (``dedup_policy.py``)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"exact_dedup.policy: {self.policy!r} is not one of {', '.join(POLICIES)}")

    def apply(self, table: pa.Table, context: ShardContext) -> tuple[pa.Table, Counter[str]]:
        raise TypeError("exact_dedup runs between passes of the pipeline, not on one batch")


def _keep(table: pa.Table, keep: np.ndarray, reason: str) -> tuple[pa.Table, Counter[str]]:
    removed = int(len(keep) - np.count_nonzero(keep))
    if not removed:
        return table, Counter()
    return table.filter(pa.array(keep)), Counter({reason: removed})


def _keep_texts(table: pa.Table, keep: np.ndarray, reason: str, text_field: str) -> tuple[pa.Table, Counter[str]]:
    """``_keep``, and what the heuristic filters derived from the texts cut down to the kept ones (``carry_analyses``)."""
    kept, removed = _keep(table, keep, reason)
    if removed:
        carry_analyses(as_array(field_column(table, text_field)), keep, as_array(field_column(kept, text_field)))
    return kept, removed


@dataclass
class StageCount:
    """What one stage saw of a batch: records in, records out, and those removed by reason."""

    records_in: int
    records_out: int
    removed: Counter[str]


UNTAKEN_SHARE = 0.25
"""The share of a batch that a run of ``score_filter`` stages may have removed before it takes the kept records: the
filters after score the records already removed until then (at most this share more scoring), instead of each
removing filter copying the batch."""


def apply_stages(stages: list[Stage], table: pa.Table, context: ShardContext) -> tuple[pa.Table, list[StageCount]]:
    """The records of ``table`` that ``stages`` keep, run in order, and what each stage saw (a stage after all records
    are gone sees none and is not called). Consecutive ``score_filter`` stages mark the records they keep and the
    batch is cut once at the end of their run (or once ``UNTAKEN_SHARE`` of it is removed), not once per filter that
    removes some: the same records, fields and counts as applying each stage in turn."""
    counts: list[StageCount] = []
    i = 0
    while i < len(stages):
        run = _filter_run(stages, i, context)
        if len(run) > 1:
            table = _apply_filter_run(run, table, context, counts)
            i += len(run)
            continue
        records_in = table.num_rows
        removed: Counter[str] = Counter()
        if records_in:
            table, removed = stages[i].apply(table, context)
        counts.append(StageCount(records_in, table.num_rows, removed))
        i += 1
    return table, counts


def _filter_run(stages: list[Stage], start: int, context: ShardContext) -> list[ScoreFilter]:
    """The ``score_filter`` stages from ``start`` on that can mark one batch together: none reads a field that one
    before it in the run writes, nor writes a field that one in the run reads."""
    run: list[ScoreFilter] = []
    reads: set[str] = set()
    writes: set[str] = set()
    for stage in stages[start:]:
        if not isinstance(stage, ScoreFilter):
            break
        text = stage.text_field or context.text_field
        if text in writes or stage.score_field in reads | {text}:
            break
        run.append(stage)
        reads.add(text)
        if stage.score_field is not None:
            writes.add(stage.score_field)
    return run


def _apply_filter_run(run: list[ScoreFilter], table: pa.Table, context: ShardContext, counts: list[StageCount]) -> pa.Table:
    alive = np.ones(table.num_rows, dtype=bool)
    untaken = 0
    for stage in run:
        records_in = int(np.count_nonzero(alive))
        removed: Counter[str] = Counter()
        if records_in:
            table, keep = stage.mark(table, context)
            dropped = alive & ~keep
            if dropped.any():
                removed[stage.filter.reason] = int(np.count_nonzero(dropped))
                alive &= keep
                untaken += removed[stage.filter.reason]
        counts.append(StageCount(records_in, records_in - sum(removed.values()), removed))
        if untaken > UNTAKEN_SHARE * len(alive):
            table, _ = _keep_texts(table, alive, "", stage.text_field or context.text_field)
            alive = np.ones(table.num_rows, dtype=bool)
            untaken = 0
    table, _ = _keep_texts(table, alive, "", run[-1].text_field or context.text_field)
    return table


def text_hashes(texts: pa.Array, normalize: bool) -> np.ndarray:
    """128-bit hashes of texts (``[n, 2]`` uint64), after normalization when asked: what exact dedup compares."""
    import xxhash

    if normalize:
        texts = pc.utf8_normalize(texts, "NFC")
        texts = pc.utf8_lower(texts)
        texts = pc.utf8_trim_whitespace(pc.replace_substring_regex(texts, r"\s+", " "))
    out = np.empty((len(texts), 2), dtype=np.uint64)
    for i, text in enumerate(texts.to_pylist()):
        digest = xxhash.xxh3_128_intdigest((text or "").encode("utf-8"))
        out[i, 0] = digest >> 64
        out[i, 1] = digest & 0xFFFFFFFFFFFFFFFF
    return out
