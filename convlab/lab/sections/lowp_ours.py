"""The ``lowp_ours`` section of a measurement record: convlab's own routes in bfloat16 and
float16 next to oneDNN's, where ATen sends those dtypes to oneDNN.

Two interleaved runs (:func:`convlab.lab.method.timing.interleaved`), each per reduced dtype that
:func:`convlab.lab.sections.lowp.support` finds supported, and in float32 for scale:

* ``reference``: on a few suite layers, the full backward of the from-scratch reference
  (:func:`convlab.aten.fast_reference.convolution_backward`; a reduced dtype takes its
  simple form, whose GEMMs are ``torch.matmul`` in that dtype) against the forced oneDNN
  backward in the same dtype;
* ``per_sample``: every route of :func:`convlab.scratch.per_sample.per_sample_weight_grad`
  on the layer of :mod:`convlab.lab.sections.per_sample_timing` (its ``LAYER``: N 8, 16 -> 32
  channels, 32x32, 3x3).

Per row: the median time, its ratio to the float32 row of the same candidate (median of
per-round ratios) with its verdict against the run's A/A band (the first float32
candidate timed twice), and the accuracy ``max |g - g64| / max |g64|`` against float64 from the
same rounded inputs (the arithmetic's error, as in :mod:`convlab.lab.sections.lowp`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from convlab.aten import fast_reference
from convlab.lab import paths
from convlab.lab.method import timing
from convlab.lab.paths import Layer
from convlab.lab.sections import lowp, per_sample_timing
from convlab.scratch.per_sample import ROUTES, per_sample_weight_grad

__all__ = ["record"]

FULL = {"rounds": 7, "min_calls": 3, "min_run_time": 0.05}
QUICK = {"rounds": 3, "min_calls": 1, "min_run_time": 0.005}
LAYERS = ("cifar5", "resnet14")
QUICK_LAYERS = ("cifar5",)
MASK = [True, True, False]
AA_SUFFIX = " (A/A)"  # the first float32 candidate of each run, timed twice: its A/A pair


def _error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """Largest ``max |g - g64| / max |g64|`` over the pairs."""
    return max(((g.double() - r).abs().max() / r.abs().max()).item()
               for g, r in zip(got, want, strict=True))


def _reference_fns(layer: Layer, name: str) -> tuple[dict, dict, dict]:
    """For ``layer`` in dtype ``name``: the timed calls (convlab's reference, forced
    oneDNN), oneDNN's context, and each call's error against float64."""
    dtype = lowp.LOW[name][0] if name in lowp.LOW else torch.float32
    x, w, b, go = layer.tensors(dtype=dtype)
    args = layer.args()
    want = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), None,
                                               *args, MASK)[:2]
    path = paths.get_path("mkldnn")

    def ours() -> object:
        return fast_reference.convolution_backward(go, x, w, None, *args, MASK)

    def theirs() -> object:
        return torch.ops.aten.convolution_backward(go, x, w, None, *args, MASK)

    with path.held():
        err_theirs = _error(theirs()[:2], want)
    key = f"{layer.name} {name}"
    return ({f"reference {key}": ours, f"onednn {key}": theirs},
            {f"onednn {key}": path.held},
            {f"reference {key}": _error(ours()[:2], want), f"onednn {key}": err_theirs})


def _per_sample_fns(name: str) -> tuple[dict, dict]:
    """Every per-sample route in dtype ``name``, and its error against float64."""
    dtype = lowp.LOW[name][0] if name in lowp.LOW else torch.float32
    x, w, go = (t.to(dtype) for t in per_sample_timing.layer_tensors(
        *per_sample_timing.LAYER))
    pad = per_sample_timing.LAYER[4] // 2
    want = per_sample_weight_grad(x.double(), w.shape, go.double(), padding=pad)
    fns: dict[str, Callable[[], object]] = {}
    errors = {}
    for route in ROUTES:
        def fn(route: str = route) -> torch.Tensor:
            return per_sample_weight_grad(x, w.shape, go, padding=pad, method=route)

        fns[f"{route} {name}"] = fn
        errors[f"{route} {name}"] = _error([fn()], [want])
    return fns, errors


def _with_twin(fns: dict[str, Callable[[], object]]) -> dict[str, Callable[[], object]]:
    """``fns`` plus its first float32 candidate again, under ``<name> (A/A)``."""
    first = next(k for k in fns if k.endswith(" float32"))
    return {**fns, first + AA_SUFFIX: fns[first]}


def _band(timings: dict[str, timing.Timing]) -> float:
    """The run's A/A band (:func:`_with_twin`'s pair)."""
    twin = next(k for k in timings if k.endswith(AA_SUFFIX))
    return timing.noise_band(timings[twin], timings[twin.removesuffix(AA_SUFFIX)])


def _rows(timings: dict[str, timing.Timing], errors: dict[str, float], band: float,
          ) -> list[dict[str, Any]]:
    """One row per ``"<candidate> <dtype>"``: its time over the candidate's float32 one,
    with the verdict against the run's A/A ``band`` (float32 rows: 1, no verdict)."""
    rows = []
    for key, t in timings.items():
        if key.endswith(AA_SUFFIX):
            continue
        what, dtype = key.rsplit(" ", 1)
        ratios = timing.round_ratios(t, timings[f"{what} float32"])
        verdict = timing.verdict_of(ratios, band).verdict if dtype != "float32" else "-"
        rows.append({"candidate": what, "dtype": dtype, "median_s": t.median,
                     "over_float32": statistics.median(ratios), "verdict": verdict,
                     "max_rel_error": errors[key]})
    return rows


def record(quick: bool = False) -> dict[str, Any]:
    """The ``lowp_ours`` section (module docstring); ``quick``: one small layer, 3 rounds."""
    cfg = QUICK if quick else FULL
    supported = lowp.support()
    names = ["float32", *(n for n, s in supported.items() if s["supported"])]
    fns: dict[str, Callable[[], object]] = {}
    around: dict[str, Callable[[], Any]] = {}
    errors: dict[str, float] = {}
    for layer in paths.suite_layers(list(QUICK_LAYERS if quick else LAYERS)):
        for name in names:
            f, a, e = _reference_fns(layer, name)
            fns.update(f)
            around.update(a)
            errors.update(e)
    fns = _with_twin(fns)
    around.update({k + AA_SUFFIX: a for k, a in around.items() if k + AA_SUFFIX in fns})
    reference = timing.interleaved(fns, around=around, **cfg)
    fns, errors_ps = {}, {}
    for name in names:
        f, e = _per_sample_fns(name)
        fns.update(f)
        errors_ps.update(e)
    per_sample = timing.interleaved(_with_twin(fns), threads=1, **cfg)
    return {"method": {**cfg, "threads": torch.get_num_threads(), "per_sample_threads": 1,
                       "error": lowp.ERROR_TEXT,
                       "per_sample_layer": list(per_sample_timing.LAYER)},
            "support": supported,
            "aa_band": {"reference": _band(reference), "per_sample": _band(per_sample)},
            "reference": _rows(reference, errors, _band(reference)),
            "per_sample": _rows(per_sample, errors_ps, _band(per_sample))}
