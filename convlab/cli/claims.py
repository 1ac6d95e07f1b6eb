"""``convlab claims``: run the book's machine-dependent claims here and print each one's
verdict, sentence, condition and evidence, and how many committed records agree.

A verdict is ``holds``, ``does not hold``, ``inconclusive`` (the run could not resolve the
effect the sentence needs), ``cannot run here`` (a stated condition is not met) or
``error`` (the check raised: its type and message are the evidence). Options are checked
before any check runs (a bad one, an unknown ``--id`` included: one line on stderr, exit
2). The exit status is 0, or with ``--strict`` 1 when a claim does not hold or errs.
``--list`` prints the ids and sentences and runs nothing. With ``--json`` the output is
one JSON object: ``{"machine": ..., "summary": {status: count}, "claims": [{"id",
"chapter", "sentence", "condition", "status", "evidence", "detail", "records_agree",
"records_differ", "gpu_runs"}, ...]}``; ``gpu_runs`` lists the stored GPU runs of a CUDA
claim (:mod:`convlab.lab.claims.gpu_runs`) as ``"<device> <date>: <status>"``.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from convlab.cli.args import Parser

if TYPE_CHECKING:
    from convlab.lab.claims.core import Claim

WIDTH = 72


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


def claim_id(text: str) -> str:
    """The id of a claim of the registry."""
    from convlab.lab import claims

    if text not in {c.id for c in claims.CLAIMS}:
        raise argparse.ArgumentTypeError(
            f"no claim {text!r} (convlab claims --list shows the ids)")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``convlab claims`` argument parser."""
    ap = Parser(prog="convlab claims",
                description="Check the book's machine-dependent claims on this machine: "
                "holds / does not hold / inconclusive / cannot run here / error, with "
                "evidence, and how many committed records store the same verdict.")
    ap.add_argument("--chapter", type=chapter, default=None,
                    help="only this chapter's claims (a number, or intro)")
    ap.add_argument("--id", type=claim_id, action="append", dest="ids", metavar="ID",
                    help="only this claim (repeat for more)")
    ap.add_argument("--list", action="store_true",
                    help="print the ids and sentences and run nothing")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 if a claim does not hold or its check raised")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return ap


def _fill(text: str, first: str = "  ", rest: str = "    ") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=rest)


def _agree(row: dict) -> str:
    """``4/5``: the records that store this claim's verdict of the records storing one."""
    stored = len(row["records_agree"]) + len(row["records_differ"])
    return f"{len(row['records_agree'])}/{stored}" if stored else "-"


def _list(chosen: Sequence[Claim]) -> int:
    """Each claim's id and sentence (``--list``); runs nothing."""
    for c in chosen:
        print(c.id)
        print(_fill(c.sentence))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab claims [--chapter N] [--id ID] [--list] [--strict] [--json]``; 0 after
    printing (1 with ``--strict`` when a claim does not hold or errs), 2 on a bad
    argument."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    from convlab.lab import claims
    from convlab.lab.claims import core, gpu_runs
    from convlab.lab.method import machine
    from convlab.lab.record import records

    if args.list:
        return _list(core.select(claims.CLAIMS, args.chapter, args.ids))
    found = records.load_records()
    on_gpus = gpu_runs.load_runs()
    by_id = {c.id: c for c in claims.CLAIMS}
    outcomes = claims.evaluate(args.chapter, args.ids)
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
    statuses = [r["status"] for r in rows]
    failed = 1 if args.strict and any(s in core.STRICT_FAILURES for s in statuses) else 0
    if args.json:
        print(json.dumps({"machine": machine.machine_slug(),
                          "summary": {s: statuses.count(s) for s in core.STATUSES},
                          "claims": rows}, indent=1))
        return failed
    print(f"{'verdict':<16}{'agree':>7}  claim")
    for r in rows:
        print(f"{r['status']:<16}{_agree(r):>7}  {r['id']}")
        print(_fill(r["sentence"]))
        print(_fill("condition: " + r["condition"]))
        print(_fill("here: " + r["evidence"]))
        if r["records_differ"]:
            print(_fill("records that differ: " + "; ".join(r["records_differ"])))
        if r["gpu_runs"]:
            print(_fill("stored GPU runs: " + "; ".join(r["gpu_runs"])))
    print()
    print(textwrap.fill(core.summary(statuses) + ".", WIDTH, subsequent_indent="  "))
    print(textwrap.fill(f"agree: of the {len(found)} committed records, those that store "
                        "the claim's verdict, of those that store the claim.", WIDTH))
    errors = [r for r in rows if r["status"] == core.ERROR]
    if errors:
        print(textwrap.fill("Errors (a check raised, not a verdict on the claim): "
                            + ", ".join(r["id"] for r in errors) + ".", WIDTH,
                            subsequent_indent="  "))
    return failed
