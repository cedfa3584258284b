"""Helpers the tests share: the bundled tokenizer and corpus, shard writers, cache builds, wrapped shards
and datasets, and a cache that is still building.

Importing this module does not import JAX, so the multi-process loader worker can set its device count first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zstandard

from tokenmix import BuildOptions, Dataset, LmDatasetFormatBase, TextLmDatasetFormat, TokenBatch, TokenCache, TokenizationConfig
from tokenmix.cache import CacheBuilder
from tokenmix.cache.lock import CacheLockedError, LeaseBuildLock, LockLostError
from tokenmix.datasets import Pending
from tokenmix.sources import DEFAULT_CHUNK_BYTES, FileShard

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = str(REPO / "data" / "tokenizer")
DEMO_CORPUS = REPO / "data" / "demo"
SEQ_LEN = 128
# the chat template of the DPO configs in the wild (marin's lib/levanter/config, tests/data/levanter/wild)
DPO_TEMPLATE = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ message['content'] }}\n"
                "{% elif message['role'] == 'assistant' %}\n{% generation %}{{ message['content'] }}{% endgeneration %}\n"
                "{% endif %}\n{% endfor %}\n")


def read_jsonl_zst(path: Path) -> list[dict[str, Any]]:
    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True).read()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def write_lines(path: Path, lines: list[bytes]) -> str:
    """Write raw lines (bytes, newline added) to path, compressed by its suffix."""
    data = b"".join(line + b"\n" for line in lines)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return str(path)


def write_jsonl(path: Path, records: list[Any]) -> str:
    return write_lines(path, [json.dumps(r).encode() for r in records])


def demo_urls(source: str) -> list[str]:
    return [str(DEMO_CORPUS / source / f"train-0{i}-of-02.jsonl.zst") for i in range(2)]


def encoder_for(fmt: LmDatasetFormatBase | None = None, tokenizer: str = TOKENIZER, **kw: Any):
    return TokenizationConfig(tokenizer=tokenizer, **kw).encoder_spec(fmt or TextLmDatasetFormat(), "test")


def build(location: str, urls: list[str], fmt: LmDatasetFormatBase | None = None, tokenizer: str = TOKENIZER,
          tokenization: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    options.setdefault("num_workers", 0)
    spec, identity = encoder_for(fmt, tokenizer, **(tokenization or {}))
    builder = CacheBuilder(location, [FileShard(u) for u in urls], spec, identity, BuildOptions(**options), info={"tokenizer": tokenizer})
    return builder.build()


def cache_bytes(location: str) -> dict[str, bytes]:
    """Every file of a local cache; stats.json without its timing section."""
    out = {}
    for root, _, files in os.walk(location):
        for name in files:
            path = os.path.join(root, name)
            data = Path(path).read_bytes()
            if name == "stats.json":
                doc = json.loads(data)
                doc.pop("build")
                data = json.dumps(doc, sort_keys=True).encode()
            out[os.path.relpath(path, location)] = data
    return out


def with_format(config: Any, source: str, fmt: LmDatasetFormatBase | None = None, **changes: Any) -> Any:
    """A copy of a mixture config whose source has another format (or its format with ``changes``)."""
    old = config.configs[source]
    new = dataclasses.replace(old, format=fmt or dataclasses.replace(old.format, **changes))
    return dataclasses.replace(config, configs={**config.configs, source: new})


class DelegatingShard:
    """A real file shard seen through a wrapper; subclasses change how it is read."""

    def __init__(self, url: str):
        self._shard = FileShard(url)
        self.name = url

    @property
    def verified_at_end(self):
        return self._shard.verified_at_end

    def size_bytes(self):
        return self._shard.size_bytes()

    def identity(self):
        return self._shard.identity()

    def position_label(self, position):
        return self._shard.position_label(position)

    def read(self, start=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
        yield from self._shard.read(start, chunk_bytes)


class GatedShard(DelegatingShard):
    """A shard that holds back its records until ``gate`` is set (to catch a build mid-way)."""

    def __init__(self, url: str, gate: threading.Event):
        super().__init__(url)
        self._gate = gate

    def read(self, start=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
        self._gate.wait()
        yield from super().read(start, chunk_bytes)


def check_lease_lifecycle(location: str, lease_s: float, caplog: Any) -> None:
    """A build lease at ``location`` excludes others while renewed (past ``lease_s``), is taken over once its holder stalls,
    the stalled holder learns it lost at its next check, and a released lease is free at once."""
    first = LeaseBuildLock(location, timeout=0, lease_s=lease_s)
    first.acquire()
    time.sleep(1.5 * lease_s)  # longer than the lease: the renewals keep it
    with pytest.raises(CacheLockedError, match=f"pid {os.getpid()}"):
        LeaseBuildLock(location, timeout=0, lease_s=lease_s).acquire()
    first.check()
    first._stop.set()  # the holder stalls: no more renewals
    first._renewer.join()
    second = LeaseBuildLock(location, timeout=10 * lease_s, lease_s=lease_s)
    with caplog.at_level(logging.WARNING, logger="tokenmix.cache.lock"):
        second.acquire()
    assert "expired" in caplog.text
    with pytest.raises(LockLostError, match="took over this build's lease"):
        first.check()
    second.check()
    second.release()
    third = LeaseBuildLock(location, timeout=0, lease_s=lease_s)
    third.acquire()  # released: free at once
    third.release()


def wait_until(get: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``get()`` until it returns something true, and return that; fails naming ``what`` after ``timeout`` seconds
    (a fixed bound, generous for a busy machine: a test waits for a condition, never for a guessed time)."""
    deadline = time.monotonic() + timeout
    while not (got := get()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.01)
    return got


_NETWORK_EVENTS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.connect")
_network_attempts: list[str] | None = None
"""Where the audit hook writes while ``network_attempts`` records (None otherwise)."""


def _record_network_attempt(event: str, args: tuple) -> None:
    if _network_attempts is None or event not in _NETWORK_EVENTS:
        return
    address = args[1] if event == "socket.connect" else args[0]
    if event == "socket.connect" and not isinstance(address, tuple):
        return  # a Unix socket's path
    host = address[0] if isinstance(address, tuple) else address
    host = host.decode() if isinstance(host, bytes) else host
    if host is None or host == "localhost" or host.startswith("127.") or host == "::1":
        return  # this machine: another test's cluster or server may be talking on it
    _network_attempts.append(f"{event} {address!r}")


@contextlib.contextmanager
def network_attempts() -> Iterator[list[str]]:
    """The attempts of this process to reach a host other than this machine (name lookups and connects, from Python's
    audit events) while the block runs: what a test asserts is empty where nothing may go to the network, instead of
    timing it. The hook stays installed (audit hooks cannot be removed) and records nothing outside the block."""
    global _network_attempts
    if not getattr(network_attempts, "hooked", False):
        sys.addaudithook(_record_network_attempt)
        network_attempts.hooked = True  # type: ignore[attr-defined]
    _network_attempts = attempts = []
    try:
        yield attempts
    finally:
        _network_attempts = None


def library_threads() -> int:
    """This process's threads that tokenmix and the native libraries under it start: its own named Python threads,
    unnamed executors' workers, and threads Python did not start (tensorstore's pools, the fast tokenizer's). Not other
    Python threads: a cluster client that an earlier test of the same worker left behind starts and ends its own."""
    python = {t.native_id: t.name for t in threading.enumerate()}
    count = 0
    for task in os.listdir("/proc/self/task"):
        name = python.get(int(task))
        count += name is None or name.startswith(("tokenmix-", "ThreadPoolExecutor-"))
    return count


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux: reads ``/proc``)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class GrowingCache:
    """A cache building in a background thread whose shards from ``held_from`` on wait for ``release()``.

    Readers see the rows of the first ``held_from`` shards committed, and the build unfinished, until then.
    """

    def __init__(self, location: str, urls: list[str], held_from: int, **options: Any):
        spec, identity = encoder_for()
        self.location = location
        self._gate = threading.Event()
        shards = [GatedShard(u, self._gate) if i >= held_from else DelegatingShard(u) for i, u in enumerate(urls)]
        options = {"num_workers": 0, "commit_interval_s": 0.0, **options}
        self._builder = CacheBuilder(location, shards, spec, identity, BuildOptions(**options))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._build, daemon=True)
        self._thread.start()

    def _build(self) -> None:
        try:
            self._builder.build()
        except BaseException as e:  # handed to the test by finish()
            self._error = e

    def open(self, view: Callable[[TokenCache], Any] = lambda cache: cache, timeout: float = 60) -> Any:
        """``view(TokenCache(location))`` as soon as the cache exists."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return view(TokenCache(self.location))
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def release(self) -> None:
        """Let the held shards be read."""
        self._gate.set()

    def finish(self, timeout: float = 120) -> None:
        """Release the held shards and wait for the build to end; raises what the build raised."""
        self.release()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the build of {self.location} did not finish in {timeout} s"
        if self._error is not None:
            raise self._error


MIXTURE_YAML = f"""
tokenizer: {TOKENIZER}
cache_dir: CACHE
mixture_block_size: 64
seed: 3
train_weights: {{linux_doc: 0.5, python_doc: 0.3, webster: 0.2}}
configs:
  linux_doc:
    train_urls: ["{DEMO_CORPUS}/linux_doc/train-{{00..01}}-of-02.jsonl.zst"]
  python_doc:
    train_urls: ["{DEMO_CORPUS}/python_doc/train-*.jsonl.zst"]
  webster:
    train_urls: ["{DEMO_CORPUS}/webster/train-{{00..01}}-of-02.jsonl.zst"]
build: {{num_workers: 0}}
"""


def mixture_yaml(cache_dir: str | Path) -> str:
    """The test mixture (three real sources of the bundled corpus slice) with its caches under ``cache_dir``."""
    return MIXTURE_YAML.replace("CACHE", str(cache_dir))


def write_train_config(directory: Path, run: str, trainer: dict[str, Any], model: dict[str, Any], caches: Path | None = None,
                       config_name: str | None = None, **data: Any) -> str:
    """A training config on the bundled demo mixture (config/demo.yaml, its caches in ``caches``, by default
    ``directory/caches``; ``data`` updates its fields), the run in ``directory/<run>``: written to
    ``directory/<config_name or run>.yaml``, whose path is returned."""
    doc = {
        "data": {**yaml.safe_load((REPO / "config" / "demo.yaml").read_text()), "cache_dir": str(caches or directory / "caches"), **data},
        "trainer": {**trainer, "checkpoint_dir": str(directory / run)},
        "model": model,
    }
    for source in doc["data"]["configs"].values():
        for key in ("train_urls", "validation_urls"):
            source[key] = [str(REPO / url) for url in source[key]]
    path = directory / f"{config_name or run}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


class Wrapped(Dataset):
    """A dataset that passes everything to ``base`` (and a mixture's ``names`` / ``locate``)."""

    def __init__(self, base: Dataset):
        self.base = base
        self.tokens_per_example = base.tokens_per_example

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r})"

    @property
    def names(self) -> list[str]:
        return self.base.names  # type: ignore[attr-defined]

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.base.locate(indices)  # type: ignore[attr-defined]

    def is_finite(self) -> bool:
        return self.base.is_finite()

    def current_len(self) -> int:
        return self.base.current_len()

    def final_len(self) -> int | None:
        return self.base.final_len()

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        return self.base.read(indices)


class CountingDataset(Wrapped):
    """Records the indices of every ``read`` call."""

    def __init__(self, base: Dataset):
        super().__init__(base)
        self.reads: list[np.ndarray] = []
        self._lock = threading.Lock()

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        with self._lock:
            self.reads.append(np.asarray(indices, np.int64).copy())
        return self.base.read(indices)


class FailingDataset(Wrapped):
    """Reads fail for examples in ``[lo, hi)``."""

    def __init__(self, base, lo: int, hi: int):
        super().__init__(base)
        self.lo, self.hi = lo, hi

    def read(self, indices) -> Pending[TokenBatch]:
        idx = np.asarray(indices)
        if np.any((idx >= self.lo) & (idx < self.hi)):
            raise OSError("simulated disk failure")
        return self.base.read(indices)


class Uint32TokensDataset(Wrapped):
    """Gives its base's batches with uint32 tokens (a dataset over a uint32 token file could), ``big`` added to each."""

    def __init__(self, base: Dataset, big: int = 0):
        super().__init__(base)
        self.big = big

    def read(self, indices) -> Pending[TokenBatch]:
        pending = self.base.read(indices)
        return Pending(lambda: dataclasses.replace(batch := pending.result(), tokens=batch.tokens.astype(np.uint32) + np.uint32(self.big)))


class SlowDataset(Wrapped):
    """Every read takes ``seconds`` longer (a slow disk or network), before it starts. With ``marks`` (a directory), each
    read first leaves a file there named ``<pid>-<CLOCK_MONOTONIC ns>``: which process started a read, and when."""

    def __init__(self, base, seconds: float, marks: Path | None = None):
        super().__init__(base)
        self.seconds = seconds
        self.marks = marks

    def read(self, indices) -> Pending[TokenBatch]:
        if self.marks is not None:
            (self.marks / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(self.seconds)
        return self.base.read(indices)


BUILD_WORKER = Path(__file__).parent / "build_worker.py"


def start_builders(configs: Sequence[Path], go: Path | None, *overrides: str) -> list[subprocess.Popen]:
    """Builder processes (``build_worker.py``), one per config, their output on ``stdout``. With ``go``, they start
    building together: once every one has loaded its config and tokenizer, ``go`` is created."""
    procs = [subprocess.Popen([sys.executable, str(BUILD_WORKER), str(config), str(go or "-"), *overrides],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for config in configs]
    if go is not None:
        try:
            for proc in procs:
                assert proc.stdout is not None
                said = proc.stdout.readline()
                assert said == "ready\n", said + proc.stdout.read()
        except BaseException:  # the others would wait for ``go`` for ever, after the test too
            for proc in procs:
                proc.kill()
                proc.wait()
            raise
        go.touch()
    return procs


class ReadLogDataset(Wrapped):
    """A mixture that appends the first index of every ``read`` to the file ``log`` (one line each), from whichever
    process reads it (a loader's reader processes included), and takes appended weight stages."""

    def __init__(self, base: Dataset, log: Path):
        super().__init__(base)
        self.log = log

    def append_stage(self, start: int, weights: dict[str, float]) -> None:
        self.base.append_stage(start, weights)  # type: ignore[attr-defined]

    def read(self, indices: Sequence[int] | np.ndarray) -> Pending[TokenBatch]:
        with open(self.log, "a") as f:
            f.write(f"{int(np.min(indices))}\n")
        return self.base.read(indices)

    def first_indices_read(self) -> list[int]:
        return [int(line) for line in self.log.read_text().split()] if self.log.exists() else []
