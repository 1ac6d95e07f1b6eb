"""The results of ``convlab bench``: rows, A/A bands, comparisons with verdicts, tables, files.

:class:`Result` is one timed (layer, path, pass) with the spread of its rounds; a
:class:`Report` holds a run's results, skipped paths and metadata. The A/A pair of a
(layer, pass) is ``native`` and its forced twin (the same kernel reached two ways); a run's
noise band pools the per-round ratios of *every* A/A pair of the run
(:func:`convlab.lab.method.timing.aa_band`), and a comparison's verdict is the sign test of
:func:`convlab.lab.method.timing.verdict_of` against it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path as FilePath

from convlab.lab import paths as registry
from convlab.lab.method.timing import Ratio, Timing, Verdict, ratio, verdict_of
from convlab.lab.method.timing import aa_band as pooled_band

NATIVE_PATHS: tuple[str, ...] = tuple(p.name for p in registry.PATHS if p.is_aten)
COLUMNS: tuple[str, ...] = (
    "layer", "path", "pass", "backend", "device", "dtype", "threads", "time_ms", "q1_ms",
    "q3_ms", "min_ms", "max_ms", "rounds", "calls_per_round", "round_spread", "flops",
    "gflops", "min_bytes", "gbytes_s", "ratio_native", "ratio_native_low",
    "ratio_native_high", "aa_band", "gemm_gflops", "ratio_gemm", "mem_alloc_mb",
    "mem_rss_mb", "shape",
)
MB = 2.0**20
# Warn when an A/A pair differs, or one candidate's rounds spread, by more than this.
AA_WARN = 0.10
SPREAD_WARN = 0.25


@dataclass
class Result:
    """One timed (layer, path, pass); see ``COLUMNS`` and the module docstring."""

    layer: str
    path: str
    pass_: str
    backend: str
    device: str
    dtype: str
    threads: int
    time_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    rounds: int
    calls_per_round: int
    round_spread: float
    flops: int
    gflops: float
    min_bytes: int
    gbytes_s: float
    ratio_native: float = math.nan
    ratio_native_low: float = math.nan
    ratio_native_high: float = math.nan
    aa_band: float = math.nan
    gemm_gflops: float = math.nan
    ratio_gemm: float = math.nan
    mem_alloc_mb: float = math.nan
    mem_rss_mb: float = math.nan
    shape: str = ""
    timing: Timing | None = field(default=None, repr=False)

    def row(self) -> dict[str, object]:
        """The CSV/JSON row (``pass_`` spelled ``pass``)."""
        data = {k: v for k, v in asdict(self).items() if k != "timing"}
        data["pass"] = data.pop("pass_")
        return {key: data[key] for key in COLUMNS}


@dataclass
class Skip:
    """A (layer, path) that was not timed, and why."""

    layer: str
    path: str
    reason: str


@dataclass
class Report:
    """Everything one run produced: results, skipped paths, metadata."""

    results: list[Result] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)

def _fill_ratios(results: list[Result]) -> None:
    """Per-round ratio to the fastest native path, and the A/A band, per (layer, pass)."""
    for pass_ in dict.fromkeys(r.pass_ for r in results):
        rows = [r for r in results if r.pass_ == pass_]
        natives = [r for r in rows if r.path in NATIVE_PATHS]
        if not natives:
            continue
        fastest = min(natives, key=lambda r: r.time_ms)
        band = aa_band(rows)
        for r in rows:
            q = ratio(r.timing, fastest.timing)  # type: ignore[arg-type]
            r.ratio_native, r.ratio_native_low, r.ratio_native_high = q.median, q.low, q.high
            r.aa_band = band


def aa_pair(rows: Sequence[Result]) -> tuple[Result, Result] | None:
    """``(native, its forced twin)`` among the rows of one (layer, pass), if both ran."""
    native = next((r for r in rows if r.path == "native"), None)
    if native is None:
        return None
    twin = registry.TWIN_OF_BACKEND.get(native.backend)
    other = next((r for r in rows if r.path == twin and r.backend == native.backend), None)
    return None if other is None else (native, other)


def all_aa_pairs(rows: Sequence[Result]) -> list[tuple[Result, Result]]:
    """Every A/A pair among the rows of one (layer, pass): native and its forced twin
    (:func:`aa_pair`) and each repeated path with the path it repeats
    (``convlab.lab.paths.AA_REPEATS``), where both ran."""
    pairs = [] if (pair := aa_pair(rows)) is None else [pair]
    by_path = {r.path: r for r in rows}
    pairs += [(by_path[path], by_path[repeat]) for repeat, path in registry.AA_REPEATS.items()
              if repeat in by_path and path in by_path]
    return pairs


def aa_band(rows: Sequence[Result]) -> float:
    """Noise band of one (layer, pass) from its A/A pairs' per-round ratios alone
    (NaN when no pair ran). Verdicts use :func:`run_band`, pooled over every pair."""
    pairs = [(a.timing, b.timing) for a, b in all_aa_pairs(rows)
             if a.timing is not None and b.timing is not None]
    if not pairs:
        return math.nan
    return pooled_band(pairs)  # type: ignore[arg-type]


def aa_pairs(results: Sequence[Result], pass_: str | None = None) -> list[tuple[Timing, Timing]]:
    """The A/A pairs of a run (of one pass, or of every pass when ``pass_`` is None)."""
    keys = dict.fromkeys((r.layer, r.pass_) for r in results
                         if pass_ is None or r.pass_ == pass_)
    out = []
    for key in keys:
        for a, b in all_aa_pairs([r for r in results if (r.layer, r.pass_) == key]):
            if a.timing is not None and b.timing is not None:
                out.append((a.timing, b.timing))
    return out


def run_band(results: Sequence[Result], pass_: str | None = None) -> float:
    """The run's noise band: per-round ratios of every A/A pair of the run (of ``pass_``
    only, if given) pooled into :func:`convlab.lab.method.timing.aa_band` (NaN without pairs).

    One pair's gap is itself a noisy estimate; pooling keeps a lucky 0 % from turning
    noise into a verdict.
    """
    return pooled_band(aa_pairs(results, pass_))


# ---------------------------------------------------------------------------- comparisons


@dataclass
class Comparison:
    """A measured ratio of two paths on one layer and pass, with the run's noise band."""

    label: str
    layer: str
    pass_: str
    ratio: Ratio
    band: float

    @property
    def outcome(self) -> Verdict:
        """The sign test of the per-round ratios against the band
        (:func:`convlab.lab.method.timing.verdict_of`)."""
        return verdict_of(list(self.ratio.per_round) or [self.ratio.median], self.band)

    @property
    def verdict(self) -> str:
        """``slower``/``faster`` only when the per-round ratios lie beyond the band's edge
        in so many rounds that the sign test rejects noise; ``within noise`` otherwise;
        ``?`` when the run had no A/A pair."""
        return self.outcome.verdict

    def line(self) -> str:
        band = "n/a" if math.isnan(self.band) else f"{self.band:.0%}"
        return (f"{self.label:<34} {self.layer:<10} {self.pass_:<16} {self.ratio!s:<22} "
                f"A/A band {band:<5} {self.verdict}")


COMPARISONS: tuple[tuple[str, str, str | None, str], ...] = (
    # label, path, baseline path (None: the fastest native path), pass
    ("reference / fastest native", "reference", None, "backward"),
    ("thnn / aten slow (forward+backward)", "thnn", "slow", "forward_backward"),
    ("thnn / aten slow (backward only)", "thnn", "slow", "backward"),
    ("numpy_ref / aten slow", "numpy_ref", "slow", "backward"),
)


def comparisons(results: Sequence[Result]) -> list[Comparison]:
    """The standard ratios of a run (``COMPARISONS``), per layer, where both sides ran,
    each with the run's band pooled over every A/A pair (:func:`run_band`)."""
    out = []
    band = run_band(results)
    layers = list(dict.fromkeys(r.layer for r in results))
    table = {(r.layer, r.pass_, r.path): r for r in results}
    for label, path, base, pass_ in COMPARISONS:
        for layer in layers:
            mine = table.get((layer, pass_, path))
            rows = [r for r in results if (r.layer, r.pass_) == (layer, pass_)]
            if mine is None or mine.timing is None:
                continue
            if base is None:
                natives = [r for r in rows if r.path in NATIVE_PATHS]
                other = min(natives, key=lambda r: r.time_ms) if natives else None
            else:
                other = table.get((layer, pass_, base))
            if other is None or other.timing is None:
                continue
            out.append(Comparison(label, layer, pass_, ratio(mine.timing, other.timing), band))
    return out


def noise_warnings(results: Sequence[Result]) -> list[str]:
    """Warnings about A/A pairs above ``AA_WARN`` (one line each) and round spreads above
    ``SPREAD_WARN`` (one summary line naming the worst)."""
    lines = []
    seen = set()
    for r in results:
        key = (r.layer, r.pass_)
        if key not in seen and r.aa_band > AA_WARN:
            seen.add(key)
            lines.append(f"warning: {r.layer}/{r.pass_}: the A/A pair's per-round ratios "
                         f"reach {r.aa_band:.0%} (> {AA_WARN:.0%}); differences smaller "
                         "than that are noise")
    spread = [r for r in results if r.round_spread > SPREAD_WARN]
    if spread:
        worst = max(spread, key=lambda r: r.round_spread)
        lines.append(f"warning: {len(spread)} of {len(results)} timings have rounds spread "
                     f"over {SPREAD_WARN:.0%} of their median (worst {worst.layer}/"
                     f"{worst.pass_}/{worst.path}: {worst.round_spread:.0%}); the machine "
                     "is noisy, rerun on a quieter one or with more rounds")
    return lines


# --------------------------------------------------------------------------------- output


def format_table(results: Sequence[Result]) -> str:
    """A fixed-width text table: median, round range, rates, ratio to native, memory."""
    head = (f"{'layer':<10} {'pass':<16} {'path':<9} {'backend':<15} {'ms':>8} "
            f"{'range ms':>15} {'GFLOP/s':>8} {'GB/s':>6} {'x native':>8} {'alloc MB':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        spread = f"{r.min_ms:.3g}-{r.max_ms:.3g}"
        lines.append(
            f"{r.layer:<10} {r.pass_:<16} {r.path:<9} {r.backend:<15} {r.time_ms:>8.3g} "
            f"{spread:>15} {r.gflops:>8.1f} {r.gbytes_s:>6.1f} {r.ratio_native:>8.2f} "
            f"{r.mem_alloc_mb:>8.1f}"
        )
    return "\n".join(lines)


def check_out_dir(out_dir: str | os.PathLike[str]) -> FilePath:
    """Create ``out_dir`` if needed and prove it writable now (``ValueError`` if not)."""
    out = FilePath(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".convlab-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"out: cannot write to {str(out)!r} ({err.strerror or err})") from None
    return out


def write(report: Report, out_dir: str | os.PathLike[str]) -> tuple[FilePath, FilePath]:
    """Write ``bench.csv`` and ``bench.json`` into ``out_dir``; return their paths."""
    out = check_out_dir(out_dir)
    csv_path, json_path = out / "bench.csv", out / "bench.json"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in report.results:
            writer.writerow(r.row())

    def clean(value: object) -> object:  # JSON has no NaN
        return None if isinstance(value, float) and math.isnan(value) else value

    payload = {
        "meta": report.meta,
        "columns": list(COLUMNS),
        "results": [
            {**{k: clean(v) for k, v in r.row().items()},
             "rounds_ms": [s * 1e3 for s in r.timing.rounds] if r.timing else []}
            for r in report.results
        ],
        "skipped": [asdict(s) for s in report.skipped],
        "comparisons": [
            {"label": c.label, "layer": c.layer, "pass": c.pass_, "ratio": c.ratio.median,
             "low": c.ratio.low, "high": c.ratio.high, "aa_band": clean(c.band),
             "p_value": clean(c.outcome.p_value), "verdict": c.verdict}
            for c in comparisons(report.results)
        ],
    }
    json_path.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    return csv_path, json_path


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Rows of a ``bench.csv`` as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
