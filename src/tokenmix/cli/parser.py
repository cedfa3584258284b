"""The argument parser of every command: the command's module docstring as its description, each option's default
in its help, and a usage error as one line naming the option."""

from __future__ import annotations

import argparse
from typing import NoReturn


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written (its paragraphs and examples); an option's default after its help, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """``tokenmix <command>``'s options; a usage error is one line: what is wrong and where the options are listed."""

    def __init__(self, command: str, doc: str | None) -> None:
        super().__init__(prog=f"tokenmix {command}", description=plain_text(doc or ""), formatter_class=_HelpFormatter)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def plain_text(doc: str) -> str:
    """A docstring as a terminal shows it: reST's double backticks around code as single ones."""
    return doc.replace("``", "`")


def at_least(minimum: int, what: str):
    """An argparse ``type``: an integer no smaller than ``minimum`` (``what`` says what it counts, for the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} ({what}), got {value}")
        return value

    return parse
