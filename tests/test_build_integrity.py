"""A cache that cannot be corrupted: one builder at a time (racing processes, killed holders, leases), inputs that
change under a cache, shards that come back, storage that refuses writes. Real processes, real files."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import BUILD_WORKER, REPO, TOKENIZER, build, cache_bytes, check_lease_lifecycle, demo_urls, read_jsonl_zst, start_builders, write_jsonl

import tokenmix
from tokenmix.cache import store
from tokenmix.cache.lock import LOCK_FILE, CacheLockedError, build_lock

SHARDS = demo_urls("webster") + demo_urls("linux_doc") + demo_urls("python_doc")
RACE_TRIES = int(os.environ.get("TOKENMIX_RACE_TRIES", "3"))
"""Races per shard-order case; CI runs 3, a stress run more (``TOKENMIX_RACE_TRIES=20``)."""
SLOW = {"num_workers": 0, "commit_interval_s": 0.0, "chunk_bytes": 1 << 14}
"""Many small commits: a build of SHARDS takes a few seconds, long enough to race it, read it and kill it."""


def write_config(path: Path, cache_dir: Path, urls: list[str]) -> Path:
    doc = {"tokenizer": TOKENIZER, "cache_dir": str(cache_dir), "configs": {"web": {"train_urls": urls}},
           "build": SLOW}
    path.write_text(yaml.safe_dump(doc))
    return path


def content_of(location: Path) -> dict[str, bytes]:
    """``cache_bytes`` without the inputs' recorded identities (a file restored by hand has a new mtime)."""
    files = cache_bytes(str(location))
    ledger = json.loads(files["ledger.json"])
    for shard in ledger["shards"]:
        shard.pop("source")
    return {**files, "ledger.json": json.dumps(ledger, sort_keys=True).encode()}


def build_all(config: Path) -> None:
    tokenmix.build_caches(tokenmix.load_data_config(config), progress=False)


class RowWatcher:
    """Polls a cache's published row count from another thread while builders run; keeps every value seen."""

    def __init__(self, location: Path):
        self.location = location
        self.seen: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        cache = None
        while not self._stop.is_set():
            try:
                cache = cache or tokenmix.TokenCache(str(self.location))
                self.seen.append(cache.num_rows())
            except FileNotFoundError:
                pass
            time.sleep(0.002)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.seen


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Single uninterrupted builds of SHARDS in listed and in reversed order: what every race must end with."""
    root = tmp_path_factory.mktemp("reference")
    out = {}
    for order, urls in (("listed", SHARDS), ("reversed", SHARDS[::-1])):
        build_all(write_config(root / f"{order}.yaml", root / order, urls))
        out[order] = cache_bytes(str(root / order / "web" / "train"))
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("orders", [("listed", "listed"), ("listed", "reversed")])
def test_builders_racing_on_one_cache_end_with_a_single_builds_bytes(tmp_path, reference, orders):
    """Two processes start building the same cache at the same instant, many times: one builds, the other waits for it
    (then finds the cache built, or refuses a shard list that differs); a reader never sees the row count go down."""
    waited = 0
    for attempt in range(RACE_TRIES):
        cache_dir = tmp_path / f"try{attempt}"
        configs = [write_config(tmp_path / f"{attempt}-{i}.yaml", cache_dir, SHARDS if order == "listed" else SHARDS[::-1])
                   for i, order in enumerate(orders)]
        watcher = RowWatcher(cache_dir / "web" / "train")
        procs = start_builders(configs, tmp_path / f"go{attempt}")
        outputs = [p.communicate(timeout=240)[0] for p in procs]
        seen = watcher.stop()
        assert seen == sorted(seen) and seen, "the published row count went down (or was never read)"
        codes = [p.returncode for p in procs]
        waited += sum("waiting for the build lock" in out for out in outputs)
        built = cache_bytes(str(cache_dir / "web" / "train"))
        if orders[0] == orders[1]:
            assert codes == [0, 0], outputs
            assert built == reference[orders[0]]
        else:
            assert sorted(codes) == [0, 1], outputs
            winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
            assert "ShardListMismatchError" in outputs[loser] and "can only be appended" in outputs[loser]
            assert built == reference[orders[winner]]
        assert not (cache_dir / "web" / "train" / LOCK_FILE).exists()
    assert waited >= min(2, RACE_TRIES), "the builders never overlapped: the race was not tested"


def test_a_build_lock_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    """Before, the lock was opened through a link planted at its name, and the link's target truncated and overwritten."""
    location = tmp_path / "c"
    location.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("not yours")
    (location / LOCK_FILE).symlink_to(target)
    with pytest.raises(tokenmix.UnsafeFileError, match=rf"{location / LOCK_FILE}: the build lock is a symbolic link \(to {target}\)"):
        build(str(location), SHARDS[:1])
    assert target.read_text() == "not yours" and (location / LOCK_FILE).is_symlink()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["delete", "replace"])
def test_deleting_or_replacing_the_build_lock_lets_no_second_builder_in(tmp_path, reference, how):
    """The lock file of a running build is deleted (or replaced by another file), and a second builder starts: it waits,
    since the running build still holds the cache directory's lock; the running build finds its lock file gone at its
    next commit and stops; the second then resumes. The published row count never goes down and the cache ends with
    an uninterrupted build's bytes. Before, the second builder ran beside the first."""
    cache_dir = tmp_path / "c"
    config = write_config(tmp_path / "c.yaml", cache_dir, SHARDS)
    location = cache_dir / "web" / "train"
    watcher = RowWatcher(location)
    [first] = start_builders([config], None)
    deadline = time.monotonic() + 120
    while not (watcher.seen and watcher.seen[-1] > 0):
        assert time.monotonic() < deadline and first.poll() is None, "the first build never published a row"
        time.sleep(0.005)
    if how == "delete":
        (location / LOCK_FILE).unlink()
    else:
        (location / "stranger").write_text("{}")
        os.replace(location / "stranger", location / LOCK_FILE)
    [second] = start_builders([config], None)
    out_first, out_second = first.communicate(timeout=240)[0], second.communicate(timeout=240)[0]
    seen = watcher.stop()
    assert first.returncode == 1 and "LockLostError" in out_first and "was deleted or replaced while this build held it" in out_first, out_first
    assert second.returncode == 0, out_second
    assert seen == sorted(seen), "the published row count went down"
    assert cache_bytes(str(location)) == reference["listed"]
    assert not (location / LOCK_FILE).exists()


def test_a_second_builder_refuses_at_once_naming_the_holder(tmp_path):
    location = str(tmp_path / "c")
    with build_lock(location):
        started = time.monotonic()
        with pytest.raises(CacheLockedError) as info:
            build(location, SHARDS[:1], lock_timeout_s=0)
        assert time.monotonic() - started < 60  # the lock is held until the test lets it go: waiting would not end
        assert f"pid {os.getpid()} on {os.uname().nodename}, building since" in str(info.value)
        assert "build.lock_timeout_s" in str(info.value)
        with pytest.raises(CacheLockedError, match="after waiting 0.5 s"):
            build(location, SHARDS[:1], lock_timeout_s=0.5)
    assert build(location, SHARDS[:1], lock_timeout_s=0)["documents"] > 0


def _mid_shard(ledger: dict) -> bool:
    """Whether a ledger holds part of a shard (only uncompressed shards are committed before their end)."""
    return any(0 < s["position"] for s in ledger["shards"] if not s["finished"])


def _kill_mid_build(config: Path, location: Path, *overrides: str, when=_mid_shard) -> dict:
    """Start a builder, SIGKILL it once it has committed some rows but not all (and ``when`` holds of its ledger), and
    return its ledger."""
    [proc] = start_builders([config], None, *overrides)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ledger = json.loads((location / "ledger.json").read_text())
        except (FileNotFoundError, ValueError):
            ledger = None
        if ledger and ledger["rows"] > 0 and when(ledger):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return json.loads((location / "ledger.json").read_text())
        assert proc.poll() is None, "the build ended before it could be killed: " + proc.stdout.read()
        time.sleep(0.005)
    raise AssertionError("the build committed nothing in two minutes")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lock", ["auto", "lease"])
def test_a_killed_builders_lock_is_taken_over_and_the_build_completes(tmp_path, reference, lock, caplog):
    config = write_config(tmp_path / "c.yaml", tmp_path / "cache", SHARDS)
    location = tmp_path / "cache" / "web" / "train"
    overrides = ("--build.lock", lock, "--build.lock_lease_s", "1.5")
    _kill_mid_build(config, location, *overrides, when=lambda ledger: True)  # compressed shards: between two of them
    assert (location / LOCK_FILE).exists(), "a SIGKILLed builder leaves its lock behind"
    started = time.time()  # the clock of the log records' times
    with caplog.at_level(logging.WARNING, logger="tokenmix.cache.lock"):
        tokenmix.build_caches(tokenmix.load_data_config(config, list(overrides)), progress=False)
    [took_over] = [r for r in caplog.records if "taking it over" in r.getMessage()]
    assert ("left behind" if lock == "auto" else "expired") in took_over.getMessage()
    # at once, or once the 1.5 s lease has run out (the bound is for a busy machine), not after the build lock's timeout
    assert took_over.created - started < 1.5 + 30
    assert cache_bytes(str(location)) == reference["listed"]


def test_a_lease_excludes_others_while_renewed_and_its_stalled_holder_learns_it_lost(caplog):
    # renewed every lease_s / 4: a holder that a busy machine holds up for 1.5 s is still in time
    check_lease_lifecycle(f"memory://lease-{time.time_ns()}/c", 2.0, caplog)


def _real_records(n: int) -> list[dict]:
    records = [r for url in SHARDS for r in read_jsonl_zst(Path(url))]
    assert len(records) >= n
    return records[:n]


@pytest.mark.parametrize("when", ["finished", "killed"])
def test_a_shard_changed_under_its_cache_is_named_and_refused(tmp_path, when):
    records = _real_records(120)
    urls = [write_jsonl(tmp_path / "a.jsonl", records[:60]), write_jsonl(tmp_path / "b.jsonl", records[60:])]
    location = tmp_path / "cache" / "web" / "train"
    config = write_config(tmp_path / "c.yaml", tmp_path / "cache", urls)
    if when == "finished":
        build_all(config)
    else:
        ledger = _kill_mid_build(config, location)
        assert any(0 < s["position"] for s in ledger["shards"])
    changed = urls[0] if when == "finished" or ledger["shards"][0]["position"] < 60 else urls[1]
    first = records[0] if changed == urls[0] else records[60]
    original = Path(changed).read_bytes()
    rewritten = [{**first, "text": first["text"] + " (edited)"}] + (records[1:60] if changed == urls[0] else records[61:])
    write_jsonl(Path(changed), rewritten)
    with pytest.raises(tokenmix.ShardChangedError) as info:
        build_all(config)
    message = str(info.value)
    assert message.startswith(f"{changed} changed since the cache at {location}") and "size" in message
    assert "Restore the original file, or delete the cache" in message
    Path(changed).write_bytes(original)  # restored: the build goes on
    build_all(config)
    build_all(write_config(tmp_path / "fresh.yaml", tmp_path / "fresh", urls))
    assert content_of(location) == content_of(tmp_path / "fresh" / "web" / "train")


def test_a_shard_rewritten_with_the_same_records_is_not_a_change(tmp_path, caplog):
    records = _real_records(40)
    url = write_jsonl(tmp_path / "a.jsonl", records)
    location = str(tmp_path / "cache")
    first = build(location, [url])
    mtime_ns = Path(url).stat().st_mtime_ns
    write_jsonl(Path(url), records)  # the same content, and a new mtime (the clock may not have ticked since)
    os.utime(url, ns=(mtime_ns + 10**9, mtime_ns + 10**9))
    with caplog.at_level(logging.INFO, logger="tokenmix.cache"):
        again = build(location, [url])
    assert again == {**first, "already_built": True}
    assert "are the same; going on" in caplog.text and "resuming" not in caplog.text


def test_fixing_a_bad_record_resumes_but_editing_what_was_read_does_not(tmp_path):
    records = _real_records(200)
    lines = [json.dumps(r).encode() for r in records]
    lines[150] = b'{"text": '
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    location = str(tmp_path / "cache")
    with pytest.raises(tokenmix.BadInputError, match="line 151: malformed_json"):
        build(location, [str(path)], chunk_bytes=1 << 12)
    stopped = json.loads((tmp_path / "cache" / "ledger.json").read_text())["shards"][0]["position"]
    assert 0 < stopped <= 150
    edited = list(records)
    edited[0] = {**records[0], "text": "an edit above the stop"}
    write_jsonl(path, edited)
    with pytest.raises(tokenmix.ShardChangedError, match="records it read are not the same"):
        build(location, [str(path)], chunk_bytes=1 << 12)
    write_jsonl(path, records)  # the bad record fixed, nothing else touched
    stats = build(location, [str(path)], chunk_bytes=1 << 12)
    assert stats["build"]["resumed_at_row"] > 0 and stats["documents"] == 200


def test_a_missing_shard_is_tried_again_and_its_rows_follow(tmp_path, caplog):
    records = _real_records(90)
    a = write_jsonl(tmp_path / "a.jsonl", records[:30])
    b = str(tmp_path / "b.jsonl")  # not there yet
    c = write_jsonl(tmp_path / "c.jsonl", records[60:])
    location = str(tmp_path / "cache")
    first = build(location, [a, b, c], on_error="skip")
    assert first["documents"] == 60 and first["skipped_by_reason"] == {"missing_file": 1}
    write_jsonl(Path(b), records[30:60])
    with caplog.at_level(logging.INFO, logger="tokenmix.cache.builder"):
        second = build(location, [a, b, c], on_error="skip")
    assert "trying" in caplog.text and "again" in caplog.text
    assert second["documents"] == 90 and second["skipped_by_reason"] == {}
    cache = tokenmix.TokenCache(location)
    in_order_built = [cache[i].tolist() for i in range(90)]
    alone = {name: tmp_path / f"alone-{name}" for name in "abc"}
    for name, url in zip("abc", (a, b, c)):
        build(str(alone[name]), [url])
    expected = [tokenmix.TokenCache(str(alone[n]))[i].tolist() for n in "acb" for i in range(30)]
    assert in_order_built == expected, "the retried shard's rows follow those built without it"
    assert build(location, [a, b, c], on_error="skip") == {**second, "already_built": True}  # nothing left to retry: untouched


def test_an_unwritable_cache_dir_is_one_plain_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = write_config(tmp_path / "c.yaml", blocker / "cache", SHARDS[:1])
    result = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", str(config)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(error) == 1 and len(error[0]) < 400, result.stderr
    assert f"cannot write the cache at {blocker}/cache/web/train: Not a directory" in error[0]
    assert "\\x00" not in result.stderr and "tensorstore_spec" not in result.stderr


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, like a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


@pytest.mark.timeout(300)
def test_storage_refusing_writes_keeps_the_committed_rows_and_a_rerun_resumes(tmp_path, reference):
    config = write_config(tmp_path / "c.yaml", tmp_path / "cache", SHARDS)
    result = subprocess.run([sys.executable, str(BUILD_WORKER), str(config), "-"], cwd=REPO, capture_output=True, text=True,
                            timeout=240, preexec_fn=_limit_file_size)
    assert result.returncode == 1, result.stdout
    message = result.stdout.strip().splitlines()[-1]
    assert message.startswith(f"CacheWriteError: writing the cache at {tmp_path}/cache/web/train failed: File too large. Its ")
    assert "committed rows are kept" in message and "re-run the build, which resumes" in message
    build_all(config)
    assert cache_bytes(str(tmp_path / "cache" / "web" / "train")) == reference["listed"]


def test_a_write_cut_short_by_a_kill_leaves_nothing_once_the_build_resumes(tmp_path, monkeypatch):
    """Tensorstore writes an object to ``<key>.__lock`` and renames it: a kill in between leaves that file (seen after
    a SIGKILL in ``test_crash_resume.py``). A later write of the same key replaces it, but an object no write touches
    again keeps it; the next build (holding the build lock, so no write is in flight) removes every one."""
    monkeypatch.setattr(store, "DATA_SHARD", 1 << 12)  # many shards: the first is complete, never written again
    monkeypatch.setattr(store, "DATA_INNER", 1 << 9)
    urls = demo_urls("python_doc")
    location, reference = tmp_path / "c", tmp_path / "ref"
    build(str(location), urls[:1])
    shard = location / "input_ids" / "data" / "c" / "0"
    (shard.parent / "0.__lock").write_bytes(shard.read_bytes()[:100])  # as a kill mid-write leaves it
    build(str(location), urls)
    build(str(reference), urls)
    assert cache_bytes(str(location)) == cache_bytes(str(reference))


def test_a_fifo_where_the_build_lock_goes_is_refused_and_a_waiting_builder_does_not_hang(tmp_path):
    """A named pipe at build.lock: the builder refuses it by name; one waiting behind the holder reads no holder from it
    (an open without O_NONBLOCK would block until a writer came)."""
    location = tmp_path / "c"
    location.mkdir()
    os.mkfifo(location / LOCK_FILE)
    with pytest.raises(tokenmix.UnsafeFileError, match=rf"{location / LOCK_FILE}: the build lock is not a regular file"):
        build(str(location), SHARDS[:1])
    (location / "elsewhere").mkdir()  # a cache directory another builder holds locked, with a FIFO as its lock file
    os.mkfifo(location / "elsewhere" / LOCK_FILE)
    directory = os.open(location / "elsewhere", os.O_RDONLY)
    fcntl.flock(directory, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with pytest.raises(CacheLockedError, match="is being built by another builder"):
            build(str(location / "elsewhere"), SHARDS[:1], lock_timeout_s=0)
        assert time.monotonic() - started < 30
    finally:
        os.close(directory)
