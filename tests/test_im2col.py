"""convlab.scratch.im2col: the column layout, its adjoint, and agreement with F.unfold / F.fold."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from convlab.scratch.im2col import col2im, im2col

DT = torch.float64


@st.composite
def windows(draw: st.DrawFn, max_dim: int = 3):
    """(x, kernel, out_size, stride, padding, dilation, groups), out_size possibly short."""
    dim = draw(st.integers(1, max_dim))
    groups = draw(st.integers(1, 3))
    c = groups * draw(st.integers(1, 2))
    n = draw(st.integers(0, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(dim)]
    stride = [draw(st.integers(1, 3)) for _ in range(dim)]
    dilation = [draw(st.integers(1, 2)) for _ in range(dim)]
    padding = [draw(st.integers(0, 2)) for _ in range(dim)]
    size = [max(1, d * (k - 1) + 1 - 2 * p) + draw(st.integers(0, 3))
            for k, d, p in zip(kernel, dilation, padding, strict=True)]
    full = [(s + 2 * p - d * (k - 1) - 1) // st_ + 1
            for s, p, d, k, st_ in zip(size, padding, dilation, kernel, stride, strict=True)]
    out = [draw(st.integers(1, f)) for f in full]
    x = torch.randn(n, c, *size, dtype=DT)
    return x, kernel, out, stride, padding, dilation, groups


@settings(max_examples=30, deadline=None)
@given(windows())
def test_col2im_is_the_adjoint(case) -> None:
    """<im2col(x), c> == <x, col2im(c)> for random c, N-d, groups, short out_size."""
    x, kernel, out, stride, padding, dilation, groups = case
    args = (kernel, out, stride, padding, dilation)
    cols = im2col(x, *args, groups)
    c = torch.randn_like(cols)
    folded = col2im(c, x.shape, *args)
    assert folded.shape == x.shape and folded.is_contiguous()
    torch.testing.assert_close((cols * c).sum(), (x * folded).sum(), rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(windows(max_dim=2).filter(lambda c: len(c[1]) == 2))
def test_columns_hold_the_same_entries_as_unfold(case) -> None:
    """2-d with the full output size: the columns are a permutation of F.unfold's."""
    x, kernel, _, stride, padding, dilation, groups = case
    n, c = x.shape[:2]
    ref = F.unfold(x, kernel, dilation, padding, stride)  # [N, C*k, L]
    k, positions = math.prod(kernel), ref.shape[-1]
    full = [(s + 2 * p - d * (kk - 1) - 1) // st_ + 1 for s, p, d, kk, st_ in
            zip(x.shape[2:], padding, dilation, kernel, stride, strict=True)]
    args = (kernel, full, stride, padding, dilation, groups)
    by_group = ref.reshape(n, groups, c // groups, k, positions)  # [N, G, C/G, k, L]
    expected_cols = by_group.permute(1, 2, 3, 0, 4).reshape(groups, c // groups * k,
                                                               n * positions)
    torch.testing.assert_close(im2col(x, *args), expected_cols, rtol=0, atol=0)
    # col2im agrees with F.fold on the same entries (fold sums overlapping windows too)
    grad = torch.randn_like(ref)
    cols = grad.reshape(n, groups, c // groups * k, positions).permute(1, 2, 0, 3)
    torch.testing.assert_close(
        col2im(cols.reshape(groups, c // groups * k, n * positions), x.shape, *args[:-1]),
        F.fold(grad, x.shape[2:], kernel, dilation, padding, stride), rtol=1e-12, atol=1e-12)


def test_padding_reads_as_zero_and_is_dropped_on_the_way_back() -> None:
    x = torch.full((1, 1, 2), float("inf"), dtype=DT)
    cols = im2col(x, [2], [3], [1], [1], [1], 1)
    inf = float("inf")
    assert cols.tolist() == [[[0.0, inf, inf], [inf, inf, 0.0]]]
    # col2im adds only entries that came from the input: padding entries never reach it
    back = col2im(torch.ones(1, 2, 3, dtype=DT), x.shape, [2], [3], [1], [1], [1])
    assert back.tolist() == [[[2.0, 2.0]]]


def test_col2im_is_differentiable_when_inputs_require_grad() -> None:
    x = torch.randn(2, 2, 5, dtype=DT)
    cols = im2col(x, [3], [3], [1], [0], [1], 2).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda c: col2im(c, x.shape, [3], [3], [1], [0], [1]), (cols,))


def test_mismatched_ranks_are_named() -> None:
    fn = im2col
    x = torch.randn(1, 2, 5, 5)
    with pytest.raises(ValueError, match="stride"):
        fn(x, [3, 3], [3, 3], [1], [0, 0], [1, 1], 1)
    with pytest.raises(ValueError, match="input must be"):
        fn(x[0], [3, 3], [3, 3], [1, 1], [0, 0], [1, 1], 1)


# --- bad arguments (issue 21 D14): a clear error naming the argument, before any work -------

X = torch.randn(1, 2, 5, 5, dtype=DT)
GOOD = {"kernel": (3, 3), "out_size": (3, 3), "stride": (1, 1), "padding": (0, 0),
        "dilation": (1, 1), "groups": 1}
BAD_IM2COL = [
    ({"groups": 0}, ValueError, "groups=0"),
    ({"groups": 3}, ValueError, "groups=3"),
    ({"groups": True}, TypeError, "groups"),
    ({"stride": (0, 1)}, ValueError, "stride"),
    ({"dilation": (1, 0)}, ValueError, "dilation"),
    ({"padding": (-1, 0)}, ValueError, "padding"),
    ({"kernel": (0, 3)}, ValueError, "kernel"),
    ({"kernel": (3,)}, ValueError, "out_size must have 1 entries"),
    ({"kernel": (3,), "out_size": (3,), "stride": (1,), "padding": (0,), "dilation": (1,)},
     ValueError, "the input must be"),
    ({"out_size": (4, 3)}, ValueError, "out_size"),
    ({"out_size": (2, 2), "stride": (2, 2), "kernel": (3, 4)}, ValueError, "out_size"),
    ({"stride": (1.5, 1)}, TypeError, "stride"),
    ({"padding": 1}, TypeError, "padding"),
    ({"kernel": "33"}, TypeError, "kernel"),
]


@pytest.mark.parametrize("change, error, pattern", BAD_IM2COL, ids=lambda v: str(v)[:30])
def test_im2col_rejects_bad_arguments(change, error, pattern) -> None:
    args = {**GOOD, **change}
    with pytest.raises(error, match=pattern):
        im2col(X, args["kernel"], args["out_size"], args["stride"], args["padding"],
               args["dilation"], args["groups"])


def test_im2col_and_col2im_reject_numpy_input() -> None:
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        im2col(X.numpy(), (3, 3), (3, 3), (1, 1), (0, 0), (1, 1), 1)
    cols = im2col(X, (3, 3), (3, 3), (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(TypeError, match="cols must be a torch.Tensor"):
        col2im(cols.numpy(), X.shape, (3, 3), (3, 3), (1, 1), (0, 0), (1, 1))


@pytest.mark.parametrize("change, error, pattern",
                         [c for c in BAD_IM2COL if "groups" not in c[0]],
                         ids=lambda v: str(v)[:30])
def test_col2im_rejects_bad_arguments(change, error, pattern) -> None:
    cols = im2col(X, (3, 3), (3, 3), (1, 1), (0, 0), (1, 1), 1)
    args = {**GOOD, **change}
    with pytest.raises(error, match=pattern):
        col2im(cols, X.shape, args["kernel"], args["out_size"], args["stride"],
               args["padding"], args["dilation"])


def test_col2im_rejects_columns_of_the_wrong_shape() -> None:
    cols = im2col(X, (3, 3), (3, 3), (1, 1), (0, 0), (1, 1), 1)
    for bad in (cols[:, :-1], cols[..., :-1], cols[0], cols.reshape(3, 6, 9)):
        with pytest.raises(ValueError, match="cols must be"):
            col2im(bad, X.shape, (3, 3), (3, 3), (1, 1), (0, 0), (1, 1))


@settings(max_examples=60, deadline=None)
@given(kernel=st.lists(st.integers(-1, 4), min_size=1, max_size=3),
       stride=st.integers(-1, 3), padding=st.integers(-2, 3), dilation=st.integers(-1, 2),
       out=st.integers(-1, 6), groups=st.integers(-1, 4), size=st.integers(0, 6))
def test_any_im2col_arguments_work_or_raise_a_named_error(kernel, stride, padding, dilation,
                                                          out, groups, size) -> None:
    """Class of D14: whatever the geometry, im2col either returns unfold's entries or raises
    ValueError/TypeError (never a ZeroDivisionError, RuntimeError or IndexError from torch)."""
    dim = len(kernel)
    x = torch.randn(1, 2, *([size] * dim), dtype=DT)
    args = (kernel, [out] * dim, [stride] * dim, [padding] * dim, [dilation] * dim)
    try:
        cols = im2col(x, *args, groups)
    except (ValueError, TypeError):
        return
    back = col2im(cols, x.shape, *args)
    assert back.shape == x.shape
    assert cols.shape == (groups, 2 // groups * math.prod(kernel), math.prod([out] * dim))
