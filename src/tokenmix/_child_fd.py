"""A file descriptor handed to a spawned process as it starts, so that a child shares a file that has no name."""

from __future__ import annotations

from typing import Any


class ChildFd:
    """A descriptor that each spawned child receives as its own copy when it starts (an ``int`` there; POSIX only).

    Pass it among a ``multiprocessing`` process's arguments (or a pool's initializer arguments): it is duplicated into
    the child while the child is being spawned, as ``multiprocessing`` does for the pipes it hands over."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        from multiprocessing.reduction import DupFd  # defined on POSIX only

        return _detach, (DupFd(self.fd),)


def _detach(dup: Any) -> int:
    return dup.detach()
