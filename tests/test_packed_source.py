"""A source packed with others into one cache reads, through ``PackedSourceCache``, exactly as its cache built alone:
rows, bounds, token ranges, blocks, loss spans and the batches of datasets over it, with the chunk cache holding the pack
or refusing it; pickled to another process; every member of a pack sharing one open pack."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, build, library_threads, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from s3_server import BUCKET

from tokenmix import CacheDamagedError, MixtureDataset, PackedDataset, SupervisedLmDatasetFormat, TokenCache, TokenSeqDataset
from tokenmix.cache import PackedSourceCache, open_object, open_pack, reader, store
from tokenmix.cache.chunk_cache import SHARED, ChunkCache
from tokenmix.cache.ledger import CacheMismatchError
from tokenmix.cache.shard_reads import ShardLayout
from tokenmix.datasets.cache_ranges import split_at_chunks

PAD = 1
SOURCES = {"a": 2, "b": 1, "c": 3}
"""Shards per source, listed in this order in the pack."""
UNIT, BLOCK = 1 << 9, 1 << 11
"""The stored chunk (exact read unit) and chunk-cache block the caches here are made and read with: small, so that every
source spans several of each and begins inside one of the pack's."""
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which but have an".split()


@dataclass
class Packed:
    """A pack of the sources, and each source built alone."""

    pack: str
    alone: dict[str, str]
    members: dict[str, tuple[tuple[int, int], tuple[int, int]]]
    """Per source, its rows and tokens in the pack, found from the pack's ledger."""
    root: Path
    shards: list[str]
    """The pack's shards, in order."""


def _records(rng: np.random.Generator, n: int, supervised: bool) -> list[dict[str, str]]:
    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS, words)) if words else ""

    lengths = [0 if k % 7 == 3 else (int(rng.integers(1500, 2500)) if k % 9 == 5 else int(rng.integers(1, 300))) for k in range(n)]
    if supervised:
        return [{"prompt": text(m // 3), "response": text(m - m // 3)} for m in lengths]
    return [{"text": text(m)} for m in lengths]


def _build(root: Path, supervised: bool) -> Packed:
    rng = np.random.default_rng(7 if supervised else 3)
    shards = {name: [write_jsonl(root / f"{name}{k}.jsonl", _records(rng, 20, supervised)) for k in range(count)]
              for name, count in SOURCES.items()}
    fmt = SupervisedLmDatasetFormat() if supervised else None
    pack = str(root / "pack")
    listed = [url for urls in shards.values() for url in urls]
    build(pack, listed, fmt, on_error="skip")
    alone = {name: str(root / name) for name in SOURCES}
    for name, urls in shards.items():
        build(alone[name], urls, fmt, on_error="skip")
    runs = TokenCache(pack).ledger.run_extents()
    members, first_shard = {}, 0
    for name, count in SOURCES.items():
        own = [r for r in runs if first_shard <= r.shard < first_shard + count]
        members[name] = ((own[0].row, own[-1].stop_row), (own[0].token, own[-1].stop_token))
        first_shard += count
    return Packed(pack, alone, members, root, listed)


@pytest.fixture(scope="module")
def small_layout():
    """Stored chunks of 2^9 tokens and blocks of 2^11 while the caches of this module are built and read."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "DATA_SHARD", 1 << 12)
        patch.setattr(store, "DATA_INNER", UNIT)
        patch.setattr(reader, "BLOCK_TOKENS", BLOCK)
        yield


@pytest.fixture(scope="module")
def text_pack(tmp_path_factory, small_layout) -> Packed:
    return _build(tmp_path_factory.mktemp("text_pack"), supervised=False)


@pytest.fixture(scope="module")
def supervised_pack(tmp_path_factory, small_layout) -> Packed:
    return _build(tmp_path_factory.mktemp("supervised_pack"), supervised=True)


def _open(packed: Packed, chunk_cache: ChunkCache | None = None) -> tuple[dict[str, PackedSourceCache], dict[str, TokenCache]]:
    """Every member of the pack, and every source's cache built alone, each reading through ``chunk_cache`` (one each for
    the pack and for the sources alone, so that neither takes the other's room)."""
    pack_chunks = chunk_cache or ChunkCache()
    alone_chunks = ChunkCache(chunk_cache.max_bytes) if chunk_cache else ChunkCache()
    fingerprint = TokenCache(packed.pack).fingerprint
    members, alone = {}, {}
    for name, (rows, tokens) in packed.members.items():
        own = TokenCache(packed.alone[name], chunk_cache=alone_chunks)
        location = str(packed.root / f"member-{name}")
        pack = open_pack(packed.pack, fingerprint, location, chunk_cache=pack_chunks)
        members[name] = PackedSourceCache(pack, location, rows, tokens, own.identity, own.fingerprint, own.stats())
        alone[name] = own
    return members, alone


def _ranges(cache: PackedSourceCache | TokenCache, picks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The ranges ``(begin, size)`` cut where read units end, as datasets cut them."""
    begin = np.array([b for b, _ in picks], np.int64)
    size = np.array([s for _, s in picks], np.int64)
    _, piece_begin, piece_size = split_at_chunks(begin, size, cache.read_unit)
    return piece_begin, piece_size


def test_the_sources_begin_inside_units_and_blocks_of_the_pack(text_pack):
    """What the other tests rest on: every source but the first begins inside a read unit of the pack, and spans several."""
    for name, (_, (first, stop)) in text_pack.members.items():
        assert stop - first > 2 * BLOCK, name
        assert name == "a" or (first % UNIT and first % BLOCK), name


@pytest.mark.parametrize("which", ["text_pack", "supervised_pack"])
def test_each_member_reads_as_its_source_built_alone(request, which):
    packed = request.getfixturevalue(which)
    members, alone = _open(packed)
    for name, member in members.items():
        own = alone[name]
        rows, tokens = own.num_rows(), own.num_tokens()
        assert (member.num_rows(), member.num_tokens()) == (rows, tokens), name
        assert member.location == str(packed.root / f"member-{name}")
        assert (member.identity, member.fingerprint, member.stats()) == (own.identity, own.fingerprint, own.stats())
        member.stats()["document_length_tokens"]["max"] = -1  # a caller's change stays its own, as with its own cache's
        assert member.stats() == own.stats()
        assert (member.dtype, member.has_loss_spans) == (own.dtype, own.has_loss_spans) == (own.dtype, which == "supervised_pack")
        assert member.is_finished() and member.wait_for_rows(rows + 5, timeout=0) == member.wait_until_finished(timeout=0) == rows
        assert np.array_equal(member.row_bounds(0, rows), own.row_bounds(0, rows)) and member.row_bounds(0, rows)[0] == 0
        assert np.array_equal(member.row_bounds(3, 7), own.row_bounds(3, 7))
        assert np.array_equal(member.row_ends(2, rows), own.row_ends(2, rows))
        assert np.array_equal(member.committed_row_ends(4), own.committed_row_ends(4))
        assert [r.tolist() for r in member.get_rows(range(rows))] == [r.tolist() for r in own.get_rows(range(rows))]
        assert member[rows - 1].tolist() == own[rows - 1].tolist()
        assert np.array_equal(member.read_tokens(0, tokens), own.read_tokens(0, tokens))
        assert np.array_equal(member.read_tokens(UNIT - 5, 3 * UNIT + 7), own.read_tokens(UNIT - 5, 3 * UNIT + 7))
        assert member.read_ranges(np.empty(0, np.int64), np.empty(0, np.int64), tokens)() == []
        assert (member.read_unit, member.chunk_tokens) == (own.read_unit, own.chunk_tokens) == (UNIT, BLOCK)
        if member.has_loss_spans:
            for got, want in zip(member.loss_spans(0, rows), own.loss_spans(0, rows)):
                assert np.array_equal(got, want), name
            for got, want in zip(member.loss_spans(5, rows - 2), own.loss_spans(5, rows - 2)):
                assert np.array_equal(got, want), name


_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_SETTINGS
@given(data=st.data())
def test_random_ranges_and_blocks_read_as_from_the_source_built_alone(text_pack, data):
    members, alone = _open(text_pack)
    name = data.draw(st.sampled_from(sorted(members)))
    member, own = members[name], alone[name]
    tokens = own.num_tokens()
    starts = data.draw(st.lists(st.integers(0, tokens - 1), min_size=1, max_size=12))
    picks = [(b, data.draw(st.integers(0, min(tokens - b, 3 * UNIT)))) for b in starts]
    begin, size = _ranges(own, picks)
    got, want = member.read_ranges(begin, size, tokens)(), own.read_ranges(begin, size, tokens)()
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    blocks = data.draw(st.lists(st.integers(0, (tokens - 1) // BLOCK), min_size=1, max_size=4))
    got_blocks, want_blocks = member.read_chunks(blocks, tokens)(), own.read_chunks(blocks, tokens)()
    assert sorted(got_blocks) == sorted(want_blocks) == sorted(set(blocks))
    assert all(got_blocks[c].tolist() == want_blocks[c].tolist() for c in want_blocks)


@pytest.mark.parametrize("room", ["granted", "refused"])
@pytest.mark.parametrize("which", ["text_pack", "supervised_pack"])
def test_datasets_over_members_give_the_examples_of_the_sources_built_alone(request, which, room):
    packed = request.getfixturevalue(which)
    members, alone = _open(packed, ChunkCache(64 << 20 if room == "granted" else 1 << 10))
    for name, member in members.items():
        assert member.caches_blocks(member.num_tokens()) == (room == "granted") == alone[name].caches_blocks(alone[name].num_tokens())

    def datasets(caches: dict) -> dict:
        return {
            "windows": {n: TokenSeqDataset(c, 300, source_id=k) for k, (n, c) in enumerate(caches.items())},
            "packed": {n: PackedDataset(c, 400, source_id=k, pad_id=PAD, long_documents="split", shuffle=True, key=k, persist=False)
                       for k, (n, c) in enumerate(caches.items())},
        }

    over_members, over_alone = datasets(members), datasets(alone)
    for kind in ("windows", "packed"):
        mixed = MixtureDataset(over_members[kind], {"a": 3, "b": 1, "c": 2}, block_size=16, seed=5)
        reference = MixtureDataset(over_alone[kind], {"a": 3, "b": 1, "c": 2}, block_size=16, seed=5)
        picks = np.random.default_rng(11).permutation(min(len(over_alone[kind][n]) for n in SOURCES) * 2)
        got, want = mixed.get_batch(picks), reference.get_batch(picks)
        for field in ("tokens", "loss_mask", "segment_ids", "source_ids"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), (kind, field)
        for n in SOURCES:
            every = np.arange(len(over_alone[kind][n]))
            assert len(over_members[kind][n]) == len(every)
            got, want = over_members[kind][n].get_batch(every), over_alone[kind][n].get_batch(every)
            for field in ("tokens", "loss_mask", "segment_ids"):
                assert np.array_equal(getattr(got, field), getattr(want, field)), (kind, n, field)


def test_the_chunk_cache_holds_the_whole_pack_for_its_members_or_none_of_them(text_pack):
    pack = TokenCache(text_pack.pack)
    size = pack.num_tokens() * pack.dtype.itemsize
    members, _ = _open(text_pack, ChunkCache(size - 1))  # room for any one source, not for the pack
    assert not any(m.caches_blocks(m.num_tokens()) for m in members.values())
    chunks = ChunkCache(size)
    members, _ = _open(text_pack, chunks)
    assert all(m.caches_blocks(m.num_tokens()) for m in members.values())
    assert not chunks.claim("another cache", 1, 0)  # the pack's one claim took all the room


def test_a_packing_plan_is_kept_at_the_members_own_location(text_pack):
    members, _ = _open(text_pack)
    member = members["b"]
    before = set(os.listdir(text_pack.pack))
    PackedDataset(member, 400, pad_id=PAD)
    assert os.listdir(member.location) and set(os.listdir(text_pack.pack)) == before


def test_members_of_a_pack_share_one_open_pack_held_weakly(text_pack):
    members, _ = _open(text_pack)
    packs = {id(m.pack) for m in members.values()}
    assert len(packs) == 1
    fingerprint = members["a"].pack.fingerprint
    shared = members["a"].pack
    assert open_pack(text_pack.pack, fingerprint, "another member", chunk_cache=shared.chunk_cache) is shared
    assert open_pack(text_pack.pack, fingerprint, "another member", chunk_cache=ChunkCache()) is not shared  # another budget
    del shared
    held = weakref.ref(members["a"].pack)
    del members
    gc.collect()
    assert held() is None


def test_a_member_per_row_opens_no_cache_thread_or_file_per_member(text_pack):
    """Every row of the pack a member of its own, all read: still one open pack, and the threads and open files of one."""
    bounds = TokenCache(text_pack.pack).row_bounds(0, text_pack.members["c"][0][1]).tolist()
    fingerprint, chunks = TokenCache(text_pack.pack).fingerprint, ChunkCache(0)

    def read(rows: range) -> list[list[int]]:
        got = []
        for r in rows:
            where = str(text_pack.root / f"row-{r}")
            member = PackedSourceCache(open_pack(text_pack.pack, fingerprint, where, chunks), where, (r, r + 1), (bounds[r], bounds[r + 1]),
                                       {}, fingerprint, None)
            size = member.num_tokens()
            got.append(np.concatenate(member.read_ranges(*_ranges(member, [(0, size)]), size)()).tolist())
            kept.append(member)
        return got

    def held() -> tuple[int, int, int]:
        """Open caches of the pack's directory, tokenmix's and its libraries' threads, and descriptors but sockets (not
        what a cluster an earlier test of this worker left running starts, or its talk)."""
        gc.collect()
        caches = sum(isinstance(o, TokenCache) and str(o.location).startswith(f"{text_pack.root}/") for o in gc.get_objects())
        files = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                files += not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:  # closed since the listing
                pass
        return caches, library_threads(), files

    kept: list[PackedSourceCache] = []
    first = read(range(1))
    one = held()
    rest = read(range(1, len(bounds) - 1))
    caches, threads, files = held()  # as for one member, give or take a thread or file of another test's leftovers
    assert caches == one[0] and threads <= one[1] + 4 and files <= one[2] + 4 and len(kept) == len(bounds) - 1 > 100
    whole = TokenCache(text_pack.pack)
    assert first + rest == [r.tolist() for r in whole.get_rows(range(len(bounds) - 1))]


def test_a_pack_of_another_fingerprint_is_refused_naming_both_locations(text_pack, tmp_path):
    member = str(tmp_path / "member-b")
    with pytest.raises(CacheMismatchError, match=rf"{member}: .* pack at {text_pack.pack} with fingerprint 0123456789abcdef, but the "
                                                 r"pack there has fingerprint [0-9a-f]{16} .*build the caches again"):
        open_pack(text_pack.pack, "0123456789abcdef", member)
    pack = open_pack(text_pack.pack, TokenCache(text_pack.pack).fingerprint, member)
    (first, stop), (token, stop_token) = text_pack.members["b"]
    with pytest.raises(CacheMismatchError, match=rf"{member}: .*rows \[{first}, {stop}\] and tokens \[{token + 1}, {stop_token}\] "
                                                 rf"of the pack at {text_pack.pack}, which holds tokens \[{token}, {stop_token}\).*"
                                                 r"build the caches again"):
        PackedSourceCache(pack, member, (first, stop), (token + 1, stop_token), {}, "f", None)
    rows = pack.num_rows()
    with pytest.raises(CacheMismatchError, match=rf"{member}: .*which has {rows} rows"):
        PackedSourceCache(pack, member, (first, rows + 1), (token, stop_token), {}, "f", None)


def test_reads_outside_a_member_are_refused_naming_it(text_pack):
    members, _ = _open(text_pack)
    member = members["b"]
    rows, tokens, where = member.num_rows(), member.num_tokens(), member.location
    with pytest.raises(IndexError, match=rf"{where}: rows \[0, {rows + 1}\) are outside its {rows} rows"):
        member.row_bounds(0, rows + 1)
    with pytest.raises(IndexError, match=rf"{where}: rows \[{rows}\] are outside"):
        member.get_rows([rows])
    with pytest.raises(IndexError, match=rf"{where}: tokens \[0, {tokens + 1}\) are outside"):
        member.read_tokens(0, tokens + 1)
    with pytest.raises(IndexError, match=rf"{where}: token range \[{tokens - 2}, {tokens + 1}\) is outside its {tokens}"):
        member.read_ranges(np.array([tokens - 2]), np.array([3]), tokens)
    with pytest.raises(IndexError, match=rf"{where}: chunk {tokens // BLOCK + 1} is outside"):
        member.read_chunks([tokens // BLOCK + 1], tokens)
    with pytest.raises(ValueError, match=rf"{where}: token range \[{UNIT - 1}, {UNIT + 1}\) crosses a read unit"):
        member.read_ranges(np.array([UNIT - 1]), np.array([2]), tokens)
    with pytest.raises(ValueError, match=rf"{where}: this cache has no loss spans"):
        member.loss_spans(0, 1)


@pytest.mark.parametrize("object_reads", ["tensorstore", "fsspec"])
def test_members_of_a_pack_on_s3_read_as_the_sources_built_alone(text_pack, s3, object_reads):
    remote = f"s3://{BUCKET}/packs-{time.time_ns()}/pack"
    build(remote, text_pack.shards, on_error="skip")
    pack = open_pack(remote, TokenCache(text_pack.pack).fingerprint, "member", object_reads=object_reads)
    _, alone = _open(text_pack)
    for name, (rows, tokens) in text_pack.members.items():
        member, own = PackedSourceCache(pack, f"{remote}-{name}", rows, tokens, {}, "f", None), alone[name]
        assert not member.caches_blocks(member.num_tokens()) and member.read_unit == own.read_unit
        assert np.array_equal(member.row_bounds(0, member.num_rows()), own.row_bounds(0, own.num_rows()))
        windows = [TokenSeqDataset(c, 300) for c in (member, own)]
        picks = np.random.default_rng(2).permutation(len(windows[1]))
        assert np.array_equal(windows[0].get_batch(picks).tokens, windows[1].get_batch(picks).tokens), name


_CHILD = """
import hashlib, pickle, sys
members = [m for blob in pickle.loads(sys.stdin.buffer.read()) for m in pickle.loads(blob)]
digest = hashlib.sha256()
for m in members:
    digest.update(repr((m.location, m.num_rows(), m.num_tokens(), m.fingerprint)).encode())
    for row in m.get_rows(range(m.num_rows())):
        digest.update(row.tobytes())
print(len({id(m.pack) for m in members}), digest.hexdigest())
"""


def test_members_pickled_to_another_process_read_the_same_and_share_the_pack_there(text_pack):
    members, _ = _open(text_pack, SHARED)  # the process's own chunk cache there too (another one pickles as a new one each time)
    ordered = [members[n] for n in SOURCES]
    blobs = [pickle.dumps(ordered[:1]), pickle.dumps(ordered[1:])]  # two pickles: the pack is shared across them too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps(blobs), capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    digest = hashlib.sha256()
    for m in ordered:
        digest.update(repr((m.location, m.num_rows(), m.num_tokens(), m.fingerprint)).encode())
        for row in m.get_rows(range(m.num_rows())):
            digest.update(row.tobytes())
    assert done.stdout.decode().split() == ["1", digest.hexdigest()]


def _damage_chunk(pack: Path, array: str, element: int) -> None:
    """Flip a bit in the middle of the stored chunk of ``array`` (``data`` or ``offsets`` of the tokens) holding element
    ``element`` (the array's objects each with their index at their start)."""
    layout = ShardLayout.from_metadata(json.loads((pack / "input_ids" / array / "zarr.json").read_text()))
    path = pack / "input_ids" / array / "c" / str(element // layout.shard)
    data = bytearray(path.read_bytes())
    offset, size = np.frombuffer(bytes(data[: layout.index_bytes - 4]), "<u8").reshape(-1, 2)[element % layout.shard // layout.inner]
    data[int(offset + size // 2)] ^= 1
    path.write_bytes(bytes(data))


def test_damage_in_one_members_tokens_fails_its_reads_and_not_those_of_a_member_sharing_the_block(text_pack, tmp_path):
    """A stored chunk of c damaged, in the pack's block that also holds the end of b: c's reads of it raise
    ``CacheDamagedError`` naming the pack and its repair, while every block of b reads as from b built alone (b's own
    cache would not hold c's damage), through the chunk cache and in a dataset over it."""
    pack = tmp_path / "pack"
    shutil.copytree(text_pack.pack, pack)
    (_, (_, b_stop)), (_, (c_first, _)) = text_pack.members["b"], text_pack.members["c"]
    damaged = -(-c_first // UNIT)  # c's first whole stored chunk
    assert damaged * UNIT // BLOCK == (b_stop - 1) // BLOCK, "the damaged chunk must share a block of the pack with b"
    _damage_chunk(pack, "data", damaged * UNIT)
    fingerprint, chunks = TokenCache(str(pack)).fingerprint, ChunkCache(64 << 20)
    members = {name: PackedSourceCache(open_pack(str(pack), fingerprint, str(tmp_path / name), chunks), str(tmp_path / name), rows, tokens,
                                       {}, fingerprint, None) for name, (rows, tokens) in text_pack.members.items()}
    b, own = members["b"], TokenCache(text_pack.alone["b"], chunk_cache=ChunkCache(64 << 20))
    tokens = own.num_tokens()
    assert b.caches_blocks(tokens)
    every = range((tokens - 1) // BLOCK + 1)
    got, want = b.read_chunks(every, tokens)(), own.read_chunks(every, tokens)()
    assert all(got[k].tolist() == want[k].tolist() for k in every)
    windows = [TokenSeqDataset(c, 300) for c in (b, own)]
    picks = np.arange(len(windows[1]))
    assert np.array_equal(windows[0].get_batch(picks).tokens, windows[1].get_batch(picks).tokens)
    c = members["c"]
    with pytest.raises(CacheDamagedError, match=rf"cache at {pack} is damaged: input_ids/data elements {damaged * UNIT:,}-.*checksum "
                                                rf"mismatch.*tokenmix verify {pack} --repair"):
        c.read_chunks([(damaged * UNIT - c_first) // BLOCK], c.num_tokens())()


@pytest.fixture(scope="module")
def small_offsets_packs(tmp_path_factory, small_layout) -> dict[str, Packed]:
    """Packs (and their sources alone) of stored row ends in chunks of 16: ``held``, whose open object holds them, and
    ``read``, whose open object holds none (as a pack of over ``ROW_ENDS_HELD`` rows), so that its members' bounds are
    read from its ``offsets``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "OFFSETS_SHARD", 64)
        patch.setattr(store, "OFFSETS_INNER", 16)
        held = _build(tmp_path_factory.mktemp("held"), supervised=False)
        patch.setattr(open_object, "ROW_ENDS_HELD", 16)
        return {"held": held, "read": _build(tmp_path_factory.mktemp("read"), supervised=False)}


def _damaged_copy(packed: Packed, tmp_path: Path, array: str, element: int) -> tuple[Path, Callable[[str], PackedSourceCache]]:
    """A copy of the pack with the stored chunk of ``array`` holding ``element`` damaged, and how to open its members."""
    pack = tmp_path / "pack"
    shutil.copytree(packed.pack, pack)
    _damage_chunk(pack, array, element)
    fingerprint = TokenCache(str(pack)).fingerprint

    def member(name: str) -> PackedSourceCache:
        rows, tokens = packed.members[name]
        return PackedSourceCache(open_pack(str(pack), fingerprint, str(tmp_path / name), ChunkCache()), str(tmp_path / name), rows,
                                 tokens, {}, fingerprint, None)

    return pack, member


def test_row_ends_damaged_in_one_members_rows_fail_its_opening_and_not_the_other_members(small_offsets_packs, tmp_path):
    """The stored row ends of rows of c damaged, where the pack's open object does not hold them: c is refused naming
    the pack and its repair, while a and b open and read as their sources built alone (their own caches would not hold
    c's damage)."""
    packed = small_offsets_packs["read"]
    c_rows = packed.members["c"][0]
    damaged = c_rows[1] - 5  # offsets[r + 1] is where row r ends: a stored chunk of c's row ends only
    assert damaged // 16 * 16 > c_rows[0] + 1
    pack, member = _damaged_copy(packed, tmp_path, "offsets", damaged)
    with pytest.raises(CacheDamagedError, match=rf"cache at {pack} is damaged: input_ids/offsets elements {damaged // 16 * 16:,}-.*"
                                                rf"tokenmix verify {pack} --repair"):
        member("c")
    for name in ("a", "b"):
        got, own = member(name), TokenCache(packed.alone[name])
        rows, tokens = own.num_rows(), own.num_tokens()
        assert np.array_equal(got.row_bounds(0, rows), own.row_bounds(0, rows)) and np.array_equal(got.row_ends(0, rows), own.row_ends(0, rows))
        assert np.array_equal(got.committed_row_ends(0), own.committed_row_ends(0))
        windows = [PackedDataset(c, 400, pad_id=PAD, persist=False) for c in (got, own)]
        picks = np.arange(len(windows[1]))
        assert np.array_equal(windows[0].get_batch(picks).tokens, windows[1].get_batch(picks).tokens), name
        assert np.array_equal(got.read_tokens(0, tokens), own.read_tokens(0, tokens))


def test_rows_of_a_member_are_read_by_its_bounds_past_damaged_row_ends_it_does_not_need(small_offsets_packs, tmp_path):
    """A stored chunk of row ends holding the ends of b's last rows and c's first damaged, where the pack's open object
    holds them all (checked): b's and c's rows read as from their sources built alone, as their datasets do, and as
    their own caches, which hold none of that damage, would."""
    packed = small_offsets_packs["held"]
    (first, stop), _ = packed.members["b"]
    damaged = stop + 1  # the chunk holding the end of b's last row and of c's first
    assert damaged // 16 * 16 <= stop < damaged // 16 * 16 + 16
    _, member = _damaged_copy(packed, tmp_path, "offsets", damaged)
    for name in ("b", "c"):
        got, own = member(name), TokenCache(packed.alone[name])
        rows = own.num_rows()
        assert [r.tolist() for r in got.get_rows(range(rows))] == [r.tolist() for r in own.get_rows(range(rows))], name
        assert got[rows - 1].tolist() == own[rows - 1].tolist()
