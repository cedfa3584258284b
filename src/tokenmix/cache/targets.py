"""One cache a build makes: a source's split, where it goes, what it is read from and encoded with (``config.caches``
lists them from a data config; the builder and ``packs.py`` take them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenmix.formats.encoder_spec import EncoderSpec
    from tokenmix.sources.shards import Shard


@dataclass
class CacheTarget:
    """One cache to build: a source's split."""

    source: str
    split: str
    location: str
    shards: list[Shard]
    spec: EncoderSpec
    identity: dict[str, Any]
    pack_root: str | None = None
    """The directory holding the cache (at ``<pack_root>/<source>/<split>``) and packs of it; None: it is never packed."""
