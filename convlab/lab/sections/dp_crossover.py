"""Where the ghost norm beats instantiating per-sample gradients: the fit behind
:func:`convlab.dp_step.choose_method`.

For each conv layer of :data:`LAYERS` (ResNet-8's layers at CIFAR size and wider ones
deeper in a network), one thread, batch :data:`N`: the time of one layer's share of a
book-keeping step, per-sample squared norms plus the clipped sum, by each of
:data:`convlab.dp_step.METHODS`, interleaved over rounds. The cost model's variable is
``r = L (D + p) / (D p)`` (ghost ``L^2 (D + p)`` against instantiate ``L D p`` per sample
and group); :func:`fit` puts the threshold between the largest ``r`` where the ghost norm
is faster and the smallest where it is slower (their geometric mean).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from convlab import dp_step
from convlab.lab.method import timing

__all__ = ["LAYERS", "N", "fit", "layer_point", "record"]

#: The batch size of every point.
N = 32
#: The layers, each ``(C_in, C_out, kernel, size, stride)``; ResNet-8's convolutions at
#: 32x32, then wider layers at the sizes deeper stages see.
LAYERS: tuple[tuple[int, int, int, int, int], ...] = (
    (3, 16, 3, 32, 1), (16, 16, 3, 32, 1), (16, 32, 3, 32, 2), (32, 32, 3, 16, 1),
    (32, 64, 3, 16, 2), (64, 64, 3, 8, 1), (16, 16, 3, 8, 1), (32, 32, 3, 8, 1),
    (64, 64, 1, 8, 1), (64, 64, 5, 8, 1), (128, 128, 3, 8, 1), (64, 64, 3, 4, 1),
    (128, 128, 3, 4, 1), (256, 256, 1, 4, 1), (256, 256, 3, 4, 1), (128, 128, 3, 2, 1),
    (512, 512, 3, 2, 1),
)
QUICK_LAYERS = LAYERS[5:7] + LAYERS[11:13]


def layer_point(c_in: int, c_out: int, k: int, size: int, stride: int, n: int = N,
                rounds: int = 7, quick: bool = False) -> dict[str, Any]:
    """Both methods on one layer (float32, one thread): seconds per call, the per-round
    ratio ghost / instantiate (median and range) and the shapes' ``L, D, p, r``."""
    gen = torch.Generator().manual_seed(0)
    layer = nn.Conv2d(c_in, c_out, k, stride, k // 2, bias=False)
    x = torch.randn(n, c_in, size, size, generator=gen)
    with torch.no_grad():
        g = torch.randn(layer(x).shape, generator=gen)
    length, d, p, _ = dp_step.layer_sizes(layer, x.shape, g.shape)
    clip = torch.ones(n)

    def share(method: str) -> None:
        part = dp_step.LayerShare(layer, x, g, method)
        part.norms2()
        part.clipped_sums(clip)

    fns = {m: (lambda m=m: share(m)) for m in dp_step.METHODS}
    t = timing.interleaved(fns, rounds=3 if quick else rounds, threads=1, clock="cpu",
                           min_run_time=0.01 if quick else 0.05, min_calls=1)
    ratios = timing.round_ratios(t["ghost"], t["instantiate"])
    return {"c_in": c_in, "c_out": c_out, "kernel": k, "size": size, "stride": stride,
            "L": length, "D": d, "p": p, "r": length * (d + p) / (d * p),
            "ghost_s": t["ghost"].median, "instantiate_s": t["instantiate"].median,
            "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
            "rule": dp_step.choose_method(layer, x.shape, g.shape)}


def fit(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The threshold on ``r`` between the points where ghost is faster (ratio < 1) and
    those where it is slower, and how many points the rule with
    :data:`convlab.dp_step.GHOST_FACTOR` sends to the faster method. ``separable`` is
    False when the two sets overlap in ``r`` (then the threshold is that of fewest
    misplaced points)."""
    faster = sorted(p["r"] for p in points if p["ratio"] < 1)
    slower = sorted(p["r"] for p in points if p["ratio"] >= 1)
    candidates = sorted({p["r"] for p in points}) + [math.inf]
    if faster and slower and faster[-1] < slower[0]:
        threshold, separable = math.sqrt(faster[-1] * slower[0]), True
    else:
        def misplaced(c: float) -> int:
            return sum((p["r"] < c) != (p["ratio"] < 1) for p in points)
        threshold, separable = min(candidates, key=misplaced), False
    right = sum((p["rule"] == "ghost") == (p["ratio"] < 1) for p in points)
    return {"threshold": threshold, "separable": separable,
            "ghost_factor": dp_step.GHOST_FACTOR, "rule_right": right,
            "points": len(points)}


def record(quick: bool = False) -> dict[str, Any]:
    """The ``dp_crossover`` record section: every point of :data:`LAYERS` and the fit."""
    points = [layer_point(*shape, quick=quick)
              for shape in (QUICK_LAYERS if quick else LAYERS)]
    return {"n": N, "threads": 1, "clock": "cpu", "dtype": "float32", "points": points,
            "fit": fit(points)}
