"""How a curation pipeline's run is laid out before a task runs: its input shards in order (sources in list order,
each source's shards as its patterns expand), its passes (the stages split at each ``exact_dedup`` and
``fuzzy_dedup``), and where the outputs go."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenmix.curate import fuzzy_dedup
from tokenmix.curate.pipeline_config import CurationError, CurationOutput
from tokenmix.curate.pipeline_tasks import ShardRef
from tokenmix.curate.shard_io import local_or_url_join, shard_stem
from tokenmix.curate.stages import ExactDedup, Stage
from tokenmix.sources.urls import expand_urls, shard_name

if TYPE_CHECKING:
    from tokenmix.curate.pipeline_config import CurationConfig


def list_shards(config: CurationConfig) -> list[ShardRef]:
    """Every input shard, in order: sources in list order, each source's shards as its patterns expand."""
    shards = []
    stems: dict[str, str] = {}
    for rank, source in enumerate(config.sources):
        urls = expand_urls(source.paths)
        if config.output.write_to_filename:
            if config.output.source_dirs:
                stems = {}
            for url in urls:
                stem = shard_stem(url)
                if stem in stems:
                    raise CurationError(f"sources[{source.name}]: {stems[stem]} and {url} would both be written as {stem}; with "
                                        "output.write_to_filename every output shard needs its own name: rename one, or keep "
                                        "output.source_dirs on when the clash is between sources")
                stems[stem] = url
        shards += [ShardRef(len(shards) + i, source.name, rank, i, url, source.text_field) for i, url in enumerate(urls)]
    return shards


def final_url(output: CurationOutput, shard: ShardRef, suffix: str) -> str:
    """Where a pipeline that writes to file names writes the shard: under its source's directory, or in the output's."""
    name = shard_stem(shard.url) + suffix
    return local_or_url_join(output.path, shard.source, name) if output.source_dirs else local_or_url_join(output.path, name)


def partition_url(output: CurationOutput, partition: int, suffix: str) -> str:
    """Where a partitioned pipeline writes a partition."""
    return local_or_url_join(output.path, f"part-{partition:05d}{suffix}")


def output_urls(config: CurationConfig, shards: list[ShardRef], suffix: str) -> list[str]:
    """Every file a run of the pipeline over these shards writes for its user to read."""
    if config.output.write_to_filename:
        return [final_url(config.output, shard, suffix) for shard in shards]
    return [partition_url(config.output, p, suffix) for p in range(partition_count(config, shards))]


def refuse_inputs_among_outputs(config: CurationConfig, shards: list[ShardRef], outputs: list[str]) -> None:
    """Refuse a pipeline whose inputs include a file it writes (``outputs``), other than a shard written back in place
    under its own name: its paths match its own output, so a rerun (or a resume) would read that output as input."""
    written = {shard_name(url): url for url in outputs}
    own = [shard_name(url) for url in outputs] if config.output.write_to_filename else [None] * len(shards)
    for shard, its_own in zip(shards, own, strict=True):
        if shard.url in written and shard.url != its_own:
            raise CurationError(f"sources[{shard.source}]: {shard.url} is an input and a file this pipeline writes ({written[shard.url]} in "
                                f"output.path {config.output.path}), so it would read its own output, more of it at each rerun; narrow "
                                f"sources[{shard.source}].paths so they do not match the output, or set another output.path")


def split_at_dedups(stages: list[Stage]) -> list[tuple[int, list[Stage], Stage | None]]:
    """The stages split at each ``exact_dedup`` and ``fuzzy_dedup``, one map pass each: (index of the first stage, the
    stages, the dedup that ends them)."""
    segments = []
    current: list[Stage] = []
    first = 0
    for i, stage in enumerate(stages):
        if isinstance(stage, ExactDedup | fuzzy_dedup.FuzzyDedup):
            segments.append((first, current, stage))
            current, first = [], i + 1
        else:
            current.append(stage)
    segments.append((first, current, None))
    return segments


def partition_count(config: CurationConfig, shards: list[ShardRef]) -> int:
    """How many partitions a partitioned output has: as asked, or one per input shard."""
    return config.output.partitions or len(shards)
