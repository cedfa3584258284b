"""``tokenmix <command> ...``: dispatch to the subcommands."""

from __future__ import annotations

import importlib
import sys

from tokenmix._commands import configure_command_logging, run_command

COMMANDS = {
    "curate": ("tokenmix.cli.curate", "Run (or resume) a curation pipeline: filter, modify, deduplicate, blend, shuffle raw shards."),
    "build-cache": ("tokenmix.cli.build_cache", "Build (or resume, or extend) the caches of a data config."),
    "export": ("tokenmix.cli.export", "Write a cache (or a source's token files) as Megatron, datatrove, Nanoset, Levanter or Cerebras HDF5 files."),
    "inspect": ("tokenmix.cli.inspect_cache", "Show a cache's ledger and statistics and decode sample documents."),
    "verify": ("tokenmix.cli.verify", "Check every stored byte of caches (checksums, row bounds, inputs) and repair damaged rows."),
    "demo": ("tokenmix.cli.demo", "Build the bundled demo mixture's caches, then stream its batches onto a mesh of 8 fake CPU devices."),
    "train": ("tokenmix.cli.train_lm", "Train a tiny transformer on a mixture: per-source eval, checkpoints, exact resume."),
    "plot": ("tokenmix.cli.plot_schedule", "Draw a mixture config's schedule (each source's share by step) as a PNG."),
}


def _usage() -> str:
    lines = ["usage: tokenmix <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`tokenmix <command> --help` shows a command's options."]
    return "\n".join(lines)


def _print_usage(asked: bool) -> int:
    """The commands on stdout; 0 when ``--help`` asked for them, 2 when no command was given."""
    print(_usage())
    return 0 if asked else 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        return run_command(__name__, lambda: _print_usage(asked=bool(argv)))
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"tokenmix: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    configure_command_logging()
    name = COMMANDS[command][0]
    return run_command(name, lambda: importlib.import_module(name).run(rest))


if __name__ == "__main__":
    sys.exit(main())
