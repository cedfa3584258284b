"""A Hugging Face ``datasets`` split read as one shard, resumable at an example index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tokenmix.sources.shards import (
    DEFAULT_CHUNK_BYTES,
    ChunkBuffer,
    RawChunk,
    ShardReadError,
    approx_size,
    chunked,
)


def available_splits(dataset_id: str, name: str | None) -> list[str]:
    """The split names a Hugging Face dataset (hub id or local directory) defines."""
    import datasets

    return list(datasets.get_dataset_split_names(dataset_id, name))


class HfDatasetShard:
    """One split of a Hugging Face dataset (hub id or local dataset directory), in example order."""

    verified_at_end = False
    """``datasets`` reads the files: no checksum of theirs is checked here, at the end or before."""

    def __init__(self, dataset_id: str, name: str | None, split: str, stream: bool = True):
        self.dataset_id = dataset_id
        self.config_name = name
        self.split = split
        self.stream = stream
        self.name = f"hf://{dataset_id}" + (f"/{name}" if name else "") + f"/{split}"

    def size_bytes(self) -> int | None:
        return None

    def identity(self) -> dict[str, Any] | None:
        """None: a Hugging Face dataset is named by id, config and split, which the source config already fixes."""
        return None

    def position_label(self, position: int) -> str:
        return f"{self.name} example {position}"

    def read(self, start: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[RawChunk]:
        import datasets

        try:
            ds = datasets.load_dataset(self.dataset_id, self.config_name, split=self.split, streaming=self.stream)
        except FileNotFoundError as e:
            raise ShardReadError(self.name, start, "missing_file", str(e)) from e
        except Exception as e:  # datasets raises many unrelated types for an unusable dataset
            raise ShardReadError(self.name, start, "unreadable_file", f"{type(e).__name__}: {e}") from e
        if start:
            ds = ds.skip(start) if self.stream else ds.select(range(start, len(ds)))
        position = start
        try:
            for chunk in chunked((dict(example) for example in ds), approx_size, ChunkBuffer(start, chunk_bytes), lambda: 0):
                position = chunk.start + len(chunk.records)
                yield chunk
        except Exception as e:  # a streamed split reads its files as it goes: their failures come here, of as many types
            raise ShardReadError(self.name, position, "unreadable_file", f"{type(e).__name__}: {e}") from e
