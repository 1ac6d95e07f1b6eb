"""The ``reference_speed`` section of a measurement record: convlab's from-scratch backward,
simple and fast, against ATen's im2col path and oneDNN on every suite layer.

Per layer, one :func:`convlab.lab.method.timing.interleaved` run of the full backward (all three
gradients) of:

* ``reference``: :func:`convlab.scratch.reference.convolution_backward` (the simple form);
* ``reference fast``: :func:`convlab.aten.fast_reference.convolution_backward`, the form
  :func:`convlab.aten.fast_reference.choose_form` picks (named in ``form``), and each other
  form the layer allows (``fast shift``, ``fast im2col``), the data the rule is fitted on;
* ``aten slow`` (forced im2col, C++) and ``onednn`` (forced ``mkldnn``), each twice (A/A).

The band pools every layer's A/A pairs. ``profile`` gives, for the ResNet-like layers, the
share of the backward's self CPU time in ``aten::copy_`` (the column copies) and in all
data-movement ops (``copy_``, ``fill_``, ``zero_``, ``cat``, ``constant_pad_nd``) for both
forms, from :func:`convlab.lab.method.profiling.profile_ops`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from convlab.aten import fast_reference
from convlab.lab import paths
from convlab.lab.method import profiling
from convlab.lab.method.timing import Timing, aa_band, interleaved, round_ratios, verdict_of
from convlab.lab.paths import Layer, flops, min_bytes
from convlab.lab.sections.suite import FULL_LAYERS, timing_dict, verdict_dict
from convlab.scratch import reference

FULL = {"rounds": 7, "min_calls": 5, "min_run_time": 0.05}
QUICK = {"rounds": 3, "min_calls": 2, "min_run_time": 0.01}
QUICK_LAYERS = ("cifar5", "depthwise", "conv1d")
PROFILE_LAYERS = ("resnet14", "mid3x3")
MID3X3 = Layer("mid3x3", (8, 64, 28, 28), (64, 64, 3, 3), padding=1, note="3x3, 64 channels")
BASELINES = ("aten slow", "onednn")
MOVES = ("aten::copy_", "aten::fill_", "aten::zero_", "aten::cat", "aten::constant_pad_nd")
ALL_MASK = [True, True, True]
# What the fast im2col form was when a section was taken (sections without the key timed
# the first one: the simple reference with 4 L2 of columns per chunk; a section with
# another value, a form since replaced).
IM2COL_FORM = (f"grad_input by sample in C++ (one GEMM and col2im per sample and "
               f"thread), {fast_reference.L2_PER_CHUNK} L2 of columns per chunk")


def layers(quick: bool = False) -> list[Layer]:
    """The timed layers: the suite's (as the ``suite`` section times them) and mid3x3."""
    return [*paths.suite_layers(list(QUICK_LAYERS if quick else FULL_LAYERS)),
            *([] if quick else [MID3X3])]


def _ours(fn: Callable[..., object], layer: Layer, tensors: paths.Tensors,
          **kw: object) -> Callable[[], object]:
    x, w, b, go = tensors
    args = layer.args()
    return lambda: fn(go, x, w, [b.shape[0]], *args, ALL_MASK, **kw)


def candidates(layer: Layer, threads: int | None = None,
               ) -> tuple[dict[str, Callable[[], object]], dict, str]:
    """name -> zero-argument backward; name -> context factory (forced backends); the
    form the rule picks for this layer at ``threads`` (default: torch's current count)."""
    tensors = layer.tensors()
    x, w, _, _ = tensors
    p = layer.params
    chosen = fast_reference.choose_form(x.shape, w.shape, p, x.dtype, threads)
    fns = {"reference": _ours(reference.convolution_backward, layer, tensors),
           "reference fast": _ours(fast_reference.convolution_backward, layer, tensors)}
    for form in ("shift", "im2col"):
        try:
            fast_reference.check_form(form, x, w, p)
        except ValueError:
            continue
        if form != chosen:
            fns[f"fast {form}"] = _ours(fast_reference.convolution_backward, layer, tensors,
                                        form=form)
    around: dict[str, Callable[[], Any]] = {}
    for label, name in (("aten slow", "slow"), ("onednn", "mkldnn")):
        path = paths.get_path(name)
        for suffix in ("", " (A/A)"):
            fns[label + suffix] = path.runners(layer, tensors, hold=False)["backward"]
            around[label + suffix] = path.held
    return fns, around, chosen


def time_layer(layer: Layer, cfg: dict[str, Any],
               threads: int | None = None) -> tuple[dict[str, Timing], str]:
    """One layer's interleaved run (``threads``: torch threads, default the current)."""
    fns, around, chosen = candidates(layer, threads)
    timings = interleaved(fns, rounds=cfg["rounds"], min_run_time=cfg["min_run_time"],
                          min_calls=cfg["min_calls"], around=around, threads=threads)
    return timings, chosen


def rows_of(runs: Sequence[tuple[Layer, dict[str, Timing], str]]) -> tuple[list[dict], float]:
    """Per-layer rows with the verdicts against the pooled A/A band, and the band."""
    band = aa_band([(t[a], t[f"{a} (A/A)"]) for _, t, _ in runs for a in BASELINES])
    rows = []
    for layer, timings, chosen in runs:
        count, moved = flops(layer, "backward"), min_bytes(layer, "backward")
        row: dict[str, Any] = {
            "layer": layer.name, "shape": layer.describe(), "form": chosen,
            "times": {k: timing_dict(t, count, moved) for k, t in timings.items()},
            "ratios": {},
        }
        for ours in ("reference", "reference fast"):
            for base in BASELINES:
                v = verdict_of(round_ratios(timings[ours], timings[base]), band)
                row["ratios"][f"{ours} / {base}"] = verdict_dict(v)
        for other in ("fast shift", "fast im2col"):
            if other in timings:
                v = verdict_of(round_ratios(timings["reference fast"], timings[other]), band)
                row["ratios"][f"reference fast / {other}"] = verdict_dict(v)
        rows.append(row)
    return rows, band


def rule_rows(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Per layer of a stored ``reference_speed`` section, the fast reference as
    :func:`convlab.aten.fast_reference.choose_form` now picks it at the section's thread
    count: ``{"layer", "shape", "form", "simple / slow", "fast / slow", "fast / onednn",
    "simple / fast"}``, each ratio the median of the per-round ratios of that run.

    The section times every form a layer allows (the one the rule picked then, as
    ``reference fast``, and the others as ``fast <form>``), so a record taken under an
    earlier rule still gives the current rule's numbers; a form the record did not time
    raises ``ValueError``.
    """
    threads = section["method"]["threads"]
    by_name = {layer.name: layer for layer in [*paths.SUITE, MID3X3]}
    rows = []
    for row in section["layers"]:
        layer = by_name[row["layer"]]
        form = fast_reference.choose_form(layer.input_shape, layer.weight_shape,
                                          layer.params, torch.float32, threads)
        key = "reference fast" if form == row["form"] else f"fast {form}"
        if key not in row["times"]:
            raise ValueError(f"layer {row['layer']}: the record has no time of the "
                             f"{form!r} form")
        rounds = {k: t["rounds_s"] for k, t in row["times"].items()}
        rows.append({"layer": row["layer"], "shape": row["shape"], "form": form,
                     "simple / slow": _median_ratio(rounds, "reference", "aten slow"),
                     "fast / slow": _median_ratio(rounds, key, "aten slow"),
                     "fast / onednn": _median_ratio(rounds, key, "onednn"),
                     "simple / fast": _median_ratio(rounds, "reference", key)})
    return rows


def _median_ratio(rounds: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a``'s time over ``b``'s (one interleaved run)."""
    return statistics.median(x / y for x, y in zip(rounds[a], rounds[b], strict=True))


def copy_shares(layer: Layer, repeat: int = 3) -> dict[str, Any]:
    """Share of self CPU time in ``aten::copy_`` and in every op of ``MOVES``, per form."""
    tensors = layer.tensors()
    out: dict[str, Any] = {"layer": layer.name}
    for name, fn in (("reference", _ours(reference.convolution_backward, layer, tensors)),
                     ("reference fast", _ours(fast_reference.convolution_backward, layer,
                                              tensors))):
        ops = profiling.profile_ops(fn, top=1000, repeat=repeat)
        out[name] = {
            "copy_share": sum(o.share for o in ops if o.name == "aten::copy_"),
            "moves_share": sum(o.share for o in ops if o.name in MOVES),
            "top": [{"op": o.name, "calls": o.calls, "self_ms": o.self_ms, "share": o.share}
                    for o in ops[:6]],
        }
    return out


def record(quick: bool = False) -> dict[str, Any]:
    """The ``reference_speed`` section (module docstring)."""
    cfg = QUICK if quick else FULL
    runs = [(layer, *time_layer(layer, cfg)) for layer in layers(quick)]
    rows, band = rows_of(runs)
    by_name = {layer.name: layer for layer in [*paths.SUITE, MID3X3]}
    profiled = PROFILE_LAYERS[:1] if quick else PROFILE_LAYERS
    return {"method": {**cfg, "threads": torch.get_num_threads(),
                       "band": "pooled over every layer's A/A pairs (aten slow, oneDNN)",
                       "im2col_form": IM2COL_FORM},
            "aa_band": band, "layers": rows,
            "profile": [copy_shares(by_name[name]) for name in profiled]}
