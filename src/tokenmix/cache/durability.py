"""Making a build's local writes durable at the steps that need it: one ``syncfs`` shared by the builds that get there
together, instead of two fsyncs per object written.

Tensorstore's file driver fsyncs every object it writes and then its directory: about twenty fsyncs for a small cache
(arrays' metadata, row ends, tokens, ledgers, publications, open object, statistics), each one a wait on the disk and a
system call, which a thousand small sources paid twenty thousand times. A build's own writes are instead made with
those fsyncs off (``store.deferred_sync_context``), and the commit protocol calls ``sync_filesystem`` where what was
written must be durable before the next step may exist: ``syncfs`` of the filesystem holding the cache makes every write
completed before it durable, whichever file it went to.

A build calling it while another ``syncfs`` of the same filesystem runs waits for the next one, which then serves every
caller that arrived meanwhile (a group commit): the caches that the run's setup threads open and finish together share
their barriers. ``syncfs`` is Linux's; elsewhere ``SYNCFS_AVAILABLE`` is false, each write keeps its own fsyncs and the
barrier has nothing left to do.

Barriers are only as safe as per-object fsyncs where the filesystem brings a file replaced by a rename back whole (old
or new) after a power loss: a build rewrites objects that hold committed rows (the ledger, a partial last shard) between
barriers. ``barriers_hold`` says where that is known: btrfs, and ext4 with its journal running, ``auto_da_alloc`` on
(its default) and not ``data=writeback``. Anywhere else (XFS, ext4 without a journal, network filesystems) a build's
writes keep their own fsyncs. ``$TOKENMIX_BUILD_BARRIERS`` (1 or 0) overrides the check.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading


def _load_syncfs() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them
    except OSError:
        return None
    syncfs = getattr(libc, "syncfs", None)
    if syncfs is not None:
        syncfs.argtypes, syncfs.restype = [ctypes.c_int], ctypes.c_int
    return syncfs


_SYNCFS = _load_syncfs()
SYNCFS_AVAILABLE = _SYNCFS is not None
"""Whether this system has ``syncfs`` (Linux): builds then write local files without fsyncs and call barriers."""


class _GroupSync:
    """The barriers of one filesystem: each caller is served by the first ``syncfs`` that starts after it called."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._started = 0
        """Number of syncs started so far (the last one may still be running)."""
        self._done = 0
        """Number of syncs finished so far."""
        self._running = False
        self._errors: dict[int, OSError] = {}
        """The syncs that failed, by number."""

    def sync(self, directory: str) -> None:
        with self._changed:
            mine = self._started + 1  # a sync running now may have begun before our writes completed: not ours
            while self._done < mine:
                if self._running:
                    self._changed.wait()
                    continue
                self._running = True
                self._started += 1
                number = self._started
                self._changed.release()
                try:
                    error = _syncfs(directory)
                finally:
                    self._changed.acquire()
                    self._running = False
                    self._done = number
                    self._changed.notify_all()
                if error is not None:
                    self._errors[number] = error
            error = self._errors.get(mine)
        if error is not None:
            raise error


def _syncfs(directory: str) -> OSError | None:
    """``syncfs`` of the filesystem holding ``directory``; the error, if it failed."""
    assert _SYNCFS is not None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return e
    try:
        if _SYNCFS(fd) != 0:
            errno = ctypes.get_errno()
            return OSError(errno, f"syncfs of the filesystem holding {directory} failed: {os.strerror(errno)}")
        return None
    finally:
        os.close(fd)


_groups: dict[int, _GroupSync] = {}
_groups_lock = threading.Lock()


def can_sync_filesystem() -> bool:
    """Whether ``sync_filesystem`` makes writes durable here (Linux's ``syncfs``), rather than returning at once."""
    return _SYNCFS is not None


def sync_filesystem(directory: str) -> None:
    """Return once every write completed before this call on the filesystem holding ``directory`` is durable (raises
    ``OSError`` when the filesystem reports a failed writeback). Without ``syncfs`` it returns at once: writes are then
    fsynced one by one as they are made."""
    if _SYNCFS is None:
        return
    device = os.stat(directory).st_dev
    with _groups_lock:
        group = _groups.setdefault(device, _GroupSync())
    group.sync(directory)


BARRIERS_ENV = "TOKENMIX_BUILD_BARRIERS"
"""1: a build's local writes are made durable by barriers wherever ``syncfs`` exists; 0: each by its own fsyncs."""


def barriers_hold(directory: str) -> bool:
    """Whether a build writing under ``directory`` (it need not exist yet) makes its writes durable by barriers
    (``sync_filesystem``) rather than each by its own fsyncs: where ``syncfs`` exists and the filesystem brings a file
    replaced by a rename back whole after a power loss, or as ``$TOKENMIX_BUILD_BARRIERS`` says."""
    if _SYNCFS is None:
        return False
    forced = os.environ.get(BARRIERS_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    while not os.path.exists(directory):
        parent = os.path.dirname(directory)
        if parent == directory:
            return False
        directory = parent
    device = os.stat(directory).st_dev
    known = _KEEPS_REPLACED_FILES.get(device)
    if known is None:
        known = _KEEPS_REPLACED_FILES[device] = _keeps_replaced_files(device, os.path.realpath(directory))
    return known


_KEEPS_REPLACED_FILES: dict[int, bool] = {}
"""``_keeps_replaced_files`` by device: found once per filesystem, not once per cache directory on it."""


def _keeps_replaced_files(device: int, path: str) -> bool:
    """Whether the filesystem (device ``device``) mounted over ``path`` is btrfs, or ext4 whose journal runs (an entry in
    ``/proc/fs/jbd2``) with ``auto_da_alloc`` and without ``data=writeback``."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return False
    best: list[str] | None = None
    for fields in mounts:
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[4])):
            best = fields
    if best is None or "-" not in best:
        return False
    after = best[best.index("-") + 1 :]
    kind, options = after[0], set(best[5].split(",")) | set(after[2].split(",") if len(after) > 2 else ())
    if kind == "btrfs":
        return True
    if kind not in ("ext4", "ext3") or "noauto_da_alloc" in options or "data=writeback" in options:
        return False
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"))
    return os.path.isdir(f"/proc/fs/jbd2/{name}-8")
