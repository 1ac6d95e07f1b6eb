"""The ``lowp`` section of a measurement record: oneDNN's convolution backward in bfloat16
and float16 against float32, where ATen sends those dtypes to oneDNN.

ATen routes a bfloat16 (float16) convolution to oneDNN only where
``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` (``_fp16_supported()``) is true, i.e.
where the ISA setting allows oneDNN's reduced-precision kernels; elsewhere the dtype is
stored as not supported, with that reason, and not timed (it would time the slow path).

For a few suite layers, one :func:`convlab.lab.method.timing.interleaved` run times the forced
oneDNN full backward (``convlab.lab.paths`` ``mkldnn``, the suite's call) in float32,
float32 again (the A/A pair of each layer, pooled into the run's band), and each supported
reduced dtype. Per layer and dtype the section stores the times, the ratio to float32
(median over rounds with its order-statistic CI and the smallest ratio the run resolves,
:mod:`convlab.lab.method.effect`, and the sign-test verdict), oneDNN's implementation per pass
(:func:`convlab.lab.sections.impls.conv_impls`) and the accuracy: ``max |g - g64| / max |g64|`` of
``grad_input`` and ``grad_weight``, ``g64`` computed in float64 from the same (rounded)
inputs, so it is the kernel's own arithmetic error, not the rounding of its inputs.

A candidate whose one call takes more than ``MAX_CALL_S`` (oneDNN's own primitive times in
the traced call; float16 ``grad_weight`` runs oneDNN's reference loops, ``ref:any``, on
some CPUs, seconds per call) is not timed in rounds: its row stores that one call's
primitive time (``single_call_s``) and no ratio, so the section stays within minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from convlab.lab import paths
from convlab.lab.method import effect, profiling
from convlab.lab.method.timing import aa_band, default_clock, round_ratios, verdict_of
from convlab.lab.paths import Layer, NotApplicable
from convlab.lab.sections.impls import conv_impls
from convlab.lab.sections.suite import run_candidates, timing_dict

FULL = {"rounds": 7, "min_calls": 5, "min_run_time": 0.05}
QUICK = {"rounds": 3, "min_calls": 2, "min_run_time": 0.01}
FULL_LAYERS = ("resnet14", "cifar5", "depthwise")
QUICK_LAYERS = ("cifar5",)
# dtype name -> (dtype, the torch.ops.mkldnn query ATen's routing reads)
LOW: dict[str, tuple[torch.dtype, str]] = {
    "bfloat16": (torch.bfloat16, "_is_mkldnn_bf16_supported"),
    "float16": (torch.float16, "_is_mkldnn_fp16_supported"),
}
MAX_CALL_S = 0.5
ERROR_TEXT = ("max |g - g64| / max |g64| per gradient; g64 in float64 from the same "
              "rounded inputs (the kernel's arithmetic error)")


def support() -> dict[str, dict[str, Any]]:
    """Per reduced dtype: whether ATen would route it to oneDNN here, and if not why."""
    out: dict[str, dict[str, Any]] = {}
    for name, (_, query) in LOW.items():
        ask = getattr(torch.ops.mkldnn, query, None) if torch.backends.mkldnn.is_available() \
            else None
        if ask is None:
            out[name] = {"supported": False, "reason": "no oneDNN (or no "
                         f"torch.ops.mkldnn.{query}) in this build"}
        elif not ask():
            out[name] = {"supported": False, "reason": f"torch.ops.mkldnn.{query}() is "
                         f"False under this setting: ATen sends {name} to the slow path"}
        else:
            out[name] = {"supported": True, "reason": None}
    return out


def max_rel_errors(layer: Layer, dtype: torch.dtype) -> dict[str, float]:
    """``grad_input`` and ``grad_weight`` of the forced oneDNN backward in ``dtype`` against
    float64 on the same rounded inputs (module docstring)."""
    x, w, _, go = layer.tensors(dtype=dtype)
    mask = [True, True, False]
    with paths.get_path("mkldnn").held():
        got = torch.ops.aten.convolution_backward(go, x, w, None, *layer.args(), mask)
    ref = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), None,
                                              *layer.args(), mask)
    return {name: ((g.double() - r).abs().max() / r.abs().max()).item()
            for name, g, r in (("grad_input", got[0], ref[0]),
                               ("grad_weight", got[1], ref[1]))}


def _candidates(layers: Sequence[Layer],
                dtypes: Sequence[str]) -> tuple[dict, dict, dict, dict]:
    """Timed candidates ``"<layer> <dtype>"`` (plus ``"<layer> float32 again"``), the
    implementations per candidate, the layers/dtypes ATen would not force, and the
    candidates too slow to time in rounds (their one call's primitive seconds)."""
    path = paths.get_path("mkldnn")
    candidates, impl, skipped, slow = {}, {}, {}, {}
    for layer in layers:
        for name in ("float32", *dtypes):
            dtype = LOW[name][0] if name in LOW else torch.float32
            try:
                path.check(layer, torch.device("cpu"), dtype)
            except NotApplicable as err:
                skipped[(layer.name, name)] = str(err)
                continue
            fn = path.runners(layer, layer.tensors(dtype=dtype), hold=False)["backward"]
            with path.held():
                calls = profiling.onednn_trace(fn)
            impl[f"{layer.name} {name}"] = conv_impls(calls)
            seconds = sum(c.ms for c in calls) / 1e3
            if seconds > MAX_CALL_S and name != "float32":
                slow[f"{layer.name} {name}"] = seconds
                continue
            candidates[f"{layer.name} {name}"] = (path, fn)
            if name == "float32":
                again = path.runners(layer, layer.tensors(), hold=False)["backward"]
                candidates[f"{layer.name} float32 again"] = (path, again)
    return candidates, impl, skipped, slow


def record(quick: bool = False) -> dict[str, Any]:
    """The ``lowp`` section (module docstring); ``quick``: one small layer, 3 rounds."""
    cfg = QUICK if quick else FULL
    layers = paths.suite_layers(list(QUICK_LAYERS if quick else FULL_LAYERS))
    supported = support()
    dtypes = [name for name, s in supported.items() if s["supported"]]
    candidates, impl, skipped, slow = _candidates(layers, dtypes)
    timings = run_candidates(candidates, cfg)
    pairs = [(timings[f"{n} float32 again"], timings[f"{n} float32"])
             for n in (layer.name for layer in layers) if f"{n} float32" in timings]
    band = aa_band(pairs)
    aa = [r for a, b in pairs for r in round_ratios(a, b)]
    rows = []
    for layer in layers:
        base = timings.get(f"{layer.name} float32")
        for name in ("float32", *dtypes):
            key = f"{layer.name} {name}"
            if key not in timings and key not in slow:
                rows.append({"layer": layer.name, "dtype": name,
                             "skipped": skipped.get((layer.name, name), "not timed")})
                continue
            dtype = LOW[name][0] if name in LOW else torch.float32
            row: dict[str, Any] = {
                "layer": layer.name, "dtype": name, "shape": layer.describe(),
                "aten_picks": paths.get_path("native").check(layer, torch.device("cpu"),
                                                             dtype),
                "impl": impl[key],
                "max_rel_error": max_rel_errors(layer, dtype),
            }
            if key in slow:
                row["single_call_s"] = slow[key]
            else:
                row["times"] = timing_dict(timings[key], paths.flops(layer, "backward"))
            if name != "float32" and base is not None and key in timings:
                t = timings[key]
                row["over_float32"] = {
                    **effect.ratio_summary(t.rounds, base.rounds, aa),
                    "verdict": verdict_of(round_ratios(t, base), band).verdict,
                }
            rows.append(row)
    return {
        "method": {**cfg, "seed": 0, "threads": torch.get_num_threads(),
                   "clock": default_clock(), "error": ERROR_TEXT, "max_call_s": MAX_CALL_S,
                   "path": "forced oneDNN (mkldnn), full backward"},
        "support": supported, "aa_band": band, "aa_pairs": len(pairs), "rows": rows,
    }
