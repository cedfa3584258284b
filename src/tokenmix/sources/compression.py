"""Streaming decompression that notices truncated input.

``zstandard``'s stream reader returns a short read at the end of a truncated frame without an
error, which would silently drop the tail of a shard. ``ZstdTruncationCheckingReader`` raises
``TruncatedInputError`` instead; gzip's own reader already raises ``EOFError``.
"""

from __future__ import annotations

import gzip
import io
from typing import BinaryIO

import zstandard

_READ_SIZE = 1 << 20


class TruncatedInputError(EOFError):
    """The compressed stream ended in the middle of a frame."""


class ZstdTruncationCheckingReader(io.RawIOBase):
    """A raw binary stream over zstd data (any number of frames) that fails on truncation."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._pending = b""
        self._frame_open = False
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while not self._pending and not self._eof:
            self._fill()
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _fill(self) -> None:
        data = self._raw.read(_READ_SIZE)
        if not data:
            if self._frame_open:
                raise TruncatedInputError("zstd stream ended in the middle of a frame")
            self._eof = True
            return
        out = []
        while data:
            self._frame_open = True
            out.append(self._dobj.decompress(data))
            if self._dobj.eof:
                self._frame_open = False
                data = self._dobj.unused_data
                self._dobj = self._dctx.decompressobj()
            else:
                data = b""
        self._pending = b"".join(out)


def compression_of(url: str) -> str | None:
    """The compression a shard URL's suffix names: ``"gzip"``, ``"zstd"`` or ``None``."""
    lower = url.lower()
    if lower.endswith((".gz", ".gzip")):
        return "gzip"
    if lower.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def strip_compression_suffix(url: str) -> str:
    """The URL without a trailing compression suffix, so the data format can be read off it."""
    lower = url.lower()
    for suffix in (".gzip", ".gz", ".zstd", ".zst"):
        if lower.endswith(suffix):
            return url[: -len(suffix)]
    return url


def decompressing_reader(raw: BinaryIO, compression: str | None) -> BinaryIO:
    """Wrap ``raw`` so that reads return decompressed bytes, buffered for line iteration."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if compression == "zstd":
        return io.BufferedReader(ZstdTruncationCheckingReader(raw), buffer_size=_READ_SIZE)
    return raw if hasattr(raw, "peek") else io.BufferedReader(raw, buffer_size=_READ_SIZE)  # type: ignore[arg-type]
