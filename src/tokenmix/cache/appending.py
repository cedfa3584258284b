"""What each encoded chunk and each shard's end add to a cache, in listed-shard order, whichever executor encoded them.

A chunk adds its rows (``commits.py`` writes them) and its account to the shard's progress in the ledger (records,
tokens, characters, the digest of what was read), and its bad records are counted and logged, or stop the build under
``on_error: raise``. A shard's end finishes the shard: an unreadable, empty or (since it was begun) changed shard is
skipped with its reason, or stops the build; the rows of a shard verified only at its end whose checksums failed there
(or were never reached) are taken back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tokenmix.cache.commits import CacheCommits
from tokenmix.cache.ledger import CHECKED_END_REASONS, RETRIED_REASONS, CacheLedger
from tokenmix.cache.options import BuildOptions
from tokenmix.cache.progress import BuildProgress
from tokenmix.cache.source_checks import SourceChecks
from tokenmix.formats.base import FILTER_REASONS
from tokenmix.formats.encoder import EncodedChunk
from tokenmix.sources.shards import DIGEST_MASK, Shard, ShardReadError

logger = logging.getLogger(__name__)


class BadInputError(ValueError):
    """A bad record or unreadable shard under ``on_error: raise``."""


@dataclass
class ShardEnd:
    """A shard read to its end (``error`` None), or until it could not be read further."""

    index: int
    error: ShardReadError | None


class ShardAppender:
    """Appends one build's encoded chunks and shard ends, in listed-shard order, to its ledger and arrays."""

    def __init__(self, shards: Sequence[Shard], options: BuildOptions, commits: CacheCommits, sources: SourceChecks,
                 progress: BuildProgress | None):
        self.shards = shards
        self.options = options
        self.commits = commits
        self.sources = sources
        self.progress = progress
        self._skips_logged = 0

    @property
    def ledger(self) -> CacheLedger:
        return self.commits.ledger

    def chunk(self, index: int, chunk: EncodedChunk) -> None:
        """Append a chunk of shard ``index``: its rows, its account, its bad records."""
        if self.shards[index].verified_at_end:
            self.commits.hold(index)
        if chunk.skipped:
            self._on_skipped(index, chunk)
        self.commits.write(index, chunk)
        shard = self.ledger.shards[index]
        shard.position = chunk.start + chunk.positions
        shard.records += chunk.records
        shard.rows += len(chunk.lengths)
        shard.tokens += len(chunk.tokens)
        shard.chars += chunk.chars
        shard.utf8_bytes += chunk.utf8_bytes
        shard.loss_tokens += chunk.loss_tokens
        if shard.digest is not None:
            shard.digest = (shard.digest + chunk.source_digest) & DIGEST_MASK
        if self.progress is not None:
            self.progress.update(len(chunk.lengths), len(chunk.tokens), chunk.consumed_bytes)

    def _on_skipped(self, index: int, chunk: EncodedChunk) -> None:
        shard_name = self.shards[index].name
        errors = [s for s in chunk.skipped if s[1] not in FILTER_REASONS]
        if errors and self.options.on_error == "raise":
            before = "this chunk"
            if self.commits.holding:
                self.commits.take_back()
                before = "this shard (a compressed shard's rows are kept only once it was read and checked to its end)"
            self.commits.commit()
            position, reason, detail = errors[0]
            raise BadInputError(
                f"{self.shards[index].position_label(position)}: {reason}: {detail}\n"
                f"The cache at {self.commits.location} keeps the {self.ledger.rows} rows before {before}. Fix the input, or set "
                "on_error: skip (CLI: --build.on_error skip) to count and skip bad records."
            )
        for position, reason, detail in chunk.skipped:
            self.ledger.shards[index].skip(reason)
            if self._skips_logged < self.options.log_skipped:
                self._skips_logged += 1
                logger.warning("skipping %s: %s: %s", self.shards[index].position_label(position), reason, detail)
        if self._skips_logged == self.options.log_skipped:
            self._skips_logged += 1
            logger.warning("further skipped records in %s are counted in the statistics, not logged", shard_name)

    def keeps_no_row(self, end: ShardEnd) -> bool:
        """Whether a shard ends in a failure that refuses all its rows: one verified only at its end whose checksums
        failed there or were never reached."""
        return end.error is not None and self.shards[end.index].verified_at_end and end.error.reason not in CHECKED_END_REASONS

    def shard_end(self, end: ShardEnd) -> None:
        """Finish a shard: keep or take back its rows, and skip (or raise on) an unreadable, empty or changed shard."""
        name = self.shards[end.index].name
        refused = self.keeps_no_row(end)
        if refused and self.commits.holding:
            self.commits.take_back()
        self.commits.release()
        shard = self.ledger.shards[end.index]
        problem = None
        if end.error is not None:
            taken_back = end.error.position - shard.position if refused else 0
            problem = (end.error.reason, f"{name}: {end.error.reason} after {end.error.position} record positions: {end.error.detail}"
                       + (f"; none of the {taken_back} record positions read is kept, as a compressed shard's records are "
                          "trusted only once its checksums passed at its end" if taken_back > 0 else ""))
        elif shard.records == 0:
            problem = ("empty_shard", f"{name}: empty_shard: the shard holds no records")
        else:
            self.sources.check(self.ledger, end.index, self.sources.identity(end.index))  # changed while it was read
        if problem is not None:
            reason, message = problem
            if self.options.on_error == "raise":
                self.commits.commit()
                raise BadInputError(message + "\nFix or remove the shard, or set on_error: skip to count it and go on.")
            retried = reason in RETRIED_REASONS
            logger.warning("skipping %s %s%s", "all of" if refused else "the rest of", message,
                           "; the next build tries it again" if retried else "")
            shard.skip(reason)
            shard.error = message
            shard.retry = reason if retried else None
        shard.finished = True
