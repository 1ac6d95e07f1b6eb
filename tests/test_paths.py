"""convlab.lab.paths: the one registry of layers and paths that bench, doctor and gpu_check use."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from convlab.lab import paths
from convlab.lab.paths import CASES, PASSES, PATHS, SUITE, Layer, NotApplicable, flops, min_bytes

CPU = torch.device("cpu")


def test_names_are_unique_and_known() -> None:
    for items in (SUITE, CASES, PATHS):
        names = [item.name for item in items]
        assert len(names) == len(set(names))
    assert set(paths.QUICK_LAYERS) | set(paths.RESNET_LAYERS) <= {layer.name for layer in SUITE}
    with pytest.raises(ValueError, match="unknown path 'fast'"):
        paths.get_path("fast")
    with pytest.raises(ValueError, match=r"unknown layer name\(s\) 'nope'"):
        paths.suite_layers(["nope"])


@pytest.mark.parametrize("layer", SUITE + CASES, ids=lambda layer: layer.name)
def test_layer_shapes_match_torch(layer: Layer) -> None:
    x = torch.empty(layer.input_shape, device="meta")
    w = torch.empty(layer.weight_shape, device="meta")
    assert tuple(torch.ops.aten.convolution(x, w, None, *layer.args()).shape) == \
        layer.output_shape


def _expected(layer: Layer) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    x, w, b, go = layer.tensors(CPU, torch.float64, seed=3)
    args = layer.args()
    y = torch.ops.aten.convolution(x, w, b, *args)
    grads = torch.ops.aten.convolution_backward(go, x, w, [b.numel()], *args, [True] * 3)
    return y, tuple(grads)


def _close(got: object, want: torch.Tensor, tol: float) -> None:
    got = torch.as_tensor(got).to(torch.float64)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_runner_computes_what_its_pass_says(path: paths.Path) -> None:
    """Every pass of every applicable path against ATen in float64 (float32 for oneDNN).

    Three cases (plain, transposed, NNPACK's batch of 16); doctor's test covers them all.
    """
    checked = 0
    for layer in [c for c in CASES if c.name in ("plain2d", "transposed2d", "batch16")]:
        dtype = torch.float64 if path.float64 else torch.float32
        tol = 1e-10 if path.float64 else 1e-4  # float32 rounding of sums of ~50 terms
        try:
            path.check(layer, CPU, dtype)
        except NotApplicable as why:
            assert str(why)
            continue
        fns = path.runners(layer, layer.tensors(CPU, dtype, seed=3))
        assert set(fns) == set(PASSES)
        y, (gi, gw, gb) = _expected(layer)
        _close(fns["forward"](), y, tol)
        out_i, out_w, out_b = fns["backward"]()
        for got, want in ((out_i, gi), (out_w, gw), (out_b, gb)):
            _close(got, want, tol)
        _close(fns["backward_input"]()[0], gi, tol)
        _close(fns["backward_weight"]()[1], gw, tol)
        _close(fns["forward_backward"]()[1], gw, tol)
        checked += 1
    if path.name != "cudnn":
        assert checked, f"{path.name} served no case on the CPU"


def test_forced_paths_report_their_backend_and_restore_flags() -> None:
    layer = paths.get_path("slow")
    assert layer.check(CASES[0], CPU, torch.float32) == "Slow2d"
    assert paths.get_path("mkldnn").check(CASES[0], CPU, torch.float32) == "Mkldnn"
    with pytest.raises(NotApplicable, match="float64"):
        paths.get_path("mkldnn").check(CASES[0], CPU, torch.float64)
    fns = paths.get_path("slow").runners(CASES[0], CASES[0].tensors())
    fns["backward"]()
    assert torch.backends.mkldnn.enabled
    assert paths.TWIN_OF_BACKEND["Mkldnn"] == "mkldnn"
    assert paths.TWIN_OF_BACKEND["SlowDilated2d"] == "slow"


def test_flop_formula_by_hand() -> None:
    layer = paths.suite_layers(["resnet56"])[0]
    macs = 8 * 64 * 56 * 56 * 64 * 3 * 3
    assert layer.macs == macs
    assert [flops(layer, p) for p in PASSES] == [2 * macs, 2 * macs, 2 * macs, 4 * macs,
                                                  6 * macs]
    d = paths.suite_layers(["depthwise"])[0]
    assert d.macs == 8 * 128 * 28 * 28 * 1 * 3 * 3
    with pytest.raises(ValueError, match="unknown pass"):
        flops(layer, "backwards")


def test_min_bytes_counts_each_operand_once() -> None:
    layer = Layer("t", (2, 3, 8, 8), (4, 3, 3, 3), padding=1)
    x, w, y, b = 2 * 3 * 64, 4 * 27, 2 * 4 * 64, 4
    assert min_bytes(layer, "forward") == 4 * (x + w + b + y)
    assert min_bytes(layer, "backward_input", 8) == 8 * (y + w + x)
    assert min_bytes(layer, "backward") == 4 * (y + x + w + x + w + b)
    assert min_bytes(layer, "forward_backward") == (min_bytes(layer, "forward")
                                                    + min_bytes(layer, "backward"))


@st.composite
def layers(draw: st.DrawFn) -> Layer:
    dim = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    c_in, c_out = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    spatial = tuple(draw(st.integers(3, 7)) for _ in range(dim))
    weight = (c_in, c_out // groups) if transposed else (c_out, c_in // groups)
    layer = Layer(
        "h", (draw(st.integers(1, 3)), c_in, *spatial), (*weight, *kernel), stride=stride,
        padding=draw(st.integers(0, 2)), dilation=dilation, transposed=transposed,
        output_padding=draw(st.integers(0, max(stride, dilation) - 1)) if transposed else 0,
        groups=groups,
    )
    try:
        layer.params  # noqa: B018 - keep only valid configurations
    except ValueError:
        assume(False)
    return layer


def _counted(op, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        op(*args)
    return counter.get_total_flops()


@given(layers())
def test_flops_agree_with_torch_flop_counter(layer: Layer) -> None:
    x = torch.empty(layer.input_shape, device="meta")
    w = torch.empty(layer.weight_shape, device="meta")
    go = torch.empty(layer.output_shape, device="meta")
    args = layer.args()
    conv, backward = torch.ops.aten.convolution, torch.ops.aten.convolution_backward
    assert flops(layer, "forward") == _counted(conv, x, w, None, *args)
    assert flops(layer, "backward_input") == _counted(
        backward, go, x, w, None, *args, [True, False, False])
    counted_gw = _counted(backward, go, x, w, None, *args, [False, True, False])
    # torch's counter ignores `groups` for grad_weight (counts it as an ungrouped conv):
    # `groups` times too many (upstream PR #183405 divides by groups). Grouped layers are
    # checked against a count from first principles in test_grouped_weight_gradient_flops.
    assert counted_gw in (flops(layer, "backward_weight"),
                          layer.groups * flops(layer, "backward_weight"))
    if layer.groups == 1:
        assert flops(layer, "backward_weight") == _counted(
            backward, go, x, w, None, *args, [False, True, False])
        assert flops(layer, "backward") == _counted(
            backward, go, x, w, None, *args, [True, True, False])
        assert math.isclose(flops(layer, "forward_backward"),
                            flops(layer, "forward") + flops(layer, "backward"))


def _weight_gradient_terms(layer: Layer, x, go) -> tuple[object, int]:
    """grad_weight of a 2-d (grouped) convolution by its definition, as explicit loops, and
    the number of multiply-adds those loops perform (padding taps included, as kernels do).

    grad_w[oc, c, i, j] = sum over n, oh, ow of
        go[n, oc, oh, ow] * x_padded[n, g * C_in/g + c, oh * s + i * d, ow * s + j * d]
    with g = oc // (C_out / groups).
    """
    import numpy as np

    p = layer.params
    (s_h, s_w), (p_h, p_w), (d_h, d_w) = p.stride, p.padding, p.dilation
    xp = np.pad(x.numpy(), ((0, 0), (0, 0), (p_h, p_h), (p_w, p_w)))
    g_out = go.numpy()
    c_out, c_per_group, k_h, k_w = layer.weight_shape
    per_group_out = c_out // p.groups
    n, _, o_h, o_w = g_out.shape
    grad = np.zeros(layer.weight_shape)
    terms = 0
    for oc in range(c_out):
        base = (oc // per_group_out) * c_per_group
        for c in range(c_per_group):
            for i in range(k_h):
                for j in range(k_w):
                    for b in range(n):
                        for oh in range(o_h):
                            for ow in range(o_w):
                                grad[oc, c, i, j] += (g_out[b, oc, oh, ow]
                                                      * xp[b, base + c, oh * s_h + i * d_h,
                                                           ow * s_w + j * d_w])
                                terms += 1
    return grad, terms


@pytest.mark.parametrize("layer", [
    Layer("grouped", (2, 4, 5, 5), (6, 2, 3, 3), padding=1, groups=2),
    Layer("depthwise", (2, 3, 6, 5), (6, 1, 3, 2), stride=2, padding=1, dilation=1, groups=3),
    Layer("dense", (1, 2, 5, 4), (3, 2, 2, 2), dilation=2),
], ids=lambda layer: layer.name)
def test_grouped_weight_gradient_flops(layer: Layer) -> None:
    """convlab's backward_weight FLOPs are 2 x the multiply-adds of the definition;
    FlopCounterMode's are `groups` times that for a grouped layer."""
    x, _, _, go = layer.tensors(CPU, torch.float64)
    grad, terms = _weight_gradient_terms(layer, x, go)
    want = torch.ops.aten.convolution_backward(go, x, torch.empty(layer.weight_shape,
                                               dtype=torch.float64), None, *layer.args(),
                                               [False, True, False])[1]
    assert torch.allclose(torch.from_numpy(grad), want)  # the loops are the real gradient
    assert flops(layer, "backward_weight") == 2 * terms
    meta = [torch.empty(s, device="meta") for s in (layer.input_shape, layer.weight_shape,
                                                    layer.output_shape)]
    counted = _counted(torch.ops.aten.convolution_backward, meta[2], meta[0], meta[1], None,
                       *layer.args(), [False, True, False])
    if counted != 2 * terms:  # the upstream over-count (fixed by PR #183405 where merged)
        assert counted == layer.groups * 2 * terms
        assert layer.groups > 1
