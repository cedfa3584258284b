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

import numpy as np

from tokenmix.cache.builder import BuildOptions, CacheBuilder
from tokenmix.cache.progress import TqdmProgress
from tokenmix.cache.reader import TokenCache
from tokenmix.cache.store import join_location
from tokenmix.datasets.base import Dataset
from tokenmix.datasets.batch_schedule import BatchSchedule
from tokenmix.datasets.holdout import held_out_documents, kept_documents
from tokenmix.datasets.mixture import STOP_STRATEGIES, MixtureDataset, normalize_schedule
from tokenmix.datasets.order import check_shuffle
from tokenmix.datasets.packed import PackedDataset
from tokenmix.datasets.packing import LongDocuments, check_packing
from tokenmix.datasets.permutation import derive_key
from tokenmix.datasets.token_seq import TokenSeqDataset
from tokenmix.formats.encoder import PRETOKENIZED_KEY, EncoderSpec, format_context, token_dtype
from tokenmix.formats.text import LmDatasetFormatBase, TextLmDatasetFormat
from tokenmix.formats.tokenizer import describe_tokenizer, load_tokenizer
from tokenmix.sources.hf import HfDatasetShard, available_splits
from tokenmix.sources.shards import FileShard, Shard
from tokenmix.sources.urls import expand_urls

logger = logging.getLogger(__name__)

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
    packing: PackingConfig | None = None
    """Pack whole documents into examples. Unset: supervised and chat sources pack (Levanter's ``format.pack``,
    true by default; false packs one document per example), text and fim sources cut their token stream."""

    def __post_init__(self) -> None:
        if self.id is not None and (self.train_urls or self.validation_urls):
            raise ValueError(f"source {self.id!r}: give either `id` (Hugging Face) or `train_urls`/`validation_urls`, not both")

    def packing_options(self) -> PackingConfig | None:
        """How this source's examples are packed, or None when they are windows of its token stream."""
        if self.packing is not None:
            return self.packing
        pack = getattr(self.format, "pack", None)
        if pack is None:
            return None
        return PackingConfig() if pack else PackingConfig(max_segments_per_example=1)

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
        special = fmt.adds_special_tokens  # a chat template places its own
        use_bos = special and (info.adds_bos if self.enforce_bos is None else self.enforce_bos)
        use_eos = special and (self.enforce_eos or info.adds_eos)
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
            special_tokens=info.special_tokens,
            chat_template=info.chat_template,
        )
        try:
            fmt.bind(format_context(spec, load_tokenizer(self.tokenizer).backend_tokenizer.token_to_id))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        identity = {
            "tokenizer_fingerprint": info.fingerprint,
            "vocab_size": info.vocab_size,
            "format": fmt.identity(),
            "bos_id": spec.bos_id,
            "eos_id": spec.eos_id,
            "dtype": spec.dtype,
            "pretokenized_key": PRETOKENIZED_KEY,
        }
        if fmt.masks_loss:
            identity["loss_spans"] = True
        return spec, identity

    def pad_id(self) -> int:
        """The id packed examples are padded with: the tokenizer's pad token, else its EOS, else 0 (padding is never trained on)."""
        if not self.tokenizer:
            raise ValueError("`tokenizer` is not set; give a hub name or a local tokenizer directory")
        info = describe_tokenizer(self.tokenizer)
        return next((i for i in (info.pad_id, info.eos_id) if i is not None), 0)


@dataclass(frozen=True)
class LMMixtureDatasetConfig(TokenizationConfig):
    """Named sources sharing a tokenizer and a cache directory, mixed by weight into a training set."""

    configs: dict[str, LMDatasetSourceConfig] = field(default_factory=dict)
    cache_dir: str = "cache/"
    build: BuildOptions = field(default_factory=BuildOptions)
    train_weights: dict[str, float] | list[tuple[int, dict[str, float]]] = field(default_factory=dict)
    """A weight per source, or ``[[start_step, {source: weight}], ...]`` stages (steps, not examples);
    missing sources weigh 0, a source with weight 0 everywhere is evaluation-only; empty: equal weights."""
    batch_size: int | list[tuple[int, int]] | None = None
    """Training batch size, or a ramp ``[[start_step, batch_size], ...]`` as the loader takes it; turns stage start
    steps into example indices (needed with stages), through the same schedule the loader uses."""
    mixture_block_size: int = 2048
    """Examples per block; every block holds its exact per-source counts."""
    shuffle: bool | int = True
    """Per-source order: true = full shuffle per epoch, false = in order, an int = shuffle within eras of that many."""
    stop_strategy: str = "restart"
    """restart (sources loop, new order each epoch), first_exhausted or all_exhausted."""
    seed: int = 0
    num_validation_sequences: dict[str, int] | None = None
    """Per source without validation URLs: hold out documents holding this many ``seq_len`` sequences."""
    validation_fraction: dict[str, float] | None = None
    """Per source without validation URLs: hold out this fraction of its tokens (whole documents)."""

    def __post_init__(self) -> None:
        names = list(self.configs)
        if self.stop_strategy not in STOP_STRATEGIES:
            raise ValueError(f"stop_strategy: expected one of {STOP_STRATEGIES}, got {self.stop_strategy!r}")
        check_shuffle(self.shuffle, "mixture config")
        self.batch_schedule()  # refuses a bad ramp, naming `batch_size`
        if self.train_weights:
            normalize_schedule(self._weights_in_steps(), names)
        if isinstance(self.train_weights, list) and len(self.train_weights) > 1 and not self.batch_size:
            raise ValueError("train_weights has stages given in steps: set `batch_size` so they can be turned into examples")
        for field_name in ("num_validation_sequences", "validation_fraction"):
            for name, value in (getattr(self, field_name) or {}).items():
                if name not in self.configs:
                    raise ValueError(f"{field_name}: unknown source {name!r}; the config defines {sorted(names)}")
                if self.configs[name].validation_urls or self.configs[name].id is not None:
                    raise ValueError(f"{field_name}[{name!r}]: the source has its own validation split; remove it from {field_name}")
                limit = " and below 1" if field_name == "validation_fraction" else ""
                if not value > 0 or (limit and value >= 1):
                    raise ValueError(f"{field_name}[{name!r}] must be positive{limit}, got {value}")

    def sources(self) -> dict[str, LMDatasetSourceConfig]:
        return dict(self.configs)

    def cache_location(self, name: str, split: str) -> str:
        source = self.configs[name]
        return join_location(source.cache_dir, split) if source.cache_dir else join_location(self.cache_dir, name, split)

    def _weights_in_steps(self) -> dict[str, float] | list[tuple[int, dict[str, float]]]:
        if isinstance(self.train_weights, dict):
            return self.train_weights
        return [(int(step), dict(w)) for step, w in self.train_weights]

    def batch_schedule(self) -> BatchSchedule | None:
        """The batch sizes by step (``batch_size``), or None when it is not set."""
        if self.batch_size is None:
            return None
        spec = self.batch_size if isinstance(self.batch_size, int) else [tuple(stage) for stage in self.batch_size]
        return BatchSchedule.of(spec)

    def weight_schedule(self) -> list[tuple[int, dict[str, float]]]:
        """The weight stages with starts in example indices: the first example of each stage's start step."""
        weights = self._weights_in_steps() or {name: 1.0 for name in self.configs}
        stages = normalize_schedule(weights, list(self.configs))
        schedule = self.batch_schedule() or BatchSchedule.constant(1)
        return [(schedule.offset(step), w) for step, w in stages]

    def _examples(self, name: str, cache: TokenCache, seq_len: int, source_id: int, documents: np.ndarray | None = None) -> Dataset:
        """A source's examples: packed documents, or windows of its token stream (see ``packing_options``)."""
        packing = self.configs[name].packing_options()
        if packing is None:
            return TokenSeqDataset(cache, seq_len, source_id, documents=documents)
        return PackedDataset(
            cache, seq_len, source_id, pad_id=self.pad_id(), max_segments_per_example=packing.max_segments_per_example,
            long_documents=packing.long_documents, shuffle=packing.shuffle, key=packing.seed, documents=documents,
        )

    def _train_dataset(self, name: str, seq_len: int, source_id: int) -> Dataset:
        cache = open_cache(self, name, "train")
        held = self._held_out(name, cache, seq_len)
        if held is None:
            return self._examples(name, cache, seq_len, source_id)
        return self._examples(name, cache, seq_len, source_id, kept_documents(cache.num_rows(), held))

    def _held_out(self, name: str, cache: TokenCache, seq_len: int) -> np.ndarray | None:
        """Rows held out of a training cache for validation, or None when the source holds none out."""
        sequences = (self.num_validation_sequences or {}).get(name)
        fraction = (self.validation_fraction or {}).get(name)
        if sequences is None and fraction is None:
            return None
        if not cache.is_finished():
            logger.info("%s: waiting for the cache to finish: holding out validation documents needs all of them", cache.location)
            cache.wait_until_finished()
        bounds = cache.row_bounds(0, cache.num_rows())
        wanted = max(sequences * seq_len if sequences else 0, int(np.ceil(fraction * bounds[-1])) if fraction else 0)
        # keyed by the source name alone: every run and seed validates on the same documents
        return held_out_documents(np.diff(bounds), wanted, derive_key("holdout", name))

    def train_set(self, seq_len: int, key: int | None = None) -> MixtureDataset:
        """The training mixture of ``seq_len``-token examples; ``key`` overrides the config's ``seed``."""
        schedule = self.weight_schedule()
        training = [n for n in self.configs if any(w.get(n, 0) > 0 for _, w in schedule)]
        datasets = {n: self._train_dataset(n, seq_len, i) for i, n in enumerate(self.configs) if n in training}
        weights = [(start, {n: w.get(n, 0.0) for n in datasets}) for start, w in schedule]
        return MixtureDataset(
            datasets,
            weights if len(weights) > 1 else weights[0][1],
            block_size=self.mixture_block_size,
            seed=self.seed if key is None else int(np.asarray(key).ravel()[-1]),
            shuffle=self.shuffle,
            stop_strategy=self.stop_strategy,  # type: ignore[arg-type]
        )

    def validation_sets(self, seq_len: int) -> dict[str, Dataset]:
        """Per source, its validation examples: its validation split, or the documents held out of training."""
        out = {}
        for i, (name, source) in enumerate(self.configs.items()):
            if "validation" in source.splits():
                out[name] = self._examples(name, open_cache(self, name, "validation"), seq_len, i)
                continue
            cache = open_cache(self, name, "train")
            held = self._held_out(name, cache, seq_len)
            if held is not None:
                out[name] = self._examples(name, cache, seq_len, i, held)
        return out


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
    with config.build.executor.open(config.build.num_workers) as executor:
        for target in cache_targets(config, sources):
            logger.info("building %s/%s at %s from %d shards", target.source, target.split, target.location, len(target.shards))
            bar = TqdmProgress(f"{target.source}/{target.split}") if progress else None
            info = {"tokenizer": config.tokenizer, "source": target.source, "split": target.split}
            builder = CacheBuilder(target.location, target.shards, target.spec, target.identity, config.build, bar, info, executor)
            results[(target.source, target.split)] = builder.build()
    return results


def open_cache(config: DataConfig, source: str, split: str = "train") -> TokenCache:
    """Open a built (or building) cache of the config, refusing one made with other settings."""
    available = config.sources()
    if source not in available:
        raise KeyError(f"unknown source {source!r}; the config defines {sorted(available)}")
    _, identity = config.encoder_spec(available[source].format, f"source {source!r}")
    return TokenCache(config.cache_location(source, split), expected_identity=identity)
