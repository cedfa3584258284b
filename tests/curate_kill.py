"""Runs of ``tokenmix curate`` killed at a point of their progress, and what a run has finished and written: shared by
the tests and ``scripts/bench_dedup_scale.py`` (which puts this directory on its path), so both kill runs the same way.

Importing this module imports nothing of tokenmix's, nor pytest.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK_DIR = ".curate"
"""The run's work directory below its output, one directory per run key (``pipeline.WORK_DIR``)."""


def curate_until(config_path: str | Path, out: str | Path, reached: Callable[[], bool], what: str, limit_s: float = 300) -> bool:
    """Run ``tokenmix curate`` in a process group of its own until ``reached()`` holds (polled), then SIGKILL the
    driver and its workers; returns whether the run ended first (it must then have succeeded). The kill point is a
    point of the run's progress, whatever the machine's speed; ``what`` names it in the error of a run that does not
    reach it in ``limit_s`` seconds (a hung run, not a slow one: keep it generous and fixed)."""
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a run that logs much never blocks on it
        proc = subprocess.Popen([sys.executable, "-m", "tokenmix.cli.main", "curate", "--config_path", str(config_path), "--output.path", str(out)],
                                cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + limit_s
        timed_out = False
        while proc.poll() is None and not reached() and not timed_out:
            time.sleep(0.002)
            timed_out = time.monotonic() > deadline
        finished = proc.poll() is not None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    assert not timed_out, f"the run did not reach {what} in {limit_s:.0f} s: {stderr[-3000:]}"
    assert not finished or proc.returncode == 0, stderr[-3000:]
    return finished


def finished_tasks(out: str | Path, dirs: Iterable[str]) -> list[Path]:
    """The records of finished tasks (``.json``) below ``dirs`` of the run's work directory (any run key)."""
    work = Path(out) / WORK_DIR
    keys = os.listdir(work) if work.is_dir() else []
    return [Path(r) / f for key in keys for d in dirs for r, _, files in os.walk(work / key / d) for f in files if f.endswith(".json")]


def run_files(out: str | Path, suffixes: tuple[str, ...]) -> dict[str, str]:
    """The SHA-256 of each of a run's files ending in ``suffixes``, by path below ``out``, the run key left out of the
    work directory's paths (runs of one pipeline to two outputs compare equal)."""
    files = {}
    for r, _, fs in os.walk(out):
        for f in fs:
            if f.endswith(suffixes):
                path = os.path.relpath(os.path.join(r, f), out).split(os.sep)
                with open(os.path.join(r, f), "rb") as handle:
                    files["/".join(path[:1] + path[2:] if path[0] == WORK_DIR else path)] = hashlib.file_digest(handle, "sha256").hexdigest()
    return files
