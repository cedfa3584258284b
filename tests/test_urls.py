import json
from pathlib import Path

import pytest
from helpers import build, write_jsonl

from tokenmix import NoShardsError, ShardListMismatchError, TokenCache
from tokenmix.sources import expand_urls


def test_brace_ranges_keep_zero_padding_and_order():
    assert expand_urls(["gs://b/train-{00..02}-of-{3,4}.jsonl.gz"]) == [
        "gs://b/train-00-of-3.jsonl.gz", "gs://b/train-00-of-4.jsonl.gz",
        "gs://b/train-01-of-3.jsonl.gz", "gs://b/train-01-of-4.jsonl.gz",
        "gs://b/train-02-of-3.jsonl.gz", "gs://b/train-02-of-4.jsonl.gz",
    ]


def test_patterns_keep_listed_order_and_drop_duplicates():
    assert expand_urls(["gs://b/{2,1}.jsonl", "gs://a.jsonl", "gs://b/1.jsonl"]) == ["gs://b/2.jsonl", "gs://b/1.jsonl", "gs://a.jsonl"]


def test_a_local_file_has_one_absolute_name_however_it_is_written_and_urls_keep_theirs(tmp_path, monkeypatch):
    """Plain paths, brace patterns and globs name a local file alike: absolute, normalized, relative ones resolved
    against the current directory (so the same file written two ways is one shard); a URL with a scheme is as written."""
    (tmp_path / "data").mkdir()
    for name in ("a", "b"):
        (tmp_path / "data" / f"{name}.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    named = [str(tmp_path / "data" / "a.jsonl"), str(tmp_path / "data" / "b.jsonl")]
    assert expand_urls(["data/{a,b}.jsonl"]) == named
    assert expand_urls(["data/*.jsonl"]) == named
    assert expand_urls(["./data/a.jsonl", "data/../data/b.jsonl"]) == named
    assert expand_urls(["~/data/{a,b}.jsonl"]) == named
    assert expand_urls(["data/a.jsonl", named[0], "data/[a].jsonl", "data/{b,a}.jsonl"]) == [named[0], named[1]]
    assert expand_urls(["s3://bucket/./x/{1,2}.jsonl", "file://data/a.jsonl", "hf://datasets/x/y"]) == [
        "s3://bucket/./x/1.jsonl", "s3://bucket/./x/2.jsonl", "file://data/a.jsonl", "hf://datasets/x/y"]


def test_a_cache_whose_ledger_names_its_shards_relative_still_extends_and_opens(tmp_path, monkeypatch):
    """Builds before local shard names were made absolute recorded a brace pattern's or a plain path's names as written,
    relative to the directory they ran in; such a cache extends when the same files are named in any spelling (here a
    glob), takes the absolute names, and opens. From another directory the relative names are other files: refused."""
    (tmp_path / "data").mkdir()
    for name, count in (("a", 5), ("b", 7)):
        write_jsonl(tmp_path / "data" / f"{name}.jsonl", [{"text": f"document {i} of {name}"} for i in range(count)])
    location = str(tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    build(location, ["data/a.jsonl"])  # the shard named as such builds named it
    ledger = Path(location) / "ledger.json"
    assert [s["name"] for s in json.loads(ledger.read_text())["shards"]] == ["data/a.jsonl"]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(ShardListMismatchError, match="differs at shard 0"):
        build(location, [str(tmp_path / "data" / "a.jsonl")])
    monkeypatch.chdir(tmp_path)
    stats = build(location, expand_urls(["data/*.jsonl"]))
    assert stats["documents"] == 12
    assert [s["name"] for s in json.loads(ledger.read_text())["shards"]] == expand_urls(["data/{a,b}.jsonl"])
    assert TokenCache(location).num_rows() == 12


def test_globs_are_sorted_and_keep_the_scheme(tmp_path):
    for name in ("c.jsonl", "a.jsonl", "b.jsonl", "skip.txt"):
        (tmp_path / name).write_text("{}\n")
    assert expand_urls([f"{tmp_path}/*.jsonl"]) == [f"{tmp_path}/{n}" for n in ("a.jsonl", "b.jsonl", "c.jsonl")]
    assert expand_urls([f"file://{tmp_path}/[ab].jsonl"]) == [f"file://{tmp_path}/a.jsonl", f"file://{tmp_path}/b.jsonl"]


def test_glob_matching_nothing_names_the_pattern(tmp_path):
    with pytest.raises(NoShardsError, match="nothing-here"):
        expand_urls([f"{tmp_path}/nothing-here-*.jsonl"])


def test_a_file_whose_name_holds_glob_characters_is_that_file_not_what_the_glob_matches(tmp_path):
    for name in ("part[1].jsonl", "part1.jsonl", "parts.jsonl"):
        (tmp_path / name).write_text("{}\n")
    assert expand_urls([f"{tmp_path}/part[1].jsonl", f"{tmp_path}/part[s1].jsonl"]) == [
        f"{tmp_path}/part[1].jsonl", f"{tmp_path}/part1.jsonl", f"{tmp_path}/parts.jsonl"]
