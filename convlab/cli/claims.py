"""``convlab claims``: run the book's machine-dependent claims here and print each one's
status, evidence, and which committed records agree.

Options are checked before any check runs (a bad one: one line on stderr, exit 2). With
``--json`` the output is one JSON object: ``{"machine": ..., "claims": [{"id", "chapter",
"sentence", "condition", "status", "evidence", "detail", "records_agree",
"records_differ", "gpu_runs"}, ...]}``; ``gpu_runs`` lists the stored GPU runs of a CUDA
claim (:mod:`convlab.lab.claims.gpu_runs`) as ``"<device> <date>: <status>"``.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence

from convlab.cli.args import Parser


def chapter(text: str) -> int | str:
    """A chapter that has claims: ``intro`` or its number."""
    from convlab.lab import claims
    from convlab.lab.claims import core

    try:
        key = core.check_chapter(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if key not in claims.chapters():
        have = ", ".join(str(c) for c in claims.chapters())
        raise argparse.ArgumentTypeError(f"chapter {key} has no claims (these do: {have})")
    return key


def build_parser() -> argparse.ArgumentParser:
    """The ``convlab claims`` argument parser."""
    ap = Parser(prog="convlab claims",
                description="Check the book's machine-dependent claims on this machine: "
                "holds / does not hold / cannot run here, with evidence, and which "
                "committed records agree.")
    ap.add_argument("--chapter", type=chapter, default=None,
                    help="only this chapter's claims (a number, or intro)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab claims [--chapter N] [--json]``; 0 after printing, 2 on a bad argument."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    from convlab.lab import claims, machine, records
    from convlab.lab.claims import core, gpu_runs

    found = records.load_records()
    on_gpus = gpu_runs.load_runs()
    by_id = {c.id: c for c in claims.CLAIMS}
    outcomes = claims.evaluate(args.chapter)
    rows = []
    for o in outcomes:
        same, other = core.agreeing(o, found)
        c = by_id[o.claim_id]
        rows.append({"id": o.claim_id, "chapter": c.chapter, "sentence": c.sentence,
                     "condition": c.condition, "status": o.status, "evidence": o.evidence,
                     "detail": o.detail, "records_agree": same, "records_differ": other,
                     "gpu_runs": [f"{g['gpu']} {g['date'][:10]}: "
                                  f"{g['outcomes'][o.claim_id]['status']}"
                                  for g in on_gpus if o.claim_id in g["outcomes"]]})
    if args.json:
        print(json.dumps({"machine": machine.machine_slug(), "claims": rows}, indent=1))
        return 0
    for r in rows:
        print(f"{r['id']}: {r['status']}")
        print(textwrap.fill(r["evidence"], 72, initial_indent="  ", subsequent_indent="  "))
        if r["records_agree"] or r["records_differ"]:
            agree = "records agree: " + ("; ".join(r["records_agree"]) or "none")
            if r["records_differ"]:
                agree += " (differ: " + "; ".join(r["records_differ"]) + ")"
        else:
            agree = "records: none stores this claim"
        print(textwrap.fill(agree, 72, initial_indent="  ", subsequent_indent="    "))
        if r["gpu_runs"]:
            print(textwrap.fill("stored GPU runs: " + "; ".join(r["gpu_runs"]), 72,
                                initial_indent="  ", subsequent_indent="    "))
    held = sum(r["status"] == core.HOLDS for r in rows)
    print(f"\n{held} of {len(rows)} claims hold here.", file=sys.stdout)
    return 0
