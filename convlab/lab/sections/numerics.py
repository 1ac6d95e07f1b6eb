"""Chapter 10's measurements as one record section (``numerics``): the bfloat16/float16
routing, run-to-run and thread-count bit equality, the accuracy table and the error growth
sweep, each error measured with :mod:`convlab.lab.method.float_errors`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from convlab.aten import backends, native
from convlab.lab.method.float_errors import backward_error
from convlab.scratch.params import ConvParams

FORCED: tuple[str, str] = ("mkldnn", "slow")
_SHORT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, int]]


def _case(n: int, c: int, k: int, size: int, kernel: int, dim: int = 2, seed: int = 0,
          **kw: int) -> Case:
    """float64 ``(grad_output, input, weight, conv kwargs)`` of one seeded convolution."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, *[size] * dim, generator=gen, dtype=torch.float64)
    w = torch.randn(k, c // kw.get("groups", 1), *[kernel] * dim, generator=gen,
                    dtype=torch.float64)
    p = ConvParams.create(dim, kw.get("stride", 1), kw.get("padding", 0),
                          kw.get("dilation", 1), False, 0, kw.get("groups", 1))
    out = p.output_shape(tuple(x.shape), tuple(w.shape))
    go = torch.randn(out, generator=gen, dtype=torch.float64)
    return go, x, w, kw


def determinism_cases() -> dict[str, Case]:
    """One small conv per kind of CPU kernel: plain, dilated, depthwise, 3-d, dilated 3-d."""
    return {
        "2-d": _case(4, 16, 16, 12, 3, seed=1, padding=1),
        "dilated 2-d": _case(4, 16, 16, 12, 3, seed=2, padding=2, dilation=2),
        "depthwise": _case(4, 16, 16, 12, 3, seed=3, padding=1, groups=16),
        "3-d": _case(4, 16, 16, 8, 3, dim=3, seed=4, padding=1),
        "dilated 3-d": _case(4, 16, 16, 8, 3, dim=3, seed=5, padding=2, dilation=2),
    }


def accuracy_layers(quick: bool = False) -> dict[str, Case]:
    """The layers of the accuracy table (two of them when ``quick``)."""
    layers = {
        "3x3, 32 ch": _case(4, 32, 32, 16, 3, seed=11, padding=1),
        "7x7 stem": _case(4, 3, 32, 64, 7, seed=12, stride=2, padding=3),
        "batch 64": _case(64, 8, 8, 16, 3, seed=13, padding=1),
        "depthwise": _case(4, 32, 32, 16, 3, seed=14, padding=1, groups=32),
        "dilated": _case(4, 16, 16, 16, 3, seed=15, padding=2, dilation=2),
        "3-d": _case(2, 8, 8, 8, 3, dim=3, seed=16, padding=1),
    }
    return {k: layers[k] for k in ("3x3, 32 ch", "depthwise")} if quick else layers


def _backward(case: Case, backend: str, dtype: torch.dtype = torch.float32) -> tuple:
    go, x, w, kw = case
    return native.convolution_backward(
        go.to(dtype), x.to(dtype), w.to(dtype), [w.shape[0]], kw.get("stride", 1),
        kw.get("padding", 0), kw.get("dilation", 1), False, 0, kw.get("groups", 1),
        [True, True, True], backend=backend)


def served(case: Case, dtype: torch.dtype) -> list[tuple[str, str]]:
    """``(use_backend name, ATen backend)`` of each of oneDNN and the slow path that ATen
    lets serve this conv in ``dtype`` on this machine (oneDNN drops out for a dtype its
    kernels here do not take)."""
    _, x, w, kw = case
    pairs = []
    for name in FORCED:
        try:
            with backends.use_backend(name, x.to(dtype), w.to(dtype), **kw) as chosen:
                pairs.append((name, str(chosen)))
        except ValueError:
            pass
    return pairs


def routing() -> dict[str, object]:
    """Which backend ATen selects per dtype under the default flags (a plain 3x3 conv and a
    depthwise one), with oneDNN's own answers to "bf16/fp16 supported here?"."""
    convs = {"3x3": _case(8, 16, 16, 16, 3, padding=1),
             "depthwise": _case(8, 16, 16, 16, 3, padding=1, groups=16)}
    rows = [{"conv": name, "dtype": _SHORT[dtype],
             "backend": str(backends.select_backend(x.to(dtype), w.to(dtype), **kw))}
            for name, (_, x, w, kw) in convs.items() for dtype in _SHORT]
    return {"mkldnn_bf16_supported": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "mkldnn_fp16_supported": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
            "rows": rows}


def run_to_run() -> list[dict[str, object]]:
    """Whether each backward returns the same bits twice (gI, gW, gb), float32."""
    rows = []
    for name, case in determinism_cases().items():
        for backend, chosen in served(case, torch.float32):
            first, second = _backward(case, backend), _backward(case, backend)
            same = [torch.equal(p, q) for p, q in zip(first, second, strict=True)]
            rows.append({"conv": name, "backend": chosen, "same_bits": same})
    return rows


def across_threads(counts: Sequence[int] = (1, 2, 4)) -> dict[str, object]:
    """Whether each gradient keeps its bits at every thread count of ``counts`` (float32);
    the thread count in place before is restored."""
    before = torch.get_num_threads()
    rows = []
    try:
        for name, case in determinism_cases().items():
            for backend, chosen in served(case, torch.float32):
                runs = []
                for count in counts:
                    torch.set_num_threads(count)
                    runs.append(_backward(case, backend))
                same = [all(torch.equal(r[i], runs[0][i]) for r in runs) for i in range(3)]
                rows.append({"conv": name, "backend": chosen, "same": same})
    finally:
        torch.set_num_threads(before)
    return {"counts": list(counts), "rows": rows}


def accuracy(quick: bool = False) -> list[dict[str, object]]:
    """Per layer, dtype and serving backend: each gradient's error in ULPs of its largest
    entry and its normwise relative error, against the float64 oracle."""
    rows = []
    for layer, case in accuracy_layers(quick).items():
        go, x, w, kw = case
        for dtype in _SHORT:
            for forced, chosen in served(case, dtype):
                errs = backward_error(go, x, w, **kw, dtype=dtype, backend=forced)
                rows.append({"layer": layer, "backend": chosen, "dtype": _SHORT[dtype],
                             "ulps": {g: e.ulps for g, e in errs.items()},
                             "rel": {g: e.rel for g, e in errs.items()}})
    return rows


def growth(quick: bool = False) -> list[dict[str, object]]:
    """grad_weight's relative error as the reduction length N*H*W grows 16x, by more samples
    at a 64x64 image (``grown="N"``) or a bigger image of one sample (``grown="HW"``), for
    an 8->8 channel 3x3 conv, per serving backend and dtype."""
    shapes = {"N": [(n, 64) for n in (1, 2, 4, 8, 16)],
              "HW": [(1, s) for s in (64, 90, 128, 181, 256)]}
    if quick:
        shapes = {k: [v[0], v[-1]] for k, v in shapes.items()}
    series: dict[tuple[str, str, str], list[list[float]]] = {}
    for grown, points in shapes.items():
        for n, size in points:
            case = _case(n, 8, 8, size, 3, seed=n * 1000 + size, padding=1)
            go, x, w, kw = case
            for dtype in _SHORT:
                for forced, chosen in served(case, dtype):
                    err = backward_error(go, x, w, **kw, dtype=dtype, backend=forced,
                                         output_mask=(False, True, False))
                    key = (chosen, _SHORT[dtype], grown)
                    series.setdefault(key, []).append([n * size * size,
                                                       err["grad_weight"].rel])
    return [{"backend": b, "dtype": d, "grown": g, "points": pts}
            for (b, d, g), pts in sorted(series.items())]


def onednn_layouts() -> list[dict[str, object]]:
    """oneDNN's convolution primitives for a full backward of a 3-channel 5x5 stem and a
    32-channel 3x3 conv (float32): the implementation and the memory descriptors it logs.
    The channel block (``aBcd8b``: 8, ``aBcd16b``: 16, plain ``abcd``) fixes how oneDNN
    splits its sums, so it depends on the ISA setting."""
    from convlab.lab.method.profiling import onednn_trace

    convs = {"3-channel 5x5 stem": _case(32, 3, 16, 32, 5, padding=2),
             "3x3, 32 ch": accuracy_layers()["3x3, 32 ch"]}
    rows = []
    for name, case in convs.items():
        if not served(case, torch.float32)[:1] == [("mkldnn", "Mkldnn")]:
            continue
        calls = onednn_trace(lambda case=case: _backward(case, "mkldnn"))
        for c in calls:
            if c.op == "convolution":
                rows.append({"conv": name, "prop": c.prop, "impl": c.impl,
                             "layouts": c.layouts})
    return rows


def record(quick: bool = False) -> dict[str, object]:
    """Chapter 10's measurements on this machine and ISA setting, JSON-serialisable: the
    bf16/fp16 routing, run-to-run and thread-count bit equality, the accuracy table and
    the error growth sweep. ``quick`` keeps two accuracy layers and two sweep points."""
    go, x, w, kw = accuracy_layers()["7x7 stem"]
    f64 = backward_error(go, x, w, **kw, dtype=torch.float64)
    return {
        "threads": torch.get_num_threads(),
        "routing": routing(),
        "run_to_run": run_to_run(),
        "threads_bits": across_threads(),
        "accuracy": accuracy(quick),
        "growth": growth(quick),
        "float64_worst_rel": max(e.rel for e in f64.values()),
        "onednn_layouts": onednn_layouts(),
    }
