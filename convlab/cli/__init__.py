"""The ``convlab`` command (also ``python -m convlab``): a thin dispatcher.

One module per command in this package (:mod:`convlab.cli.doctor`, :mod:`~convlab.cli.trace`,
:mod:`~convlab.cli.bench`, :mod:`~convlab.cli.explain`), each with ``build_parser()`` (its
options) and ``main(argv) -> int``, imported only when its command runs (so ``convlab
explain`` does not load the benchmark). Adding a command is one such module and one line in
``COMMANDS``.

The dispatcher parses every command's arguments the same way before the command runs
(:func:`convlab.cli.args.parse`): an unknown option or a malformed value is one line on
stderr, ``convlab CMD: error: ...``, and exit status 2, as is a value the command refuses
after parsing. An interrupted command (Ctrl-C) exits with status 130.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, str] = {
    "doctor": "environment, backends, a quick correctness check of every path",
    "trace": "the ATen ops (and backend) of a conv layer's forward+backward",
    "bench": "time every path side by side (interleaved rounds, A/A band)",
    "explain": "which backend and C++ kernel a layer's backward uses, and what flips it",
    "claims": "check the book's machine-dependent claims here (holds or not, evidence)",
}
INTERRUPTED = 130
USAGE_ERROR = 2


def usage() -> str:
    """The top-level help text."""
    lines = ["usage: convlab COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, help_ in COMMANDS.items()]
    lines += ["", "Run `convlab COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Route ``argv`` to a command module's ``main``; return its exit status. A usage
    error raises ``SystemExit(2)`` after its one line (``--help``: ``SystemExit(0)``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"convlab: error: unknown command {name!r} (choose from "
              f"{', '.join(COMMANDS)}; convlab --help)", file=sys.stderr)
        return USAGE_ERROR
    from convlab.cli.args import parse

    module = importlib.import_module(f"convlab.cli.{name}")
    try:
        parse(module.build_parser(), rest)  # SystemExit(2) on a usage error, as argparse
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:  # bench keeps its finished layers itself; others just stop
        print(f"convlab {name}: interrupted", file=sys.stderr)
        return INTERRUPTED
