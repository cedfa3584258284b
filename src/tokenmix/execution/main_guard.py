"""Whether this call comes from a script's top level outside ``if __name__ == "__main__":``.

A spawned worker process starts a fresh interpreter that imports the main script again (as ``__mp_main__``, so that
functions defined there can be found). A script whose work is not under that guard then runs its work again in every
worker, which ``multiprocessing`` stops as soon as that work starts processes of its own: the worker dies and the pool
breaks (``BrokenProcessPool``). NeMo Curator users' scripts often have no guard; ``process_pool.py`` asks here before
it chooses how to start workers.
"""

from __future__ import annotations

import ast
import sys
import tokenize


def unguarded_main_line() -> tuple[str, int] | None:
    """The main script's path and the line of its top level running now, when that line is outside every ``if __name__
    == "__main__":`` block; ``None`` when it is inside one, when there is no main script file (an interactive session,
    ``python -c``, a notebook), or when the script's top level is not on this thread's stack."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        with tokenize.open(path) as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    guarded = any(isinstance(node, ast.If) and _is_main_test(node.test)
                  and any(statement.lineno <= line <= (statement.end_lineno or statement.lineno) for statement in node.body)
                  for node in ast.walk(tree))
    return None if guarded else (path, line)


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round), alone or as one term of an ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_main_test(value) for value in test.values)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
