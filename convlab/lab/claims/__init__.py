"""Claims that check themselves: every machine-dependent sentence of the book, checked here.

Each claim (:class:`~convlab.lab.claims.core.Claim`) is one sentence, the condition it
depends on, and a check that measures or inspects on the running machine and returns an
:class:`~convlab.lab.claims.core.Outcome`: ``holds``, ``does not hold``, ``inconclusive``
(a timed run could not resolve the effect the sentence needs,
:mod:`~convlab.lab.claims.resolve`), ``cannot run here`` (no CUDA, no such ISA) or
``error`` (the check raised), with its evidence. The
rows live in one table per topic (:mod:`~convlab.lab.claims.routing`,
:mod:`~convlab.lab.claims.bits`, ...); ``CLAIMS`` joins them. The types, the statuses and
the flag guard are in :mod:`~convlab.lab.claims.core`.

>>> from convlab.lab import claims
>>> print(claims.report(10))                        # doctest: +SKIP
ch10_slow_bits_across_threads: holds
  Slow2d stem 3->16 224^2, threads (1, 2, 4): all bit-identical
...
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from convlab.lab.claims import (
    bits,
    cuda,
    gpu_runs,
    inductor,
    memory,
    onednn,
    perf,
    routing,
    subnormal,
    transposed,
)
from convlab.lab.claims.core import (
    CHAPTERS,
    Claim,
    Outcome,
    check_chapter,
    fresh,
    matrix_rows,
    report_text,
    run,
    select,
)

__all__ = ["CLAIMS", "chapters", "evaluate", "matrix", "record_outcomes", "report"]

# Every table's rows, in book order (intro, then chapters 1..13), table order within one.
CLAIMS: tuple[Claim, ...] = tuple(sorted(
    routing.CLAIMS + subnormal.CLAIMS + onednn.CLAIMS + perf.CLAIMS + memory.CLAIMS
    + inductor.CLAIMS + bits.CLAIMS + transposed.CLAIMS + cuda.CLAIMS,
    key=lambda c: CHAPTERS.index(c.chapter)))


def chapters() -> list[int | str]:
    """The chapters that have claims, in book order."""
    have = {c.chapter for c in CLAIMS}
    return [c for c in CHAPTERS if c in have]


def evaluate(chapter: int | str | None = None, ids: Iterable[str] | None = None
             ) -> list[Outcome]:
    """Run the claims of ``chapter`` (None: all) with ids in ``ids`` (None: all), in table
    order. Each check runs with the process flags kept (threads, backend flags, denormal
    flush, deterministic mode, torch's RNG); one that raises gives ``error`` with the
    exception's type and message as evidence. Raises ValueError for an unknown chapter or
    id."""
    chosen = select(CLAIMS, chapter, ids)
    fresh()
    try:
        return [run(c) for c in chosen]
    finally:
        fresh()


def report(chapter: int | str) -> str:
    """The text of a chapter's live-claims cell: each claim's status and evidence, then
    the counts of each status and the claims that do not hold, are inconclusive, cannot
    run or err here (lines <= 72 characters); without CUDA, then the
    chapter's CUDA claims as a GPU checked them (:mod:`~convlab.lab.claims.gpu_runs`)."""
    key = check_chapter(chapter)
    outcomes = evaluate(key)
    if not outcomes:
        return f"No claims for chapter {key}."
    what = "Introduction" if key == "intro" else f"Chapter {key}"
    text = report_text(outcomes, what)
    stored = "" if torch.cuda.is_available() else gpu_runs.report(key)
    return f"{text}\n\n{stored}" if stored else text


def matrix(records: Sequence[Any], chapter: int | str | None
           ) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a claims x records table for ``chapter`` (None: all) from the
    outcomes the records store (their ``claims`` section): ``yes`` (holds), ``no`` (does
    not hold), ``?`` (inconclusive), ``n/a`` (cannot run there), ``err`` (the check
    raised), ``-`` (no stored outcome)."""
    return matrix_rows(select(CLAIMS, chapter), records)


def record_outcomes(quick: bool = False) -> dict[str, dict]:
    """The ``claims`` section of a record: claim id -> ``{"status", "evidence", "detail"}``
    for every claim, run in this process. ``quick`` is accepted like every section's; the
    checks are already small, so it changes nothing."""
    del quick
    return {o.claim_id: {"status": o.status, "evidence": o.evidence, "detail": o.detail}
            for o in evaluate()}

