"""Every kind of bad input, under both error policies: raise names file, line and reason; skip counts."""

import json
import logging
import random

import pytest
from helpers import build, write_lines

from tokenmix import BadInputError, TokenCache

GOOD = [json.dumps({"text": f"good document number {i}"}).encode() for i in range(4)]

RECORD_CASES = {
    "malformed_json": b'{"text": "no closing brace"',
    "missing_field": b'{"content": "the text is under another key"}',
    "wrong_type": b'{"text": 12345}',
    "invalid_utf8": b'{"text": "caf\xe9 au lait"}',
    "empty_document": b'{"text": "   "}',
    "token_out_of_range": b'{"input_ids": [5, 99999999]}',
}


@pytest.mark.parametrize("reason", sorted(RECORD_CASES))
def test_bad_record_raises_with_file_line_and_reason(tmp_path, reason):
    url = write_lines(tmp_path / "shard.jsonl", GOOD[:2] + [RECORD_CASES[reason]] + GOOD[2:])
    with pytest.raises(BadInputError) as err:
        build(str(tmp_path / "cache"), [url])
    message = str(err.value)
    assert f"{url}, line 3: {reason}" in message
    assert "on_error: skip" in message


@pytest.mark.parametrize("reason", sorted(RECORD_CASES))
def test_bad_record_is_skipped_and_counted(tmp_path, reason, caplog):
    url = write_lines(tmp_path / "shard.jsonl", GOOD[:2] + [RECORD_CASES[reason]] + GOOD[2:])
    with caplog.at_level(logging.WARNING):
        stats = build(str(tmp_path / "cache"), [url], on_error="skip")
    assert stats["documents"] == 4
    assert stats["records"] == 5
    assert stats["skipped_by_reason"] == {reason: 1}
    assert stats["shards"][url]["skipped"] == {reason: 1}
    assert f"{url}, line 3" in caplog.text
    assert TokenCache(str(tmp_path / "cache")).num_rows() == 4


def _truncated(tmp_path, suffix):
    rng = random.Random(1)
    lines = [json.dumps({"text": f"{rng.getrandbits(128):032x} {rng.getrandbits(128):032x}"}).encode() for _ in range(20_000)]
    path = tmp_path / f"trunc.jsonl{suffix}"
    write_lines(path, lines)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return str(path)


def _unreadable(tmp_path):
    (tmp_path / "a_directory.jsonl").mkdir()
    return str(tmp_path / "a_directory.jsonl")


def _empty(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    return str(tmp_path / "empty.jsonl")


SHARD_CASES = {
    "truncated zst": ("truncated_file", lambda p: _truncated(p, ".zst")),
    "truncated gz": ("truncated_file", lambda p: _truncated(p, ".gz")),
    "missing file": ("missing_file", lambda p: str(p / "does-not-exist.jsonl")),
    "unreadable file": ("unreadable_file", _unreadable),
    "empty shard": ("empty_shard", _empty),
}


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_bad_shard_raises_naming_the_file(tmp_path, case):
    reason, make = SHARD_CASES[case]
    bad = make(tmp_path)
    good = write_lines(tmp_path / "good.jsonl", GOOD)
    with pytest.raises(BadInputError) as err:
        build(str(tmp_path / "cache"), [good, bad])
    assert f"{bad}: {reason}" in str(err.value)
    # the good shard before it was committed and stays readable; a truncated shard's readable prefix is never verified
    assert TokenCache(str(tmp_path / "cache")).num_rows() == len(GOOD)


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_bad_shard_is_skipped_and_counted(tmp_path, case):
    reason, make = SHARD_CASES[case]
    bad = make(tmp_path)
    good = write_lines(tmp_path / "good.jsonl", GOOD)
    stats = build(str(tmp_path / "cache"), [bad, good], on_error="skip")
    assert stats["skipped_by_reason"] == {reason: 1}
    assert stats["discarded_shards"] == 1
    assert reason in stats["shards"][bad]["error"]
    assert stats["documents"] == len(GOOD)
    assert stats["shards"][bad]["documents"] == 0
    # every record read became a document or was counted as skipped
    assert stats["records"] == stats["documents"]


def test_a_clean_build_counts_every_record(tmp_path):
    url = write_lines(tmp_path / "a.jsonl", GOOD + [b"", b"   "] + GOOD)
    stats = build(str(tmp_path / "cache"), [url])
    assert stats["records"] == stats["documents"] == 8
    assert stats["skipped_records"] == 0


def test_json_lines_with_python_json_constants_or_big_integers_are_read_as_python_json_reads_them(tmp_path):
    """Python's json.dumps writes NaN and Infinity, and any integer; Levanter reads JSON lines with json.loads (and
    Hugging Face's pyarrow reads NaN and Infinity too). Before, such records were malformed_json (orjson refuses them);
    a lone surrogate escape, which no tokenizer can take, stays malformed."""
    extra = [json.dumps({"text": f"document with a {name} score", "score": value}).encode()
             for name, value in (("NaN", float("nan")), ("infinite", float("inf")), ("negative infinite", float("-inf")),
                                 ("huge", 2**70))]
    url = write_lines(tmp_path / "shard.jsonl", GOOD[:2] + extra + [b'{"text": "lone \\ud800 surrogate"}'] + GOOD[2:])
    stats = build(str(tmp_path / "cache"), [url], on_error="skip")
    assert stats["documents"] == len(GOOD) + len(extra)
    assert stats["skipped_by_reason"] == {"malformed_json": 1}
