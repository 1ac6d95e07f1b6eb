"""convlab.scratch.thnn against ATen's slow 2-d path (float64), and the explicit-buffer contract."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import devices
from hypothesis import given
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from convlab.scratch import thnn

aten = torch.ops.aten
TOL = {"rtol": 1e-10, "atol": 1e-10}
MASKS = list(itertools.product([True, False], repeat=3))


def setup_case(n, c_in, c_out, size, kernel, bias=True, device="cpu", dtype=torch.float64):
    x = torch.randn(n, c_in, *size, dtype=dtype, device=device)
    w = torch.randn(c_out, c_in, *kernel, dtype=dtype, device=device)
    b = torch.randn(c_out, dtype=dtype, device=device) if bias else None
    return x, w, b


def check_against_aten(x, w, b, kernel, stride, padding, mask=(True, True, True)) -> None:
    s2, p2 = [stride] * 2 if isinstance(stride, int) else list(stride), [padding] * 2
    out, finput = thnn.conv2d_forward(x, w, kernel, b, stride, padding)
    torch.testing.assert_close(out, aten._slow_conv2d_forward(x, w, list(kernel), b, s2, p2), **TOL)
    torch.testing.assert_close(finput, torch.nn.functional.unfold(x, kernel, 1, padding, stride))
    go = torch.randn_like(out)
    expected = aten._slow_conv2d_backward.output_mask(go, x, w, list(kernel), s2, p2, list(mask))
    for cols in (finput, None):  # the forward's columns, or None: convlab recomputes them
        ours = thnn.conv2d_backward(go, x, w, kernel, stride, padding, cols, None, mask)
        names = ("grad_input", "grad_weight", "grad_bias")
        for name, a, e in zip(names, ours, expected, strict=True):
            if e is None:
                assert a is None, f"{name} should be None (masked)"
            else:
                torch.testing.assert_close(a, e, **TOL, msg=name)


# (n, c_in, c_out, size, kernel, stride, padding)
GRID = [
    (2, 4, 6, (9, 8), (3, 3), 1, 1),
    (2, 4, 6, (9, 8), (3, 2), 2, 0),
    (3, 1, 2, (6, 5), (1, 1), 1, 0),  # 1x1 kernel, one input channel
    (2, 2, 3, (4, 5), (4, 5), 1, 0),  # kernel equal to input
    (1, 3, 2, (10, 10), (2, 2), 3, 1),  # stride larger than kernel, batch 1
    (2, 3, 1, (7, 7), (5, 5), 1, 2),  # one output channel, "same" padding
    (2, 2, 4, (11, 9), (3, 3), (2, 1), 2),  # padding as large as allowed
]


@pytest.mark.parametrize("case", GRID, ids=str)
def test_matches_slow_conv2d(case) -> None:
    n, c_in, c_out, size, kernel, stride, padding = case
    x, w, b = setup_case(n, c_in, c_out, size, kernel)
    check_against_aten(x, w, b, kernel, stride, padding)


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_every_output_mask(mask) -> None:
    x, w, b = setup_case(2, 3, 4, (7, 6), (3, 3))
    check_against_aten(x, w, b, (3, 3), 2, 1, mask)


def test_no_bias_and_old_2d_weight_layout() -> None:
    x, w, _ = setup_case(2, 3, 4, (6, 6), (3, 2), bias=False)
    out4, _ = thnn.conv2d_forward(x, w, (3, 2), None, 1, 1)
    out2, _ = thnn.conv2d_forward(x, w.reshape(4, -1), (3, 2), None, 1, 1)
    torch.testing.assert_close(out2, out4, rtol=0, atol=0)
    go = torch.randn_like(out4)
    g4 = thnn.conv2d_backward(go, x, w, (3, 2), 1, 1, None, None)
    g2 = thnn.conv2d_backward(go, x, w.reshape(4, -1), (3, 2), 1, 1, None, None)
    assert g2[1].shape == (4, 18)
    torch.testing.assert_close(g2[1], g4[1].reshape(4, -1), rtol=0, atol=0)
    torch.testing.assert_close(g2[0], g4[0], rtol=0, atol=0)


@st.composite
def configs(draw):
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    padding = draw(st.integers(0, 2))
    size = tuple(max(1, k - 2 * padding) + draw(st.integers(0, 5)) for k in kernel)
    return (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)), size,
            kernel, stride, padding)  # fmt: skip


@given(configs(), st.sampled_from(MASKS), st.booleans())
def test_hypothesis_matches_slow_conv2d(case, mask, bias) -> None:
    n, c_in, c_out, size, kernel, stride, padding = case
    x, w, b = setup_case(n, c_in, c_out, size, kernel, bias)
    check_against_aten(x, w, b, kernel, stride, padding, mask)


@pytest.mark.parametrize("device", devices())
def test_follows_the_device(device) -> None:
    x, w, b = setup_case(2, 3, 4, (8, 8), (3, 3), device=device)
    check_against_aten(x, w, b, (3, 3), 1, 1)


# ------------------------------------------------------------------------ explicit buffers


def test_large_enough_buffers_keep_their_storage() -> None:
    x, w, b = setup_case(2, 3, 4, (8, 8), (3, 3))
    finput = torch.empty(10_000, dtype=x.dtype)  # larger than the 2*27*64 columns
    fgrad_input = torch.empty(3, 5000, dtype=x.dtype)
    ptrs = finput.data_ptr(), fgrad_input.data_ptr()
    for _ in range(3):
        out, cols = thnn.conv2d_forward(x, w, 3, b, 1, 1, finput)
        assert cols is finput and finput.shape == (2, 27, 64)
        thnn.conv2d_backward(torch.randn_like(out), x, w, 3, 1, 1, finput, fgrad_input)
        assert fgrad_input.shape == (2, 27, 64)
        assert (finput.data_ptr(), fgrad_input.data_ptr()) == ptrs
    # A smaller problem shrinks the shape in place; the storage stays.
    thnn.conv2d_forward(x[:1], w, 3, b, 2, 0, finput)
    assert finput.shape == (1, 27, 9) and finput.data_ptr() == ptrs[0]


def test_too_small_buffers_are_resized_in_place() -> None:
    x, w, b = setup_case(2, 3, 4, (8, 8), (3, 3))
    finput, fgrad_input = torch.empty(0, dtype=x.dtype), torch.empty(7, dtype=x.dtype)
    out, cols = thnn.conv2d_forward(x, w, 3, b, 1, 1, finput)
    assert cols is finput and finput.shape == (2, 27, 64)
    go = torch.randn_like(out)
    gi, _, _ = thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, fgrad_input)
    assert fgrad_input.shape == (2, 27, 64)
    # fgrad_input now holds weightᵀ @ grad_output, the columns' gradient.
    torch.testing.assert_close(fgrad_input, w.reshape(4, -1).t() @ go.reshape(2, 4, -1), **TOL)
    torch.testing.assert_close(gi, torch.nn.functional.fold(fgrad_input, 8, 3, 1, 1, 1), **TOL)


def test_finput_of_the_right_shape_is_trusted_like_thnn() -> None:
    # THNN's contract: backward reads the columns the forward left in finput.
    x, w, b = setup_case(2, 3, 4, (6, 6), (3, 3))
    out, finput = thnn.conv2d_forward(x, w, 3, b, 1, 0)
    go = torch.randn_like(out)
    finput.mul_(2)
    _, gw, _ = thnn.conv2d_backward(go, x, w, 3, 1, 0, finput, None, (False, True, False))
    expected = aten._slow_conv2d_backward.output_mask(go, x, w, [3, 3], [1, 1], [0, 0],
                                                      [False, True, False])[1]  # fmt: skip
    torch.testing.assert_close(gw, 2 * expected, **TOL)


def test_steady_state_backward_allocates_only_its_outputs() -> None:
    x, w, b = setup_case(4, 8, 6, (16, 16), (3, 3), dtype=torch.float32)
    out, finput = thnn.conv2d_forward(x, w, 3, b, 1, 1)
    go, fgrad_input = torch.randn_like(out), torch.empty(0)
    thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, fgrad_input)  # warm-up sizes the scratch
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        grads = thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, fgrad_input)
    allocated = sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0)
    assert allocated == sum(g.numel() * g.element_size() for g in grads)


class _OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_uses_no_native_convolution_op() -> None:
    x, w, b = setup_case(2, 3, 4, (6, 6), (3, 3))
    with _OpLog() as log:
        out, finput = thnn.conv2d_forward(x, w, 3, b, 1, 1)
        thnn.conv2d_backward(torch.ones_like(out), x, w, 3, 1, 1, finput, None)
    assert "aten.bmm.out" in log.ops
    assert not [op for op in log.ops if "conv" in op]


# ------------------------------------------------------------------------------ bad input

X, Wt, B = setup_case(2, 3, 4, (6, 6), (3, 3))
GO = torch.zeros(2, 4, 6, 6, dtype=torch.float64)
fwd, bwd = thnn.conv2d_forward, thnn.conv2d_backward


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: fwd(X, Wt, 3, B, 1, 1, torch.empty(0)), TypeError, "finput has dtype"),
        (lambda: fwd(X, Wt, 3, B, 1, 1, torch.empty(0, device="meta", dtype=X.dtype)),
         ValueError, "finput is on meta"),
        (lambda: fwd(X, Wt, 3, B, 1, 1, X.numpy()), TypeError, "finput must be a torch.Tensor"),
        (lambda: fwd(X, Wt, 3, B, 1, 1, torch.empty(0, dtype=X.dtype, requires_grad=True)),
         ValueError, "finput is a work buffer"),
        (lambda: bwd(GO, X, Wt, 3, 1, 1, None, torch.empty(0)), TypeError, "fgrad_input has"),
        (lambda: bwd(GO, X, Wt, 3, 1, 1, None, torch.empty(0, dtype=X.dtype, device="meta"),
                     (False, True, True)), ValueError, "fgrad_input is on meta"),
        (lambda: bwd(GO, X, Wt, 3, 1, 1, None, torch.empty(2, 36, 27, dtype=X.dtype).mT),
         ValueError, "fgrad_input must be contiguous"),
        (lambda: fwd(X, Wt, 2, B, 1, 1), ValueError, "kernel_size=.2, 2. does not match"),
        (lambda: fwd(X, Wt.reshape(4, -1), 2, B, 1, 1), ValueError, "a 2-d weight must be"),
        (lambda: fwd(X, Wt[:, :2], 3, B, 1, 1), ValueError, "input has 3 channels"),
        (lambda: fwd(X, Wt, 3, B[:3], 1, 1), ValueError, "bias must have shape"),
        (lambda: fwd(X[0], Wt, 3, B, 1, 1), ValueError, "input must be .N, C_in, H, W."),
        (lambda: fwd(X, Wt, 3, B, 0, 1), ValueError, "stride must be positive"),
        (lambda: fwd(X, Wt, 3, B, 1, -1), ValueError, "padding must be non-negative"),
        (lambda: fwd(X, Wt, 7, B, 1, 0), ValueError, "kernel_size=.7, 7. does not match"),
        (lambda: fwd(X, torch.zeros(4, 3, 9, 9, dtype=X.dtype), 9, B, 1, 1), ValueError,
         "kernel extent"),
        (lambda: fwd(X.float(), Wt, 3, B, 1, 1), TypeError, "weight has dtype"),
        (lambda: bwd(GO[:, :3], X, Wt, 3, 1, 1, None, None), ValueError, "grad_output must"),
        (lambda: bwd(GO, X, Wt, 3, 1, 1, None, None, (True, True)), ValueError, "output_mask"),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        call()


def test_channels_last_and_non_contiguous_tensors() -> None:
    x, w, b = setup_case(2, 3, 4, (7, 6), (3, 3))
    xs, ws = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    out, finput = thnn.conv2d_forward(xs, ws, 3, b, 2, 1)
    torch.testing.assert_close(out, aten._slow_conv2d_forward(x, w, [3, 3], b, [2, 2], [1, 1]))
    go = torch.randn(2, 4, 3, 4, dtype=x.dtype).transpose(2, 3)  # [2, 4, 4, 3], not contiguous
    expected = aten._slow_conv2d_backward.output_mask(go.contiguous(), x, w, [3, 3], [2, 2],
                                                      [1, 1], [True] * 3)  # fmt: skip
    for a, e in zip(thnn.conv2d_backward(go, xs, ws, 3, 2, 1, finput, None), expected, strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_inputs_that_require_grad_build_no_graph() -> None:
    x, w, b = (t.requires_grad_() for t in setup_case(2, 3, 4, (6, 6), (3, 3)))
    finput, fgrad_input = torch.empty(0, dtype=x.dtype), torch.empty(0, dtype=x.dtype)
    for _ in range(2):  # the buffers stay plain work buffers, reusable on the next call
        out, _ = thnn.conv2d_forward(x, w, 3, b, 1, 1, finput)
        grads = thnn.conv2d_backward(torch.ones_like(out), x, w, 3, 1, 1, finput, fgrad_input)
    assert not out.requires_grad and not any(g.requires_grad for g in grads)
    assert not finput.requires_grad and not fgrad_input.requires_grad


def test_backward_checks_buffers_before_any_work() -> None:
    x, w, _ = setup_case(2, 3, 4, (6, 6), (3, 3))
    go = torch.ones(2, 4, 6, 6, dtype=x.dtype)
    fgrad_input = torch.full((2, 27, 36), 7.0, dtype=x.dtype)
    bad_finput = torch.empty(2, 36, 27, dtype=x.dtype).mT  # right shape, not contiguous
    for finput, error in [(bad_finput, ValueError), ("columns", TypeError)]:
        with pytest.raises(error, match="finput"):
            thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, fgrad_input)
    assert (fgrad_input == 7).all(), "fgrad_input was written before finput was refused"


# ------------------------------------------------- the 1.x CPU contract (ConvolutionMM2d.cpp)


@pytest.mark.parametrize("mask", [m for m in MASKS if m[0] or m[1]], ids=str)
def test_empty_finput_is_refused_like_the_1x_cpu_op(mask) -> None:
    """The 2020 recipe (empty finput/fgrad_input) failed on CPU: a clear error here."""
    x, w, _ = setup_case(2, 3, 4, (6, 6), (3, 3))
    go = torch.randn(2, 4, 4, 4, dtype=x.dtype)
    with pytest.raises(ValueError, match="finput must hold the forward's columns"):
        thnn.conv2d_backward(go, x, w, 3, 1, 0, torch.empty(0, dtype=x.dtype),
                             torch.empty(0, dtype=x.dtype), mask)


def test_bias_only_backward_ignores_finput() -> None:
    x, w, _ = setup_case(2, 3, 4, (6, 6), (3, 3))
    go = torch.randn(2, 4, 4, 4, dtype=x.dtype)
    _, _, gb = thnn.conv2d_backward(go, x, w, 3, 1, 0, torch.empty(0, dtype=x.dtype), None,
                                    (False, False, True))
    torch.testing.assert_close(gb, go.sum((0, 2, 3)), **TOL)


def test_pointwise_forward_returns_a_view_of_the_input() -> None:
    """1x1 kernel, stride 1, no padding: finput is the input itself, as in 1.x."""
    x, w, b = setup_case(2, 3, 4, (5, 6), (1, 1))
    buf = torch.full((7,), 3.0, dtype=x.dtype)
    out, finput = thnn.conv2d_forward(x, w, 1, b, 1, 0, buf)
    assert finput.data_ptr() == x.data_ptr() and finput.shape == (2, 3, 30)
    assert buf.shape == (7,) and (buf == 3).all()  # the buffer passed in is untouched
    torch.testing.assert_close(out, aten._slow_conv2d_forward(x, w, [1, 1], b, [1, 1], [0, 0]))
    go = torch.randn_like(out)
    ours = thnn.conv2d_backward(go, x, w, 1, 1, 0, finput, None)
    theirs = aten._slow_conv2d_backward.output_mask(go, x, w, [1, 1], [1, 1], [0, 0], [True] * 3)
    for a, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, e, **TOL)


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_empty_batch_matches_aten(mask) -> None:
    x, w, b = setup_case(0, 3, 4, (6, 6), (3, 3))
    out, finput = thnn.conv2d_forward(x, w, 3, b, 1, 1)
    torch.testing.assert_close(out, aten._slow_conv2d_forward(x, w, [3, 3], b, [1, 1], [1, 1]))
    go = torch.randn_like(out)
    expected = aten._slow_conv2d_backward.output_mask(go, x, w, [3, 3], [1, 1], [1, 1],
                                                      list(mask))  # fmt: skip
    for cols in (finput, None):
        ours = thnn.conv2d_backward(go, x, w, 3, 1, 1, cols, torch.empty(0, dtype=x.dtype), mask)
        for a, e in zip(ours, expected, strict=True):
            assert (a is None) == (e is None)
            if e is not None:
                assert a.shape == e.shape
                torch.testing.assert_close(a, e, **TOL)


@pytest.mark.parametrize(
    ("shape", "kernel", "padding", "word"),
    [
        ((2, 3, 6, 6), 9, 0, "larger than the padded input"),
        ((2, 3, 6, 6), 9, 1, "larger than the padded input"),
        ((2, -3, 6, 6), 3, 0, "input_shape"),
        ((-1, 3, 6, 6), 3, 0, "input_shape"),
        ((2, 3, 0, 6), 3, 0, "input_shape"),
        ((2, 3, 6), 3, 0, "input_shape"),
        ((2, 3, 6, 6), 0, 0, "kernel_size"),
        ((2, 3, 6, 6), (3, -1), 0, "kernel_size"),
        ((2, 3, 6, 6), 3, -1, "padding"),
    ],
)  # fmt: skip
def test_columns_shape_refuses_nonsense(shape, kernel, padding, word) -> None:
    with pytest.raises(ValueError, match=word):
        thnn.columns_shape(shape, kernel, 1, padding)


def test_columns_shape_matches_unfold() -> None:
    x = torch.randn(2, 3, 7, 6)
    for kernel, stride, padding in [(3, 1, 1), ((2, 3), (2, 1), 0), (6, 1, 0), (1, 2, 2)]:
        cols = torch.nn.functional.unfold(x, kernel, 1, padding, stride)
        assert thnn.columns_shape(x.shape, kernel, stride, padding) == tuple(cols.shape)


# ------------------------------------------------------------------ aliasing buffers


def _aliasing_calls(x, w, b, go, finput):
    """(description, call) pairs where a written buffer shares memory with another argument."""
    cols_copy = finput.clone()
    big = torch.zeros(10 * finput.numel(), dtype=x.dtype)
    return [
        ("finput=x", lambda: thnn.conv2d_forward(x, w, 3, b, 1, 1, x)),
        ("finput=w", lambda: thnn.conv2d_forward(x, w, 3, b, 1, 1, w)),
        ("finput=view of x", lambda: thnn.conv2d_forward(x, w, 3, b, 1, 1, x.view(-1)[:0])),
        ("fgrad_input=finput", lambda: thnn.conv2d_backward(go, x, w, 3, 1, 1, cols_copy,
                                                            cols_copy)),
        ("fgrad_input=grad_output", lambda: thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, go)),
        ("fgrad_input=x", lambda: thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, x)),
        ("fgrad_input overlaps finput", lambda: thnn.conv2d_backward(
            go, x, w, 3, 1, 1, big[:finput.numel()].view(finput.shape).copy_(finput),
            big[finput.numel() // 2:][:finput.numel()].view(finput.shape))),
    ]


def test_aliasing_buffers_are_refused_before_any_work() -> None:
    """Regression: aliased buffers used to corrupt gradients and resize the inputs."""
    x, w, b = setup_case(2, 3, 4, (6, 6), (3, 3))
    out, finput = thnn.conv2d_forward(x, w, 3, b, 1, 1)
    go = torch.randn_like(out)
    before = [t.clone() for t in (x, w, b, go, finput)]
    for what, call in _aliasing_calls(x, w, b, go, finput):
        with pytest.raises(ValueError, match="shares memory"):
            call()
        for t, saved in zip((x, w, b, go, finput), before, strict=True):
            assert t.shape == saved.shape and torch.equal(t, saved), what


_WINDOWS = {  # ways to hand over a window on ``big``; only the first is a view to autograd
    "view": lambda t: t,
    "detach": lambda t: t.detach(),
    "data": lambda t: t.data,
}


@pytest.mark.parametrize("how", ["detach", "data"])
@pytest.mark.parametrize("which", ["finput", "fgrad_input"])
def test_detached_slice_buffer_is_not_resized_over_its_base(how, which) -> None:
    """Regression (issue 21 D2): ``big[:10].detach()`` counted as owning its storage, and
    the resize overwrote thousands of elements of ``big``."""
    x, w, b = setup_case(2, 2, 3, (6, 6), (3, 3))
    out, finput = thnn.conv2d_forward(x, w, 3, b, 1, 1)
    go = torch.randn_like(out)
    big = torch.full((10_000,), 5.0, dtype=x.dtype)
    buf = _WINDOWS[how](big[:10])
    with pytest.raises(ValueError, match=which):
        if which == "finput":
            thnn.conv2d_forward(x, w, 3, b, 1, 1, buf)
        else:
            thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, buf)
    assert (big == 5).all() and buf.shape == (10,)


@given(st.integers(0, 3), st.integers(1, 3), st.integers(0, 200), st.integers(1, 400),
       st.sampled_from(["finput", "fgrad_input"]), st.sampled_from(sorted(_WINDOWS)))
def test_hypothesis_buffers_never_write_outside_their_view(n, k, start, length, which,
                                                           how) -> None:
    """A buffer that is a window on a bigger tensor's storage (a slice, or its ``.detach()``
    or ``.data``): the call either works within the window or refuses; the rest of the
    bigger tensor is never written."""
    x, w, b = setup_case(n, 2, 3, (5, 4), (k, k))
    out, finput = thnn.conv2d_forward(x, w, k, b, 1, 1)
    go = torch.randn_like(out)
    big = torch.full((1000,), 5.0, dtype=x.dtype)
    view = _WINDOWS[how](big[start:start + length])
    shape = thnn.columns_shape(x.shape, k, 1, 1)
    if view.numel() == math.prod(shape):
        view = view.view(shape)
    try:
        if which == "finput":
            thnn.conv2d_forward(x, w, k, b, 1, 1, view)
        else:
            thnn.conv2d_backward(go, x, w, k, 1, 1, finput, view)
    except ValueError as e:
        assert which in str(e)
    outside = torch.cat([big[:start], big[start + length:]])
    assert (outside == 5).all()
    assert big.shape == (1000,)


def test_one_workspace_serves_large_small_mid_large_layers() -> None:
    """Regression (issue 34 E9): after a small layer shrank ``finput``, a mid-sized layer was
    refused ("a shrunk buffer"); PyTorch 1.9's ``resize_`` reused the storage. Both buffers
    now stay in one storage for the whole sequence, and every step matches ATen."""
    finput, fgrad_input = torch.empty(0, dtype=torch.float64), torch.empty(0,
                                                                            dtype=torch.float64)
    ptrs = None
    for n, size in [(4, 16), (1, 5), (2, 10), (4, 16)]:  # large, small, mid, large
        x, w, b = setup_case(n, 3, 4, (size, size), (3, 3))
        out, cols = thnn.conv2d_forward(x, w, 3, b, 1, 1, finput)
        go = torch.randn_like(out)
        got = thnn.conv2d_backward(go, x, w, 3, 1, 1, finput, fgrad_input)
        assert cols is finput and finput.shape == fgrad_input.shape == (n, 27, size * size)
        here = (finput.untyped_storage().data_ptr(), fgrad_input.untyped_storage().data_ptr())
        ptrs = ptrs or here
        assert here == ptrs, "the first (largest) layer's storage suffices: no reallocation"
        torch.testing.assert_close(out, aten._slow_conv2d_forward(x, w, [3, 3], b, [1, 1],
                                                                  [1, 1]), **TOL)
        want = aten._slow_conv2d_backward.output_mask(go, x, w, [3, 3], [1, 1], [1, 1],
                                                      [True, True, True])
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, **TOL)


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """A copy of every element of ``t``'s storage, also those outside ``t``."""
    return t.new_empty(0).set_(t.untyped_storage()).clone()


@pytest.mark.parametrize("how", ["view", "detach", "data"])
def test_a_window_on_a_shrunk_workspace_is_still_refused(how) -> None:
    """The reuse is for the buffer convlab shrank only: a view, .detach() or .data of it
    is a window on its storage and may not grow over the spare memory (round-3 rule)."""
    x, w, b = setup_case(4, 3, 4, (16, 16), (3, 3))
    _, finput = thnn.conv2d_forward(x, w, 3, b, 1, 1, torch.empty(0, dtype=x.dtype))
    thnn.conv2d_forward(x[:1, :, :5, :5], w, 3, b, 1, 1, finput)  # shrunk by convlab
    window = _WINDOWS[how](finput[:1] if how == "view" else finput)
    spare = whole_storage(finput)
    with pytest.raises(ValueError, match="finput has shape"):
        thnn.conv2d_forward(x[:2, :, :10, :10], w, 3, b, 1, 1, window)
    after = whole_storage(finput)
    assert torch.equal(after, spare) and finput.shape == (1, 27, 25)
