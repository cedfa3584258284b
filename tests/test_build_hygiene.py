"""Failing early and leaving nothing behind.

A tokenizer path that does not exist fails at once (not after the hub's retries), a weight that is not a finite
number >= 0 is refused when the config is read, and a cache build leaves nothing in the temp dir and no worker
behind it, whether it finishes, is SIGKILLed, or its workers fail to start.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, TOKENIZER, demo_urls, encoder_for, network_attempts, process_alive, wait_until

import tokenmix
from tokenmix.cache import encoding as encoding_module
from tokenmix.cache.encoding import EncoderPool
from tokenmix.formats import TextLmDatasetFormat, TokenizerLoadError, load_tokenizer
from tokenmix.sources import FileShard

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads processes from /proc")


# -- a tokenizer path that does not exist --------------------------------------------------------------------------------


def _local_failure(name: str) -> str:
    """The message of the ``TokenizerLoadError`` that loading ``name`` raises, having tried no host but this machine."""
    with network_attempts() as attempts, pytest.raises(TokenizerLoadError) as failure:
        load_tokenizer(name)
    assert attempts == [], attempts
    return str(failure.value)


_LOCAL_LOAD = f"""
import json, sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from helpers import network_attempts
from tokenmix.formats import TokenizerLoadError, load_tokenizer
started = time.monotonic()
with network_attempts() as attempts:
    try:
        load_tokenizer(sys.argv[1])
    except TokenizerLoadError as e:
        print(json.dumps({{"seconds": time.monotonic() - started, "message": str(e), "network": attempts}}))
"""


@pytest.mark.parametrize("offline", [None, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_a_mistyped_relative_tokenizer_path_fails_at_once_naming_where_it_looked(tmp_path, offline):
    # a fresh interpreter: huggingface_hub reads HF_HUB_OFFLINE when imported, and the test session sets it
    (tmp_path / "data" / "tokenizer").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    if offline:
        env[offline] = "1"
    run = subprocess.run([sys.executable, "-c", _LOCAL_LOAD, "data/tokenizr"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    failure = json.loads(run.stdout)
    print(f"failed in {failure['seconds']:.3f} s")
    assert failure["network"] == []  # it took about 46 s of hub retries
    for part in ("'data/tokenizr'", str(tmp_path / "data" / "tokenizr"), f"current directory, {tmp_path}",
                 "did you mean 'tokenizer'?", "check the path", "'gpt2'"):
        assert part in failure["message"]


@pytest.mark.parametrize("name", ["./tokenizr", "../tokenmix-no-such-dir/tokenizer", "/tokenmix-no-such-dir/tokenizer",
                                  "~/tokenmix-no-such-dir/tokenizer", "a/b/c", "a b"])
def test_what_cannot_be_a_hub_id_is_a_local_path_and_never_goes_to_the_hub(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    message = _local_failure(name)
    assert f"no such local file or directory {os.path.abspath(os.path.expanduser(name))}" in message
    assert "check the path" in message


def test_a_hub_id_offline_is_looked_up_in_the_local_hub_cache_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    message = _local_failure("tokenmix-no-such-org/no-such-tokenizer")
    assert "TRANSFORMERS_OFFLINE is set, so only the local Hugging Face cache was searched" in message
    assert "unset TRANSFORMERS_OFFLINE" in message


def test_an_existing_directory_loads_by_any_spelling_and_a_failure_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(REPO)
    assert load_tokenizer("data/tokenizer") is load_tokenizer(TOKENIZER)  # kept by absolute path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with pytest.raises(TokenizerLoadError):
        load_tokenizer("data/tokenizer")  # relative to the new directory: not the one loaded above
    shutil.copytree(TOKENIZER, tmp_path / "data" / "tokenizer")
    assert len(load_tokenizer("data/tokenizer")) == len(load_tokenizer(TOKENIZER))


# -- weights that are not finite numbers >= 0 ------------------------------------------------------------------------------


def _mixture(train_weights, **fields):
    return {"tokenizer": TOKENIZER, "configs": {"web": {"train_urls": demo_urls("linux_doc")}, "code": {"train_urls": demo_urls("webster")}},
            "train_weights": train_weights, **fields}


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), -1.0, float("-inf")])
def test_a_weight_that_is_not_a_finite_number_at_least_0_is_refused_when_the_config_is_read(weight):
    with pytest.raises(tokenmix.ConfigError) as failure:
        tokenmix.load_data_config(_mixture({"web": weight, "code": 1.0}))
    assert f"train_weights: source 'web' has weight {weight!r}; give it a finite number >= 0" in str(failure.value)


def test_a_bad_weight_in_a_later_stage_names_the_stage_by_its_step():
    with pytest.raises(tokenmix.ConfigError) as failure:
        tokenmix.load_data_config(_mixture([[0, {"web": 1.0, "code": 1.0}], [100, {"web": float("inf"), "code": 1.0}]], batch_size=8))
    assert "train_weights (the stage from step 100): source 'web' has weight inf; give it a finite number >= 0" in str(failure.value)


def test_an_infinite_weight_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "data.yaml"
    path.write_text(f"tokenizer: {TOKENIZER}\ntrain_weights: {{web: .inf}}\nconfigs:\n  web: {{train_urls: [{demo_urls('linux_doc')[0]}]}}\n")
    with pytest.raises(tokenmix.ConfigError, match=f"^{path} does not parse .*source 'web' has weight inf; give it a finite number >= 0"):
        tokenmix.load_data_config(path)


# -- the worker pool ---------------------------------------------------------------------------------------------------------


def _chunk():
    return next(iter(FileShard(demo_urls("webster")[0]).read()))


@pytest.mark.parametrize("passes_fds", [True, False], ids=["spec file", "spec in each task"])
def test_every_registered_spec_reaches_the_workers(monkeypatch, passes_fds):
    monkeypatch.setattr(encoding_module, "_PASSES_FDS", passes_fds and encoding_module._PASSES_FDS)
    chunk = _chunk()
    specs = [encoder_for(TextLmDatasetFormat(), enforce_eos=eos)[0] for eos in (True, False)]
    with EncoderPool(0) as local, EncoderPool(2) as workers:
        for _ in range(2):
            for spec in specs:
                want, got = local.submit(spec, chunk).result(), workers.submit(spec, chunk).result()
                assert got.tokens.tolist() == want.tokens.tolist() and got.lengths.tolist() == want.lengths.tolist()
    assert want.tokens.size < local.submit(specs[0], chunk).result().tokens.size  # the two specs differ


# -- nothing left behind ------------------------------------------------------------------------------------------------------


def _build_command(tmp_path: Path) -> list[str]:
    """A CLI build on two worker processes (``tokenizers``: ``fastokens`` encodes in threads, with no processes to leave)."""
    return [sys.executable, "-m", "tokenmix.cli.main", "build-cache", "--config_path", "config/demo.yaml",
            "--cache_dir", str(tmp_path / "cache"), "--build.num_workers", "2", "--build.tokenizer_backend", "tokenizers"]


def _scratch_env(tmp_path: Path, **extra: str) -> tuple[Path, dict[str, str]]:
    """A fresh, empty temp dir, and the environment that makes a build use it."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return scratch, {**os.environ, "TMPDIR": str(scratch), **extra}


def _children(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            state, ppid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid and state != "Z":
            found.add(int(entry))
    return found


def _workers(pid: int) -> set[int]:
    """The pool's workers among the children of ``pid`` (the other one is multiprocessing's resource tracker)."""
    found = set()
    for child in _children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except OSError:
            continue
    return found


def _kill_after(command: list[str], env: dict[str, str], delay: float) -> tuple[int, float]:
    """Start a build, SIGKILL its driver (only) ``delay`` seconds after its workers are up, and wait for every process it
    started to exit; returns how many there were and how many seconds the last outlived the driver."""
    driver = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: len(_workers(driver.pid)) == 2 or driver.poll() is not None, "the build's workers starting", timeout=120)
    time.sleep(delay)  # a kill at a random instant of the build, not a wait for something to happen
    children = _children(driver.pid)
    driver.send_signal(signal.SIGKILL)
    assert driver.wait() == -signal.SIGKILL, "the build finished before it was killed"
    killed = time.monotonic()
    # they exit within about a second of the driver (their watch polls it); the bound is for a busy machine
    wait_until(lambda: not any(process_alive(p) for p in children), "the killed build's workers exiting")
    return len(children), time.monotonic() - killed


@linux_only
@pytest.mark.slow
def test_a_sigkilled_build_leaves_nothing_in_the_temp_dir_and_no_worker_behind(tmp_path):
    scratch, env = _scratch_env(tmp_path)
    rng = random.Random(int(os.environ.get("TOKENMIX_CRASH_SEED", "2026")))
    for kill in range(3):
        delay = rng.uniform(0.0, 1.5)
        children, outlived = _kill_after(_build_command(tmp_path), env, delay)
        print(f"kill {kill} at {delay:.2f} s: {children} children, all gone {outlived:.2f} s after the driver")
        assert os.listdir(scratch) == []
    finished = subprocess.run(_build_command(tmp_path), cwd=REPO, env=env, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    assert os.listdir(scratch) == []


_WORKERS_THAT_FAIL = {
    "initializer raises": (
        "import sys\n"
        "if '--multiprocessing-fork' in sys.argv:\n"
        "    import tokenmix.cache.encoding\n"
        "    def init_worker(*args):\n"
        "        raise RuntimeError('this worker was told not to start')\n"
        "    tokenmix.cache.encoding.init_worker = init_worker\n"
    ),
    "process exits": "import os, sys\nif '--multiprocessing-fork' in sys.argv:\n    os._exit(3)\n",
}


@linux_only
@pytest.mark.parametrize("failure", list(_WORKERS_THAT_FAIL))
def test_a_pool_whose_workers_fail_to_start_leaves_nothing(tmp_path, failure):
    # a sitecustomize module runs in every interpreter on PYTHONPATH, here making the spawned workers fail
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_WORKERS_THAT_FAIL[failure])
    scratch, env = _scratch_env(tmp_path, PYTHONPATH=str(site))
    failed = subprocess.run(_build_command(tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    assert "a tokenizing worker process died" in failed.stderr
    assert os.listdir(scratch) == []
