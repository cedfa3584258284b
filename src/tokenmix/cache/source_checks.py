"""What each input shard was when a build began reading it, and the checks that it has not changed since.

A shard's identity (size, modification time or ETag) is recorded in the ledger before its first record is read, with a
digest of the records read from its start. A resumed build checks every begun shard (their identities fetched all at
once) and a build checks a shard again at its end: a changed identity whose records read so far read back the same is
taken as the new one; anything else is ``ShardChangedError``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenmix.cache.input_digest import records_unchanged
from tokenmix.cache.ledger import CacheLedger
from tokenmix.sources.shards import Shard

logger = logging.getLogger(__name__)


class SourceChecks:
    """Records and checks the identities of a build's shards in its ledger."""

    def __init__(self, location: str, shards: Sequence[Shard], chunk_bytes: int):
        self.location = location
        self.shards = shards
        self.chunk_bytes = chunk_bytes

    def identity(self, index: int) -> dict[str, Any] | None:
        """Shard ``index``'s identity now, or None when it cannot be had (its absence is reported where it is read)."""
        shard = self.shards[index]
        try:
            return shard.identity()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            logger.warning("%s: cannot tell whether it changed (%s: %s)", shard.name, type(e).__name__, e)
            return None

    def check_begun(self, ledger: CacheLedger) -> bool:
        """Refuse shards whose records read so far changed since the cache read them (identities fetched all at once);
        returns whether a shard's identity changed with its records the same (the ledger then takes the new one)."""
        begun = [i for i, p in enumerate(ledger.shards) if p.source is not None]
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(begun)))) as pool:
            current = list(pool.map(self.identity, begun))
        return any([self.check(ledger, index, identity) for index, identity in zip(begun, current)])

    def check(self, ledger: CacheLedger, index: int, identity: dict[str, Any] | None) -> bool:
        """Go on with a shard whose identity is unchanged (False), or whose records read so far read back the same (True,
        and its identity is updated); else raise ``ShardChangedError``."""
        error = ledger.changed_source(index, identity, self.location)
        if error is None:
            return False
        progress = ledger.shards[index]
        if not records_unchanged(self.shards[index], progress, self.chunk_bytes):
            raise error
        logger.info("%s changed (%s -> %s), but the %d records the cache read from it are the same; going on",
                    progress.name, progress.source, identity, progress.position)
        progress.source = identity
        return True

    def begin(self, ledger: CacheLedger, index: int) -> None:
        """Record what a shard is before its first record is read (and, from its start, a digest of what is read)."""
        progress = ledger.shards[index]
        if progress.source is None:
            progress.source = self.identity(index)
            if progress.position == 0:
                progress.digest = 0
