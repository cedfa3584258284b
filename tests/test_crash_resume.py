"""SIGKILL a real cache build (driver and workers) at random points of its progress; the resumed build is identical."""

import gzip
import json
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
from tokenmix.cache.ledger import skipped_totals

COPIES = 4
SOURCES = ("linux_doc", "python_doc", "webster")
KILLS = 5
RUN_TIMEOUT_S = 300
"""How long one build may run without reaching its kill point (or its end) before the test fails: generous, fixed."""


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
    for s in SOURCES:
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


def _progress(cache_dir) -> int:
    """Input records the build has committed so far, summed over every source's ledger (0 before the first is written).
    A ledger is replaced whole by each write, so it is never read half-written."""
    total = 0
    for source in SOURCES:
        path = cache_dir / source / "train" / "ledger.json"
        if path.exists():
            total += sum(shard["position"] for shard in json.loads(path.read_text())["shards"])
    return total


def _run_until(config, cache_dir, target: int) -> bool:
    """Run the build until it has committed ``target`` input records (polled), then SIGKILL it (driver and workers);
    returns whether it finished first. The kill point is a point of the build's progress, whatever the machine's
    speed: a busy machine makes the build slower, never the kill land elsewhere."""
    proc = subprocess.Popen(_command(*config), cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while proc.poll() is None and _progress(cache_dir) < target:
        assert time.monotonic() < deadline, f"the build reached {_progress(cache_dir)} of {target} records in {RUN_TIMEOUT_S} s"
        time.sleep(0.002)
    finished = proc.poll() is not None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it finished, and every process of its group is gone
        pass
    stderr = proc.communicate()[1].decode()
    assert not finished or proc.returncode == 0, stderr
    return finished


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tokenizers", "fastokens"])
def test_sigkill_at_random_points_then_resume_gives_an_identical_cache(tmp_path, backend):
    """Each run is killed once the build has committed a number of input records drawn at random (and more than the run
    before it left): the kills land all through the build (every source, the shard whose checksum fails), never in the
    interpreter's start-up (most of a ``fastokens`` build's time), and never depend on how fast the machine is."""
    reference_dir = tmp_path / "reference"
    subprocess.run(_command(_config(tmp_path, reference_dir), backend), cwd=REPO, check=True, capture_output=True)
    reference = {s: TokenCache(str(reference_dir / s / "train")) for s in SOURCES}
    assert all(skipped_totals(cache.ledger.shards) == {"corrupt_shard": 1} for cache in reference.values())
    records = _progress(reference_dir)

    crashed_dir = tmp_path / "crashed"
    config = (_config(tmp_path, crashed_dir), backend)
    points = sorted(random.Random(int(os.environ.get("TOKENMIX_CRASH_SEED", "2026"))).sample(range(1, records * 9 // 10), KILLS))
    kills = 0
    progress_seen: set[tuple[str, int]] = set()
    for point in points:  # all through the build, not at its very end; each run makes some progress before its kill
        if _run_until(config, crashed_dir, max(point, _progress(crashed_dir) + 1)):
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
    print("kills", kills, "of", records, "records:", sorted(progress_seen))
    assert kills == KILLS, "a build ran to its end past its kill point"
    assert len(progress_seen) >= 3, "the kills landed at too few points"
    subprocess.run(_command(*config), cwd=REPO, check=True, capture_output=True)
    for source in reference:
        assert cache_bytes(str(crashed_dir / source / "train")) == cache_bytes(str(reference_dir / source / "train")), source
