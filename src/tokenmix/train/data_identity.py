"""What data a training run reads, as named fields a checkpoint records and a resume compares.

A step's batch is a function of the data config, ``trainer.seq_len``, ``trainer.train_batch_size`` and the caches'
contents. ``data_identity`` holds every field of the data config (flattened: ``data.configs.web.train_urls``,
``data.train_weights.web``, ...) except those that only say where caches are stored or how they are built, or that
are accepted without effect (``NOT_DATA``); the tokenizer by its fingerprint (a hash of its files), not its path; and
the two trainer fields. ``caches_identity`` holds per training source its cache's identity fingerprint (tokenizer,
format, options), rows and tokens; it is taken once the caches are built, the other before, so that a config listing
other shards is refused before it extends a cache. A resume whose identity differs is refused field by field, unless
``trainer.allow_data_change`` is set; then the change is logged and recorded in the checkpoints that follow (changed
``train_weights`` become a stage of the run's weight log from the resume step: ``weight_log.py``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import draccus

from tokenmix.config.caches import open_cache
from tokenmix.formats.tokenizer_identity import tokenizer_identity
from tokenmix.train.config import TrainLmConfig

logger = logging.getLogger(__name__)

NOT_DATA = frozenset({
    "data.cache_dir", "data.build", "data.cache_options", "data.auto_build_caches", "data.components",
    "data.tokenizer",  # its path: recorded by its fingerprint instead
    "data.shuffle_buffer_size",  # already read into data.shuffle
    "data.permutation_type", "data.block_cross_document_attention",  # accepted without effect
})
"""Data config fields (and per source: ``cache_dir``, ``stream``, ``tags``, ``type``, Levanter's name for what its other
fields say) not recorded as they are: they change no batch."""
_NOT_SOURCE_DATA = frozenset({"cache_dir", "stream", "tags", "type"})
ALLOW_FLAG = "--trainer.allow_data_change true"


class DataChangedError(ValueError):
    """A resume would train on other data than the checkpoint it resumes from."""


def data_identity(config: TrainLmConfig) -> dict[str, Any]:
    """The named fields of ``config`` that fix which batch each step of its run gets (the caches aside: they are
    compared once built, ``caches_identity``)."""
    data_doc = {k: v for k, v in draccus.encode(config.data).items() if f"data.{k}" not in NOT_DATA}
    data_doc["configs"] = {name: {k: v for k, v in source.items() if k not in _NOT_SOURCE_DATA}
                           for name, source in data_doc["configs"].items()}
    fields = _flatten("data", data_doc)
    fields["data.tokenizer"] = tokenizer_identity(config.data.tokenizer_name("the data config")).fingerprint
    fields["trainer.seq_len"] = config.trainer.seq_len
    fields["trainer.train_batch_size"] = config.trainer.train_batch_size
    return _as_recorded(fields)


def caches_identity(config: TrainLmConfig, sources: list[str]) -> dict[str, Any]:
    """Per training source in ``sources``, its built cache's identity fingerprint (tokenizer, format, options), rows and
    tokens, as named fields (``caches.<source>.rows``, ...)."""
    fields = {}
    for name in sources:
        cache = open_cache(config.data, name, "train")
        fields.update(_flatten(f"caches.{name}", {"identity": cache.fingerprint, "rows": cache.num_rows(), "tokens": cache.num_tokens()}))
    return _as_recorded(fields)


def changed_fields(recorded: dict[str, Any], current: dict[str, Any]) -> dict[str, list[Any]]:
    """Each field whose value differs, as ``[recorded, current]`` (None where one side lacks it)."""
    return {k: [recorded.get(k), current.get(k)] for k in sorted(set(recorded) | set(current)) if recorded.get(k) != current.get(k)}


def accept_data_change(changes: dict[str, list[Any]], step: int, where: str, allow: bool, cause: str = "") -> None:
    """Refuse to resume from checkpoint ``where`` at ``step`` on changed data, naming each change (and ``cause``, what
    made it), unless ``allow``; then log it."""
    if not changes:
        return
    lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()) + (f"\n{cause}." if cause else "")
    if not allow:
        raise DataChangedError(
            f"{where} was trained up to step {step} on other data than this config gives (checkpoint -> config):\n{lines}\n"
            f"Resuming would train the steps from {step} on other batches than the run so far. Restore what changed; or pass "
            f"{ALLOW_FLAG} (trainer.allow_data_change: true) to go on with the new data from step {step} (the change is logged "
            "and recorded in the checkpoints); or use another trainer.checkpoint_dir to start a new run")
    logger.warning("resuming %s at step %d on changed data (trainer.allow_data_change; checkpoint -> config):\n%s", where, step, lines)


def _as_recorded(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as a checkpoint's record reads them back (tuples as lists)."""
    return json.loads(json.dumps(fields))


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flatten(f"{prefix}.{key}", item).items()}
    return {prefix: value}
