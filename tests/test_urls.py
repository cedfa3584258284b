import pytest

from tokenmix import NoShardsError
from tokenmix.sources import expand_urls


def test_brace_ranges_keep_zero_padding_and_order():
    assert expand_urls(["gs://b/train-{00..02}-of-{3,4}.jsonl.gz"]) == [
        "gs://b/train-00-of-3.jsonl.gz", "gs://b/train-00-of-4.jsonl.gz",
        "gs://b/train-01-of-3.jsonl.gz", "gs://b/train-01-of-4.jsonl.gz",
        "gs://b/train-02-of-3.jsonl.gz", "gs://b/train-02-of-4.jsonl.gz",
    ]


def test_patterns_keep_listed_order_and_drop_duplicates():
    assert expand_urls(["b/{2,1}.jsonl", "a.jsonl", "b/1.jsonl"]) == ["b/2.jsonl", "b/1.jsonl", "a.jsonl"]


def test_globs_are_sorted_and_keep_the_scheme(tmp_path):
    for name in ("c.jsonl", "a.jsonl", "b.jsonl", "skip.txt"):
        (tmp_path / name).write_text("{}\n")
    assert expand_urls([f"{tmp_path}/*.jsonl"]) == [f"{tmp_path}/{n}" for n in ("a.jsonl", "b.jsonl", "c.jsonl")]
    assert expand_urls([f"file://{tmp_path}/[ab].jsonl"]) == [f"file://{tmp_path}/a.jsonl", f"file://{tmp_path}/b.jsonl"]


def test_glob_matching_nothing_names_the_pattern(tmp_path):
    with pytest.raises(NoShardsError, match="nothing-here"):
        expand_urls([f"{tmp_path}/nothing-here-*.jsonl"])
