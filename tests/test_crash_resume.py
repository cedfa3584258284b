"""SIGKILL a real cache build (driver and workers) at random instants; the resumed build is identical."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import DEMO_CORPUS, REPO, TOKENIZER, cache_bytes

from tokenmix import CacheNotFoundError, TokenCache

COPIES = 4


def _config(tmp_path, cache_dir):
    """The demo corpus, each shard listed as 4 copies, so a build lasts long enough to be killed often."""
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
        sources[s] = {"train_urls": urls}
    path = tmp_path / f"{os.path.basename(cache_dir)}.yaml"
    path.write_text(yaml.safe_dump({"tokenizer": TOKENIZER, "cache_dir": str(cache_dir), "configs": sources}))
    return str(path)


def _command(config):
    return [sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", config,
            "--build.num_workers", "2", "--build.chunk_bytes", "32768", "--build.commit_interval_s", "0"]


def _run_and_kill(config, delay):
    proc = subprocess.Popen(_command(config), cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    finished = proc.poll() is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return finished


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_gives_an_identical_cache(tmp_path):
    reference_dir = tmp_path / "reference"
    started = time.monotonic()
    subprocess.run(_command(_config(tmp_path, reference_dir)), cwd=REPO, check=True, capture_output=True)
    duration = time.monotonic() - started
    reference = {s: TokenCache(str(reference_dir / s / "train")) for s in ("linux_doc", "python_doc", "webster")}

    crashed_dir = tmp_path / "crashed"
    config = _config(tmp_path, crashed_dir)
    rng = random.Random(int(os.environ.get("TOKENMIX_CRASH_SEED", "2026")))
    kills = 0
    progress_seen = set()
    for _ in range(12):
        if _run_and_kill(config, rng.uniform(0.15, 0.4) * duration):
            break
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
    subprocess.run(_command(config), cwd=REPO, check=True, capture_output=True)
    for source in reference:
        assert cache_bytes(str(crashed_dir / source / "train")) == cache_bytes(str(reference_dir / source / "train")), source
