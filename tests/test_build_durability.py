"""What a build makes durable, and when (docs/design/cache.md, "Commit protocol"): each step of a commit is on stable
storage before the next can be seen, by barriers (``syncfs``) shared between the caches that reach them together
instead of fsyncs of every object; and a many-source build SIGKILLed at each of those barriers leaves no published
rows without their data and resumes to the bytes of an uninterrupted build.

Both watch a real builder process through ``strace`` (its system calls, and a SIGKILL it delivers at a chosen barrier),
so they are skipped where ``strace`` cannot trace (not installed, or ptrace forbidden). What a power loss can leave
of writes made after the last barrier, files renamed into place whose bytes never reached the disk (empty), is made by
hand, and a re-run must end with the bytes of an uninterrupted build.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import BUILD_WORKER, REPO, TOKENIZER, cache_bytes, write_jsonl

from tokenmix import LMDatasetSourceConfig, LMMixtureDatasetConfig, build_caches
from tokenmix.cache.durability import BARRIERS_ENV, SYNCFS_AVAILABLE, barriers_hold
from tokenmix.cache.scrub import scrub

SOURCES = 12
DOCS_PER_SOURCE = 3
BARRIERS_PER_CACHE = 3
"""Barriers a small cache built in one commit asks for: the commit's two (data, then ledger) and the one before its
statistics. Shared between caches, the run makes at most this many per cache."""


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    done = subprocess.run(["strace", "-f", "-o", "/dev/null", sys.executable, "-c", "pass"], capture_output=True)
    return done.returncode == 0


_traced = pytest.mark.skipif(not SYNCFS_AVAILABLE or not _strace_works(),
                             reason="no syncfs (each write is fsynced on its own), or strace cannot trace processes here")


@pytest.fixture
def barriers(monkeypatch):
    """Builds make their writes durable by barriers, whatever this machine's filesystem (``barriers_hold``): the
    protocol under test."""
    monkeypatch.setenv(BARRIERS_ENV, "1")


def _sources(tmp_path: Path, demo_docs: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Small sources cut from the demo corpus, one shard each (every third compressed: held to its end)."""
    docs = [d for source in sorted(demo_docs) for d in demo_docs[source]]
    (tmp_path / "inputs").mkdir()
    return {f"s{i:03d}": write_jsonl(tmp_path / "inputs" / f"s{i:03d}{'.jsonl.zst' if i % 3 == 2 else '.jsonl'}",
                                     [docs[(i * DOCS_PER_SOURCE + j) % len(docs)] for j in range(DOCS_PER_SOURCE)])
            for i in range(SOURCES)}


def _config_file(tmp_path: Path, sources: dict[str, str], cache_dir: Path, **build: Any) -> Path:
    path = tmp_path / f"{cache_dir.name}.yaml"
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(cache_dir),
                                    "configs": {name: {"train_urls": [url]} for name, url in sources.items()},
                                    "build": {"num_workers": 1, **build}}))
    return path


def _reference(tmp_path: Path, sources: dict[str, str]) -> Path:
    cache_dir = tmp_path / "reference"
    build_caches(LMMixtureDatasetConfig(tokenizer=TOKENIZER, cache_dir=str(cache_dir),
                                        configs={n: LMDatasetSourceConfig(train_urls=[u]) for n, u in sources.items()}),
                 progress=False)
    return cache_dir


def _traced_build(config: Path, *strace_options: str) -> subprocess.CompletedProcess:
    return subprocess.run(["strace", "-f", "-qq", *strace_options, sys.executable, str(BUILD_WORKER), str(config), "-"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


_CALL = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
_PATH = re.compile(r'"([^"]*)"')
_FD_PATH = re.compile(r"^\d+<([^>]*)>")


def _events(trace: str, cache_dir: Path) -> list[tuple[str, str, str]]:
    """The trace's events in order: ("renamed", cache, key) when a rename into a cache completed, ("unlinked", cache,
    key) when an unlink began, ("sync started" | "sync done", "", "") for each syncfs, ("fsync", cache, key) for an fsync
    of a file or directory of a cache."""
    prefix = str(cache_dir) + "/"
    pending: dict[str, str] = {}  # a thread's rename between its start and its end: the target path
    events = []

    def inside(path: str) -> tuple[str, str] | None:
        if not path.startswith(prefix):
            return None
        parts = path[len(prefix):].split("/")
        return "/".join(parts[:2]), "/".join(parts[2:])

    for line in trace.splitlines():
        match = _CALL.match(line)
        if match is None:
            continue
        pid, resumed, call, rest = match.groups()
        name = resumed or call
        finished = "<unfinished ...>" not in rest
        if name in ("rename", "renameat", "renameat2"):
            if not resumed:
                pending[pid] = _PATH.findall(rest)[-1]
            if finished and rest.rstrip().endswith("= 0"):
                where = inside(pending.pop(pid))
                if where is not None:
                    events.append(("renamed", *where))
        elif name == "syncfs":
            if not resumed:
                events.append(("sync started", "", ""))
            if finished:
                events.append(("sync done", "", ""))
        elif name in ("fsync", "fdatasync") and not resumed:
            fd = _FD_PATH.match(rest)
            where = inside(fd.group(1)) if fd else None
            if where is not None:
                events.append(("fsync", *where))
        elif name in ("unlink", "unlinkat") and not resumed:
            where = inside(_PATH.findall(rest)[0]) if _PATH.findall(rest) else None
            if where is not None:
                events.append(("unlinked", *where))
    return events


def _is_array_object(key: str) -> bool:
    return key.startswith(("input_ids/", "loss_spans/"))


@_traced
def test_each_commit_step_is_durable_before_the_next_through_barriers_the_caches_share(tmp_path, demo_docs, barriers):
    sources = _sources(tmp_path, demo_docs)
    cache_dir = tmp_path / "cache"
    trace = tmp_path / "trace.txt"
    config = _config_file(tmp_path, sources, cache_dir, commit_interval_s=3600)  # one commit a cache however slow the machine
    done = _traced_build(config, "-y", "-o", str(trace),
                         "-e", "trace=rename,renameat,renameat2,syncfs,fsync,fdatasync,unlink,unlinkat")
    assert done.returncode == 0, done.stdout + done.stderr
    events = _events(trace.read_text(), cache_dir)
    renamed: dict[str, dict[str, int]] = defaultdict(dict)  # cache -> key -> number of its last rename
    durable = 0  # renames up to this number are durable
    syncs_started: list[int] = []  # for each sync begun and not done: the renames completed when it began
    count, syncs = 0, 0
    violations = []
    last_publication: dict[str, bool] = {}  # cache -> whether its ledger was durable at its last row-ends write

    def check(cache: str, step: str, needs: list[str]) -> None:
        late = [key for key in needs if renamed[cache][key] > durable]
        if late:
            violations.append(f"{cache}: {step} while {late} may not be durable")

    for event, cache, key in events:
        if event == "sync started":
            syncs_started.append(count)
            syncs += 1
        elif event == "sync done":
            durable = max(durable, syncs_started.pop(0))
        elif event == "fsync":
            violations.append(f"{cache}: {key} fsynced on its own")
        elif event == "renamed":
            # a commit's ledger: the rows it counts, their tokens and ends, durable first (the opening's, the first one,
            # counts only rows committed before; a power loss leaves of it and of new arrays empty files, removed next run)
            if key == "ledger.json" and key in renamed[cache]:
                check(cache, "ledger written", [k for k in renamed[cache] if _is_array_object(k)])
            elif key.startswith("input_ids/offsets/c/"):  # the last one of a cache is its final publication
                last_publication[cache] = renamed[cache].get("ledger.json", 0) <= durable
            elif key == "open.bin":  # what readers open a finished cache from: the rows and ledger it describes
                check(cache, "open.bin written", [k for k in renamed[cache] if k == "ledger.json" or "/data/" in k])
            elif key == "stats.json":  # "finished, nothing to build": everything before it, the open object included
                check(cache, "stats.json written", [k for k in renamed[cache] if k != "stats.json"])
            count += 1
            renamed[cache][key] = count
    violations += [f"{cache}: published ahead of a durable ledger" for cache, ok in last_publication.items() if not ok]
    assert not violations, violations[:10]
    assert len(renamed) == SOURCES and all("stats.json" in keys for keys in renamed.values()), sorted(renamed)
    assert 1 <= syncs <= BARRIERS_PER_CACHE * SOURCES, syncs
    reference = _reference(tmp_path, sources)
    for name in sources:
        assert cache_bytes(str(cache_dir / name)) == cache_bytes(str(reference / name)), name


@_traced
@pytest.mark.slow
def test_a_many_source_build_killed_at_each_barrier_publishes_no_row_without_its_data_and_resumes_to_the_same_bytes(
        tmp_path, demo_docs, barriers):
    sources = _sources(tmp_path, demo_docs)
    reference = _reference(tmp_path, sources)
    cache_dir = tmp_path / "cache"
    config = _config_file(tmp_path, sources, cache_dir, commit_interval_s=0)  # a commit after every chunk: more barriers
    kills = 0
    for barrier in (1, 2, 3, 4, 5, 6, 8, 11):
        # the process is SIGKILLed as one of its threads enters its barrier-th syncfs: between two commit steps
        done = _traced_build(config, "-o", "/dev/null", "-e", "trace=syncfs",
                             "-e", f"inject=syncfs:signal=SIGKILL:when={barrier}")
        if done.returncode == 0:  # the rest of the build needed fewer barriers than that
            continue
        assert "built" not in done.stdout, done.stdout
        kills += 1
        for ledger_file in cache_dir.glob("*/train/ledger.json"):
            location = str(ledger_file.parent)
            ledger = json.loads(ledger_file.read_text())
            report = scrub(location, inputs=False, progress=False)
            assert report.ok, (barrier, location, report.to_json())
            assert report.rows <= ledger["rows"], (barrier, location)
    # the driver alone asks for 2 barriers a commit one after another, each served by a syncfs begun after it asked:
    # 24 or more syncfs over at most 9 threads, so some thread makes 3 at least
    assert kills >= 3, kills
    build_caches(LMMixtureDatasetConfig(tokenizer=TOKENIZER, cache_dir=str(cache_dir),
                                        configs={n: LMDatasetSourceConfig(train_urls=[u]) for n, u in sources.items()}),
                 progress=False)
    for name in sources:
        assert cache_bytes(str(cache_dir / name)) == cache_bytes(str(reference / name)), name


def test_the_empty_files_a_power_loss_leaves_after_the_last_barrier_are_rebuilt_to_the_same_bytes(tmp_path, demo_docs, barriers):
    sources = _sources(tmp_path, demo_docs)
    reference = _reference(tmp_path, sources)
    cache_dir = tmp_path / "cache"
    config = LMMixtureDatasetConfig(tokenizer=TOKENIZER, cache_dir=str(cache_dir),
                                    configs={n: LMDatasetSourceConfig(train_urls=[u]) for n, u in sources.items()})
    build_caches(config, progress=False)
    # s001 lost power as it finished: its open object and statistics were renamed into place, their bytes not written
    for name in ("open.bin", "stats.json"):
        (cache_dir / "s001" / "train" / name).write_bytes(b"")
    # s002 lost power before its first commit's barrier: every file it wrote may be empty, its first ledger included
    for path in (cache_dir / "s002").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")
    results = build_caches(config, progress=False)
    assert not results[("s001", "train")].get("already_built") and not results[("s002", "train")].get("already_built")
    for name in sources:
        assert cache_bytes(str(cache_dir / name)) == cache_bytes(str(reference / name)), name


@_traced
def test_where_the_filesystem_may_not_keep_a_replaced_file_whole_each_write_keeps_its_own_fsyncs(tmp_path, demo_docs, monkeypatch):
    """Barriers are as safe as per-object fsyncs only where a file replaced by a rename comes back whole after a power
    loss (``barriers_hold``: btrfs, ext4 with its journal running); elsewhere, or with ``$TOKENMIX_BUILD_BARRIERS`` 0, a
    build fsyncs each object it writes and calls no barrier. A tmpfs is not known to keep them: no barriers there."""
    monkeypatch.setenv(BARRIERS_ENV, "0")
    sources = _sources(tmp_path, demo_docs)
    cache_dir = tmp_path / "cache"
    trace = tmp_path / "trace.txt"
    done = _traced_build(_config_file(tmp_path, sources, cache_dir), "-y", "-o", str(trace), "-e", "trace=syncfs,fsync,fdatasync")
    assert done.returncode == 0, done.stdout + done.stderr
    events = _events(trace.read_text(), cache_dir)
    assert not [e for e in events if e[0].startswith("sync")]
    fsynced = {cache for event, cache, _ in events if event == "fsync"}
    assert fsynced == {f"{name}/train" for name in sources}, sorted(fsynced)
    monkeypatch.delenv(BARRIERS_ENV)
    if os.path.isdir("/dev/shm") and os.statvfs("/dev/shm").f_blocks:
        assert not barriers_hold("/dev/shm/not/made/yet")
