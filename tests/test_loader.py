"""The loader over real caches of the bundled corpus slice: 8 fake CPU devices in this process, and two real
processes of 4 devices each (tests/loader_worker.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import json
import logging
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import draccus
import haliax as hax
import jax
import loader_worker
import numpy as np
import pytest
import yaml
from helpers import (
    SEQ_LEN,
    CountingDataset,
    FailingDataset,
    ReadLogDataset,
    SlowDataset,
    Uint32TokensDataset,
    Wrapped,
    demo_urls,
    mixture_yaml,
    process_alive,
    wait_until,
)
from jax.sharding import NamedSharding, PartitionSpec
from s3_server import free_port

from tokenmix import (
    BatchSchedule,
    DataLoader,
    LMMixtureDatasetConfig,
    LoaderError,
    MixtureDataset,
    TokenBatch,
    TokenCache,
    TokenSeqDataset,
    batch_fingerprint,
    build_caches,
)
from tokenmix._waiting import POLL_MAX_S
from tokenmix.datasets import Pending
from tokenmix.loader.fingerprint import combine, row_digests
from tokenmix.loader.reader_processes import ReaderProcessError

# Eight fake CPU devices. Pytest imports every test module before it runs any test, and nothing imports
# a JAX backend at import time, so this runs before JAX starts (JAX refuses it afterwards, loudly).
jax.config.update("jax_num_cpu_devices", 8)

TESTS = Path(__file__).resolve().parent
FIELDS = ("tokens", "loss_mask", "segment_ids", "source_ids")


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loader")
    path = root / "mixture.yaml"
    path.write_text(mixture_yaml(root / "caches"))
    build_caches(mixture_config(path), progress=False)
    return path


def mixture_config(path: Path) -> LMMixtureDatasetConfig:
    return draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(path.read_text()))


@pytest.fixture(scope="module")
def train(config_path):
    """The three-source shuffled mixture (restart: it never ends)."""
    return mixture_config(config_path).train_set(SEQ_LEN)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tokenmix-loader")]


def expected_rows(mesh: jax.sharding.Mesh, device, axes: tuple[str, ...], size: int) -> tuple[int, int]:
    """The rows a device holds, from its mesh coordinates (row-major over the batch's mesh axes)."""
    coords = dict(zip(mesh.axis_names, (int(c[0]) for c in np.nonzero(mesh.devices == device))))
    shards = math.prod(mesh.shape[a] for a in axes)
    block = int(np.ravel_multi_index([coords[a] for a in axes], [mesh.shape[a] for a in axes])) if axes else 0
    return block * size // shards, (block + 1) * size // shards


def as_tuple(spec) -> tuple[str, ...]:
    return () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)


MESH_CASES = [
    pytest.param((8,), ("data",), {"batch": "data"}, id="8-batch"),
    pytest.param((8,), ("data",), {}, id="8-replicated"),
    pytest.param((4, 2), ("data", "model"), {"batch": "data"}, id="4x2-batch-model_replicated"),
    pytest.param((4, 2), ("data", "model"), {"batch": "data", "position": "model", "embed": "model"}, id="4x2-batch-position"),
    pytest.param((4, 2), ("data", "model"), {"batch": ("data", "model")}, id="4x2-batch_over_both"),
    pytest.param((2, 2, 2), ("replica", "data", "model"), {"batch": ("replica", "data")}, id="2x2x2-batch-model_replicated"),
    pytest.param((2, 2, 2), ("replica", "data", "model"), {"batch": ("replica", "data"), "position": "model"}, id="2x2x2-batch-position"),
    pytest.param((2, 2, 2), ("replica", "data", "model"), {"batch": "data", "position": ("model", "replica")}, id="2x2x2-position_over_two"),
]


@pytest.mark.parametrize("shape, names, mapping", MESH_CASES)
def test_global_batches_and_shards_are_the_datasets_examples(train, shape, names, mapping):
    mesh = jax.make_mesh(shape, names)
    dataset = CountingDataset(train)
    schedule = BatchSchedule.of([(0, 16), (2, 32)])
    batch_axes, position_axes = as_tuple(mapping.get("batch")), as_tuple(mapping.get("position"))
    steps = 4
    with DataLoader(dataset, schedule, mesh, mapping, fingerprint=True) as loader:
        for sb in loader:
            size = schedule.batch_size(sb.step)
            assert sb.offset == schedule.offset(sb.step) and sb.size == size
            expected = train.get_batch(np.arange(sb.offset, sb.offset + size))
            Batch, Position = hax.Axis("batch", size), hax.Axis("position", SEQ_LEN)
            assert sb.batch.tokens.axes == sb.batch.loss_mask.axes == sb.batch.segment_ids.axes == (Batch, Position)
            assert sb.batch.source_ids.axes == (Batch,)
            for field, array in sb.batch.arrays().items():
                want = getattr(expected, field)
                assert array.shape == want.shape and array.dtype == want.dtype
                assert np.array_equal(np.asarray(array), want), field
                spec = PartitionSpec(mapping.get("batch"), mapping.get("position")) if want.ndim == 2 else PartitionSpec(mapping.get("batch"))
                assert array.sharding == NamedSharding(mesh, spec)
                assert len(array.addressable_shards) == 8
                for shard in array.addressable_shards:
                    rows = expected_rows(mesh, shard.device, batch_axes, size)
                    assert shard.index[0].indices(size)[:2] == rows
                    if want.ndim == 2:
                        assert shard.index[1].indices(SEQ_LEN)[:2] == expected_rows(mesh, shard.device, position_axes, SEQ_LEN)
                    assert np.array_equal(np.asarray(shard.data), want[shard.index])
            assert sb.fingerprint == batch_fingerprint(expected)
            if sb.step == steps - 1:
                break
    # one read per step, every row once, even where replicas (model axis, unsharded batch) hold the same rows
    for step, read in enumerate(dataset.reads[:steps]):
        offset, size = schedule.offset(step), schedule.batch_size(step)
        assert np.array_equal(read, np.arange(offset, offset + size))


def test_a_batch_is_placed_on_cpu_devices_without_a_copy(train):
    """The batch's host arrays are aligned so that XLA's CPU client uses them in place: every device shard of the
    placed (Batch, Position) arrays lies inside the host array read for it (a copy would double the cost of placing a
    batch). ``source_ids`` shards, 16 bytes here, cannot all start on a 64-byte boundary and are copied. The first batch
    is placed through ``jax.device_put``, later ones directly (``placement.ArrayPlacer``): both in place."""
    held: list[TokenBatch] = []

    class Keeping(Wrapped):
        def read(self, indices):
            pending = self.base.read(indices)

            def result() -> TokenBatch:
                held.append(pending.result())
                return held[-1]

            return Pending(result)

    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(Keeping(train), 16, mesh, {"batch": "data"}, prefetch=0) as loader:
        placed = [loader.batch(3), loader.batch(4)]
    for sb, host in zip(placed, held, strict=True):
        for field in ("tokens", "loss_mask", "segment_ids"):
            array, host_array = getattr(sb.batch, field).array, getattr(host, field)
            begin = host_array.ctypes.data
            assert begin % 64 == 0, field
            for shard in array.addressable_shards:
                assert begin <= shard.data.unsafe_buffer_pointer() < begin + host_array.nbytes, field
            assert np.array_equal(np.asarray(array), host_array), field


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 1])
def test_packed_sources_stream_through_the_loader_like_token_windows(config_path, workers):
    """A mixture with a packed source (whole documents, segment ids, padding of id -1 without loss) on a
    mesh that splits positions too: the loader's batches are the mixture's examples, read here or in a reader
    process."""
    doc = yaml.safe_load(config_path.read_text())
    doc["configs"]["webster"]["packing"] = {"max_segments_per_example": 4, "long_documents": "split"}
    config = draccus.decode(LMMixtureDatasetConfig, doc)
    train = config.train_set(SEQ_LEN)
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    webster = train.names.index("webster")
    padded = 0
    with DataLoader(train, 32, mesh, {"batch": "data", "position": "model"}, positions=True, workers=workers) as loader:
        for sb, _ in zip(loader, range(6)):
            expected = train.get_batch(np.arange(sb.offset, sb.offset + 32))
            arrays = sb.batch.arrays()
            assert set(arrays) == {"tokens", "loss_mask", "segment_ids", "source_ids", "positions"}
            for field, array in arrays.items():
                want = expected.positions() if field == "positions" else getattr(expected, field)
                assert np.array_equal(np.asarray(array), want), field
            assert sb.batch.positions.axes == sb.batch.tokens.axes and arrays["positions"].sharding == arrays["tokens"].sharding
            packed = expected.source_ids == webster
            padding = expected.segment_ids[packed] == -1
            assert not expected.loss_mask[packed][padding].any()
            padded += int(padding.any(axis=1).sum())
    assert padded > 0, "some packed examples should end in padding"


def test_fingerprints_follow_content_not_layout(train):
    batch = train.get_batch(np.arange(64))
    reference = batch_fingerprint(batch)
    halves = np.concatenate([row_digests(train.get_batch(np.arange(32))), row_digests(train.get_batch(np.arange(32, 64)))])
    assert combine(halves, SEQ_LEN) == reference and len(reference) == 32
    for field, change in [("tokens", (3, 5)), ("loss_mask", (0, 0)), ("segment_ids", (63, 127)), ("source_ids", (7,))]:
        other = dataclasses.replace(batch, **{field: getattr(batch, field).copy()})
        getattr(other, field)[change] = ~getattr(other, field)[change] if field == "loss_mask" else getattr(other, field)[change] + 1
        assert batch_fingerprint(other) != reference, field
    swapped = TokenBatch(*(getattr(batch, f)[[1, 0, *range(2, 64)]] for f in FIELDS))
    assert batch_fingerprint(swapped) != reference


def test_resume_at_any_step_equals_continuing_and_random_access(train):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    ramp = [(0, 8), (3, 16), (7, 24)]
    with DataLoader(train, ramp, mesh, {"batch": "data"}, fingerprint=True) as loader:
        run = [(sb.step, sb.fingerprint, np.asarray(sb.batch.tokens.array)) for sb, _ in zip(loader, range(12))]
        assert [step for step, _, _ in run] == list(range(12))
        assert len({fp for _, fp, _ in run}) == 12
        for start in np.random.default_rng(0).choice(12, size=4, replace=False).tolist():
            with loader.iter_from_step(start) as it:
                resumed = [(sb.step, sb.fingerprint, np.asarray(sb.batch.tokens.array)) for sb, _ in zip(it, range(12 - start))]
            for (s1, f1, t1), (s2, f2, t2) in zip(run[start:], resumed, strict=True):
                assert s1 == s2 and f1 == f2 and np.array_equal(t1, t2)
        for step in (11, 0, 5):
            assert loader[step].fingerprint == loader.batch(step).fingerprint == run[step][1]


def test_prefetch_depth_changes_nothing(train):
    mesh = jax.make_mesh((2, 2, 2), ("replica", "data", "model"))
    runs = []
    for depth in (0, 1, 4):
        with DataLoader(train, 16, mesh, {"batch": ("replica", "data")}, prefetch=depth, fingerprint=True) as loader:
            runs.append([(sb.fingerprint, np.asarray(sb.batch.loss_mask.array)) for sb, _ in zip(loader, range(8))])
    for other in runs[1:]:
        assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(runs[0], other))


class HeldDataset(Wrapped):
    """Reads of examples from ``held_from`` on wait until ``release`` is set (and fail after 10 s)."""

    def __init__(self, base, held_from: int):
        super().__init__(base)
        self.held_from = held_from
        self.release = threading.Event()

    def read(self, indices) -> Pending[TokenBatch]:
        if np.max(indices) >= self.held_from and not self.release.wait(120):
            raise TimeoutError("held read was never released")
        return self.base.read(indices)


@pytest.mark.timeout(300)
def test_first_batch_is_not_held_back_by_a_deep_prefetch(train):
    dataset = HeldDataset(train, 16)
    with DataLoader(dataset, 16, jax.make_mesh((8,), ("data",)), {"batch": "data"}, prefetch=8) as loader:
        it = iter(loader)
        start = time.monotonic()
        assert next(it).step == 0  # while the read of step 1 is still held (for 120 s at most)
        assert time.monotonic() - start < 60 and not dataset.release.is_set()  # a generous bound for a busy machine
        dataset.release.set()
        assert [next(it).step for _ in range(3)] == [1, 2, 3]


def test_fingerprints_are_off_by_default_and_then_nothing_is_hashed(train, monkeypatch):
    def refuse(batch):
        raise AssertionError("rows were hashed with fingerprints off")

    monkeypatch.setattr("tokenmix.loader.step_reads.row_digests", refuse)
    mesh = jax.make_mesh((8,), ("data",))
    with DataLoader(train, 16, mesh, {"batch": "data"}) as loader:
        assert loader.batch(0).fingerprint is None
        assert [sb.fingerprint for sb, _ in zip(loader, range(3))] == [None] * 3
        assert loader.batch(0).batch.positions is None and "positions" not in loader.batch(0).batch.arrays()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("prefetch, read_ahead, workers", [(0, 0, 0), (3, 0, 0), (2, 4, 0), (2, 0, 1)])
def test_read_errors_reach_the_consumer_naming_step_sources_and_indices(train, prefetch, read_ahead, workers):
    """A read started ahead of its step that fails fails that step, not the one that started it; one in a reader
    process comes back with the reader's traceback."""
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    loader = DataLoader(FailingDataset(train, 3 * 16 + 5, 3 * 16 + 6), 16, mesh, {"batch": "data"}, prefetch=prefetch, read_ahead=read_ahead,
                        workers=workers)
    it = iter(loader)
    assert [next(it).step for _ in range(3)] == [0, 1, 2]
    with pytest.raises(LoaderError) as info:
        next(it)
    error = info.value
    assert error.step == 3 and np.array_equal(error.indices, np.arange(48, 64))
    message = str(error)
    assert message.startswith("step 3: loading examples [48, 64) (16 rows")
    assert "simulated disk failure" in message and "iter_from_step(3)" in message
    located, _ = train.locate(np.arange(48, 64))
    counts = np.bincount(located, minlength=len(train.names))
    assert error.sources == [f"{name} ({n} row{'' if n == 1 else 's'})" for name, n in zip(train.names, counts.tolist()) if n]
    assert all(source in message for source in error.sources)
    if workers:
        assert isinstance(error.__cause__, ReaderProcessError) and "OSError: simulated disk failure" in str(error.__cause__)
    else:
        assert isinstance(error.__cause__, OSError)
    with pytest.raises(StopIteration):
        next(it)
    assert not loader_threads() and not reader_processes()


class RecordedDataset(Wrapped):
    """Records the first index of every read, in the order reads start."""

    def __init__(self, base):
        super().__init__(base)
        self.started: list[int] = []

    def read(self, indices) -> Pending[TokenBatch]:
        self.started.append(int(np.asarray(indices)[0]))
        return self.base.read(indices)


@pytest.mark.timeout(60)
def test_read_ahead_starts_later_steps_reads_before_a_step_is_awaited_and_changes_no_batch(train):
    mesh = jax.make_mesh((8,), ("data",))
    recorded = RecordedDataset(train)
    with DataLoader(recorded, 16, mesh, {"batch": "data"}, prefetch=0, read_ahead=3, fingerprint=True) as ahead, \
            DataLoader(train, [(0, 16), (2, 32)], mesh, {"batch": "data"}, prefetch=0, fingerprint=True) as plain:
        it = iter(ahead)
        first = next(it)
        assert first.step == 0 and recorded.started == [0, 16, 32, 48]  # steps 1-3 started before step 0 was awaited
        next(it)
        assert recorded.started == [0, 16, 32, 48, 64]  # each later step starts one more, none twice
        assert [sb.fingerprint for sb, _ in zip(iter(ahead), range(6))] == [ahead.batch(s).fingerprint for s in range(6)]
        with DataLoader(train, [(0, 16), (2, 32)], mesh, {"batch": "data"}, prefetch=1, read_ahead=2, fingerprint=True) as ramp:
            assert [sb.fingerprint for sb, _ in zip(ramp, range(5))] == [plain.batch(s).fingerprint for s in range(5)]


@pytest.mark.timeout(60)
def test_shutdown_leaves_no_thread(train):
    mesh = jax.make_mesh((8,), ("data",))
    loader = DataLoader(train, 16, mesh, {"batch": "data"}, prefetch=4)
    it = loader.iter_from_step(0)
    next(it)
    assert loader_threads()  # the prefetch thread is filling its queue
    it.close()
    assert not loader_threads()
    it = iter(loader)
    next(it)
    del it  # abandoned iterator: garbage collection stops its thread
    gc.collect()
    assert not loader_threads()
    with loader:
        for sb in loader:
            if sb.step == 2:
                break
        kept = loader.iter_from_step(5)  # still referenced: the loader's close stops it
        next(kept)
    assert not loader_threads()
    with pytest.raises(StopIteration):
        next(kept)
    with pytest.raises(RuntimeError, match="is closed"):
        iter(loader)


class GrowingDataset(Wrapped):
    """A finite dataset whose readable length grows (a cache still building), then becomes final."""

    def __init__(self, base, length: int):
        super().__init__(base)
        self.length = length
        self.finished = False

    def is_finite(self) -> bool:
        return True

    def current_len(self) -> int:
        return self.length

    def final_len(self) -> int | None:
        return self.length if self.finished else None

    def read(self, indices) -> Pending[TokenBatch]:
        assert np.max(indices) < self.length, "the loader read past the readable length"
        return self.base.read(indices)


@pytest.mark.timeout(60)
def test_loader_waits_for_a_growing_cache_and_says_why(train, caplog):
    mesh = jax.make_mesh((8,), ("data",))
    train.get_batch(np.arange(16))  # its sources open (on first draw) before the growing starts, which times the steps
    dataset = GrowingDataset(train, 40)

    def grow() -> None:
        try:  # the cache grows once the loader waits for it, however long the loader takes to get there
            wait_until(lambda: "step 2 needs examples" in caplog.text, "the loader waiting at step 2")
        finally:
            while dataset.length < 170:
                time.sleep(0.05)
                dataset.length += 10
            dataset.finished = True

    grower = threading.Thread(target=grow)
    with caplog.at_level(logging.INFO, logger="tokenmix.loader"), DataLoader(dataset, 16, mesh, {"batch": "data"}, fingerprint=True) as loader:
        grower.start()
        seen = [(sb.step, sb.fingerprint) for sb in loader]
    grower.join()
    assert [step for step, _ in seen] == list(range(10))  # 170 examples: 10 full batches of 16, the last 10 examples unused
    assert all(fp == batch_fingerprint(train.get_batch(np.arange(16 * s, 16 * s + 16))) for s, fp in seen)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("step 2 needs examples up to 48; GrowingDataset(") and "has 40 so far" in m for m in messages)
    assert any("step 10 needs examples [160, 176)" in m and "last full batch is step 9" in m for m in messages)
    assert loader.num_steps() == 10


@pytest.mark.timeout(120)
def test_loader_streams_a_real_cache_while_it_builds(growing_cache, caplog):
    """A cache whose second shard is held back: the loader serves what is committed, says why it waits,
    and once the build finishes ends at the last full batch with exactly the finished cache's batches."""
    building = growing_cache(demo_urls("linux_doc"), held_from=1, chunk_bytes=1 << 13)
    mesh = jax.make_mesh((8,), ("data",))
    dataset = building.open(lambda cache: TokenSeqDataset(cache, SEQ_LEN))
    with caplog.at_level(logging.INFO, logger="tokenmix.loader"), DataLoader(dataset, 16, mesh, {"batch": "data"}) as loader:
        it = iter(loader)
        seen = [np.asarray(next(it).batch.tokens.array)]
        assert dataset.final_len() is None, "the build must still be held at its second shard"

        def release_once_waiting() -> None:
            try:  # the build goes on once the loader has served what was committed and waits, not after a guessed time
                wait_until(lambda: "waiting for its cache to grow" in caplog.text, "the loader waiting for the build")
            finally:
                building.release()

        threading.Thread(target=release_once_waiting, daemon=True).start()
        seen += [np.asarray(sb.batch.tokens.array) for sb in it]
    building.finish()
    finished = TokenSeqDataset(TokenCache(building.location), SEQ_LEN)
    assert len(seen) == len(finished) // 16 > 1
    for step, tokens in enumerate(seen):
        assert np.array_equal(tokens, finished.get_batch(np.arange(16 * step, 16 * step + 16)).tokens)
    assert "waiting for its cache to grow" in caplog.text


@pytest.mark.timeout(150)
def test_a_stop_strategy_mixture_over_a_building_source_waits_for_its_length_without_blocking_close(train):
    """Its end needs every source's length: while a source's cache builds, the length is unknown (num_steps None) and the
    loader waits for it polling its stop, so closing stops the thread; once the source finishes, the batches are those of
    the mixture over the finished source, up to its last full batch."""
    mesh = jax.make_mesh((8,), ("data",))
    linux, webster = train.source("linux_doc").base, train.source("webster").base
    growing = GrowingDataset(linux, 40)
    weights = {"linux_doc": 1.0, "webster": 1.0}
    building = MixtureDataset({"linux_doc": growing, "webster": webster}, weights, block_size=64, stop_strategy="first_exhausted")
    loader = DataLoader(building, 16, mesh, {"batch": "data"}, fingerprint=True)
    it = iter(loader)
    it.close()
    assert not loader_threads()
    assert loader.num_steps() is None and building.final_len() is None and building.current_len() == 0
    growing.length, growing.finished = len(linux), True
    finished = MixtureDataset({"linux_doc": linux, "webster": webster}, weights, block_size=64, stop_strategy="first_exhausted")
    with DataLoader(finished, 16, mesh, {"batch": "data"}, fingerprint=True, prefetch=0) as expected:
        assert loader.num_steps() == expected.num_steps() > 1
        assert [sb.fingerprint for sb in loader] == [expected.batch(step).fingerprint for step in range(expected.num_steps())]
    loader.close()


@pytest.mark.timeout(150)
def test_close_while_waiting_for_a_cache_returns_promptly(train, caplog):
    mesh = jax.make_mesh((8,), ("data",))
    loader = DataLoader(GrowingDataset(train, 8), 16, mesh, {"batch": "data"})
    with caplog.at_level(logging.INFO, logger="tokenmix.loader"):
        it = iter(loader)
        wait_until(lambda: "waiting for its cache to grow" in caplog.text, "the loader waiting for the cache")
        start = time.monotonic()
        it.close()
        closed = time.monotonic() - start
    # the wait polls the stop at least every POLL_MAX_S (2 s): a wait that did not would hold close for its 60 s join
    assert not loader_threads() and "still busy" not in caplog.text
    assert closed < POLL_MAX_S + 30, closed  # a generous bound for a busy machine


def test_finite_dataset_stops_at_its_last_full_batch(train):
    webster = train.source("webster").base  # one cache as token windows: finite
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(webster, 64, mesh, {"batch": ("data", "model")}) as loader:
        n = loader.num_steps()
        assert n == len(webster) // 64 and len(webster) % 64  # a partial batch is left over
        steps = [sb.step for sb in loader.iter_from_step(n - 3)]
        assert steps == [n - 3, n - 2, n - 1]
        assert np.array_equal(np.asarray(loader.batch(n - 1).batch.tokens.array), webster.get_batch(np.arange((n - 1) * 64, n * 64)).tokens)
        past = rf"step {n} needs examples \[{n * 64}, {n * 64 + 64}\) .* has {len(webster)}: its last full batch is step {n - 1}"
        with pytest.raises(IndexError, match=past):
            loader.batch(n)


def reader_processes() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("tokenmix-reader")]


def shared_memory_of(pid: int) -> set[str]:
    """The /dev/shm files a process maps, by path (an unlinked one as the path it had)."""
    with open(f"/proc/{pid}/maps") as maps:
        fields = [line.split(maxsplit=5) for line in maps]
    return {f[5].strip().removesuffix(" (deleted)") for f in fields if len(f) == 6 and f[5].startswith("/dev/shm/")}


@pytest.mark.timeout(120)
def test_reader_processes_give_the_batches_the_loaders_own_thread_gives(train):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    ramp = [(0, 16), (3, 32)]  # two batch sizes: a reader's slots hold the larger
    with DataLoader(train, ramp, mesh, {"batch": "data"}, fingerprint=True, prefetch=0) as threaded:
        expected = [threaded.batch(s) for s in range(2, 9)]
    for workers in (1, 2):
        with DataLoader(train, ramp, mesh, {"batch": "data"}, fingerprint=True, workers=workers, prefetch=1, read_ahead=workers) as loader:
            it = loader.iter_from_step(2)
            got = [sb for sb, _ in zip(it, range(7))]
            assert len(reader_processes()) == workers
        assert not reader_processes()
        assert [sb.step for sb in got] == list(range(2, 9))
        assert [sb.fingerprint for sb in got] == [sb.fingerprint for sb in expected]
        for ours, theirs in zip(got, expected):
            for field in FIELDS:
                a, b = getattr(ours.batch, field).array, getattr(theirs.batch, field).array
                assert a.sharding == b.sharding and np.array_equal(np.asarray(a), np.asarray(b)), field


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_stage_appended_while_iterating_reaches_the_reader_processes_and_gives_the_logs_batches(config_path, workers):
    """``DataLoader.append_stage`` past the read-ahead: the batches are those of the mixture built with the whole log,
    whether the steps are read in this process or in reader processes (each told of the stage)."""
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    grown = mixture_config(config_path).train_set(SEQ_LEN)
    with DataLoader(grown, 16, mesh, {"batch": "data"}, fingerprint=True, workers=workers, prefetch=1) as loader:
        it = loader.iter_from_step(0)
        got = [next(it).fingerprint for _ in range(2)]
        start = grown.next_boundary(16 * (2 + loader.steps_read_ahead()))
        loader.append_stage(start, {"linux_doc": 0.1, "webster": 0.9})
        got += [next(it).fingerprint for _ in range(start // 16 + 8 - 2)]
    whole = mixture_config(config_path).train_set(SEQ_LEN, weight_log=grown.stages)
    with DataLoader(whole, 16, mesh, {"batch": "data"}, fingerprint=True, prefetch=0) as loader:
        assert got == [loader.batch(step).fingerprint for step in range(len(got))]
    old = mixture_config(config_path).train_set(SEQ_LEN)
    with DataLoader(old, 16, mesh, {"batch": "data"}, fingerprint=True, prefetch=0) as loader:
        assert got[-1] != loader.batch(len(got) - 1).fingerprint  # the stage changed the batches after its start


@pytest.mark.timeout(120)
def test_steps_read_ahead_covers_each_readers_read_ahead_so_a_stage_past_it_gives_the_logs_batches(config_path, tmp_path):
    """With reader processes, each reader starts the reads of its next ``read_ahead`` steps (every ``workers``-th step)
    past the last step in its slots: ``steps_read_ahead()`` must count them, or a stage appended past it changes batches
    already read."""
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    workers, prefetch, read_ahead, taken = 2, 1, 2, 2
    grown = mixture_config(config_path).train_set(SEQ_LEN)
    dataset = ReadLogDataset(grown, tmp_path / "reads.log")
    with DataLoader(dataset, 16, mesh, {"batch": "data"}, fingerprint=True, workers=workers, prefetch=prefetch, read_ahead=read_ahead) as loader:
        it = loader.iter_from_step(0)
        got = [next(it).fingerprint for _ in range(taken)]
        # the queue, the step its thread holds, each reader's slots, then the read-ahead of the last step in a slot
        furthest = taken + prefetch + workers * (prefetch + read_ahead)
        deadline = time.monotonic() + 60
        while 16 * furthest not in dataset.first_indices_read() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert max(dataset.first_indices_read()) // 16 == furthest
        assert furthest <= taken - 1 + loader.steps_read_ahead()
        start = grown.next_boundary(16 * (taken + loader.steps_read_ahead()))
        loader.append_stage(start, {"linux_doc": 0.1, "webster": 0.9})
        got += [next(it).fingerprint for _ in range(start // 16 + 4 - taken)]
    whole = mixture_config(config_path).train_set(SEQ_LEN, weight_log=grown.stages)
    with DataLoader(whole, 16, mesh, {"batch": "data"}, fingerprint=True, prefetch=0) as loader:
        assert got == [loader.batch(step).fingerprint for step in range(len(got))]


@pytest.mark.timeout(120)
def test_uint32_tokens_give_the_same_int32_batches_with_and_without_reader_processes(train):
    """A dataset whose tokens come as uint32 gives int32 batches, as the readers' int32 slots do, whatever ``workers`` is:
    one dtype, so a jitted step is not traced twice; a token id that int32 cannot hold is refused, naming step and field."""
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    want = [train.get_batch(np.arange(s * 16, (s + 1) * 16)) for s in range(3)]
    for workers in (0, 1):
        with DataLoader(Uint32TokensDataset(train), 16, mesh, {"batch": "data"}, workers=workers, fingerprint=True) as loader:
            got = [sb for sb, _ in zip(loader, range(3))]
        for sb, w in zip(got, want, strict=True):
            tokens = sb.batch.tokens.array
            assert tokens.dtype == np.int32, workers
            assert np.array_equal(np.asarray(tokens), w.tokens) and sb.fingerprint == batch_fingerprint(w)
    with DataLoader(Uint32TokensDataset(train, big=2**31), 16, mesh, {"batch": "data"}, prefetch=0) as loader:
        with pytest.raises(LoaderError, match=r"step 0: .*tokens .*uint32.* int32"):
            loader.batch(0)


@pytest.mark.timeout(120)
def test_reader_processes_end_a_finite_dataset_at_its_last_full_batch(train):
    webster = train.source("webster").base
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(webster, 64, mesh, {"batch": ("data", "model")}, workers=2) as loader:
        n = loader.num_steps()
        assert [sb.step for sb in loader.iter_from_step(n - 3)] == [n - 3, n - 2, n - 1]
        assert not reader_processes()  # stopped at the end, before the loader is closed


@pytest.mark.timeout(120)
def test_a_reader_process_that_dies_is_reported_and_closing_frees_its_memory(train):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(train, 16, mesh, {"batch": "data"}, workers=1, prefetch=1) as loader:
        it = iter(loader)
        next(it)
        (reader,) = reader_processes()
        memory = f"/dev/shm/{it._prefetcher._processes._memory[0].name}"
        assert memory in shared_memory_of(os.getpid()) and not os.path.exists(memory)  # mapped, its name unlinked at once
        os.kill(reader.pid, signal.SIGKILL)
        with pytest.raises(LoaderError, match=r"reader process tokenmix-reader-0-from-step-0 .* exited with code -9"):
            for _ in range(10):  # a batch or two may be ready already
                next(it)
    assert memory not in shared_memory_of(os.getpid()) and not reader_processes()


@pytest.mark.timeout(120)
def test_reader_processes_stop_promptly_ignore_ctrl_c_and_do_not_outlive_a_killed_loader(train, config_path, tmp_path, caplog):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(train, 16, mesh, {"batch": "data"}, workers=1) as loader:
        it = iter(loader)
        first = next(it)
        (reader,) = reader_processes()
        os.kill(reader.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group: the loader's to handle
        assert [next(it).step for _ in range(3)] == [first.step + 1, first.step + 2, first.step + 3]
    marks = tmp_path / "reads"
    marks.mkdir()
    slow = DataLoader(SlowDataset(train, 2.0, marks), 16, mesh, {"batch": "data"}, workers=2, prefetch=4)
    it = iter(slow)

    def reading() -> set[str]:
        """The readers that have started a read (both, or none yet)."""
        pids = {m.name.split("-")[0] for m in marks.iterdir()}
        return pids if len(pids) == 2 else set()

    readers = wait_until(reading, "both readers reading")
    closed_at = time.monotonic_ns()
    with caplog.at_level(logging.WARNING, logger="tokenmix.loader.reader_processes"):
        it.close()  # each reader is inside a 2 s read, with three more free slots it must not fill
    after = [m.name.split("-")[0] for m in marks.iterdir() if int(m.name.split("-")[1]) > closed_at]
    # a reader may have started the read of its next slot before the stop reached it, never more; and none was killed
    assert all(after.count(pid) <= 1 for pid in readers), sorted(m.name for m in marks.iterdir())
    assert not caplog.records and not reader_processes()
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing, sys, time
        sys.path[:0] = [{str(TESTS)!r}]
        import draccus, jax, yaml
        from helpers import SlowDataset
        from tokenmix import DataLoader, LMMixtureDatasetConfig
        if __name__ == "__main__":
            config = draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(open({str(config_path)!r})))
            loader = DataLoader(SlowDataset(config.train_set(64), 60.0), 8, jax.make_mesh((1,), ("data",)), {{"batch": "data"}}, workers=1)
            it = iter(loader)
            time.sleep(2)
            print(multiprocessing.active_children()[0].pid, flush=True)
            time.sleep(600)
    """))
    with open(tmp_path / "killed.err", "w") as err:  # its resource tracker reports the shared memory it cleans up
        parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), (tmp_path / "killed.err").read_text()
        orphan = int(line)
        parent.kill()  # while its reader is inside a 60 s read
        parent.wait()
        wait_until(lambda: not process_alive(orphan), f"the orphaned reader {orphan} exiting")  # it exits after a grace of 5 s
    except BaseException:  # not left sleeping 10 minutes beside the tests that follow
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        raise


@pytest.mark.timeout(120)
def test_a_loader_killed_with_its_whole_process_group_leaves_no_shared_memory(config_path, tmp_path):
    script = tmp_path / "group.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        import draccus, jax, yaml
        from tokenmix import DataLoader, LMMixtureDatasetConfig
        if __name__ == "__main__":
            config = draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(open({str(config_path)!r})))
            loader = DataLoader(config.train_set(64), 8, jax.make_mesh((1,), ("data",)), {{"batch": "data"}}, workers=2, prefetch=3)
            it = iter(loader)
            steps = [next(it).step for _ in range(4)]
            print(steps, flush=True)
            time.sleep(600)
    """))
    with open(tmp_path / "group.err", "w") as err:  # a process group of its own: the loader, its readers, its resource tracker
        parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    segments: set[str] = set()
    try:
        line = parent.stdout.readline()
        assert line.strip() == "[0, 1, 2, 3]", (tmp_path / "group.err").read_text()
        segments = shared_memory_of(parent.pid)
        assert len(segments) == 2, segments  # one block per reader, each mapped by the loader
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        assert not [s for s in segments if os.path.exists(s)]
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        for leaked in segments:  # what the test found left behind, so that it does not fill /dev/shm
            if os.path.exists(leaked):
                os.unlink(leaked)


@pytest.mark.timeout(120)
def test_a_stopped_reader_process_is_reported_naming_it_and_the_step(train):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(train, 16, mesh, {"batch": "data"}, workers=2, prefetch=1, read_timeout_s=2) as loader:
        it = iter(loader)
        assert [next(it).step, next(it).step] == [0, 1]  # each reader has started
        (stopped,) = [p for p in reader_processes() if p.name == "tokenmix-reader-1-from-step-0"]  # steps 1, 3, 5, ...
        os.kill(stopped.pid, signal.SIGSTOP)
        began = time.monotonic()
        delivered = []
        try:
            with pytest.raises(LoaderError) as caught:
                for sb in it:  # what the reader sent before it stopped comes first
                    delivered.append(sb.step)
            waited = time.monotonic() - began
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped.pid, signal.SIGCONT)
    error = caught.value
    assert error.step % 2 == 1 and delivered == list(range(2, error.step))
    assert re.search(rf"^step {error.step}: .*reader process tokenmix-reader-1-from-step-0 \(pid {stopped.pid}\) made no progress "
                     rf"for 2 s \(read_timeout_s\).*iter_from_step\({error.step}\)", str(error)), str(error)
    assert waited < 2 + 30  # read_timeout_s, and a generous bound for a busy machine
    assert not reader_processes()


@pytest.mark.timeout(120)
def test_a_slow_reader_that_runs_is_waited_for_past_read_timeout_s(train):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with DataLoader(SlowDataset(train, 2.5), 16, mesh, {"batch": "data"}, workers=1, prefetch=1, read_timeout_s=1) as loader:
        assert [sb.step for sb, _ in zip(loader, range(2))] == [0, 1]


@pytest.mark.timeout(120)
def test_a_reader_slow_to_start_is_waited_for_with_a_warning(config_path, tmp_path):
    script = tmp_path / "slow_start.py"
    script.write_text(textwrap.dedent(f"""
        import logging, time
        import draccus, jax, yaml
        from tokenmix import DataLoader, LMMixtureDatasetConfig
        if __name__ == "__mp_main__":  # a reader importing this script, as slowly as a heavy training script on a busy machine
            time.sleep(3)
        if __name__ == "__main__":
            logging.basicConfig(level=logging.WARNING)
            config = draccus.decode(LMMixtureDatasetConfig, yaml.safe_load(open({str(config_path)!r})))
            loader = DataLoader(config.train_set(64), 8, jax.make_mesh((1,), ("data",)), {{"batch": "data"}}, workers=1, read_timeout_s=1)
            with loader:
                print([sb.step for sb, _ in zip(loader, range(2))], flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100)
    assert done.stdout.strip() == "[0, 1]", done.stderr
    assert re.search(r"reader process tokenmix-reader-0-from-step-0 \(pid \d+\) has not started yet; "
                     r"step 0 has waited another 1 s \(read_timeout_s\) for it", done.stderr), done.stderr


@pytest.mark.timeout(120)
def test_closing_a_loader_whose_reader_is_stopped_does_not_hang(train):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    loader = DataLoader(train, 16, mesh, {"batch": "data"}, workers=1, prefetch=1)
    it = iter(loader)
    next(it)
    (reader,) = reader_processes()
    os.kill(reader.pid, signal.SIGSTOP)  # it holds a SIGTERM until it is continued
    began = time.monotonic()
    loader.close()
    assert time.monotonic() - began < 40 and not reader_processes()


def test_too_little_shared_memory_is_refused_at_once_naming_dev_shm(train, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    loader = DataLoader(train, 16, jax.make_mesh((8,), ("data",)), {"batch": "data"}, workers=2, prefetch=3)
    with pytest.raises(OSError, match=r"workers=2, prefetch=3\) needs \d+ MiB of shared memory per reader.*/dev/shm.*--shm-size"):
        iter(loader)
    assert not reader_processes()


def test_workers_need_prefetch_slots_and_a_dataset_that_pickles(train):
    mesh = jax.make_mesh((8,), ("data",))
    with pytest.raises(ValueError, match=r"workers read ahead into prefetch slots.*prefetch >= 1"):
        DataLoader(train, 16, mesh, {"batch": "data"}, workers=1, prefetch=0)
    for bad in (0, -1.0, float("nan"), "60", True):
        with pytest.raises(ValueError, match=r"read_timeout_s must be a number of seconds > 0 .*got " + re.escape(repr(bad))):
            DataLoader(train, 16, mesh, {"batch": "data"}, workers=1, read_timeout_s=bad)
    unpicklable = Wrapped(train)
    unpicklable.hook = lambda: None
    with pytest.raises(TypeError, match=r"workers=1.*pickling it.*does not pickle.*workers=0"):
        iter(DataLoader(unpicklable, 16, mesh, {"batch": "data"}, workers=1))


def test_batches_that_do_not_fit_the_mesh_are_refused_naming_step_size_and_axes(train, config_path):
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with pytest.raises(ValueError, match=r"batch_size \(the stage from step 5\): batch size 12 is not divisible by 8.*\('data', 'model'\)"):
        DataLoader(train, [(0, 16), (5, 12)], mesh, {"batch": ("data", "model")})
    with pytest.raises(ValueError, match=r"axis_mapping\['batch'\] names mesh axis 'dta', but the mesh's axes are \('data', 'model'\)"):
        DataLoader(train, 16, mesh, {"batch": "dta"})
    with pytest.raises(ValueError, match="mesh axis 'model' is used by both 'batch' and 'position'"):
        DataLoader(train, 16, mesh, {"batch": ("data", "model"), "position": "model"})
    odd = mixture_config(config_path).train_set(100)
    with pytest.raises(ValueError, match="seq_len 100 is not divisible by 8"):
        DataLoader(odd, 16, jax.make_mesh((8,), ("data",)), {"position": "data"})
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        DataLoader(train, 16, mesh, {"batch": "data"}, prefetch=-1)


def run_two_processes(config_path: Path, out_dir: Path, *args: str, timeout_s: float = 240) -> None:
    """Run tests/loader_worker.py as processes 0 and 1 of a two-process JAX job; both must exit 0 within ``timeout_s``."""
    port = free_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen([sys.executable, str(TESTS / "loader_worker.py"), str(i), str(port), str(config_path), str(out_dir), *args],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    outputs = []
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]


@pytest.mark.timeout(300)
def test_two_processes_read_only_their_rows_and_see_the_single_process_batches(train, config_path, tmp_path):
    run_two_processes(config_path, tmp_path)
    reports = [json.loads((tmp_path / f"report-{i}.json").read_text()) for i in range(2)]
    BATCH, STEPS = loader_worker.BATCH, loader_worker.STEPS
    expected = [train.get_batch(np.arange(s * BATCH, (s + 1) * BATCH)) for s in range(STEPS)]
    for case, (shape, names, mapping) in loader_worker.MESH_CASES.items():
        with DataLoader(train, BATCH, jax.make_mesh(shape, names), mapping, fingerprint=True) as single:
            single_fps = [sb.fingerprint for sb, _ in zip(single, range(STEPS))]
        assert single_fps == [batch_fingerprint(e) for e in expected]
        for i in range(2):
            assert reports[i][case]["fingerprints"] == single_fps, case
            gathered = np.load(tmp_path / f"{case}-{i}.npz")
            for field in FIELDS:
                assert np.array_equal(gathered[field], np.stack([getattr(e, field) for e in expected])), (case, field)
        for step in range(STEPS):
            rows = [np.array(reports[i][case]["reads"][step]) - step * BATCH for i in range(2)]
            if case == "batch_within_process":  # the batch is split inside each process: each reads every row, once
                assert all(np.array_equal(r, np.arange(BATCH)) for r in rows)
            else:  # each process reads only its half, once
                assert all(len(r) == BATCH // 2 and len(np.unique(r)) == len(r) for r in rows), case
                assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(BATCH)), case
    log = reports[0]["log"]
    assert reports[1]["log"] == log and len(log["stages"]) == 2  # both hosts appended the same stage and read the same batches
    whole = mixture_config(config_path).train_set(SEQ_LEN, weight_log=[(start, w) for start, w in log["stages"]])
    with DataLoader(whole, BATCH, jax.make_mesh((8,), ("data",)), {"batch": "data"}, fingerprint=True, prefetch=0) as single:
        assert log["fingerprints"] == [single.batch(step).fingerprint for step in range(len(log["fingerprints"]))]  # 2 hosts -> 1


@pytest.mark.timeout(300)
def test_a_step_that_fails_on_one_process_fails_on_every_process_instead_of_hanging_the_others(config_path, tmp_path):
    """Process 1's read of step 2 fails. With fingerprints on, process 0 would wait for process 1's row digests of step 2
    in the all-gather until the job was torn down (5 minutes, naming nothing); now both raise the step's LoaderError,
    process 1 with its cause and process 0 naming process 1, after the same steps."""
    run_two_processes(config_path, tmp_path, "fail", timeout_s=120)
    reports = [json.loads((tmp_path / f"fail-{i}.json").read_text()) for i in range(2)]
    failed = loader_worker.FAILED_STEP
    assert [r["steps"] for r in reports] == [list(range(failed))] * 2
    assert [r["error"]["step"] for r in reports] == [failed, failed]
    assert "simulated disk failure" in reports[1]["error"]["message"]
    assert re.match(rf"step {failed}: process 1 of 2 failed to load its rows", reports[0]["error"]["message"]), reports[0]
