"""Opening the token files of a source: each of the user's paths expanded as its kind expects, in order."""

from __future__ import annotations

from tokenmix.sources.cerebras_hdf5 import open_cerebras_hdf5
from tokenmix.sources.datatrove_tokens import datatrove_files, open_datatrove
from tokenmix.sources.megatron import open_megatron
from tokenmix.sources.nanoset import open_nanoset
from tokenmix.sources.token_file import TOKEN_FILE_KINDS, TokenFile, TokenFileError
from tokenmix.sources.urls import expand_urls


def open_token_files(kind: str, urls: list[str], dtype: str | None = None, eos_id: int | None = None) -> list[TokenFile]:
    """Open the token files of ``urls`` (in order; each expanded as its kind expects) as ``kind``.

    ``dtype`` gives the token type where the files do not say it (a Nanoset raw dump; datatrove files without
    metadata); ``eos_id`` splits a stream without document boundaries (Nanoset, packed Cerebras HDF5) into documents
    after each EOS.
    """
    if kind == "megatron":
        return [open_megatron(prefix) for prefix in _megatron_prefixes(urls)]
    if kind == "datatrove":
        return [open_datatrove(path, dtype) for path in datatrove_files(urls)]
    if kind == "nanoset":
        return [open_nanoset(path, dtype, eos_id) for path in expand_urls(urls)]
    if kind == "hdf5":
        return [open_cerebras_hdf5(path, eos_id) for path in expand_urls(urls)]
    raise TokenFileError(f"token_files.kind: {kind!r} is not a kind tokenmix reads; choose one of {list(TOKEN_FILE_KINDS)}")


def _megatron_prefixes(urls: list[str]) -> list[str]:
    """Megatron datasets named by prefix, or by their ``.bin``/``.idx`` files (a glob over both names each once)."""
    prefixes: list[str] = []
    for url in expand_urls(urls):
        prefix = url[: -len(".bin")] if url.endswith(".bin") else url[: -len(".idx")] if url.endswith(".idx") else url
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes
