"""convlab.aten.native against ATen and convlab.scratch.reference.

convolution_backward and torch.nn.grad.

Properties over grids and hypothesis (float64, tight tolerances), the one bias_sizes rule,
layouts (the slow kernels' channels-last bug), empty batches and threads.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from functools import partial

import numpy as np
import pytest
import torch
from backend_cases import CPU_BACKEND_CASES, flags_now
from backend_cases import make_case as _case
from hypothesis import given
from hypothesis import strategies as st

import convlab.scratch.reference as ref
from convlab.aten import backends, native
from convlab.aten.backends import available_backends, select_backend, use_backend
from convlab.aten.native import conv_input, conv_weight, convolution_backward
from convlab.scratch import numpy_ref
from convlab.scratch.params import ConvParams

F64 = torch.float64
ALL_MASK = [True, True, True]
MASKS = [list(m) for m in itertools.product([True, False], repeat=3)]


@pytest.fixture(autouse=True)
def _flags_restored():
    """Every test leaves the global backend flags as it found them."""
    before = flags_now()
    yield
    assert flags_now() == before, "a test (or convlab) leaked backend flags"


def _grads_vs_reference(x, w, b, kw, backend, tol):
    p = ConvParams.for_tensors(x, w, b, **kw)
    out = torch.ops.aten.convolution(x, w, b, *p.aten_args())
    go = torch.randn_like(out)
    args = ([out.shape[1]], p.stride, p.padding, p.dilation, p.transposed, p.output_padding,
            p.groups, ALL_MASK)
    got = convolution_backward(go, x, w, *args, backend=backend)
    want = ref.convolution_backward(go.double(), x.double(), w.double(), *args)
    for name, g, r in zip(("grad_input", "grad_weight", "grad_bias"), got, want, strict=True):
        assert g.dtype == x.dtype
        torch.testing.assert_close(g.double(), r, atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize("expected, xs, ws, opts, forced", CPU_BACKEND_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CPU_BACKEND_CASES)])
def test_every_cpu_backend_matches_the_reference(expected, xs, ws, opts, forced) -> None:
    if forced is not None and forced not in available_backends("cpu"):
        pytest.skip(f"{forced} is not built into this torch")  # only NNPACK-less builds
    if expected.startswith("Mkldnn") and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    x, w, b, kw = _case(xs, ws, **opts)
    # float64 backends: tight. float32 (oneDNN, NNPACK, forced slow fp32): each output sums
    # <= N*C*k*k ~ 600 products of O(1) numbers in float32, whose rounding error is
    # ~ sqrt(600) * 6e-8 * |terms| ~ 1e-5 relative; 1e-4 leaves headroom.
    tol = 1e-10 if x.dtype == F64 else 1e-4
    with use_backend(forced, x, w, b, **kw) if forced else nullcontext():
        assert select_backend(x, w, b, **kw) == expected
        _grads_vs_reference(x, w, b, kw, None, tol)


FORCED = {
    "slow": ((2, 4, 8, 8), (6, 2, 3, 3), {"groups": 2, "stride": 2, "padding": 1}),
    "mkldnn": ((2, 4, 8, 8), (6, 2, 3, 3), {"groups": 2, "stride": 2, "padding": 1}),
    "nnpack": ((16, 4, 8, 8), (6, 4, 3, 3), {"padding": 1}),  # NNPACK needs N >= 16
}


@pytest.mark.parametrize("backend", list(FORCED))
def test_backend_argument_forces_and_matches(backend: str) -> None:
    if backend not in available_backends("cpu"):
        pytest.skip(f"{backend} is not built into this torch")
    xs, ws, opts = FORCED[backend]
    x, w, b, kw = _case(xs, ws, dtype=torch.float32, **opts)
    _grads_vs_reference(x, w, b, kw, backend, 1e-4)  # float32 tolerance: see above


def test_backend_argument_raises_when_it_cannot_serve() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    with pytest.raises(backends.BackendMismatch) as info:
        convolution_backward(go, x, w, [4], 1, 0, 1, False, 0, 1, ALL_MASK, backend="mkldnn")
    assert info.value.chosen == "Slow2d"


GRID_F64 = list(itertools.product([1, 2], [0, 2], [1, 2], [1, 2], [False, True], [1, 2, 3]))


@pytest.mark.parametrize("stride, padding, dilation, groups, transposed, dim", GRID_F64)
def test_convolution_backward_grid_float64(stride, padding, dilation, groups, transposed, dim):
    xs = (2, 4) + (6, 7, 5)[:dim]
    ws = ((4, 6 // groups) if transposed else (6, 4 // groups)) + (3, 2, 3)[:dim]
    op = 1 if transposed and stride > 1 else 0
    x, w, b, kw = _case(xs, ws, transposed=transposed, stride=stride, padding=padding,
                        dilation=dilation, groups=groups, output_padding=op)
    _grads_vs_reference(x, w, b, kw, None, 1e-10)
    _grads_vs_reference(x, w, b, kw, "slow", 1e-10)


@given(
    dim=st.integers(1, 3),
    n=st.integers(0, 3),
    cin_g=st.integers(1, 3),
    cout_g=st.integers(1, 3),
    groups=st.integers(1, 3),
    k=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    transposed=st.booleans(),
    mask=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    data=st.data(),
)
def test_convolution_backward_matches_aten_hypothesis(
    dim, n, cin_g, cout_g, groups, k, stride, padding, dilation, transposed, mask, data
) -> None:
    size = data.draw(st.integers(dilation * (k - 1) + 1, 7), label="size")
    xs = (n, cin_g * groups) + (size,) * dim
    ws = ((cin_g * groups, cout_g) if transposed else (cout_g * groups, cin_g)) + (k,) * dim
    op = data.draw(st.integers(0, max(0, max(stride, dilation) - 1)), label="output_padding")
    op = op if transposed else 0
    try:
        p = ConvParams.create(dim, stride, padding, dilation, transposed, op, groups)
        p.check_shapes(xs, ws)
    except ValueError:
        return  # an invalid combination: ConvParams' own tests cover the messages
    x, w = torch.randn(*xs, dtype=F64), torch.randn(*ws, dtype=F64)
    out = p.output_shape(xs, ws)
    go = torch.randn(*out, dtype=F64)
    args = ([out[1]], p.stride, p.padding, p.dilation, transposed, p.output_padding, groups,
            list(mask))
    got = convolution_backward(go, x, w, *args)
    want = torch.ops.aten.convolution_backward(go, x, w, *args)
    yard = ref.convolution_backward(go, x, w, *args)
    for m, g, a, r in zip(mask, got, want, yard, strict=True):
        if not m:
            assert g is None
            continue
        torch.testing.assert_close(g, a, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


def test_convolution_backward_rejects_bad_arguments() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    base = ([4], 1, 0, 1, False, 0, 1)
    cases = [
        (ValueError, "output_mask", lambda: convolution_backward(go, x, w, *base, [True, True])),
        (TypeError, "output_mask", lambda: convolution_backward(go, x, w, *base, "yes")),
        (ValueError, "bias_sizes",
         lambda: convolution_backward(go, x, w, [5], 1, 0, 1, False, 0, 1, ALL_MASK)),
        (ValueError, "grad_output",
         lambda: convolution_backward(go[:, :, :5], x, w, *base, ALL_MASK)),
        (ValueError, "groups",
         lambda: convolution_backward(go, x, w, [4], 1, 0, 1, False, 0, 2, ALL_MASK)),
        (TypeError, "input", lambda: convolution_backward(go, None, w, *base, ALL_MASK)),
        (ValueError, "output_padding",
         lambda: convolution_backward(go, x, w, [4], 1, 0, 1, False, 1, 1, ALL_MASK)),
        (ValueError, "unknown backend",
         lambda: convolution_backward(go, x, w, *base, ALL_MASK, backend="fast")),
    ]
    for exc, word, call in cases:
        with pytest.raises(exc, match=word):
            call()


# --- the one bias_sizes rule (params.check_bias_sizes) ----------------------------------------

BIAS_SIZES = [None, [4], (4,), [0], [7], [], [4, 1], [np.int64(4)], [-1]]


def _outcome(call):
    try:
        return call()
    except (TypeError, ValueError) as exc:
        return type(exc)


@pytest.mark.parametrize("n", [2, 0])
@pytest.mark.parametrize("bias_sizes", BIAS_SIZES, ids=repr)
def test_every_backward_follows_one_bias_sizes_rule(n, bias_sizes) -> None:
    """native, reference and numpy_ref accept and reject the same bias_sizes, for any mask,
    and grad_bias is always [C_out] (what ATen gives for every non-empty batch)."""
    x, w = torch.randn(n, 3, 6, 6, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(n, 4, 4, 4, dtype=F64)
    accepted = bias_sizes is None or list(bias_sizes) in ([4], [0])
    for mask in MASKS:
        rest = (1, 0, 1, False, 0, 1, mask)
        paths = {
            "native": partial(convolution_backward, go, x, w, bias_sizes, *rest),
            "reference": partial(ref.convolution_backward, go, x, w, bias_sizes, *rest),
        }
        if n > 0:  # numpy_ref's empty-batch support is tested in test_numpy_ref
            paths["numpy_ref"] = partial(numpy_ref.convolution_backward, go.numpy(),
                                         x.numpy(), w.numpy(), bias_sizes, 1, 0, 1, 1, mask)
        results = {name: _outcome(call) for name, call in paths.items()}
        for name, got in results.items():
            if not accepted:
                assert got in (TypeError, ValueError), (name, mask, got)
                continue
            assert isinstance(got, tuple), (name, mask, got)
            gb = got[2]
            assert (gb is None) == (not mask[2])
            if gb is not None:
                torch.testing.assert_close(torch.as_tensor(gb), go.sum((0, 2, 3)),
                                           atol=1e-10, rtol=1e-10)
        if accepted and n > 0:  # ATen reads bias_sizes only for an empty batch
            aten = torch.ops.aten.convolution_backward(go, x, w, bias_sizes, [1, 1], [0, 0],
                                                       [1, 1], False, [0, 0], 1, mask)
            for g, a in zip(results["native"], aten, strict=True):
                assert (g is None) == (a is None)
                if g is not None:
                    torch.testing.assert_close(g, a, atol=1e-12, rtol=1e-12)


def test_empty_batch_with_no_bias_sizes_does_not_abort() -> None:
    # ATen aborts the process (std::bad_optional_access) for this call with bias_sizes=None.
    x, w = torch.randn(0, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(0, 4, 6, 6, dtype=F64)
    gi, gw, gb = convolution_backward(go, x, w, None, 1, 0, 1, False, 0, 1, ALL_MASK)
    assert gi.shape == x.shape and gb.shape == (4,)
    assert gw.abs().sum() == 0 and gb.abs().sum() == 0


# --- layouts: ATen's slow kernels get dense NCHW operands -------------------------------------


def upstream_repro() -> float:
    """Minimal standalone repro of the ATen bug guarded by native.convolution_backward.

    A float64 channels-last input whose size-1 dimension has stride 1 (not W*C), a
    channels-last weight, groups=2: ``aten::convolution_backward`` (Slow2d) returns a wrong
    grad_weight. Returns max |ATen grad_weight - autograd on dense copies|.
    """
    torch.manual_seed(0)
    x = torch.empty_strided((1, 4, 1, 4), (16, 1, 1, 4), dtype=torch.float64).normal_()
    w = torch.randn(2, 2, 1, 2, dtype=torch.float64).to(memory_format=torch.channels_last)
    go = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    args = ([2], [1, 1], [0, 0], [1, 1], False, [0, 0], 2, [False, True, False])
    gw = torch.ops.aten.convolution_backward(go, x, w, *args)[1]
    w_ = w.contiguous().requires_grad_()
    torch.nn.functional.conv2d(x.contiguous(), w_, groups=2).backward(go)
    return (gw - w_.grad).abs().max().item()


def test_the_upstream_repro_inputs_give_the_right_grad_weight_here() -> None:
    wrong = upstream_repro()  # large on torch 2.13; 0 once ATen is fixed
    torch.manual_seed(0)
    x = torch.empty_strided((1, 4, 1, 4), (16, 1, 1, 4), dtype=F64).normal_()
    w = torch.randn(2, 2, 1, 2, dtype=F64).to(memory_format=torch.channels_last)
    go = torch.randn(1, 2, 1, 3, dtype=F64)
    got = convolution_backward(go, x, w, None, 1, 0, 1, False, 0, 2, [False, True, False])[1]
    want = ref.convolution_backward(go, x, w, None, 1, 0, 1, False, 0, 2, ALL_MASK)[1]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert wrong == 0.0 or wrong > 1e-3  # either fixed upstream or clearly wrong


def test_issue_case_permuted_float64_input_and_channels_last_weight() -> None:
    # x[1,8,1,4] with permuted strides, w[12,2,1,4] channels_last, groups 4, stride (1,2),
    # padding (3,0): ATen 2.13 returns grad_weight off by ~9.9 here.
    x = torch.randn(1, 4, 8, 1, dtype=F64).permute(0, 2, 3, 1)
    w = torch.randn(12, 2, 1, 4, dtype=F64).to(memory_format=torch.channels_last)
    go = torch.randn(1, 12, 7, 1, dtype=F64)
    args = ([12], (1, 2), (3, 0), 1, False, 0, 4, ALL_MASK)
    got = convolution_backward(go, x, w, *args)
    want = ref.convolution_backward(go, x.contiguous(), w.contiguous(), *args)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


def _layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as ``t`` in another memory layout."""
    if kind == "contiguous":
        return t.contiguous()
    if kind == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if kind == "transposed":  # last two dims swapped in memory
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    # channels-last order with every size-1 dimension given stride 1
    cl = t.contiguous(memory_format=torch.channels_last)
    strides = [1 if size == 1 and i > 0 else s
               for i, (size, s) in enumerate(zip(cl.shape, cl.stride(), strict=True))]
    return torch.empty_strided(t.shape, strides, dtype=t.dtype).copy_(t)


LAYOUTS = ["contiguous", "channels_last", "transposed", "odd_size1"]


@given(
    n=st.integers(1, 2),
    cin_g=st.integers(1, 3),
    cout_g=st.integers(1, 2),
    groups=st.integers(1, 3),
    h=st.integers(1, 4),
    kw=st.integers(1, 3),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    padding=st.tuples(st.integers(0, 2), st.integers(0, 1)),
    dilation=st.integers(1, 2),
    layouts=st.tuples(*[st.sampled_from(LAYOUTS)] * 3),
)
def test_any_layout_gives_the_right_gradients_in_atens_layout(
    n, cin_g, cout_g, groups, h, kw, stride, padding, dilation, layouts
) -> None:
    """float64 (ATen's slow kernels) over memory layouts of input, weight and grad_output:
    the values equal the reference, the strides (on dimensions of size > 1, the only ones
    that place elements) equal ATen's own result where ATen gives one (it refuses some
    odd size-1 strides: issue 21 D18)."""
    xs, ws = (n, cin_g * groups, h, 5), (cout_g * groups, cin_g, 1, kw)
    p = ConvParams.create(2, stride, padding, dilation, False, 0, groups)
    try:
        p.check_shapes(xs, ws)
    except ValueError:
        return
    x = _layout(torch.randn(xs, dtype=F64), layouts[0])
    w = _layout(torch.randn(ws, dtype=F64), layouts[1])
    go = _layout(torch.randn(p.output_shape(xs, ws), dtype=F64), layouts[2])
    args = ([ws[0]], p.stride, p.padding, p.dilation, False, [0, 0], groups, ALL_MASK)
    got = convolution_backward(go, x, w, *args)
    want = ref.convolution_backward(go, x.contiguous(), w.contiguous(), *args)
    try:
        aten = torch.ops.aten.convolution_backward(go, x, w, *args)
    except RuntimeError as exc:
        assert "must be contiguous" in str(exc)
        aten = got
    for g, r, a in zip(got, want, aten, strict=True):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)
        assert _placing_strides(g) == _placing_strides(a)


def _placing_strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(s for n, s in zip(t.shape, t.stride(), strict=True) if n > 1)


def _odd_size1(t: torch.Tensor, fmt: torch.memory_format, odd: int) -> torch.Tensor:
    """``t`` dense in ``fmt`` with stride ``odd`` on every size-1 dimension."""
    dense = t.contiguous(memory_format=fmt)
    strides = [odd if n == 1 else s for n, s in zip(dense.shape, dense.stride(), strict=True)]
    out = dense.as_strided(dense.shape, strides)
    assert torch.equal(out, t)  # the same elements: size-1 strides place nothing
    return out


@pytest.mark.parametrize("route", ["native", "extension"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_channels_last_weight_with_odd_size1_stride(route, dtype) -> None:
    """Regression (issue 21 D17, D18): a channels_last input and a weight that is
    channels_last dense with an odd stride on its size-1 kernel dimension. float32 (Mkldnn):
    ATen's grad_input is off by ~10; float64 (Slow2d): the extension raised "slow_conv2d:
    grad_weight must be contiguous"."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 5, dtype=dtype).contiguous(memory_format=torch.channels_last)
    w0 = torch.randn(4, 2, 1, 3, dtype=dtype)
    w = _odd_size1(w0, torch.channels_last, 1)
    go = torch.randn(2, 4, 5, 3, dtype=dtype)
    args = ([4], 1, 0, 1, False, 0, 2, ALL_MASK)
    if route == "native":
        got = convolution_backward(go, x, w, *args)
    else:
        from convlab.aten import extension

        got = extension.load().convolution_backward(go, x, w, *args)
    want = ref.convolution_backward(go.double(), x.double().contiguous(), w0.double(), *args)
    tol = 1e-10 if dtype == F64 else 1e-4
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), r, atol=tol, rtol=tol)


def test_atens_own_result_for_the_odd_stride_weight_is_wrong_or_fixed() -> None:
    """What :func:`convlab.aten.native.canonical_strides` guards against, computed live."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=torch.channels_last)
    w0 = torch.randn(4, 2, 1, 3)
    go = torch.randn(2, 4, 5, 3)
    args = ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 2, ALL_MASK)
    flawed = torch.ops.aten.convolution_backward(go, x, _odd_size1(w0, torch.channels_last, 1),
                                                 *args)[0]
    right = torch.ops.aten.convolution_backward(go, x, w0, *args)[0]
    err = (flawed - right).abs().max().item()
    assert err < 1e-4 or err > 1.0  # either fixed upstream or clearly wrong, never "close"


@given(
    groups=st.integers(1, 3), cin_g=st.integers(1, 2), cout_g=st.integers(1, 2),
    kernel=st.sampled_from([(1, 1), (1, 3), (3, 1), (1, 2)]), odd=st.integers(1, 9),
    which=st.sets(st.sampled_from(["input", "weight", "grad_output"]), min_size=1),
    dtype=st.sampled_from([torch.float32, F64]), stride=st.integers(1, 2),
)
def test_odd_size1_strides_on_any_operand_give_the_right_gradients(
    groups, cin_g, cout_g, kernel, odd, which, dtype, stride
) -> None:
    """Class of D17/D18: any dense operand with any stride on its size-1 dimensions, every
    backend that the current flags select, float32 (oneDNN) and float64 (slow)."""
    xs, ws = (2, cin_g * groups, 5, 1), (cout_g * groups, cin_g, *kernel)
    p = ConvParams.create(2, stride, 0, 1, False, 0, groups)
    try:
        p.check_shapes(xs, ws)
    except ValueError:
        return
    cl = torch.channels_last
    x, w = torch.randn(xs, dtype=dtype), torch.randn(ws, dtype=dtype)
    go = torch.randn(p.output_shape(xs, ws), dtype=dtype)
    odd_x = _odd_size1(x, cl, odd) if "input" in which else x.contiguous(memory_format=cl)
    odd_w = _odd_size1(w, cl, odd) if "weight" in which else w
    odd_go = _odd_size1(go, cl, odd) if "grad_output" in which else go
    args = ([ws[0]], p.stride, p.padding, p.dilation, False, [0, 0], groups, ALL_MASK)
    got = convolution_backward(odd_go, odd_x, odd_w, *args)
    want = ref.convolution_backward(go.double(), x.double(), w.double(), *args)
    tol = 1e-10 if dtype == F64 else 1e-4
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), r, atol=tol, rtol=tol)


# --- torch.nn.grad equivalents ----------------------------------------------------------------

NN_GRID = list(itertools.product([1, 2, 3], [1, 2], [0, 1], [1, 2], [1, 2]))


@pytest.mark.parametrize("dim, stride, padding, dilation, groups", NN_GRID)
def test_conv_input_and_weight_match_torch_nn_grad(dim, stride, padding, dilation, groups):
    x = torch.randn(*(2, 4) + (7, 6, 5)[:dim], dtype=F64)
    w = torch.randn(*(6, 4 // groups) + (3, 2, 3)[:dim], dtype=F64)
    y = torch.ops.aten.convolution(x, w, None, [stride] * dim, [padding] * dim,
                                   [dilation] * dim, False, [0] * dim, groups)
    go = torch.randn_like(y)
    args = (stride, padding, dilation, groups)
    ours_in = conv_input(x.shape, w, go, *args)
    theirs_in = getattr(torch.nn.grad, f"conv{dim}d_input")(x.shape, w, go, *args)
    ours_w = conv_weight(x, w.shape, go, *args)
    theirs_w = getattr(torch.nn.grad, f"conv{dim}d_weight")(x, w.shape, go, *args)
    torch.testing.assert_close(ours_in, theirs_in, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ours_w, theirs_w, atol=1e-12, rtol=1e-12)
    want = ref.convolution_backward(go, x, w, None, *([stride], [padding], [dilation]), False,
                                    [0], groups, [True, True, False])
    torch.testing.assert_close(ours_in, want[0], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(ours_w, want[1], atol=1e-10, rtol=1e-10)
    if dim == 2:  # the names torch.nn.grad uses
        torch.testing.assert_close(native.conv2d_input(x.shape, w, go, *args), ours_in)
        torch.testing.assert_close(native.conv2d_weight(x, w.shape, go, *args), ours_w)


def test_conv_input_keeps_autograds_channels_last_layout() -> None:
    # The reason for the dense placeholder (see the conv_input docstring).
    x = torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(16, 8, 3, 3)
    y = torch.nn.functional.conv2d(x, w)
    go = torch.randn_like(y)
    y.backward(go)
    ours = conv_input(x.shape, w, go)
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    assert ours.stride() == x.grad.stride()
    torch.testing.assert_close(ours, x.grad, atol=1e-5, rtol=1e-5)  # fp32, same kernel path


def test_conv_input_and_weight_validate() -> None:
    w, go = torch.randn(4, 3, 3, 3), torch.randn(2, 4, 6, 6)
    with pytest.raises(ValueError, match="input_size"):
        conv_input([2, 3, 8], w, go)
    with pytest.raises(TypeError, match="input_size"):
        conv_input([2, 3, 8.0, 8], w, go)
    with pytest.raises(ValueError, match="weight"):
        native.conv2d_input([2, 3, 8, 8, 8], w[..., None], go)
    with pytest.raises(ValueError, match="grad_output"):
        conv_weight(torch.randn(2, 3, 9, 9), [4, 3, 3, 3], go)
    with pytest.raises(ValueError, match="weight_size"):
        conv_weight(torch.randn(2, 3, 8, 8), [4, -3, 3, 3], go)


# --- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_selects_cudnn_and_depthwise() -> None:
    x, w = torch.randn(2, 8, 16, 16, device="cuda"), torch.randn(8, 8, 3, 3, device="cuda")
    expect = "Cudnn" if torch.backends.cudnn.is_available() else "Slow2d"
    assert select_backend(x, w) == expect
    dw = torch.randn(8, 1, 3, 3, device="cuda")
    assert select_backend(x, dw, groups=8) in {"CudaDepthwise2d", "Cudnn"}
    saved = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = False
    try:
        assert select_backend(x, dw, groups=8) == "CudaDepthwise2d"
        assert select_backend(x, w) == "Slow2d"
    finally:
        torch.backends.cudnn.enabled = saved


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cudnn", "cudnn-deterministic", "slow"])
def test_cuda_backends_match_reference(backend: str) -> None:
    if backend.startswith("cudnn") and not torch.backends.cudnn.is_available():
        pytest.skip("no cuDNN")
    x = torch.randn(2, 4, 9, 9, device="cuda", dtype=F64)
    w = torch.randn(6, 2, 3, 3, device="cuda", dtype=F64)
    kw = dict(stride=2, padding=1, dilation=1, transposed=False, output_padding=0, groups=2)
    _grads_vs_reference(x, w, None, kw, backend, 1e-10)
    with use_backend(backend, x, w, None, **kw) as chosen:
        assert chosen == ("Slow2d" if backend == "slow" else "Cudnn")
