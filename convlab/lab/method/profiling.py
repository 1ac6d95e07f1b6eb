"""Measuring one call: the memory it needs, its op times, the oneDNN primitives it runs.

* :func:`measure_memory`: extra bytes one call needs above what was live before it,
  outputs included, as :func:`alloc_peak` (torch's allocator plus tracemalloc on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA) and :func:`rss_peak` (the rise of the
  process's resident-set high-water mark, Linux CPU only); see :mod:`convlab.lab.bench` for
  what each sees;
* :func:`profile_ops`: the ``torch.profiler`` self-time breakdown of one call;
* :func:`onednn_trace`: the oneDNN primitives one call executes, from its verbose log
  (captured with :func:`convlab.aten.capture.redirect_fd`: oneDNN prints from C, past
  ``sys.stdout``).

Torch's profiler, the file descriptors, tracemalloc and the RSS high-water mark are
process-wide: every function here holds :data:`convlab.aten.capture.PROFILER_LOCK` while it
uses them, so calls from several threads run one after another instead of crashing the
process or leaving stdout redirected, and tracemalloc is stopped even when ``fn`` raises.

:mod:`convlab.lab.bench` uses these for its memory columns.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from convlab.aten.capture import PROFILER_LOCK, redirect_fd

__all__ = [
    "OneDNNCall", "OpTime", "alloc_peak", "measure_memory", "onednn_trace", "profile_ops",
    "rss_peak",
]


def alloc_peak(fn: Callable[[], object], device: torch.device) -> float:
    """Peak bytes allocated by one call of ``fn`` above the start (see :mod:`convlab.lab.bench`)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - start
        del out
        return float(max(peak, 0))
    from torch.profiler import ProfilerActivity, profile

    with PROFILER_LOCK, redirect_fd(2), profile(
        activities=[ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        py_start = tracemalloc.get_traced_memory()[0]
        try:
            out = fn()
            py_peak = tracemalloc.get_traced_memory()[1] - py_start
            del out
        finally:
            if not was_tracing:  # leave tracemalloc as we found it, also when fn raises
                tracemalloc.stop()
    try:
        tree = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError:  # the (experimental) event tree moved: report unknown
        return math.nan
    events: list[tuple[int, int]] = []
    stack = list(tree)
    while stack:
        node = stack.pop()
        size = getattr(node.extra_fields, "alloc_size", None)
        if size is not None:
            events.append((node.start_time_ns, size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return float(peak + py_peak)


def measure_memory(
    fn: Callable[[], object], device: str | torch.device = "cpu"
) -> tuple[float, float]:
    """``(alloc_bytes, rss_bytes)`` extra memory of one call of ``fn``.

    >>> alloc, rss = measure_memory(lambda: torch.empty(2**20))   # doctest: +SKIP
    >>> alloc / 2**20                                              # doctest: +SKIP
    4.0
    """
    device = torch.device(device)
    with PROFILER_LOCK:
        return alloc_peak(fn, device), rss_peak(fn, device)


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    if match is None:
        raise OSError(f"{key} not in /proc/self/status")
    return int(match.group(1)) * 1024


def rss_peak(fn: Callable[[], object], device: torch.device) -> float:
    """Rise of the resident-set high-water mark during one call (Linux CPU only, else NaN)."""
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return math.nan
    with PROFILER_LOCK:
        return _rss_peak_locked(fn)


def _rss_peak_locked(fn: Callable[[], object]) -> float:
    try:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap pages back first
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        start = _status_bytes("VmRSS")
        out = fn()
        peak = _status_bytes("VmHWM")
        del out
    except OSError:
        return math.nan
    return float(max(peak - start, 0))


@dataclass
class OpTime:
    """One row of a profiler op breakdown."""

    name: str
    calls: int
    self_ms: float
    share: float  # of the summed self time


def profile_ops(fn: Callable[[], object], top: int = 8, repeat: int = 3) -> list[OpTime]:
    """The ``torch.profiler`` op breakdown (self CPU time per call of ``fn``), largest first.

    ``fn`` runs once to warm up, then ``repeat`` times under the profiler; times and call
    counts are per call. Kineto's own log lines are kept off stderr.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    with PROFILER_LOCK, redirect_fd(2), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeat):
            fn()
    rows = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    rows.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        OpTime(e.key, e.count // repeat, e.self_cpu_time_total / 1e3 / repeat,
               e.self_cpu_time_total / total)
        for e in rows[:top]
    ]


@dataclass
class OneDNNCall:
    """One oneDNN primitive execution from its verbose log."""

    op: str  # convolution, reorder, ...
    impl: str  # e.g. jit:avx512_core, brg..., gemm:jit
    prop: str  # backward_data, backward_weights, forward_training, undef (reorders)
    layouts: str  # memory descriptors, e.g. "src:f32::blocked:abcd::f0 dst:f32::blocked:aBcd16b"
    problem: str
    ms: float


def onednn_trace(fn: Callable[[], object]) -> list[OneDNNCall]:
    """The oneDNN primitives one call of ``fn`` executes, from ``ONEDNN_VERBOSE`` output.

    Uses ``torch.backends.mkldnn.verbose``; the log, printed by C code on stdout, is caught
    in a temporary file. Empty when oneDNN is not used (or not built in).
    """
    fn()
    with PROFILER_LOCK, tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "onednn.log")
        with redirect_fd(1, log), torch.backends.mkldnn.verbose(
            torch.backends.mkldnn.VERBOSE_ON
        ):
            fn()
        lines = Path(log).read_text(errors="replace").splitlines()
    return parse_trace(lines)


def parse_trace(lines: Iterable[str]) -> list[OneDNNCall]:
    """The primitive executions (``exec`` lines) of oneDNN verbose ``lines``, in order;
    other lines (``info``, ``create``, anything not oneDNN's) are skipped."""
    calls = []
    for line in lines:
        parts = line.split(",")
        if not line.startswith("onednn_verbose") or "exec" not in parts[:4]:
            continue
        start = parts.index("exec") + 2  # skip the engine field
        try:
            calls.append(OneDNNCall(parts[start], parts[start + 1], parts[start + 2],
                                    parts[start + 3], parts[-2], float(parts[-1])))
        except (IndexError, ValueError):
            continue
    return calls
