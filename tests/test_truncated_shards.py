"""Compressed shards cut short: every record wholly before the cut is read, in order; the cut is reported where it is;
a build keeps none of them, since the stream's checksums are never reached (a cut looks like some bit flips do).

The shards are real JSON lines (the demo corpus' training records) compressed with gzip, with zstd as one frame and with
zstd as many frames that split lines between them, cut at several points. What a reader may yield is worked out
independently of the shard reader: the bytes zlib, and zstd's (silently short) stream reader, decode from the cut file,
of which only the lines ending in a newline are complete records.
"""

import gzip
import io
import json
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from helpers import DEMO_CORPUS, build, write_lines

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
"""Decompressed bytes per frame of the multi-frame zstd file: frames end mid-line."""


def _zstd_frame(data: bytes) -> bytes:
    """One zstd frame ending in a 4-byte checksum, as gzip ends in 8 bytes of CRC and size: a cut there loses no record."""
    return zstandard.ZstdCompressor(write_checksum=True).compress(data)


def _zstd_frames(data: bytes) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return b"".join(compressor.compress(data[i : i + FRAME_BYTES]) for i in range(0, len(data), FRAME_BYTES))


def _gzip_prefix(cut: bytes) -> bytes:
    return zlib.decompressobj(wbits=31).decompress(cut)


def _zstd_prefix(cut: bytes) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(cut), read_across_frames=True).read()


COMPRESSIONS: dict[str, tuple[str, Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "gzip": (".jsonl.gz", gzip.compress, _gzip_prefix),
    "zstd one frame": (".jsonl.zst", _zstd_frame, _zstd_prefix),
    "zstd many frames": (".jsonl.zst", _zstd_frames, _zstd_prefix),
}
CUTS: dict[str, Callable[[int], int]] = {
    "early": lambda size: size // 50,
    "middle": lambda size: size // 2,
    "near the end": lambda size: size * 97 // 100,
    "in the last bytes": lambda size: size - 3,
}


def _cut_shard(tmp_path: Path, compression: str, cut: str) -> tuple[str, int]:
    """A truncated shard and the number of complete records the decodable part of it holds."""
    suffix, compress, decodable = COMPRESSIONS[compression]
    whole = compress(DATA)
    kept = whole[: CUTS[cut](len(whole))]
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(kept)
    prefix = decodable(kept)
    assert DATA.startswith(prefix)
    return str(path), prefix.count(b"\n")


def _read(url: str, start: int = 0, chunk_bytes: int = 1 << 20) -> tuple[list[bytes], ShardReadError]:
    records: list[bytes] = []
    with pytest.raises(ShardReadError) as err:
        for chunk in FileShard(url).read(start, chunk_bytes):
            assert chunk.start == start + len(records)
            records.extend(chunk.records)
    return records, err.value


def test_the_corpus_is_a_few_hundred_records_and_the_frames_split_lines():
    assert 200 <= len(LINES) <= 1000
    assert any(not DATA[: end].endswith(b"\n") for end in range(FRAME_BYTES, len(DATA), FRAME_BYTES))


@pytest.mark.parametrize("cut", sorted(CUTS))
@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 4096])
def test_every_complete_record_before_the_cut_is_read_in_order(tmp_path, compression, cut, chunk_bytes):
    url, complete = _cut_shard(tmp_path, compression, cut)
    records, error = _read(url, chunk_bytes=chunk_bytes)
    assert records == LINES[:complete]
    assert error.reason == "truncated_file"
    assert error.position == complete
    assert f"line {complete + 1}" in str(error)
    if cut != "early":
        assert complete > 0
    if cut == "in the last bytes":
        assert complete == len(LINES)


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_a_partial_last_line_is_not_a_record(tmp_path, compression):
    suffix, compress, decodable = COMPRESSIONS[compression]
    whole = compress(DATA)
    size = next(n for n in range(len(whole) // 2, len(whole), 997) if not decodable(whole[:n]).endswith(b"\n"))
    complete = decodable(whole[:size]).count(b"\n")
    path = tmp_path / f"partial{suffix}"
    path.write_bytes(whole[:size])
    records, error = _read(str(path))
    assert records == LINES[:complete]
    assert error.position == complete
    stats = build(str(tmp_path / "cache"), [str(path)], on_error="skip")
    assert stats["skipped_by_reason"] == {"truncated_file": 1}
    assert stats["records"] == stats["documents"] == 0


def test_reading_resumes_inside_the_readable_part(tmp_path):
    url, complete = _cut_shard(tmp_path, "zstd many frames", "middle")
    records, error = _read(url, start=complete // 2, chunk_bytes=4096)
    assert records == LINES[complete // 2 : complete]
    assert error.position == complete


@pytest.mark.parametrize(("compression", "cut"), [("gzip", "middle"), ("zstd many frames", "near the end"), ("zstd one frame", "early")])
def test_a_skipping_build_keeps_no_record_of_a_cut_shard_and_counts_the_cut(tmp_path, hf_tokenizer, compression, cut):
    url, complete = _cut_shard(tmp_path, compression, cut)
    good = write_lines(tmp_path / "good.jsonl", LINES[:3])
    stats = build(str(tmp_path / "cache"), [url, good], on_error="skip", chunk_bytes=4096, commit_interval_s=0.0)
    assert stats["skipped_by_reason"] == {"truncated_file": 1}
    assert stats["shards"][url]["documents"] == stats["shards"][url]["records"] == 0
    assert f"line {complete + 1}" in stats["shards"][url]["error"]
    assert (f"none of the {complete} record positions read is kept" in stats["shards"][url]["error"]) == (complete > 0)
    assert stats["documents"] == 3
    texts = [json.loads(line)["text"] for line in LINES[:3]]
    want = [ids + [0] for ids in hf_tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    cache = TokenCache(str(tmp_path / "cache"))
    assert [row.tolist() for row in cache.get_rows(range(cache.num_rows()))] == want


def test_a_raising_build_names_the_file_and_line_and_keeps_only_the_rows_before_the_cut_shard(tmp_path):
    url, complete = _cut_shard(tmp_path, "gzip", "near the end")
    good = write_lines(tmp_path / "good.jsonl", LINES[:3])
    with pytest.raises(BadInputError) as err:
        build(str(tmp_path / "cache"), [good, url], chunk_bytes=4096, commit_interval_s=0.0)
    assert f"{url}: truncated_file" in str(err.value)
    assert f"line {complete + 1}" in str(err.value)
    assert TokenCache(str(tmp_path / "cache")).num_rows() == 3
