"""Engines that are optional extras (Ray, Dask): imported only when chosen, or a message naming what to install."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """The chosen executor's engine is not installed."""


def import_extra(module: str, extra: str) -> ModuleType:
    """Import an optional engine, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"executor.type {extra!r} needs the {module!r} package, which is not installed here: "
            f"pip install 'tokenmix[{extra}]' (and the same on every machine of the cluster)"
        ) from e
