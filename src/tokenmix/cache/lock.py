"""One builder per cache: a build lock that holds on local disks and on object stores.

Local paths (``flock``): the builder holds an exclusive ``fcntl.flock`` on ``<cache>/build.lock``. The
kernel drops it the instant its holder dies, SIGKILL included, so a killed builder's lock is free at
once and no lock can outlive its holder; the holder writes its host, pid and start time into the file
so that a waiting builder can say whom it waits for. On release the file is unlinked while still
locked; a builder that locked a file that is no longer at the path (it lost that race) tries again.
``flock`` holds between processes of one machine; on a filesystem shared between machines (NFS and
the like) it may not, and ``build.lock: lease`` uses the lease below instead.

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
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Literal

from tokenmix._waiting import poll_until
from tokenmix.cache.store import kvstore_spec, open_kvstore, unwritable

logger = logging.getLogger(__name__)

LOCK_FILE = "build.lock"
LockKind = Literal["auto", "lease"]


class CacheLockedError(RuntimeError):
    """Another builder holds the cache's build lock; the message names it (host, pid, start time)."""


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
        return LockHolder(socket.gethostname(), os.getpid(), now, uuid.uuid4().hex, now)

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
    """The build lock of a cache on a local filesystem: an ``flock`` the kernel releases when its holder dies."""

    def __init__(self, location: str, path: str, timeout: float | None):
        super().__init__(location, timeout)
        self.path = path
        self._fd: int | None = None

    def _try_acquire(self) -> bool:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise unwritable(self.location, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.holder = LockHolder.parse(os.pread(fd, 1 << 16, 0))
            os.close(fd)
            return False
        try:
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                os.close(fd)  # locked a file its holder unlinked on release: the lock is the file now at the path
                return False
        except FileNotFoundError:
            os.close(fd)
            return False
        previous = LockHolder.parse(os.pread(fd, 1 << 16, 0))
        if previous is not None:
            logger.warning("%s: the build lock of %s was left behind (that builder was killed); taking it over",
                           self.location, previous.describe())
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.me.encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return True

    def check(self) -> None:
        """Nothing to check: an flock is held for as long as its holder lives."""

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a waiter that opened this file sees it gone and tries again
        finally:
            os.close(self._fd)
            self._fd = None


class LeaseBuildLock(BuildLock):
    """The build lock of a cache on an object store: a lease object renewed by generation-conditioned writes."""

    def __init__(self, location: str, timeout: float | None, lease_s: float):
        super().__init__(location, timeout)
        if not lease_s > 0:
            raise ValueError(f"build.lock_lease_s must be positive, got {lease_s}")
        self.lease_s = lease_s
        self._kv = open_kvstore(location)
        self._generation: bytes | None = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _try_acquire(self) -> bool:
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
    spec = kvstore_spec(location)
    if kind == "auto" and spec["driver"] == "file":
        return FlockBuildLock(location, os.path.join(spec["path"], LOCK_FILE), timeout)
    return LeaseBuildLock(location, timeout, lease_s)
