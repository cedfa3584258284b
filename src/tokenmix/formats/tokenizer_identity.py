"""What a cache's identity needs of a tokenizer, known without loading it once its files have been described.

Opening a cache checks that it was made with the config's tokenizer, which needs the tokenizer's fingerprint,
vocabulary size and special ids. Describing a tokenizer loads it through ``transformers`` (about 0.8 s from a cold
start, most of it the import); a reader that only opens caches should not pay that. So every description of a
local tokenizer directory (or single ``tokenizer.json`` file) is remembered in a small file keyed by a digest of its
tokenizer files and of the ``tokenizers``/``transformers`` installations that described it; an open whose key matches reads that file instead.
Changing any tokenizer file, or upgrading either library, changes the key. Hub ids are described in full each time
(their files live in the hub cache under names this module does not resolve).

A build needs the whole description (``tokenizer_info``): also the backend's serialization, which the encoders load,
its named special tokens and chat template. Those are remembered too, the serialization (megabytes) in a file of its
own beside the identity's, so that an open still reads only the small one; a build of a tokenizer described before
imports no ``transformers`` either (about 1 s of a build's start-up, more than the shared corpus takes to encode).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import tokenmix.formats.tokenizer
from tokenmix._safe_files import UnsafeFileError, create_new
from tokenmix.formats.tokenizer import TokenizerIdentity, TokenizerInfo, describe_tokenizer, file_state, tokenizer_files

logger = logging.getLogger(__name__)

_FORMAT = 3
"""Version of the remembered description's layout; part of the key."""
_DESCRIBING_CODE = tokenmix.formats.tokenizer.__file__
"""The module whose code describes a tokenizer (which tokens are BOS, EOS, padding; the fingerprint): part of the key."""


def tokenizer_identity(name_or_path: str) -> TokenizerIdentity:
    """The identity of a tokenizer: remembered, when its files were described before on this machine, else described
    (loading it) and remembered."""
    key = _files_key(name_or_path)
    if key is not None:
        known = _recall(key)
        if known is not None:
            return known
    return _described(name_or_path, key).identity()


def tokenizer_info(name_or_path: str) -> TokenizerInfo:
    """The whole description of a tokenizer (what a build needs): remembered, when its files were described before on
    this machine, else described (loading it) and remembered."""
    key = _files_key(name_or_path)
    known = _recalled_infos.get((key, name_or_path)) if key is not None else None
    if key is not None and known is None:
        known = _recall_info(key, name_or_path)
        if known is not None:
            _recalled_infos[(key, name_or_path)] = known
    return known if known is not None else _described(name_or_path, key)


def _described(name_or_path: str, key: str | None) -> TokenizerInfo:
    """A fresh description of a tokenizer whose files had ``key`` before it, remembered under ``key`` only where they
    still have it after: files that changed meanwhile may have been described in either version."""
    info = describe_tokenizer(name_or_path)
    if key is not None and _files_key(name_or_path) == key:
        _store(key, info)
        _recalled_infos[(key, name_or_path)] = info
    return info


def descriptions_dir() -> Path:
    """Where descriptions are kept: ``$TOKENMIX_CACHE_DIR/tokenizers``, else under ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    root = os.environ.get("TOKENMIX_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenmix")
    return Path(root) / "tokenizers"


def _files_key(name_or_path: str) -> str | None:
    """A digest of a local tokenizer directory's files, or of a tokenizer file, and of the libraries and the code that
    describe them; None for a hub id."""
    path = os.path.abspath(os.path.expanduser(name_or_path))
    files = tokenizer_files(path)
    if not files:
        return None
    # a file is described otherwise than a directory holding only it (its special tokens are not configured): keys apart
    root, kind = (os.path.dirname(path), "file\0") if os.path.isfile(path) else (path, "")
    libraries = f"{installed('tokenizers')}\0{installed('transformers')}\0{code_version(_DESCRIBING_CODE)}"
    digest = hashlib.sha256(f"{kind}{_FORMAT}\0{libraries}".encode())
    for file in files:
        digest.update(os.path.relpath(file, root).encode() + b"\0" + _file_digest(file, file_state(file)))
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, state: tuple[int, ...]) -> bytes:
    """SHA-256 of a file's bytes, read again only when its state (``file_state``) changes (a tokenizer.json is megabytes,
    and every open asks)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


_NATIVE = (".so", ".pyd")
"""Endings of the native extensions at the top of a package (``fastokens``' and ``tokenizers``' code is all in one)."""


def installed(package: str) -> str:
    """Which installation of a package this is, without importing it (``importlib.metadata`` costs 30 ms a package): where
    its ``__init__`` lies, and the size and modification time of it and of the native extensions beside it, which an
    upgrade, a reinstall or a rebuild in place changes."""
    spec = find_spec(package)
    if spec is None or spec.origin is None:
        return "absent"
    files = [spec.origin]
    if spec.submodule_search_locations:
        files += sorted(entry.path for entry in os.scandir(os.path.dirname(spec.origin)) if entry.name.endswith(_NATIVE))
    return ";".join(map(code_version, files))


def code_version(path: str) -> str:
    """Which version of a file of code this is: its path, size and modification time, which an edit, a checkout or a
    reinstall changes."""
    stat = os.stat(path)
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


_recalled_infos: dict[tuple[str, str], TokenizerInfo] = {}
"""Whole descriptions this process read or made, by files key and name: a build of a thousand sources asks for each."""
_IDENTITY_FIELDS = [f.name for f in dataclasses.fields(TokenizerIdentity)]


def _recall(key: str) -> TokenizerIdentity | None:
    try:
        known = _read_description(key)
        return TokenizerIdentity(**{name: known[name] for name in _IDENTITY_FIELDS})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:  # unreadable, damaged or from another layout: describe again
        logger.debug("ignoring the remembered tokenizer description %s: %s", key, e)
        return None


def _recall_info(key: str, name_or_path: str) -> TokenizerInfo | None:
    try:
        known = _read_description(key)
        backend = (descriptions_dir() / f"{key}.backend").read_bytes()
        if hashlib.sha256(backend).hexdigest() != known["backend_sha256"]:
            raise ValueError(f"{key}.backend is not the serialization described (damaged)")
        backend_json = backend.decode("utf-8")
        return TokenizerInfo(**{name: known[name] for name in _IDENTITY_FIELDS}, name_or_path=name_or_path, backend_json=backend_json,
                             special_tokens=tuple((k, v) for k, v in known["special_tokens"]), chat_template=known["chat_template"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:  # unreadable, damaged or from another layout: describe again
        logger.debug("ignoring the remembered tokenizer description %s: %s", key, e)
        return None


def _read_description(key: str) -> dict[str, Any]:
    """The small file of the description under ``key``, whose checksum must match it (``ValueError`` where it does not)."""
    known = json.loads((descriptions_dir() / f"{key}.json").read_text(encoding="utf-8"))
    if not isinstance(known, dict) or known.pop("sha256", None) != _sha256(json.dumps(known, sort_keys=True)):
        raise ValueError(f"{key}.json does not match its checksum (damaged)")
    return known


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _store(key: str, info: TokenizerInfo) -> None:
    """The serialization first, then the small file an open reads: a description whose small file exists is whole. The
    small file holds the serialization's checksum and its own, checked before either is trusted."""
    described = {**asdict(info.identity()), "special_tokens": info.special_tokens, "chat_template": info.chat_template,
                 "backend_sha256": _sha256(info.backend_json)}
    described["sha256"] = _sha256(json.dumps(described, sort_keys=True))
    if remember_file(descriptions_dir() / f"{key}.backend", info.backend_json.encode("utf-8")):
        remember_file(descriptions_dir() / f"{key}.json", json.dumps(described, sort_keys=True).encode("utf-8"))


def remember_file(target: Path, data: bytes) -> bool:
    """Write ``data`` at ``target`` whole or not at all (a scratch file renamed over it), and say whether it was; a
    directory that cannot be written (read-only, full) is only logged, and left as it was: what is remembered is
    remembered to save time, never needed."""
    scratch = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with create_new(str(scratch), "scratch file of what tokenmix remembers of a tokenizer") as f:
            f.write(data)
        os.replace(scratch, target)
        return True
    except OSError as e:  # a read-only home: every open describes the tokenizer (and every build checks it), as before
        logger.debug("could not remember %s: %s", target, e)
        if not isinstance(e, UnsafeFileError):  # a link planted at the scratch path is refused, never removed
            with contextlib.suppress(OSError):
                os.remove(scratch)
        return False
