"""Which object store a URL reaches: the endpoint the environment names, given to fsspec and to tensorstore alike."""

from __future__ import annotations

import os
from typing import Any


def s3_endpoint() -> str | None:
    """The S3-compatible endpoint (MinIO, R2, a local server) the environment names, as the AWS tools read it:
    ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``; None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def storage_options(url: str) -> dict[str, Any]:
    """What fsspec is given besides ``url`` to open it: for ``s3://``, the endpoint of ``s3_endpoint``, and no listings
    kept.

    fsspec keeps one filesystem, and its open client, for each set of arguments: given only the URL, a process would
    reach the endpoint its environment named the first time, even after the environment names another, while the
    caches tensorstore opens follow the environment. Passed explicitly, the endpoint picks the filesystem. That
    filesystem would also keep every listing it made for the rest of the process, so that a glob expanded again, or an
    output directory listed again, missed the objects other processes wrote since and named those they removed."""
    if not url.startswith("s3://"):
        return {}
    endpoint = s3_endpoint()
    return {"use_listings_cache": False, **({"endpoint_url": endpoint} if endpoint else {})}


def url_to_fs(url: str) -> tuple[Any, str]:
    """The fsspec filesystem holding ``url`` (with ``storage_options``) and the path in it."""
    import fsspec  # here: its import scans every installed package's entry points, which a reading process never needs

    return fsspec.core.url_to_fs(url, **storage_options(url))


def open_url(url: str) -> Any:
    """``url`` opened for reading through fsspec (with ``storage_options``), as a context manager of a binary file."""
    import fsspec

    return fsspec.open(url, "rb", **storage_options(url))
