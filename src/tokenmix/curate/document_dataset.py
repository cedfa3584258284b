"""NeMo Curator's ``DocumentDataset`` face over the pipeline engine: read, apply stages, blend, shuffle, write.

Code written for NeMo Curator's seed API reads the same here::

    books = DocumentDataset.read_json(files, add_filename=True)
    long_books = ScoreFilter(WordCountFilter(min_words=80), text_field="text", score_field="word_count")(books)
    long_books.to_json("long_books/", write_to_filename=True)

A ``DocumentDataset`` is lazy and immutable: applying a stage returns a new one; nothing is read until it is written
(or iterated). Writing runs a ``CurationConfig`` through ``run_curation``: the same engine, statistics, resume and
executors as ``tokenmix curate``. A blend mixes datasets that carry the same stages, and stages come before a blend or
a shuffle (the engine runs them in that order); either rule broken is an error that says what to do instead.
"""

from __future__ import annotations

import dataclasses
import glob
import posixpath
from collections.abc import Iterator
from typing import Any, Literal

import pyarrow as pa

from tokenmix._object_stores import url_to_fs
from tokenmix.curate.listing import is_curation_bookkeeping
from tokenmix.curate.pipeline import run_curation
from tokenmix.curate.pipeline_config import BlendConfig, CurationConfig, CurationOutput, CurationSource, ShuffleConfig
from tokenmix.curate.records import user_table
from tokenmix.curate.shard_io import ShardBatches, read_batches
from tokenmix.curate.stages import ExactDedup, ShardContext, Stage, apply_stages
from tokenmix.execution.configs import ExecutorConfig, LocalExecutorConfig
from tokenmix.sources.urls import expand_urls


@dataclasses.dataclass(frozen=True)
class DocumentDataset:
    """A lazy collection of documents over sharded files, with the stages to run on them."""

    sources: tuple[CurationSource, ...]
    stages: tuple[Stage, ...] = ()
    filename_field: str | None = None
    blend: BlendConfig | None = None
    shuffle: ShuffleConfig | None = None
    on_error: Literal["raise", "skip"] = "raise"

    @classmethod
    def read_json(cls, input_files: str | list[str], add_filename: bool | str = False, text_field: str = "text",
                  name: str = "documents", on_error: Literal["raise", "skip"] = "raise") -> DocumentDataset:
        """Shards of JSON lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``; a directory, a glob, braces or a list);
        ``add_filename`` keeps each record's shard name in ``filename`` (or the field it names)."""
        return cls._read(input_files, add_filename, text_field, name, on_error, (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".jsonl.zst"))

    @classmethod
    def read_parquet(cls, input_files: str | list[str], add_filename: bool | str = False, text_field: str = "text",
                     name: str = "documents", on_error: Literal["raise", "skip"] = "raise") -> DocumentDataset:
        """Parquet shards (a directory, a glob, braces or a list); ``add_filename`` as in ``read_json``."""
        return cls._read(input_files, add_filename, text_field, name, on_error, (".parquet",))

    @classmethod
    def _read(cls, input_files: str | list[str], add_filename: bool | str, text_field: str, name: str, on_error: Literal["raise", "skip"],
              suffixes: tuple[str, ...]) -> DocumentDataset:
        paths = []
        for pattern in [input_files] if isinstance(input_files, str) else list(input_files):
            if _is_directory(pattern):
                paths += _shards_in(pattern, suffixes)
            else:
                paths.append(pattern)
        if not paths:
            raise FileNotFoundError(f"no {'/'.join(suffixes)} files in {input_files}")
        field = add_filename if isinstance(add_filename, str) else ("filename" if add_filename else None)
        return cls((CurationSource(name, paths, text_field),), filename_field=field, on_error=on_error)

    def apply(self, stage: Stage) -> DocumentDataset:
        """This dataset with ``stage`` run on it."""
        if self.blend is not None or self.shuffle is not None:
            raise ValueError(f"{stage.label} applied after a blend or a shuffle; apply record stages to the datasets before "
                             "blending or shuffling them (the engine runs stages first)")
        return dataclasses.replace(self, stages=(*self.stages, stage))

    def iter_batches(self) -> Iterator[pa.Table]:
        """The documents as Arrow tables of their fields, with the stages run, in this process (for looking at a small
        dataset; ``exact_dedup``, blends and shuffles need ``to_json``/``to_parquet``)."""
        if self.blend is not None or self.shuffle is not None or any(isinstance(s, ExactDedup) for s in self.stages):
            raise ValueError("exact_dedup, blends and shuffles run over all shards at once; write the dataset with to_json or to_parquet")
        for rank, source in enumerate(self.sources):
            for index, url in enumerate(expand_urls(source.paths)):
                context = ShardContext(source.name, rank, index, source.text_field)
                for table in read_batches(url, source.text_field, self.filename_field, self.on_error, ShardBatches()):
                    table, _ = apply_stages(list(self.stages), table, context)
                    if table.num_rows:
                        yield user_table(table)

    def to_json(self, output_path: str, write_to_filename: bool = False, compression: Literal["gzip", "zstd"] | None = None,
                partitions: int | None = None, executor: ExecutorConfig | None = None, num_workers: int | None = None) -> dict[str, Any]:
        """Write JSON lines (compressed as asked); returns the run's statistics (``curation_stats.json``)."""
        fmt = {None: "jsonl", "gzip": "jsonl.gz", "zstd": "jsonl.zst"}[compression]
        return self._write(output_path, fmt, write_to_filename, partitions, executor, num_workers)

    def to_parquet(self, output_path: str, write_to_filename: bool = False, partitions: int | None = None,
                   executor: ExecutorConfig | None = None, num_workers: int | None = None) -> dict[str, Any]:
        """Write Parquet; returns the run's statistics (``curation_stats.json``)."""
        return self._write(output_path, "parquet", write_to_filename, partitions, executor, num_workers)

    def _write(self, output_path: str, fmt: str, write_to_filename: bool, partitions: int | None, executor: ExecutorConfig | None,
               num_workers: int | None) -> dict[str, Any]:
        if write_to_filename and self.filename_field is None:
            raise ValueError("write_to_filename needs each record's shard name: read the dataset with add_filename=True")
        config = CurationConfig(
            sources=list(self.sources), output=CurationOutput(output_path, fmt, write_to_filename, partitions, source_dirs=False),
            stages=list(self.stages), blend=self.blend, shuffle=self.shuffle, filename_field=self.filename_field, on_error=self.on_error,
            executor=executor or LocalExecutorConfig(), num_workers=num_workers)
        return run_curation(config)


def blend_datasets(target_size: int, datasets: list[DocumentDataset], weights: list[float], seed: int | None = None) -> DocumentDataset:
    """An offline blend: dataset ``i`` gives ``ceil(target_size * w_i / sum w)`` documents, repeating one that has
    fewer (NeMo Curator's ``blend_datasets``); with a seed, the partial copy or cut is a seeded sample (``blend.py``)."""
    if len(datasets) != len(weights):
        raise ValueError(f"blend_datasets: {len(datasets)} datasets but {len(weights)} weights")
    if not datasets:
        raise ValueError("blend_datasets: give at least one dataset")
    stages = {ds.stages for ds in datasets}
    if len(stages) > 1:
        raise ValueError("blend_datasets: the datasets carry different stages; blend datasets with the same stages, or write each "
                         "one out (to_json) and blend what was written")
    for option, attribute in (("add_filename", "filename_field"), ("on_error", "on_error")):
        if len({getattr(ds, attribute) for ds in datasets}) > 1:
            raise ValueError(f"blend_datasets: the datasets were read with different {option} "
                             f"({[getattr(ds, attribute) for ds in datasets]}), and a blend reads every one alike; read them with the same "
                             f"{option}")
    if any(ds.blend is not None or ds.shuffle is not None for ds in datasets):
        raise ValueError("blend_datasets: a dataset is already blended or shuffled; blend the datasets it was made of")
    sources = []
    for i, ds in enumerate(datasets):
        for source in ds.sources:
            sources.append(dataclasses.replace(source, name=f"{i}:{source.name}") if len(datasets) > 1 else source)
    if len(sources) != len(datasets):
        raise ValueError("blend_datasets: a dataset that is itself a blend of several sources cannot be blended again")
    blend = BlendConfig(target_size, {s.name: float(w) for s, w in zip(sources, weights, strict=True)}, seed)
    return dataclasses.replace(datasets[0], sources=tuple(sources), blend=blend)


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """A seeded global shuffle of a dataset (NeMo Curator's ``Shuffle``): ``Shuffle(seed=42)(dataset)``."""

    seed: int = 0
    buffer_bytes: int = 256 << 20

    def __call__(self, dataset: DocumentDataset) -> DocumentDataset:
        if dataset.shuffle is not None:
            raise ValueError("the dataset is already shuffled")
        return dataclasses.replace(dataset, shuffle=ShuffleConfig(self.seed, self.buffer_bytes))


def _is_directory(url: str) -> bool:
    fs, path = url_to_fs(url)
    return fs.isdir(path)


def _shards_in(directory: str, suffixes: tuple[str, ...]) -> list[str]:
    """The files of ``directory`` ending in each of ``suffixes`` in turn, each group in name order, less what an earlier
    curation kept there (``listing.is_curation_bookkeeping``: ``curation_stats.json`` is no shard): a step reads the
    directory the step before it wrote."""
    fs, path = url_to_fs(directory)
    found = [name for suffix in suffixes for name in sorted(fs.glob(posixpath.join(glob.escape(path), f"*{suffix}")))
             if not is_curation_bookkeeping(posixpath.basename(name))]
    return [fs.unstrip_protocol(name) for name in found] if "://" in directory else found
