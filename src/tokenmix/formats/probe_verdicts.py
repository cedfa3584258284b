"""The verdicts of the backend check's probes, remembered on this machine.

The probes (``backends.probe_texts``: fixed texts, and the tokenizer's added tokens written inside text) depend only on
the tokenizer's serialization, and what ``fastokens`` and ``tokenizers`` make of them only on that serialization and on
the two libraries. Yet every cold build paid for them again: the serialization parsed for its added tokens, the probes
encoded by both backends, about 50 ms of the GIL on the way to the first chunk encoded. So each verdict (the first
difference found, or none) is kept in a small file keyed by a SHA-256 of the serialization, of the fixed probe texts
and of which ``fastokens`` and ``tokenizers`` installations gave it (each package's ``__init__``: path, size and
modification time, which an upgrade or reinstall changes) and of the module that runs the probes (``backends.py``,
likewise); a change to any of them is another key, and the probes run again. A tokenizer that encodes at random (a BPE
with dropout) is never remembered. The other half of the check, the sample of each build's own input encoded by both
backends, runs on every build as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenmix.formats.tokenizer_identity import descriptions_dir, installed, remember_file

logger = logging.getLogger(__name__)

_FORMAT = 1
"""Version of a remembered verdict's layout; part of the key."""


@dataclass(frozen=True)
class ProbeVerdict:
    """What the probes found: where ``fastokens`` first differs from ``tokenizers``, or None where they agree."""

    difference: str | None


def verdict_key(tokenizer_json: str, fixed_probes: Sequence[str], checker: str) -> str:
    """The key of the probes' verdict on a serialized tokenizer, with these fixed probe texts, the installed libraries
    and the module that runs the probes (``checker``, a file: its path, size and modification time)."""
    stat = os.stat(checker)
    digest = hashlib.sha256(f"{_FORMAT}\0{installed('fastokens')}\0{installed('tokenizers')}\0"
                            f"{checker}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    digest.update(hashlib.sha256("\0".join(fixed_probes).encode("utf-8", "surrogatepass")).digest())
    digest.update(hashlib.sha256(tokenizer_json.encode("utf-8", "surrogatepass")).digest())
    return digest.hexdigest()


def verdict_path(key: str) -> Path:
    """Where the verdict of ``key`` is kept: beside the remembered tokenizer descriptions."""
    return descriptions_dir() / f"{key}.probes.json"


def recall_verdict(key: str) -> ProbeVerdict | None:
    """The verdict remembered under ``key``, or None (never given, or unreadable: the probes run again)."""
    try:
        known = json.loads(verdict_path(key).read_text(encoding="utf-8"))
        difference = known["difference"]
        if difference is not None and not isinstance(difference, str):
            raise TypeError(f"difference is {difference!r}")
        return ProbeVerdict(difference)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        logger.debug("ignoring the remembered probe verdict %s: %s", key, e)
        return None


def remember_verdict(key: str, verdict: ProbeVerdict) -> None:
    """Keep ``verdict`` under ``key`` for later builds on this machine (only logged where it cannot be written)."""
    remember_file(verdict_path(key), json.dumps({"difference": verdict.difference}).encode("utf-8"))
