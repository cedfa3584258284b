"""One builder per cache: a build lock that holds on local disks and on object stores.

Local paths (``flock``): the builder holds an exclusive ``fcntl.flock`` on the cache directory and on
``<cache>/build.lock``. The kernel drops both the instant their holder dies, SIGKILL included, so a killed
builder's lock is free at once and no lock can outlive its holder; the holder writes its host, pid and
start time into the file so that a waiting builder can say whom it waits for. The directory's lock is
what excludes: deleting or replacing ``build.lock`` lets no second builder in. The holder checks before
each commit, and at release, that ``build.lock`` is still the file it locked, and stops
(``LockLostError``) when it was deleted or replaced. ``build.lock`` is never opened through a symbolic
link (one there is refused by name). On release the file is unlinked while still locked; a builder that
locked a file that is no longer at the path (it lost that race) tries again. ``flock`` holds between
processes of one machine; on a filesystem shared between machines (NFS and the like) it may not, and
``build.lock: lease`` uses the lease below instead.

Object stores (gs://, s3://) and ``memory://`` (``lease``): ``<cache>/build.lock`` is a lease object,
created only if absent and renewed every ``lease_s / 4`` by writes conditioned on the storage
generation the holder wrote last (tensorstore's ``if_equal``). A lease whose heartbeat is older than
``lease_s`` (its holder was killed) is taken over by a write conditioned on the generation read, so of
two builders taking over only one wins. A holder that fails to renew (it stalled past its lease and was
taken over) learns it at its next commit, which first reads the lease, and stops (``LockLostError``). What a lease cannot exclude: a
holder frozen for longer than ``lease_s`` (a suspended VM) whose pending data writes land after another
builder took over; heartbeats also assume clocks that agree to well within ``lease_s``.
"""

from __future__ import annotations

import abc
import fcntl
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Literal

from tokenmix._safe_files import UnsafeFileError, open_lock_file
from tokenmix._waiting import poll_until

logger = logging.getLogger(__name__)

LOCK_FILE = "build.lock"
LockKind = Literal["auto", "lease"]


class CacheLockedError(RuntimeError):
    """Another builder holds the cache's build lock; the message names it (host, pid, start time)."""


class FlockUnsupportedError(CacheLockedError):
    """The cache's filesystem takes no ``flock`` locks (a network filesystem): a lease lock is needed there."""


class LockLostError(RuntimeError):
    """This builder's lease on the cache was taken over by another builder; it stopped before its next commit."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a build lock, as written in the lock."""

    host: str
    pid: int
    started: float
    """Unix time at which the holder took the lock."""
    owner: str
    """A random id of the holder (a pid alone is reused)."""
    heartbeat: float = 0.0
    """Unix time of the holder's last renewal (leases only)."""

    @staticmethod
    def me() -> LockHolder:
        now = time.time()
        return LockHolder(os.uname().nodename, os.getpid(), now, os.urandom(16).hex(), now)  # as gethostname(), uuid4()

    @staticmethod
    def parse(data: bytes) -> LockHolder | None:
        try:
            return LockHolder(**json.loads(data))
        except (ValueError, TypeError):  # empty, or written by a builder killed mid-write
            return None

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, building since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))}"


class BuildLock(abc.ABC):
    """Exclusive right to write one cache; ``with build_lock(location): ...``."""

    def __init__(self, location: str, timeout: float | None):
        self.location = location
        self.timeout = timeout
        self.me = LockHolder.me()
        self.holder: LockHolder | None = None
        """The other builder seen holding the lock at the last try."""

    @abc.abstractmethod
    def _try_acquire(self) -> bool:
        """Take the lock if it is free (or stale); False when another builder holds it."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the lock up (and remove it)."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise ``LockLostError`` if this builder no longer holds the lock (called before every commit)."""

    def acquire(self) -> None:
        """Take the lock, waiting up to ``timeout`` seconds (None: for as long as it takes) while another builder holds it."""
        try:
            poll_until(self._try_acquire, self.timeout, self._held_message,
                       lambda: logger.info("%s: waiting for the build lock: %s", self.location, self._held_by()))
        except TimeoutError as e:
            raise CacheLockedError(str(e)) from None

    def _held_by(self) -> str:
        return self.holder.describe() if self.holder else "another builder"

    def _held_message(self) -> str:
        waited = f" after waiting {self.timeout:g} s" if self.timeout else ""
        return (f"cache at {self.location} is being built by {self._held_by()}{waited}. Wait for that build to finish (it may "
                "still be running; the finished cache is then reused), set build.lock_timeout_s to wait longer (null: "
                "as long as it takes), or use another cache_dir.")

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class FlockBuildLock(BuildLock):
    """The build lock of a cache on a local filesystem: ``flock``s the kernel releases when their holder dies."""

    def __init__(self, location: str, path: str, timeout: float | None):
        super().__init__(location, timeout)
        self.path = path
        self._fd: int | None = None
        self._dir_fd: int | None = None

    def _try_acquire(self) -> bool:
        from tokenmix.cache.store import unwritable  # imported where it is used: see build_lock

        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise unwritable(self.location, e) from None
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dir_fd)
            self.holder = self._recorded_holder()
            return False
        except OSError as e:  # a filesystem without flock on directories (NFS and the like)
            os.close(dir_fd)
            raise FlockUnsupportedError(f"cannot lock the cache directory {directory} ({e.strerror or e}): its filesystem does not "
                                        "take flock locks (a network filesystem?); set build.lock: lease") from None
        try:
            fd = open_lock_file(self.path, "build lock")
        except UnsafeFileError:
            os.close(dir_fd)
            raise
        except OSError as e:
            os.close(dir_fd)
            raise unwritable(self.location, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a builder of an older tokenmix locks the file alone
        except BlockingIOError:
            self.holder = LockHolder.parse(os.pread(fd, 1 << 16, 0))
            os.close(fd)
            os.close(dir_fd)
            return False
        if not self._still_at_path(fd):
            os.close(fd)  # locked a file its holder unlinked on release: the lock is the file now at the path
            os.close(dir_fd)
            return False
        previous = LockHolder.parse(os.pread(fd, 1 << 16, 0))
        if previous is not None:
            logger.warning("%s: the build lock of %s was left behind (that builder was killed); taking it over",
                           self.location, previous.describe())
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.me.encode(), 0)  # not fsynced: it only names the holder in messages; the flock is the lock
        self._fd, self._dir_fd = fd, dir_fd
        return True

    def _recorded_holder(self) -> LockHolder | None:
        """Who the lock file says holds the lock (read without following a link)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO planted there: no wait
        except OSError:
            return None
        try:
            return LockHolder.parse(os.pread(fd, 1 << 16, 0))
        except OSError:  # not a file one can read at an offset
            return None
        finally:
            os.close(fd)

    def _still_at_path(self, fd: int) -> bool:
        """Whether the file open as ``fd`` is the one at the lock's path (not deleted, renamed over or replaced)."""
        try:
            at_path = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)

    def check(self) -> None:
        """Raise ``LockLostError`` when the lock file was deleted or replaced since it was taken: whoever did that may
        have let another builder think the cache free, so this build stops before it commits more."""
        if self._fd is not None and not self._still_at_path(self._fd):
            raise LockLostError(f"cache at {self.location}: its build lock {self.path} was deleted or replaced while this build "
                                "held it; this build stopped before its next commit. Re-run the build: it resumes from the last "
                                "commit (never delete build.lock by hand: a killed builder's lock is released by the kernel).")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if self._still_at_path(self._fd):
                os.unlink(self.path)  # while still locked: a waiter that opened this file sees it gone and tries again
            else:
                logger.warning("%s: the build lock file was deleted or replaced while this build held it; it is left as it is",
                               self.location)
        finally:
            os.close(self._fd)
            os.close(self._dir_fd)  # type: ignore[arg-type]
            self._fd = self._dir_fd = None


class LeaseBuildLock(BuildLock):
    """The build lock of a cache on an object store: a lease object renewed by generation-conditioned writes."""

    def __init__(self, location: str, timeout: float | None, lease_s: float):
        super().__init__(location, timeout)
        if not lease_s > 0:
            raise ValueError(f"build.lock_lease_s must be positive, got {lease_s}")
        self.lease_s = lease_s
        from tokenmix.cache.store import open_kvstore

        self._kv = open_kvstore(location)
        self._generation: bytes | None = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _try_acquire(self) -> bool:
        from tokenmix.cache.store import unwritable

        try:
            current = self._kv.read(LOCK_FILE).result()
        except ValueError as e:
            raise unwritable(self.location, e) from None
        stale = None
        if current.state == "value":
            holder = LockHolder.parse(bytes(current.value))
            if holder is not None and time.time() - holder.heartbeat < self.lease_s:
                self.holder = holder
                return False
            stale = holder
        try:
            written = self._kv.write(LOCK_FILE, self._record(), if_equal=current.stamp.generation).result()
        except ValueError as e:
            raise unwritable(self.location, e) from None
        if not written.generation:
            return False  # another builder created or took over the lease between our read and our write
        self._generation = written.generation
        if stale is not None:
            logger.warning("%s: the build lease of %s expired %.0f s ago (that builder was killed or stalled); taking it over",
                           self.location, stale.describe(), time.time() - stale.heartbeat - self.lease_s)
        self._renewer = threading.Thread(target=self._renew, name=f"tokenmix-lease {self.location}", daemon=True)
        self._renewer.start()
        return True

    def _record(self) -> bytes:
        return LockHolder(self.me.host, self.me.pid, self.me.started, self.me.owner, time.time()).encode()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                written = self._kv.write(LOCK_FILE, self._record(), if_equal=self._generation).result()
            except ValueError as e:  # storage unreachable: keep trying until the lease would have run out
                logger.warning("%s: renewing the build lease failed (%s); retrying", self.location, e)
                continue
            if not written.generation:
                logger.error("%s: the build lease was taken over by another builder; this build stops at its next commit", self.location)
                self._lost.set()
                return
            self._generation = written.generation

    def check(self) -> None:
        """Reads the lease: it must still name this builder (a stalled renewer would not have noticed otherwise)."""
        if not self._lost.is_set():
            current = self._kv.read(LOCK_FILE).result()
            holder = LockHolder.parse(bytes(current.value)) if current.state == "value" else None
            if holder is None or holder.owner != self.me.owner:
                self._lost.set()
        if self._lost.is_set():
            raise LockLostError(f"cache at {self.location}: another builder took over this build's lease (this one stalled for "
                                f"more than build.lock_lease_s = {self.lease_s:g} s); this build stopped, the other one goes on")

    def release(self) -> None:
        if self._generation is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if not self._lost.is_set():
            self._kv.write(LOCK_FILE, None, if_equal=self._generation).result()
        self._generation = None


def build_lock(location: str, kind: LockKind = "auto", timeout: float | None = None, lease_s: float = 60.0) -> BuildLock:
    """The build lock of the cache at ``location``: an ``flock`` on a local path (``auto``), else a lease."""
    # The store (tensorstore) is imported where it is used, not at the top: a config's BuildOptions name LockKind, and
    # reading a config imports no tensorstore.
    from tokenmix.cache.store import kvstore_spec

    spec = kvstore_spec(location)
    if kind == "auto" and spec["driver"] == "file":
        return FlockBuildLock(location, os.path.join(spec["path"], LOCK_FILE), timeout)
    return LeaseBuildLock(location, timeout, lease_s)
