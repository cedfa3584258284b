"""Opening the files tokenmix keeps beside its outputs (build locks, partial files renamed into place when complete) so
that a symbolic link planted at their path can never redirect a write: such a file is created only where no file is,
and never opened through a link.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFileError(OSError):
    """A path where tokenmix writes a file of its own holds a symbolic link (or something else that is not a file)."""


def refuse_unsafe(path: str, what: str) -> None:
    """Raise ``UnsafeFileError`` when ``path`` is a symbolic link or a non-regular file; ``what`` names the file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(f"{path}: the {what} is a symbolic link (to {os.readlink(path)}); tokenmix never writes through a "
                              "link there. Remove the link and run again.")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"{path}: the {what} is not a regular file; remove it and run again")


def create_new(path: str, what: str) -> BinaryIO:
    """A new file at ``path`` open for writing and reading: a stale regular file left there by an interrupted run is
    removed first, a symbolic link is refused, and the file is created exclusively (a link made meanwhile is refused
    too, never followed)."""
    refuse_unsafe(path, what)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NO_LINK, 0o644)
    except FileExistsError:
        refuse_unsafe(path, what)
        raise UnsafeFileError(f"{path}: the {what} was created by another process while this one created it: two runs are "
                              "writing the same output; run one at a time") from None
    return os.fdopen(fd, "w+b")


def open_lock_file(path: str, what: str) -> int:
    """A descriptor of the regular file at ``path`` (created if absent), never opened through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NO_LINK, 0o644)
    except OSError:
        refuse_unsafe(path, what)
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        refuse_unsafe(path, what)
    return fd
