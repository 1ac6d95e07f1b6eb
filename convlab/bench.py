"""Benchmarks: every convolution path side by side (``convlab bench``).

For each layer of a suite and each *pass* (``forward``, ``backward_input``,
``backward_weight``, full ``backward``) this times every *path* that applies:

* ``native``: ``torch.ops.aten.convolution{,_backward}`` with ATen's own backend choice;
* ``mkldnn``, ``slow``, ``cudnn``: the same ops with the backend forced through
  :func:`convlab.native.use_backend` (``slow`` = oneDNN, NNPACK and cuDNN off);
* ``thnn``: :mod:`convlab.thnn` (2-d, no groups or dilation), its backward reading the
  ``finput`` columns saved by the forward, as THNN's autograd did;
* ``reference``: :mod:`convlab.reference` (torch ops, N-d, everything);
* ``numpy_ref``: :mod:`convlab.numpy_ref` im2col + GEMM (CPU only, not transposed).

Method. ``torch.utils.benchmark.Timer.blocked_autorange`` (it synchronises CUDA, and its
``num_threads`` fixes the thread count); every task of a layer is timed once per round,
the rounds interleave the paths, and a task keeps its best per-round median, because the
machine is shared and noisy. After each NumPy job the run pauses ``BLAS_SETTLE_S`` so
that OpenBLAS's spinning threads do not slow down the next torch job.

FLOPs are ``2 * MACs`` per GEMM-sized pass (``MACs`` from :meth:`~convlab.params.ConvParams.macs`):
forward, backward_input and backward_weight count ``2 * MACs`` each, the full backward
``4 * MACs`` (the bias sum is ignored). ``ratio_gemm`` divides a path's
time by that of a square GEMM of (nearly) the same FLOPs on the same device and dtype, the
practical peak; ``ratio_native`` divides by the fastest native path of the same pass.

Memory (extra bytes a single call needs above what was live before it, outputs included):

* ``mem_alloc_mb``: on CPU, the peak of torch's CPU allocator as recorded by
  ``torch.profiler`` (``profile_memory=True``; oneDNN's reordered copies go through it)
  plus the tracemalloc peak (NumPy's arrays and Python objects); memory that a library
  allocates without torch's allocator is *not* seen. On CUDA,
  ``torch.cuda.max_memory_allocated`` above the start.
* ``mem_rss_mb``: on Linux CPU runs, the rise of the process's resident-set high-water
  mark (``/proc/self/clear_refs`` reset, ``VmHWM``) after ``malloc_trim``: every buffer
  that touched memory, at page granularity; NaN elsewhere.

>>> results = run(["resnet14"], paths=["native", "reference"], passes=["backward"],
...               rounds=1, memory=False)                      # doctest: +SKIP
>>> print(format_table(results))                               # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.benchmark import Timer

from convlab import native, numpy_ref, reference, thnn
from convlab.params import ConvParams
from convlab.profiling import (  # noqa: F401 - notebooks and tests use these as bench.*
    OneDNNCall,
    OpTime,
    alloc_peak,
    measure_memory,
    onednn_trace,
    profile_ops,
    rss_peak,
)

_alloc_peak, _rss_peak = alloc_peak, rss_peak  # their names before convlab.profiling (tests)

PATHS: tuple[str, ...] = ("native", "mkldnn", "slow", "cudnn", "thnn", "reference", "numpy_ref")
NATIVE_PATHS: tuple[str, ...] = ("native", "mkldnn", "slow", "cudnn")
PASSES: tuple[str, ...] = ("forward", "backward_input", "backward_weight", "backward")
MASKS: dict[str, tuple[bool, bool, bool]] = {
    "backward_input": (True, False, False),
    "backward_weight": (False, True, False),
    "backward": (True, True, True),
}
COLUMNS: tuple[str, ...] = (
    "layer", "path", "pass", "backend", "device", "dtype", "threads", "time_ms",
    "round_spread", "flops", "gflops", "ratio_native", "gemm_gflops", "ratio_gemm",
    "mem_alloc_mb", "mem_rss_mb", "shape",
)
FLOP_FORMULA = (
    "flops = 2 * MACs for forward, backward_input and backward_weight; 4 * MACs for the full "
    "backward (bias sum ignored); MACs = ConvParams.macs(input_shape, weight_shape)"
)
MEMORY_METHOD = (
    "mem_alloc_mb: peak above the start of torch's allocator during one call (CPU: "
    "torch.profiler profile_memory plus tracemalloc for NumPy; memory allocated outside "
    "torch's allocator is not seen; CUDA: torch.cuda.max_memory_allocated). mem_rss_mb: rise "
    "of the process RSS high-water mark (Linux /proc/self/clear_refs + VmHWM, after "
    "malloc_trim), CPU only"
)
MB = 2.0**20
# NumPy's OpenBLAS worker threads busy-wait for a while after each call and steal the cores
# that torch's OpenMP threads need (measured here: the next native backward ran ~1.5-2x
# slower). Pausing this long after every NumPy job lets them go to sleep first.
BLAS_SETTLE_S = 0.1


@dataclass(frozen=True)
class Layer:
    """One benchmark layer: ``aten::convolution`` shapes and arguments.

    ``input_shape`` is ``[N, C_in, *S]``; ``weight_shape`` ``[C_out, C_in/groups, *k]``
    (``[C_in, C_out/groups, *k]`` when ``transposed``).

    >>> Layer("tiny", (2, 3, 8, 8), (4, 3, 3, 3), padding=1).output_shape
    (2, 4, 8, 8)
    """

    name: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] = 0
    dilation: int | tuple[int, ...] = 1
    transposed: bool = False
    output_padding: int | tuple[int, ...] = 0
    groups: int = 1
    note: str = ""

    @property
    def params(self) -> ConvParams:
        """The validated :class:`~convlab.params.ConvParams` (``ValueError`` if invalid)."""
        p = ConvParams.create(
            len(self.weight_shape) - 2, self.stride, self.padding, self.dilation,
            self.transposed, self.output_padding, self.groups,
        )
        p.check_shapes(self.input_shape, self.weight_shape)
        return p

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.params.output_shape(self.input_shape, self.weight_shape)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the forward (each backward GEMM costs as many)."""
        return self.params.macs(self.input_shape, self.weight_shape)

    @property
    def dim(self) -> int:
        return len(self.weight_shape) - 2

    @property
    def thnn_ok(self) -> bool:
        """True when THNN's conv2d serves this layer (2-d, no groups, dilation or transposition)."""
        p = self.params
        return p.dim == 2 and p.groups == 1 and not p.transposed and set(p.dilation) == {1}

    def args(self) -> tuple[list[int], list[int], list[int], bool, list[int], int]:
        """``(stride, padding, dilation, transposed, output_padding, groups)`` as ATen wants."""
        return self.params.aten_args()

    def describe(self) -> str:
        """Short human description, e.g. ``x[8,64,56,56] w[64,64,3,3] p1``."""
        parts = [f"x{list(self.input_shape)}", f"w{list(self.weight_shape)}"]
        for key, default in (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1)):
            value = getattr(self, key)
            if value != default:
                parts.append(f"{key[0] if key != 'groups' else 'g'}{value}")
        if self.transposed:
            parts.append("T" + (f" op{self.output_padding}" if self.output_padding else ""))
        return " ".join(p.replace(" ", "") for p in parts)

    def tensors(
        self, device: torch.device, dtype: torch.dtype, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Random ``(input, weight, bias, grad_output)`` for this layer."""
        gen = torch.Generator().manual_seed(seed)
        out = self.output_shape
        c_out = out[1]
        x, w, b, go = (
            torch.randn(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
            for shape in (self.input_shape, self.weight_shape, (c_out,), out)
        )
        return x, w, b, go


SUITE: tuple[Layer, ...] = (
    Layer("resnet56", (8, 64, 56, 56), (64, 64, 3, 3), padding=1, note="ResNet conv2_x"),
    Layer("resnet28", (8, 128, 28, 28), (128, 128, 3, 3), padding=1, note="ResNet conv3_x"),
    Layer("resnet14", (8, 256, 14, 14), (256, 256, 3, 3), padding=1, note="ResNet conv4_x"),
    Layer("cifar5", (32, 3, 32, 32), (16, 3, 5, 5), padding=2, note="5x5 stem, 'same'"),
    Layer("strided", (8, 64, 56, 56), (128, 64, 3, 3), stride=2, padding=1, note="downsample"),
    Layer("grouped", (8, 128, 28, 28), (128, 32, 3, 3), padding=1, groups=4, note="ResNeXt"),
    Layer("depthwise", (8, 128, 28, 28), (128, 1, 3, 3), padding=1, groups=128, note="MobileNet"),
    Layer("dilated", (8, 64, 28, 28), (64, 64, 3, 3), padding=2, dilation=2, note="atrous"),
    Layer("transposed", (8, 64, 14, 14), (64, 32, 4, 4), stride=2, padding=1, transposed=True,
          note="2x upsampling"),
    Layer("conv1d", (8, 64, 512), (64, 64, 5), padding=2, note="1-d, audio/text"),
    Layer("conv3d", (4, 16, 16, 16, 16), (32, 16, 3, 3, 3), padding=1, note="3-d, video"),
)
RESNET_LAYERS: tuple[str, ...] = ("resnet56", "resnet28", "resnet14", "cifar5")
QUICK_LAYERS: tuple[str, ...] = ("resnet14", "cifar5", "depthwise", "conv1d")


def suite_layers(names: Sequence[str] | None = None) -> list[Layer]:
    """Suite layers by name (all when ``names`` is None); ``ValueError`` for an unknown name.

    >>> [layer.name for layer in suite_layers(["conv1d"])]
    ['conv1d']
    """
    by_name = {layer.name: layer for layer in SUITE}
    if names is None:
        return list(SUITE)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(
            f"layers: unknown layer name(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(by_name)}"
        )
    return [by_name[n] for n in names]


@dataclass
class Result:
    """One timed (layer, path, pass); see the module docstring for the columns."""

    layer: str
    path: str
    pass_: str
    backend: str
    device: str
    dtype: str
    threads: int
    time_ms: float
    round_spread: float
    flops: int
    gflops: float
    ratio_native: float = math.nan
    gemm_gflops: float = math.nan
    ratio_gemm: float = math.nan
    mem_alloc_mb: float = math.nan
    mem_rss_mb: float = math.nan
    shape: str = ""

    def row(self) -> dict[str, object]:
        """The CSV/JSON row (``pass_`` spelled ``pass``)."""
        data = asdict(self)
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

    results: list[Result]
    skipped: list[Skip] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------------- tasks


@dataclass
class _Task:
    layer: Layer
    path: str
    pass_: str
    fn: Callable[[], object]
    backend: str
    force: str | None  # a native.use_backend name to hold while timing


def _flops(layer: Layer, pass_: str) -> int:
    return (4 if pass_ == "backward" else 2) * layer.macs


def _aten_fns(
    forward: Callable[..., object],
    backward: Callable[..., object],
    layer: Layer, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, go: torch.Tensor,
) -> dict[str, Callable[[], object]]:
    """Closures per pass for a ``convolution``/``convolution_backward`` pair with ATen's
    signatures (``torch.ops.aten`` itself, or :mod:`convlab.reference`)."""
    args = layer.args()
    bias_sizes = [b.shape[0]]
    fns: dict[str, Callable[[], object]] = {"forward": lambda: forward(x, w, b, *args)}
    for pass_, mask in MASKS.items():
        fns[pass_] = lambda mask=mask: backward(go, x, w, bias_sizes, *args, list(mask))
    return fns


def _thnn_fns(
    layer: Layer, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, go: torch.Tensor
) -> dict[str, Callable[[], object]]:
    p = layer.params
    kernel = list(w.shape[2:])
    # THNN's calling convention: the forward fills `finput`, autograd keeps it, and the
    # backward reads it instead of recomputing im2col; `fgrad_input` is reused scratch.
    _, finput = thnn.conv2d_forward(x, w, kernel, b, p.stride, p.padding)
    fwd_buf = torch.empty_like(finput)
    fgrad_input = torch.empty_like(finput)
    fns: dict[str, Callable[[], object]] = {
        "forward": lambda: thnn.conv2d_forward(x, w, kernel, b, p.stride, p.padding, fwd_buf),
    }
    for pass_, mask in MASKS.items():
        fns[pass_] = (
            lambda mask=mask: thnn.conv2d_backward(
                go, x, w, kernel, p.stride, p.padding, finput, fgrad_input, mask
            )
        )
    return fns


def _numpy_fns(
    layer: Layer, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, go: torch.Tensor
) -> dict[str, Callable[[], object]]:
    p = layer.params
    xn, wn, bn, gon = (t.numpy() for t in (x, w, b, go))
    fns: dict[str, Callable[[], object]] = {
        "forward": lambda: numpy_ref.convolution(
            xn, wn, bn, p.stride, p.padding, p.dilation, p.groups
        ),
    }
    for pass_, mask in MASKS.items():
        fns[pass_] = (
            lambda mask=mask: numpy_ref.convolution_backward(
                gon, xn, wn, [bn.shape[0]], p.stride, p.padding, p.dilation, p.groups, mask
            )
        )
    return fns


def _why_not(path: str, layer: Layer, device: torch.device) -> str | None:
    """Why ``path`` does not apply to ``layer`` on ``device`` (None if it may)."""
    if path in ("mkldnn", "slow", "cudnn") and path not in native.available_backends(device):
        return f"not available on {device.type} in this build"
    if path == "thnn" and not layer.thnn_ok:
        return "THNN's conv2d is 2-d only, without groups, dilation or transposition"
    if path == "numpy_ref":
        if device.type != "cpu":
            return "NumPy runs on the CPU only (no device round-trips)"
        if layer.transposed:
            return "numpy_ref has no transposed convolution"
    return None


def _tasks(
    layer: Layer,
    paths: Sequence[str],
    passes: Sequence[str],
    device: torch.device,
    dtype: torch.dtype,
    skipped: list[Skip],
) -> list[_Task]:
    x, w, b, go = layer.tensors(device, dtype)
    args = layer.args()
    tasks: list[_Task] = []
    for path in paths:
        reason = _why_not(path, layer, device)
        if reason is not None:
            skipped.append(Skip(layer.name, path, reason))
            continue
        force = path if path in ("mkldnn", "slow", "cudnn") else None
        if path in NATIVE_PATHS:
            # Select as a training step does: with inputs that require grad.
            xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
            try:
                if force is None:
                    backend = native.select_backend(xg, wg, b, *args)
                else:
                    with native.use_backend(force, xg, wg, b, *args) as chosen:
                        backend = str(chosen)
            except ValueError as err:
                skipped.append(Skip(layer.name, path, str(err)))
                continue
            fns = _aten_fns(torch.ops.aten.convolution.default,
                            torch.ops.aten.convolution_backward.default, layer, x, w, b, go)
        elif path == "reference":
            backend = "-"
            fns = _aten_fns(reference.convolution, reference.convolution_backward,
                            layer, x, w, b, go)
        else:
            backend = "-"
            fns = {"thnn": _thnn_fns, "numpy_ref": _numpy_fns}[path](layer, x, w, b, go)
        tasks += [_Task(layer, path, ps, fns[ps], backend, force) for ps in passes]
    return tasks


def _gemm_fn(flops: int, device: torch.device, dtype: torch.dtype) -> tuple[Callable, int]:
    """A square ``(m, m) @ (m, m)`` matmul with about ``flops`` FLOPs; returns (fn, its flops)."""
    m = max(1, round((flops / 2) ** (1 / 3)))
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(m, m, generator=gen).to(device=device, dtype=dtype)
    bm = torch.randn(m, m, generator=gen).to(device=device, dtype=dtype)
    return (lambda: torch.mm(a, bm)), 2 * m**3


# ------------------------------------------------------------------------------ measuring


def _time(fn: Callable[[], object], task: _Task | None, threads: int,
          min_run_time: float) -> float:
    """Median seconds per call of one blocked_autorange (under ``task``'s forced backend)."""
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    with _forced(task):
        return timer.blocked_autorange(min_run_time=min_run_time).median


@contextlib.contextmanager
def _forced(task: _Task | None) -> Iterator[None]:
    if task is None or task.force is None:
        yield
        return
    with native.use_backend(task.force):
        yield


# ---------------------------------------------------------------------------------- running


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
        "numpy_blas_threads": "library default (not controlled)",
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["cudnn_benchmark"] = torch.backends.cudnn.benchmark
        env["allow_tf32"] = torch.backends.cudnn.allow_tf32
    return env


def _check_choice(values: Sequence[str] | None, allowed: Sequence[str], name: str) -> list[str]:
    if values is None:
        return list(allowed)
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of names, got the string {values!r}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(
            f"{name}: unknown name(s) {', '.join(map(repr, bad))}; choose from "
            f"{', '.join(allowed)}"
        )
    return list(values)


def _resolve_layers(layers: Sequence[str | Layer] | None) -> list[Layer]:
    if layers is None:
        return list(SUITE)
    if isinstance(layers, str | Layer):
        raise TypeError("layers must be a sequence of names or Layer objects")
    out = []
    for item in layers:
        if isinstance(item, Layer):
            item.params  # noqa: B018 - validates the layer now, with a clear error
            out.append(item)
        else:
            out += suite_layers([item])
    return out


def benchmark(
    layers: Sequence[str | Layer] | None = None,
    paths: Sequence[str] | None = None,
    passes: Sequence[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    rounds: int = 3,
    min_run_time: float = 0.1,
    memory: bool = True,
    gemm: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Time ``paths`` x ``passes`` on ``layers``; see :func:`run` (this also returns skips)."""
    chosen_layers = _resolve_layers(layers)
    chosen_paths = _check_choice(paths, PATHS, "paths")
    chosen_passes = _check_choice(passes, PASSES, "passes")
    dev = torch.device(device if device is not None else "cuda" if torch.cuda.is_available()
                       else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: CUDA was requested but torch.cuda.is_available() is False")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {dev}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if threads is None:
        threads = torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if not min_run_time > 0:
        raise ValueError(f"min_run_time must be positive, got {min_run_time!r}")

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    report = Report([], meta=environment(dev, threads))
    report.meta.update(
        rounds=rounds, min_run_time=min_run_time, dtype=str(dtype).replace("torch.", ""),
        flop_formula=FLOP_FORMULA, memory_method=MEMORY_METHOD,
    )
    try:
        for index, layer in enumerate(chosen_layers, 1):
            tag = f"[{index}/{len(chosen_layers)}] {layer.name}"
            report.results += _bench_layer(
                layer, chosen_paths, chosen_passes, dev, dtype, threads, rounds, min_run_time,
                memory, gemm, report.skipped, progress, tag,
            )
    finally:
        torch.set_num_threads(saved_threads)
    _fill_ratios(report.results)
    return report


def run(
    layers: Sequence[str | Layer] | None = None,
    paths: Sequence[str] | None = None,
    passes: Sequence[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    rounds: int = 3,
    min_run_time: float = 0.1,
    memory: bool = True,
    gemm: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[Result]:
    """Benchmark every applicable path on ``layers``; one :class:`Result` per timed task.

    ``layers``: suite names (see ``SUITE``) or :class:`Layer` objects (default: the whole
    suite); ``paths``/``passes``: subsets of ``PATHS``/``PASSES``; ``device``
    defaults to CUDA when available; ``threads`` to torch's current count; each of
    ``rounds`` times every task once with ``blocked_autorange(min_run_time)``.
    ``memory=False`` skips the (untimed) memory measurements, ``gemm=False`` the GEMM peak.

    >>> rs = run([Layer("tiny", (2, 3, 8, 8), (4, 3, 3, 3))], paths=["native"],
    ...          passes=["backward"], rounds=1, min_run_time=0.01, memory=False)
    >>> [(r.path, r.pass_) for r in rs]
    [('native', 'backward')]
    """
    return benchmark(
        layers, paths, passes, device, dtype, threads, rounds, min_run_time, memory, gemm,
        progress,
    ).results


def _bench_layer(
    layer: Layer,
    paths: Sequence[str],
    passes: Sequence[str],
    device: torch.device,
    dtype: torch.dtype,
    threads: int,
    rounds: int,
    min_run_time: float,
    memory: bool,
    gemm: bool,
    skipped: list[Skip],
    progress: Callable[[str], None] | None,
    tag: str,
) -> list[Result]:
    tasks = _tasks(layer, paths, passes, device, dtype, skipped)
    gemms: dict[int, tuple[Callable, int]] = {}
    if gemm:
        for flops in sorted({_flops(layer, t.pass_) for t in tasks}):
            gemms[flops] = _gemm_fn(flops, device, dtype)
    jobs: list[tuple[str, Callable[[], object], _Task | None]] = [
        (f"{t.path}:{t.pass_}", t.fn, t) for t in tasks
    ]
    jobs += [(f"gemm:{f}", fn, None) for f, (fn, _) in gemms.items()]
    for _, fn, task in jobs:  # warm-up: caches, oneDNN primitives, lazy inits
        with _forced(task):
            fn()
        _settle(task)
    times: dict[str, list[float]] = {name: [] for name, _, _ in jobs}
    for r in range(rounds):
        order = jobs[r % len(jobs):] + jobs[: r % len(jobs)] if jobs else []
        for i, (name, fn, task) in enumerate(order, 1):
            if progress is not None:
                progress(f"{tag} | round {r + 1}/{rounds} {i}/{len(jobs)} {name}")
            times[name].append(_time(fn, task, threads, min_run_time))
            _settle(task)
    gemm_rate = {f: g_flops / min(times[f"gemm:{f}"]) / 1e9 for f, (_, g_flops) in gemms.items()}
    results = []
    for task in tasks:
        series = times[f"{task.path}:{task.pass_}"]
        best = min(series)
        flops = _flops(layer, task.pass_)
        res = Result(
            layer=layer.name, path=task.path, pass_=task.pass_, backend=task.backend,
            device=device.type, dtype=str(dtype).replace("torch.", ""), threads=threads,
            time_ms=best * 1e3, round_spread=max(series) / best - 1.0, flops=flops,
            gflops=flops / best / 1e9, shape=layer.describe(),
        )
        if flops in gemm_rate:
            res.gemm_gflops = gemm_rate[flops]
            res.ratio_gemm = gemm_rate[flops] / res.gflops
        if memory:
            if progress is not None:
                progress(f"{tag} | memory {task.path}:{task.pass_}")
            with _forced(task):
                res.mem_alloc_mb = alloc_peak(task.fn, device) / MB
                res.mem_rss_mb = rss_peak(task.fn, device) / MB
            _settle(task)
        results.append(res)
    return results


def _settle(task: _Task | None) -> None:
    if task is not None and task.path == "numpy_ref":
        time.sleep(BLAS_SETTLE_S)


def _fill_ratios(results: list[Result]) -> None:
    best: dict[tuple[str, str], float] = {}
    for r in results:
        if r.path in NATIVE_PATHS:
            key = (r.layer, r.pass_)
            best[key] = min(best.get(key, math.inf), r.time_ms)
    for r in results:
        if (r.layer, r.pass_) in best:
            r.ratio_native = r.time_ms / best[(r.layer, r.pass_)]


# ---------------------------------------------------------------------------------- targets


@dataclass
class Target:
    """One DESIGN §6 target evaluated on a run: worst and geometric-mean ratio over layers."""

    name: str
    limit: float
    ratios: dict[str, float]

    @property
    def worst(self) -> float:
        return max(self.ratios.values()) if self.ratios else math.nan

    @property
    def geomean(self) -> float:
        if not self.ratios:
            return math.nan
        return math.exp(statistics.fmean(math.log(v) for v in self.ratios.values()))

    @property
    def status(self) -> str:
        if not self.ratios:
            return "n/a"
        return "pass" if self.worst <= self.limit else "miss"

    def line(self) -> str:
        if not self.ratios:
            return f"{self.status:<4}  {self.name}: not measured in this run"
        per_layer = ", ".join(f"{k} {v:.2f}x" for k, v in self.ratios.items())
        return (
            f"{self.status:<4}  {self.name} <= {self.limit:g}x: worst {self.worst:.2f}x, "
            f"geomean {self.geomean:.2f}x ({per_layer})"
        )


def targets(results: Sequence[Result], pass_: str = "backward") -> list[Target]:
    """The three DESIGN §6 performance targets, on the full ``backward`` pass by default.

    * thnn.conv2d_backward vs the forced slow path (ATen's ``_slow_conv2d_backward``) <= 1.25x;
    * reference.convolution_backward vs the fastest native path <= 2x;
    * numpy_ref im2col backward vs the forced slow path <= 3x.
    """
    table = {(r.layer, r.path): r for r in results if r.pass_ == pass_}
    layers = list(dict.fromkeys(r.layer for r in results if r.pass_ == pass_))

    def ratios(path: str, base: str | None) -> dict[str, float]:
        out = {}
        for layer in layers:
            mine = table.get((layer, path))
            if mine is None:
                continue
            if base is None:
                if not math.isnan(mine.ratio_native):
                    out[layer] = mine.ratio_native
            elif (layer, base) in table:
                out[layer] = mine.time_ms / table[(layer, base)].time_ms
        return out

    return [
        Target("thnn.conv2d_backward / aten slow", 1.25, ratios("thnn", "slow")),
        Target("reference.convolution_backward / fastest native", 2.0, ratios("reference", None)),
        Target("numpy_ref.convolution_backward / aten slow", 3.0, ratios("numpy_ref", "slow")),
    ]


# ---------------------------------------------------------------------------------- output


def format_table(results: Sequence[Result]) -> str:
    """A fixed-width text table of the main columns."""
    head = (
        f"{'layer':<11}{'pass':<16}{'path':<10}{'backend':<16}{'ms':>9}{'GFLOP/s':>9}"
        f"{'x native':>9}{'x gemm':>8}{'alloc MB':>9}{'rss MB':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.layer:<11}{r.pass_:<16}{r.path:<10}{r.backend:<16}{r.time_ms:>9.2f}"
            f"{r.gflops:>9.1f}{r.ratio_native:>9.2f}{r.ratio_gemm:>8.2f}"
            f"{r.mem_alloc_mb:>9.1f}{r.mem_rss_mb:>8.1f}"
        )
    return "\n".join(lines)


def write(report: Report, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``bench.csv`` and ``bench.json`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
        "results": [{k: clean(v) for k, v in r.row().items()} for r in report.results],
        "skipped": [asdict(s) for s in report.skipped],
        "targets": [
            {"name": t.name, "limit": t.limit, "status": t.status, "worst": clean(t.worst),
             "geomean": clean(t.geomean), "ratios": t.ratios}
            for t in targets(report.results)
        ],
    }
    json_path.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    return csv_path, json_path


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """Rows of a ``bench.csv`` as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------- profiling helpers


# -------------------------------------------------------------------------------------- CLI


def _names(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convlab bench",
        description="Time every convolution path (native, forced backends, convlab's own) "
        "side by side with torch.utils.benchmark; write CSV and JSON.",
        epilog=FLOP_FORMULA + ". " + MEMORY_METHOD + ".",
    )
    parser.add_argument("--quick", action="store_true",
                        help=f"layers {','.join(QUICK_LAYERS)}, 2 rounds, short timings")
    parser.add_argument("--layers", type=_names, help="comma-separated layer names (see --list)")
    parser.add_argument("--paths", type=_names, help=f"comma-separated, from {','.join(PATHS)}")
    parser.add_argument("--passes", type=_names, help=f"comma-separated, from {','.join(PASSES)}")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's current count)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (3; quick 2)")
    parser.add_argument("--min-run-time", type=float, default=None,
                        help="seconds per blocked_autorange (0.1; quick 0.02)")
    parser.add_argument("--no-memory", action="store_true", help="skip memory measurements")
    parser.add_argument("--out", default="bench-results", help="output folder for CSV and JSON")
    parser.add_argument("--list", action="store_true", help="list the suite's layers and exit")
    return parser


def _progress_printer(stream: object) -> Callable[[str], None]:
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [""]

    def show(message: str) -> None:
        if tty:
            print(f"\r{message:<78.78}", end="", file=stream, flush=True)
        elif message.split(" | ")[0] != last[0]:  # one line per layer in logs
            last[0] = message.split(" | ")[0]
            print(last[0], file=stream, flush=True)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """``convlab bench``: run, print a table and the targets, write CSV and JSON."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.list:
        for layer in SUITE:
            print(f"{layer.name:<11} {layer.describe():<44} {layer.note}")
        return 0
    layers = args.layers if args.layers is not None else (
        list(QUICK_LAYERS) if args.quick else None
    )
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    min_run_time = args.min_run_time if args.min_run_time is not None else (
        0.02 if args.quick else 0.1
    )
    dtype = getattr(torch, args.dtype)
    if layers is not None:
        try:
            suite_layers(layers)
        except ValueError as err:
            parser.error(str(err))
    progress = _progress_printer(sys.stderr)
    start = time.perf_counter()
    try:
        report = benchmark(
            layers, args.paths, args.passes, args.device, dtype, args.threads, rounds,
            min_run_time, memory=not args.no_memory, progress=progress,
        )
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    if sys.stderr.isatty():
        print(file=sys.stderr)
    meta = report.meta
    print(
        f"convlab bench: torch {meta['torch']}, device {meta['device']}, "
        f"threads {meta['threads']}, {meta['dtype']}, {rounds} rounds x "
        f"blocked_autorange({min_run_time:g} s), best round median "
        f"({time.perf_counter() - start:.0f} s)"
    )
    print(format_table(report.results))
    for skip in report.skipped:
        print(f"skipped {skip.layer}/{skip.path}: {skip.reason}")
    print("\nDESIGN targets (full backward; time ratio, lower is better):")
    for target in targets(report.results):
        print("  " + target.line())
    csv_path, json_path = write(report, args.out)
    print(f"\nwrote {csv_path} and {json_path}")
    return 0
