"""Building and opening the caches a data config defines (one per source and split), and what a data config is to
them: ``DataConfigBase``, the base of both data configs (``config/mixture.py``), which therefore import this module
and never the other way round."""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenmix.cache.ledger import LEDGER_FILE
from tokenmix.cache.levanter import LEVANTER_LEDGER, built_by_levanter
from tokenmix.cache.options import BuildOptions
from tokenmix.cache.targets import CacheTarget
from tokenmix.config.sources import LMDatasetSourceConfig
from tokenmix.config.token_file_source import check_vocabulary
from tokenmix.config.tokenization import TokenizationConfig

if TYPE_CHECKING:
    from tokenmix.cache.packed_source import PackedSourceCache
    from tokenmix.cache.reader import TokenCache
    from tokenmix.cache.token_files_cache import TokenFilesCache
    from tokenmix.formats.encoder_spec import EncoderSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataConfigBase(TokenizationConfig, abc.ABC):
    """What every data config (a mixture, or a single source) gives its caches: the tokenizer settings, how the caches
    are built, its sources by name and where each one's caches go."""

    build: BuildOptions = field(default_factory=BuildOptions)

    @abc.abstractmethod
    def sources(self) -> dict[str, LMDatasetSourceConfig]:
        """The config's sources by name, in config order."""

    @abc.abstractmethod
    def cache_location(self, name: str, split: str) -> str:
        """Where source ``name``'s cache of ``split`` is."""

    def pack_root(self, name: str) -> str | None:
        """The directory holding source ``name``'s caches (``<root>/<name>/<split>``) and packs of them
        (``<root>/_packs``: ``cache/packs.py``), or None where it is never packed (its caches have a location of their
        own)."""
        return None


def cache_targets(config: DataConfigBase, sources: list[str] | None = None) -> list[CacheTarget]:
    """Every (source, split) cache a config defines, in config order."""
    targets = []
    encoders: dict[Any, tuple[EncoderSpec, dict[str, Any]]] = {}
    available = config.sources()
    unknown = sorted(set(sources or []) - set(available))
    if unknown:
        raise ValueError(f"unknown source(s) {unknown}; the config defines {sorted(available)}")
    for name, source in available.items():
        if sources and name not in sources:
            continue
        if source.token_files is not None:
            logger.info("source %r reads %s token files in place: nothing to build", name, source.token_files.kind)
            continue
        spec, identity = _encoder_of(config, source, name, encoders)
        for split in source.split_names():
            targets.append(CacheTarget(name, split, config.cache_location(name, split), source.shards(split), spec, identity,
                                       config.pack_root(name)))
    return targets


def _encoder_of(config: DataConfigBase, source: LMDatasetSourceConfig, name: str,
                encoders: dict[Any, tuple[EncoderSpec, dict[str, Any]]]) -> tuple[EncoderSpec, dict[str, Any]]:
    """The encoder and identity of a source's caches, made once per distinct format (a thousand sources share a few)."""
    try:
        return encoders[source.format]
    except KeyError:
        made = encoders[source.format] = config.encoder_spec(source.format, f"source {name!r}")
        return made
    except TypeError:  # a format holding something unhashable
        return config.encoder_spec(source.format, f"source {name!r}")


def build_caches(config: DataConfigBase, sources: list[str] | None = None, progress: bool = True) -> dict[tuple[str, str], dict[str, Any]]:
    """Build (or resume, or extend) every cache of the config; returns statistics per (source, split).

    A cache that was finished already is left as it is: its statistics are those of the build that made it, marked
    ``already_built: True``. Many small sources of a split are built together as packs (``build.pack_below_bytes``,
    ``build.pack_min_sources``), each read back as if built alone."""
    from tokenmix.formats.backends import REFERENCE, preload_fast

    targets = cache_targets(config, sources)
    if config.build.tokenizer_backend != REFERENCE:  # the longest step before the first chunk is encoded: begun first
        for tokenizer_json in {target.spec.tokenizer_json for target in targets}:
            preload_fast(tokenizer_json)
    from tokenmix.cache.build_run import build_all  # here: reading a config and opening its caches need no builder
    from tokenmix.cache.builder import CacheBuilder
    from tokenmix.cache.encoding import open_build_executor
    from tokenmix.cache.packs import plan_packs, write_member_records
    from tokenmix.cache.progress import TqdmProgress
    from tokenmix.cache.stats import ALREADY_BUILT

    def alone(target: CacheTarget) -> CacheBuilder:
        bar = TqdmProgress(f"{target.source}/{target.split}") if progress else None
        info = {"tokenizer": config.tokenizer, "source": target.source, "split": target.split}
        return CacheBuilder(target.location, target.shards, target.spec, target.identity, config.build, bar, info, executor)

    plan = plan_packs(targets, config.build)
    with open_build_executor(config.build) as executor:
        builders, keys = [], []
        for target in plan.levanter:
            logger.info("%s/%s: %s holds a cache Levanter built; it is read as it is", target.source, target.split, target.location)
        for target in plan.alone:
            if target.pack_root is None and _built_by_levanter(target.location):  # (the others' ledgers plan_packs read)
                logger.info("%s/%s: %s holds a cache Levanter built; it is read as it is", target.source, target.split, target.location)
                continue
            builders.append(alone(target))
            keys.append((target.source, target.split))
        for pack in plan.packs:
            bar = TqdmProgress(f"{len(pack.sources)} sources/{pack.split}") if progress else None
            builders.append(CacheBuilder(pack.location, pack.shards, pack.targets[pack.sources[0]].spec, pack.identity, config.build, bar,
                                         pack.info(config.tokenizer), executor))
        results = build_all(builders, executor)
        built = {**plan.built, **dict(zip(keys, results))}
        for pack, pack_stats in [*zip(plan.packs, results[len(keys) :]),
                                 *((pack, {**pack.stats, ALREADY_BUILT: True}) for pack in plan.finished)]:
            built.update(write_member_records(pack, pack_stats, config.build.chunk_bytes))
        # members left without a record (a shard to try again, rows not one run of the pack) are built alone, as they
        # would have been without packs
        unrecorded = [t for pack in [*plan.packs, *plan.finished] for t in pack.targets.values() if (t.source, t.split) not in built]
        built.update(zip([(t.source, t.split) for t in unrecorded], build_all([alone(t) for t in unrecorded], executor)))
    return {(t.source, t.split): built[(t.source, t.split)] for t in targets if (t.source, t.split) in built}


def _built_by_levanter(location: str) -> bool:
    """Whether ``location`` holds a finished cache Levanter built (``levanter.built_by_levanter``)."""
    from tokenmix.cache.store import JsonDocuments  # here: reading a config imports no tensorstore

    docs = JsonDocuments(location)
    ledger = docs.read(LEDGER_FILE)
    return built_by_levanter(ledger, None if ledger is not None else docs.read(LEVANTER_LEDGER), location)


def open_cache(config: DataConfigBase, source: str, split: str = "train") -> TokenCache | TokenFilesCache | PackedSourceCache:
    """Open a built (or building) cache of the config, refusing one made with other settings.

    A source of token files opens them in place, refused when their declared tokenizer's vocabulary is not the config's;
    a cache Levanter built opens through its own ledger; a source built in a pack opens over the pack, as if built alone."""
    # here: reading a config imports neither tensorstore nor numpy
    from tokenmix.cache.packs import open_cache_at
    from tokenmix.cache.token_files_cache import TokenFilesCache

    available = config.sources()
    if source not in available:
        raise KeyError(f"unknown source {source!r}; the config defines {sorted(available)}")
    token_files = available[source].token_files
    if token_files is not None:
        where = f"source {source!r}"
        identity = token_files.identity(config.tokenizer_name(where), where)
        files = token_files.open(available[source].urls(split), where)
        check_vocabulary(files, identity["vocab_size"], where)
        return TokenFilesCache(files, config.cache_location(source, split), identity)
    identity = {**config.cache_identity(available[source].format, f"source {source!r}"), **config.build.layout_identity()}
    return open_cache_at(config.cache_location(source, split), identity)
