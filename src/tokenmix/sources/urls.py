"""Turn the URL patterns of a source config, or the files listing its inputs, into the ordered list of shard URLs.

Order matters: the cache stores rows in listed-shard order (invariant 2), so expansion is
deterministic: patterns in the order given, brace alternatives in the order written, glob
matches sorted; listed inputs in the order of their listing files and lines.

Names follow one rule (``shard_name``), whatever wrote them (a plain path, a brace pattern, a glob, a listing file): a
local path is named by its absolute, normalized path, a relative one resolved against the current directory (a listed
one, against its listing's); a URL with a scheme (``gs://``, ``s3://``, ``file://``, ``hf://``, ...) is kept as written.
A cache's ledger records these names and a later build compares its list with them, so a file has one name wherever
the command runs and however the config spells it, and every process (a cluster's worker, ``tokenmix verify``) opens it
by that name.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Iterable

import braceexpand

from tokenmix._object_stores import url_to_fs

logger = logging.getLogger(__name__)

_GLOB_CHARS = ("*", "?", "[")


class NoShardsError(ValueError):
    """A URL pattern matched no file.

    Also raised for a metadata (listing) file that is missing or lists nothing, or names an input that does not exist."""


def local_path(url: str) -> str | None:
    """The path on this machine's disks of a plain path or a ``file://`` URL (``~`` expanded); None for a URL with any
    other scheme, or fsspec's chained ``a::b`` form, which are read through fsspec or tensorstore."""
    if url.startswith("file://"):
        return url.removeprefix("file://")
    return None if "://" in url or "::" in url else os.path.expanduser(url)


def join_location(location: str, *parts: str) -> str:
    """``location/part/...`` for paths and URLs alike."""
    return "/".join([location.rstrip("/"), *parts])


def shard_name(url: str) -> str:
    """The name a shard is known by: a URL with a scheme as written; a local path absolute and normalized (``~``
    expanded, a relative one resolved against the current directory)."""
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def expand_urls(patterns: Iterable[str]) -> list[str]:
    """Expand brace patterns (``{00..29}``, ``{a,b}``) and globs into concrete shard URLs, named by ``shard_name``.

    A pattern that contains a glob and matches nothing is an error naming the pattern; a plain URL is kept (a missing
    file is reported when the shard is read, where the error policy applies), and so is one naming a file that exists
    as written, glob characters and all. Duplicates are removed, keeping the first occurrence.
    """
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        for url in braceexpand.braceexpand(pattern):
            for shard in _expand_glob(shard_name(url)):
                if shard not in seen:
                    seen.add(shard)
                    out.append(shard)
    return out


def _expand_glob(url: str) -> list[str]:
    path_part = url.split("://", 1)[-1]
    if not any(c in path_part for c in _GLOB_CHARS):
        return [url]
    fs, path = url_to_fs(url)
    if fs.isfile(path):
        return [url]  # a file whose name holds glob characters ("raw [v1]/s.jsonl") is that file, not what the glob matches
    paths = fs.glob(path)
    if not paths:
        raise NoShardsError(f"URL pattern {url!r} matched no files; check the path or the glob")
    if "://" in url:
        return [fs.unstrip_protocol(p) for p in sorted(paths)]
    return sorted(paths)


def urls_from_metadata_files(paths: list[str]) -> list[str]:
    """The input files listed in Cerebras-style metadata files: one path or URL a line, in the order of the files and
    their lines, duplicates dropped (the first kept). Blank lines and lines starting with ``#`` are skipped. A relative
    entry is taken relative to the listing file's own directory (so a listing moves with its data), and local paths
    come back absolute (``shard_name``); entries are literal, never brace-expanded or globbed. Listing files and entries may be local
    paths or fsspec URLs.

    Every entry is checked to exist (one ``exists`` call each, so a missing input is named with its listing file and
    line before any building starts); a missing or empty listing file, or a missing entry, raises ``NoShardsError``.
    """
    out: list[str] = []
    seen: set[str] = set()
    for listing in paths:
        fs, path = url_to_fs(listing)
        try:
            text = fs.cat_file(path).decode("utf-8")
        except FileNotFoundError:
            raise NoShardsError(f"metadata file {listing!r} does not exist; check the path in metadata_files") from None
        except UnicodeDecodeError as e:
            raise NoShardsError(f"metadata file {listing!r} is not UTF-8 text (byte {e.start}); give a text file of one input path a line") from None
        listed = 0
        for number, line in enumerate(text.splitlines(), 1):
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            url = _beside(listing, entry)
            entry_fs, entry_path = url_to_fs(url)
            if not entry_fs.exists(entry_path):
                resolved = "" if url == entry else f" (resolved against the listing's directory: {url})"
                raise NoShardsError(f"{listing}, line {number}: input {entry!r} does not exist{resolved}; fix the path or remove the line")
            listed += 1
            if url not in seen:
                seen.add(url)
                out.append(url)
        if not listed:
            raise NoShardsError(f"metadata file {listing!r} lists no input files; give one input path a line, or remove it from metadata_files")
    return out


def _beside(listing: str, entry: str) -> str:
    """``entry`` as written when it is a URL; a local path made absolute, a relative one taken from the directory of the
    ``listing`` file (so the same input listed twice, or from two listings, has one name); a relative entry of a listing
    given by URL joined to that URL's directory."""
    if "://" in entry:
        return entry
    if "://" in listing and not os.path.isabs(entry):
        protocol, _, rest = listing.partition("://")
        return f"{protocol}://{posixpath.normpath(posixpath.join(posixpath.dirname(rest), entry))}"
    return shard_name(os.path.join(os.path.dirname(os.path.expanduser(listing)), os.path.expanduser(entry)))
