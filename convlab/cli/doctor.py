"""``convlab doctor``: see :func:`convlab.lab.doctor.main` (options and checks live there)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The ``convlab doctor`` argument parser (``convlab.lab.doctor.build_parser``)."""
    from convlab.lab.doctor import build_parser as doctor_parser

    return doctor_parser()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``convlab doctor`` with ``argv``; return its exit status (2: a bad argument, one
    line)."""
    from convlab.cli.args import parse
    from convlab.lab.doctor import main as doctor

    parse(build_parser(), argv)  # the doctor's own parser, with one-line usage errors
    return int(doctor(list(argv) if argv is not None else None) or 0)
