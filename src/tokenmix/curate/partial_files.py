"""Files a curation writes under a temporary name and renames once whole: opened safely, digested as they are written,
and checked again before a later run trusts them.

On a local filesystem the temporary file is created new, never opened through whatever stands at its name
(``_safe_files.create_new``): a symbolic link planted there (by mistake or by someone else on a shared machine) would
otherwise have curation truncate and overwrite the file the link points to. A link at that name is refused, naming it
(``UnsafeFileError``); a regular file there is what a killed run left behind, and is removed first. Object stores (``s3://``, ``gs://``...)
have no links, and a write there replaces the object whole when it is closed, so a temporary object is just written.

Each output records its size and its xxh3-128 digest as it is written (``PartialFile.record``, no second read); a
resumed run takes an output as done only while it still has that size (and, for the outputs a user reads, that
digest: ``damage``), so an output deleted, cut short or garbled after its task finished is written again.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import xxhash
from fsspec.implementations.local import LocalFileSystem

from tokenmix._file_digest import file_digest
from tokenmix._object_stores import url_to_fs
from tokenmix._safe_files import create_new


class PartialFile:
    """A temporary file open for writing, whose size and digest are kept up to date as bytes go in."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str):
        self.fs, self.path = fs, path
        self._raw = _open_new(fs, path)
        self._hash = xxhash.xxh3_128()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._hash.update(view)
        self.size += view.nbytes
        self._raw.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    def close(self) -> None:
        self._raw.close()

    def record(self) -> dict[str, Any]:
        """What ``damage`` checks the finished file against: its size and digest."""
        return {"bytes": self.size, "xxh3_128": self._hash.hexdigest()}

    def publish(self, target: str) -> None:
        """Close the file and give it the name ``target`` (replacing a link or file there, never writing through it)."""
        self.close()
        if isinstance(self.fs, LocalFileSystem):
            os.replace(self.path, target)
        else:  # one object copied and removed: fsspec's mv and rm read a path holding [ as a glob
            self.fs.cp_file(self.path, target)
            self.fs.rm_file(self.path)

    def discard(self) -> None:
        """Close and remove the file (a task that failed: no output appears)."""
        try:
            self.close()
        finally:
            if self.fs.exists(self.path):
                self.fs.rm_file(self.path)


def _open_new(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    if not isinstance(fs, LocalFileSystem):
        return fs.open(path, "wb")
    return create_new(path, "temporary file of a curation")


def damage(url: str, record: dict[str, Any], check_digest: bool) -> str | None:
    """What is wrong with the file at ``url`` against ``record`` (its size and digest when written), or ``None`` when
    it is still that file. ``check_digest`` reads the whole file; without it only the size is compared."""
    fs, path = url_to_fs(url)
    try:
        size = fs.size(path)
        if size != record["bytes"]:
            return f"{size} bytes where {record['bytes']} were written"
        if not check_digest:
            return None
        _, digest = file_digest(url)
    except FileNotFoundError:
        return "missing"
    return None if digest == record["xxh3_128"] else "its bytes differ from those written (xxh3-128 digest)"
