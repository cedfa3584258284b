"""The size and XXH3-128 digest of a stored file: what curation's outputs and training checkpoints record when they are
written, and check before a later run trusts them."""

from __future__ import annotations

import xxhash

from tokenmix._object_stores import open_url

_READ_BYTES = 8 << 20


def file_digest(url: str) -> tuple[int, str]:
    """The size of the file at ``url`` (a path or an fsspec URL) and its XXH3-128 digest in hex, from one read of it."""
    digest = xxhash.xxh3_128()
    size = 0
    with open_url(url) as f:
        while block := f.read(_READ_BYTES):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()
