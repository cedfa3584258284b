"""A curation pipeline's config, ``CurationConfig``, and its parts: its named sources, its output, an offline blend and
a shuffle; and ``CurationError``, which a pipeline that cannot run as configured raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tokenmix.curate import blend as blending
from tokenmix.curate.shard_io import BATCH_BYTES, OUTPUT_FORMATS
from tokenmix.curate.stages import AddId, Stage
from tokenmix.execution.configs import ExecutorConfig, LocalExecutorConfig


class CurationError(ValueError):
    """A pipeline that cannot run as configured; the message names the field and what to change."""


@dataclass(frozen=True)
class CurationSource:
    """One named input: shards by URL pattern (braces, globs; local or fsspec), the field holding the text."""

    name: str
    paths: list[str]
    text_field: str = "text"


@dataclass(frozen=True)
class CurationOutput:
    """Where and how the result is written."""

    path: str
    format: str = "jsonl.zst"
    """``jsonl``, ``jsonl.gz``, ``jsonl.zst`` or ``parquet``."""
    write_to_filename: bool = False
    """Each input shard's records go to a shard of the same name, ``<path>/<source>/<name><suffix>``: the input's
    sharding is kept. Off: ``partitions`` files ``<path>/part-00000<suffix>``, ...: needed for blend and shuffle."""
    partitions: int | None = None
    """Output files when not writing to file names; unset: as many as input shards."""
    source_dirs: bool = True
    """With ``write_to_filename``: each source's shards in a directory of its name (off: all in ``path`` itself, which
    needs shard names unique across sources)."""

    def __post_init__(self) -> None:
        if self.format not in OUTPUT_FORMATS:
            raise CurationError(f"output.format {self.format!r} is not one of {list(OUTPUT_FORMATS)}")
        if self.partitions is not None and self.partitions < 1:
            raise CurationError(f"output.partitions must be >= 1, got {self.partitions}")
        if self.partitions is not None and self.write_to_filename:
            raise CurationError(f"output.partitions ({self.partitions}) divides a partitioned output, but output.write_to_filename writes "
                                "each input shard to a file of its name; remove output.partitions, or set output.write_to_filename: false")


@dataclass(frozen=True)
class BlendConfig:
    """An offline blend (NeMo Curator's ``blend_datasets``): source ``s`` gives ``ceil(target_size * w_s / sum w)``
    records, repeating a source that has fewer (``blend.py``)."""

    target_size: int
    weights: dict[str, float]
    seed: int | None = None
    """Unset: a source's first records make up a partial copy or a cut (NeMo's rule); set: a seeded uniform sample."""

    def __post_init__(self) -> None:
        if self.seed is not None and self.seed < 0:
            raise CurationError(f"blend.seed must be >= 0 (or unset), got {self.seed}")


@dataclass(frozen=True)
class ShuffleConfig:
    """A seeded global shuffle into the output partitions, in two passes with one bucket in memory at a time."""

    seed: int = 0
    buffer_bytes: int = 256 << 20
    """About the most record bytes (Arrow) a gather task holds at once; more data means more, smaller buckets."""

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise CurationError(f"shuffle.seed must be >= 0, got {self.seed}")
        if self.buffer_bytes < 1:
            raise CurationError(f"shuffle.buffer_bytes must be >= 1 (bytes a gather task holds), got {self.buffer_bytes}")


@dataclass(frozen=True)
class CurationConfig:
    """A curation pipeline (``tokenmix curate --config_path pipeline.yaml``)."""

    sources: list[CurationSource]
    output: CurationOutput
    stages: list[Stage] = field(default_factory=list)
    """Record stages in order (``add_id``, ``score``, ``score_filter``, ``field_filter``, ``modify``, ``quality``,
    ``exact_dedup``, ``fuzzy_dedup``)."""
    blend: BlendConfig | None = None
    """Applied after the stages; needs partitioned output."""
    shuffle: ShuffleConfig | None = None
    """Applied last; needs partitioned output."""
    filename_field: str | None = None
    """Write each record's input shard name to this field (NeMo's ``add_filename``); unset: not written."""
    on_error: Literal["raise", "skip"] = "raise"
    """``raise`` stops at the first bad record naming file and line; ``skip`` counts it by reason."""
    executor: ExecutorConfig = field(default_factory=LocalExecutorConfig)
    """``{type: local}`` (worker processes), ``{type: ray, address: ...}`` or ``{type: dask, address: ...}``."""
    num_workers: int | None = None
    """Local worker processes (one per core when unset; 0 runs tasks in this process), or a local cluster's size."""
    chunk_bytes: int = BATCH_BYTES
    """Input bytes per batch of records."""
    keep_intermediate: bool = False
    """Keep the passes' intermediate shards after a successful run (they are removed by default)."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.sources]
        if not names:
            raise CurationError("sources: give at least one source (name, paths)")
        if len(set(names)) != len(names):
            raise CurationError(f"sources: names must be unique, got {names}")
        for source in self.sources:
            if not source.paths:
                raise CurationError(f"sources[{source.name}].paths: give at least one shard URL or pattern")
        self._refuse_writes_over_texts()
        for i, stage in enumerate(self.stages):
            if isinstance(stage, AddId) and stage.id_prefix is not None and len(names) > 1:
                raise CurationError(f"stages[{i}] (add_id).id_prefix {stage.id_prefix!r} gives the records of all {len(names)} sources one "
                                    "prefix, and rows are numbered within each source's shards, so two sources would give the same ids; "
                                    "leave id_prefix unset (each source's name is its prefix), or curate each source in a pipeline of its own")
        if self.output.write_to_filename and (self.blend is not None or self.shuffle is not None):
            raise CurationError("output.write_to_filename keeps each input shard's records in a shard of its name, which a blend or a "
                                "shuffle cannot; set output.write_to_filename: false (and output.partitions) to blend or shuffle")
        if self.blend is not None:
            unknown = sorted(set(self.blend.weights) - set(names))
            if unknown:
                raise CurationError(f"blend.weights names {unknown}, which are not sources; sources are {names}")
            blending.blend_counts(self.blend.target_size, [self.blend.weights.get(n, 0.0) for n in names])

    def _refuse_writes_over_texts(self) -> None:
        """Refuse a field written by a stage or by ``filename_field`` that holds a text a source or a stage reads: every
        record's text would be replaced by an id, a score or a shard name."""
        texts: dict[str, str] = {}
        for source in self.sources:
            texts.setdefault(source.text_field, f"the text of sources[{source.name}]")
        for i, stage in enumerate(self.stages):
            text = getattr(stage, "text_field", None)
            if text:
                texts.setdefault(text, f"the text stages[{i}] ({stage.label}) reads")
        writers = [(f"stages[{i}] ({stage.label})", name) for i, stage in enumerate(self.stages) for name in stage.written_fields()]
        for writer, name in ([("filename_field", self.filename_field)] if self.filename_field else []) + writers:
            if name in texts:
                raise CurationError(f"{writer} writes the field {name!r}, {texts[name]}, and would replace that text in every record; "
                                    "write it to another field")
