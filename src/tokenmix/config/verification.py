"""Verifying a cache (``tokenmix verify``), and finding what a repair needs: the cache's inputs and its encoder, from the
data config that built it or, without one, from the cache's own ledger (its tokenizer, format and shard names).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import draccus

from tokenmix.cache.ledger import LEDGER_FILE, CacheLedger, CacheMismatchError
from tokenmix.cache.packs import stored_cache_of
from tokenmix.cache.repair import RepairError
from tokenmix.cache.repair import repair as repair_from_inputs
from tokenmix.cache.scrub import CacheReport, ledger_shards, scrub
from tokenmix.cache.stats import STATS_FILE
from tokenmix.cache.store import DocumentDamagedError, JsonDocuments
from tokenmix.config.caches import DataConfigBase, cache_targets
from tokenmix.config.tokenization import TokenizationConfig
from tokenmix.formats.base import LmDatasetFormatBase
from tokenmix.sources.shards import Shard

if TYPE_CHECKING:
    from tokenmix.formats.encoder_spec import EncoderSpec

logger = logging.getLogger(__name__)


def verify_cache(location: str, repair: bool = False, inputs: bool = True, config: DataConfigBase | None = None,
                 progress: bool = True) -> CacheReport:
    """Check every stored byte of a cache against its checksums, bounds and ledger; optionally repair.

    Reads every stored chunk of the cache at ``location``, holds its row bounds against its ledger and (``inputs``) its
    inputs against the digests of the records it read; with ``repair``, rewrites the damaged rows from those inputs when
    they are unchanged, and checks again. ``config``: the data config that built the cache
    (its shards and encoder); without one they are taken from the cache's ledger. A source built in a pack
    (``cache/packs.py``) is checked by checking its pack, whose shards and encoder its ledger gives. Raises ``RepairError`` when a repair
    cannot be done exactly; never writes anything otherwise."""
    stored = stored_cache_of(location)
    if stored != location:  # a source in a pack: the pack is what is stored, checked and repaired, from its own ledger
        location, config = stored, None
    shards, spec = _inputs_and_encoder(location, config, need_encoder=False)
    report = scrub(location, shards, inputs=inputs or repair, progress=progress)
    if repair and not report.ok:
        shards, spec = _inputs_and_encoder(location, config, need_encoder=True)
        report = repair_from_inputs(location, report, shards, spec, progress=progress)  # type: ignore[arg-type]
    return report


def _inputs_and_encoder(location: str, config: DataConfigBase | None, need_encoder: bool) -> tuple[list[Shard] | None, EncoderSpec | None]:
    """The cache's input shards (None: as the ledger names them) and, when needed, the encoder that built it."""
    if config is not None:
        target = next((t for t in cache_targets(config) if t.location.rstrip("/") == location.rstrip("/")), None)
        if target is None:
            raise RepairError(f"the data config defines no cache at {location}; give the config that built it")
        if need_encoder:
            try:
                _ledger_of(location).check_identity({**target.identity, **config.build.layout_identity()}, location)
            except CacheMismatchError as e:
                raise RepairError(f"cannot repair {location} with this data config, which would encode other tokens: {e}") from None
        return target.shards, _with_backend(location, target.spec) if need_encoder else None
    if not need_encoder:
        return None, None
    ledger = _ledger_of(location)
    return _ledger_shards(location, ledger), _with_backend(location, _ledger_encoder(location, ledger))


def _ledger_of(location: str) -> CacheLedger:
    return CacheLedger.from_json(JsonDocuments(location).read(LEDGER_FILE) or {})


def _ledger_shards(location: str, ledger: CacheLedger) -> list[Shard]:
    shards = ledger_shards(ledger)
    unreadable = [p.name for p, shard in zip(ledger.shards, shards) if shard is None]
    if unreadable:
        raise RepairError(f"cannot repair {location} without its data config: {unreadable[0]} is not a file it can read again "
                          "(a Hugging Face dataset); give the config that built the cache (--config_path)")
    return shards  # type: ignore[return-value]


def _ledger_encoder(location: str, ledger: CacheLedger) -> EncoderSpec:
    """The encoder that built the cache, made from its ledger: the tokenizer it names and the format its identity holds;
    it must give the very identity the cache records."""
    tokenizer = ledger.info.get("tokenizer")
    if not tokenizer:
        raise RepairError(f"cannot repair {location} without its data config: its ledger does not name its tokenizer; give the "
                          "config that built the cache (--config_path)")
    identity = ledger.identity
    fmt = draccus.decode(LmDatasetFormatBase, identity["format"])
    tokenization = TokenizationConfig(tokenizer=tokenizer, enforce_eos=identity.get("eos_id") is not None,
                                      enforce_bos=identity.get("bos_id") is not None)
    spec, made = tokenization.encoder_spec(fmt, f"the tokenizer {tokenizer!r} of the cache at {location}")
    stored = {k: v for k, v in identity.items() if k not in ("compression", "pack")}  # the layout's, and a pack's members
    if made != stored:
        differ = sorted(k for k in set(made) | set(stored) if made.get(k) != stored.get(k))
        raise RepairError(f"cannot repair {location} without its data config: the tokenizer {tokenizer!r} and format its ledger "
                          f"names give another identity ({', '.join(differ)} differ); give the config that built the cache "
                          "(--config_path)")
    return spec


def _with_backend(location: str, spec: EncoderSpec) -> EncoderSpec:
    """The encoder with the tokenizer backend the build used (``stats.json``), so that re-read rows get its very ids."""
    try:
        stats = JsonDocuments(location).read(STATS_FILE) or {}
    except DocumentDamagedError as e:  # as if it were missing: the scrub names it, and intact chunks still check the ids
        logger.warning("%s; the repair encodes with the default tokenizer backend", e)
        stats = {}
    backend = ((stats.get("build") or {}).get("tokenizer_backend") or {}).get("name")
    return dataclasses.replace(spec, backend=backend) if backend else spec
