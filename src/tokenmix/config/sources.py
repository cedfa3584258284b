"""A data source as users write it: shard URLs or a Hugging Face dataset, its format and its packing.

Field names follow Levanter's (``train_urls``, ``validation_urls``, ``id``, ``name``, ``stream``,
``cache_dir``, ``tags``, ``format``) so that Levanter data YAMLs parse unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import tokenmix.formats  # noqa: F401  (registers every format, so `format: {type: ...}` can name any of them)
from tokenmix.config.levanter import older_source_fields
from tokenmix.config.token_file_source import TokenFilesConfig
from tokenmix.datasets.settings import LongDocuments, check_packing, check_shuffle
from tokenmix.formats.base import LmDatasetFormatBase, Pack
from tokenmix.formats.text import TextLmDatasetFormat
from tokenmix.sources.hf import HfDatasetShard, available_splits
from tokenmix.sources.shards import FileShard, Shard
from tokenmix.sources.urls import expand_urls, urls_from_metadata_files

SPLITS = ("train", "validation")


@dataclass(frozen=True)
class PackingConfig:
    """Packing a source's whole documents into ``seq_len`` examples, instead of cutting its token stream."""

    max_segments_per_example: int | None = 64
    """At most this many documents (segments) in one example (Levanter's default: 64); null for no cap."""
    long_documents: LongDocuments = "truncate"
    """A document longer than ``seq_len``: ``truncate`` (keep its start), ``truncate_start`` (keep its end) or ``split``."""
    shuffle: bool | int = False
    """Document order before packing: false = cache order, true = shuffled (waits for the cache to finish),
    an int = shuffled within eras of that many documents (works on a growing cache)."""
    seed: int = 0
    """Key of the shuffled document order."""

    def __post_init__(self) -> None:
        check_packing(self.max_segments_per_example, self.long_documents)
        check_shuffle(self.shuffle, "packing")


def packing_for(pack: Pack, stream: bool) -> PackingConfig | None:
    """Levanter's ``pack`` as packing: whole documents (at most 64, or ``pack``, a example), one document a example
    (``pad``, or false for formats of separate examples), or None, windows of the token stream (unset, or false for
    a ``stream`` format: text)."""
    if pack is None or (pack is False and stream):
        return None
    if pack is True:
        return PackingConfig()
    if pack is False or pack == "pad":
        return PackingConfig(max_segments_per_example=1)
    if isinstance(pack, int) and pack >= 1:
        return PackingConfig(max_segments_per_example=pack)
    raise ValueError(f"pack must be true, false, pad or a positive number of documents per example, got {pack!r}")


@dataclass(frozen=True)
class LMDatasetSourceConfig:
    """One data source, given by URLs (with brace expansion and globs) or as a Hugging Face dataset."""

    id: str | None = None
    """Hugging Face dataset id or local dataset directory (the HF form)."""
    name: str | None = None
    """Hugging Face dataset configuration name."""
    stream: bool = True
    """Read the HF dataset streaming rather than downloading it whole first."""
    splits: list[str] | None = None
    """HF form (older Levanter): build only these of the dataset's splits; unset builds every split it has."""
    train_urls: list[str] = field(default_factory=list)
    validation_urls: list[str] = field(default_factory=list)
    metadata_files: list[str] | None = None
    """Cerebras' ``metadata_files``: text files listing training shards, one path or URL a line (blank lines and ``#``
    comments skipped; a relative path is taken from the listing file's directory); their shards follow ``train_urls``'."""
    cache_dir: str | None = None
    """Where this source's caches go, instead of ``<mixture cache_dir>/<source name>``."""
    tags: list[str] | None = None
    format: LmDatasetFormatBase = field(default_factory=TextLmDatasetFormat)
    packing: PackingConfig | None = None
    """Pack whole documents into examples. Unset: supervised and chat sources pack (Levanter's ``format.pack``,
    true by default; false packs one document per example), text and fim sources cut their token stream."""
    token_files: TokenFilesConfig | None = None
    """The URLs name token files another stack wrote (Megatron, datatrove, Nanoset), read in place: nothing to build."""
    text_key: str | None = None
    """Older Levanter (until April 2025): the field holding a record's text, now ``format: {type: text, text_key: ...}``;
    read with that meaning."""
    plaintext: bool | None = None
    """Older Levanter (October 2023 to April 2025): a flag Levanter never read; accepted, and logged."""
    rows_per_chunk: int | None = None
    """Older Levanter (until its 1.2 builds of September 2024): rows per chunk of its cache; accepted, and logged."""
    type: Literal["url", "hf"] | None = None
    """Levanter's choice name for a source (its 2025 ``UrlDatasetSourceConfig``/``HfDatasetSourceConfig``, and a
    component's ``source``), which draccus writes into every config it saves; unset, it follows from the fields (``id``
    for ``hf``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", older_source_fields(self.format, self.text_key, self.plaintext, self.rows_per_chunk))
        if self.type == "hf" and self.id is None:
            raise ValueError("source type hf needs `id` (the Hugging Face dataset)")
        if self.type == "url" and self.id is not None:
            raise ValueError("source type url takes train_urls/validation_urls, not `id`; use type: hf")
        if self.id is not None and (self.train_urls or self.validation_urls or self.metadata_files):
            raise ValueError(f"source {self.id!r}: give either `id` (Hugging Face) or `train_urls`/`validation_urls`/"
                             "`metadata_files`, not both")
        if self.metadata_files and self.token_files is not None:
            raise ValueError("metadata_files lists text shards to tokenize; a token_files source names its files in train_urls")
        if self.token_files is not None and self.id is not None:
            raise ValueError(f"source {self.id!r}: token_files are read from train_urls/validation_urls, not from a Hugging Face "
                             "dataset; remove `id` or `token_files`")
        if self.splits is not None:
            if self.id is None:
                raise ValueError("splits: chooses the splits of a Hugging Face dataset (`id:`); a URL source's splits are its "
                                 "train_urls and validation_urls")
            unknown = sorted(set(self.splits) - set(SPLITS))
            if unknown:
                raise ValueError(f"splits: {unknown} are not splits tokenmix builds; choose among {list(SPLITS)}")
        self.packing_options()  # refuses a `pack` that is no number of documents now, not once the caches are built

    def packing_options(self) -> PackingConfig | None:
        """How this source's examples are packed, or None when they are windows of its token stream."""
        if self.packing is not None:
            return self.packing
        pack = getattr(self.format, "pack", None)
        return packing_for(self.format.default_pack if pack is None else pack, isinstance(self.format, TextLmDatasetFormat))

    def urls(self, split: str) -> list[str]:
        """The URL patterns of a split, as written."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return self.train_urls if split == "train" else self.validation_urls

    def shards(self, split: str) -> list[Shard]:
        """The shards of a split, in order (empty when the source has no such split)."""
        if self.id is not None:
            return [HfDatasetShard(self.id, self.name, split, self.stream)]
        urls = expand_urls(self.urls(split))
        if split == "train" and self.metadata_files:
            known = set(urls)
            urls += [u for u in urls_from_metadata_files(self.metadata_files) if u not in known]
        return [FileShard(url) for url in urls]

    def split_names(self) -> list[str]:
        """The splits this source defines (of a Hugging Face dataset: those it has, within ``splits`` when set)."""
        if self.id is not None:
            return [s for s in SPLITS if s in available_splits(self.id, self.name) and (self.splits is None or s in self.splits)]
        return [s for s, urls in (("train", self.train_urls or self.metadata_files), ("validation", self.validation_urls)) if urls]
