"""Fixtures and test-session environment; the helpers the tests import live in helpers.py."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# the mesh tests want 8 fake CPU devices; the flag only works before JAX starts, and conftest runs first
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# remembered tokenizer descriptions go to a directory of this test session, not the user's ~/.cache; a pytest-xdist
# worker makes its own (it inherits the controller's environment), since tests count what their session remembered
if os.environ.get("PYTEST_XDIST_WORKER") or "TOKENMIX_CACHE_DIR" not in os.environ:
    os.environ["TOKENMIX_CACHE_DIR"] = tempfile.mkdtemp(prefix="tokenmix-test-cache-")
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
# compiled training steps are kept for the session, so the training processes the tests start (and stop, and resume)
# compile each step once between them, not once each (the checkpoint kill tests: 106 s -> 46 s)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.environ["TOKENMIX_CACHE_DIR"], "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

from helpers import DEMO_CORPUS, TOKENIZER, GrowingCache, read_jsonl_zst  # noqa: E402
from s3_server import BUCKET, S3Server  # noqa: E402

WORKER_GROUPS = {
    # their tests start Ray or Dask clusters: one cluster at a time
    "test_executors.py": "clusters", "test_curate.py": "clusters", "test_readme.py": "clusters",
    # their module fixtures train runs that several tests compare against: trained once, not once per worker
    "test_train.py": "test_train.py", "test_train_checkpoints.py": "test_train_checkpoints.py",
    "test_online_mixing.py": "test_online_mixing.py",
}
"""Test files whose tests pytest-xdist (``--dist loadgroup``) runs in one worker, by group; every other test is
scheduled on its own."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` scheduling by ``WORKER_GROUPS`` (pytest-xdist sends larger groups first). pytest-xdist groups
    the tests marked ``xdist_group`` through a suffix it writes into their node ids on the worker, which pytest 9.2 no
    longer reads (pytest-xdist issue 1386): every test went its own way, Ray and Dask clusters ran at once in both
    workers, and each worker computed every module fixture. Here the controller groups the node ids by their file."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = WORKER_GROUPS.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])
            return group or super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _command_logging_undone():
    """A command run in the test's process (``tokenmix.cli.main.main``) sets logging up for its process: tokenmix's
    loggers at INFO, and Dask's level in the environment. Both are put back after each test, so that what a later test
    of the same worker logs and captures does not depend on whether such a test ran before it."""
    ours = logging.getLogger("tokenmix")
    level, dask = ours.level, os.environ.get("DASK_LOGGING__DISTRIBUTED")
    yield
    ours.setLevel(level)
    if dask is None:
        os.environ.pop("DASK_LOGGING__DISTRIBUTED", None)
    else:
        os.environ["DASK_LOGGING__DISTRIBUTED"] = dask


@pytest.fixture(scope="session")
def demo_docs() -> dict[str, list[dict[str, Any]]]:
    """The bundled demo corpus' training records, per source, in shard order."""
    out = {}
    for source in ("linux_doc", "python_doc", "webster"):
        out[source] = [r for i in range(2) for r in read_jsonl_zst(DEMO_CORPUS / source / f"train-0{i}-of-02.jsonl.zst")]
    return out


@pytest.fixture(scope="session")
def hf_tokenizer():
    from tokenmix.formats import load_tokenizer

    return load_tokenizer(TOKENIZER)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A different real tokenizer, trained on the spot."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    path = tmp_path_factory.mktemp("tiny_tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>").save_pretrained(path)
    return str(path)


@pytest.fixture
def growing_cache(tmp_path):
    """Starts caches that build in the background with their later shards held back (``GrowingCache``);
    each is released and joined when the test ends, whatever happened."""
    started: list[GrowingCache] = []

    def start(urls: list[str], held_from: int = 1, name: str = "growing", **options: Any) -> GrowingCache:
        growing = GrowingCache(str(tmp_path / name), urls, held_from, **options)
        started.append(growing)
        return growing

    yield start
    for growing in started:
        growing.finish()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A fresh S3 server on 127.0.0.1 holding ``s3_server.BUCKET``, and the environment that points tokenmix (and its
    subprocesses) at it."""
    try:
        server = S3Server(str(tmp_path_factory.mktemp("s3")), BUCKET)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    env = {"AWS_ENDPOINT_URL": server.endpoint, **server.keys}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()
