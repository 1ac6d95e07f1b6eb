"""The claim and outcome types, the process-flag guard, and the report and matrix texts.

A claim is one sentence of the book that depends on the machine (ISA, BLAS, threads,
version, GPU), with a check that measures or inspects it here and returns an
:class:`Outcome`: ``holds``, ``does not hold``, ``inconclusive`` (a timed run could not
resolve the effect the sentence needs), ``cannot run here`` (a stated condition is not
met: no CUDA, no such ISA) or ``error`` (the check raised). The checks live in
the sibling modules, one table of :class:`Claim` rows each; :mod:`convlab.lab.claims` joins
the tables.
"""

from __future__ import annotations

import json
import textwrap
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

HOLDS = "holds"
FAILS = "does not hold"
INCONCLUSIVE = "inconclusive"
CANNOT = "cannot run here"
ERROR = "error"
STATUSES = (HOLDS, FAILS, INCONCLUSIVE, CANNOT, ERROR)
# Statuses that make ``convlab claims --strict`` exit 1.
STRICT_FAILURES = (FAILS, ERROR)
CHAPTERS: tuple[int | str, ...] = ("intro", *range(1, 14))
WIDTH = 72
# One cell of the claims x records matrix per status (narrow, for phones).
SHORT = {HOLDS: "yes", FAILS: "no", INCONCLUSIVE: "?", CANNOT: "n/a", ERROR: "err"}
MISSING = "-"


@dataclass(frozen=True)
class Outcome:
    """What one check found here: ``status`` (one of ``STATUSES``), a one-line ``evidence``
    with the numbers, and ``detail`` (JSON-able measurements, for records)."""

    claim_id: str
    status: str
    evidence: str
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


@dataclass(frozen=True)
class Claim:
    """One checked sentence: ``id`` (snake_case, chapter prefix), ``chapter`` (1..13 or
    ``"intro"``), the ``sentence`` as the book states it, the ``condition`` it depends on,
    and ``check`` (no arguments; measures here and returns an :class:`Outcome`)."""

    id: str
    chapter: int | str
    sentence: str
    condition: str
    check: Callable[[], Outcome]


def holds(evidence: str, **detail: Any) -> Outcome:
    """A holding outcome (the claim id is filled in by :func:`run`)."""
    return Outcome("", HOLDS, evidence, detail)


def fails(evidence: str, **detail: Any) -> Outcome:
    """A failing outcome (the claim id is filled in by :func:`run`)."""
    return Outcome("", FAILS, evidence, detail)


def cannot(evidence: str, **detail: Any) -> Outcome:
    """A check that cannot run on this machine (no CUDA, no such ISA, ...)."""
    return Outcome("", CANNOT, evidence, detail)


def inconclusive(evidence: str, **detail: Any) -> Outcome:
    """A run that could not resolve the effect the sentence needs (noise, too few rounds)."""
    return Outcome("", INCONCLUSIVE, evidence, detail)


def decided(status: str, evidence: str, **detail: Any) -> Outcome:
    """An outcome of a ``status`` computed by the check (e.g. by
    :func:`convlab.lab.claims.resolve.judge`)."""
    return Outcome("", status, evidence, detail)


def verdict(ok: bool, evidence: str, **detail: Any) -> Outcome:
    """:func:`holds` if ``ok`` else :func:`fails`."""
    return (holds if ok else fails)(evidence, **detail)


def check_chapter(chapter: object) -> int | str:
    """``chapter`` as a chapter key (``3``, ``"3"`` or ``"intro"``); TypeError for a
    non-int non-str, ValueError for an unknown chapter."""
    if isinstance(chapter, bool) or not isinstance(chapter, int | str):
        raise TypeError(f"chapter must be an int 1..13 or 'intro', got {chapter!r}")
    if isinstance(chapter, str) and chapter.strip().isdigit():
        chapter = int(chapter)
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be 1..13 or 'intro', got {chapter!r}")
    return chapter  # type: ignore[return-value]


# ------------------------------------------------------------------ shared measurements

_MEMO: dict[str, Any] = {}


def shared(key: str, measure: Callable[[], Any]) -> Any:
    """``measure()``, run once per :func:`fresh` period and shared by the checks that read
    the same measurement (e.g. one timing run behind three subnormal claims)."""
    if key not in _MEMO:
        _MEMO[key] = measure()
    return _MEMO[key]


def fresh() -> None:
    """Forget the shared measurements (each ``evaluate`` measures afresh)."""
    _MEMO.clear()


# ------------------------------------------------------------------ process flags


def _flush_denormal_on() -> bool:
    """Whether this thread flushes subnormals (observed: a subnormal times 1 gives 0)."""
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    return bool((tiny * 1.0).item() == 0.0)


def flags() -> dict[str, Any]:
    """Every process-wide setting a check might touch, as found now."""
    b = torch.backends
    found: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "mkldnn": b.mkldnn.enabled,
        "nnpack": torch._C._get_nnpack_enabled(),
        "cudnn": b.cudnn.enabled,
        "cudnn_benchmark": b.cudnn.benchmark,
        "cudnn_deterministic": b.cudnn.deterministic,
        "cudnn_tf32": b.cudnn.allow_tf32,
        "matmul_tf32": b.cuda.matmul.allow_tf32,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "flush_denormal": _flush_denormal_on(),
        "grad_enabled": torch.is_grad_enabled(),
        "default_dtype": torch.get_default_dtype(),
    }
    if hasattr(b.mkldnn, "deterministic"):
        found["mkldnn_deterministic"] = b.mkldnn.deterministic
    return found


def restore(saved: Mapping[str, Any]) -> None:
    """Set every flag of :func:`flags` back to ``saved``."""
    b = torch.backends
    if torch.get_num_threads() != saved["threads"]:
        torch.set_num_threads(saved["threads"])
    b.mkldnn.enabled = saved["mkldnn"]
    torch._C._set_nnpack_enabled(saved["nnpack"])
    b.cudnn.enabled = saved["cudnn"]
    b.cudnn.benchmark = saved["cudnn_benchmark"]
    b.cudnn.deterministic = saved["cudnn_deterministic"]
    b.cudnn.allow_tf32 = saved["cudnn_tf32"]
    b.cuda.matmul.allow_tf32 = saved["matmul_tf32"]
    torch.use_deterministic_algorithms(saved["deterministic"],
                                       warn_only=saved["deterministic_warn_only"])
    if _flush_denormal_on() != saved["flush_denormal"]:
        torch.set_flush_denormal(saved["flush_denormal"])
    torch.set_grad_enabled(saved["grad_enabled"])
    torch.set_default_dtype(saved["default_dtype"])
    if "mkldnn_deterministic" in saved:
        b.mkldnn.deterministic = saved["mkldnn_deterministic"]


@contextmanager
def kept_flags() -> Iterator[dict[str, Any]]:
    """Run a block and put every flag of :func:`flags` (and torch's global RNG) back."""
    saved = flags()
    rng = torch.random.get_rng_state()
    try:
        yield saved
    finally:
        restore(saved)
        torch.random.set_rng_state(rng)


def _jsonable(detail: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(detail), default=str))


def run(claim: Claim) -> Outcome:
    """Run one claim's check with the flags kept; an exception becomes an ``error``
    outcome whose evidence is its type and message (so one broken check stops nothing
    else, and is counted as broken, not as a condition of this machine)."""
    with kept_flags():
        try:
            out = claim.check()
            if not isinstance(out, Outcome):
                raise TypeError(f"check returned {type(out).__name__}, not an Outcome")
            return replace(out, claim_id=claim.id, detail=_jsonable(out.detail))
        except Exception as err:  # noqa: BLE001 - one failing check must not stop the others
            first = (str(err).strip().splitlines() or [""])[0][:200]
            where = traceback.extract_tb(err.__traceback__)[-1]
            return Outcome(claim.id, ERROR, f"check raised {type(err).__name__}: {first}",
                           {"error": f"{type(err).__name__}: {first}",
                            "at": f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}"})


def select(claims: Sequence[Claim], chapter: object = None,
           ids: Iterable[str] | None = None) -> list[Claim]:
    """The claims of ``chapter`` (None: all) whose id is in ``ids`` (None: all)."""
    chosen = list(claims)
    if chapter is not None:
        key = check_chapter(chapter)
        chosen = [c for c in chosen if c.chapter == key]
    if ids is not None:
        if isinstance(ids, str):
            raise TypeError("ids must be an iterable of claim ids, not a str")
        wanted = list(ids)
        known = {c.id for c in claims}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise ValueError(f"ids: unknown claim ids {unknown}")
        chosen = [c for c in chosen if c.id in set(wanted)]
    return chosen


# ------------------------------------------------------------------ texts


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent) or [indent]


_WORDS = {HOLDS: ("holds", "hold"), FAILS: ("does not hold", "do not hold"),
          INCONCLUSIVE: ("inconclusive", "inconclusive"),
          CANNOT: ("cannot run here", "cannot run here"), ERROR: ("error", "errors")}
# The lists below a report: claims of these statuses, by name.
_LISTED = {FAILS: "Do not hold here", INCONCLUSIVE: "Inconclusive here",
           CANNOT: "Cannot run here", ERROR: "Errors (the check raised)"}


def summary(statuses: Iterable[str]) -> str:
    """One line counting every status, in ``STATUSES`` order: ``31 hold, 2 do not hold,
    5 inconclusive, 7 cannot run here, 1 error``."""
    found = list(statuses)
    parts = []
    for status in STATUSES:
        n = found.count(status)
        parts.append(f"{n} {_WORDS[status][0] if n == 1 else _WORDS[status][1]}")
    return ", ".join(parts)


def report_text(outcomes: Sequence[Outcome], what: str) -> str:
    """One line per claim (id: status), its evidence wrapped below it, then the counts
    (:func:`summary`) and the claims of each status but ``holds`` by name. Lines are at
    most ``WIDTH`` characters."""
    lines: list[str] = []
    for o in outcomes:
        lines += textwrap.wrap(f"{o.claim_id}: {o.status}", WIDTH, subsequent_indent="    ")
        lines += _wrap(o.evidence)
    lines.append("")
    lines += textwrap.wrap(f"{what}: {summary(o.status for o in outcomes)}.", WIDTH,
                           subsequent_indent="  ")
    for status, label in _LISTED.items():
        named = [o.claim_id for o in outcomes if o.status == status]
        if named:
            lines += textwrap.wrap(f"{label}: " + ", ".join(named) + ".", WIDTH,
                                   subsequent_indent="  ")
    return "\n".join(lines)


def stored_status(stored: object) -> str | None:
    """The status of one stored outcome (a record's or a GPU run's), one of ``STATUSES``;
    None where it stores none we know. Records older than the inconclusive and error
    states stored holds / does not hold / cannot run here, read as they are (a raising
    check was folded into the last then: it cannot be told apart, and stays as stored)."""
    status = stored.get("status") if isinstance(stored, Mapping) else None
    return status if status in STATUSES else None


def stored_outcomes(record: Any) -> Mapping[str, Any]:
    """The claim outcomes a record stores (its ``claims`` section), or ``{}``.

    ``record`` is a :class:`convlab.lab.record.records.Record` or its JSON as a mapping."""
    sections = record.get("sections", {}) if isinstance(record, Mapping) else record.sections
    found = sections.get("claims") or {}
    if not isinstance(found, Mapping) or "error" in found:
        return {}
    return found.get("outcomes", found) if isinstance(found.get("outcomes"), Mapping) else found


def record_label(record: Any) -> str:
    """A record's column header (``AMD EPYC x2, AVX2``)."""
    if isinstance(record, Mapping):
        fp = record.get("fingerprint", {})
        return f"{fp.get('cpu_model', '?')}, {record.get('isa', '?')}"
    return str(record.label)


def matrix_rows(claims: Sequence[Claim], records: Sequence[Any]
                ) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a claims x records table: ``SHORT`` of each stored outcome
    (``yes``/``no``/``?``/``n/a``/``err``), ``-`` where a record has none."""
    stored = [stored_outcomes(r) for r in records]
    headers = ["claim", *(record_label(r) for r in records)]
    rows = []
    for c in claims:
        cells = [SHORT.get(stored_status(outcomes.get(c.id)) or "", MISSING)
                 for outcomes in stored]
        rows.append([c.id, *cells])
    return headers, rows


def agreeing(outcome: Outcome, records: Sequence[Any]) -> tuple[list[str], list[str]]:
    """Labels of the records whose stored outcome of this claim has the same status, and
    of those that stored another status (records without one are in neither)."""
    same, other = [], []
    for r in records:
        status = stored_status(stored_outcomes(r).get(outcome.claim_id))
        if status is not None:
            (same if status == outcome.status else other).append(record_label(r))
    return same, other
