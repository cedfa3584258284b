"""Turn the URL patterns of a source config into the ordered list of shard URLs.

Order matters: the cache stores rows in listed-shard order (invariant 2), so expansion is
deterministic: patterns in the order given, brace alternatives in the order written, glob
matches sorted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import braceexpand
import fsspec

logger = logging.getLogger(__name__)

_GLOB_CHARS = ("*", "?", "[")


class NoShardsError(ValueError):
    """A URL pattern matched no file."""


def expand_urls(patterns: Iterable[str]) -> list[str]:
    """Expand brace patterns (``{00..29}``, ``{a,b}``) and globs into concrete shard URLs.

    A pattern that contains a glob and matches nothing is an error naming the pattern; a plain
    URL is kept as given (a missing file is reported when the shard is read, where the error
    policy applies). Duplicates are removed, keeping the first occurrence.
    """
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        for url in braceexpand.braceexpand(pattern):
            for shard in _expand_glob(url):
                if shard not in seen:
                    seen.add(shard)
                    out.append(shard)
    return out


def _expand_glob(url: str) -> list[str]:
    path_part = url.split("://", 1)[-1]
    if not any(c in path_part for c in _GLOB_CHARS):
        return [url]
    fs, path = fsspec.core.url_to_fs(url)
    paths = fs.glob(path)
    if not paths:
        raise NoShardsError(f"URL pattern {url!r} matched no files; check the path or the glob")
    if "://" in url:
        return [fs.unstrip_protocol(p) for p in sorted(paths)]
    return sorted(paths)
