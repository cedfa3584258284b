"""The front door: what `import tokenmix` gives, what it costs, what help() shows, and the README's code."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO, TOKENIZER

import tokenmix
from tokenmix._lazy import declared_exports

PACKAGES = ["tokenmix", "tokenmix.execution", "tokenmix.sources", "tokenmix.formats", "tokenmix.cache", "tokenmix.datasets", "tokenmix.loader",
            "tokenmix.config", "tokenmix.curate", "tokenmix.export", "tokenmix.mixing"]
HEAVY = ("jax", "transformers", "torch")
TORCH_ADVICE = "PyTorch was not found"
README = (REPO / "README.md").read_text()
README_PYTHON = re.findall(r"```python\n(.*?)```", README, re.S)


def _python(code: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)


def _summaries() -> dict[str, str]:
    """The one-line summary the package docstring gives each public name."""
    return dict(re.findall(r"^    (\w+) {2,}(.+)$", tokenmix.__doc__, re.M))


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_declares_its_names_once_and_every_one_resolves(package):
    module = importlib.import_module(package)
    declared = declared_exports(module.__file__)
    assert sorted(module.__all__) == sorted(declared), f"{package}: __all__ and the TYPE_CHECKING imports differ"
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        assert getattr(module, name) is getattr(importlib.import_module(declared[name]), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_importing_tokenmix_and_its_stages_starts_neither_jax_nor_transformers():
    code = f"""
import sys, tokenmix
for package in {PACKAGES!r}:
    __import__(package)
config = tokenmix.load_data_config("config/demo.yaml")
tokenmix.TokenCache, tokenmix.MixtureDataset, tokenmix.PackedDataset, tokenmix.BatchSchedule, tokenmix.build_caches
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    starts_jax = _python("import os, sys, tokenmix\n"
                         "children = {}\n"
                         "for name in tokenmix.__all__:\n"
                         "    pid = os.fork()\n"  # each name in a process that has imported tokenmix and nothing more
                         "    if pid == 0:\n"
                         "        getattr(tokenmix, name)\n"
                         "        os._exit(3 if 'jax' in sys.modules else 0)\n"
                         "    children[pid] = name\n"
                         "for pid, name in children.items():\n"
                         "    if os.waitpid(pid, 0)[1] >> 8 == 3:\n"
                         "        print(name)\n")
    assert starts_jax.returncode == 0, starts_jax.stderr
    assert sorted(starts_jax.stdout.split()) == ["DataLoader", "LmBatch", "LoaderError", "StepBatch"], "as the package docstring says"


_BLAS_SPIN = """
import os, sys, time
{first}
import numpy
time.sleep(0.3)  # OpenBLAS's threads, started by numpy's import, spin for 2**28 cycles (about 0.1 s) unless told less
main = str(os.getpid())
def cpu_ticks(task):
    try:
        with open(f"/proc/self/task/{{task}}/stat") as f:
            return sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13])
    except FileNotFoundError:  # a thread that ended after the listing
        return 0
ticks = sum(cpu_ticks(t) for t in os.listdir("/proc/self/task") if t != main)
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), ticks)
"""


def test_importing_tokenmix_first_keeps_numpys_idle_blas_threads_from_spinning():
    """numpy's import starts OpenBLAS threads that would burn about 0.1 s of each other core (numpy#29193); after
    ``import tokenmix`` they sleep at once (a clock tick is 10 ms: a spin of 0.1 s is several). A user's own setting
    is kept, and numpy imported first is left as it is."""
    def run(first: str, **setting: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}  # this process set its own
        done = subprocess.run([sys.executable, "-c", _BLAS_SPIN.format(first=first)], cwd=REPO, capture_output=True,
                              text=True, env={**env, **setting}, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    setting, ticks = run("import tokenmix")
    assert setting == "20" and int(ticks) <= 1, (setting, ticks)
    assert run("import tokenmix", OPENBLAS_THREAD_TIMEOUT="28")[0] == "28"
    assert run("import numpy, tokenmix")[0] == "None"


ARRAY_LIBRARIES = ("numpy", "tensorstore")


def test_reading_a_config_imports_no_array_library():
    """Every build and every training launch reads its config: YAML into checked dataclasses, which needs none of the
    array libraries the caches and datasets are made of (about 0.1 s of imports on a 2-core VM), so that a build loads
    its tokenizer beside their imports rather than after them."""
    block_shuffled = {"tokenizer": TOKENIZER, "shuffle": {"io_block_size": 4, "window_blocks": 2},
                      "configs": {"packed": {"train_urls": ["/data/a.jsonl"], "packing": {"max_segments_per_example": 8}},
                                  "chat": {"train_urls": ["/data/b.jsonl"], "format": {"type": "chat"}}}}
    code = ("import json, sys, tokenmix\n"
            "for config in ('config/demo.yaml', json.loads(sys.argv[1])):\n"
            "    tokenmix.load_data_config(config).sources()\n"
            f"print(sorted(m for m in {ARRAY_LIBRARIES!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code, json.dumps(block_shuffled)], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_public_name_has_a_one_line_summary_that_is_its_docstring():
    summaries = _summaries()
    assert sorted(summaries) == sorted(tokenmix.__all__)
    for name in tokenmix.__all__:
        value = getattr(tokenmix, name)
        if hasattr(value, "__args__"):  # a type alias (DataConfig) has no docstring of its own
            continue
        first_line = (value.__doc__ or "").strip().splitlines()[0]
        assert summaries[name] == first_line, f"tokenmix.{name}: the docstring's first line is {first_line!r}"


def test_help_lists_the_public_api():
    result = _python("import tokenmix; help(tokenmix)", PAGER="cat")
    assert result.returncode == 0, result.stderr
    for name, summary in _summaries().items():
        assert f"{name}" in result.stdout and summary in result.stdout


def test_the_readme_uses_public_names_only():
    code = "\n".join(README_PYTHON)
    assert README_PYTHON, "the README has Python examples"
    assert not re.search(r"^\s*(from|import) tokenmix\.", code, re.M), "README examples import from inside the package"
    used = set(re.findall(r"\btokenmix\.(\w+)", code)) | {
        name.strip() for names in re.findall(r"^from tokenmix import (.+)$", code, re.M) for name in names.split(",")
    }
    assert used and used <= set(tokenmix.__all__), f"not public: {sorted(used - set(tokenmix.__all__))}"


def test_a_config_loads_from_a_mapping_as_from_its_yaml_and_leaves_no_file_behind(tmp_path, monkeypatch):
    doc = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    from_yaml = tokenmix.load_data_config(REPO / "config" / "demo.yaml", ["--cache_dir", "/tmp/c", "--build.num_workers=3"])
    from_dict = tokenmix.load_data_config(doc, ["--cache_dir", "/tmp/c", "--build.num_workers=3"])
    under_data = tokenmix.load_data_config({"data": doc, "trainer": {"steps": 10}}, ["--cache_dir", "/tmp/c", "--build.num_workers=3"])
    assert from_yaml == from_dict == under_data
    assert from_dict.cache_dir == "/tmp/c" and from_dict.build.num_workers == 3 and doc["cache_dir"] == "cache/demo"
    for _ in range(20):
        tokenmix.load_data_config(doc)
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("overrides, message", [
    (["cache_dir", "x"], "'cache_dir' is not of the form --field value"),
    (["--cache_dir"], "--cache_dir has no value"),
    (["--no_such_field", "1"], "no_such_field"),
    (["--mixture_block_size", "[1"], "not a valid YAML value"),
])
def test_bad_overrides_name_the_override(overrides, message):
    with pytest.raises(tokenmix.ConfigError, match=re.escape(message)):
        tokenmix.load_data_config({"tokenizer": TOKENIZER, "configs": {}}, overrides)


@pytest.mark.timeout(300)
def test_the_demo_command_streams_the_mixture_without_torch_advice(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tokenmix.cli.main", "demo", "--batches", "6", "--cache_dir", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "of examples, weight" in result.stdout and "(the same)" in result.stdout
    assert TORCH_ADVICE not in result.stdout + result.stderr
