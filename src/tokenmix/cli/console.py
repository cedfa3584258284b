"""The rich console the CLI prints with: full tables even when output is piped to a file."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)
