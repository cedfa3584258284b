"""The kinds of token files tokenmix reads, and opening a source's files as their kind: each of the user's paths
expanded as the kind expects (a Megatron prefix, a folder of datatrove files, a glob), in order, then read by that
kind's reader. The readers (numpy's users) are imported when a file is opened: a config names the kinds, and reading one
imports no numpy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenmix.sources.token_file_base import TokenFileError
from tokenmix.sources.urls import expand_urls

if TYPE_CHECKING:
    from tokenmix.sources.token_file_base import TokenFile

TOKEN_FILE_KINDS: tuple[str, ...] = ("megatron", "datatrove", "nanoset", "hdf5")


def open_token_files(kind: str, urls: list[str], dtype: str | None = None, eos_id: int | None = None) -> list[TokenFile]:
    """Open the token files of ``urls`` (in order; each expanded as its kind expects) as ``kind``.

    ``dtype`` gives the token type where the files do not say it (a Nanoset raw dump; datatrove files without
    metadata); ``eos_id`` splits a stream without document boundaries (Nanoset, packed Cerebras HDF5) into documents
    after each EOS.
    """
    if kind not in TOKEN_FILE_KINDS:
        raise TokenFileError(f"token_files.kind: {kind!r} is not a kind tokenmix reads; choose one of {list(TOKEN_FILE_KINDS)}")
    from tokenmix.sources.datatrove_tokens import datatrove_files

    targets = _megatron_prefixes(urls) if kind == "megatron" else datatrove_files(urls) if kind == "datatrove" else expand_urls(urls)
    return [open_token_file(kind, target, dtype, eos_id) for target in targets]


def open_token_file(kind: str, target: str, dtype: str | None = None, eos_id: int | None = None) -> TokenFile:
    """One token file of ``kind``: a Megatron prefix, or a file's path."""
    from tokenmix.sources.cerebras_hdf5 import open_cerebras_hdf5
    from tokenmix.sources.datatrove_tokens import open_datatrove
    from tokenmix.sources.megatron import open_megatron
    from tokenmix.sources.nanoset import open_nanoset

    if kind == "megatron":
        file = open_megatron(target)
    elif kind == "datatrove":
        file = open_datatrove(target, dtype)
    elif kind == "nanoset":
        file = open_nanoset(target, dtype, eos_id)
    else:
        file = open_cerebras_hdf5(target, eos_id)
    file.opened_as = (open_token_file, (kind, target, dtype, eos_id))
    return file


def _megatron_prefixes(urls: list[str]) -> list[str]:
    """Megatron datasets named by prefix, or by their ``.bin``/``.idx`` files (a glob over both names each once)."""
    prefixes: list[str] = []
    for url in expand_urls(urls):
        prefix = url[: -len(".bin")] if url.endswith(".bin") else url[: -len(".idx")] if url.endswith(".idx") else url
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes
