"""Which input shards still need doing: NeMo Curator's ``get_remaining_files`` and ``get_batched_files``.

An input shard is done when an output shard of the same base name is there (``books_00.jsonl.zst`` in, ``books_00.jsonl``
or ``books_00.parquet`` out). Output shards are only ever given their name when complete (``shard_io.ShardWriter``),
so a shard a killed run was writing is still remaining.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from tokenmix._object_stores import url_to_fs
from tokenmix.curate.shard_io import shard_stem


def shards_in(directory: str, file_type: str) -> list[str]:
    """The files of ``directory`` (local or fsspec URL) ending in ``.<file_type>``, sorted; hidden files left out."""
    fs, path = url_to_fs(directory)
    if not fs.exists(path):
        return []
    suffix = "." + file_type.lstrip(".")
    found = sorted(p for p in fs.ls(path, detail=False) if p.endswith(suffix) and not posixpath.basename(p).startswith("."))
    return [fs.unstrip_protocol(p) if "://" in directory else p for p in found]


def get_remaining_files(input_dir: str, output_dir: str, input_file_type: str, output_file_type: str | None = None,
                        num_files: int = -1) -> list[str]:
    """The shards of ``input_dir`` with no finished shard of the same name in ``output_dir`` (at most ``num_files`` of
    them when that is positive), in sorted order."""
    done = {shard_stem(p) for p in shards_in(output_dir, output_file_type or input_file_type)}
    remaining = [p for p in shards_in(input_dir, input_file_type) if shard_stem(p) not in done]
    return remaining[:num_files] if num_files > 0 else remaining


def get_batched_files(input_dir: str, output_dir: str, input_file_type: str, batch_size: int = 64,
                      output_file_type: str | None = None) -> Iterator[list[str]]:
    """The remaining shards in batches of ``batch_size``, so that a long job runs (and resumes) a batch at a time."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    remaining = get_remaining_files(input_dir, output_dir, input_file_type, output_file_type)
    for start in range(0, len(remaining), batch_size):
        yield remaining[start:start + batch_size]
