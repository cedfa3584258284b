"""Draccus configs: data sources and mixtures as users write them in YAML, and what they build.

Field names follow Levanter's (``train_urls``, ``validation_urls``, ``id``, ``name``, ``stream``,
``cache_dir``, ``tags``, ``format``, ``configs``, ``tokenizer``, ``enforce_eos``) so that Levanter
data YAMLs parse unchanged. These classes turn configuration into the objects of ``sources``,
``formats`` and ``cache``; nothing below imports them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tokenmix.cache.builder import BuildOptions, CacheBuilder
from tokenmix.cache.pool import EncoderPool
from tokenmix.cache.progress import TqdmProgress
from tokenmix.cache.reader import TokenCache
from tokenmix.cache.store import join_location
from tokenmix.formats.encoder import PRETOKENIZED_KEY, EncoderSpec, token_dtype
from tokenmix.formats.text import LmDatasetFormatBase, TextLmDatasetFormat
from tokenmix.formats.tokenizer import describe_tokenizer
from tokenmix.sources.hf import HfDatasetShard, available_splits
from tokenmix.sources.shards import FileShard, Shard
from tokenmix.sources.urls import expand_urls

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")


@dataclass(frozen=True)
class LMDatasetSourceConfig:
    """One data source, given by URLs (with brace expansion and globs) or as a Hugging Face dataset."""

    id: str | None = None
    """Hugging Face dataset id or local dataset directory (the HF form)."""
    name: str | None = None
    """Hugging Face dataset configuration name."""
    stream: bool = True
    """Read the HF dataset streaming rather than downloading it whole first."""
    train_urls: list[str] = field(default_factory=list)
    validation_urls: list[str] = field(default_factory=list)
    cache_dir: str | None = None
    """Where this source's caches go, instead of ``<mixture cache_dir>/<source name>``."""
    tags: list[str] | None = None
    format: LmDatasetFormatBase = field(default_factory=TextLmDatasetFormat)

    def __post_init__(self) -> None:
        if self.id is not None and (self.train_urls or self.validation_urls):
            raise ValueError(f"source {self.id!r}: give either `id` (Hugging Face) or `train_urls`/`validation_urls`, not both")

    def shards(self, split: str) -> list[Shard]:
        """The shards of a split, in order (empty when the source has no such split)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if self.id is not None:
            return [HfDatasetShard(self.id, self.name, split, self.stream)]
        urls = self.train_urls if split == "train" else self.validation_urls
        return [FileShard(url) for url in expand_urls(urls)]

    def splits(self) -> list[str]:
        """The splits this source defines."""
        if self.id is not None:
            return [s for s in SPLITS if s in available_splits(self.id, self.name)]
        return [s for s, urls in (("train", self.train_urls), ("validation", self.validation_urls)) if urls]


@dataclass(frozen=True)
class TokenizationConfig:
    """The tokenizer and the special tokens every document gets; part of each cache's identity."""

    tokenizer: str | None = None
    """Hub name or local directory of a Hugging Face tokenizer."""
    enforce_eos: bool = True
    """Append the tokenizer's EOS id to every document."""
    enforce_bos: bool | None = None
    """Prepend BOS to every document; None follows the tokenizer's own habit."""

    def encoder_spec(self, fmt: LmDatasetFormatBase, where: str) -> tuple[EncoderSpec, dict[str, Any]]:
        """The encoder for a format, and the identity a cache made with it records."""
        if not self.tokenizer:
            raise ValueError(f"{where}: `tokenizer` is not set; give a hub name or a local tokenizer directory")
        info = describe_tokenizer(self.tokenizer)
        use_bos = info.adds_bos if self.enforce_bos is None else self.enforce_bos
        use_eos = self.enforce_eos or info.adds_eos
        for wanted, token_id, what in ((use_bos, info.bos_id, "BOS"), (use_eos, info.eos_id, "EOS")):
            if wanted and token_id is None:
                raise ValueError(f"{where}: tokenizer {self.tokenizer!r} has no {what} token; set enforce_{what.lower()}: false")
        spec = EncoderSpec(
            tokenizer_json=info.backend_json,
            format=fmt,
            vocab_size=info.vocab_size,
            bos_id=info.bos_id if use_bos else None,
            eos_id=info.eos_id if use_eos else None,
            dtype=token_dtype(info.vocab_size),
        )
        identity = {
            "tokenizer_fingerprint": info.fingerprint,
            "vocab_size": info.vocab_size,
            "format": fmt.identity(),
            "bos_id": spec.bos_id,
            "eos_id": spec.eos_id,
            "dtype": spec.dtype,
            "pretokenized_key": PRETOKENIZED_KEY,
        }
        return spec, identity


@dataclass(frozen=True)
class LMMixtureDatasetConfig(TokenizationConfig):
    """Named sources sharing a tokenizer and a cache directory."""

    configs: dict[str, LMDatasetSourceConfig] = field(default_factory=dict)
    cache_dir: str = "cache/"
    build: BuildOptions = field(default_factory=BuildOptions)

    def sources(self) -> dict[str, LMDatasetSourceConfig]:
        return dict(self.configs)

    def cache_location(self, name: str, split: str) -> str:
        source = self.configs[name]
        return join_location(source.cache_dir, split) if source.cache_dir else join_location(self.cache_dir, name, split)


@dataclass(frozen=True)
class LMDatasetConfig(LMDatasetSourceConfig, TokenizationConfig):
    """A single source with its tokenizer and cache directory (Levanter's single-dataset form)."""

    cache_dir: str | None = "cache/"
    build: BuildOptions = field(default_factory=BuildOptions)

    def sources(self) -> dict[str, LMDatasetSourceConfig]:
        return {"default": self}

    def cache_location(self, name: str, split: str) -> str:
        return join_location(self.cache_dir or "cache/", split)


DataConfig = LMMixtureDatasetConfig | LMDatasetConfig


@dataclass
class CacheTarget:
    """One cache to build: a source's split."""

    source: str
    split: str
    location: str
    shards: list[Shard]
    spec: EncoderSpec
    identity: dict[str, Any]


def cache_targets(config: DataConfig, sources: list[str] | None = None) -> list[CacheTarget]:
    """Every (source, split) cache a config defines, in config order."""
    targets = []
    available = config.sources()
    unknown = sorted(set(sources or []) - set(available))
    if unknown:
        raise ValueError(f"unknown source(s) {unknown}; the config defines {sorted(available)}")
    for name, source in available.items():
        if sources and name not in sources:
            continue
        spec, identity = config.encoder_spec(source.format, f"source {name!r}")
        for split in source.splits():
            targets.append(CacheTarget(name, split, config.cache_location(name, split), source.shards(split), spec, identity))
    return targets


def build_caches(config: DataConfig, sources: list[str] | None = None, progress: bool = True) -> dict[tuple[str, str], dict[str, Any]]:
    """Build (or resume, or extend) every cache of the config; returns statistics per (source, split)."""
    results = {}
    with EncoderPool(config.build.num_workers) as pool:
        for target in cache_targets(config, sources):
            logger.info("building %s/%s at %s from %d shards", target.source, target.split, target.location, len(target.shards))
            bar = TqdmProgress(f"{target.source}/{target.split}") if progress else None
            info = {"tokenizer": config.tokenizer, "source": target.source, "split": target.split}
            builder = CacheBuilder(target.location, target.shards, target.spec, target.identity, config.build, bar, info, pool)
            results[(target.source, target.split)] = builder.build()
    return results


def open_cache(config: DataConfig, source: str, split: str = "train") -> TokenCache:
    """Open a built (or building) cache of the config, refusing one made with other settings."""
    available = config.sources()
    if source not in available:
        raise KeyError(f"unknown source {source!r}; the config defines {sorted(available)}")
    _, identity = config.encoder_spec(available[source].format, f"source {source!r}")
    return TokenCache(config.cache_location(source, split), expected_identity=identity)
