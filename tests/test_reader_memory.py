"""What a process reading a mixture from local caches holds as its sources grow: bounded by the byte and file budgets
(the chunk cache; the mapped shard files of uncompressed caches), not by the number of sources; each measured in a fresh
process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import DEMO_CORPUS, REPO, TOKENIZER

import tokenmix

SEQ = 512
STEPS = 40
BUDGET_MIB = 8
"""The chunk cache's budget (``TOKENMIX_CHUNK_CACHE_BYTES``) and the mapped bytes' (``TOKENMIX_MAPPED_BYTES``) the readers
run under: far below 300 sources' 80 MiB of tokens."""
MAPPED_FILES = 32
"""The mapped-file bound the uncompressed case runs under (``TOKENMIX_MAPPED_FILES``), below its 300 shard files."""
RECORDS_MIB = 32
"""What 300 opened sources may hold beyond the budgets (about 70 KB each today)."""
READER = r"""
import json, os, sys
import numpy as np
import tokenmix
train = tokenmix.load_data_config(json.loads(sys.argv[1])).train_set(int(sys.argv[2]))
for step in range(int(sys.argv[3])):
    train.get_batch(np.arange(64 * step, 64 * (step + 1)))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"hwm_mib": int(status["VmHWM"].split()[0]) / 1024, "files": len(os.listdir("/proc/self/fd")),
                  "opened": len(train.opened_sources())}))
"""


def _config(cache_dir: str, sources: int, compression: str) -> dict:
    names = [f"s{i:03d}" for i in range(sources)]
    return {"tokenizer": TOKENIZER, "cache_dir": cache_dir, "shuffle": True, "build": {"compression": compression},
            "configs": {n: {"train_urls": [str(DEMO_CORPUS / "linux_doc" / "train-00-of-02.jsonl.zst")]} for n in names}}


def _many_caches(root, compression: str):
    """300 sources of about 140 k tokens each: one cache built, copied under 299 more names."""
    tokenmix.build_caches(tokenmix.load_data_config(_config(str(root), 1, compression)), progress=False)
    for i in range(1, 300):
        shutil.copytree(root / "s000", root / f"s{i:03d}")
    return root


def _read(root, sources: int, compression: str, env: dict[str, str]) -> dict:
    run = subprocess.run([sys.executable, "-c", READER, json.dumps(_config(str(root), sources, compression)), str(SEQ), str(STEPS)],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_local_readers_memory_and_files_stay_within_its_budgets_from_10_to_300_sources(tmp_path):
    """Every source read (zstd, the default layout): 300 sources x 280 KB of tokens would be 80 MiB cached; the chunk
    cache's budget bounds that, the sources it cannot hold are read exactly, their compressed chunks by range (no file
    held open, no mapped page resident), and what grows beyond is each opened source's record (tens of KB)."""
    root = _many_caches(tmp_path, "zstd")
    env = {"TOKENMIX_CHUNK_CACHE_BYTES": str(BUDGET_MIB << 20)}
    few, many = _read(root, 10, "zstd", env), _read(root, 300, "zstd", env)
    assert few["opened"] == 10 and many["opened"] == 300, (few, many)
    assert many["files"] <= few["files"] + 2, (few, many)
    assert many["hwm_mib"] - few["hwm_mib"] <= BUDGET_MIB + RECORDS_MIB, (few, many)


@pytest.mark.slow
def test_an_uncompressed_caches_mapped_shards_stay_within_the_file_and_byte_bounds(tmp_path):
    """Uncompressed chunks are read as slices of mapped shard files: 300 sources read keep at most ``MAPPED_FILES`` of
    them mapped (a file descriptor each) and ``BUDGET_MIB`` of them, not one per source."""
    root = _many_caches(tmp_path, "none")
    env = {"TOKENMIX_CHUNK_CACHE_BYTES": "0", "TOKENMIX_MAPPED_FILES": str(MAPPED_FILES), "TOKENMIX_MAPPED_BYTES": str(BUDGET_MIB << 20)}
    few, many = _read(root, 10, "none", env), _read(root, 300, "none", env)
    assert few["opened"] == 10 and many["opened"] == 300, (few, many)
    assert many["files"] <= few["files"] + MAPPED_FILES, (few, many)
    assert many["hwm_mib"] - few["hwm_mib"] <= BUDGET_MIB + RECORDS_MIB, (few, many)
