"""Benchmarks: every convolution path side by side (``convlab bench``).

Layers and paths come from :mod:`convlab.lab.paths`; for each layer every (path, pass) that
applies is timed in one :func:`convlab.lab.method.timing.interleaved` run (rounds of at least
20 calls per candidate, in a shuffled order per round), so the ratios between paths of a
layer are per-round ratios of calls that ran side by side.

Every result keeps the median and the spread across rounds. Whenever ``native`` is timed,
its *A/A twin* is timed too: the same ATen backend reached by forcing it (``mkldnn`` when
ATen picks oneDNN, ``slow`` when it picks an im2col kernel). The two run the same kernel,
so their per-round ratios, pooled over every pair of the run, give its noise band; a
difference between paths is called only when the sign test of
:func:`convlab.lab.method.timing.verdict_of` puts it outside that band. Results, comparisons and
files: :mod:`convlab.lab.bench_report`; the ``suite`` section of the records:
:mod:`convlab.lab.sections.suite`. NumPy's BLAS gets the same thread count as torch
(``threadpoolctl``).

Columns besides the time: GFLOP/s (``convlab.lab.paths.FLOP_FORMULA``), GB/s against the
bytes a pass must move (:func:`convlab.lab.paths.min_bytes`, the honest yardstick of thin
layers such as depthwise), the ratio to the fastest native path and to a square GEMM of
equal FLOPs, and two memory measures (:mod:`convlab.lab.method.profiling`):

* ``mem_alloc_mb``: the peak of torch's allocator above the start during one call (CPU:
  ``torch.profiler`` with ``profile_memory`` plus tracemalloc for NumPy; memory a library
  allocates on its own is not seen; CUDA: ``torch.cuda.max_memory_allocated``);
* ``mem_rss_mb``: the rise of the process's resident-set high-water mark (Linux CPU).

>>> report = benchmark(["resnet14"], paths=["native", "reference"],
...                    passes=["backward"], memory=False)          # doctest: +SKIP
>>> print(bench_report.format_table(report.results))                       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from convlab.lab import paths as registry
from convlab.lab.bench_report import MB, Report, Result, Skip, _fill_ratios
from convlab.lab.method.profiling import alloc_peak, rss_peak
from convlab.lab.method.timing import blas_threads, check_run_time, interleaved
from convlab.lab.paths import (
    FLOP_FORMULA,
    PASSES,
    SUITE,
    Layer,
    NotApplicable,
    flops,
    min_bytes,
    suite_layers,
)

MEMORY_METHOD = (
    "mem_alloc_mb: peak above the start of torch's allocator during one call (CPU: "
    "torch.profiler profile_memory plus tracemalloc for NumPy; memory allocated outside "
    "torch's allocator is not seen; CUDA: torch.cuda.max_memory_allocated). mem_rss_mb: rise "
    "of the process RSS high-water mark (Linux /proc/self/clear_refs + VmHWM), CPU only"
)
# NumPy's OpenBLAS threads spin for a while after each call and take the cores torch's
# OpenMP threads need next; a pause after each NumPy block lets them sleep first.
BLAS_SETTLE_S = 0.1
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
        name = names.pop(0)
        path = (registry.repeat_path(name) if name in registry.AA_REPEATS
                else registry.get_path(name))
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
    rounds: int = 7,
    min_run_time: float = 0.1,
    memory: bool = True,
    gemm: bool = True,
    progress: Callable[[str], None] | None = None,
    report: Report | None = None,
    min_calls: int = 20,
    repeats: Sequence[str] | None = None,
) -> Report:
    """Time ``paths`` x ``passes`` on ``layers``, layer by layer.

    Returns a :class:`~convlab.lab.bench_report.Report`.

    ``layers``: suite names or :class:`~convlab.lab.paths.Layer` objects (default: the suite);
    ``paths``/``passes``: subsets of ``PATH_NAMES``/``PASSES`` of :mod:`convlab.lab.paths`
    (``native`` brings its A/A twin); ``device`` defaults to CUDA when available;
    ``threads`` to torch's current count (NumPy's BLAS gets the same). Each layer is one
    :func:`convlab.lab.method.timing.interleaved` run of ``rounds`` rounds of at least
    ``min_calls`` calls and ``min_run_time`` seconds per candidate
    (``convlab.lab.method.timing.MIN_ROUNDS`` rounds at least for a verdict; ``min_run_time`` at
    most ``convlab.lab.method.timing.MAX_RUN_TIME``). ``memory=False`` skips the memory
    measurements, ``gemm=False`` the GEMM yardstick. Results are appended to
    ``report`` as each layer finishes, so an interrupted run keeps what it finished.
    ``repeats`` (names of ``convlab.lab.paths.AA_REPEATS``, e.g. ``["slow_aa"]``) times
    those paths a second time in the same run: A/A pairs of their own.
    """
    chosen_layers = _resolve_layers(layers)
    chosen_paths = _check_choice(paths, registry.PATH_NAMES, "paths")
    if isinstance(repeats, str | bool) or not isinstance(repeats, Sequence | type(None)):
        raise TypeError(f"repeats must be a sequence of names, got {repeats!r}")
    bad = [r for r in repeats or () if r not in registry.AA_REPEATS
           or registry.AA_REPEATS[r] not in chosen_paths]
    if bad:
        raise ValueError(f"repeats: {', '.join(map(repr, bad))} must name a repeat of "
                         f"{', '.join(registry.AA_REPEATS)} whose path is in paths")
    chosen_paths += list(repeats or ())
    chosen_passes = _check_choice(passes, PASSES, "passes")
    dev = check_device(device)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    threads = check_threads(torch.get_num_threads() if threads is None else threads)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    check_run_time(min_run_time)

    report = Report() if report is None else report
    report.meta.update(environment(dev, threads))
    report.meta.update(
        rounds=rounds, min_run_time=min_run_time, min_calls=min_calls,
        dtype=str(dtype).replace("torch.", ""),
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
                                       report.skipped, progress, tag, min_calls=min_calls)
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
    min_calls: int = 20,
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
                          around=around, min_calls=min_calls)
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

