"""Where records come from: shard URLs expanded in order, and shards read from a record position on.

Local paths and fsspec URLs; ``.jsonl``, ``.json``, ``.parquet``, ``.txt``, optionally ``.gz``/``.zst``;
one split of a Hugging Face dataset as one shard. Records stay raw here: formats parse them.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.sources.hf import HfDatasetShard, available_splits
    from tokenmix.sources.shards import DEFAULT_CHUNK_BYTES, FileShard, PlainText, RawChunk, Shard, ShardReadError
    from tokenmix.sources.token_file_base import TokenFile, TokenFileError
    from tokenmix.sources.token_file_kinds import open_token_files
    from tokenmix.sources.urls import NoShardsError, expand_urls, urls_from_metadata_files

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FileShard",
    "HfDatasetShard",
    "NoShardsError",
    "PlainText",
    "RawChunk",
    "Shard",
    "ShardReadError",
    "TokenFile",
    "TokenFileError",
    "available_splits",
    "expand_urls",
    "open_token_files",
    "urls_from_metadata_files",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
