"""Fields of Levanter's data configs that change nothing in tokenmix, or that older Levanter releases had, accepted so
that Levanter YAMLs load as they are (or refused, naming the release that removed them and what replaces them).

Each accepted one is said once in the log, with why it has no effect here or what it is read as; none is dropped
silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.formats.text import TextLmDatasetFormat

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


def older_source_fields(fmt: LmDatasetFormatBase, text_key: str | None, plaintext: bool | None,
                        rows_per_chunk: int | None) -> LmDatasetFormatBase:
    """A source's format once older Levanter's source fields are read: ``text_key`` (until Levanter's April 2025 change
    #946, the text field, now the text format's ``text_key``), ``plaintext`` (a flag Levanter never read, gone in the
    same change) and ``rows_per_chunk`` (its cache's chunking, gone in its September 2024 cache rework #716)."""
    if plaintext is not None:
        logger.info("plaintext: %s (older Levanter) is accepted: Levanter never read it, and removed it in April 2025 (#946)", plaintext)
    if rows_per_chunk is not None:
        logger.info("rows_per_chunk: %d (older Levanter) is accepted: it set the rows per chunk of Levanter's cache before its "
                    "September 2024 rework (#716), and tokenmix's builder sizes its chunks with build.chunk_bytes", rows_per_chunk)
    if text_key is None:
        return fmt
    if not isinstance(fmt, TextLmDatasetFormat):
        raise ValueError(f"text_key: {text_key!r} (older Levanter) names the text field of text records, but the format is "
                         f"{fmt.get_choice_name(type(fmt))!r}; remove text_key and give the format's own field names")
    if fmt.text_key not in ("text", text_key):
        raise ValueError(f"text_key: {text_key!r} (older Levanter) and format.text_key: {fmt.text_key!r} disagree; keep format.text_key")
    return replace(fmt, text_key=text_key)


def refuse_removed_shard_counts(num_train_shards: int | None, num_val_shards: int | None) -> None:
    """Levanter's single-dataset shard counts, removed before its 1.0 release: refused, since a count of output shards
    has nothing left to mean in any Levanter since."""
    for name, value in (("num_train_shards", num_train_shards), ("num_val_shards", num_val_shards)):
        if value is not None:
            raise ValueError(f"{name}: Levanter 1.0 removed it (June 2023, #174: caches are built on demand from the listed "
                             "shards, however many there are); remove it: tokenmix reads every shard train_urls/validation_urls list")
