"""Per-sample weight gradients of a convolution: convlab's routes against what a user would
pick instead, timed in one interleaved run, and the grouped-vs-im2col crossover.

* ``WEIGHT_ROUTES``: given the input and ``grad_output``, every sample's weight
  gradient: convlab's ``grouped``, ``im2col``, ``forward``
  (:func:`convlab.scratch.per_sample.per_sample_weight_grad`), ``loop`` and ``auto``
  routes (:func:`convlab.aten.fast_per_sample.per_sample_weight_grad`), ``torch.func.vmap`` over
  ``convolution_backward``, Opacus's ``nn.Conv2d`` grad sampler (its own unfold,
  ``F.pad`` + ``as_strided``, then ``einsum``), ``unfoldNd`` (BackPACK's unfold package)
  + ``einsum``, and BackPACK's ``BatchGrad`` derivative (a forward convolution with
  ``C_in * N`` groups and ``grad_output`` repeated ``C_in / groups`` times as its weight);
* ``STEP_ROUTES``: a forward plus a per-sample backward, as a training step runs it:
  ``vmap(grad(...))``, ExpandedWeights (``torch.nn.utils._per_sample_grad``), a loop of one
  backward per sample, and the forward alone;
* :func:`sweep`: grouped against im2col over the batch size and the output positions.

Opacus and BackPACK are optional: without them their rows are recorded as
``{"skipped": "not installed"}``. :func:`record` is the ``per_sample`` section of
:mod:`convlab.lab.record.records`.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from convlab.aten import fast_per_sample
from convlab.lab.method import timing
from convlab.scratch.per_sample import per_sample_weight_grad

__all__ = ["LAYER", "compare", "crossover", "peer_routes", "record", "routes", "sweep",
           "verdict"]

# The timed layer: N, C_in, C_out, image side, kernel side (3x3, padding 1, float32).
LAYER: tuple[int, int, int, int, int] = (8, 16, 32, 32, 3)


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


def layer_tensors(n: int, c_in: int, c_out: int, size: int, k: int, seed: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input, weight, grad_output)`` of a 2-d layer with padding ``k // 2`` (same size)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c_in, size, size, generator=gen)
    w = torch.randn(c_out, c_in, k, k, generator=gen)
    go = torch.randn(n, c_out, size, size, generator=gen)  # padding k // 2: same size
    return x, w, go


def peer_routes(x: torch.Tensor, w: torch.Tensor, go: torch.Tensor, padding: int,
                groups: int = 1) -> dict[str, Callable[[], torch.Tensor] | str]:
    """What a user would run instead of convlab, for a stride-1 2-d convolution: name ->
    zero-argument callable giving the ``[N, *w.shape]`` per-sample weight gradients
    (``"not installed"`` for a missing package). ``vmap``, Opacus and BackPACK take
    ``x`` and ``go`` (``[N, C_out, *O]``); ``ExpandedWeights`` runs the forward too, as a
    training step does."""
    c_out, c_in_g, k = w.shape[0], w.shape[1], w.shape[2]
    conv = torch.nn.Conv2d(c_in_g * groups, c_out, k, padding=padding, groups=groups,
                           bias=False)
    conv.weight.data.copy_(w)
    args = ([1, 1], [padding, padding], [1, 1], False, [0, 0], groups)

    def backward_only(xi: torch.Tensor, gi: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution_backward(
            gi[None], xi[None], w, None, *args, [False, True, False])[1]

    peers: dict[str, Callable[[], torch.Tensor] | str] = {
        "vmap(conv backward)": lambda: vmap(backward_only)(x, go)}
    if installed("opacus"):
        from opacus.grad_sample.conv import compute_conv_grad_sample

        peers["Opacus (unfold + einsum)"] = (
            lambda: compute_conv_grad_sample(conv, [x], go)[conv.weight])
    else:
        peers["Opacus (unfold + einsum)"] = "not installed"
    if installed("backpack"):
        from backpack.core.derivatives.conv2d import Conv2DDerivatives

        holder = torch.nn.Conv2d(c_in_g * groups, c_out, k, padding=padding, groups=groups,
                                 bias=False)
        holder.weight.data.copy_(w)
        holder.input0, holder.output = x, go  # what BackPACK's hooks store
        derivatives = Conv2DDerivatives()
        peers["BackPACK BatchGrad (grouped conv)"] = lambda: derivatives.param_mjp(
            "weight", holder, None, (go,), go, sum_batch=False)
    else:
        peers["BackPACK BatchGrad (grouped conv)"] = "not installed"

    def expanded_weights() -> torch.Tensor:
        from torch.nn.utils._per_sample_grad import call_for_per_sample_grads

        conv.weight.grad_sample = None
        call_for_per_sample_grads(conv, loss_reduction="sum")(x).backward(go)
        return conv.weight.grad_sample

    peers["ExpandedWeights"] = expanded_weights
    return peers


def routes(layer: tuple[int, int, int, int, int] = LAYER
           ) -> tuple[dict[str, Callable[[], torch.Tensor] | str], dict[str, Callable]]:
    """``(weight_routes, step_routes)`` for ``layer``: name -> zero-argument callable that
    returns the ``[N, C_out, C_in, k, k]`` per-sample weight gradients (the step routes'
    ``forward only`` returns the output), or -> ``"not installed"`` for a missing peer."""
    n, c_in, c_out, size, k = layer
    x, w, go = layer_tensors(*layer)
    pad = k // 2
    peers = peer_routes(x, w, go, pad)
    weight: dict[str, Callable[[], torch.Tensor] | str] = {
        "convlab grouped": lambda: per_sample_weight_grad(x, w.shape, go, padding=pad,
                                                          method="grouped"),
        "convlab auto": lambda: fast_per_sample.per_sample_weight_grad(x, w.shape, go,
                                                                       padding=pad),
        "convlab loop": lambda: fast_per_sample.per_sample_weight_grad(
            x, w.shape, go, padding=pad, method="loop"),
        "convlab im2col": lambda: per_sample_weight_grad(x, w.shape, go, padding=pad,
                                                         method="im2col"),
        "convlab forward": lambda: per_sample_weight_grad(x, w.shape, go, padding=pad,
                                                          method="forward"),
        "vmap(conv backward)": peers["vmap(conv backward)"],
        "Opacus (unfold + einsum)": peers["Opacus (unfold + einsum)"],
    }
    if installed("unfoldNd"):
        import unfoldNd

        def unfoldnd_einsum() -> torch.Tensor:
            cols = unfoldNd.unfoldNd(x, k, padding=pad)  # [N, C_in k k, L]
            out = torch.einsum("nol,npl->nop", go.reshape(n, c_out, -1), cols)
            return out.reshape(n, *w.shape)

        weight["unfoldNd + einsum"] = unfoldnd_einsum
    else:
        weight["unfoldNd + einsum"] = "not installed"
    weight["BackPACK BatchGrad (grouped conv)"] = peers["BackPACK BatchGrad (grouped conv)"]

    def full_loss(wt: torch.Tensor, xi: torch.Tensor, gi: torch.Tensor) -> torch.Tensor:
        return (F.conv2d(xi[None], wt, padding=pad) * gi[None]).sum()

    def loop() -> torch.Tensor:
        wr = w.clone().requires_grad_()
        return torch.stack([torch.autograd.grad(
            F.conv2d(x[i:i + 1], wr, padding=pad), wr, go[i:i + 1])[0][None]
            for i in range(n)]).reshape(n, *w.shape)

    step = {
        "vmap(grad(conv))": lambda: vmap(grad(full_loss), in_dims=(None, 0, 0))(w, x, go),
        "ExpandedWeights": peers["ExpandedWeights"],
        "loop of backwards": loop,
        "forward only": lambda: F.conv2d(x, w, padding=pad),
    }
    return weight, step


def _ratios(a: tuple[float, ...], b: tuple[float, ...]) -> list[float]:
    return [p / q for p, q in zip(a, b, strict=True)]


def _interleaved(fns: Mapping[str, Callable[[], object]], quick: bool,
                 min_run_time: float = 0.1) -> dict[str, timing.Timing]:
    """:func:`convlab.lab.method.timing.interleaved` on one thread (fewer rounds and calls
    if quick)."""
    if quick:
        return timing.interleaved(fns, rounds=3, min_run_time=0.01, threads=1, min_calls=3)
    return timing.interleaved(fns, rounds=7, min_run_time=min_run_time, threads=1)


def verdict(ratios: list[float], band: float) -> dict[str, object]:
    """:func:`convlab.lab.method.timing.verdict_of` as JSON: the sign-test verdict and p-value."""
    v = timing.verdict_of(ratios, band)
    return {"verdict": v.verdict, "p_value": v.p_value}


def _peak_mb(fn: Callable[[], object]) -> float:
    from convlab.lab.method.profiling import measure_memory

    return measure_memory(fn, "cpu")[0] / 2**20


def compare(quick: bool = False) -> dict[str, object]:
    """Every route of :func:`routes` on ``LAYER``, one interleaved run on one thread,
    against ``convlab grouped``; the A/A pairs are ``convlab grouped`` and ``convlab
    im2col`` each timed twice, their per-round ratios pooled into one band."""
    weight, step = routes(LAYER)
    truth = weight["convlab im2col"]()
    fns: dict[str, Callable[[], object]] = {}
    rows: dict[str, dict[str, object]] = {}
    for name, fn in {**weight, **step}.items():
        if isinstance(fn, str):
            rows[name] = {"skipped": fn}
            continue
        if name != "forward only":
            got = fn()
            # float32 sums of up to C_in*k*k*H*W = 147456 products of N(0,1) values.
            rows[name] = {"matches_im2col": bool(torch.allclose(got, truth, atol=1e-2))}
        else:
            rows[name] = {}
        fns[name] = fn
    # Two A/A pairs (the same callable timed twice); their per-round ratios are pooled.
    fns["convlab grouped (again)"] = fns["convlab grouped"]
    fns["convlab im2col (again)"] = fns["convlab im2col"]
    timings = _interleaved(fns, quick)
    base = timings["convlab grouped"]
    aa = _ratios(timings["convlab grouped (again)"].rounds, base.rounds) + _ratios(
        timings["convlab im2col (again)"].rounds, timings["convlab im2col"].rounds)
    band = timing.band_from_ratios(aa)
    for name, t in timings.items():
        if name.endswith("(again)"):
            continue
        ratios = _ratios(t.rounds, base.rounds)
        rows[name].update({
            "kind": "weight" if name in weight else "step",
            "median_s": t.median, "min_s": min(t.rounds), "max_s": max(t.rounds),
            "calls_per_round": t.calls_per_round, "ratio_vs_grouped": statistics.median(ratios),
            "round_ratios": ratios,
            **({"verdict": "-"} if name == "convlab grouped" else verdict(ratios, band)),
            "peak_mb": _peak_mb(fns[name]),
        })
    import torch.nn.utils._expanded_weights.conv_utils as ew

    return {"layer": dict(zip(("n", "c_in", "c_out", "size", "kernel"), LAYER, strict=True)),
            "threads": 1, "rounds": len(base.rounds), "aa_round_ratios": aa, "aa_band": band,
            "expanded_weights_threshold": ew.THRESHOLD, "routes": rows}


def sweep(quick: bool = False) -> dict[str, object]:
    """Time of ``im2col`` over time of ``grouped`` (median of per-round ratios) as the batch
    grows at 16x16 (``"N"``) and as the output positions grow at N = 8 (``"positions"``),
    for a 16 -> 32 channel 3x3 conv; one interleaved run per axis, one thread, its A/A band
    pooled from both routes timed twice at the middle point; sign-test verdicts per point."""
    axes = {"N": [(n, 16) for n in (1, 4, 16, 64)],
            "positions": [(8, s) for s in (4, 8, 16, 32, 64)]}
    if quick:
        axes = {"N": [(1, 16), (16, 16)], "positions": [(8, 4), (8, 32)]}
    out: dict[str, object] = {}
    for axis, points in axes.items():
        fns: dict[str, Callable[[], object]] = {}
        for n, size in points:
            x, w, go = layer_tensors(n, 16, 32, size, 3, seed=n + size)
            for method in ("grouped", "im2col"):
                fns[f"{method} {n} {size}"] = (
                    lambda x=x, w=w, go=go, m=method:
                    per_sample_weight_grad(x, w.shape, go, padding=1, method=m))
        mid = "{} {}".format(*points[len(points) // 2])
        for method in ("grouped", "im2col"):  # two A/A pairs, pooled
            fns[f"{method} again"] = fns[f"{method} {mid}"]
        t = _interleaved(fns, quick, min_run_time=0.05)
        band = timing.band_from_ratios(
            [r for m in ("grouped", "im2col")
             for r in _ratios(t[f"{m} again"].rounds, t[f"{m} {mid}"].rounds)])
        rows = []
        for n, size in points:
            g, i = t[f"grouped {n} {size}"], t[f"im2col {n} {size}"]
            ratios = _ratios(i.rounds, g.rounds)
            rows.append({"n": n, "positions": size * size, "grouped_s": g.median,
                         "im2col_s": i.median, "im2col_over_grouped":
                         statistics.median(ratios), "round_ratios": ratios,
                         **verdict(ratios, band)})
        out[axis] = rows
        out[f"{axis}_aa_band"] = band
    return out


def crossover(points: list[dict[str, object]], key: str) -> str:
    """Which route wins along ``key`` (``"n"`` or ``"positions"``), as a sentence computed
    from the points' sign-test verdicts (im2col against grouped), e.g.
    ``"n = 1-4: within noise; n = 16-64: grouped faster"``."""
    words = {"slower": "grouped faster", "faster": "im2col faster"}
    runs: list[tuple[str, object, object]] = []
    for p in points:
        word = words.get(str(p.get("verdict")), "within noise")
        if runs and runs[-1][0] == word:
            runs[-1] = (word, runs[-1][1], p[key])
        else:
            runs.append((word, p[key], p[key]))
    return "; ".join(f"{key} = {a}{'' if a == b else f'-{b}'}: {word}"
                     for word, a, b in runs)


def record(quick: bool = False) -> dict[str, object]:
    """The ``per_sample`` record section: :func:`compare` and :func:`sweep`, with the peer
    packages' versions (or None where not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("opacus", "backpack-for-pytorch", "unfoldNd"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    before = torch.get_num_threads()
    try:
        return {"peers": versions, "compare": compare(quick), "sweep": sweep(quick)}
    finally:
        torch.set_num_threads(before)
