"""What every export shares: a cache read in bounded batches of whole rows, files written under temporary names and
renamed when complete, and a progress bar over tokens.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Protocol

import numpy as np
from tqdm.auto import tqdm

from tokenmix._safe_files import create_new
from tokenmix.sources.urls import local_path


class TokenSource(Protocol):
    """What the export reads from a cache: a ``TokenCache``, or any reader with the same members (such as a reader of
    Megatron or datatrove token files)."""

    location: str
    identity: dict[str, Any]

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def has_loss_spans(self) -> bool: ...

    def num_rows(self) -> int: ...

    def is_finished(self) -> bool: ...

    def row_bounds(self, start: int, stop: int) -> np.ndarray: ...

    def read_tokens(self, start: int, stop: int) -> np.ndarray: ...

    def loss_spans(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


BATCH_TOKENS = 1 << 24
"""Tokens read per batch of rows (a row longer than this is read alone): the export's memory bound, 32-64 MiB."""


@dataclass
class RowBatch:
    """Consecutive rows of a cache: their tokens, each row's length, and (formats that mask the loss) per token
    whether it is trained on."""

    first_row: int
    tokens: np.ndarray
    lengths: np.ndarray
    trained: np.ndarray | None


def row_batches(cache: TokenSource, batch_tokens: int | None = None, description: str = "export", progress: bool = True) -> Iterator[RowBatch]:
    """Every row of a finished cache (a ``TokenCache`` or ``TokenFilesCache``) in order, about ``batch_tokens`` (default
    ``BATCH_TOKENS``) at a time."""
    batch_tokens = batch_tokens or BATCH_TOKENS
    rows = cache.num_rows()
    bounds = cache.row_bounds(0, rows)
    with tqdm(total=int(bounds[-1]), desc=description, unit="tok", unit_scale=True, disable=not progress, dynamic_ncols=True,
              mininterval=0.5) as bar:
        start = 0
        while start < rows:
            stop = int(np.searchsorted(bounds, bounds[start] + batch_tokens, side="right")) - 1
            stop = min(max(stop, start + 1), rows)
            lo, hi = int(bounds[start]), int(bounds[stop])
            tokens = cache.read_tokens(lo, hi)
            trained = None
            if cache.has_loss_spans:
                row, begin, end = cache.loss_spans(start, stop)
                trained = span_mask(bounds[row] - lo + begin, bounds[row] - lo + end, hi - lo)
            yield RowBatch(start, tokens, np.diff(bounds[start : stop + 1]), trained)
            bar.update(hi - lo)
            start = stop


def refuse_loss_spans(cache: TokenSource, target: str) -> None:
    """Refuse a cache whose format masks the loss for a ``target`` that holds ids only: its export would train on what
    the cache masks."""
    if cache.has_loss_spans:
        raise ValueError(f"{cache.location}: {target} hold ids only, and this cache's format masks the loss; export it to "
                         "datatrove (.ds with .loss) or Cerebras HDF5 (mode summarization) instead")


def local_output(output: str, target: str) -> str:
    """The local path to write ``target``'s files at ``output`` (a path or a ``file://`` URL). Those files are written
    as local files: a URL of any other scheme (``s3://``, ``gs://``) is refused naming it and the fix, where it would
    have been taken for a relative path (a local directory named ``s3:``)."""
    path = local_path(output)
    if path is None:
        raise ValueError(f"{output}: {target} files are written to a local or mounted disk, not to object storage; export to "
                         "a local path and copy the files to the bucket (aws s3 cp --recursive, gcloud storage cp -r), or "
                         "export --to levanter, which writes a cache to a bucket")
    return path


def local_file_output(output: str, target: str, prefix: bool = False) -> str:
    """``local_output`` for an export whose files are named from ``output``: a file, refused where it names a directory
    (a trailing separator, or one that exists: it was written in full, then refused at its rename); or a ``prefix`` of
    names (``prefix.bin`` beside a directory ``prefix`` is fine), refused with a trailing separator, which made hidden
    files inside the directory (``DIR/.bin``)."""
    path = local_output(output, target)
    if path.endswith(os.sep) or (not prefix and os.path.isdir(path)):
        raise ValueError(f"{output}: a {target} export is written as files named from this path, and it names a directory; give "
                         f"a file path (for example {os.path.join(path, 'train')})")
    return path


def span_mask(begins: np.ndarray, ends: np.ndarray, size: int) -> np.ndarray:
    """A boolean mask of ``size`` positions, true inside the disjoint ranges ``[begins[i], ends[i])``."""
    change = np.zeros(size + 1, np.int64)
    np.add.at(change, begins, 1)
    np.add.at(change, ends, -1)
    return np.cumsum(change[:-1]) > 0


def partial_name(path: str) -> str:
    """Where ``path`` is written until complete: a hidden name beside it."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.partial")


def _locked(fd: int) -> bool:
    """Take the lock an export holds on a partial file while it writes it; False where another export holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _claim_partial(path: str) -> IO[bytes]:
    """The partial file of ``path``, new and locked by this export. One left by an interrupted export (unlocked) is
    replaced; one another export is writing (locked) is refused, where it was replaced and then renamed into place by
    its writer, with this export's bytes, half written, in it."""
    partial = partial_name(path)
    busy = FileExistsError(f"{path}: another export is writing it now (it holds {partial}); wait for it to finish, or "
                           "export to another path")
    try:
        fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # none there (a link there is refused by create_new)
        pass
    else:
        try:
            if not _locked(fd):
                raise busy
        finally:
            os.close(fd)
    f = create_new(partial, "partial export file")
    try:
        ours = _locked(f.fileno()) and os.fstat(f.fileno()).st_ino == os.lstat(partial).st_ino
    except FileNotFoundError:
        ours = False
    if not ours:  # another export took it for an interrupted one's before it was locked
        f.close()
        raise busy
    return f


@contextmanager
def atomic_files(*paths: str) -> Iterator[list[IO[bytes]]]:
    """Open ``paths`` for writing under temporary names; on success each is renamed into place, in the order given (so
    the last one named, an index, appears only once the data it describes is whole); on failure none appears. A path
    another export is writing is refused (``FileExistsError``)."""
    for path in paths:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    handles: list[IO[bytes]] = []
    try:
        for path in paths:
            handles.append(_claim_partial(path))
        yield handles
        for f in handles:
            f.flush()
            os.fsync(f.fileno())
        for path in paths:  # still locked: closed first, they could be taken for an interrupted export's
            os.replace(partial_name(path), path)
    finally:
        for path, f in zip(paths, handles):
            _remove_if_ours(partial_name(path), f)
            f.close()


def _remove_if_ours(partial: str, f: IO[bytes]) -> None:
    """Remove ``partial`` where it is still the file ``f`` writes (not renamed into place, nor another export's since)."""
    try:
        if os.lstat(partial).st_ino == os.fstat(f.fileno()).st_ino:
            os.remove(partial)
    except FileNotFoundError:
        pass
