"""Public names of a package, imported on first use.

A package declares its public names once, as ``from module import Name`` lines inside an
``if TYPE_CHECKING:`` block of its ``__init__.py``: type checkers and editors read those as real
imports, and ``lazy_exports`` reads the same lines to import each name only when it is first used.
So ``import tokenmix`` costs about 10 ms over the interpreter's start and starts neither JAX nor ``transformers``.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any


def declared_exports(init_file: str) -> dict[str, str]:
    """Public name -> the module that defines it, from the ``if TYPE_CHECKING:`` block of ``init_file``."""
    with open(init_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), init_file)
    exports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if not isinstance(statement, ast.ImportFrom) or statement.module is None or statement.level:
                    raise SyntaxError(f"{init_file}: the TYPE_CHECKING block may hold only absolute `from module import name` lines")
                for alias in statement.names:
                    exports[alias.asname or alias.name] = statement.module
    return exports


def lazy_exports(package: str, init_file: str) -> tuple[dict[str, str], Callable[[str], Any], Callable[[], list[str]]]:
    """The export table of ``package`` and the module-level ``__getattr__`` and ``__dir__`` that serve it lazily."""
    exports = declared_exports(init_file)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return exports, __getattr__, __dir__
