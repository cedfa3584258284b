"""Newer Levanter's mixture schema (``LmDataConfig.components``), read with Levanter's meaning.

A component is ``cached`` (the default: a ``source`` with ``type: url`` or ``type: hf``, or none for a cache that
already exists, plus the component's own ``format``, ``pack``, ``cache_dir`` and ``tags``), ``hierarchical_cached``
(child components mixed by their own ``train_weights`` into one top-level component) or ``direct`` (datasets made in
Python, which a YAML file cannot hold). They resolve into the older schema's named sources (``configs``): a cached
component is one source; a hierarchical one is a source ``parent/child`` per child (its cache where Levanter keeps it,
``<cache_dir>/parent/child``), each weighing the parent's weight times the child's share, so every child gets the share
of the examples Levanter's nested mixture gives it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import draccus

from tokenmix.config.sources import LMDatasetSourceConfig
from tokenmix.datasets.settings import BlockShuffle, is_weight
from tokenmix.formats.base import LmDatasetFormatBase, Pack
from tokenmix.formats.text import TextLmDatasetFormat

logger = logging.getLogger(__name__)

Weights = dict[str, float] | list[tuple[int, dict[str, float]]]


@dataclass(frozen=True)
class DatasetComponentBase(draccus.ChoiceRegistry):
    """One entry of ``components``, chosen with ``type:`` (``cached`` by default)."""

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "cached"


@DatasetComponentBase.register_subclass("cached")
@dataclass(frozen=True)
class CachedComponent(DatasetComponentBase):
    """A cache built from a source (or, without one, a cache that exists already)."""

    source: LMDatasetSourceConfig | None = None
    """Levanter's ``url`` (``train_urls``, ``validation_urls``) or ``hf`` (``id``, ``name``, ``stream``, ``splits``) source,
    with its ``type``."""
    cache_dir: str | None = None
    """Where the component's caches go (``<cache_dir>/<split>``), instead of ``<mixture cache_dir>/<name>``."""
    format: LmDatasetFormatBase = field(default_factory=TextLmDatasetFormat)
    """The records' format. Levanter builds with this one, not the source's."""
    pack: Pack = None
    """Levanter's ``pack``, overriding the format's: true packs (at most 64 documents a example, or this many), false
    cuts a text stream into windows; unset follows the format (text: windows, chat: packed)."""
    tags: list[str] | None = None
    """Names the component's validation loss is also reported under (with its own name)."""
    split: str = "validation"
    """Accepted: Levanter's data loading does not read it either."""
    shuffle: bool | int | None = None
    """Set by marin's DPO configs (``dpo_tiny_gpt2.yaml``), though no Levanter release defines it on a component: the
    order of this component's examples, which tokenmix takes from the config's ``shuffle`` (the two must agree)."""


@DatasetComponentBase.register_subclass("hierarchical_cached")
@dataclass(frozen=True)
class HierarchicalComponent(DatasetComponentBase):
    """Child components mixed by ``train_weights`` into one top-level component."""

    components: dict[str, CachedComponent] = field(default_factory=dict)
    train_weights: dict[str, float] = field(default_factory=dict)
    token_counts: dict[str, int] | None = None
    """Levanter sizes children from these before opening them; tokenmix reads sizes from the caches, so they are only
    checked to cover every child."""
    tags: list[str] | None = None

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("a hierarchical_cached component needs at least one child in its `components`")
        unknown = sorted(set(self.train_weights) - set(self.components))
        if unknown:
            raise ValueError(f"train_weights names {unknown}, which are not among its components {sorted(self.components)}")
        if self.token_counts is not None and set(self.components) - set(self.token_counts):
            raise ValueError(f"token_counts must cover every child, missing {sorted(set(self.components) - set(self.token_counts))}")
        if not any(w > 0 for w in self.train_weights.values()):
            raise ValueError("a hierarchical_cached component needs a positive train_weight for at least one child")


@DatasetComponentBase.register_subclass("direct")
@dataclass(frozen=True)
class DirectComponent(DatasetComponentBase):
    """Levanter's programmatic component: datasets made in Python."""

    datasets: Any = None
    tags: list[str] | None = None

    def __post_init__(self) -> None:
        raise ValueError("a `direct` component holds datasets made in Python, which a config file cannot: build a "
                         "tokenmix.MixtureDataset of your datasets in Python instead, or give this component a `source`")


LEVANTER_BLOCK_SHUFFLE = BlockShuffle(io_block_size=256, window_blocks=512)
"""Newer Levanter's shuffle when a ``components`` config sets none (``DEFAULT_LM_DATA_SHUFFLE``)."""


def components_shuffle(components: dict[str, DatasetComponentBase], shuffle: object) -> object:
    """The order a ``components`` config means: its own ``shuffle``; unset, the one its components all give (they name
    no such field in Levanter, but real configs set it), else newer Levanter's block shuffle. A component asking for
    another order than that is refused, naming it and the fix."""
    cached = [(n, c) for n, c in components.items() if isinstance(c, CachedComponent)]
    cached += [(f"{n}/{k}", c) for n, h in components.items() if isinstance(h, HierarchicalComponent) for k, c in h.components.items()]
    given = [(name, c.shuffle) for name, c in cached if c.shuffle is not None]
    if shuffle is None:
        shuffle = given[0][1] if given else LEVANTER_BLOCK_SHUFFLE
        if given:
            logger.info("component %r: shuffle: %r is read as the config's shuffle, which sets none", given[0][0], shuffle)
    for name, own in given:
        if own != shuffle:
            raise ValueError(f"component {name!r}: shuffle: {own!r} differs from the config's shuffle: {shuffle!r}; "
                             "tokenmix orders every source as the config's `shuffle` says: set it there (data.shuffle) and "
                             "remove it from the components")
    return shuffle


def resolve_components(components: dict[str, DatasetComponentBase], weights: Weights | None, cache_dir: str | None,
                       ) -> tuple[dict[str, LMDatasetSourceConfig], Weights | None]:
    """The sources (``configs``) and weights that ``components`` and their ``train_weights`` mean.

    Hierarchical components become one source per child, named ``parent/child``; the parent's weight in every stage is
    shared among its children in proportion to their weights (children of weight 0 are validation-only).
    """
    sources: dict[str, LMDatasetSourceConfig] = {}
    shares: dict[str, dict[str, float]] = {}
    for name, component in components.items():
        if isinstance(component, HierarchicalComponent):
            for child_name, weight in component.train_weights.items():
                if not is_weight(weight):
                    raise ValueError(f"component {name!r}: train_weights: child {child_name!r} has weight {weight!r}; give it a "
                                     "finite number >= 0 (0 leaves it to validation)")
            total = sum(component.train_weights.values())
            shares[name] = {}
            for child_name, child in component.components.items():
                full = f"{name}/{child_name}"
                tags = (component.tags or []) + (child.tags or [])
                sources[full] = _source(full, replace(child, tags=tags or None), cache_dir)
                shares[name][full] = component.train_weights.get(child_name, 0.0) / total
        else:
            sources[name] = _source(name, component, cache_dir)  # type: ignore[arg-type]
    if not shares:
        return sources, weights

    def expand(stage: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, weight in stage.items():
            for child, share in shares.get(name, {name: 1.0}).items():
                out[child] = weight * share
        return out

    if isinstance(weights, list):
        return sources, [(start, expand(dict(stage))) for start, stage in weights]
    return sources, expand(weights or dict.fromkeys(components, 1.0))  # unset or empty: the components weigh the same


def _source(name: str, component: CachedComponent, cache_dir: str | None) -> LMDatasetSourceConfig:
    """A cached component as a source: its URLs or dataset, with the component's format, packing, cache and tags."""
    source = component.source or LMDatasetSourceConfig()
    default_format = TextLmDatasetFormat()
    if source.format != default_format and component.format == default_format:
        logger.warning("component %r: its source's format %r is not used: Levanter builds a component with the component's "
                       "own `format` (text when unset); move `format` up to the component", name, source.format)
    if source.cache_dir is not None and component.cache_dir is None:
        logger.warning("component %r: its source's cache_dir is not used: Levanter keeps a component's caches in the "
                       "component's `cache_dir`, else <cache_dir>/%s; move cache_dir up to the component", name, name)
    if component.split != "validation":
        logger.info("component %r: split %r is accepted; Levanter's data loading does not read it either", name, component.split)
    if component.pack is not None and not hasattr(component.format, "pack"):
        raise ValueError(f"component {name!r}: pack is not available for format {type(component.format).__name__}; remove it")
    fmt = component.format if component.pack is None else replace(component.format, pack=component.pack)
    if component.source is None:
        logger.info("component %r has no source: its caches must exist already (under %s)", name, component.cache_dir or f"{cache_dir}/{name}")
    try:
        return LMDatasetSourceConfig(
            id=source.id, name=source.name, stream=source.stream, splits=source.splits, train_urls=list(source.train_urls),
            validation_urls=list(source.validation_urls), cache_dir=component.cache_dir, tags=component.tags or source.tags,
            format=fmt, packing=source.packing,
        )
    except ValueError as e:  # what the component's own fields make of its source (its pack): named by the component
        raise ValueError(f"component {name!r}: {e}") from None
