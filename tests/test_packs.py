"""Packs (issue 39): many small sources of a split built as one cache, each source read back as the cache it would have
had built alone, resumable, re-run for free, rebuilt where its inputs change, and checked."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from helpers import TOKENIZER, cache_bytes, start_builders, write_jsonl

from tokenmix import BuildOptions, LMDatasetSourceConfig, LMMixtureDatasetConfig, build_caches
from tokenmix.cache.ledger import ShardChangedError
from tokenmix.cache.packs import MEMBER_FILE, PACKS_DIR, MemberDamagedError, read_member
from tokenmix.cache.reader import CacheNotFoundError, TokenCache
from tokenmix.cache.store import DocumentDamagedError
from tokenmix.config.caches import open_cache

SOURCES = 40
"""More than ``BuildOptions.pack_min_sources``: a build packs them."""


def _sources(tmp_path: Path, demo_docs: dict[str, list[dict[str, Any]]], count: int = SOURCES) -> dict[str, list[str]]:
    """``count`` small sources cut from the demo corpus, one shard each (every fourth compressed, one of two shards, one
    of a document with no text)."""
    docs = [d for source in sorted(demo_docs) for d in demo_docs[source]]
    directory = tmp_path / "inputs"
    directory.mkdir(exist_ok=True)
    out = {}
    for i in range(count):
        suffix = ".jsonl.zst" if i % 4 == 3 else ".jsonl"
        records = [{"text": ""}] if i == 5 else [docs[(3 * i + j) % len(docs)] for j in range(1 + i % 4)]
        out[f"s{i:03d}"] = [write_jsonl(directory / f"s{i:03d}{suffix}", records)]
    out["s007"].append(write_jsonl(directory / "s007-b.jsonl", docs[:2]))
    return out


def _config(sources: dict[str, list[str]], cache_dir: Path, **build: Any) -> LMMixtureDatasetConfig:
    """A mixture of the sources; bad records skipped, so that one source keeps no document."""
    return LMMixtureDatasetConfig(tokenizer=TOKENIZER, cache_dir=str(cache_dir),
                                  configs={name: LMDatasetSourceConfig(train_urls=urls) for name, urls in sources.items()},
                                  build=BuildOptions(**{"on_error": "skip", **build}))


def _config_file(sources: dict[str, list[str]], cache_dir: Path, path: Path) -> Path:
    """The mixture of ``sources`` as a config file at ``path``, for a builder process: a commit after every chunk of 256
    bytes (so that a process stopped midway has committed some), bad records skipped."""
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(cache_dir),
                                    "configs": {name: {"train_urls": urls} for name, urls in sources.items()},
                                    "build": {"commit_interval_s": 0, "chunk_bytes": 256, "on_error": "skip"}}))
    return path


def _rows_in_pack(cache_dir: Path, name: str) -> list[np.ndarray]:
    location = str(cache_dir / name / "train")
    record = read_member(location)
    assert record is not None, location
    pack = TokenCache(record.pack_location(location))
    return pack.get_rows(list(range(*record.rows)))


def _without_build(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if k not in ("build", "already_built")}


def test_small_sources_are_built_as_one_pack_holding_each_ones_rows_and_statistics_as_if_built_alone(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    results = build_caches(_config(sources, tmp_path / "packed"), progress=False)
    alone = build_caches(_config(sources, tmp_path / "alone", pack_below_bytes=0), progress=False)
    packs = list((tmp_path / "packed" / PACKS_DIR).iterdir())
    assert len(packs) == 1 and packs[0].name.startswith("train-"), packs
    assert list(results) == list(alone) == [(name, "train") for name in sources]
    for name in sources:
        # the source's own location holds its member record only: no arrays, ledger or lock of its own
        assert sorted(p.name for p in (tmp_path / "packed" / name / "train").iterdir()) == [MEMBER_FILE], name
        want = TokenCache(str(tmp_path / "alone" / name / "train"))
        got = _rows_in_pack(tmp_path / "packed", name)
        assert len(got) == want.num_rows() == alone[(name, "train")]["documents"], name
        assert all(np.array_equal(g, w) for g, w in zip(got, want.get_rows(list(range(want.num_rows()))))), name
        assert _without_build(results[(name, "train")]) == _without_build(alone[(name, "train")]), name
        assert results[(name, "train")]["build"]["pack"] == f"../../{PACKS_DIR}/{packs[0].name}"


def test_a_rerun_builds_nothing_and_a_source_whose_inputs_grew_is_built_again_while_the_others_stay_packed(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    cache_dir = tmp_path / "cache"
    build_caches(_config(sources, cache_dir), progress=False)
    pack = next((cache_dir / PACKS_DIR).iterdir())
    before = {p: p.stat().st_mtime_ns for p in pack.rglob("*")}
    again = build_caches(_config(sources, cache_dir), progress=False)
    assert all(stats["already_built"] for stats in again.values())
    assert {p: p.stat().st_mtime_ns for p in pack.rglob("*")} == before
    grown = {**sources, "s012": [*sources["s012"], write_jsonl(tmp_path / "inputs" / "s012-more.jsonl", [{"text": "one more document"}])]}
    results = build_caches(_config(grown, cache_dir), progress=False)
    assert not results[("s012", "train")].get("already_built") and all(
        stats["already_built"] for key, stats in results.items() if key != ("s012", "train"))
    # one source to build is too few to pack: it gets a cache of its own, and its stale record is gone
    own = cache_dir / "s012" / "train"
    assert (own / "ledger.json").exists() and not (own / MEMBER_FILE).exists()
    reference = build_caches(_config({"s012": grown["s012"]}, tmp_path / "reference"), progress=False)
    assert cache_bytes(str(own)) == cache_bytes(str(tmp_path / "reference" / "s012" / "train"))
    assert _without_build(results[("s012", "train")]) == _without_build(reference[("s012", "train")])
    assert open_cache(_config(grown, cache_dir), "s012").num_rows() == reference[("s012", "train")]["documents"]
    assert {p: p.stat().st_mtime_ns for p in pack.rglob("*")} == before


def test_a_packed_source_whose_input_changed_is_refused_as_a_cache_of_its_own_would_be(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    build_caches(_config(sources, tmp_path / "cache"), progress=False)
    changed = Path(sources["s002"][0])
    changed.write_text(changed.read_text().replace("a", "b", 1))
    with pytest.raises(ShardChangedError, match="s002.jsonl changed since the cache"):
        build_caches(_config(sources, tmp_path / "cache"), progress=False)


def test_few_or_large_sources_are_built_alone_and_packing_can_be_turned_off(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    few = dict(list(sources.items())[:31])
    build_caches(_config(few, tmp_path / "few"), progress=False)
    assert not (tmp_path / "few" / PACKS_DIR).exists() and all((tmp_path / "few" / n / "train" / "ledger.json").exists() for n in few)
    size = Path(sources["s001"][0]).stat().st_size
    build_caches(_config(sources, tmp_path / "large", pack_below_bytes=size - 1, pack_min_sources=2), progress=False)
    small = {n for n, urls in sources.items() if sum(Path(u).stat().st_size for u in urls) < size}
    assert 2 <= len(small) < len(sources)
    for name in sources:
        assert (tmp_path / "large" / name / "train" / (MEMBER_FILE if name in small else "ledger.json")).exists(), name
    build_caches(_config(sources, tmp_path / "off", pack_below_bytes=0), progress=False)
    assert not (tmp_path / "off" / PACKS_DIR).exists()


def test_a_damaged_member_record_is_refused_naming_it_and_a_build_writes_it_again_from_its_pack(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    cache_dir = tmp_path / "cache"
    build_caches(_config(sources, cache_dir), progress=False)
    record = cache_dir / "s003" / "train" / MEMBER_FILE
    original = record.read_bytes()
    doc = json.loads(original)
    doc["rows"][1] += 1
    record.write_text(json.dumps(doc))
    with pytest.raises(MemberDamagedError, match=f"{cache_dir / 's003' / 'train'}.*{MEMBER_FILE}.*checksum.*Delete {MEMBER_FILE}"):
        open_cache(_config(sources, cache_dir), "s003")
    pack = next((cache_dir / PACKS_DIR).iterdir())
    before = {p: p.stat().st_mtime_ns for p in pack.rglob("*")}
    results = build_caches(_config(sources, cache_dir), progress=False)
    assert all(stats["already_built"] for stats in results.values())
    assert record.read_bytes() == original
    assert {p: p.stat().st_mtime_ns for p in pack.rglob("*")} == before
    record.unlink()  # lost (a build stopped before writing it, or deleted by hand): written again the same way
    build_caches(_config(sources, cache_dir), progress=False)
    assert record.read_bytes() == original
    record.write_bytes(b"")  # what a power loss leaves of a write never synced (records are synced once, all together)
    with pytest.raises(CacheNotFoundError):
        open_cache(_config(sources, cache_dir), "s003")
    build_caches(_config(sources, cache_dir), progress=False)
    assert record.read_bytes() == original
    record.write_bytes(original[: len(original) // 2])  # cut short: no longer JSON
    with pytest.raises(MemberDamagedError, match=f"{cache_dir / 's003' / 'train'}.*{MEMBER_FILE}.*not a JSON document.*Delete {MEMBER_FILE}"):
        open_cache(_config(sources, cache_dir), "s003")
    assert all(stats["already_built"] for stats in build_caches(_config(sources, cache_dir), progress=False).values())
    assert record.read_bytes() == original


def test_a_ledger_that_is_not_json_is_refused_naming_it_and_the_fix(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs, 8)  # too few to pack: a cache each
    cache_dir = tmp_path / "cache"
    build_caches(_config(sources, cache_dir), progress=False)
    ledger = cache_dir / "s001" / "train" / "ledger.json"
    ledger.write_bytes(ledger.read_bytes()[:100])
    with pytest.raises(DocumentDamagedError, match=f"{ledger} is damaged: not a JSON document.*Delete the cache and build it again"):
        build_caches(_config(sources, cache_dir), progress=False)


def test_a_pack_build_killed_midway_resumes_to_the_bytes_and_records_of_an_uninterrupted_one(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs, 48)
    reference = build_caches(_config(sources, tmp_path / "reference"), progress=False)
    path = _config_file(sources, tmp_path / "killed", tmp_path / "config.yaml")
    builder = start_builders([path], None)[0]
    try:
        _poll_until_committed(tmp_path / "killed", builder)
    finally:
        builder.kill()
        builder.wait()
    assert not list((tmp_path / "killed").glob(f"*/train/{MEMBER_FILE}"))
    results = build_caches(_config(sources, tmp_path / "killed"), progress=False)
    (killed,), (uninterrupted,) = (list((tmp_path / d / PACKS_DIR).iterdir()) for d in ("killed", "reference"))
    assert killed.name == uninterrupted.name
    assert cache_bytes(str(killed)) == cache_bytes(str(uninterrupted))
    for name in sources:
        assert _without_build(results[(name, "train")]) == _without_build(reference[(name, "train")]), name
    # killed once the pack was finished, before every record was written: the next build writes the missing ones
    for name in list(sources)[::3]:
        (tmp_path / "killed" / name / "train" / MEMBER_FILE).unlink()
    again = build_caches(_config(sources, tmp_path / "killed"), progress=False)
    assert all(stats["already_built"] for stats in again.values())
    assert cache_bytes(str(killed)) == cache_bytes(str(uninterrupted))
    for name in sources:
        got, want = (read_member(str(tmp_path / d / name / "train")) for d in ("killed", "reference"))
        assert got is not None and want is not None
        assert (got.rows, got.tokens, got.pack, got.pack_fingerprint) == (want.rows, want.tokens, want.pack, want.pack_fingerprint)
        assert got.identity == want.identity, name
        assert _without_build(got.stats) == _without_build(want.stats), name


def _poll_until_committed(cache_dir: Path, builder: Any, timeout: float = 120.0) -> None:
    """Wait until the pack has committed some rows and is not finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ledger in cache_dir.glob(f"{PACKS_DIR}/*/ledger.json"):
            try:
                doc = json.loads(ledger.read_text())
            except (OSError, ValueError):  # replaced while read
                continue
            if doc["rows"] > 0 and not doc["finished"]:
                return
        assert builder.poll() is None, builder.stdout.read()
        time.sleep(0.005)
    raise AssertionError("the pack committed no rows in time")


def test_verify_of_a_packed_config_checks_each_pack_once_and_repair_restores_its_bytes(tmp_path, demo_docs):
    from test_damaged_caches import flip, tokenmix_cli

    sources = _sources(tmp_path, demo_docs)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"), "build": {"on_error": "skip"},
                                      "configs": {name: {"train_urls": urls} for name, urls in sources.items()}}))
    build_caches(tokenmix_config(config), progress=False)
    (pack,) = (tmp_path / "cache" / PACKS_DIR).iterdir()
    pristine = cache_bytes(str(pack))
    clean = tokenmix_cli("verify", "--config_path", str(config), "--json")
    assert clean.returncode == 0, clean.stderr
    assert [r["location"] for r in json.loads(clean.stdout)] == [str(pack)]
    data = pack / "input_ids" / "data" / "c" / "0"
    flip(data, data.stat().st_size - 7)
    found = tokenmix_cli("verify", "--config_path", str(config))
    assert found.returncode == 1 and "DAMAGED" in found.stdout and str(pack) in found.stdout, found.stdout + found.stderr
    alone = tokenmix_cli("verify", str(tmp_path / "cache" / "s009" / "train"))  # a source's location: its pack is checked
    assert alone.returncode == 1 and str(pack) in alone.stdout
    repaired = tokenmix_cli("verify", "--config_path", str(config), "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert cache_bytes(str(pack)) == pristine


def tokenmix_config(path: Path) -> Any:
    from tokenmix import load_data_config

    return load_data_config(str(path))


def test_a_mixture_of_packed_sources_gives_the_batches_of_the_same_sources_built_alone_here_and_in_a_loaders_readers(tmp_path, demo_docs):
    import dataclasses

    import jax

    from tokenmix import DataLoader

    sources = _sources(tmp_path, demo_docs)
    weights = {name: 1 + i % 5 for i, name in enumerate(sources) if name != "s005"}  # s005 keeps no document
    packed, alone = (dataclasses.replace(_config({n: sources[n] for n in weights}, tmp_path / d, **build), train_weights=weights, shuffle=True)
                     for d, build in (("packed", {}), ("alone", {"pack_below_bytes": 0})))
    build_caches(packed, progress=False)
    build_caches(alone, progress=False)
    assert (tmp_path / "packed" / PACKS_DIR).exists() and not (tmp_path / "alone" / PACKS_DIR).exists()
    here, there = packed.train_set(64), alone.train_set(64)
    indices = np.random.default_rng(0).choice(4096, 96, replace=False)
    assert np.array_equal(here.get_batch(indices).tokens, there.get_batch(indices).tokens)
    mesh = jax.make_mesh((1,), ("data",))
    with DataLoader(here, 8, mesh, {"batch": "data"}, workers=1) as loader:
        for step, batch in zip(range(3), loader):
            assert np.array_equal(np.asarray(batch.batch.tokens.array), there.get_batch(np.arange(8 * step, 8 * step + 8)).tokens), step


def test_a_packed_source_is_refused_for_a_config_of_another_identity_and_inspected_and_exported_from_its_location(tmp_path, demo_docs):
    import dataclasses

    from test_damaged_caches import tokenmix_cli

    from tokenmix.cache.ledger import CacheMismatchError

    sources = _sources(tmp_path, demo_docs)
    config = _config(sources, tmp_path / "cache")
    build_caches(config, progress=False)
    with pytest.raises(CacheMismatchError, match="(?s)s001.*bos_id"):
        open_cache(dataclasses.replace(config, enforce_bos=True), "s001")
    location = tmp_path / "cache" / "s001" / "train"
    shown = tokenmix_cli("inspect", str(location), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["stats"] == open_cache(config, "s001").stats()
    build_caches(_config({"s001": sources["s001"]}, tmp_path / "alone"), progress=False)
    for name, where in (("packed", location), ("alone", tmp_path / "alone" / "s001" / "train")):
        exported = tokenmix_cli("export", "--cache", str(where), "--to", "megatron", "--output", str(tmp_path / name / "s001"))
        assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in (tmp_path / "packed").glob("s001*")) == ["s001.bin", "s001.idx"]
    for suffix in (".bin", ".idx"):
        assert (tmp_path / "packed" / f"s001{suffix}").read_bytes() == (tmp_path / "alone" / f"s001{suffix}").read_bytes()


@pytest.mark.timeout(300)
def test_small_sources_on_s3_are_packed_only_when_asked_and_read_as_the_local_build(s3, tmp_path, demo_docs):
    import dataclasses

    from s3_server import BUCKET

    sources = _sources(tmp_path, demo_docs)
    unpacked = dataclasses.replace(_config(sources, tmp_path / "unused"), cache_dir=f"s3://{BUCKET}/default-{time.time_ns()}")
    build_caches(unpacked, progress=False)  # the default on object storage: a cache per source, whose reads fetch less
    assert type(open_cache(unpacked, "s001")).__name__ == "TokenCache"
    remote = dataclasses.replace(_config(sources, tmp_path / "unused", pack_below_bytes=16 << 20),
                                 cache_dir=f"s3://{BUCKET}/packs-{time.time_ns()}")
    local = _config(sources, tmp_path / "local")
    built = build_caches(remote, progress=False)
    reference = build_caches(local, progress=False)
    assert all(_without_build(built[k]) == _without_build(reference[k]) for k in reference)
    assert all(s["already_built"] for s in build_caches(remote, progress=False).values())
    for name in list(sources)[::7]:
        there, here = open_cache(remote, name), open_cache(local, name)
        assert there.location.startswith("s3://") and type(there).__name__ == "PackedSourceCache"
        rows = list(range(here.num_rows()))
        assert [r.tolist() for r in there.get_rows(rows)] == [r.tolist() for r in here.get_rows(rows)], name


def test_a_member_whose_pack_is_gone_is_refused_naming_it_the_pack_and_the_fix_which_reads_it_again(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    config = _config(sources, tmp_path / "cache")
    build_caches(config, progress=False)
    want = [r.tolist() for r in _rows_in_pack(tmp_path / "cache", "s003")]
    (pack,) = (tmp_path / "cache" / PACKS_DIR).iterdir()
    shutil.rmtree(pack)
    location = tmp_path / "cache" / "s003" / "train"
    with pytest.raises(CacheNotFoundError, match=rf"{location}: its member record reads rows of the pack at {pack}, where there is no "
                                                 r"cache.*build the caches again \(tokenmix build-cache\)"):
        open_cache(config, "s003")
    from test_damaged_caches import tokenmix_cli

    checked = tokenmix_cli("verify", str(location))  # what a user runs then: the pack is checked, and found gone
    assert checked.returncode == 1 and f"{location}: its member record reads rows of the pack at {pack}, where there is no cache" in \
        checked.stderr, checked.stderr
    build_caches(config, progress=False)  # the fix the message gives
    cache = open_cache(config, "s003")
    assert [r.tolist() for r in cache.get_rows(range(cache.num_rows()))] == want
