"""The package's shape: imports run one way through the stages, and no module imports itself back through a cycle.

Stages, lowest first: execution (where tasks run: the local process pool, Ray, Dask; it imports no stage) -> sources ->
formats -> cache -> datasets -> loader -> config -> curate (beside the flow: it uses the readers of sources, the
executors and the YAML loading of config, and no stage of the flow uses it), and
export beside it at the same rank (caches to other stacks' files) -> the
public face (tokenmix/__init__.py) -> train (the example training launch) -> cli. A module imports from its own stage or a
lower one; ``_lazy``, ``_waiting``, ``_safe_files``, ``_parent_death``, ``_child_fd``, ``_file_digest``,
``_object_stores``, ``_blas_threads`` and ``_commands`` are private helpers below every stage. Imports inside functions
count (they run when called), and
so do imports under ``if TYPE_CHECKING:``: two modules that need each other's names, if only for a type, are a cycle hidden, not removed.
The one exception is a package's own ``__init__.py``, whose ``TYPE_CHECKING`` block declares the names it exports
lazily (``_lazy.py``): a module of the package may import from the package. Only the execution stage imports Ray or Dask.
"""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO

SRC = REPO / "src"
RANK = {"_lazy": 0, "_blas_threads": 0, "_waiting": 0, "_safe_files": 0, "_parent_death": 0, "_child_fd": 0, "_file_digest": 0,
        "_object_stores": 0, "_commands": 0,
        "execution": 1, "sources": 2, "formats": 3, "cache": 4, "datasets": 5, "loader": 6, "config": 7, "curate": 8, "export": 8, "mixing": 8,
        "": 9, "train": 10, "cli": 11}
"""Stage of each top-level name under tokenmix ("" is the package itself, its public face)."""


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    runs: bool
    """False under ``if TYPE_CHECKING:``."""

    @property
    def lazy_export(self) -> bool:
        """A name a package's ``__init__.py`` exports lazily (declared under ``TYPE_CHECKING``, imported on first use)."""
        return not self.runs and MODULES[self.importer].name == "__init__.py"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "tokenmix").rglob("*.py"))}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def resolve(name: str) -> str:
    """The module an import statement loads: ``tokenmix.formats`` + ``chat`` is the module ``tokenmix.formats.chat``."""
    return name if name in MODULES else name.rsplit(".", 1)[0]


def imports_of(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[Import] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tokenmix":
            assert node.level == 0, f"{module}:{node.lineno}: relative import"
            for alias in node.names:
                found.append(Import(module, resolve(f"{node.module}.{alias.name}"), node.lineno, runs))
        elif isinstance(node, ast.Import):
            found.extend(Import(module, resolve(a.name), node.lineno, runs) for a in node.names if a.name.split(".")[0] == "tokenmix")
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return found


ALL_IMPORTS = [imp for module in MODULES for imp in imports_of(module)]

ENGINES = {"ray", "dask", "distributed"}
"""The distributed engines: optional extras, imported by the execution stage alone."""
IMPORTING_CALLS = {"import_module", "__import__", "import_extra"}


def engines_imported(module: str) -> list[str]:
    """``line: engine`` for each import of Ray or Dask in ``module``: statements (at any depth, ``TYPE_CHECKING`` too)
    and calls that import a module named by a string (``importlib.import_module("ray")``, ``import_extra("ray", ...)``)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(), str(MODULES[module]))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            names = [node.args[0].value] if called in IMPORTING_CALLS else []
        found.extend(f"{node.lineno}: {name}" for name in names if name.split(".")[0] in ENGINES)
    return found


def test_every_module_sits_in_a_known_stage():
    assert {stage(m) for m in MODULES} <= set(RANK), f"unknown stages: {sorted({stage(m) for m in MODULES} - set(RANK))}"


def test_no_module_imports_from_a_stage_above_its_own():
    upward = [f"{i.importer}:{i.line} imports {i.imported}" for i in ALL_IMPORTS if RANK[stage(i.imported)] > RANK[stage(i.importer)]]
    assert upward == []


def test_lazy_exports_of_a_stage_come_from_that_stage():
    from tokenmix._lazy import declared_exports

    for package, path in MODULES.items():
        if path.name == "__init__.py" and package != "tokenmix":
            outside = {name: m for name, m in declared_exports(str(path)).items() if not m.startswith(package + ".")}
            assert outside == {}, f"{package} exports names of other packages"
    exported_from = {m for m in declared_exports(str(MODULES["tokenmix"])).values()}
    assert not {m for m in exported_from if stage(m) == "cli"}, "the public face exports from the CLI"


def test_only_the_execution_stage_imports_ray_or_dask():
    outside = {m: engines_imported(m) for m in MODULES if stage(m) != "execution"}
    assert {m: lines for m, lines in outside.items() if lines} == {}
    inside = {m for m in MODULES if stage(m) == "execution" and engines_imported(m)}
    assert inside == {"tokenmix.execution.ray_executor", "tokenmix.execution.dask_executor"}  # the check sees them


def test_no_import_cycles():
    graph = graphlib.TopologicalSorter()
    for imp in ALL_IMPORTS:
        if not imp.lazy_export and imp.imported != imp.importer:
            graph.add(imp.importer, imp.imported)
    try:
        graph.prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_checks_see_the_imports_they_judge():
    """The walk finds function-level imports and TYPE_CHECKING ones, so the tests above could fail."""
    found = {(i.importer, i.imported, i.runs) for i in ALL_IMPORTS}
    assert ("tokenmix.execution.configs", "tokenmix.execution.ray_executor", True) in found  # inside RayExecutorConfig.open
    type_only = {(i.importer, i.imported): i.lazy_export for i in ALL_IMPORTS if not i.runs}
    assert type_only[("tokenmix.cache.targets", "tokenmix.sources.shards")] is False  # under TYPE_CHECKING: counts for cycles
    assert type_only[("tokenmix.config", "tokenmix.config.caches")] is True  # a package's lazy export: does not
    assert ("tokenmix.config.sources", "tokenmix.formats", True) in found
    assert RANK[stage("tokenmix.cli.demo")] > RANK[stage("tokenmix")] > RANK[stage("tokenmix.config.mixture")]
