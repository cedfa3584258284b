"""Caches Levanter built, opened as they are: its ``shard_ledger.json`` read as a ledger.

Levanter's token caches store the same jagged ``input_ids/{data,offsets}`` arrays as ours (``offsets[0]`` the row
count; ids of the type of the exemplar the cache was built with: int32, or int64 from its ``BatchTokenizer``), so only
the ledger differs; the ids are read in the type they were stored in. Levanter records no tokenizer fingerprint, only the tokenizer's name, its
vocabulary size and whether BOS and EOS were added; opening checks those against the config instead of the identity
a tokenmix cache carries.
"""

from __future__ import annotations

from typing import Any

from tokenmix.cache.ledger import CacheLedger, CacheMismatchError, ShardProgress, fingerprint_of

LEVANTER_LEDGER = "shard_ledger.json"
LEVANTER_KEY = "levanter_cache"
"""The identity key that marks a ledger read from Levanter's."""


def is_levanter(identity: dict[str, Any]) -> bool:
    """Whether an identity is that of a cache Levanter built."""
    return bool(identity.get(LEVANTER_KEY))


def ledger_from_levanter(doc: dict[str, Any]) -> CacheLedger:
    """Levanter's ``shard_ledger.json`` as a ledger: its shards, rows and completion, and an identity made of what its
    metadata says about the tokenizer (``dtype`` None: whatever the arrays hold, which the reader fills in); its ``info``
    names the tokenizer where a tokenmix ledger does, for what decodes a cache's rows (``tokenmix inspect``, exports)."""
    meta = (doc.get("metadata") or {}).get("preprocessor_metadata") or {}
    identity = {
        LEVANTER_KEY: True,
        "tokenizer": meta.get("tokenizer"),
        "vocab_size": meta.get("vocab_size"),
        "append_bos": meta.get("append_bos"),
        "append_eos": meta.get("append_eos"),
        "dtype": None,
    }
    finished = set(doc.get("finished_shards") or [])
    shards = [ShardProgress(name, rows=int(rows), finished=name in finished) for name, rows in (doc.get("shard_rows") or {}).items()]
    return CacheLedger(identity=identity, shards=shards, rows=int(doc.get("total_num_rows", 0)), tokens=0,
                       finished=bool(doc.get("is_finished")), info={"built_by": "levanter", "tokenizer": meta.get("tokenizer")})


def check_levanter_identity(found: dict[str, Any], expected: dict[str, Any], location: str) -> None:
    """Refuse a Levanter cache whose vocabulary, BOS/EOS or contents are not what the config asks for."""
    wanted = {"vocab_size": expected.get("vocab_size"), "append_bos": expected.get("bos_id") is not None,
              "append_eos": expected.get("eos_id") is not None}
    problems = [f"  {k}: Levanter's cache has {found.get(k)!r}, the config asks for {v!r}" for k, v in wanted.items() if found.get(k) != v]
    if expected.get("loss_spans"):
        problems.append("  format: the config's format masks the loss, but Levanter's token caches store ids only")
    if expected.get("format", {}).get("type") not in (None, "text"):
        problems.append(f"  format: {expected['format']['type']!r} documents, but a Levanter token cache holds plain text ids")
    if problems:
        raise CacheMismatchError(
            f"cache at {location} was built by Levanter (tokenizer {found.get('tokenizer')!r}) with other settings than the config's "
            f"(fingerprint {fingerprint_of(expected)}):\n" + "\n".join(problems) +
            "\nPoint the source at a cache built with this tokenizer and these settings (or set enforce_eos / enforce_bos to "
            "match the cache), or use another cache_dir to build one.")


def built_by_levanter(ledger: dict[str, Any] | None, levanter: dict[str, Any] | None, location: str) -> bool:
    """Whether ``location``, whose tokenmix ledger and Levanter ledger are these documents (None: absent), holds a
    finished cache Levanter built (and none of ours); an unfinished one is refused: its builder is Levanter's, and a
    tokenmix build would write into arrays of another layout."""
    if ledger is not None or levanter is None:
        return False
    if not levanter.get("is_finished"):
        raise ValueError(f"{location} holds a cache Levanter has not finished building; finish it with Levanter, or delete it "
                         "(or use another cache_dir) to build it with tokenmix")
    return True
