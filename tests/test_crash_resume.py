"""SIGKILL a real cache build (driver and workers) at random instants; the resumed build is identical."""

import gzip
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml
import zstandard
from helpers import DEMO_CORPUS, REPO, TOKENIZER, cache_bytes

from tokenmix import CacheNotFoundError, TokenCache

COPIES = 4


def _corrupt_copy(source: str, target) -> None:
    """A shard of the demo corpus as gzip whose CRC-32 fails at its end: its rows are written, then taken back."""
    data = zstandard.ZstdDecompressor().stream_reader((DEMO_CORPUS / source / "train-00-of-02.jsonl.zst").read_bytes(),
                                                      read_across_frames=True).read()
    damaged = bytearray(gzip.compress(data))
    damaged[-7] ^= 1 << 3
    target.write_bytes(bytes(damaged))


def _config(tmp_path, cache_dir):
    """The demo corpus, each shard listed as 4 copies, so a build lasts long enough to be killed often; after the first
    copy of each source, a copy whose checksum fails (counted, no row kept)."""
    corpus = tmp_path / "corpus"
    sources = {}
    for s in ("linux_doc", "python_doc", "webster"):
        (corpus / s).mkdir(parents=True, exist_ok=True)
        urls = []
        for copy in range(COPIES):
            for i in range(2):
                target = corpus / s / f"copy{copy}-train-0{i}.jsonl.zst"
                if not target.exists():
                    shutil.copyfile(DEMO_CORPUS / s / f"train-0{i}-of-02.jsonl.zst", target)
                urls.append(str(target))
            if copy == 0:
                corrupt = corpus / s / "corrupt-train-00.jsonl.gz"
                if not corrupt.exists():
                    _corrupt_copy(s, corrupt)
                urls.append(str(corrupt))
        sources[s] = {"train_urls": urls}
    path = tmp_path / f"{os.path.basename(cache_dir)}.yaml"
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(cache_dir), "configs": sources}))
    return str(path)


def _command(config, backend):
    return [sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", config, "--build.tokenizer_backend", backend,
            "--build.num_workers", "2", "--build.chunk_bytes", "32768", "--build.commit_interval_s", "0", "--build.on_error", "skip"]


def _timed_reference(config, first_ledger):
    """Build the reference cache; returns the seconds until its first ledger was written and until it finished."""
    started = time.monotonic()
    proc = subprocess.Popen(_command(*config), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    began = None
    while proc.poll() is None:
        if began is None and first_ledger.exists():
            began = time.monotonic() - started
        time.sleep(0.005)
    assert proc.returncode == 0, proc.stderr.read()
    finished = time.monotonic() - started
    return began if began is not None else 0.0, finished


def _run_and_kill(config, delay):
    proc = subprocess.Popen(_command(*config), cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    finished = proc.poll() is not None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it finished, and every process of its group is gone
        pass
    proc.wait()
    return finished


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tokenizers", "fastokens"])
def test_sigkill_at_random_points_then_resume_gives_an_identical_cache(tmp_path, backend):
    """Kills land between the first ledger write and the end of the reference build's time: the build itself, not the
    interpreter's start-up (most of a ``fastokens`` build's time)."""
    reference_dir = tmp_path / "reference"
    began, finished = _timed_reference((_config(tmp_path, reference_dir), backend), reference_dir / "linux_doc" / "train" / "ledger.json")
    reference = {s: TokenCache(str(reference_dir / s / "train")) for s in ("linux_doc", "python_doc", "webster")}
    assert all(cache.ledger.skipped_totals() == {"corrupt_shard": 1} for cache in reference.values())

    crashed_dir = tmp_path / "crashed"
    config = (_config(tmp_path, crashed_dir), backend)
    rng = random.Random(int(os.environ.get("TOKENMIX_CRASH_SEED", "2026")))
    kills = 0
    progress_seen: set[tuple[str, int]] = set()
    window = 0.35
    for _ in range(16):
        if _run_and_kill(config, began + rng.uniform(0.0, window) * (finished - began)):
            if kills >= 3:
                break
            # the machine got faster than when the reference was timed: start over, killing earlier
            shutil.rmtree(crashed_dir)
            kills, window = 0, window / 2
            progress_seen.clear()
            continue
        kills += 1
        for source, ref in reference.items():
            try:
                cache = TokenCache(str(crashed_dir / source / "train"))
            except CacheNotFoundError:
                continue
            rows = cache.num_rows()
            progress_seen.add((source, rows))
            # what a reader sees after a crash is a prefix of the final cache, row for row
            assert rows <= ref.num_rows()
            sample = sorted({0, rows // 2, rows - 1}) if rows else []
            assert [r.tolist() for r in cache.get_rows(sample)] == [r.tolist() for r in ref.get_rows(sample)]
    print("kills", kills, sorted(progress_seen))
    assert kills >= 3, "the build finished before it could be killed; make it slower"
    assert len(progress_seen) >= 2, "every kill landed at the same point"
    subprocess.run(_command(*config), cwd=REPO, check=True, capture_output=True)
    for source in reference:
        assert cache_bytes(str(crashed_dir / source / "train")) == cache_bytes(str(reference_dir / source / "train")), source
