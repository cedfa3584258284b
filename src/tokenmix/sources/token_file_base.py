"""What every reader of another training stack's token files shares: the ``TokenFile`` each gives, its error, and the
helpers they all use.

A ``TokenFile`` is one file's tokens (memory-mapped, never copied), where each of its documents ends, and optionally a
0/1 loss value per token. The formats themselves are read by ``megatron.py`` (``prefix.bin`` + ``prefix.idx``),
``datatrove_tokens.py`` (``.ds`` + ``.ds.index`` [+ ``.ds.loss``, ``.ds.metadata``]), ``nanoset.py`` (Nanotron's
``*_input_ids.npy``) and ``cerebras_hdf5.py`` (directories of Cerebras HDF5 samples); ``token_file_kinds.open_token_files``
picks one by kind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenmix.sources import urls

if TYPE_CHECKING:
    import numpy as np


class TokenFileError(ValueError):
    """A token file that cannot be read as the kind it was declared; the message names the file and the fix."""


@dataclass
class TokenFile:
    """One file of tokens: its token stream, where its documents end, and optional per-token loss values."""

    path: str
    """The file the tokens are in (for messages and identity)."""
    tokens: np.ndarray
    """Every token of the file, memory-mapped (1-d; a plain ndarray view of the map, since slicing an ``np.memmap``
    builds a memmap object each time, which costs more than copying a 2048-token window)."""
    ends: np.ndarray
    """Where each document ends in ``tokens`` (int64, increasing, the last equal to ``len(tokens)``)."""
    loss: np.ndarray | None = None
    """Per token, whether it is trained on (uint8 0/1, memory-mapped), where the file has a loss mask."""
    info: dict[str, Any] = field(default_factory=dict)
    """What the file says about itself (tokenizer name, counts), for people and identity."""
    opened_as: tuple[Callable[..., TokenFile], tuple[Any, ...]] | None = None
    """How it was opened (a function and its arguments: ``token_file_kinds.open_token_file`` sets it), so that another
    process (a loader's reader) can map it again rather than receive a copy of its tokens."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self.opened_as is None:
            raise TypeError(f"{self.path}: a TokenFile made by hand cannot be sent to another process (it would copy every "
                            "token); open it with tokenmix.sources.token_file_kinds.open_token_files")
        return _reopen, (self.opened_as, self.identity())

    def identity(self) -> dict[str, Any]:
        """Size and modification time of the token file: a cache over it is told apart from one over another version."""
        stat = os.stat(self.path)
        return {"path": os.path.abspath(self.path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def local_path(url: str, kind: str) -> str:
    """The local path of a token file URL; token files are memory-mapped, so they must be on a local (or mounted) disk."""
    path = urls.local_path(url)
    if path is None:
        raise TokenFileError(f"{url}: {kind} token files are memory-mapped and must be on a local or mounted disk; copy them "
                             "there (or import them into a tokenmix cache, which reads from object storage)")
    return path


def document_ends(tokens: np.ndarray, eos_id: int | None) -> np.ndarray:
    """Document ends of a stream without an index: after each ``eos_id`` (and at the end), or the whole stream as one."""
    import numpy as np  # here: a config's token-file settings are read without numpy

    n = len(tokens)
    if eos_id is None or n == 0:
        return np.array([n] if n else [], np.int64)
    block = 1 << 26  # a bounded scan: a file can be far larger than memory
    ends = np.concatenate([np.flatnonzero(tokens[i : i + block] == eos_id).astype(np.int64) + (i + 1) for i in range(0, n, block)])
    return ends if ends.size and ends[-1] == n else np.append(ends, np.int64(n))


def _reopen(opened_as: tuple[Callable[..., TokenFile], tuple[Any, ...]], identity: dict[str, Any]) -> TokenFile:
    opener, arguments = opened_as
    file = opener(*arguments)
    if file.identity() != identity:
        raise TokenFileError(f"{file.path}: the file changed (size or modification time) while it was being read; start again")
    return file
