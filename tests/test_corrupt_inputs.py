"""Compressed shards damaged as disks and copies damage them: real gzip and zstd files with flipped bits, a checksum that
fails at their end, junk after their last frame, and text that begins with a UTF-8 byte order mark, built through
``build_caches`` and the CLI. A damaged stream adds no row to a cache, is counted by name, and is not tried again."""

from __future__ import annotations

import codecs
import gzip
import json
import random
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
import yaml
import zstandard
from helpers import DEMO_CORPUS, REPO, TOKENIZER, cache_bytes, write_lines

import tokenmix
from tokenmix import BadInputError, ShardReadError, TokenCache
from tokenmix.sources import FileShard

LINES = [
    line
    for source in ("linux_doc", "python_doc", "webster")
    for line in zstandard.ZstdDecompressor()
    .stream_reader((DEMO_CORPUS / source / "train-00-of-02.jsonl.zst").read_bytes(), read_across_frames=True)
    .read()
    .splitlines(keepends=True)
]
DATA = b"".join(LINES)
FRAME_BYTES = 150_000
GOOD = [json.dumps({"text": f"a good document, number {i}"}).encode() for i in range(5)]
BUILD = {"num_workers": 0, "on_error": "skip", "commit_interval_s": 0.0, "chunk_bytes": 1 << 14}
"""A commit after every chunk wherever the build may commit: rows of a damaged shard would be published if they could."""


def _zstd_frames(data: bytes) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return b"".join(compressor.compress(data[i : i + FRAME_BYTES]) for i in range(0, len(data), FRAME_BYTES))


def _flipped(data: bytes, byte: int, bit: int) -> bytes:
    damaged = bytearray(data)
    damaged[byte] ^= 1 << bit
    return bytes(damaged)


def _config(tmp_path: Path, name: str, urls: list[str], **build) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / name), "configs": {"web": {"train_urls": urls}},
                                    "build": {**BUILD, **build}}))
    return path


def _build(tmp_path: Path, name: str, urls: list[str], **build) -> tuple[dict, str]:
    """Build the cache of ``urls`` with ``build_caches``; its statistics and location."""
    stats = tokenmix.build_caches(tokenmix.load_data_config(_config(tmp_path, name, urls, **build)), progress=False)[("web", "train")]
    return stats, str(tmp_path / name / "web" / "train")


def _rows(location: str) -> list[list[int]]:
    cache = TokenCache(location)
    return [row.tolist() for row in cache.get_rows(range(cache.num_rows()))]


def _arrays(location: str) -> dict[str, bytes]:
    """The stored token and offset arrays of a cache: what its ledger and statistics leave out."""
    return {name: data for name, data in cache_bytes(location).items() if name.startswith("input_ids/")}


class _PublishedRows:
    """Every row count readers are shown while a build runs (polled from another thread)."""

    def __init__(self, location: str):
        self.location = location
        self.seen: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        cache = None
        while not self._stop.is_set():
            try:
                cache = cache or TokenCache(self.location)
                self.seen.append(cache.num_rows())
            except FileNotFoundError:
                pass
            time.sleep(0.001)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.seen


def test_every_bit_flip_of_a_gzip_shard_reads_whole_or_is_a_named_shard_error(tmp_path):
    """200 random flips: none escapes as a bare ``zlib.error`` or is taken for a storage failure to try again."""
    whole = gzip.compress(b"".join(LINES[:24]))
    rng = random.Random(34)
    outcomes: dict[str, int] = {}
    for attempt in range(200):
        path = tmp_path / f"flip{attempt}.jsonl.gz"
        path.write_bytes(_flipped(whole, rng.randrange(len(whole)), rng.randrange(8)))
        records: list[bytes] = []
        try:
            for chunk in FileShard(str(path)).read():
                records.extend(chunk.records)
        except ShardReadError as e:
            assert e.reason in ("corrupt_shard", "truncated_file"), e
            assert str(path) in str(e) and " byte " in str(e), e
            outcomes[e.reason] = outcomes.get(e.reason, 0) + 1
        else:  # a flip in a header field no checksum covers (time stamp, OS) changes no record
            assert records == LINES[:24]
            outcomes["read whole"] = outcomes.get("read whole", 0) + 1
    assert outcomes["corrupt_shard"] > 150, outcomes


def _decoder_error_flips(whole: bytes, count: int) -> list[bytes]:
    """Flips of a gzip file that zlib itself refuses mid-stream (not at the CRC at its end): what escaped as a bare
    ``zlib.error``."""
    found = []
    for byte in range(20, len(whole) - 8, 97):
        damaged = _flipped(whole, byte, byte % 8)
        try:
            zlib.decompressobj(wbits=31).decompress(damaged)
        except zlib.error as e:
            if "check" not in str(e):
                found.append(damaged)
        if len(found) == count:
            return found
    raise AssertionError("no flip that zlib refuses mid-stream")


def test_the_cli_counts_gzip_shards_zlib_refuses_names_them_and_finishes(tmp_path):
    whole = gzip.compress(b"".join(LINES[:24]))
    bad = []
    for i, damaged in enumerate(_decoder_error_flips(whole, 3)):
        (tmp_path / f"bad{i}.jsonl.gz").write_bytes(damaged)
        bad.append(str(tmp_path / f"bad{i}.jsonl.gz"))
    good = write_lines(tmp_path / "good.jsonl", GOOD)
    config = _config(tmp_path, "cache", [bad[0], good, *bad[1:]])
    result = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", str(config)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for url in bad:
        assert f"{url}: corrupt_shard after 0 record positions: the gzip member that starts at byte 0 is corrupt" in result.stderr
    stats = json.loads((tmp_path / "cache" / "web" / "train" / "stats.json").read_text())
    assert stats["skipped_by_reason"] == {"corrupt_shard": 3}
    assert stats["documents"] == len(GOOD)


def _flip_read_as_a_cut(whole: bytes) -> bytes:
    """A flip after which zlib decodes to the file's end without an error and without reaching the end of the member:
    a cut short file to a reader, but one whose decoded bytes are not the original's."""
    for byte in range(len(whole) - 9, 10, -1):
        for bit in range(8):
            damaged = _flipped(whole, byte, bit)
            decoder = zlib.decompressobj(wbits=31)
            try:
                decoded = decoder.decompress(damaged)
            except zlib.error:
                continue
            if not decoder.eof and not DATA.startswith(decoded):
                return damaged
    raise AssertionError("no flip that reads as a cut")


def test_a_bit_flip_that_reads_as_a_cut_adds_no_row(tmp_path):
    """Why a shard cut short keeps no row: a cut cannot be told from a flip that makes the decoder run past the end."""
    path = tmp_path / "flip.jsonl.gz"
    path.write_bytes(_flip_read_as_a_cut(gzip.compress(b"".join(LINES[:24]))))
    good = write_lines(tmp_path / "good.jsonl", GOOD)
    stats, location = _build(tmp_path, "cache", [good, str(path)])
    assert stats["skipped_by_reason"] == {"truncated_file": 1}
    assert stats["shards"][str(path)]["documents"] == 0
    _, alone = _build(tmp_path, "alone", [good])
    assert _rows(location) == _rows(alone)


DAMAGED_ENDS = {
    "gzip CRC-32": (".jsonl.gz", lambda: _flipped(gzip.compress(DATA), -7, 3), "incorrect data check"),
    "gzip length": (".jsonl.gz", lambda: _flipped(gzip.compress(DATA), -2, 0), "incorrect length check"),
    "zstd checksum of the last frame": (".jsonl.zst", lambda: _flipped(_zstd_frames(DATA), -2, 5), "doesn't match checksum"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_ENDS))
def test_a_shard_whose_checksum_fails_at_its_end_adds_no_row_and_is_not_tried_again(tmp_path, case, caplog):
    suffix, damaged, cause = DAMAGED_ENDS[case]
    path = tmp_path / f"damaged{suffix}"
    path.write_bytes(damaged())
    before, after = write_lines(tmp_path / "before.jsonl", GOOD[:2]), write_lines(tmp_path / "after.jsonl", GOOD[2:])
    location = str(tmp_path / "cache" / "web" / "train")
    watcher = _PublishedRows(location)
    try:
        stats, _ = _build(tmp_path, "cache", [before, str(path), after])
    finally:
        seen = watcher.stop()
    assert stats["skipped_by_reason"] == {"corrupt_shard": 1}
    shard = stats["shards"][str(path)]
    assert shard["documents"] == shard["records"] == 0
    assert cause in shard["error"] and "starts at byte" in shard["error"] and "record positions read is kept" in shard["error"]
    assert seen and max(seen) <= len(GOOD) and seen == sorted(seen), "rows of the damaged shard were published"
    _, alone = _build(tmp_path, "alone", [before, after])
    assert _rows(location) == _rows(alone)
    assert _arrays(location) == _arrays(alone), "the damaged shard's tokens are left in storage"
    with caplog.at_level("INFO", logger="tokenmix.cache.builder"):
        again, _ = _build(tmp_path, "cache", [before, str(path), after])
    assert "trying" not in caplog.text and again == {**stats, "already_built": True}


def test_a_raising_build_stops_at_a_corrupt_shard_keeping_only_the_rows_before_it(tmp_path):
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(_flipped(gzip.compress(DATA), -7, 3))
    before = write_lines(tmp_path / "before.jsonl", GOOD)
    with pytest.raises(BadInputError) as err:
        _build(tmp_path, "cache", [before, str(path)], on_error="raise")
    assert f"{path}: corrupt_shard" in str(err.value) and "incorrect data check" in str(err.value)
    assert TokenCache(str(tmp_path / "cache" / "web" / "train")).num_rows() == len(GOOD)


JUNK = b"these bytes are no frame\n"
WITH_JUNK = {
    "zstd, one frame": (".jsonl.zst", lambda data: zstandard.ZstdCompressor(write_checksum=True).compress(data)),
    "zstd, many frames": (".jsonl.zst", _zstd_frames),
    "gzip, two members": (".jsonl.gz", lambda data: gzip.compress(data[: len(data) // 2]) + gzip.compress(data[len(data) // 2 :])),
}


@pytest.mark.parametrize("case", sorted(WITH_JUNK))
def test_every_complete_frame_before_trailing_junk_is_kept_and_the_junk_counted(tmp_path, case, caplog):
    suffix, compress = WITH_JUNK[case]
    clean = tmp_path / f"clean{suffix}"
    clean.write_bytes(compress(DATA))
    junk = tmp_path / f"junk{suffix}"
    junk.write_bytes(clean.read_bytes() + JUNK)
    good = write_lines(tmp_path / "good.jsonl", GOOD)
    stats, location = _build(tmp_path, "cache", [str(junk), good])
    assert stats["skipped_by_reason"] == {"trailing_junk": 1}
    assert stats["shards"][str(junk)]["documents"] == len(LINES)
    assert f"end at byte {clean.stat().st_size:,}" in stats["shards"][str(junk)]["error"]
    _, alone = _build(tmp_path, "alone", [str(clean), good])
    assert _rows(location) == _rows(alone)
    with caplog.at_level("INFO", logger="tokenmix.cache.builder"):
        again, _ = _build(tmp_path, "cache", [str(junk), good])
    assert "trying" not in caplog.text and again == {**stats, "already_built": True}


def _json_array(lines: list[bytes]) -> bytes:
    return b"[" + b",\n".join(line.rstrip(b"\n") for line in lines) + b"]\n"


WITH_BOM = {
    "JSON lines": ("a.jsonl", lambda lines: b"".join(lines)),
    "gzip JSON lines": ("a.jsonl.gz", lambda lines: gzip.compress(b"".join(lines))),
    "JSON array": ("a.json", _json_array),
    "text": ("a.txt", lambda lines: json.loads(lines[0])["text"].encode()),
}


@pytest.mark.parametrize("case", sorted(WITH_BOM))
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, case):
    name, content = WITH_BOM[case]
    lines = [line + b"\n" for line in GOOD]
    (tmp_path / "bom").mkdir()
    (tmp_path / "plain").mkdir()
    data = content(lines)
    if name.endswith(".gz"):
        (tmp_path / "bom" / name).write_bytes(gzip.compress(codecs.BOM_UTF8 + gzip.decompress(data)))
    else:
        (tmp_path / "bom" / name).write_bytes(codecs.BOM_UTF8 + data)
    (tmp_path / "plain" / name).write_bytes(data)
    stats, location = _build(tmp_path, "bom-cache", [str(tmp_path / "bom" / name)], on_error="raise")
    plain_stats, plain = _build(tmp_path, "plain-cache", [str(tmp_path / "plain" / name)], on_error="raise")
    assert stats["skipped_by_reason"] == {} and stats["documents"] == plain_stats["documents"] == (1 if name.endswith(".txt") else 5)
    assert _rows(location) == _rows(plain)
