"""The ``convlab`` command (also ``python -m convlab``).

Each subcommand lives in the module that owns the concept and exposes
``main(argv: list[str]) -> int``; this file only routes to it.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("convlab.doctor", "environment, backends, a quick correctness check of every path"),
    "trace": ("convlab.dispatch", "the ATen ops (and backend) of a conv layer's forward+backward"),
    "bench": ("convlab.bench", "time every path side by side (torch.utils.benchmark)"),
}


def usage() -> str:
    """The top-level help text."""
    lines = ["usage: convlab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `convlab COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Route ``argv`` to a subcommand's ``main``; return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"convlab: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)
