"""The parts of a curation pipeline's config (``CurationConfig`` in ``pipeline.py``): its named sources, its output,
an offline blend and a shuffle; and ``CurationError``, which a pipeline that cannot run as configured raises."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmix.curate.shard_io import OUTPUT_FORMATS


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


@dataclass(frozen=True)
class BlendConfig:
    """An offline blend (NeMo Curator's ``blend_datasets``): source ``s`` gives ``ceil(target_size * w_s / sum w)``
    records, repeating a source that has fewer (``blend.py``)."""

    target_size: int
    weights: dict[str, float]
    seed: int | None = None
    """Unset: a source's first records make up a partial copy or a cut (NeMo's rule); set: a seeded uniform sample."""


@dataclass(frozen=True)
class ShuffleConfig:
    """A seeded global shuffle into the output partitions, in two passes with one bucket in memory at a time."""

    seed: int = 0
    buffer_bytes: int = 256 << 20
    """About the most record bytes (Arrow) a gather task holds at once; more data means more, smaller buckets."""
