"""Every shell and Python snippet of the README runs as written, in order, in a fresh copy of the repository.

The copy holds the files a commit of the working tree would hold (tracked, and untracked ones git does not ignore): no
caches, runs, virtual environment or compiled module. Shell blocks run with bash, each stopping at its first failing
command; Python snippets run one after the other in one interpreter (``readme_session.py``), the copy's ``.venv``'s,
as a user pasting them into one session would; a YAML snippet must load as a data config, pasted into the demo config
where it is a mixture's fields without sources (``configs``).

Two things are not run as a user's machine would: the test suite's command (the opening block's second line, which CI
runs, and which runs this test), and the network. ``pip install`` runs as written, offline: no index, no isolated build
environment, the packages of the interpreter running this test standing for what it would download (they are on the
copy's ``PYTHONPATH``, so the copy's ``.venv`` sees them), so an extra the README installs must be among them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO

README = REPO / "README.md"
TEST_SUITE = "-m pytest"
"""What the line that runs the test suite holds: that line is left out."""


@dataclass(frozen=True)
class Snippet:
    language: str
    code: str
    line: int
    """Its first line in the README (the fence's)."""

    @property
    def where(self) -> str:
        return f"README.md, line {self.line}"


def readme_snippets(text: str) -> list[Snippet]:
    """The README's fenced ``bash``, ``python`` and ``yaml`` blocks, in order."""
    return [Snippet(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in re.finditer(r"^```(bash|python|yaml)\n(.*?)^```$", text, re.M | re.S)]


def fresh_copy(target: Path) -> Path:
    """The repository's files as a commit of the working tree would hold them, copied to ``target``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git working tree: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not in a commit of it either
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def environment(copy: Path, bin_dir: Path) -> dict[str, str]:
    """A user's shell in ``copy`` without a network: ``python3`` is this interpreter (the only program of ``bin_dir``);
    its packages stand for what ``pip`` would download; nothing of this checkout's own install is on any path."""
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    packages = os.pathsep.join(dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=packages, PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")  # as the README's mesh snippet says to set on a CPU
    return env


class PythonSession:
    """The copy's ``.venv/bin/python`` running ``readme_session.py``: snippets run in it one after the other."""

    def __init__(self, copy: Path, env: dict[str, str], log: Path):
        self.log = log
        self._process = subprocess.Popen([str(copy / ".venv" / "bin" / "python"), str(copy / "tests" / "readme_session.py")], cwd=copy,
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)

    def run(self, code: str, where: str) -> None:
        assert self._process.stdin and self._process.stdout
        self._process.stdin.write(json.dumps({"code": code, "where": where}) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        assert answer, f"{where}: the Python session ended\n{self.log.read_text()[-4000:]}"
        outcome = json.loads(answer)
        assert outcome["ok"], f"{where} failed:\n{outcome['error']}\n{self.log.read_text()[-4000:]}"

    def close(self) -> None:
        if self._process.stdin:
            self._process.stdin.close()
        self._process.wait()


YAML_CHECK = """
import yaml as _yaml
import tokenmix as _tokenmix
_doc = _yaml.safe_load({text!r})
if "configs" not in _doc:  # a mixture's fields: pasted into the demo config
    _doc = {{**_yaml.safe_load(open("config/demo.yaml")), **_doc}}
    _tokenmix.load_data_config(_doc).train_set(64)
else:
    _tokenmix.load_data_config(_doc)
"""


def test_the_readme_has_snippets_of_each_language_and_one_test_suite_line():
    snippets = readme_snippets(README.read_text())
    assert {s.language for s in snippets} == {"bash", "python", "yaml"}
    assert sum(line.count(TEST_SUITE) for s in snippets if s.language == "bash" for line in s.code.splitlines()) == 1
    assert snippets[0].language == "bash" and snippets[0].line == 9


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_readme_snippet_runs_as_written_in_order_in_a_fresh_copy(tmp_path):
    copy = fresh_copy(tmp_path / "tokenmix")
    env = environment(copy, tmp_path / "bin")
    session: PythonSession | None = None
    try:
        for snippet in readme_snippets((copy / "README.md").read_text()):
            if snippet.language == "bash":
                script = "".join(line for line in snippet.code.splitlines(keepends=True) if TEST_SUITE not in line)
                result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=copy, env=env, capture_output=True, text=True)
                output = f"{snippet.where}:\n{script}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
                assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, output
                continue
            session = session or PythonSession(copy, env, tmp_path / "python.log")
            session.run(snippet.code if snippet.language == "python" else YAML_CHECK.format(text=snippet.code), snippet.where)
    finally:
        if session is not None:
            session.close()
