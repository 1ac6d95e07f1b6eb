"""convlab.scratch.numpy_ref against torch.ops.aten (float64): loops, im2col/col2im, GEMM paths."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from convlab.scratch import numpy_ref as R

aten = torch.ops.aten
TOL = {"rtol": 1e-10, "atol": 1e-10}
MASKS = list(itertools.product([True, False], repeat=3))


def make(
    n: int, c_in: int, c_out: int, size: tuple[int, ...], kernel: tuple[int, ...], groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = torch.randn(n, c_in, *size, dtype=torch.float64)
    w = torch.randn(c_out, c_in // groups, *kernel, dtype=torch.float64)
    b = torch.randn(c_out, dtype=torch.float64)
    return x.numpy(), w.numpy(), b.numpy()


def aten_forward(x, w, b, stride, padding, dilation, groups) -> np.ndarray:
    dim = w.ndim - 2
    b = None if b is None else torch.from_numpy(b)
    out = aten.convolution(
        torch.from_numpy(x), torch.from_numpy(w), b,
        [stride] * dim, [padding] * dim, [dilation] * dim, False, [0] * dim, groups,
    )  # fmt: skip
    return out.numpy()


def aten_backward(go, x, w, stride, padding, dilation, groups, mask=(True, True, True)):
    dim = w.ndim - 2
    grads = aten.convolution_backward(
        torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(w), [w.shape[0]],
        [stride] * dim, [padding] * dim, [dilation] * dim, False, [0] * dim, groups, list(mask),
    )  # fmt: skip
    return tuple(None if g is None else g.numpy() for g in grads)


def assert_grads(ours, expected) -> None:
    for name, a, e in zip(("grad_input", "grad_weight", "grad_bias"), ours, expected, strict=True):
        if e is None:
            assert a is None, f"{name} should be None (masked)"
        else:
            assert a is not None and a.shape == e.shape, name
            np.testing.assert_allclose(a, e, **TOL, err_msg=name)


# (dim, n, c_in, c_out, size, kernel, stride, padding, dilation, groups)
GRID = [
    (2, 2, 4, 6, (9, 8), (3, 3), 1, 1, 1, 1),
    (2, 2, 4, 6, (9, 8), (3, 2), 2, 0, 1, 2),
    (2, 1, 3, 3, (7, 7), (3, 3), 1, 2, 2, 3),  # depthwise: groups == channels
    (2, 3, 1, 2, (6, 5), (1, 1), 1, 0, 1, 1),  # 1x1 kernel, one channel
    (2, 2, 2, 3, (4, 5), (4, 5), 1, 0, 1, 1),  # kernel equal to input
    (2, 2, 2, 3, (10, 10), (2, 2), 3, 1, 1, 1),  # stride larger than kernel
    (2, 1, 6, 4, (11, 9), (3, 3), 2, 1, 3, 2),
    (1, 2, 4, 4, (13,), (3,), 2, 1, 2, 2),
    (1, 1, 1, 1, (5,), (5,), 1, 0, 1, 1),
    (3, 2, 2, 4, (5, 6, 4), (3, 2, 2), (1, 2, 1), 1, 1, 2),
]


def _norm(v, dim):
    return v if isinstance(v, tuple) else (v,) * dim


@pytest.mark.parametrize("case", GRID, ids=str)
def test_im2col_path_matches_aten(case) -> None:
    dim, n, c_in, c_out, size, kernel, stride, padding, dilation, groups = case
    x, w, b = make(n, c_in, c_out, size, kernel, groups)
    s = _norm(stride, dim)
    y = R.convolution(x, w, b, s, padding, dilation, groups)
    expected = aten.convolution(
        torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
        list(s), [padding] * dim, [dilation] * dim, False, [0] * dim, groups,
    ).numpy()  # fmt: skip
    np.testing.assert_allclose(y, expected, **TOL)
    go = np.random.default_rng(0).standard_normal(y.shape)
    grads = aten.convolution_backward(
        torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(w), [c_out],
        list(s), [padding] * dim, [dilation] * dim, False, [0] * dim, groups, [True] * 3,
    )  # fmt: skip
    ours = R.convolution_backward(go, x, w, [c_out], s, padding, dilation, groups)
    assert_grads(ours, [g.numpy() for g in grads])


@pytest.mark.parametrize("case", [c for c in GRID if c[0] < 3], ids=str)
def test_naive_loops_match_aten(case) -> None:
    dim, n, c_in, c_out, size, kernel, stride, padding, dilation, groups = case
    x, w, b = make(n, c_in, c_out, size, kernel, groups)
    y = R.convolution_naive(x, w, b, stride, padding, dilation, groups)
    np.testing.assert_allclose(y, aten_forward(x, w, b, stride, padding, dilation, groups), **TOL)
    go = np.random.default_rng(1).standard_normal(y.shape)
    ours = R.convolution_backward_naive(go, x, w, [c_out], stride, padding, dilation, groups)
    assert_grads(ours, aten_backward(go, x, w, stride, padding, dilation, groups))


def test_naive_3d_matches_aten() -> None:
    x, w, b = make(1, 2, 2, (4, 3, 4), (2, 2, 3), 1)
    y = R.convolution_naive(x, w, b, 1, 1, 1, 1)
    np.testing.assert_allclose(y, aten_forward(x, w, b, 1, 1, 1, 1), **TOL)
    go = np.ones_like(y)
    expected = aten_backward(go, x, w, 1, 1, 1, 1)
    assert_grads(R.convolution_backward_naive(go, x, w, None, 1, 1), expected)


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_every_output_mask(mask) -> None:
    x, w, _ = make(2, 4, 6, (7, 6), (3, 3), 2)
    go = np.random.default_rng(2).standard_normal((2, 6, 4, 3))
    expected = aten_backward(go, x, w, 2, 1, 1, 2, mask)
    assert_grads(R.convolution_backward(go, x, w, [6], 2, 1, 1, 2, mask), expected)
    assert_grads(R.convolution_backward_naive(go, x, w, [6], 2, 1, 1, 2, mask), expected)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation"),
    [(3, 1, 0, 1), (3, 2, 1, 1), ((2, 3), (1, 2), (0, 1), (2, 1)), (1, 3, 0, 1), (4, 1, 2, 1)],
)
def test_im2col_col2im_match_unfold_fold(kernel, stride, padding, dilation) -> None:
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    cols = R.im2col(x.numpy(), kernel, stride, padding, dilation)
    expected = F.unfold(x, kernel, dilation, padding, stride)
    np.testing.assert_array_equal(cols, expected.numpy())
    c = torch.randn_like(expected)
    back = R.col2im(c.numpy(), x.shape, kernel, stride, padding, dilation)
    np.testing.assert_allclose(back, F.fold(c, (9, 8), kernel, dilation, padding, stride), **TOL)


def test_float32_keeps_dtype_and_matches() -> None:
    x, w, b = (a.astype(np.float32) for a in make(2, 4, 4, (8, 8), (3, 3), 1))
    y = R.convolution(x, w, b, 1, 1)
    assert y.dtype == np.float32
    ref = aten.convolution(
        *(torch.from_numpy(a) for a in (x, w, b)), [1, 1], [1, 1], [1, 1], False, [0, 0], 1
    )
    # float32 with different summation orders: 1e-4 relative is the float32 noise level here.
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-4, atol=1e-4)
    grads = R.convolution_backward(np.ones_like(y), x, w, [4], 1, 1)
    assert all(g.dtype == np.float32 for g in grads)


@st.composite
def configs(draw):
    dim = draw(st.sampled_from([1, 2]))
    groups = draw(st.integers(1, 3))
    c_in = groups * draw(st.integers(1, 2))
    c_out = groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    stride = draw(st.integers(1, 3))
    padding = draw(st.integers(0, 2))
    dilation = draw(st.integers(1, 2))
    extent = [dilation * (k - 1) + 1 for k in kernel]
    size = tuple(max(1, e - 2 * padding) + draw(st.integers(0, 4)) for e in extent)
    n = draw(st.integers(0, 2))  # N = 0: empty results, as ATen
    return dim, n, c_in, c_out, size, kernel, stride, padding, dilation, groups


@given(configs(), st.sampled_from(MASKS))
def test_hypothesis_im2col_and_naive_match_aten(case, mask) -> None:
    dim, n, c_in, c_out, size, kernel, stride, padding, dilation, groups = case
    x, w, b = make(n, c_in, c_out, size, kernel, groups)
    y = R.convolution(x, w, b, stride, padding, dilation, groups)
    np.testing.assert_allclose(y, aten_forward(x, w, b, stride, padding, dilation, groups), **TOL)
    naive = R.convolution_naive(x, w, b, stride, padding, dilation, groups)
    np.testing.assert_allclose(naive, y, **TOL)
    go = np.random.default_rng(3).standard_normal(y.shape)
    expected = aten_backward(go, x, w, stride, padding, dilation, groups, mask)
    args = (go, x, w, [c_out], stride, padding, dilation, groups, mask)
    assert_grads(R.convolution_backward(*args), expected)
    assert_grads(R.convolution_backward_naive(*args), expected)


# ------------------------------------------------------------------------------ bad input

X = np.zeros((2, 4, 6, 6))
W = np.zeros((6, 2, 3, 3))
GO = np.zeros((2, 6, 4, 4))


conv, bwd, naive_bwd = R.convolution, R.convolution_backward, R.convolution_backward_naive
F32 = np.float32


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: conv(torch.zeros(2, 4, 6, 6), W, groups=2), TypeError, "input must be a numpy"),
        (lambda: conv(X.astype(np.int64), W, groups=2), TypeError, "input must have a floating"),
        (lambda: conv(X, W.astype(F32), groups=2), TypeError, "weight has dtype"),
        (lambda: conv(X, W, groups=3), ValueError, "groups=3 must divide"),
        (lambda: conv(X, W), ValueError, "input has 4 channels"),
        (lambda: conv(X, W, np.zeros(5), groups=2), ValueError, "bias must have shape"),
        (lambda: conv(X, W, stride=0, groups=2), ValueError, "stride must be positive"),
        (lambda: conv(X, W, padding=(1, 1, 1), groups=2), ValueError, "padding must be"),
        (lambda: conv(X, np.zeros((6, 2, 7, 7)), groups=2), ValueError, "kernel extent"),
        (lambda: conv(X[0], W, groups=2), ValueError, "input must have 4 dimensions"),
        (lambda: conv(X, W[0, 0], groups=2), ValueError, "weight must have at least 3"),
        (lambda: R.convolution_naive(X, W, dilation=4, groups=2), ValueError, "kernel extent"),
        (lambda: bwd(GO[:, :5], X, W, groups=2), ValueError, "grad_output must"),
        (lambda: bwd(GO, X, W, [5], groups=2), ValueError, "bias_sizes"),
        (lambda: bwd(GO, X, W, [6, 1], groups=2), ValueError, "bias_sizes must be"),
        (lambda: bwd(GO, X, W, 6, groups=2), TypeError, "bias_sizes must be"),
        (lambda: conv(X, W, 3.0, groups=2), TypeError, "bias must be a numpy"),
        (lambda: conv(X, W, [0.0] * 6, groups=2), TypeError, "bias must be a numpy"),
        (lambda: R.convolution_naive(X, W, 3.0, groups=2), TypeError, "bias must be a numpy"),
        (lambda: conv(X, np.zeros((0, 2, 3, 3)), groups=2), ValueError, "output channel"),
        (lambda: bwd(GO[:, :0], X, np.zeros((0, 2, 3, 3)), groups=2), ValueError,
         "output channel"),
        (lambda: conv(X, W, padding=10**20, groups=2), ValueError, "padding=.* int64"),
        (lambda: conv(X, W, stride=(1, 2**63), groups=2), ValueError, "stride=.* int64"),
        (lambda: R.im2col(X, 3, padding=10**20), ValueError, "padding=.* int64"),
        (lambda: bwd(GO, X, W, groups=2, output_mask=(1, 1, 1)), TypeError, "output_mask"),
        (lambda: naive_bwd(GO.astype(F32), X, W, groups=2), TypeError, "grad_output has"),
        (lambda: R.im2col(X, 7), ValueError, "kernel extent"),
        (lambda: R.im2col(X, (3, 3, 3)), ValueError, "kernel_size must be"),
        (lambda: R.col2im(np.zeros((2, 36, 15)), X.shape, 3), ValueError, "columns must have"),
    ],
)
def test_bad_input_is_named(call, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        call()


def test_non_contiguous_arrays() -> None:
    x, w, b = make(2, 4, 6, (7, 8), (3, 3), 2)
    xf, wf = np.asfortranarray(x), np.asfortranarray(w)
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    for xa, wa in [(xf, wf), (xt, w)]:
        y = R.convolution(xa, wa, b, 2, 1, 1, 2)
        np.testing.assert_allclose(y, aten_forward(x, w, b, 2, 1, 1, 2), **TOL)
        go = np.asfortranarray(np.ones_like(y))
        assert_grads(R.convolution_backward(go, xa, wa, [6], 2, 1, 1, 2),
                     aten_backward(go, x, w, 2, 1, 1, 2))  # fmt: skip


def test_empty_batch_matches_aten() -> None:
    """Regression: N = 0 used to fail in reshape(-1); ATen returns empty results."""
    x, w, b = make(0, 4, 6, (7, 6), (3, 2), 2)
    y = R.convolution(x, w, b, 2, 1, 1, 2)
    np.testing.assert_array_equal(y, aten_forward(x, w, b, 2, 1, 1, 2))
    assert y.shape == (0, 6, 4, 4)
    go = np.zeros(y.shape)
    for mask in MASKS:
        assert_grads(R.convolution_backward(go, x, w, [6], 2, 1, 1, 2, mask),
                     aten_backward(go, x, w, 2, 1, 1, 2, mask))  # fmt: skip
    cols = R.im2col(x, (3, 2), 2, 1)
    assert cols.shape == tuple(F.unfold(torch.from_numpy(x), (3, 2), 1, 1, 2).shape)
    assert R.col2im(cols, x.shape, (3, 2), 2, 1).shape == x.shape
