"""Fields of Levanter's data configs that change nothing in tokenmix, accepted so that Levanter YAMLs load as they are.

Each is said once in the log, with why it has no effect here; none is dropped silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheOptions:
    """Levanter's ``cache_options``: how its cache builder groups shards, batches documents and flushes to storage."""

    num_shard_groups: int | None = 128
    target_size_per_flush: int | str = "512MB"
    batch_size: int = 128


def note_cache_options(options: CacheOptions | None) -> None:
    """Say, once per config that sets them, why Levanter's cache options change nothing here."""
    if options is None:
        return
    logger.info(
        "cache_options %s (Levanter's) are not used: tokenmix's builder works on chunks of build.chunk_bytes of input "
        "within and across shards (not on groups of shards or batches of documents), keeps listed-shard order, bounds its "
        "memory by the chunks in flight and commits every build.commit_interval_s", options
    )
