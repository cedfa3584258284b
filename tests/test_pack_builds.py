"""Packs' build side under adversarial cases (issue 39): sources of several formats in one split, a shard that cannot be
read for now, a pack deleted, a member's input changed between its pack's end and its record, subsets, reorders and a
validation split built in turn, bad input beside caches built alone earlier, and two builders at once; each source
must read exactly as the cache it would have had built alone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import cache_bytes, read_jsonl_zst, start_builders, write_jsonl
from test_packs import _config, _config_file, _sources, _without_build

from tokenmix import LMMixtureDatasetConfig, build_caches
from tokenmix.cache.ledger import ShardChangedError
from tokenmix.cache.packs import MEMBER_FILE, PACKS_DIR, read_member
from tokenmix.config.caches import open_cache


def _reads_as_alone(config: LMMixtureDatasetConfig, alone: LMMixtureDatasetConfig, names: Any) -> None:
    """Each source of ``config`` opens with exactly the rows of the same source built alone under ``alone``."""
    for name in names:
        got, want = open_cache(config, name), open_cache(alone, name)
        rows = list(range(want.num_rows()))
        assert got.num_rows() == want.num_rows(), name
        assert [r.tolist() for r in got.get_rows(rows)] == [r.tolist() for r in want.get_rows(rows)], name


def test_sources_of_different_formats_in_one_split_are_each_encoded_with_their_own_format(tmp_path, demo_docs):
    import dataclasses

    from tokenmix import TextLmDatasetFormat

    sources = _sources(tmp_path, demo_docs, 12)
    keyed = {}
    for k, (name, urls) in enumerate(sources.items()):
        if k % 2:  # every other source keeps its text under another key, and says so in its format
            urls = [write_jsonl(Path(u).with_suffix(".content.jsonl"), [{"content": r["text"]} for r in _read_records(u)]) for u in urls]
        keyed[name] = urls

    def config(cache_dir: Path, **build: Any) -> LMMixtureDatasetConfig:
        base = _config(keyed, cache_dir, pack_min_sources=4, **build)
        return dataclasses.replace(base, configs={
            name: dataclasses.replace(source, format=TextLmDatasetFormat(text_key="content")) if k % 2 else source
            for k, (name, source) in enumerate(base.configs.items())})

    packed, alone = config(tmp_path / "packed"), config(tmp_path / "alone", pack_below_bytes=0)
    results, reference = build_caches(packed, progress=False), build_caches(alone, progress=False)
    assert len(list((tmp_path / "packed" / PACKS_DIR).iterdir())) == 2  # a pack per format
    assert all(_without_build(results[k]) == _without_build(reference[k]) for k in reference)
    _reads_as_alone(packed, alone, keyed)
    assert all(s["already_built"] for s in build_caches(packed, progress=False).values())


def _read_records(url: str) -> list[dict[str, Any]]:
    path = Path(url)
    return read_jsonl_zst(path) if path.suffix == ".zst" else [json.loads(line) for line in path.read_text().splitlines()]


def test_a_packed_source_whose_shard_could_not_be_read_is_read_as_if_built_alone_and_tried_again_by_the_next_build(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    blocked = Path(sources["s010"][0])
    text = blocked.read_bytes()
    blocked.unlink()
    blocked.mkdir()  # a shard that cannot be read for now: under on_error: skip, the next build tries it again
    first = build_caches(_config(sources, tmp_path / "cache"), progress=False)
    alone = build_caches(_config({"s010": sources["s010"]}, tmp_path / "alone"), progress=False)
    assert _without_build(first[("s010", "train")]) == _without_build(alone[("s010", "train")])
    assert open_cache(_config(sources, tmp_path / "cache"), "s010").num_rows() == 0
    blocked.rmdir()
    blocked.write_bytes(text)
    again = build_caches(_config(sources, tmp_path / "cache"), progress=False)
    reference = build_caches(_config({"s010": sources["s010"]}, tmp_path / "reference"), progress=False)
    assert _without_build(again[("s010", "train")]) == _without_build(reference[("s010", "train")])
    assert reference[("s010", "train")]["documents"] > 0
    _reads_as_alone(_config(sources, tmp_path / "cache"), _config(sources, tmp_path / "reference"), ["s010"])
    assert all(stats["already_built"] for key, stats in again.items() if key != ("s010", "train"))



def test_packed_sources_whose_pack_was_deleted_are_built_again_rather_than_taken_as_built(tmp_path, demo_docs):
    import shutil

    sources = _sources(tmp_path, demo_docs)
    config, alone = _config(sources, tmp_path / "cache"), _config(sources, tmp_path / "alone", pack_below_bytes=0)
    build_caches(config, progress=False)
    reference = build_caches(alone, progress=False)
    shutil.rmtree(tmp_path / "cache" / PACKS_DIR)  # to free the space, or to build it anew: its members' records remain
    again = build_caches(config, progress=False)
    assert not any(stats.get("already_built") for stats in again.values())
    assert all(_without_build(again[k]) == _without_build(reference[k]) for k in reference)
    _reads_as_alone(config, alone, sources)
    assert all(stats["already_built"] for stats in build_caches(config, progress=False).values())


def test_a_source_whose_input_changed_after_its_pack_finished_and_before_its_record_was_written_is_refused(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    config = _config(sources, tmp_path / "cache")
    build_caches(config, progress=False)
    record = tmp_path / "cache" / "s002" / "train" / MEMBER_FILE
    record.unlink()  # as a build killed before writing it leaves it
    os.utime(sources["s002"][0], ns=(1, 10**18))  # touched, its records the same: taken, and the record says what it is now
    assert all(stats["already_built"] for stats in build_caches(config, progress=False).values())
    written = read_member(str(record.parent))
    assert written is not None and written.shards[0].source == {"mtime_ns": 10**18, "size": Path(sources["s002"][0]).stat().st_size}
    record.unlink()
    changed = Path(sources["s002"][0])
    changed.write_text(changed.read_text().replace("a", "b", 1))
    with pytest.raises(ShardChangedError, match="s002.jsonl changed since the cache"):
        build_caches(config, progress=False)
    assert not (tmp_path / "cache" / "s002" / "train" / MEMBER_FILE).exists()




def test_builds_of_a_subset_then_the_whole_config_then_reordered_or_shrunk_read_each_source_and_rebuild_nothing(tmp_path, demo_docs):
    import dataclasses

    sources = _sources(tmp_path, demo_docs, 80)
    names = list(sources)
    config, alone = _config(sources, tmp_path / "cache"), _config(sources, tmp_path / "alone", pack_below_bytes=0)
    build_caches(alone, progress=False)
    build_caches(config, sources=names[10:50], progress=False)
    _reads_as_alone(config, alone, names[10:50])
    whole = build_caches(config, progress=False)
    assert {k[0] for k, stats in whole.items() if stats.get("already_built")} == set(names[10:50])
    assert len(list((tmp_path / "cache" / PACKS_DIR).iterdir())) == 2  # the subset's, then the other 40's
    _reads_as_alone(config, alone, names)
    reordered = dataclasses.replace(config, configs=dict(reversed(list(config.configs.items()))))
    shrunk = dataclasses.replace(config, configs={n: c for n, c in config.configs.items() if n != "s020"})
    for again in (build_caches(config, sources=names[10:50], progress=False), build_caches(reordered, progress=False),
                  build_caches(shrunk, progress=False)):
        assert again and all(stats["already_built"] for stats in again.values())
    _reads_as_alone(shrunk, alone, [n for n in names if n != "s020"])
    # each source gains a validation split: packed apart from the train split's, which stays as it is
    validated = {n: dataclasses.replace(c, validation_urls=sources[names[(k + 1) % len(names)]]) for k, (n, c) in enumerate(config.configs.items())}
    config, alone = dataclasses.replace(config, configs=validated), dataclasses.replace(alone, configs=validated)
    results, reference = build_caches(config, progress=False), build_caches(alone, progress=False)
    assert all(stats["already_built"] for (_, split), stats in results.items() if split == "train")
    assert len([p for p in (tmp_path / "cache" / PACKS_DIR).iterdir() if p.name.startswith("validation-")]) == 1
    assert all(_without_build(results[k]) == _without_build(reference[k]) for k in reference)
    for name in names[::7]:
        got, want = open_cache(config, name, "validation"), open_cache(alone, name, "validation")
        rows = list(range(want.num_rows()))
        assert [r.tolist() for r in got.get_rows(rows)] == [r.tolist() for r in want.get_rows(rows)], name


def test_sources_built_alone_earlier_stay_untouched_and_bad_records_are_counted_as_in_a_cache_of_their_own(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs, 50)
    (tmp_path / "inputs" / "empty.jsonl").write_bytes(b"")
    sources["s011"] = [str(tmp_path / "inputs" / "empty.jsonl"), *sources["s011"]]
    malformed = Path(sources["s013"][0])
    malformed.write_text(malformed.read_text() + "{not json\n" + malformed.read_text())
    names = list(sources)
    build_caches(_config({n: sources[n] for n in names[:10]}, tmp_path / "cache", pack_below_bytes=0), progress=False)
    earlier = {p: p.stat().st_mtime_ns for n in names[:10] for p in (tmp_path / "cache" / n).rglob("*") if p.is_file()}
    config, alone = _config(sources, tmp_path / "cache"), _config(sources, tmp_path / "alone", pack_below_bytes=0)
    results, reference = build_caches(config, progress=False), build_caches(alone, progress=False)
    assert {p: p.stat().st_mtime_ns for n in names[:10] for p in (tmp_path / "cache" / n).rglob("*") if p.is_file()} == earlier
    assert not any((tmp_path / "cache" / n / "train" / MEMBER_FILE).exists() for n in names[:10])
    assert len(list((tmp_path / "cache" / PACKS_DIR).iterdir())) == 1
    assert reference[("s011", "train")]["skipped_by_reason"] and reference[("s013", "train")]["skipped_by_reason"]
    assert all(_without_build(results[k]) == _without_build(reference[k]) for k in reference)
    _reads_as_alone(config, alone, names)


def test_two_processes_building_one_packed_config_at_once_end_with_one_pack_and_the_records_of_a_single_build(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs, 48)
    reference = build_caches(_config(sources, tmp_path / "reference"), progress=False)
    path = _config_file(sources, tmp_path / "cache", tmp_path / "config.yaml")
    procs = start_builders([path, path], tmp_path / "go")
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    (packed,), (uninterrupted,) = (list((tmp_path / d / PACKS_DIR).iterdir()) for d in ("cache", "reference"))
    assert cache_bytes(str(packed)) == cache_bytes(str(uninterrupted))
    for name in sources:
        got, want = (read_member(str(tmp_path / d / name / "train")) for d in ("cache", "reference"))
        assert got is not None and want is not None
        assert (got.rows, got.tokens, got.pack, got.pack_fingerprint) == (want.rows, want.tokens, want.pack, want.pack_fingerprint)
        assert _without_build(got.stats) == _without_build(reference[(name, "train")]), name
    assert all(s["already_built"] for s in build_caches(_config(sources, tmp_path / "cache"), progress=False).values())



def test_a_packed_sources_truncated_or_junk_ended_shard_is_taken_back_between_small_commits_as_in_a_cache_of_its_own(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs)
    for name in ("s003", "s007", "s011"):  # compressed: their records are trusted only once the stream's end is checked
        truncated = Path(sources[name][0])
        truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size * 2 // 3])
    junk = Path(sources["s015"][0])
    junk.write_bytes(junk.read_bytes() + b"\xff\xfe not utf8\n")
    small_commits = {"chunk_bytes": 256, "commit_interval_s": 0}
    config, alone = _config(sources, tmp_path / "cache", **small_commits), _config(sources, tmp_path / "alone", pack_below_bytes=0, **small_commits)
    results, reference = build_caches(config, progress=False), build_caches(alone, progress=False)
    assert len(list((tmp_path / "cache" / PACKS_DIR).iterdir())) == 1
    assert {k[0]: v["skipped_by_reason"] for k, v in reference.items() if v["skipped_by_reason"]} == {
        "s003": {"truncated_file": 1}, "s005": {"empty_document": 1}, "s007": {"truncated_file": 1}, "s011": {"truncated_file": 1},
        "s015": {"trailing_junk": 1}}
    assert all(_without_build(results[k]) == _without_build(reference[k]) for k in reference)
    _reads_as_alone(config, alone, sources)
