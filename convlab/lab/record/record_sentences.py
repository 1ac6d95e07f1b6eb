"""Sentences about the committed records, computed from them.

A sentence that quantifies over records ("in every record", "the settings do not cap MKL",
"fastest") is rendered by one of these functions from the loaded records
(:func:`convlab.lab.record.records.load_records`), so it cannot contradict the tables beside it.
Each takes records (objects with ``label``, ``machine_name``, ``isa_name``,
``mkl_capped`` and ``sections``) or one section's data, and returns plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convlab.lab.method import timing

GRADS = ("grad_input", "grad_weight", "grad_bias")


def _with(recs: Sequence[Any], section: str) -> list[Any]:
    """The records whose ``section`` holds data (not absent, not an error)."""
    return [r for r in recs
            if isinstance(r.sections.get(section), Mapping)
            and "error" not in r.sections[section]]


def _by_machine(recs: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in recs:
        out.setdefault(r.machine_name, []).append(r)
    return out


def slow_bits_across_threads(recs: Sequence[Any]) -> str:
    """In how many records the slow kernels (backends not ``Mkldnn``) kept their bits at
    every thread count of ``numerics.threads_bits``, and where and which gradients they
    changed otherwise."""
    recs = _with(recs, "numerics")
    moved = []
    for r in recs:
        found = [f"{row['conv']} {row['backend']} {g}"
                 for row in r.sections["numerics"]["threads_bits"]["rows"]
                 if row["backend"] != "Mkldnn"
                 for g, same in zip(GRADS, row["same"], strict=True) if not same]
        if found:
            moved.append(f"{r.label} ({', '.join(found)})")
    if not recs:
        return "No record measures the thread counts yet."
    kept = len(recs) - len(moved)
    head = (f"The slow kernels kept their bits across the thread counts in {kept} of "
            f"{len(recs)} records")
    if not moved:
        return head + "."
    return head + "; they changed in " + "; ".join(moved) + "."


def mkl_capped(recs: Sequence[Any]) -> str:
    """Which records' ISA setting capped MKL too (``Record.mkl_capped``), per machine."""
    recs = list(recs)
    if not recs:
        return "No records."
    capped = [r for r in recs if r.mkl_capped]
    if not capped:
        return (f"None of the {len(recs)} records capped MKL: their MKL ran the code path "
                "each record names whatever the setting.")
    parts = [f"{m} under {', '.join(r.isa_name for r in rs)}"
             for m, rs in _by_machine(capped).items()]
    return (f"{len(capped)} of the {len(recs)} records capped MKL too ("
            + "; ".join(parts) + "); in the other "
            f"{len(recs) - len(capped)} MKL ran the code path each record names "
            "whatever the setting.")


def _gemm_rates(rf: Mapping[str, Any]) -> tuple[float, float]:
    """MKL's and oneDNN's GEMM GFLOP/s at the roofline's highest thread count."""
    g = rf["gemm"]
    t = str(max(int(k) for k in g["torch.mm"]))
    return g["torch.mm"][t]["gflops"], g["onednn matmul"][t]["gflops"]


def gemm_leader(recs: Sequence[Any], isa: str = "sse41") -> str:
    """Under setting ``isa``: which GEMM was faster, MKL's ``torch.mm`` or oneDNN's
    matmul, per record, split by whether the setting capped MKL too."""
    recs = [r for r in _with(recs, "roofline") if r.isa == isa]
    if not recs:
        return f"No record of the {isa} setting has a roofline section."
    out = []
    for capped, word in ((False, "did not cap"), (True, "capped")):
        group = [r for r in recs if bool(r.mkl_capped) == capped]
        if not group:
            continue
        cells = []
        for r in group:
            mkl, one = _gemm_rates(r.sections["roofline"])
            lead = "MKL" if mkl > one else "oneDNN"
            cells.append(f"{r.machine_name} {mkl:.0f} against {one:.0f} GF/s ({lead} "
                         f"x{max(mkl, one) / min(mkl, one):.1f})")
        out.append(f"where the {recs[0].isa_name} setting {word} MKL, MKL's mm against "
                   f"oneDNN's matmul: " + ", ".join(cells))
    text = "; ".join(out)
    return text[0].upper() + text[1:] + "."


def slow_rows_across_isa(recs: Sequence[Any]) -> str:
    """Per machine: whether the slow path's error rows (``numerics.accuracy``, every
    backend but ``Mkldnn``) came out the same under all its settings, and whether any
    setting capped MKL there."""
    recs = _with(recs, "numerics")
    out = []
    for m, rs in _by_machine(recs).items():
        if len(rs) < 2:
            continue
        seen: dict[tuple[str, str, str], set[float]] = {}
        for r in rs:
            for row in r.sections["numerics"]["accuracy"]:
                if row["backend"] != "Mkldnn":
                    key = (row["layer"], row["dtype"], row["backend"])
                    seen.setdefault(key, set()).add(
                        tuple(round(row["ulps"][g], 6) for g in GRADS if g in row["ulps"]))
        differ = sorted({f"{k[0]} {k[1]}" for k, v in seen.items() if len(v) > 1})
        capped = [r.isa_name for r in rs if r.mkl_capped]
        cap = (f"MKL capped under {', '.join(capped)}" if capped
               else "no setting capped MKL")
        verdict = ("the slow rows agree across its settings" if not differ
                   else "the slow rows differ between its settings on "
                   + ", ".join(differ))
        out.append(f"{m} ({len(rs)} settings, {cap}): {verdict}")
    return "\n".join(out) or "No machine has records under two settings."


def fastest_route(compare: Mapping[str, Any]) -> str:
    """The fastest weight-only route of a ``per_sample`` ``compare`` section, ranked by
    each route's median per-round ratio to ``convlab grouped`` (the table's ranking), and
    named only where the sign test on the per-round ratios of the first two separates
    them beyond the A/A band."""
    weight = {k: v for k, v in compare["routes"].items()
              if "skipped" not in v and v["kind"] == "weight"}
    if len(weight) < 2:
        return "fastest weight-only route: fewer than two routes timed"
    first, second = sorted(weight, key=lambda k: weight[k]["ratio_vs_grouped"])[:2]
    pair = timing.verdict_of(
        [a / b for a, b in zip(weight[first]["round_ratios"],
                               weight[second]["round_ratios"], strict=True)],
        compare["aa_band"])
    if pair.verdict == "faster":
        return f"fastest weight-only route: {first} (faster than {second})"
    return (f"fastest weight-only route: not resolved ({first} "
            f"x{weight[first]['ratio_vs_grouped']:.2f} and {second} "
            f"x{weight[second]['ratio_vs_grouped']:.2f} of grouped, within the A/A band)")


def _lowp_rows(recs: Sequence[Any]) -> list[tuple[Any, Mapping[str, Any]]]:
    return [(r, row) for r in recs
            if isinstance(r.sections.get("lowp"), Mapping) and "rows" in r.sections["lowp"]
            for row in r.sections["lowp"]["rows"] if "skipped" not in row]


def _slowdown(row: Mapping[str, Any]) -> str:
    v = row.get("over_float32")
    if v is not None:
        return f"x{v['median']:.0f}" if v["median"] >= 10 else f"x{v['median']:.2f}"
    if "single_call_s" in row:
        return f"{row['single_call_s']:.1f} s for one call"
    return "untimed"


def lowp_reference_kernels(recs: Sequence[Any]) -> str:
    """Where a reduced dtype ran a pass on oneDNN's reference (``ref:``) implementation,
    per dtype and machine: the settings, the passes and the time against float32."""
    found: dict[tuple[str, str], list[tuple[Any, Mapping[str, Any], list[str]]]] = {}
    for r, row in _lowp_rows(recs):
        passes = [p for p, impl in row["impl"].items() if str(impl).startswith("ref:")]
        if passes and row["dtype"] != "float32":
            found.setdefault((row["dtype"], r.machine_name), []).append((r, row, passes))
    if not found:
        return "No record ran a reduced dtype on oneDNN's reference kernels."
    out = []
    for (dtype, m), hits in found.items():
        isas = ", ".join(dict.fromkeys(r.isa_name for r, _, _ in hits))
        passes = ", ".join(sorted({p for _, _, ps in hits for p in ps}))
        times = ", ".join(f"{row['layer']} {_slowdown(row)}" for r, row, _ in hits
                          if r is hits[0][0])
        out.append(f"{dtype} on {m} under {isas}: {passes} ran oneDNN's reference "
                   f"kernel (ref:any), against float32 {times} (under {hits[0][0].isa_name})")
    return "\n".join(out)


def lowp_same_kernel(recs: Sequence[Any], layer: str = "resnet14") -> str:
    """The same reduced-precision oneDNN implementation (both passes) on ``layer`` against
    float32, per machine: one kernel name, its time ratio on each."""
    seen: dict[str, dict[str, list[float]]] = {}
    for r, row in _lowp_rows(recs):
        v = row.get("over_float32")
        if row["layer"] != layer or row["dtype"] == "float32" or v is None:
            continue
        impls = set(row["impl"].values())
        if len(impls) == 1:
            seen.setdefault(impls.pop(), {}).setdefault(r.machine_name, []).append(v["median"])
    out = []
    for impl, by in seen.items():
        if len(by) < 2:
            continue
        cells = [f"{m} x{min(v):.2f}" + (f"-{max(v):.2f}" if max(v) > min(v) else "")
                 for m, v in by.items()]
        out.append(f"{layer}, {impl} in both passes, time over float32: " + "; ".join(cells))
    return "\n".join(out) or f"No reduced-precision kernel of {layer} ran on two machines."
