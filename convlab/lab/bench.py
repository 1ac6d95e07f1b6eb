"""Benchmarks: every convolution path side by side (``convlab bench``).

Layers and paths come from :mod:`convlab.lab.paths`; for each layer every (path, pass) that
applies is timed in one :func:`convlab.lab.timing.interleaved` run (rounds of
``blocked_autorange`` that alternate between the candidates), so the ratios between paths
of a layer are per-round ratios of calls that ran side by side.

Every result keeps the median and the spread across rounds. Whenever ``native`` is timed,
its *A/A twin* is timed too: the same ATen backend reached by forcing it (``mkldnn`` when
ATen picks oneDNN, ``slow`` when it picks an im2col kernel). The two run the same kernel,
so their gap is the run's noise band; a difference between paths means something only
outside it. NumPy's BLAS gets the same thread count as torch (``threadpoolctl``).

Columns besides the time: GFLOP/s (``convlab.lab.paths.FLOP_FORMULA``), GB/s against the
bytes a pass must move (:func:`convlab.lab.paths.min_bytes`, the honest yardstick of thin
layers such as depthwise), the ratio to the fastest native path and to a square GEMM of
equal FLOPs, and two memory measures (:mod:`convlab.lab.profiling`):

* ``mem_alloc_mb``: the peak of torch's allocator above the start during one call (CPU:
  ``torch.profiler`` with ``profile_memory`` plus tracemalloc for NumPy; memory a library
  allocates on its own is not seen; CUDA: ``torch.cuda.max_memory_allocated``);
* ``mem_rss_mb``: the rise of the process's resident-set high-water mark (Linux CPU).

>>> report = benchmark(["resnet14"], paths=["native", "reference"],
...                    passes=["backward"], memory=False)          # doctest: +SKIP
>>> print(format_table(report.results))                         # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path as FilePath

import numpy as np
import torch

from convlab.lab import paths as registry
from convlab.lab.paths import (  # noqa: F401 - the public names bench has always had
    FLOP_FORMULA,
    PASSES,
    QUICK_LAYERS,
    RESNET_LAYERS,
    SUITE,
    Layer,
    NotApplicable,
    flops,
    min_bytes,
    suite_layers,
)
from convlab.lab.profiling import (  # noqa: F401 - notebooks use these as bench.*
    OneDNNCall,
    OpTime,
    alloc_peak,
    measure_memory,
    onednn_trace,
    profile_ops,
    rss_peak,
)
from convlab.lab.timing import Ratio, Timing, blas_threads, interleaved, noise_band, ratio

PATHS: tuple[str, ...] = registry.PATH_NAMES
NATIVE_PATHS: tuple[str, ...] = tuple(p.name for p in registry.PATHS if p.is_aten)
COLUMNS: tuple[str, ...] = (
    "layer", "path", "pass", "backend", "device", "dtype", "threads", "time_ms", "q1_ms",
    "q3_ms", "min_ms", "max_ms", "rounds", "calls_per_round", "round_spread", "flops",
    "gflops", "min_bytes", "gbytes_s", "ratio_native", "ratio_native_low",
    "ratio_native_high", "aa_band", "gemm_gflops", "ratio_gemm", "mem_alloc_mb",
    "mem_rss_mb", "shape",
)
MEMORY_METHOD = (
    "mem_alloc_mb: peak above the start of torch's allocator during one call (CPU: "
    "torch.profiler profile_memory plus tracemalloc for NumPy; memory allocated outside "
    "torch's allocator is not seen; CUDA: torch.cuda.max_memory_allocated). mem_rss_mb: rise "
    "of the process RSS high-water mark (Linux /proc/self/clear_refs + VmHWM), CPU only"
)
MB = 2.0**20
# NumPy's OpenBLAS threads spin for a while after each call and take the cores torch's
# OpenMP threads need next; a pause after each NumPy block lets them sleep first.
BLAS_SETTLE_S = 0.1
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


# ---------------------------------------------------------------------------- arguments


def max_threads() -> int:
    """The largest ``threads`` value accepted: four times the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return 4 * cpus


def check_threads(threads: object) -> int:
    """``threads`` as a positive int no larger than :func:`max_threads` (else ValueError)."""
    limit = max_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= limit:
        raise ValueError(f"threads must be an int from 1 to {limit}, got {threads!r}")
    return threads


def check_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a usable ``cpu`` or ``cuda`` torch.device (default: CUDA if present)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu or cuda, got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: CUDA was requested but torch.cuda.is_available() is False")
    return dev


def _check_choice(values: Sequence[str] | None, allowed: Sequence[str], name: str) -> list[str]:
    if values is None:
        return list(allowed)
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of names, got the string {values!r}")
    if not values:
        raise ValueError(f"{name}: empty list; choose from {', '.join(allowed)}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(
            f"{name}: unknown name(s) {', '.join(map(repr, bad))}; choose from "
            f"{', '.join(allowed)}"
        )
    return list(dict.fromkeys(values))


def _resolve_layers(layers: Sequence[str | Layer] | None) -> list[Layer]:
    if layers is None:
        return list(SUITE)
    if isinstance(layers, str | Layer):
        raise TypeError("layers must be a sequence of names or Layer objects")
    if not layers:
        raise ValueError(f"layers: empty list; choose from {', '.join(l.name for l in SUITE)}")
    out = []
    for item in layers:
        if isinstance(item, Layer):
            item.params  # noqa: B018 - validates the layer now, with a clear error
            out.append(item)
        else:
            out += suite_layers([item])
    return out


# ------------------------------------------------------------------------------ running


@dataclass
class _Task:
    path: registry.Path
    pass_: str
    fn: Callable[[], object]
    backend: str

    @property
    def key(self) -> str:
        return f"{self.path.name}:{self.pass_}"


def _tasks(layer: Layer, names: Sequence[str], passes: Sequence[str], device: torch.device,
           dtype: torch.dtype, skipped: list[Skip]) -> list[_Task]:
    tensors = layer.tensors(device, dtype)
    names = list(names)
    tasks: list[_Task] = []
    while names:
        path = registry.get_path(names.pop(0))
        try:
            backend = path.check(layer, device, dtype)
        except NotApplicable as why:
            skipped.append(Skip(layer.name, path.name, str(why)))
            continue
        if path.name == "native":  # its A/A twin runs the same kernel, forced
            twin = registry.TWIN_OF_BACKEND.get(backend)
            if twin and twin not in names and not any(t.path.name == twin for t in tasks):
                names.insert(0, twin)
        fns = path.runners(layer, tensors, hold=False)
        tasks += [_Task(path, ps, fns[ps], backend) for ps in passes]
    return tasks


def _gemm_fn(flop_count: int, device: torch.device,
             dtype: torch.dtype) -> tuple[Callable[[], object], int]:
    """A square ``(m, m) @ (m, m)`` matmul with about ``flop_count`` FLOPs; (fn, its flops)."""
    m = max(1, round((flop_count / 2) ** (1 / 3)))
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(m, m, generator=gen).to(device=device, dtype=dtype)
    bm = torch.randn(m, m, generator=gen).to(device=device, dtype=dtype)
    return (lambda: torch.mm(a, bm)), 2 * m**3


@contextlib.contextmanager
def _settled(path: registry.Path) -> Iterator[None]:
    """Hold ``path``'s backend; after a NumPy block, let BLAS's spinning threads sleep."""
    with path.held():
        yield
    if path.name == "numpy_ref":
        time.sleep(BLAS_SETTLE_S)


def environment(device: torch.device | str = "cpu", threads: int | None = None) -> dict:
    """Versions and settings that a benchmark result depends on."""
    device = torch.device(device)
    config = torch.__config__.show()
    onednn = re.search(r"(?:MKL-DNN|oneDNN) v([\w.]+)", config)
    env: dict[str, object] = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn": onednn.group(1) if onednn else None,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["cudnn_benchmark"] = torch.backends.cudnn.benchmark
        env["allow_tf32"] = torch.backends.cudnn.allow_tf32
    return env


def benchmark(
    layers: Sequence[str | Layer] | None = None,
    paths: Sequence[str] | None = None,
    passes: Sequence[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    rounds: int = 5,
    min_run_time: float = 0.1,
    memory: bool = True,
    gemm: bool = True,
    progress: Callable[[str], None] | None = None,
    report: Report | None = None,
) -> Report:
    """Time ``paths`` x ``passes`` on ``layers``, layer by layer; return a :class:`Report`.

    ``layers``: suite names or :class:`~convlab.lab.paths.Layer` objects (default: the suite);
    ``paths``/``passes``: subsets of ``PATHS``/``PASSES`` (``native`` brings its
    A/A twin); ``device`` defaults to CUDA when available; ``threads`` to torch's current
    count (NumPy's BLAS gets the same). Each layer is one :func:`convlab.lab.timing.interleaved`
    run of ``rounds`` x ``blocked_autorange(min_run_time)``. ``memory=False`` skips the
    memory measurements, ``gemm=False`` the GEMM yardstick. Results are appended to
    ``report`` as each layer finishes, so an interrupted run keeps what it finished.
    """
    chosen_layers = _resolve_layers(layers)
    chosen_paths = _check_choice(paths, PATHS, "paths")
    chosen_passes = _check_choice(passes, PASSES, "passes")
    dev = check_device(device)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    threads = check_threads(torch.get_num_threads() if threads is None else threads)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if not min_run_time > 0:
        raise ValueError(f"min_run_time must be positive, got {min_run_time!r}")

    report = Report() if report is None else report
    report.meta.update(environment(dev, threads))
    report.meta.update(
        rounds=rounds, min_run_time=min_run_time, dtype=str(dtype).replace("torch.", ""),
        flop_formula=FLOP_FORMULA, memory_method=MEMORY_METHOD,
    )
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with blas_threads(threads) as blas:
            report.meta["numpy_blas_threads"] = blas
            for index, layer in enumerate(chosen_layers, 1):
                tag = f"[{index}/{len(chosen_layers)}] {layer.name}"
                results = _bench_layer(layer, chosen_paths, chosen_passes, dev, dtype,
                                       threads, rounds, min_run_time, memory, gemm,
                                       report.skipped, progress, tag)
                _fill_ratios(results)
                report.results += results
    finally:
        torch.set_num_threads(saved_threads)
    return report


def run(layers: Sequence[str | Layer] | None = None, **kwargs: object) -> list[Result]:
    """:func:`benchmark`'s results only.

    >>> rs = run([Layer("tiny", (2, 3, 8, 8), (4, 3, 3, 3))], paths=["reference"],
    ...          passes=["backward"], rounds=1, min_run_time=0.01, memory=False)
    >>> [(r.path, r.pass_) for r in rs]
    [('reference', 'backward')]
    """
    return benchmark(layers, **kwargs).results  # type: ignore[arg-type]


def _bench_layer(
    layer: Layer, paths: Sequence[str], passes: Sequence[str], device: torch.device,
    dtype: torch.dtype, threads: int, rounds: int, min_run_time: float, memory: bool,
    gemm: bool, skipped: list[Skip], progress: Callable[[str], None] | None, tag: str,
) -> list[Result]:
    tasks = _tasks(layer, paths, passes, device, dtype, skipped)
    fns = {t.key: t.fn for t in tasks}
    around = {t.key: (lambda p=t.path: _settled(p)) for t in tasks}
    gemms: dict[int, int] = {}
    if gemm:
        for count in sorted({flops(layer, t.pass_) for t in tasks}):
            fn, gemm_flops = _gemm_fn(count, device, dtype)
            fns[f"gemm:{count}"] = fn
            gemms[count] = gemm_flops
    if progress is not None:
        progress(f"{tag} | {len(fns)} candidates x {rounds} rounds")
    timings = interleaved(fns, rounds=rounds, min_run_time=min_run_time, threads=threads,
                          around=around)
    itemsize = torch.empty((), dtype=dtype).element_size()
    results = []
    for task in tasks:
        t = timings[task.key]
        count = flops(layer, task.pass_)
        q1, q3 = t.quartiles
        moved = min_bytes(layer, task.pass_, itemsize)
        res = Result(
            layer=layer.name, path=task.path.name, pass_=task.pass_, backend=task.backend,
            device=device.type, dtype=str(dtype).replace("torch.", ""), threads=threads,
            time_ms=t.median * 1e3, q1_ms=q1 * 1e3, q3_ms=q3 * 1e3,
            min_ms=min(t.rounds) * 1e3, max_ms=max(t.rounds) * 1e3, rounds=len(t.rounds),
            calls_per_round=t.calls_per_round, round_spread=t.spread, flops=count,
            gflops=count / t.median / 1e9, min_bytes=moved, gbytes_s=moved / t.median / 1e9,
            shape=layer.describe(), timing=t,
        )
        if count in gemms:
            res.gemm_gflops = gemms[count] / timings[f"gemm:{count}"].median / 1e9
            res.ratio_gemm = res.gemm_gflops / res.gflops
        if memory:
            if progress is not None:
                progress(f"{tag} | memory {task.key}")
            with _settled(task.path):
                res.mem_alloc_mb = alloc_peak(task.fn, device) / MB
                res.mem_rss_mb = rss_peak(task.fn, device) / MB
        results.append(res)
    return results


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


def aa_band(rows: Sequence[Result]) -> float:
    """Noise band of one (layer, pass): the relative gap between the medians of its A/A pair
    (:func:`convlab.lab.timing.noise_band`; NaN when the pair did not run)."""
    pair = aa_pair(rows)
    if pair is None:
        return math.nan
    return noise_band(pair[0].timing, pair[1].timing)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- comparisons


@dataclass
class Comparison:
    """A measured ratio of two paths on one layer and pass, with its spread and noise band."""

    label: str
    layer: str
    pass_: str
    ratio: Ratio
    band: float

    @property
    def verdict(self) -> str:
        """``slower``/``faster`` when the medians differ by more than the A/A band,
        ``within noise`` otherwise, ``?`` when the run had no A/A pair."""
        if math.isnan(self.band):
            return "?"
        if self.ratio.median > 1 + self.band:
            return "slower"
        if self.ratio.median < 1 / (1 + self.band):
            return "faster"
        return "within noise"

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


def run_band(results: Sequence[Result], pass_: str) -> float:
    """The run's noise band for ``pass_``: the largest A/A band over its layers (NaN if none).

    One A/A pair's gap is itself a noisy estimate; pooling over the layers of one run
    keeps a lucky 0 % from turning noise into a verdict.
    """
    bands = [aa_band([r for r in results if (r.layer, r.pass_) == (layer, pass_)])
             for layer in dict.fromkeys(r.layer for r in results)]
    bands = [b for b in bands if not math.isnan(b)]
    return max(bands) if bands else math.nan


def comparisons(results: Sequence[Result]) -> list[Comparison]:
    """The standard ratios of a run (``COMPARISONS``), per layer, where both sides ran,
    each with the run's noise band for its pass (:func:`run_band`)."""
    out = []
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
            out.append(Comparison(label, layer, pass_, ratio(mine.timing, other.timing),
                                  run_band(results, pass_)))
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
            lines.append(f"warning: {r.layer}/{r.pass_}: the A/A pair's medians differ by "
                         f"{r.aa_band:.0%} (> {AA_WARN:.0%}); differences smaller than "
                         "that are noise")
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
             "verdict": c.verdict}
            for c in comparisons(report.results)
        ],
    }
    json_path.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    return csv_path, json_path


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Rows of a ``bench.csv`` as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab bench``: see :func:`convlab.cli.bench_main`."""
    from convlab.cli import bench_main

    return bench_main(argv)
