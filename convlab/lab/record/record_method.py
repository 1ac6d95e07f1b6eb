"""How each section of a record was taken: its method, its noise from two sides, and how
busy the machine was. The Records appendix prints it at the top of each machine's page.

The two noise figures answer different questions and are labelled apart: the *within-run*
A/A band (the section's own ``aa_band``: how far two candidates running the same kernel
drift apart inside one process) and the *between-process* spread (how far the section's
ratios move from one fresh process to the next, :mod:`convlab.lab.record.replicates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convlab.lab.notebook import Table
from convlab.lab.record.replicates import TIMED

METHOD_NAMES = {1: "earlier (one process)", 2: "A/A + 3 processes"}
# The rows of the table: the runner's repeated sections and ``dpsgd``, which runs its own
# fresh processes for the one ratio its verdict needs.
SECTIONS: tuple[str, ...] = (*TIMED, "dpsgd")


def _pct(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.0%}"


def within_band(section: Mapping[str, Any]) -> float | None:
    """A section's within-run A/A band, where it stores one at its top level (or in its
    ``compare`` part, as ``per_sample`` does; the widest of its runs', as ``dpsgd``)."""
    for part in (section, section.get("compare", {})):
        band = part.get("aa_band") if isinstance(part, Mapping) else None
        if isinstance(band, int | float):
            return float(band)
    bands = [r.get("aa_band") for r in section.get("runs", []) if isinstance(r, Mapping)]
    bands = [b for b in bands if isinstance(b, int | float)]
    return max(bands) if bands else None


def own_spread_text(section: Mapping[str, Any]) -> str:
    """``dpsgd``'s own between-process spread (of the book-keeping step's ratio to SGD),
    the widest over its runs; ``-`` when none ran."""
    spreads = [(len(step["process_ratios_vs_sgd"]), step["process_spread"])
               for run in section.get("runs", []) for step in run.get("steps", {}).values()
               if isinstance(step, Mapping) and len(step.get("process_ratios_vs_sgd", [])) > 1]
    if not spreads:
        return "-"
    n, worst = max(spreads, key=lambda s: s[1])
    return f"{n} processes (its own): max {_pct(worst)}"


def load_text(load: Mapping[str, Any] | None) -> str:
    """E.g. ``quiet (others 1%, steal 0%)``, ``NOT QUIET: ...`` or ``not stored``."""
    if not load:
        return "not stored"
    fractions = f"others {_pct(load.get('others'))}, steal {_pct(load.get('steal'))}"
    return f"quiet ({fractions})" if load.get("quiet") else f"NOT QUIET: {load.get('why')}"


def spread_text(spread: Mapping[str, Any] | None) -> str:
    """E.g. ``3 processes: median 4%, max 12%`` for the ratios (for the GF/s rates, so
    labelled, in a section without ratios, such as the roofline); ``-`` when not stored."""
    for kind, label in (("ratio", ""), ("rate", " of the GF/s")):
        part = (spread or {}).get(kind) or {}
        if part.get("median") is not None:
            return (f"{part['processes']} processes: median {_pct(part['median'])}, "
                    f"max {_pct(part['max'])}{label}")
    return "-"


def taken_table(recs: Sequence[Any]) -> Table:
    """One row per timed section of each record (:class:`convlab.lab.record.records.Record`):
    method, within-run A/A band, between-process spread of the ratios (:func:`spread_text`),
    machine load."""
    rows = []
    for rec in recs:
        for name in SECTIONS:
            section = rec.sections.get(name)
            if section is None:
                continue
            if "error" in section:
                rows.append([rec.isa_name, name, "-", "-", "-", f"error: {section['error']}"])
                continue
            method = rec.section_method(name)
            rows.append([rec.isa_name, name, METHOD_NAMES.get(method, str(method)),
                         _pct(within_band(section)),
                         own_spread_text(section) if name == "dpsgd"
                         else spread_text(rec.section_spread(name)),
                         load_text(rec.section_load(name))])
    return Table(["setting", "section", "method", "within-run A/A band",
                  "between-process spread", "machine while it ran"], rows,
                 caption="How each timed section was taken")
