"""Which committed records a chapter shows, and which the Records appendix shows.

Chapters 7, 9 and 10 render their tables from ONE reference machine
(``REFERENCE_MACHINE``; per-record tables from its ``REFERENCE_ISA`` record), so a
table stays a few screens long; the Records appendix (``book/records/<machine>.md``,
written by ``scripts/records_appendix.py``) runs the same cells once per machine under
:func:`appendix_scope`, where :func:`shown` and :func:`one` keep every record they are
given. The rendering code lives once, in the chapters' ``from-records`` cells.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

# The AMD EPYC host (Zen 4, family 25 model 17, 32 MiB L3): the records with every section
# the chapters render, taken under four ISA settings.
REFERENCE_MACHINE = "amd-epyc-x2-l3-32m-f25m17"
REFERENCE_ISA = "avx512"
APPENDIX_DIR = "records"  # book/records/<machine slug>.md, the appendix pages

_scope = {"appendix": False}


@contextlib.contextmanager
def appendix_scope() -> Iterator[None]:
    """Within it, :func:`shown` and :func:`one` return every record they are given."""
    before = _scope["appendix"]
    _scope["appendix"] = True
    try:
        yield
    finally:
        _scope["appendix"] = before


def shown(recs: Sequence[Any]) -> list[Any]:
    """The records a chapter's tables show: the reference machine's (every record in
    :func:`appendix_scope`). ``recs``: :class:`convlab.lab.record.records.Record` objects."""
    if _scope["appendix"]:
        return list(recs)
    return [r for r in recs if r.machine == REFERENCE_MACHINE]


def one(recs: Sequence[Any]) -> list[Any]:
    """For a per-record table: the reference record among ``recs`` (else the first),
    as a one-element list; every record in :func:`appendix_scope`."""
    recs = list(recs)
    if _scope["appendix"]:
        return recs
    return [r for r in recs if r.isa == REFERENCE_ISA][:1] or recs[:1]


def reference_note(recs: Sequence[Any]) -> str:
    """One line naming the machine and records a chapter's tables come from."""
    if _scope["appendix"]:
        return f"{len(recs)} record(s) of this machine"
    mine = shown(recs)
    if not mine:
        return (f"no record of the reference machine {REFERENCE_MACHINE} is committed: "
                "the tables are empty; the Records appendix has every machine")
    isas = ", ".join(r.isa_name for r in mine)
    return (f"reference machine: {mine[0].machine_name} ({len(mine)} record(s): {isas}); "
            f"{len(recs) - len(mine)} more record(s) of other machines are in the "
            "Records appendix")
