"""The ``suite`` section of a measurement record: ATen's backends side by side.

Every measurement is one :func:`convlab.lab.method.timing.interleaved` run (per-round ratios,
shuffled order, at least ``min_calls`` calls per round); every verdict is the sign test of
:func:`convlab.lab.method.timing.verdict_of` against the A/A band of the main run, pooled over
every layer's A/A pair (``native`` against its forced twin, the same kernel).

* ``layers``: every layer of ``convlab.lab.paths.SUITE`` (quick: ``QUICK_LAYERS``), the
  full backward of forced oneDNN (``mkldnn``) and the forced im2col path (``slow``), and of
  ``native`` on the ``AA_LAYERS``: seconds, GFLOP/s, GB/s of the bytes the pass must move,
  and slow / oneDNN;
* ``split``: ``grad_input`` and ``grad_weight`` alone, per backend;
* ``channels_last``: both backends on NCHW and channels_last tensors, and the oneDNN
  reorders each runs;
* ``c_in_sweep``: slow / oneDNN as the input channels grow (a stem has 3);
* ``threads``: 1 thread against 2 (and all of this machine's, if more), side by side;
* ``flop_check``: convlab's FLOP formula against ``torch.utils.flop_counter`` per pass.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from convlab.lab import bench, bench_report, paths
from convlab.lab.method import profiling
from convlab.lab.method.timing import (
    ALPHA,
    BAND_QUANTILE,
    Timing,
    Verdict,
    aa_band,
    default_clock,
    interleaved,
    round_ratios,
    verdict_of,
)
from convlab.lab.paths import Layer, NotApplicable, flops, min_bytes

FULL = {"rounds": 7, "min_calls": 20, "min_run_time": 0.05}
QUICK = {"rounds": 3, "min_calls": 2, "min_run_time": 0.01}
QUICK_LAYERS = ("cifar5", "depthwise", "conv1d")
# resnet56, resnet28 and resnet14 have the same MACs (ResNet's stages trade H*W for
# channels); the records time resnet14 only, to fit a 2-core machine (`convlab bench`
# times all three).
FULL_LAYERS = tuple(layer.name for layer in paths.SUITE
                    if layer.name not in ("resnet56", "resnet28"))
# Layers whose ``native`` path is timed too, against its forced twin, and the slow path
# twice (``slow_aa``): the A/A pairs whose per-round ratios, pooled, give the band (small to
# big, so the band covers both; both backends, so it sees the slow path's noise too).
AA_LAYERS = ("cifar5", "depthwise", "conv1d", "grouped", "dilated")
SPLIT_LAYERS = ("resnet14", "depthwise")
QUICK_SPLIT = ("depthwise",)
C_IN = (3, 16, 64)
QUICK_C_IN = (3, 64)
THREAD_LAYERS = ("conv1d", "depthwise")  # compute-bound and memory-bound
METHOD_TEXT = (
    "interleaved rounds in a seeded random order; each round times >= min_calls calls per "
    "candidate (median over <= 10 blocks); ratios are per round; the A/A band is the "
    f"{BAND_QUANTILE:.0%} quantile of |log| of the per-round ratios of every A/A pair of "
    "the main run, pooled; a verdict (slower/faster) needs the two-sided sign test of the "
    f"per-round ratios against the band's edges to reject at alpha={ALPHA}"
)


def timing_dict(t: Timing, flop_count: int | None = None,
                moved: int | None = None) -> dict[str, Any]:
    """A Timing as JSON: seconds (median, quartiles, range, every round), rates."""
    q1, q3 = t.quartiles
    out: dict[str, Any] = {
        "median_s": t.median, "q1_s": q1, "q3_s": q3, "min_s": min(t.rounds),
        "max_s": max(t.rounds), "rounds_s": list(t.rounds), "calls_per_round": t.calls_per_round,
    }
    if flop_count is not None:
        out["flops"] = flop_count
        out["gflops"] = flop_count / t.median / 1e9
    if moved is not None:
        out["min_bytes"] = moved
        out["gbytes_s"] = moved / t.median / 1e9
    return out


def verdict_dict(v: Verdict) -> dict[str, Any]:
    """A Verdict as JSON."""
    return {"median": v.ratio.median, "low": v.ratio.low, "high": v.ratio.high,
            "per_round": list(v.ratio.per_round), "above": v.above, "below": v.below,
            "p_value": v.p_value, "verdict": v.verdict}


def _held(path: paths.Path) -> Callable[[], Any]:
    return path.held


def run_candidates(candidates: Mapping[str, tuple[paths.Path, Callable[[], object]]],
                   cfg: Mapping[str, Any],
                   threads: Mapping[str, int] | None = None) -> dict[str, Timing]:
    """One interleaved run of ``name -> (path, fn)``, each path's backend held around it."""
    fns = {name: fn for name, (_, fn) in candidates.items()}
    around = {name: _held(path) for name, (path, _) in candidates.items()}
    return interleaved(fns, rounds=cfg["rounds"], min_run_time=cfg["min_run_time"],
                       min_calls=cfg["min_calls"], around=around, threads=threads)


def _main(layers: Sequence[Layer], cfg: Mapping[str, Any]
          ) -> tuple[list[dict], float, int, dict[str, float]]:
    report = bench_report.Report()
    for layer in layers:
        aa = layer.name in AA_LAYERS
        chosen = ["native", "mkldnn", "slow"] if aa else ["mkldnn", "slow"]
        bench.benchmark([layer], paths=chosen, passes=["backward"], device="cpu",
                        repeats=["slow_aa"] if aa else None,
                        memory=False, gemm=False, rounds=cfg["rounds"],
                        min_run_time=cfg["min_run_time"], min_calls=cfg["min_calls"],
                        report=report)
    pairs = bench_report.aa_pairs(report.results)
    band = aa_band(pairs)
    by_family: dict[str, list[tuple[Timing, Timing]]] = {}
    rows = []
    for layer in layers:
        res = {r.path: r for r in report.results if r.layer == layer.name}
        row: dict[str, Any] = {
            "layer": layer.name, "shape": layer.describe(), "note": layer.note,
            "macs": layer.macs, "groups": layer.groups,
            "native_backend": res["native"].backend if "native" in res else None,
            "times": {p: {"backend": r.backend, **timing_dict(r.timing, r.flops, r.min_bytes)}
                      for p, r in res.items()},
            "skipped": {s.path: s.reason for s in report.skipped if s.layer == layer.name},
        }
        if "mkldnn" in res and "slow" in res:
            row["slow_over_onednn"] = verdict_dict(
                verdict_of(round_ratios(res["slow"].timing, res["mkldnn"].timing), band))
        aa = bench_report.all_aa_pairs(list(res.values()))
        if aa:
            row["aa_per_round"] = [v for a, b in aa for v in round_ratios(a.timing, b.timing)]
            row["aa_pairs"] = [f"{a.path} / {b.path} ({a.backend})" for a, b in aa]
        for a, b in aa:
            by_family.setdefault("slow" if a.path == "slow" else a.backend, []).append(
                (a.timing, b.timing))
        rows.append(row)
    return rows, band, len(pairs), {k: aa_band(v) for k, v in by_family.items()}


def _summary(rows: Sequence[dict]) -> dict[str, Any]:
    ratios = [r["slow_over_onednn"]["median"] for r in rows if "slow_over_onednn" in r]
    verdicts = [r["slow_over_onednn"]["verdict"] for r in rows if "slow_over_onednn" in r]
    if not ratios:
        return {}
    return {
        "slow_over_onednn_median": statistics.median(ratios),
        "slow_over_onednn_geomean": math.exp(statistics.fmean(math.log(x) for x in ratios)),
        "slow_over_onednn_min": min(ratios), "slow_over_onednn_max": max(ratios),
        "verdicts": {v: verdicts.count(v) for v in ("slower", "faster", "within noise", "?")},
        "layers": len(ratios),
    }


def _split(layers: Sequence[Layer], cfg: Mapping[str, Any], band: float) -> list[dict]:
    report = bench.benchmark(layers, paths=["mkldnn", "slow"],
                             passes=["backward_input", "backward_weight"], device="cpu",
                             memory=False, gemm=False, rounds=cfg["rounds"],
                             min_run_time=cfg["min_run_time"], min_calls=cfg["min_calls"])
    table = {(r.layer, r.path, r.pass_): r for r in report.results}
    rows = []
    for layer in layers:
        for path in ("mkldnn", "slow"):
            gi = table.get((layer.name, path, "backward_input"))
            gw = table.get((layer.name, path, "backward_weight"))
            if gi is None or gw is None:
                continue
            rows.append({
                "layer": layer.name, "path": path, "backend": gi.backend,
                "grad_input": timing_dict(gi.timing, gi.flops, gi.min_bytes),
                "grad_weight": timing_dict(gw.timing, gw.flops, gw.min_bytes),
                "grad_weight_share": gw.timing.median / (gi.timing.median + gw.timing.median),
            })
        for pass_ in ("backward_input", "backward_weight"):
            slow = table.get((layer.name, "slow", pass_))
            mk = table.get((layer.name, "mkldnn", pass_))
            if slow is not None and mk is not None:
                rows.append({"layer": layer.name, "pass": pass_, "slow_over_onednn":
                             verdict_dict(verdict_of(round_ratios(slow.timing, mk.timing),
                                                     band))})
    return rows


def _channels_last(layer: Layer, cfg: Mapping[str, Any], band: float) -> dict[str, Any]:
    plain = layer.tensors()
    last = tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                 for t in plain)
    candidates = {}
    reorders = {}
    for name in ("mkldnn", "slow"):
        path = paths.get_path(name)
        for fmt, tensors in (("contiguous", plain), ("channels_last", last)):
            fn = path.runners(layer, tensors, hold=False)["backward"]
            candidates[f"{name} {fmt}"] = (path, fn)
            if name == "mkldnn":
                with path.held():
                    calls = profiling.onednn_trace(fn)
                reorders[fmt] = sum(c.op == "reorder" for c in calls)
    timings = run_candidates(candidates, cfg)
    moved = min_bytes(layer, "backward")
    out: dict[str, Any] = {
        "layer": layer.name, "shape": layer.describe(), "onednn_reorders": reorders,
        "times": {k: timing_dict(t, flops(layer, "backward"), moved) for k, t in timings.items()},
    }
    for a, b in (("mkldnn channels_last", "mkldnn contiguous"),
                 ("slow channels_last", "slow contiguous"),
                 ("slow channels_last", "mkldnn channels_last")):
        out[f"{a} / {b}"] = verdict_dict(verdict_of(round_ratios(timings[a], timings[b]), band))
    return out


def _c_in_sweep(c_ins: Sequence[int], cfg: Mapping[str, Any], band: float) -> dict[str, Any]:
    layers = [Layer(f"c_in {c}", (8, c, 28, 28), (64, c, 3, 3), padding=1) for c in c_ins]
    candidates = {}
    for layer in layers:
        tensors = layer.tensors()
        for name in ("mkldnn", "slow"):
            path = paths.get_path(name)
            candidates[f"{name} {layer.name}"] = (path, path.runners(layer, tensors,
                                                                      hold=False)["backward"])
    timings = run_candidates(candidates, cfg)
    rows = []
    for c, layer in zip(c_ins, layers, strict=True):
        mk, slow = timings[f"mkldnn {layer.name}"], timings[f"slow {layer.name}"]
        count = flops(layer, "backward")
        rows.append({"c_in": c, "shape": layer.describe(),
                     "mkldnn": timing_dict(mk, count), "slow": timing_dict(slow, count),
                     "slow_over_onednn": verdict_dict(verdict_of(round_ratios(slow, mk),
                                                                 band))})
    return {"n": 8, "c_out": 64, "hw": 28, "kernel": 3, "rows": rows}


def thread_counts() -> list[int]:
    """1, 2 and all of this process's threads (sorted, distinct)."""
    most = torch.get_num_threads()
    return sorted({1, min(2, most), most})


def _threads(layers: Sequence[Layer], cfg: Mapping[str, Any], band: float) -> dict[str, Any]:
    counts = thread_counts()
    candidates, per_thread = {}, {}
    for layer in layers:
        tensors = layer.tensors()
        for name in ("mkldnn", "slow"):
            path = paths.get_path(name)
            fn = path.runners(layer, tensors, hold=False)["backward"]
            for n in counts:
                key = f"{name} {layer.name} x{n}"
                candidates[key] = (path, fn)
                per_thread[key] = n
    timings = run_candidates(candidates, cfg, threads=per_thread)
    rows = []
    for layer in layers:
        for name in ("mkldnn", "slow"):
            one = timings[f"{name} {layer.name} x1"]
            row: dict[str, Any] = {"layer": layer.name, "path": name,
                                   "times": {str(n): timing_dict(timings[
                                       f"{name} {layer.name} x{n}"]) for n in counts}}
            for n in counts[1:]:
                many = timings[f"{name} {layer.name} x{n}"]
                # speed-up = t(1) / t(n): "slower" here means n threads are faster
                row[f"speedup_x{n}"] = verdict_dict(verdict_of(round_ratios(one, many), band))
            rows.append(row)
    return {"counts": counts, "rows": rows}


def flop_check(layers: Sequence[Layer]) -> list[dict[str, Any]]:
    """Per layer and pass: convlab's FLOPs and ``FlopCounterMode``'s (meta tensors, no work).

    ``FlopCounterMode`` counts a grouped backward_weight ``groups`` times too often (its
    formula ignores the groups of the weight gradient); convlab's is ``2 * MACs``.
    """
    rows = []
    for layer in layers:
        x, w, _, go = (t.to("meta") for t in layer.tensors())
        for pass_, mask in (("backward_input", [True, False, False]),
                            ("backward_weight", [False, True, False])):
            with FlopCounterMode(display=False) as counter:
                torch.ops.aten.convolution_backward(go, x, w, None, *layer.args(), mask)
            theirs = counter.get_total_flops()
            ours = flops(layer, pass_)
            rows.append({"layer": layer.name, "pass": pass_, "groups": layer.groups,
                         "convlab": ours, "flop_counter": theirs, "ratio": theirs / ours})
    return rows


def record(quick: bool = False) -> dict[str, Any]:
    """The ``suite`` section (module docstring); ``quick``: fewer layers, rounds and calls."""
    cfg = QUICK if quick else FULL
    layers = paths.suite_layers(list(QUICK_LAYERS if quick else FULL_LAYERS))
    rows, band, n_pairs, family_bands = _main(layers, cfg)
    out: dict[str, Any] = {
        "method": {**cfg, "seed": 0, "text": METHOD_TEXT, "threads": torch.get_num_threads(),
                   "clock": default_clock()},
        "flop_formula": paths.FLOP_FORMULA,
        "bytes_formula": "min_bytes: every operand read once, every result written once",
        "aa_band": band, "aa_pairs": n_pairs, "aa_layers": [n for n in AA_LAYERS if any(
            r["layer"] == n for r in rows)],
        # each family's own band (pooled over its pairs alone): oneDNN's backend name for
        # native against forced oneDNN, "slow" for the slow path timed twice
        "aa_band_by_family": family_bands,
        "layers_note": "resnet56/resnet28 not timed: same MACs as resnet14" if not quick
        else "quick: a subset of the layers",
        "layers": rows, "summary": _summary(rows),
    }
    out["split"] = _split(paths.suite_layers(list(QUICK_SPLIT if quick else SPLIT_LAYERS)),
                          cfg, band)
    try:
        out["channels_last"] = _channels_last(paths.suite_layers(["cifar5"])[0], cfg, band)
    except (NotApplicable, RuntimeError) as err:
        out["channels_last"] = {"error": f"{type(err).__name__}: {err}"}
    out["c_in_sweep"] = _c_in_sweep(QUICK_C_IN if quick else C_IN, cfg, band)
    out["threads"] = _threads(paths.suite_layers(["depthwise"] if quick else
                                                 list(THREAD_LAYERS)), cfg, band)
    out["flop_check"] = flop_check(paths.SUITE)
    return out
