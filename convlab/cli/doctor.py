"""``convlab doctor``: see :func:`convlab.lab.doctor.main` (options and checks live there)."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``convlab doctor`` with ``argv``; return its exit status."""
    from convlab.lab.doctor import main as doctor

    return int(doctor(list(argv) if argv is not None else None) or 0)
