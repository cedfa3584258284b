"""What a process reading a mixture from local caches holds as its sources grow: bounded by the byte and file budgets
(the chunk cache, the mapped shard files), not by the number of sources; each measured in a fresh process."""

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
MAPPED_FILES = 32
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


def _config(cache_dir: str, sources: int) -> dict:
    names = [f"s{i:03d}" for i in range(sources)]
    return {"tokenizer": TOKENIZER, "cache_dir": cache_dir, "shuffle": True,
            "configs": {n: {"train_urls": [str(DEMO_CORPUS / "linux_doc" / "train-00-of-02.jsonl.zst")]} for n in names}}


@pytest.fixture(scope="module")
def many_caches(tmp_path_factory):
    """300 sources of about 140 k tokens each: one cache built, copied under 299 more names."""
    root = tmp_path_factory.mktemp("memory")
    tokenmix.build_caches(tokenmix.load_data_config(_config(str(root), 1)), progress=False)
    for i in range(1, 300):
        shutil.copytree(root / "s000", root / f"s{i:03d}")
    return root


def _read(root, sources: int) -> dict:
    env = {**os.environ, "TOKENMIX_CHUNK_CACHE_BYTES": str(BUDGET_MIB << 20), "TOKENMIX_MAPPED_BYTES": str(BUDGET_MIB << 20),
           "TOKENMIX_MAPPED_FILES": str(MAPPED_FILES)}
    run = subprocess.run([sys.executable, "-c", READER, json.dumps(_config(str(root), sources)), str(SEQ), str(STEPS)],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_local_readers_memory_and_files_stay_within_its_budgets_from_10_to_300_sources(many_caches):
    """Every source read: 300 sources x 280 KB of tokens would be 80 MiB cached and 300 mapped shard files; the budgets
    are 8 MiB cached, 8 MiB and 32 files mapped. What grows beyond them is each opened source's record (tens of KB)."""
    few, many = _read(many_caches, 10), _read(many_caches, 300)
    assert few["opened"] == 10 and many["opened"] == 300, (few, many)
    assert many["files"] <= few["files"] + MAPPED_FILES, (few, many)
    assert many["hwm_mib"] - few["hwm_mib"] <= 2 * BUDGET_MIB + 24, (few, many)  # the budgets + 300 records of < 80 KB
