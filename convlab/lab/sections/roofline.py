"""The ``roofline`` section of a measurement record: this machine's measured ceilings.

* **Compute**: FLOP/s of the fastest square float32 matmul available, ``torch.mm`` (ATen's
  BLAS, MKL here) and oneDNN's own matmul (``torch._C._nn.mkldnn_linear`` on ``.to_mkldnn()``
  tensors), at 1 thread and at all of them. MKL may take a generic code path on a CPU it
  does not recognise (the fingerprint's ``blas.mkl_path`` says which), so its GEMM is no
  peak by itself: the faster of the two is.
* **Memory**: STREAM-like ``copy`` (``b = a``) and ``triad`` (``a = b + s * c``) on float32
  arrays of at least 64 MiB and, in a full run, at least four times the last-level cache
  (STREAM's rule; the cache size is read from sysfs, and the arrays stay within half of the
  available memory, the record says when that bound was hit), GB/s counted as STREAM does
  (2 and 3 arrays moved per element; write-allocate traffic not counted), at 1 thread and
  at all of them.
* **Theoretical peak** beside the measured GEMM ceiling: FMA pipes x float32 lanes x 2 x the
  clock the kernel reports, per thread count, for the ISA setting of this process
  (:mod:`convlab.lab.method.fma_peak`, with every input so the number can be audited, or
  why it is not modelled), and the measured ceiling's fraction of it (above 1 where the
  cores run faster than the reported clock).
* **Sizes**: the GEMM's n and bytes per matrix, the STREAM arrays' elements and bytes.

:func:`fractions` places each path of the ``suite`` section on the roofline: its GFLOP/s
as a fraction of the peak, its GB/s as a fraction of the triad bandwidth, and its share of
the roofline bound ``min(peak, intensity * bandwidth)`` where intensity is FLOPs per byte
the pass must move. A depthwise layer's intensity is a few FLOPs per byte, so its bound is
the memory line, not the peak.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from convlab.lab.method import fma_peak, machine
from convlab.lab.method.timing import interleaved
from convlab.lab.sections.suite import thread_counts, timing_dict

FULL = {"rounds": 7, "min_calls": 20, "min_run_time": 0.05, "gemm_n": 1024, "stream_log2": 24,
        "llc_multiple": 4}
# quick runs are smoke runs: their arrays are not sized from the cache
QUICK = {"rounds": 3, "min_calls": 3, "min_run_time": 0.01, "gemm_n": 512, "stream_log2": 23,
         "llc_multiple": 0}
TRIAD_SCALAR = 3.0


def _gemm_candidates(n: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    fns: dict[str, Any] = {"torch.mm": lambda: torch.mm(a, b)}
    if torch.backends.mkldnn.is_available():
        am, bm = a.to_mkldnn(), b.to_mkldnn()
        fns["onednn matmul"] = lambda: torch._C._nn.mkldnn_linear(am, bm, None)
    return fns


def _stream_candidates(elements: int) -> dict[str, Any]:
    a = torch.ones(elements)
    b = torch.full((elements,), 2.0)
    c = torch.full((elements,), 0.5)
    return {
        "copy": lambda: b.copy_(a),
        "triad": lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a),
    }


def stream_elements(minimum: int, llc: int | None, multiple: int,
                    available: int | None) -> tuple[int, dict[str, Any]]:
    """float32 elements per STREAM array: at least ``minimum`` and ``multiple`` x the
    last-level cache ``llc`` (bytes), the three arrays within half of ``available`` bytes;
    and how that came out (``llc_bytes``, ``array_over_llc``, ``capped_by_memory``).

    >>> n, _ = stream_elements(2**24, 300 * 2**20, 4, 2**36)
    >>> n * 4 // 2**20  # MiB per array
    1200
    """
    elements = minimum
    if llc and multiple:
        elements = max(elements, -(-multiple * llc // 4))
    capped = False
    if available:
        fit = available // 2 // (3 * 4)
        if elements > fit:
            elements, capped = max(fit, 1), True
    over = round(4 * elements / llc, 2) if llc else None
    return elements, {"llc_bytes": llc, "array_over_llc": over, "capped_by_memory": capped}


def theoretical(ceiling: Mapping[str, float], counts: Sequence[int]) -> dict[str, Any]:
    """This process's theoretical float32 peak
    (:func:`~convlab.lab.method.fma_peak.peak_and_reason` under its ISA setting) at each
    thread count in ``counts``, and the
    measured GEMM ``ceiling`` (GFLOP/s by thread count) as a fraction of it; where no
    peak is modelled, ``reason`` says why and the rates are None."""
    fp = fma_peak.host_fingerprint()
    label = fma_peak.process_isa_label(os.environ, set(fp["isa_flags"]))
    out: dict[str, Any] = {"isa": label, "reason": None, "model": None, "gflops": None,
                           "cores": None, "measured_over_peak": None}
    if label is None:
        return {**out, "reason": "not modelled: the ISA environment matches no setting"}
    found = {str(k): fma_peak.peak_and_reason(fp, label, k) for k in counts}
    reasons = [why for _, why in found.values() if why]
    if reasons:
        return {**out, "reason": reasons[0]}
    peaks = {k: p for k, (p, _) in found.items() if p is not None}
    per_count = ("threads", "cores", "gflops")
    model = {k: v for k, v in peaks[str(max(counts))].items() if k not in per_count}
    return {**out, "model": model,
            "gflops": {k: p["gflops"] for k, p in peaks.items()},
            "cores": {k: p["cores"] for k, p in peaks.items()},
            "measured_over_peak": {k: ceiling[k] / p["gflops"] for k, p in peaks.items()}}


def record(quick: bool = False) -> dict[str, Any]:
    """Peak GFLOP/s, the theoretical peak beside it and STREAM GB/s at 1 and all threads,
    with the array sizes (module docstring)."""
    cfg = QUICK if quick else FULL
    counts = thread_counts()
    n = cfg["gemm_n"]
    elements, sizing = stream_elements(
        2 ** cfg["stream_log2"], machine.last_level_cache(machine.cache_sizes()),
        cfg.get("llc_multiple", 0), machine.memory_available())
    kinds = {**_gemm_candidates(n), **_stream_candidates(elements)}
    fns, threads = {}, {}
    for name, fn in kinds.items():
        for k in counts:
            fns[f"{name} x{k}"] = fn
            threads[f"{name} x{k}"] = k
    # Ceilings are rates per elapsed second: always the wall clock, whatever the run's
    # default (a CPU-time GFLOP/s at t threads is per core-second, no machine ceiling).
    timings = interleaved(fns, rounds=cfg["rounds"], min_run_time=cfg["min_run_time"],
                          min_calls=cfg["min_calls"], threads=threads, clock="wall")
    gemm_flops = 2 * n**3
    moved = {"copy": 2 * 4 * elements, "triad": 3 * 4 * elements}
    gemm, stream = {}, {}
    for name in kinds:
        for k in counts:
            t = timings[f"{name} x{k}"]
            if name in moved:
                stream.setdefault(name, {})[str(k)] = timing_dict(t, None, moved[name])
            else:
                gemm.setdefault(name, {})[str(k)] = timing_dict(t, gemm_flops)
    peak = {str(k): max(gemm[name][str(k)]["gflops"] for name in gemm) for k in counts}
    best = {str(k): max(gemm, key=lambda name: gemm[name][str(k)]["gflops"]) for k in counts}
    bandwidth = {str(k): stream["triad"][str(k)]["gbytes_s"] for k in counts}
    return {
        "method": {**cfg, "threads": counts, "clock": "wall",
                   "stream_bytes": "copy 8 B, triad 12 B per element (STREAM's count; "
                   "write-allocate not counted)",
                   "array_mib": 4 * elements / 2**20, "stream_elements": elements,
                   "stream_array_bytes": 4 * elements, "gemm_matrix_bytes": 4 * n * n,
                   **sizing},
        "gemm": gemm, "stream": stream, "peak_gflops": peak, "peak_from": best,
        "theoretical_peak": theoretical(peak, counts),
        "triad_gbytes_s": bandwidth,
        "copy_gbytes_s": {str(k): stream["copy"][str(k)]["gbytes_s"] for k in counts},
    }


def fractions(suite: Mapping[str, Any], roofline: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each suite layer and path (full backward) on this machine's roofline.

    The ceilings are the best rates measured at up to the suite's thread count (more
    threads never lower what the machine can do, so a lower reading at more threads is
    noise of a shared machine, and the best reading is the safer lower bound).
    ``ValueError`` when the suite was timed on the CPU-time clock: its rates are per
    core-second, the ceilings per elapsed second.
    """
    clock = suite["method"].get("clock", "wall")
    if clock != "wall":
        raise ValueError(f"suite: timed on the {clock!r} clock; the roofline's ceilings "
                         "are wall-clock rates")
    threads = int(suite["method"]["threads"])

    def best(rates: Mapping[str, float]) -> float:
        usable = [v for k, v in rates.items() if int(k) <= threads]
        return max(usable or rates.values())

    peak = best(roofline["peak_gflops"])
    bandwidth = best(roofline["triad_gbytes_s"])
    rows = []
    for layer in suite["layers"]:
        for path, t in layer["times"].items():
            intensity = t["flops"] / t["min_bytes"]
            bound = min(peak, intensity * bandwidth)
            rows.append({
                "layer": layer["layer"], "path": path, "backend": t["backend"],
                "gflops": t["gflops"], "gbytes_s": t["gbytes_s"],
                "flops_per_byte": intensity, "of_peak": t["gflops"] / peak,
                "of_bandwidth": t["gbytes_s"] / bandwidth, "bound_gflops": bound,
                "of_bound": t["gflops"] / bound,
                "bound_by": "memory" if intensity * bandwidth < peak else "compute",
            })
    return rows
