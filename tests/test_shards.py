"""Shard readers: every format, resuming at a position, streaming, and shard-level failures."""

import json
import random
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import write_jsonl, write_lines

from tokenmix import ShardReadError
from tokenmix.sources import FileShard, PlainText

RECORDS = [{"text": f"document {i} " + "word " * (i % 7), "id": i} for i in range(50)]


def records_of(url, start=0, chunk_bytes=1 << 20):
    out = []
    position = start
    for chunk in FileShard(url).read(start, chunk_bytes):
        assert chunk.start == position
        position += len(chunk.records)
        out.extend(json.loads(r) if isinstance(r, bytes) else r for r in chunk.records)
    return out


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".ndjson"])
def test_json_lines_in_every_compression(tmp_path, suffix):
    url = write_jsonl(tmp_path / f"shard{suffix}", RECORDS)
    assert records_of(url) == RECORDS
    assert records_of(url, start=17, chunk_bytes=64) == RECORDS[17:]


@pytest.mark.parametrize("suffix", [".json", ".json.zst"])
def test_json_array_streams_items_and_resumes(tmp_path, suffix):
    data = json.dumps(RECORDS).encode()
    path = tmp_path / f"arr{suffix}"
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if suffix.endswith(".zst") else data)
    assert records_of(str(path)) == RECORDS
    assert records_of(str(path), start=30, chunk_bytes=10) == RECORDS[30:]
    assert FileShard(str(path)).position_label(3).endswith("record 3")


def test_jsonl_positions_are_lines_so_labels_name_the_line(tmp_path):
    url = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    assert FileShard(url).position_label(4) == f"{url}, line 5"


def test_multi_frame_zstd_is_read_across_frames(tmp_path):
    lines = [json.dumps(r).encode() + b"\n" for r in RECORDS]
    comp = zstandard.ZstdCompressor()
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(comp.compress(b"".join(lines[:20])) + comp.compress(b"".join(lines[20:])))
    assert records_of(str(path)) == RECORDS


def _parquet(path, row_group_size=10):
    table = pa.table({"text": [r["text"] for r in RECORDS], "id": [r["id"] for r in RECORDS]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def test_parquet_reads_rows_and_resumes_mid_row_group(tmp_path):
    url = _parquet(tmp_path / "a.parquet")
    assert records_of(url) == RECORDS
    assert records_of(url, start=23, chunk_bytes=50) == RECORDS[23:]


def test_parquet_resume_does_not_read_earlier_row_groups(tmp_path):
    """Corrupt the first row groups' data pages: resuming past them must still work."""
    url = _parquet(tmp_path / "a.parquet")
    meta = pq.ParquetFile(url).metadata
    data = bytearray((tmp_path / "a.parquet").read_bytes())
    for group in range(2):
        for c in range(meta.num_columns):
            col = meta.row_group(group).column(c)
            start = col.dictionary_page_offset or col.data_page_offset
            data[start : start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    (tmp_path / "a.parquet").write_bytes(bytes(data))
    with pytest.raises(ShardReadError):
        records_of(url)
    assert records_of(url, start=20) == RECORDS[20:]


def test_a_corrupt_row_group_keeps_the_rows_read_before_it(tmp_path):
    """The rows of the row groups before a corrupt one are handed on, then the failure is raised at its position."""
    url = _parquet(tmp_path / "a.parquet")
    meta = pq.ParquetFile(url).metadata
    data = bytearray((tmp_path / "a.parquet").read_bytes())
    last = meta.num_row_groups - 1
    for c in range(meta.num_columns):
        col = meta.row_group(last).column(c)
        start = col.dictionary_page_offset or col.data_page_offset
        data[start : start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    (tmp_path / "a.parquet").write_bytes(bytes(data))
    read = []
    with pytest.raises(ShardReadError) as info:
        for chunk in FileShard(url).read(0, chunk_bytes=1 << 20):
            read.extend(chunk.records)
    assert read == RECORDS[: 10 * last] and info.value.position == 10 * last


def test_txt_file_is_one_document(tmp_path):
    (tmp_path / "doc.txt").write_text("line one\nline two\n")
    chunks = list(FileShard(str(tmp_path / "doc.txt")).read())
    assert [c.records for c in chunks] == [[PlainText(b"line one\nline two\n")]]
    assert list(FileShard(str(tmp_path / "doc.txt")).read(start=1)) == []


def test_unknown_suffix_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="unknown shard format"):
        FileShard("data/shard.csv")


def test_truncated_zstd_and_gzip_are_errors_not_short_reads(tmp_path):
    rng = random.Random(0)
    # incompressible text, so the file spans many compressed blocks and a prefix of it decodes
    lines = [json.dumps({"text": f"{rng.getrandbits(128):032x}"}).encode() for _ in range(50_000)]
    for suffix in (".jsonl.zst", ".jsonl.gz"):
        path = tmp_path / f"t{suffix}"
        write_lines(path, lines)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        seen = 0
        with pytest.raises(ShardReadError) as err:
            for chunk in FileShard(str(path)).read(chunk_bytes=256):
                seen += len(chunk.records)
        assert err.value.reason == "truncated_file"
        assert err.value.position == seen > 0


def test_a_zstd_frame_needing_a_larger_window_than_readers_allow_is_refused_with_the_fix_not_as_corrupt(tmp_path):
    """A frame written with ``zstd --long=28`` is sound, but zstd's readers refuse its 256 MiB window unless told; before,
    it was called corrupt ("no record decoded from the file can be trusted: copy it again"), which no copy mends."""
    lines = [json.dumps(r).encode() + b"\n" for r in RECORDS]
    long_window = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(window_log=28))
    streamed = long_window.compressobj()  # no content size in the header: the frame declares its window
    path = tmp_path / "long.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[:10])) + streamed.compress(b"".join(lines[10:])) + streamed.flush())
    with pytest.raises(ShardReadError) as err:
        records_of(str(path))
    assert err.value.reason == "unreadable_file" and err.value.position == 10
    assert "needs a 256 MiB window (written with zstd --long=28)" in err.value.detail
    assert "zstd -dc --long=31" in err.value.detail



def test_a_larger_window_is_named_when_the_frame_header_straddles_a_read_of_the_file(tmp_path):
    """The frame that needs the larger window begins 5 bytes before the end of the reader's first 64 KiB of input (after
    a skippable frame), so its header arrives in two reads: it is named as the larger window all the same, where it was
    called corrupt as soon as its header was cut that way."""
    lines = [json.dumps(r).encode() + b"\n" for r in RECORDS]
    first = zstandard.ZstdCompressor().compress(b"".join(lines[:10]))
    padding = (1 << 16) - 5 - len(first) - 8
    skippable = bytes([0x50, 0x2A, 0x4D, 0x18]) + padding.to_bytes(4, "little") + bytes(padding)
    streamed = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(window_log=28)).compressobj()
    path = tmp_path / "long.jsonl.zst"
    path.write_bytes(first + skippable + streamed.compress(b"".join(lines[10:])) + streamed.flush())
    with pytest.raises(ShardReadError) as err:
        records_of(str(path))
    assert err.value.reason == "unreadable_file" and err.value.position == 10, err.value.detail
    assert f"the zstd frame that starts at byte {(1 << 16) - 5:,} needs a 256 MiB window" in err.value.detail

def test_missing_file_is_a_shard_error(tmp_path):
    with pytest.raises(ShardReadError) as err:
        list(FileShard(str(tmp_path / "nope.jsonl")).read())
    assert err.value.reason == "missing_file"


def test_reading_streams_in_bounded_memory(tmp_path):
    """A ~40 MB shard is read with a peak far below its size."""
    path = tmp_path / "big.jsonl"
    line = json.dumps({"text": "x" * 4000}).encode()
    write_lines(path, [line] * 10_000)
    tracemalloc.start()
    n = sum(len(c.records) for c in FileShard(str(path)).read(chunk_bytes=1 << 20))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == 10_000
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while reading a {path.stat().st_size / 2**20:.0f} MiB shard"
