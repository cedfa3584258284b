"""How a cache is built (``build:`` in a data config): workers, error policy, commits, the executor, the lock, the
tokenizer backend, the compression of stored tokens and which small sources are built together as packs. None of these
change a cache's contents, so none enters its identity but the compression, which changes how it is stored and read
(``layout_identity``).

Apart from the builder, so that a config can be read, and its caches opened, without importing the building code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from tokenmix.cache.lock import LockKind
from tokenmix.execution.configs import ExecutorConfig, LocalExecutorConfig
from tokenmix.formats.backends import TokenizerBackend

Compression = Literal["zstd", "lz4", "none"]
PACK_BELOW_BYTES = 16 << 20
"""``build.pack_below_bytes`` for a local cache_dir when the config leaves it null."""


@dataclass(frozen=True)
class BuildOptions:
    """How a cache is built; none of these change the cache's contents."""

    num_workers: int | None = None
    """Chunks tokenized at once: by threads of the driver with ``fastokens`` (which itself spreads each chunk over every
    core), by worker processes with ``tokenizers``; None means one per core. 0 tokenizes in the driver's own thread. With a ray or dask executor
    and no address: the size of the local cluster it starts (ignored when connecting to a cluster)."""
    on_error: Literal["raise", "skip"] = "raise"
    """``raise`` stops at the first bad record naming file, line and reason; ``skip`` counts it. Records a format
    filters out on purpose (``too_long``, ``too_short``) are counted under either policy."""
    chunk_bytes: int = 1 << 20
    """Input bytes per unit of work sent to a worker."""
    commit_interval_s: float = 1.0
    """Seconds between commits; each commit makes the rows so far visible and resumable."""
    log_skipped: int = 5
    """How many skipped records are logged one by one (all are counted)."""
    executor: ExecutorConfig = field(default_factory=LocalExecutorConfig)
    """Where the tokenizing runs: ``{type: local}`` (default), ``{type: ray, address: ...}`` or ``{type: dask, address: ...}``."""
    lock: LockKind = "auto"
    """How one builder per cache is ensured: ``auto`` takes an flock on local paths and a lease object on gs://, s3:// and
    memory://; ``lease`` takes the lease on a local path too (a filesystem shared between machines, such as NFS)."""
    lock_timeout_s: float | None = None
    """How long a build waits while another builder holds the cache: null as long as it takes (it then reuses or resumes
    that build's work), 0 refuses at once naming the holder."""
    lock_lease_s: float = 60.0
    """Lease locks: a holder that has not renewed its lease for this long is taken for dead, and its lease taken over."""
    tokenizer_backend: TokenizerBackend = "auto"
    """Which library encodes text: ``auto`` takes ``fastokens`` (about 20x faster) where it gives Hugging Face
    ``tokenizers``' ids on a sample of the input, else ``tokenizers``; ``fastokens`` or ``tokenizers`` forces one.
    Caches built either way are byte-identical; ``stats.json`` records which was used and why."""
    compression: Compression = "zstd"
    """How stored token chunks are compressed: ``zstd`` (level 1; about 0.62x the bytes of uncompressed uint16 tokens, the
    right choice on object storage and network disks), ``lz4`` (about 0.72x the bytes, decoded 3.7x as fast as zstd:
    for a corpus on local disk larger than memory, where shuffled reads decompress what they touch) or ``none``, for
    local NVMe, where a random read then costs only the bytes it returns and no decompression (docs/benchmarks.md).
    Recorded in the cache's identity: a cache is never read as other than the config says; changing it means a new
    cache_dir or deleting the cache."""

    pack_below_bytes: int | None = None
    """Sources whose input of a split is at most this many bytes are small: where a build has at least
    ``pack_min_sources`` small sources of a split to build, it builds them together as packs (``cache/packs.py``), each
    pack one cache, and each source reads back as if built alone. A cache per source costs about 10 ms of CPU and a
    dozen files beyond encoding (a thousand sources of 70 k tokens: 4x the encoding itself); a pack costs that once.
    null (the default): ``PACK_BELOW_BYTES`` (16 MiB) for a local cache_dir, 0 (never) on object storage, where a
    source of its own cache reads fewer bytes (its examples start where its chunks do, its shard index is in its open
    object; a pack's sources start mid-chunk: 3x the bytes delivered at 64 hosts, docs/benchmarks.md). 0 never packs."""
    pack_min_sources: int = 32
    """How many small sources of a split one build must have to build before it packs them (fewer are built one cache
    each, as always): a few sources gain little from packing, and keep a cache each that tools outside tokenmix can
    open."""

    def layout_identity(self) -> dict[str, Any]:
        """What a cache's identity adds for its storage layout: nothing for the default, so caches made before the
        option existed keep their identity."""
        return {} if self.compression == "zstd" else {"compression": self.compression}

    def __post_init__(self) -> None:
        if self.tokenizer_backend not in get_args(TokenizerBackend):
            raise ValueError(f"build.tokenizer_backend must be one of {', '.join(get_args(TokenizerBackend))}, got {self.tokenizer_backend!r}")
        if self.compression not in get_args(Compression):
            raise ValueError(f"build.compression must be one of {', '.join(get_args(Compression))}, got {self.compression!r}")
        if self.lock_timeout_s is not None and not self.lock_timeout_s >= 0:
            raise ValueError(f"build.lock_timeout_s must be >= 0 seconds, or null to wait as long as it takes; got {self.lock_timeout_s}")
        if (self.pack_below_bytes is not None and self.pack_below_bytes < 0) or self.pack_min_sources < 1:
            raise ValueError(f"build.pack_below_bytes must be >= 0 (0 never packs) or null and build.pack_min_sources >= 1; got "
                             f"{self.pack_below_bytes} and {self.pack_min_sources}")
        if not self.lock_lease_s > 0:
            raise ValueError(f"build.lock_lease_s must be positive (seconds), got {self.lock_lease_s}")
        if self.num_workers is not None and self.num_workers < 0:
            raise ValueError(f"build.num_workers must be at least 0 (0 tokenizes in the driver's thread) or null (one per core), "
                             f"got {self.num_workers}")
        if self.num_workers == 0 and not isinstance(self.executor, LocalExecutorConfig):
            raise ValueError(
                f"build.num_workers: 0 tokenizes in the driver, which build.executor.type "
                f"{ExecutorConfig.get_choice_name(type(self.executor))!r} cannot do; leave num_workers unset or set executor.type: local"
            )
