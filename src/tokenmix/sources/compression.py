"""Streaming decompression that tells a cut, a corrupt stream and bytes after the last frame apart.

``gzip.GzipFile`` and ``zstandard``'s stream reader do not: the first raises a bare ``zlib.error`` or an ``OSError``
for corrupt data, the second returns a short read at the end of a truncated frame and fails on a frame that follows
bytes it does not recognize, losing what it decoded before. ``FrameCheckingReader`` decodes a stream frame after frame
(gzip members, zstd frames), hands on every byte decoded before a failure, and then raises one of three errors, each
naming the byte where it was found: ``TruncatedInputError`` (the input ends inside a frame), ``CorruptInputError`` (the
decoder refused the data, or a frame's checksum failed: gzip's CRC-32 and length, a zstd frame's content checksum where
the frame has one), or ``TrailingDataError`` (bytes after a complete frame that begin no frame); and a fourth for a frame
the decoder refuses though it may be sound, ``UnsupportedFrameError`` (a zstd window over its readers' default limit).
"""

from __future__ import annotations

import functools
import io
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard

_READ_SIZE = 1 << 20
_FEED_SIZE = 1 << 16
"""Compressed bytes handed to the decoder at a time: how closely a failure's byte offset is known."""
_FRAME_HEAD = 18
"""The most bytes a frame's header takes (zstd's)."""


class TruncatedInputError(EOFError):
    """The compressed stream ended in the middle of a frame."""


class CorruptInputError(ValueError):
    """The compressed data cannot be decoded, or a frame's checksum failed: nothing decoded from it can be trusted."""


class TrailingDataError(ValueError):
    """Bytes after the last complete frame begin no frame; every frame before them was decoded whole."""


class UnsupportedFrameError(ValueError):
    """A frame asks for more than a reader of the format gives unless told to (a zstd window over its default limit):
    not known to be damaged, but not read; the message says how to rewrite the file."""


ZSTD_WINDOW_LIMIT = 1 << 27
"""The largest window zstd's decoders accept unless told more (``ZSTD_WINDOWLOG_LIMIT_DEFAULT``: the CLI without
``--long``/``--memory``, Python's ``zstandard`` without ``max_window_size``); a frame written with ``--long=28`` or more
asks for a larger one."""


def _zstd_window_refusal(head: bytes) -> str | None:
    """Why a zstd frame beginning with ``head`` is refused though maybe sound (its window is over the limit), or None."""
    try:
        window = zstandard.get_frame_parameters(head).window_size
    except zstandard.ZstdError:
        return None
    if window <= ZSTD_WINDOW_LIMIT:
        return None
    return (f"needs a {window >> 20:,} MiB window (written with zstd --long={window.bit_length() - 1}), over the "
            f"{ZSTD_WINDOW_LIMIT >> 20} MiB zstd's readers accept unless told more; rewrite the file with a smaller window: "
            "zstd -dc --long=31 FILE | zstd -o NEW_FILE")


@dataclass(frozen=True)
class _Format:
    """What ``FrameCheckingReader`` needs to know of a compression format."""

    name: str
    frame: str
    """What a self-contained unit of the format is called (a gzip member, a zstd frame)."""
    magics: tuple[bytes, ...]
    """The bytes a frame can begin with."""
    padding: bytes
    """A byte the format allows between frames (gzip's zero padding), or ``b""``."""
    decoders: Callable[[], Callable[[], Any]]
    """Makes, for one reader, what makes a decoder of one frame (with ``decompress``, ``eof`` and ``unused_data``)."""
    errors: tuple[type[Exception], ...]
    """What the decoder raises for data it refuses."""
    refusal: Callable[[bytes], str | None] = lambda head: None
    """Why the decoder refuses a frame beginning with these bytes though it may be sound, or None (then it is corrupt)."""

    def starts_frame(self, head: bytes) -> bool | None:
        """Whether bytes begin a frame; None while ``head`` is too short to tell."""
        if head.startswith(self.magics):
            return True
        return None if any(magic.startswith(head) for magic in self.magics) else False


_FORMATS = {
    "gzip": _Format("gzip", "member", (b"\x1f\x8b",), b"\x00",
                    lambda: functools.partial(zlib.decompressobj, wbits=16 + zlib.MAX_WBITS), (zlib.error,)),
    "zstd": _Format("zstd", "frame", (b"\x28\xb5\x2f\xfd", *(bytes([0x50 + i]) + b"\x2a\x4d\x18" for i in range(16))), b"",
                    lambda: zstandard.ZstdDecompressor().decompressobj, (zstandard.ZstdError,), _zstd_window_refusal),
}
"""zstd's second kind of magic number begins a skippable frame, which its decoder reads as a frame of no data."""


class FrameCheckingReader(io.RawIOBase):
    """A raw binary stream over gzip or zstd data (any number of frames) that checks every frame it decodes.

    Failures are raised once everything decoded before them has been read, so a reader of lines gets every complete
    line first."""

    def __init__(self, raw: BinaryIO, compression: str):
        self._raw = raw
        self._format = _FORMATS[compression]
        self._new_decoder = self._format.decoders()
        self._decoder: Any = None
        """The decoder of the frame being read; None between frames."""
        self._frames = 0
        self._frame_start = 0
        self._frame_head = b""
        """The first bytes of the frame being read, up to ``_FRAME_HEAD`` (gathered from the pieces fed: a frame's
        header may arrive in two reads of the file)."""
        self._offset = 0
        """Compressed bytes decoded so far."""
        self._input = b""
        """Compressed bytes read but not yet decoded."""
        self._pending = memoryview(b"")
        self._failure: Exception | None = None
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while not self._pending:
            if self._failure is not None:
                raise self._failure
            if self._eof:
                return 0
            self._fill()
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _fill(self) -> None:
        """Decode the next pieces of input into ``_pending``; a failure is kept for when ``_pending`` has been read."""
        if not self._input and not self._read_more():
            self._at_end()
            return
        out: list[bytes] = []
        decoded = 0
        piece_end = self._offset
        try:
            while self._input and decoded < _READ_SIZE:
                if self._decoder is None and not self._begin_frame():
                    break
                piece, self._input = self._input[:_FEED_SIZE], self._input[_FEED_SIZE:]
                piece_end = self._offset + len(piece)
                if len(self._frame_head) < _FRAME_HEAD:
                    self._frame_head += piece[: _FRAME_HEAD - len(self._frame_head)]
                out.append(self._decoder.decompress(piece))
                decoded += len(out[-1])
                if self._decoder.eof:
                    unused = self._decoder.unused_data
                    self._input = unused + self._input
                    self._offset = piece_end - len(unused)
                    self._decoder = None
                    self._frames += 1
                else:
                    self._offset = piece_end
        except self._format.errors as e:
            frame = f"the {self._format.name} {self._format.frame} that starts at byte {self._frame_start:,}"
            refusal = self._format.refusal(self._frame_head)
            self._failure = (UnsupportedFrameError(f"{frame} {refusal}") if refusal else
                             CorruptInputError(f"{frame} is corrupt: {e} (found by byte {piece_end:,})"))
        self._pending = memoryview(b"".join(out))

    def _begin_frame(self) -> bool:
        """At a frame boundary: start decoding the next frame, or (False) find that the bytes here begin none."""
        while True:
            if self._format.padding and self._frames:
                stripped = self._input.lstrip(self._format.padding)
                self._offset += len(self._input) - len(stripped)
                self._input = stripped
            starts = self._format.starts_frame(self._input)
            if starts is not None or not self._read_more():
                break
        if not self._input:
            return False  # padding up to the end: the next ``_fill`` finds the end
        head = self._input[:4].hex(" ")
        if starts is None:
            self._failure = TruncatedInputError(f"the {self._format.name} stream ends at byte {self._offset + len(self._input):,}, "
                                                f"inside the header of a {self._format.frame}")
        elif not starts and self._frames == 0:
            self._failure = CorruptInputError(f"the file is no {self._format.name} data: it begins {head}")
        elif not starts:
            self._failure = TrailingDataError(f"the file's {self._frames} complete {self._format.frame}(s) end at byte "
                                              f"{self._offset:,}, and the bytes after them are no {self._format.name} "
                                              f"{self._format.frame} (they begin {head})")
        else:
            self._decoder = self._new_decoder()
            self._frame_start = self._offset
            self._frame_head = b""
        return bool(starts)

    def _read_more(self) -> bool:
        more = self._raw.read(_FEED_SIZE)
        self._input += more
        return bool(more)

    def _at_end(self) -> None:
        if self._decoder is not None:
            self._failure = TruncatedInputError(f"the {self._format.name} stream ends at byte {self._offset:,}, inside the "
                                                f"{self._format.frame} that starts at byte {self._frame_start:,}")
        else:
            self._eof = True


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
    if compression is not None:
        return io.BufferedReader(FrameCheckingReader(raw, compression), buffer_size=_READ_SIZE)  # type: ignore[return-value]
    return raw if hasattr(raw, "peek") else io.BufferedReader(raw, buffer_size=_READ_SIZE)  # type: ignore[arg-type]
