"""The ``convlab`` command (also ``python -m convlab``): a thin dispatcher.

One module per command in this package (:mod:`convlab.cli.doctor`, :mod:`~convlab.cli.trace`,
:mod:`~convlab.cli.bench`, :mod:`~convlab.cli.explain`), each with ``main(argv) -> int``,
imported only when its command runs (so ``convlab explain`` does not load the benchmark).
Arguments are checked before any work: a bad one is a one-line error and exit status 2. An
interrupted command (Ctrl-C) exits with status 130.
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
    """Route ``argv`` to a command module's ``main``; return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"convlab: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return USAGE_ERROR
    module = importlib.import_module(f"convlab.cli.{name}")
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:  # bench keeps its finished layers itself; others just stop
        print(f"convlab {name}: interrupted", file=sys.stderr)
        return INTERRUPTED


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``convlab bench`` (kept here for callers of ``convlab.cli.bench_main``)."""
    from convlab.cli.bench import main as bench

    return bench(argv)
