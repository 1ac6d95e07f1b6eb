"""The ``peers`` section of a measurement record: convlab's full backward against what a
user would call instead.

On 2-d layers, in one :func:`convlab.lab.method.timing.interleaved` run per layer: convlab's
``reference`` (N-d im2col + batched GEMM in torch ops), ``thnn`` (THNN's conv2d re-created
in torch ops, the backward reading the forward's saved columns) and ``numpy_ref`` (im2col +
GEMM in NumPy), against ATen's own im2col path (forced ``slow``, C++), oneDNN (forced
``mkldnn``) and ``torch.nn.grad.conv2d_input`` + ``conv2d_weight`` (+ the bias sum). ATen's
two paths run twice each (A/A pairs); the band pools all of the run's pairs. Each peer's
gradients are checked against ATen's before it is timed (``matches``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from convlab.lab import bench, paths
from convlab.lab.method.timing import aa_band, blas_threads, interleaved, round_ratios, verdict_of
from convlab.lab.paths import Layer, flops, min_bytes
from convlab.lab.sections.suite import timing_dict, verdict_dict

FULL = {"rounds": 7, "min_calls": 20, "min_run_time": 0.05}
QUICK = {"rounds": 3, "min_calls": 3, "min_run_time": 0.01}
LAYERS: tuple[Layer, ...] = (
    paths.suite_layers(["cifar5"])[0],
    Layer("mid3x3", (8, 64, 28, 28), (64, 64, 3, 3), padding=1, note="3x3, 64 channels"),
)
PEERS = ("reference", "thnn", "numpy_ref", "torch.nn.grad")
BASELINES = ("aten slow", "onednn")
# float32 sums of a few thousand terms: real errors (a wrong tap) are of order 1.
TOL = 1e-3


def _nn_grad(layer: Layer, tensors: paths.Tensors) -> Callable[[], object]:
    x, w, _, go = tensors
    p = layer.params

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gi = torch.nn.grad.conv2d_input(x.shape, w, go, p.stride, p.padding, p.dilation,
                                        p.groups)
        gw = torch.nn.grad.conv2d_weight(x, w.shape, go, p.stride, p.padding, p.dilation,
                                         p.groups)
        return gi, gw, go.sum((0, 2, 3))

    return run


def _candidates(layer: Layer) -> dict[str, tuple[paths.Path | None, Callable[[], object]]]:
    tensors = layer.tensors()
    out: dict[str, tuple[paths.Path | None, Callable[[], object]]] = {}
    for label, name in (("aten slow", "slow"), ("onednn", "mkldnn")):
        path = paths.get_path(name)
        for suffix in ("", " (A/A)"):
            out[label + suffix] = (path, path.runners(layer, tensors, hold=False)["backward"])
    for name in ("reference", "thnn", "numpy_ref"):
        path = paths.get_path(name)
        out[name] = (path, path.runners(layer, tensors, hold=False)["backward"])
    out["torch.nn.grad"] = (None, _nn_grad(layer, tensors))
    return out


def _matches(got: Sequence[object], want: Sequence[torch.Tensor]) -> bool:
    for g, w in zip(got, want, strict=True):
        g = torch.as_tensor(g).to(torch.float64)
        w = w.to(torch.float64)
        if g.shape != w.shape or (g - w).abs().max() > TOL * max(1.0, w.abs().max().item()):
            return False
    return True


def time_layer(layer: Layer, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    """One layer's interleaved run, and whether each candidate's gradients match ATen's."""
    cands = _candidates(layer)
    x, w, b, go = layer.tensors()
    want = torch.ops.aten.convolution_backward(go, x, w, [b.shape[0]], *layer.args(),
                                               [True, True, True])
    matches = {}
    for name, (path, fn) in cands.items():
        if path is not None:
            with path.held():
                matches[name] = _matches(fn(), want)
        else:
            matches[name] = _matches(fn(), want)
    around = {name: (lambda p=path: bench._settled(p)) for name, (path, _) in cands.items()
              if path is not None}
    timings = interleaved({name: fn for name, (_, fn) in cands.items()}, rounds=cfg["rounds"],
                          min_run_time=cfg["min_run_time"], min_calls=cfg["min_calls"],
                          around=around)
    return timings, matches


def record(quick: bool = False) -> dict[str, Any]:
    """The ``peers`` section (module docstring); the band pools every layer's A/A pairs."""
    cfg = QUICK if quick else FULL
    layers = LAYERS[:1] if quick else LAYERS
    threads = torch.get_num_threads()
    with blas_threads(threads) as blas:
        runs = [(layer, *time_layer(layer, cfg)) for layer in layers]
    band = aa_band([(t[a], t[f"{a} (A/A)"]) for _, t, _ in runs for a in BASELINES])
    rows = []
    for layer, timings, matches in runs:
        count, moved = flops(layer, "backward"), min_bytes(layer, "backward")
        row: dict[str, Any] = {
            "layer": layer.name, "shape": layer.describe(),
            "times": {name: {**timing_dict(t, count, moved), "matches": matches[name]}
                      for name, t in timings.items()},
            "ratios": {},
        }
        for peer in (*PEERS, "onednn"):
            for base in BASELINES:
                if peer != base:
                    v = verdict_of(round_ratios(timings[peer], timings[base]), band)
                    row["ratios"][f"{peer} / {base}"] = verdict_dict(v)
        rows.append(row)
    return {"method": {**cfg, "threads": threads, "numpy_blas": blas,
                       "band": "pooled over every layer's A/A pairs (aten slow and oneDNN "
                               "each timed twice)"},
            "aa_band": band, "layers": rows}
