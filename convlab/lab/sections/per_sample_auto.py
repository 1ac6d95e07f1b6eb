"""The sweep behind ``per_sample_weight_grad(method="auto")``: every route of
``convlab.aten.fast_per_sample.ROUTES`` (the scratch routes and convlab's C++ loop) timed
on a coarse grid of layers (channels per group, batch, kernel, threads), with the route
:func:`~convlab.aten.fast_per_sample.choose_method` picks and its time over the fastest
route's.

Each grid point is one interleaved run (:func:`convlab.lab.method.timing.interleaved`) of the
routes on a 16x16 image, stride 1, ``padding = k // 2``, float32, next to what a user
would run instead (``torch.func.vmap``, Opacus, BackPACK, ExpandedWeights), with each
one's peak memory; :func:`against_peers` reads them. :func:`record` is the
``per_sample_auto`` section of :mod:`convlab.lab.record.records`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from convlab.aten.fast_per_sample import ROUTES, choose_method, per_sample_weight_grad
from convlab.lab.method import timing
from convlab.lab.method.profiling import measure_memory
from convlab.lab.sections import per_sample_timing
from convlab.scratch import per_sample
from convlab.scratch.per_sample import onednn_block

__all__ = ["GRID", "LAYERS", "against_peers", "against_scratch", "auto_verdicts", "layer",
           "point", "record",
           "route_facts", "rule_route", "rule_summary", "sweep", "worst"]

# channels per group -> (C_in, C_out, groups): depthwise, a 3-channel stem, grouped, ResNet.
LAYERS: dict[int, tuple[int, int, int]] = {
    1: (16, 16, 16), 3: (3, 16, 1), 8: (16, 16, 2), 16: (16, 32, 1), 64: (64, 64, 1),
}
GRID: dict[str, tuple[int, ...]] = {
    "channels_per_group": tuple(LAYERS), "n": (1, 8, 64), "kernel": (1, 3, 5, 7),
    "threads": (1, 2),
}
QUICK_GRID: dict[str, tuple[int, ...]] = {
    "channels_per_group": (1, 16), "n": (8,), "kernel": (3,), "threads": (1,),
}
SIZE = 16
ROUNDS = 7
#: The auto route timed a second time in the same run: each point's A/A pair.
AA = "auto (A/A)"


def layer(channels_per_group: int, n: int, kernel: int, seed: int = 0
          ) -> tuple[torch.Tensor, tuple[int, int, int, int], torch.Tensor, int]:
    """``(input, weight_size, grad_output, groups)`` of one grid point."""
    c_in, c_out, groups = LAYERS[channels_per_group]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c_in, SIZE, SIZE, generator=gen)
    go = torch.randn(n, c_out, SIZE, SIZE, generator=gen)
    return x, (c_out, c_in // groups, kernel, kernel), go, groups


def point(channels_per_group: int, n: int, kernel: int, threads: int,
          quick: bool = False) -> dict[str, object]:
    """One grid point: median seconds per route, the fastest, the auto choice and its
    ratio to the fastest (1.0 when it is the fastest; per round too), the per-round
    ratios of the auto route timed twice (``aa_per_round``, its A/A pair); in the same
    interleaved run the
    peers of :func:`convlab.lab.sections.per_sample_timing.peer_routes` (``peers``: seconds, or
    "not installed"), the forward alone (``forward_s``, for ExpandedWeights, which runs
    it too), and the peak MiB allocated by one call of each route and peer
    (``peak_mib``)."""
    x, size, go, groups = layer(channels_per_group, n, kernel)
    fns: dict[str, Callable[[], object]] = {
        m: (lambda m=m: per_sample_weight_grad(x, size, go, 1, kernel // 2, 1, groups,
                                               method=m))
        for m in ROUTES}
    w = torch.randn(size, generator=torch.Generator().manual_seed(1))
    peers = per_sample_timing.peer_routes(x, w, go, kernel // 2, groups)
    missing = {name: fn for name, fn in peers.items() if isinstance(fn, str)}
    fns.update({name: fn for name, fn in peers.items() if not isinstance(fn, str)})
    fns["conv forward"] = lambda: F.conv2d(x, w, padding=kernel // 2, groups=groups)
    auto = choose_method(n, size[1], size[2:], torch.float32, threads=threads,
                         groups=groups)
    fns[AA] = lambda: per_sample_weight_grad(x, size, go, 1, kernel // 2, 1, groups,
                                             method=auto)
    t = timing.interleaved(fns, rounds=3 if quick else ROUNDS, min_run_time=0.005 if quick
                           else 0.02, threads=threads, min_calls=1 if quick else 3)
    seconds = {m: t[m].median for m in ROUTES}
    fastest = min(seconds, key=seconds.__getitem__)
    ratios = timing.round_ratios(t[auto], t[fastest])
    peaks = {name: measure_memory(fn)[0] / 2**20 for name, fn in fns.items()
             if name not in ("conv forward", AA)}
    return {"channels_per_group": channels_per_group, "n": n, "kernel": kernel,
            "threads": threads, "seconds": seconds, "fastest": fastest, "auto": auto,
            "auto_over_fastest": statistics.median(ratios), "auto_over_fastest_per_round": ratios,
            "aa_per_round": timing.round_ratios(t[AA], t[auto]),
            "peers": {name: missing.get(name, t[name].median if name in t else None)
                      for name in peers},
            "forward_s": t["conv forward"].median, "peak_mib": peaks}


def sweep(quick: bool = False) -> list[dict[str, object]]:
    """Every point of ``GRID`` (``QUICK_GRID`` if quick)."""
    grid = QUICK_GRID if quick else GRID
    before = torch.get_num_threads()
    try:
        return [point(c, n, k, th, quick) for c, n, k, th in itertools.product(
            grid["channels_per_group"], grid["n"], grid["kernel"], grid["threads"])]
    finally:
        torch.set_num_threads(before)


def worst(points: list[dict[str, object]]) -> dict[str, object]:
    """The point where the auto route is furthest from the fastest."""
    return max(points, key=lambda p: float(p["auto_over_fastest"]))


def rule_route(point: dict[str, Any], block: int) -> str:
    """The route :func:`~convlab.aten.fast_per_sample.choose_method` picks now at a stored
    sweep point (its layer's groups from ``LAYERS``, the sweep's ``block``)."""
    return choose_method(point["n"], point["channels_per_group"], [point["kernel"]] * 2,
                         torch.float32, block, point["threads"],
                         LAYERS[point["channels_per_group"]][2])


def rule_summary(section: dict[str, Any]) -> dict[str, Any]:
    """The current :func:`~convlab.aten.fast_per_sample.choose_method` on a stored sweep:
    at each point the route it picks now (with the section's block and the point's
    threads) and that route's median time over the fastest route's. Returns ``{"near":
    points within 10 % of the fastest, "points": their number, "worst": the point with
    the largest ratio, with "auto" and "auto_over_fastest" of the current rule,
    "untimed": points where the rule picks a route the sweep did not time (left out)}``;
    a record taken under an earlier rule gives the current rule's numbers, since every
    route it had was timed at every point."""
    rows, untimed = [], 0
    for p in section["points"]:
        seconds = p["seconds"]
        auto = rule_route(p, section["block"])
        if auto not in seconds:  # a route added after the sweep was taken
            untimed += 1
            continue
        rows.append({**p, "auto": auto,
                     "auto_over_fastest": seconds[auto] / min(seconds.values())})
    return {"near": sum(r["auto_over_fastest"] <= 1.1 for r in rows), "points": len(rows),
            "untimed": untimed, "worst": worst(rows) if rows else None}


def route_facts(section: dict[str, Any]) -> dict[str, Any]:
    """The two facts behind rules 2 and 3 of
    :func:`~convlab.scratch.per_sample.choose_method`, read off a stored sweep:
    ``one_by_one``, ``(points where im2col is the fastest of the scratch routes, 1x1
    points)`` (the routes that rule chooses among; the loop is left out); and
    ``depthwise_forward``, the ``(least, largest)`` ratio of the grouped route's time to
    the forward route's over the depthwise points from 5x5 on with more than one sample
    (None where the sweep did not time the forward route)."""
    points = section["points"]
    ones = [p for p in points if p["kernel"] == 1]
    fastest = sum(min((r for r in p["seconds"] if r in per_sample.ROUTES),
                      key=p["seconds"].__getitem__) == "im2col" for p in ones)
    dw = [p["seconds"]["grouped"] / p["seconds"]["forward"] for p in points
          if p["channels_per_group"] == 1 and p["kernel"] >= 5 and p["n"] > 1
          and "forward" in p["seconds"]]
    return {"one_by_one": (fastest, len(ones)),
            "depthwise_forward": (min(dw), max(dw)) if dw else None}


def against_peers(section: dict[str, Any], near: float = 1.1) -> dict[str, Any] | None:
    """The current rule's route against every route and peer of a stored sweep (None when
    the sweep timed no peers). Per point: ``speed``, the auto route's time over the
    fastest of the routes and the weight-only peers (vmap, Opacus, BackPACK); ``step``,
    forward plus the auto route over ExpandedWeights (a sum of two medians of one run);
    ``peak``, the auto route's peak MiB over the leanest route's or peer's. Returns, for
    each of the three, the points at or below ``near`` and the worst point."""
    rows = []
    for p in section["points"]:
        if "peers" not in p:
            return None
        auto = rule_route(p, section["block"])
        if auto not in p["seconds"]:
            continue
        weight = {**p["seconds"], **{k: v for k, v in p["peers"].items()
                                     if isinstance(v, float) and k != "ExpandedWeights"}}
        best = min(weight, key=weight.__getitem__)
        ew = p["peers"].get("ExpandedWeights")
        peaks = {k: v for k, v in p["peak_mib"].items() if k != "ExpandedWeights"}
        lean = min(peaks, key=peaks.__getitem__)
        rows.append({**{k: p[k] for k in ("channels_per_group", "n", "kernel", "threads")},
                     "auto": auto, "fastest": best, "leanest": lean,
                     "speed": weight[auto] / weight[best],
                     "step": ((p["forward_s"] + weight[auto]) / ew
                              if isinstance(ew, float) else None),
                     "peak": peaks[auto] / peaks[lean]})
    out: dict[str, Any] = {"points": len(rows)}
    for key in ("speed", "step", "peak"):
        have = [r for r in rows if r[key] is not None]
        out[key] = {"near": sum(r[key] <= near for r in have), "of": len(have),
                    "worst": max(have, key=lambda r: r[key]) if have else None}
    return out


def against_scratch(section: dict[str, Any]) -> dict[str, Any]:
    """What the loop's clauses of the current rule bring, read off a stored sweep: at each
    point the current rule's route against the scratch rule's
    (:func:`convlab.scratch.per_sample.choose_method`, the same layer). Returns
    ``{"points": points where both routes were timed, "loop": points where the rule
    takes the loop, "time": geometric mean of the time ratio (rule / scratch rule),
    "time_range": its (least, largest), "peak": geometric mean of the peak-memory
    ratio}``; ``time`` and ``time_range`` are None when no point has both routes timed,
    ``peak`` when none has their peak memory."""
    time, peak, loop = [], [], 0
    for p in section["points"]:
        ours = rule_route(p, section["block"])
        theirs = per_sample.choose_method(
            p["n"], p["channels_per_group"], [p["kernel"]] * 2, torch.float32,
            section["block"], p["threads"], LAYERS[p["channels_per_group"]][2])
        if ours not in p["seconds"] or theirs not in p["seconds"]:
            continue  # a sweep taken before one of the two routes existed
        loop += ours == "loop"
        time.append(p["seconds"][ours] / p["seconds"][theirs])
        if "peak_mib" in p:  # sweeps before peak memory was measured lack it
            peak.append(p["peak_mib"][ours] / p["peak_mib"][theirs])

    def geomean(xs: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    return {"points": len(time), "loop": loop,
            "time": geomean(time) if time else None,
            "time_range": (min(time), max(time)) if time else None,
            "peak": geomean(peak) if peak else None}


def auto_verdicts(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's A/A band (every point's A/A per-round ratios pooled) and, per verdict of
    the auto route against the fastest (:func:`convlab.lab.method.timing.verdict_of`;
    "fastest" where the auto route is the fastest), how many points have it."""
    band = timing.band_from_ratios([r for p in points for r in p["aa_per_round"]])
    verdicts = [timing.verdict_of(p["auto_over_fastest_per_round"], band).verdict
                if p["auto"] != p["fastest"] else "fastest" for p in points]
    return {"aa_band": band, "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))}}


def record(quick: bool = False) -> dict[str, object]:
    """The ``per_sample_auto`` record section: the sweep, the block it ran with, the auto
    route's worst ratio to the fastest route, the sweep's pooled A/A band and the auto
    route's verdicts against the fastest (:func:`auto_verdicts`)."""
    points = sweep(quick)
    return {"block": onednn_block(), "size": SIZE, "rounds": 3 if quick else ROUNDS,
            "points": points, "worst": worst(points), **auto_verdicts(points)}
