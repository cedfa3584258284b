"""Building many sources in one run (issue 39): caches opened ahead and finished behind one stream of chunks, with
bounded threads, files and locks, the same bytes as builds of one cache at a time, and resumable after a kill."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import TOKENIZER, cache_bytes, library_threads, start_builders, write_jsonl

from tokenmix import BuildOptions, LMDatasetSourceConfig, LMMixtureDatasetConfig, build_caches
from tokenmix.cache.appending import BadInputError
from tokenmix.cache.build_run import OPEN_AHEAD
from tokenmix.cache.lock import LOCK_FILE, build_lock

DOCS_PER_SOURCE = 3


def _sources(tmp_path: Path, demo_docs: dict[str, list[dict[str, Any]]], count: int) -> dict[str, str]:
    """``count`` tiny sources cut from the demo corpus, one shard each (every fifth compressed: held to its end)."""
    docs = [d for source in sorted(demo_docs) for d in demo_docs[source]]
    directory = tmp_path / "inputs"
    directory.mkdir(exist_ok=True)
    out = {}
    for i in range(count):
        suffix = ".jsonl.zst" if i % 5 == 4 else ".jsonl"
        records = [docs[(i * DOCS_PER_SOURCE + j) % len(docs)] for j in range(DOCS_PER_SOURCE)]
        out[f"s{i:03d}"] = write_jsonl(directory / f"s{i:03d}{suffix}", records)
    return out


def _config(sources: dict[str, str], cache_dir: Path, **build: Any) -> LMMixtureDatasetConfig:
    """A mixture of the sources, each built as a cache of its own (these tests are of many caches in one run; packs of
    small sources: test_packs.py)."""
    return LMMixtureDatasetConfig(tokenizer=TOKENIZER, cache_dir=str(cache_dir),
                                  configs={name: LMDatasetSourceConfig(train_urls=[url]) for name, url in sources.items()},
                                  build=BuildOptions(**{"pack_below_bytes": 0, **build}))


class _Peaks:
    """Samples, while a build runs: this process's threads of tokenmix and the libraries under it (not a cluster's
    that an earlier test of the same worker left running); its open files under ``under`` (the inputs and caches of
    the test: what a handle kept per source would add to); its other descriptors but sockets, as a rise over the
    start (sockets are left out: such a cluster talks on its own); and the build locks held under ``cache_dir``."""

    def __init__(self, cache_dir: Path, under: Path):
        self.cache_dir = cache_dir
        self.under = str(under) + "/"
        self.threads = self.files = self.other_rise = self.locks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._other_at_start = self._descriptors()[1]

    def __enter__(self) -> _Peaks:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _descriptors(self) -> tuple[int, int]:
        """(open files under ``under``, other descriptors but sockets) of this process now."""
        files = other = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed since the listing
                continue
            if target.startswith(self.under):
                files += 1
            elif not target.startswith("socket:"):
                other += 1
        return files, other

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.threads = max(self.threads, library_threads())
            files, other = self._descriptors()
            self.files = max(self.files, files)
            self.other_rise = max(self.other_rise, other - self._other_at_start)
            self.locks = max(self.locks, len(list(self.cache_dir.glob(f"*/train/{LOCK_FILE}"))))
            time.sleep(0.002)


def test_two_hundred_sources_build_concurrently_with_bounded_threads_files_and_locks_into_the_bytes_of_one_at_a_time(
        tmp_path, demo_docs, caplog):
    sources = _sources(tmp_path, demo_docs, 200)
    few = dict(list(sources.items())[:OPEN_AHEAD + 20])  # enough to open as many caches at once as the run ever does
    with _Peaks(tmp_path / "few", tmp_path) as few_peaks:
        build_caches(_config(few, tmp_path / "few"), progress=False)
    caplog.set_level(logging.INFO, logger="tokenmix.cache.backend_choice")
    caplog.clear()  # the few sources' run logs its own choice where an earlier test left the logger at INFO
    with _Peaks(tmp_path / "many", tmp_path) as peaks:
        results = build_caches(_config(sources, tmp_path / "many"), progress=False)
    assert len(results) == 200 and all(r["documents"] == DOCS_PER_SOURCE for r in results.values())
    # the caches' fixed costs overlap: several held at once, never more than the run opens ahead
    assert 2 <= peaks.locks <= OPEN_AHEAD + 1, peaks.locks
    # threads do not grow with the number of sources (slack: tensorstore's pools grow with the work in flight)
    assert peaks.threads <= few_peaks.threads + 4, (peaks.threads, few_peaks.threads)
    # nor open files: a lock file and its directory for each cache held (open or finishing: OPEN_AHEAD + 1 at most),
    # the inputs being read and tensorstore's reads and writes in flight; 200 sources each keeping a handle would pass it
    bound = 2 * (OPEN_AHEAD + 1) + 24
    assert few_peaks.files <= bound and peaks.files <= bound, (few_peaks.files, peaks.files, bound)
    assert peaks.other_rise <= 8 and few_peaks.other_rise <= 8, (peaks.other_rise, few_peaks.other_rise)
    # one backend check for the run's one encoder spec, not one per cache
    assert len([r for r in caplog.records if "encoding with" in r.getMessage()]) == 1
    for name in list(sources)[::10]:
        alone = tmp_path / "alone" / name
        build_caches(_config({name: sources[name]}, alone), progress=False)
        assert cache_bytes(str(tmp_path / "many" / name)) == cache_bytes(str(alone / name)), name


def test_a_many_source_build_killed_with_caches_open_ahead_resumes_to_the_bytes_of_an_uninterrupted_build(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs, 60)
    build_caches(_config(sources, tmp_path / "reference"), progress=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "killed"),
                                    "configs": {name: {"train_urls": [url]} for name, url in sources.items()},
                                    "build": {"commit_interval_s": 0, "pack_below_bytes": 0}}))
    # the build stops at the cache held here: those before it finish, the next ones are opened and wait
    blocker = build_lock(str(tmp_path / "killed" / "s030" / "train"))
    blocker.acquire()
    builder = start_builders([path], None)[0]
    try:
        ledgers = _poll_until_open_ahead(tmp_path / "killed", builder)
    finally:
        builder.kill()  # SIGKILL; the fastokens backend encodes in the builder's own threads, so it has no workers
        builder.wait()
        blocker.release()
    assert ledgers["finished"] >= 1 and ledgers["unfinished"] >= 2, ledgers
    build_caches(_config(sources, tmp_path / "killed"), progress=False)
    for name in sources:
        assert cache_bytes(str(tmp_path / "killed" / name)) == cache_bytes(str(tmp_path / "reference" / name)), name


def _poll_until_open_ahead(cache_dir: Path, builder: Any, timeout: float = 60.0) -> dict[str, int]:
    """Wait until some caches are finished and several past the held one are open at once (their ledgers written,
    unfinished); returns those counts."""
    deadline = time.monotonic() + timeout
    while True:
        counts = {"finished": 0, "unfinished": 0}
        for ledger in cache_dir.glob("*/train/ledger.json"):
            try:
                counts["finished" if json.loads(ledger.read_text())["finished"] else "unfinished"] += 1
            except (OSError, ValueError):  # replaced while read
                pass
        if counts["finished"] >= 1 and counts["unfinished"] >= 2:
            return counts
        assert builder.poll() is None, builder.stdout.read()
        if time.monotonic() > deadline:
            return counts
        time.sleep(0.01)


def test_a_bad_record_stops_a_many_source_run_giving_back_every_lock_and_a_rerun_resumes_each_cache(tmp_path, demo_docs):
    sources = _sources(tmp_path, demo_docs, 60)
    bad = Path(sources["s020"])
    bad.write_bytes(bad.read_bytes() + b"{not json\n")
    with pytest.raises(BadInputError, match="s020.jsonl.*malformed_json"):
        build_caches(_config(sources, tmp_path / "cache"), progress=False)
    assert not list((tmp_path / "cache").glob(f"*/train/{LOCK_FILE}"))  # every cache opened ahead gave its lock back
    ledgers = {p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*/train/ledger.json")}
    assert all(ledgers[f"s{i:03d}"]["finished"] for i in range(20))
    ahead = [name for name, ledger in ledgers.items() if name > "s020"]
    assert ahead and all(not ledgers[name]["finished"] and ledgers[name]["rows"] == 0 for name in ahead), sorted(ledgers)
    build_caches(_config(sources, tmp_path / "cache", on_error="skip"), progress=False)
    build_caches(_config(sources, tmp_path / "reference", on_error="skip"), progress=False)
    for name in sources:
        assert cache_bytes(str(tmp_path / "cache" / name)) == cache_bytes(str(tmp_path / "reference" / name)), name


def test_the_fast_tokenizer_loads_while_the_first_cache_waits_for_its_lock(tmp_path, demo_docs):
    """``build_caches`` starts loading ``fastokens`` (the longest step before the first chunk is encoded) as soon as it
    knows the caches' tokenizers, not once a cache is opened: a build waiting for its only cache's lock is loading it."""
    from tokenmix.formats import backends

    sources = _sources(tmp_path, demo_docs, 1)
    backends.forget_loaded()
    blocker = build_lock(str(tmp_path / "cache" / "s000" / "train"))
    blocker.acquire()
    errors: list[BaseException] = []

    def build() -> None:
        try:
            build_caches(_config(sources, tmp_path / "cache"), progress=False)
        except BaseException as e:  # handed to the test
            errors.append(e)

    thread = threading.Thread(target=build)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not backends._loaded and time.monotonic() < deadline:
            time.sleep(0.01)
        loading = bool(backends._loaded)
    finally:
        blocker.release()
        thread.join(120)
    assert not thread.is_alive() and not errors, errors
    assert loading, "nothing was loading while the cache's lock was held"


def test_a_cold_build_loads_the_fast_tokenizer_beside_the_array_libraries_imports_and_still_checks_it(tmp_path, demo_docs):
    """``fastokens``' load (about 0.15 s, the GIL released) starts before the caches' array libraries are imported (the
    config read imports none), so the two overlap; the backend check still runs on the loaded tokenizer."""
    import subprocess
    import sys

    from tokenmix.formats.tokenizer_identity import tokenizer_info

    tokenizer_info(TOKENIZER)  # described on this machine (else transformers, which imports numpy, describes it)
    config = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"),
              "configs": {name: {"train_urls": [url]} for name, url in _sources(tmp_path, demo_docs, 2).items()}}
    code = ("import json, sys, tokenmix\n"
            "from tokenmix.formats import backends\n"
            "imported, preload = [], backends.preload_fast\n"
            "def preload_noting_imports(tokenizer_json):\n"
            "    imported.append(sorted(m for m in ('numpy', 'tensorstore') if m in sys.modules))\n"
            "    return preload(tokenizer_json)\n"
            "backends.preload_fast = preload_noting_imports\n"
            "stats = tokenmix.build_caches(tokenmix.load_data_config(json.loads(sys.argv[1])), progress=False)\n"
            "print(json.dumps({'at_first_load': imported[0], 'documents': sum(s['documents'] for s in stats.values()),\n"
            "                  'backends': [s['build']['tokenizer_backend'] for s in stats.values()]}))")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["at_first_load"] == []
    assert out["documents"] == 2 * DOCS_PER_SOURCE
    for backend in out["backends"]:
        assert backend["name"] == "fastokens" and "encode identically" in backend["reason"], backend


def test_a_build_of_local_inputs_without_bars_imports_neither_fsspec_nor_tqdm(tmp_path, demo_docs):
    """A cold build's start-up is mostly imports: one of local shards opens them without fsspec (whose import scans every
    installed package's entry points) and, without progress bars, never imports tqdm (which imports importlib.metadata
    too); 30-80 ms of the shared corpus's 1 s whole call."""
    import subprocess
    import sys

    from tokenmix.formats.tokenizer_identity import tokenizer_info

    tokenizer_info(TOKENIZER)  # described on this machine (else transformers, which imports tqdm, describes it)
    config = {"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / "cache"),
              "configs": {name: {"train_urls": [url]} for name, url in _sources(tmp_path, demo_docs, 2).items()}}
    code = ("import json, sys, tokenmix; stats = tokenmix.build_caches(tokenmix.load_data_config(json.loads(sys.argv[1])), "
            "progress=False); print(sum(s['documents'] for s in stats.values()), "
            "sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('fsspec', 'tqdm')}))")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().split(maxsplit=1) == [str(2 * DOCS_PER_SOURCE), "[]"], run.stdout


def test_two_processes_building_the_same_caches_listed_in_opposite_orders_both_finish(tmp_path, demo_docs):
    """Before, both waited for ever (2 tries of 3 with 24 sources): each run took the locks of the caches it opened
    ahead in its config's order, and a driver waiting for the next cache's lock held the caches whose chunks were still
    in its stream, unfinished (in one order too: 1 try of 1 with the orders alike but that)."""
    import subprocess

    sources = _sources(tmp_path, demo_docs, 32)
    build_caches(_config(sources, tmp_path / "reference"), progress=False)
    for attempt in range(3):
        configs = []
        for k, names in enumerate((list(sources), list(sources)[::-1])):
            configs.append(tmp_path / f"{attempt}-{k}.yaml")
            configs[-1].write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(tmp_path / f"try{attempt}"),
                                                   "configs": {name: {"train_urls": [sources[name]]} for name in names},
                                                   "build": {"pack_below_bytes": 0}}))
        procs = start_builders(configs, tmp_path / f"go{attempt}")
        try:
            outputs = [p.communicate(timeout=120)[0] for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
                p.wait()
            raise AssertionError(f"try {attempt}: the two builds were still waiting for each other's locks after 120 s") from None
        assert [p.returncode for p in procs] == [0, 0], outputs
        for name in sources:
            assert cache_bytes(str(tmp_path / f"try{attempt}" / name)) == cache_bytes(str(tmp_path / "reference" / name)), name
