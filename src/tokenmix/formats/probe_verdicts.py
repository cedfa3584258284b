"""The verdicts of the backend check, on its probes and on builds' samples, remembered on this machine.

The probes (``backends.probe_texts``: fixed texts, and the tokenizer's added tokens written inside text) depend only on
the tokenizer's serialization, and what ``fastokens`` and ``tokenizers`` make of them only on that serialization and on
the two libraries. Yet every cold build paid for them again: the serialization parsed for its added tokens, the probes
encoded by both backends, about 50 ms of the GIL on the way to the first chunk encoded. So each verdict (the first
difference found, or none) is kept in a small file keyed by a SHA-256 of the serialization, of the fixed probe texts
and of which ``fastokens`` and ``tokenizers`` installations gave it (each package's ``__init__`` and native extensions:
path, size and modification time, which an upgrade, a reinstall or a rebuild in place changes) and of the module that
runs the probes (``backends.py``, likewise); a change to any of them is another key, and the probes run again. A
tokenizer that encodes at random (a BPE with dropout) is never remembered.

The other half of the check, the sample of a build's own input encoded by both backends into what the cache would hold
(``cache/backend_choice.py``), costs a cold build loading ``tokenizers`` (its serialization parsed, about 0.06 s of the
GIL) and encoding the sample twice. Its verdict depends only on the sample's records (bytes, and their positions), the
encoder spec (the serialization, the format and its settings, special tokens, dtype), the libraries (``numpy`` too,
which assembles what the cache holds, and those that make the text encoded: ``orjson``, ``ftfy``, ``jinja2``,
``transformers``) and the code that encodes (every module of ``tokenmix.formats``, and the module
that runs the check): all of them go into its key (``sample_verdict_key``), so a build whose sample was checked before
on this machine, with the same code and libraries, takes the verdict and loads no ``tokenizers``; anything else is
checked again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenmix.formats.tokenizer_facts import serialization_digest
from tokenmix.formats.tokenizer_identity import code_version, descriptions_dir, installed, remember_file

logger = logging.getLogger(__name__)

_FORMAT = 2
"""Version of a remembered verdict's layout and of its key; part of the key."""


@dataclass(frozen=True)
class ProbeVerdict:
    """What a check found (on the probes, or on a sample): where ``fastokens`` first differs from ``tokenizers``, or None
    where they agree."""

    difference: str | None


def verdict_key(tokenizer_json: str, checked: Sequence[str | bytes], checkers: Sequence[str], libraries: Sequence[str] = ()) -> str:
    """The key of a verdict on a serialized tokenizer: of what was checked (texts or bytes, in order), of the installed
    ``fastokens``, ``tokenizers`` and ``libraries``, and of the modules that ran the check (``checkers``, files: each
    one's path, size and modification time)."""
    digest = hashlib.sha256(f"{_FORMAT}\0".encode())
    for package in ("fastokens", "tokenizers", *libraries):
        digest.update(f"{package}={installed(package)}\0".encode())
    for checker in checkers:
        digest.update(f"{code_version(checker)}\0".encode())
    digest.update(serialization_digest(tokenizer_json))
    for item in checked:
        data = item if isinstance(item, bytes) else item.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def verdict_path(key: str, kind: str = "probes") -> Path:
    """Where the verdict of ``key`` on ``kind`` (``probes``, ``sample``) is kept: beside the remembered tokenizer
    descriptions."""
    return descriptions_dir() / f"{key}.{kind}.json"


def recall_verdict(key: str, kind: str = "probes") -> ProbeVerdict | None:
    """The verdict remembered under ``key``, or None (never given, or unreadable: the check runs again)."""
    try:
        known = json.loads(verdict_path(key, kind).read_text(encoding="utf-8"))
        difference = known["difference"]
        if difference is not None and not isinstance(difference, str):
            raise TypeError(f"difference is {difference!r}")
        return ProbeVerdict(difference)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        logger.debug("ignoring the remembered %s verdict %s: %s", kind, key, e)
        return None


def remember_verdict(key: str, verdict: ProbeVerdict, kind: str = "probes") -> None:
    """Keep ``verdict`` under ``key`` for later builds on this machine (only logged where it cannot be written)."""
    remember_file(verdict_path(key, kind), json.dumps({"difference": verdict.difference}).encode("utf-8"))
