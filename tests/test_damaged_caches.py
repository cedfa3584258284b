"""What is on disk is checked: a flipped bit, a cut-short or deleted stored object is an error naming the cache, the
chunk and the rows on every read path (never other tokens, never zeros), and `tokenmix verify` finds it and repairs it
from the cache's inputs to the very bytes the build wrote. Real caches, real files, real processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, TOKENIZER, cache_bytes, demo_urls, write_jsonl

import tokenmix
from tokenmix import CacheDamagedError, TokenCache, TokenSeqDataset
from tokenmix.cache import store
from tokenmix.cache.chunk_cache import ChunkCache
from tokenmix.cache.damage import DamagedChunk
from tokenmix.export import export_cache

SEQ_LEN = 300
BY_POSITION = {"read_tokens", "read_ranges"}
"""Read paths that take tokens by their position in the stream, touching no row bounds beyond the last row's end."""
FROM_OPEN_OBJECT = {"dataset (exact)", "dataset (chunk cache)"}
"""Read paths that take the row ends from the finished cache's open object (checked itself), never from ``offsets``."""


def tokenmix_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenmix.cli.main", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def small_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored objects of 2^12 tokens (chunks of 2^9) and of 64 row ends (chunks of 16): a demo cache has many of each."""
    monkeypatch.setattr(store, "DATA_SHARD", 1 << 12)
    monkeypatch.setattr(store, "DATA_INNER", 1 << 9)
    monkeypatch.setattr(store, "OFFSETS_SHARD", 64)
    monkeypatch.setattr(store, "OFFSETS_INNER", 16)


def write_config(path: Path, cache_dir: Path, compression: str = "zstd", supervised: Path | None = None) -> Path:
    configs = {"linux": {"train_urls": demo_urls("linux_doc")}}
    if supervised is not None:
        configs = {"qa": {"train_urls": [str(supervised)], "format": {"type": "supervised"}}}
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(cache_dir), "configs": configs,
           "build": {"num_workers": 0, "compression": compression, "chunk_bytes": 1 << 15}}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """A pristine cache per compression, and one of a format with loss spans, all in the small layout."""
    root = tmp_path_factory.mktemp("pristine")
    qa = root / "qa.jsonl"
    records = [{"prompt": f"Question {i}: what is {i} squared?" * (1 + i % 7), "response": f"It is {i * i}." * (1 + i % 5)} for i in range(1500)]
    write_jsonl(qa, records)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        small_layout(mp)
        for name, compression, supervised in (("zstd", "zstd", None), ("lz4", "lz4", None), ("none", "none", None),
                                              ("spans", "zstd", qa)):
            config = tokenmix.load_data_config(str(write_config(root / f"{name}.yaml", root / name, compression, supervised)))
            tokenmix.build_caches(config, progress=False)
            out[name] = root / name
    return out


def fresh(built: dict[str, Path], name: str, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a pristine cache directory (every source in it) and its one cache."""
    cache_dir = tmp_path / name
    shutil.copytree(built[name], cache_dir)
    (location,) = [p.parent for p in cache_dir.glob("*/*/ledger.json")]
    return cache_dir, location


def read_paths(location: Path) -> dict[str, object]:
    """Every way the tokens of a cache are read, each reading all of them."""

    def tensorstore_tokens():
        cache = TokenCache(str(location))
        return cache.read_tokens(0, cache.num_tokens())

    def rows():
        cache = TokenCache(str(location))
        return np.concatenate(cache.get_rows(range(cache.num_rows())))

    def exact_ranges():
        cache = TokenCache(str(location), chunk_cache=ChunkCache(0))
        total, unit = cache.num_tokens(), cache.read_unit
        begin = np.arange(0, total, unit)
        return np.concatenate(cache.read_ranges(begin, np.minimum(unit, total - begin), total)())

    def dataset(chunk_cache: int):
        def read():
            ds = TokenSeqDataset(TokenCache(str(location), chunk_cache=ChunkCache(chunk_cache)), SEQ_LEN)
            return ds.get_batch(np.arange(len(ds))).tokens
        return read

    def export(tmp: Path = location.parent / "export"):
        def run():
            shutil.rmtree(tmp, ignore_errors=True)
            export_cache(TokenCache(str(location)), "megatron", str(tmp / "out"), progress=False)
            return (tmp / "out.bin").read_bytes()
        return run

    return {"read_tokens": tensorstore_tokens, "get_rows": rows, "read_ranges": exact_ranges, "dataset (exact)": dataset(0),
            "dataset (chunk cache)": dataset(1 << 30), "export": export()}


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1 << (at % 8)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_a_flipped_bit_anywhere_is_an_error_naming_the_rows_on_every_read_path(tmp_path, built, compression):
    """Flips in chunks, in shard indexes, in row ends: each fails every read that touches it, by name; before checksums
    most flips read back as other tokens (issue 34: 31 of 40 with zstd, 22 of 30 with lz4, all uncompressed)."""
    _, location = fresh(built, compression, tmp_path)
    paths = read_paths(location)
    expected = {name: np.asarray(read()) if name != "export" else read() for name, read in paths.items()}
    rng = np.random.default_rng(7)
    objects = sorted((location / "input_ids" / "data" / "c").iterdir(), key=lambda p: int(p.name))
    offsets = sorted((location / "input_ids" / "offsets" / "c").iterdir(), key=lambda p: int(p.name))
    targets = [(objects[i], int(rng.integers(0, objects[i].stat().st_size))) for i in rng.choice(len(objects), 8, replace=False)]
    targets += [(objects[0], 3), (offsets[0], int(rng.integers(0, offsets[0].stat().st_size))), (offsets[-1], offsets[-1].stat().st_size - 2)]
    for path, at in targets:
        flip(path, at)
        for name, read in paths.items():
            if path.parent.parent.name == "offsets" and name in BY_POSITION | FROM_OPEN_OBJECT:
                continue
            with pytest.raises(CacheDamagedError) as info:
                read()
            message = str(info.value)
            assert str(location) in message and f"c/{path.name}" in message and "--repair" in message, (name, message)
            assert "They hold rows" in message, (name, message)
        flip(path, at)
    for name, read in paths.items():
        got = read()
        assert np.array_equal(np.asarray(got), expected[name]) if name != "export" else got == expected[name]


def test_a_deleted_or_cut_object_is_an_error_never_zeros(tmp_path, built):
    """A stored object deleted or cut short reads as an error on every path, where before a deleted one read as zeros
    (token 0 is EOS: 341,306 of them in issue 34)."""
    _, location = fresh(built, "zstd", tmp_path)
    paths = read_paths(location)
    for victim in (location / "input_ids" / "data" / "c" / "3", location / "input_ids" / "offsets" / "c" / "1"):
        saved = victim.read_bytes()
        for damage in ("delete", "cut"):
            victim.unlink()
            if damage == "cut":
                victim.write_bytes(saved[: len(saved) // 2])
            for name, read in paths.items():
                if victim.parent.parent.name == "offsets" and name in BY_POSITION | FROM_OPEN_OBJECT:
                    continue
                with pytest.raises(CacheDamagedError, match=rf"c/{victim.name}\b.*(missing|cut short)") as info:
                    read()
                assert str(location) in str(info.value), name
            victim.write_bytes(saved)


def test_damage_in_a_loaders_reader_process_names_the_cache(tmp_path, built):
    """The loader's reader processes read through the same checks: the step fails naming the damaged cache."""
    import jax

    from tokenmix import DataLoader, LoaderError

    _, location = fresh(built, "none", tmp_path)
    flip(location / "input_ids" / "data" / "c" / "0", 200)  # the first chunk: tokens of step 0
    dataset = TokenSeqDataset(TokenCache(str(location), chunk_cache=ChunkCache(0)), SEQ_LEN)
    with DataLoader(dataset, 4, jax.make_mesh((1,), ("data",)), {"batch": "data"}, workers=1) as loader:
        with pytest.raises(LoaderError, match=rf"step 0: .*CacheDamagedError: cache at {location} is damaged.*checksum mismatch"):
            next(iter(loader))


@pytest.mark.parametrize("name", ["zstd", "none", "spans"])
def test_verify_finds_the_damage_and_repair_restores_the_builds_bytes(tmp_path, built, name):
    """Every kind of damage at once, in tokens, row ends and loss spans: `tokenmix verify` lists it and exits 1;
    `--repair` rewrites the damaged objects from the inputs, byte-identical to the build, and verify then exits 0."""
    cache_dir, location = fresh(built, name, tmp_path)
    pristine = cache_bytes(str(built[name] / location.relative_to(cache_dir)))
    clean = tokenmix_cli("verify", str(location))
    assert clean.returncode == 0 and "OK" in clean.stdout and "inputs: 2 same" in clean.stdout.replace("1 same", "2 same"), clean
    data, offsets = location / "input_ids" / "data" / "c", location / "input_ids" / "offsets" / "c"
    flip(data / "2", (data / "2").stat().st_size - 7)
    (data / "5").unlink()
    (data / "7").write_bytes((data / "7").read_bytes()[:300])
    flip(offsets / "0", 40)
    (offsets / "2").unlink()
    if name == "spans":
        flip(location / "loss_spans" / "data" / "c" / "0", 100)
    found = tokenmix_cli("verify", str(location), "--json")
    assert found.returncode == 1, found.stderr
    (report,) = json.loads(found.stdout)
    damaged = {(d["array"], d["stored"].split(",")[0], d["problem"].replace("undecodable", "checksum mismatch")) for d in report["damaged"]}
    assert {("input_ids/data", "c/2", "checksum mismatch"), ("input_ids/data", "c/5", "missing"),
            ("input_ids/data", "c/7", "cut short"), ("input_ids/offsets", "c/0", "damaged index"),
            ("input_ids/offsets", "c/2", "missing")} <= damaged
    if name == "spans":
        assert ("loss_spans/data", "c/0", "damaged index") in damaged or ("loss_spans/data", "c/0", "checksum mismatch") in damaged
    printed = tokenmix_cli("verify", str(location))
    assert printed.returncode == 1 and "DAMAGED" in printed.stdout and "--repair" in printed.stdout
    repaired = tokenmix_cli("verify", str(location), "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "repaired: input_ids/data c/5" in repaired.stdout and "OK" in repaired.stdout
    assert cache_bytes(str(location)) == pristine
    assert tokenmix_cli("verify", str(location)).returncode == 0


def test_verify_checks_the_open_object_and_repair_writes_it_again(tmp_path, built):
    """A finished cache's open.bin (what readers open it from, in place of its ledger and row ends): a flipped bit, or the
    open.bin of another cache put in its place, is named by `tokenmix verify`, and `--repair` writes it again, to the
    very bytes the build wrote."""
    _, location = fresh(built, "zstd", tmp_path)
    _, other = fresh(built, "none", tmp_path)
    pristine = cache_bytes(str(location))
    open_bin = location / "open.bin"
    for damage, problem in ((lambda: flip(open_bin, 10), "open.bin: checksum mismatch"),
                            (lambda: shutil.copy(other / "open.bin", open_bin), "open.bin: its metadata of input_ids/data differs")):
        damage()
        found = tokenmix_cli("verify", str(location), "--json")
        assert found.returncode == 1, found.stdout + found.stderr
        (report,) = json.loads(found.stdout)
        assert any(p.startswith(problem) for p in report["problems"]), report["problems"]
        repaired = tokenmix_cli("verify", str(location), "--repair")
        assert repaired.returncode == 0 and "open.bin: written again" in repaired.stdout, repaired.stdout + repaired.stderr
        assert cache_bytes(str(location)) == pristine
        assert tokenmix_cli("verify", str(location)).returncode == 0


def test_verify_names_changed_inputs_and_repair_refuses_to_use_them(tmp_path):
    """An input edited after the build is named; a repair that would read it again refuses, writing nothing."""
    shard = tmp_path / "in.jsonl"
    write_jsonl(shard, [{"text": f"document {i} " * 50} for i in range(300)])
    config_path = tmp_path / "c.yaml"
    config_path.write_text(json.dumps({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"),
                                       "configs": {"one": {"train_urls": [str(shard)]}}, "build": {"num_workers": 0}}))
    config = tokenmix.load_data_config(str(config_path))
    tokenmix.build_caches(config, progress=False)
    location = tmp_path / "caches" / "one" / "train"
    write_jsonl(shard, [{"text": f"document {i} " * 50 if i != 150 else "edited"} for i in range(300)])
    report = tokenmix.verify_cache(str(location), config=config, progress=False)
    assert not report.ok and [(i.shard, i.state) for i in report.inputs] == [(str(shard), "changed")]
    untouched = cache_bytes(str(location))
    repaired = tokenmix_cli("verify", "--config_path", str(config_path), "--repair", "--json")  # nothing damaged to repair
    found = json.loads(repaired.stdout)[0]
    assert repaired.returncode == 1 and not found["ok"] and [(i["shard"], i["state"]) for i in found["inputs"]] == [(str(shard), "changed")]
    assert cache_bytes(str(location)) == untouched and not found["repaired"]  # it said OK, and forgot the changed input
    tokens = location / "input_ids" / "data" / "c" / "0"
    flip(tokens, tokens.stat().st_size - 10)
    before = cache_bytes(str(location))
    with pytest.raises(tokenmix.RepairError, match=rf"changed, gone or unchecked: {shard}"):
        tokenmix.verify_cache(str(location), repair=True, config=config, progress=False)
    assert cache_bytes(str(location)) == before
    refused = tokenmix_cli("verify", "--config_path", str(config_path), "--repair", "--json")  # it printed [], as for no cache
    [listed] = json.loads(refused.stdout)
    assert refused.returncode == 1 and listed["location"] == str(location) and not listed["ok"], listed
    assert f"changed, gone or unchecked: {shard}" in listed["error"] and cache_bytes(str(location)) == before
    result = tokenmix_cli("verify", "--config_path", str(config_path))
    assert result.returncode == 1 and "input changed" in result.stdout
    moved = tmp_path / "moved"
    (tmp_path / "caches").rename(moved)
    overridden = tokenmix_cli("verify", "--config_path", str(config_path), "--cache_dir", str(moved))  # an override's value
    assert overridden.returncode == 1 and f"{moved}/one/train" in overridden.stdout and "input changed" in overridden.stdout
    stray = tokenmix_cli("verify", str(moved / "one" / "train"), "--seed", "3")
    assert stray.returncode == 2 and "--seed 3 (config overrides need --config_path)" in stray.stderr


def test_verify_runs_beside_a_build_and_checks_what_is_published(growing_cache):
    """A scrub only reads: beside a build it checks the rows published when it starts, and says the build is unfinished;
    scrubs while the build commits and publishes find nothing wrong."""
    growing = growing_cache(demo_urls("python_doc"), chunk_bytes=8 << 10)
    growing.open().wait_for_rows(1, timeout=120)
    report = tokenmix.verify_cache(growing.location, inputs=False, progress=False)
    assert report.ok and not report.finished and report.rows > 0, report
    growing.finish()
    assert tokenmix.verify_cache(growing.location, progress=False).ok
    moving = growing_cache(demo_urls("webster") + demo_urls("linux_doc"), held_from=4, name="moving", chunk_bytes=4 << 10)
    reports = []
    while not reports or not reports[-1].finished:
        try:
            reports.append(tokenmix.verify_cache(moving.location, inputs=False, progress=False))
        except tokenmix.CacheNotFoundError:
            continue
        assert reports[-1].ok, reports[-1]
    assert len({r.rows for r in reports}) > 1, "the build ended before it could be scrubbed while it ran"
    moving.finish()


def test_a_cache_whose_build_took_back_a_corrupt_shard_verifies_clean_and_repairs(tmp_path):
    """Rows of a compressed shard refused at its end are taken back with the runs the ledger noted for them: the ledger
    still says where every row came from, so the cache verifies clean, and a damaged object is repaired from the
    right shards."""
    import gzip

    first = write_jsonl(tmp_path / "a.jsonl", [{"text": f"first shard, document {i}. " * 40} for i in range(200)])
    broken = tmp_path / "b.jsonl.gz"
    words = np.random.default_rng(3).integers(0, 1 << 40, (3000, 40))  # text that does not compress: the reader hands on
    lines = [json.dumps({"text": " ".join(f"{w:x}" for w in row)}).encode() + b"\n" for row in words]  # records before the end
    data = bytearray(gzip.compress(b"".join(lines)))
    data[-6] ^= 0x10  # the CRC-32 at its end
    broken.write_bytes(bytes(data))
    last = write_jsonl(tmp_path / "c.jsonl", [{"text": f"last shard, document {i}. " * 40} for i in range(200)])
    config_path = tmp_path / "c.yaml"
    config_path.write_text(json.dumps({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"),
                                       "configs": {"one": {"train_urls": [first, str(broken), last]}},
                                       "build": {"num_workers": 0, "on_error": "skip", "chunk_bytes": 1 << 12}}))
    config = tokenmix.load_data_config(str(config_path))
    tokenmix.build_caches(config, progress=False)
    location = tmp_path / "caches" / "one" / "train"
    ledger = TokenCache(str(location)).ledger
    assert [run[0] for run in ledger.runs] == [0, 2] and ledger.shards[1].skipped == {"corrupt_shard": 1}
    assert tokenmix.verify_cache(str(location), config=config, progress=False).ok
    pristine = cache_bytes(str(location))
    tokens = location / "input_ids" / "data" / "c" / "0"
    flip(tokens, tokens.stat().st_size - 10)
    report = tokenmix.verify_cache(str(location), repair=True, config=config, progress=False)
    assert report.ok and report.repaired and cache_bytes(str(location)) == pristine


@pytest.mark.parametrize("message, problem", [
    ('PERMISSION_DENIED: Error reading shard entry {0}/{256} in local file "/data/zstd-caches/c/0": denied', None),
    ('UNAVAILABLE: Error reading "gs://bucket/blosc-shards/input_ids/data/c/3": connection reset', None),
    ('FAILED_PRECONDITION: Error reading shard entry {3}/{256} in local file "/c/0": ZSTD_decompressStream() failed: '
     'Data corruption detected', "undecodable"),
    ('DATA_LOSS: Error reading shard entry {0}/{4} in local file "/c/0": Error reading shard index in local file "/c/0": '
     'Digest mismatch, stored digest is 0x1 but computed digest is 0x2', "damaged index"),
    ('DATA_LOSS: Error reading shard entry {4}/{256} in local file "/c/0": Digest mismatch', "checksum mismatch"),
    ('NOT_FOUND: chunk {0} stored at shard entry {0}/{256} in local file "/c/1" is missing', "missing"),
    ('OUT_OF_RANGE: Error reading shard entry {1}/{4} in local file "/c/0": Requested byte range [91, 119) is not valid for '
     'value of size 80', "cut short"),
])
def test_only_errors_about_the_stored_bytes_read_as_damage(message, problem):
    """Tensorstore's messages name the file; a path holding a codec's name is no damage, a permission or an unreachable
    store never asks for a repair."""
    from tokenmix.cache.damage import problem_of

    assert problem_of(ValueError(message)) == problem


def test_a_repair_with_a_config_that_encodes_otherwise_is_refused_writing_nothing(tmp_path):
    """A whole damaged object has no intact chunk to hold the repair against: the config must give the cache's identity."""
    shard = write_jsonl(tmp_path / "in.jsonl", [{"text": f"document {i} " * 50} for i in range(300)])
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "caches"), "configs": {"one": {"train_urls": [shard]}},
           "build": {"num_workers": 0}}
    tokenmix.build_caches(tokenmix.load_data_config(doc), progress=False)
    location = tmp_path / "caches" / "one" / "train"
    (location / "input_ids" / "data" / "c" / "0").unlink()
    before = cache_bytes(str(location))
    other = tokenmix.load_data_config({**doc, "enforce_eos": False})
    with pytest.raises(tokenmix.RepairError, match=r"(?s)with this data config, which would encode other tokens.*eos_id: cache has 0"):
        tokenmix.verify_cache(str(location), repair=True, config=other, progress=False)
    assert cache_bytes(str(location)) == before
    assert tokenmix.verify_cache(str(location), repair=True, config=tokenmix.load_data_config(doc), progress=False).ok


@pytest.mark.parametrize("kept", [0, 100])
def test_verify_finds_a_last_partial_object_cut_short_and_repair_restores_it(tmp_path, built, kept):
    """The last, partial object of the tokens, cut to nothing or to less than its index (which the open object holds a
    copy of): verify lists it instead of stopping on the short read of its index, and repair writes it back."""
    _, location = fresh(built, "zstd", tmp_path)
    pristine = cache_bytes(str(location))
    objects = location / "input_ids" / "data" / "c"
    last = objects / str(max(int(p.name) for p in objects.iterdir()))
    last.write_bytes(last.read_bytes()[:kept])
    found = tokenmix_cli("verify", str(location), "--json")
    assert found.returncode == 1, found.stdout + found.stderr
    (report,) = json.loads(found.stdout)
    assert {(d["array"], d["stored"].split(",")[0]) for d in report["damaged"]} == {("input_ids/data", f"c/{last.name}")}, report
    repaired = tokenmix_cli("verify", str(location), "--repair")
    assert repaired.returncode == 0 and f"repaired: input_ids/data c/{last.name}" in repaired.stdout, repaired.stdout + repaired.stderr
    assert cache_bytes(str(location)) == pristine


@pytest.mark.parametrize("damage", ["cut", "garbled", "other dtype"])
@pytest.mark.parametrize("array", ["input_ids/data", "input_ids/offsets", "loss_spans/data"])
def test_a_damaged_zarr_json_is_named_with_the_fix_by_readers_and_by_verify(tmp_path, built, damage, array):
    """An array's zarr.json cut short, garbled or edited: a reader that opens the cache from its parts (no open.bin)
    names the file and the fix, never tensorstore's spec dump; `tokenmix verify` lists it, with or without open.bin,
    where it stopped on the same raw error."""
    from tokenmix.cache.store import DocumentDamagedError

    _, location = fresh(built, "spans" if array.startswith("loss_spans") else "zstd", tmp_path)
    metadata = location / array / "zarr.json"
    stored = metadata.read_bytes()
    dtype = json.loads(stored)["data_type"]
    metadata.write_bytes({"cut": stored[:50], "garbled": b'{"zarr_format": 3, "codecs": 7}',
                          "other dtype": stored.replace(f'"{dtype}"'.encode(), b'"float32"')}[damage])
    for opened_from in ("open.bin", "its parts"):
        found = tokenmix_cli("verify", str(location), "--json", "--no_inputs")
        assert found.returncode == 1, (opened_from, found.stdout + found.stderr)
        (report,) = json.loads(found.stdout)
        assert any(p.startswith(f"{array}/zarr.json") for p in report["problems"]), (opened_from, report)
        (location / "open.bin").unlink(missing_ok=True)
    with pytest.raises(DocumentDamagedError, match=rf"{metadata} is damaged: .*Delete the cache and build it again") as info:
        TokenCache(str(location)).get_rows([0])
    assert "tensorstore_spec" not in str(info.value)


def test_verify_names_a_damaged_stats_json_and_the_build_that_writes_it_again(tmp_path, built):
    """stats.json cut short: verify lists it with its fix (where it said OK), a repair of damaged chunks beside it still
    rewrites them, and a build writes the statistics again, after which the cache verifies clean."""
    cache_dir, location = fresh(built, "zstd", tmp_path)
    stats = location / "stats.json"
    stats.write_bytes(stats.read_bytes()[:100])
    tokens = location / "input_ids" / "data" / "c" / "1"
    flip(tokens, tokens.stat().st_size - 10)
    found = tokenmix_cli("verify", str(location), "--no_inputs")
    assert found.returncode == 1 and "inconsistent: stats.json: not a JSON document" in found.stdout, found.stdout + found.stderr
    assert "delete it, and `tokenmix build-cache` writes it again" in found.stdout
    repaired = tokenmix_cli("verify", str(location), "--repair")
    assert repaired.returncode == 1 and "repaired: input_ids/data c/1" in repaired.stdout, repaired.stdout + repaired.stderr
    assert "inconsistent: stats.json" in repaired.stdout
    stats.unlink()
    with pytest.MonkeyPatch.context() as mp:
        small_layout(mp)
        tokenmix.build_caches(tokenmix.load_data_config(str(write_config(tmp_path / "c.yaml", cache_dir))), progress=False)
    assert tokenmix_cli("verify", str(location)).returncode == 0


def test_a_reader_that_met_damage_reads_the_repaired_object_once_repaired(tmp_path, built):
    """A reader open across a repair (a training process beside `tokenmix verify --repair`): its exact reads fail while
    the object is damaged and give the build's tokens once it is repaired, where the reader of an uncompressed cache
    kept the damaged file mapped and failed until it was closed."""
    cache_dir, location = fresh(built, "none", tmp_path)
    config = tokenmix.load_data_config(str(write_config(tmp_path / "c.yaml", cache_dir, "none")))
    dataset = TokenSeqDataset(TokenCache(str(location), chunk_cache=ChunkCache(0)), SEQ_LEN)
    expected = dataset.get_batch(np.arange(len(dataset))).tokens
    victim = location / "input_ids" / "data" / "c" / "3"
    with open(victim, "r+b") as f:  # in place, as bit rot is
        f.seek(victim.stat().st_size - 20)
        f.write(bytes([f.read(1)[0] ^ 8]))
    with pytest.raises(CacheDamagedError, match=r"c/3, chunk 7 of 8\): checksum mismatch"):
        dataset.get_batch(np.arange(len(dataset)))
    assert tokenmix.verify_cache(str(location), repair=True, config=config, progress=False).ok
    assert np.array_equal(dataset.get_batch(np.arange(len(dataset))).tokens, expected)


@pytest.mark.parametrize("array", ["input_ids/data", "input_ids/offsets"])
def test_extending_a_cache_whose_last_object_is_damaged_names_the_damage_and_goes_on_once_repaired(tmp_path, monkeypatch, array):
    """A build that appends rewrites the last, partial stored object of each array (and the first of the row ends, where
    it publishes): damage there is named with its repair before anything is written, where the build stopped on
    tensorstore's error saying to fix the storage (free space, permissions) and re-run, which failed again. Once repaired,
    the cache extends to the tokens of a build of all its shards."""
    small_layout(monkeypatch)
    shards = demo_urls("linux_doc")

    def config(urls: list[str], cache_dir: Path) -> tokenmix.DataConfigBase:
        return tokenmix.load_data_config({"tokenizer": TOKENIZER, "cache_dir": str(cache_dir), "configs": {"linux": {"train_urls": urls}},
                                          "build": {"num_workers": 0, "chunk_bytes": 1 << 15}})

    tokenmix.build_caches(config(shards, tmp_path / "whole"), progress=False)
    tokenmix.build_caches(config(shards[:1], tmp_path / "grown"), progress=False)
    location = tmp_path / "grown" / "linux" / "train"
    objects = location / array / "c"
    last = objects / str(max(int(p.name) for p in objects.iterdir()))
    flip(last, last.stat().st_size - 3)
    with pytest.raises(CacheDamagedError, match=rf"cache at {location} is damaged: {array} .*\(c/{last.name}, .*--repair"):
        tokenmix.build_caches(config(shards, tmp_path / "grown"), progress=False)
    assert tokenmix.verify_cache(str(location), repair=True, progress=False).ok
    tokenmix.build_caches(config(shards, tmp_path / "grown"), progress=False)
    assert tokenmix.verify_cache(str(location), progress=False).ok
    whole, grown = TokenCache(str(tmp_path / "whole" / "linux" / "train")), TokenCache(str(location))
    assert np.array_equal(grown.read_tokens(0, grown.num_tokens()), whole.read_tokens(0, whole.num_tokens()))
    assert np.array_equal(grown.row_bounds(0, grown.num_rows()), whole.row_bounds(0, whole.num_rows()))


@pytest.mark.parametrize("replaced, by", [("1", "0"), ("2", "1")])
def test_row_ends_replaced_by_other_valid_ones_are_an_error_never_other_rows(tmp_path, built, replaced, by):
    """An object of row ends replaced by another whose checksums hold (another cache's, or another object of this one,
    copied over it) in a cache opened from its parts: every read path names the row ends, where before the rows read
    were other rows, or the read stopped on tensorstore's or numpy's IndexError."""
    _, location = fresh(built, "zstd", tmp_path)
    (location / "open.bin").unlink()
    paths = read_paths(location)
    by_position = {name: paths[name]() for name in BY_POSITION}
    offsets = location / "input_ids" / "offsets" / "c"
    shutil.copy(offsets / by, offsets / replaced)
    for name, read in paths.items():
        try:
            got = read()
        except CacheDamagedError as e:
            assert re.search(rf"cache at {location} is damaged: input_ids/offsets .*other values.*--repair", str(e)), (name, str(e))
            continue
        assert name in BY_POSITION and np.array_equal(got, by_position[name]), f"{name} read other rows"  # the ends it read are intact


def test_loss_span_bounds_replaced_by_other_valid_ones_are_an_error_never_other_masks(tmp_path, built):
    """An object of loss-span bounds replaced by another whose checksums hold: `loss_spans` and datasets name the
    bounds, where they stopped on numpy's "repeats may not contain negative values"."""
    _, location = fresh(built, "spans", tmp_path)
    offsets = location / "loss_spans" / "offsets" / "c"
    shutil.copy(offsets / "0", offsets / "1")
    cache = TokenCache(str(location))
    reads = {"loss_spans": lambda: cache.loss_spans(0, cache.num_rows()),
             **{name: read for name, read in read_paths(location).items() if name.startswith("dataset")}}
    for name, read in reads.items():
        with pytest.raises(CacheDamagedError, match=rf"cache at {location} is damaged: loss_spans/offsets .*\(c/1\): .*--repair"):
            read()
            pytest.fail(f"{name} read other loss masks")


@pytest.mark.parametrize("name, array, replaced, by", [("zstd", "input_ids", "1", "0"), ("zstd", "input_ids", "2", "1"),
                                                       ("spans", "loss_spans", "1", "0")])
def test_row_ends_replaced_by_other_valid_ones_are_repaired_by_the_fix_the_read_error_names(tmp_path, built, name, array, replaced, by):
    """An object of row ends (or loss-span bounds) replaced by another whose checksums hold: the read error says to run
    `tokenmix verify CACHE --repair`, and that command, run as the error words it, rewrites the object from the inputs to
    the build's bytes. It used to refuse ("delete the cache and build it again"): the scrub named the disagreeing row ends
    as problems, and a repair mended damaged chunks only."""
    cache_dir, location = fresh(built, name, tmp_path)
    pristine_location = built[name] / location.relative_to(cache_dir)
    pristine = cache_bytes(str(pristine_location))
    (location / "open.bin").unlink()  # readers take the row ends from the stored offsets, not the open object's copy
    offsets = location / array / "offsets" / "c"
    shutil.copy(offsets / by, offsets / replaced)
    cache = TokenCache(str(location))
    with pytest.raises(CacheDamagedError) as damaged:
        cache.get_rows(range(cache.num_rows())) if array == "input_ids" else cache.loss_spans(0, cache.num_rows())
    fix = re.search(r"Run `tokenmix (verify \S+ --repair)`", str(damaged.value))
    assert fix and fix.group(1) == f"verify {location} --repair", str(damaged.value)
    listed = json.loads(tokenmix_cli("verify", str(location), "--json", "--no_inputs").stdout)[0]
    assert not listed["ok"] and listed["other_values"], listed  # they were only words in "problems"
    assert {v["array"] for v in listed["other_values"]} == {f"{array}/offsets"} and all(
        v["problem"] in listed["problems"] and v["stop"] > v["start"] for v in listed["other_values"])
    repaired = tokenmix_cli(*fix.group(1).split())
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"repaired: {array}/offsets c/{replaced}:" in repaired.stdout and f"{array}/offsets c/{by}:" not in repaired.stdout
    assert cache_bytes(str(location)) == pristine
    built_cache, again = TokenCache(str(pristine_location)), TokenCache(str(location))
    rows = range(built_cache.num_rows())
    assert all(np.array_equal(a, b) for a, b in zip(again.get_rows(rows), built_cache.get_rows(rows), strict=True))


@pytest.mark.parametrize("damage", ["flipped bit", "zarr.json cut"])
def test_a_damaged_packing_plan_is_planned_again_never_a_failed_dataset(tmp_path, built, damage):
    """A stored packing plan is made again from the cache by any reader: damage in it (a flipped bit in its examples, a
    cut zarr.json) is logged and planned past, giving the examples of the undamaged plan, where opening the dataset
    failed with an error that told to repair the plan's directory as a cache."""
    from tokenmix import PackedDataset

    _, location = fresh(built, "zstd", tmp_path)
    planned = PackedDataset(TokenCache(str(location)), SEQ_LEN, pad_id=0)
    expected = planned.get_batch(np.arange(len(planned))).tokens
    (plan,) = (location / "packing").iterdir()
    examples = plan / "examples" / "data"
    if damage == "flipped bit":
        flip(examples / "c" / "0", (examples / "c" / "0").stat().st_size - 5)
    else:
        (examples / "zarr.json").write_bytes((examples / "zarr.json").read_bytes()[:40])
    again = PackedDataset(TokenCache(str(location)), SEQ_LEN, pad_id=0)
    assert np.array_equal(again.get_batch(np.arange(len(again))).tokens, expected)


def test_an_empty_ledger_is_named_damaged_not_a_missing_cache(tmp_path, built):
    """ledger.json left empty (a write a power loss cut short) beside the arrays: a reader opening the cache from its
    parts and `tokenmix verify` name the empty ledger and the fix, where both said there was no cache there (and the
    build they pointed to refused it)."""
    from tokenmix.cache.store import DocumentDamagedError

    _, location = fresh(built, "zstd", tmp_path)
    (location / "open.bin").unlink()
    (location / "ledger.json").write_bytes(b"")
    with pytest.raises(DocumentDamagedError, match=rf"{location}/ledger.json is damaged: empty.*Delete the cache and build it again"):
        TokenCache(str(location))
    found = tokenmix_cli("verify", str(location))
    assert found.returncode == 1 and re.search(rf"{location}/ledger.json is damaged: empty.*Delete the cache and build it again",
                                               found.stderr), found.stdout + found.stderr
    repaired = tokenmix_cli("verify", str(location), "--repair")  # no repair mends a ledger, so none is offered
    assert repaired.returncode == 1 and "--repair" not in repaired.stderr and "Delete the cache" in repaired.stderr, repaired.stderr


def test_one_element_is_named_as_one_not_as_a_range_of_it_to_itself():
    """A repair of one row end said "elements 64-64"."""
    assert DamagedChunk("input_ids/offsets", 64, 65, "checksum mismatch").describe() == "input_ids/offsets element 64: checksum mismatch"
    assert DamagedChunk("input_ids/data", 4096, 8192, "missing", "c/1").describe() == "input_ids/data elements 4,096-8,191 (c/1): missing"
