"""convlab's double backward against ATen: double_backward.convolution_double_backward against
aten._convolution_double_backward, and both autograd wrappers with create_graph=True."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reference import GRID, TIGHT, Case, cases

from convlab import autograd as cla
from convlab.scratch import double_backward, reference

aten = torch.ops.aten
PRESENCE = list(itertools.product([False, True], repeat=3))  # which of ggI, ggW, ggb exist
# Every presence of (ggI, ggW, ggb); masks: none, each output alone, all.
MASKS = [[False] * 3, [True, False, False], [False, True, False], [False, False, True],
         [True] * 3]


def compare(case: Case, presence=PRESENCE, masks=([True, True, True],), device="cpu",
            dtype=torch.float64, check=None) -> None:
    """Every requested (ggI, ggW, ggb) presence and mask: same Nones, same values as ATen."""
    check = check or (lambda a, e: torch.testing.assert_close(a, e, **TIGHT))
    x, w, _ = case.tensors(dtype, device)
    args = case.args()
    gO = torch.randn_like(aten.convolution(x, w, None, *args))
    full = (torch.randn_like(x), torch.randn_like(w),
            torch.randn(case.c_out, dtype=dtype, device=device))
    for has in presence:
        grads = [g if h else None for g, h in zip(full, has, strict=True)]
        for mask in masks:
            exp = aten._convolution_double_backward(*grads, gO, w, x, *args, list(mask))
            act = double_backward.convolution_double_backward(*grads, gO, w, x, *args, list(mask))
            for name, a, e in zip(("ggO", "gI", "gW"), act, exp, strict=True):
                assert (a is None) == (e is None), f"{name} for presence {has}, mask {mask}"
                if e is not None:
                    assert a.shape == e.shape and a.dtype == e.dtype and a.device == e.device
                    check(a, e)


@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{c.dim}d-g{c.groups}-t{int(c.transposed)}")
def test_grid_matches_aten(case: Case) -> None:
    compare(case)


SMALL = [  # every presence x mask is 64 calls: small shapes
    Case(1, 4, 6, (5, 4), (3, 2), stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
    Case(1, 4, 6, (3, 3), (3, 2), stride=2, padding=(1, 0), groups=2, transposed=True,
         output_padding=1),
]


@pytest.mark.parametrize("case", SMALL, ids=["2d", "2d-transposed"])
def test_every_presence_and_mask(case: Case) -> None:
    """ATen ignores output_mask here (a term is None only when its inputs are): so do we."""
    compare(case, masks=MASKS)


def test_none_conventions() -> None:
    """The rules spelled out, so the docstring cannot drift from ATen."""
    case = GRID[4]
    x, w, _ = case.tensors()
    args = case.args()
    gO = torch.randn_like(aten.convolution(x, w, None, *args))
    ggb = torch.randn(case.c_out, dtype=torch.float64)
    assert double_backward.convolution_double_backward(None, None, None, gO, w, x, *args,
                                                 [True] * 3) == (None, None, None)
    ggO, gI, gW = double_backward.convolution_double_backward(None, None, ggb, gO, w, x, *args,
                                                        [False] * 3)
    assert gI is None and gW is None
    torch.testing.assert_close(ggO, ggb.view(1, -1, 1, 1).expand_as(gO), **TIGHT)


def test_output_padding_of_a_normal_conv_is_ignored() -> None:
    """As in ATen's ggI and ggb terms (with ggW, ATen 2.13 raises instead: its gI term passes
    output_padding on to a transposed conv; we keep ignoring it)."""
    case = Case(2, 4, 6, (6, 6), (3, 3), groups=2)
    x, w, _ = case.tensors()
    stride, padding, dilation, _, _, groups = case.args()
    args = (stride, padding, dilation, False, [1, 1], groups, [True] * 3)
    gO = torch.randn(2, 6, 4, 4, dtype=torch.float64)
    grads = (torch.randn_like(x), None, torch.randn(6, dtype=torch.float64))
    exp = aten._convolution_double_backward(*grads, gO, w, x, *args)
    act = double_backward.convolution_double_backward(*grads, gO, w, x, *args)
    assert act[1] is None and exp[1] is None
    for a, e in zip(act[::2], exp[::2], strict=True):
        torch.testing.assert_close(a, e, **TIGHT)
    ggW = torch.randn_like(w)
    ours = double_backward.convolution_double_backward(None, ggW, None, gO, w, x, *args)
    zero_pad = (stride, padding, dilation, False, [0, 0], groups, [True] * 3)
    exp = aten._convolution_double_backward(None, ggW, None, gO, w, x, *zero_pad)
    for a, e in zip(ours[:2], exp[:2], strict=True):
        torch.testing.assert_close(a, e, **TIGHT)


def test_empty_batch_matches_aten() -> None:
    """With no input elements ATen skips the convolution terms; only ggb reaches ggO."""
    compare(Case(0, 4, 6, (5, 5), (3, 3), padding=1, groups=2))


@settings(max_examples=20)
@given(cases())
def test_hypothesis_matches_aten(case: Case) -> None:
    compare(case, presence=[(True, True, True), (True, False, False), (False, True, False)])


def test_matches_autograd_double_backward_of_reference() -> None:
    """Independent check: differentiate reference.convolution twice with autograd."""
    case = GRID[7]
    x, w, b = case.tensors()
    args = case.args()
    x.requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    y = reference.convolution(x, w, b, *args)
    gO = torch.randn_like(y, requires_grad=True)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), gO, create_graph=True)
    ggI, ggW, ggb = torch.randn_like(x), torch.randn_like(w), torch.randn_like(b)
    auto = torch.autograd.grad((gx, gw, gb), (gO, x, w), (ggI, ggW, ggb))
    ours = double_backward.convolution_double_backward(ggI, ggW, ggb, gO.detach(), w.detach(),
                                                 x.detach(), *args, [True] * 3)
    for a, o in zip(auto, ours, strict=True):
        torch.testing.assert_close(o, a, **TIGHT)


def test_gradgradcheck_forward() -> None:
    case = Case(1, 2, 4, (5, 4), (2, 2), stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    x, w, b = case.tensors()
    inputs = [t.requires_grad_() for t in (x, w, b)]
    assert torch.autograd.gradgradcheck(
        lambda x, w, b: reference.convolution(x, w, b, *case.args()), inputs
    )


@pytest.mark.parametrize(
    ("which", "value", "error"),
    [
        ("ggI", torch.randn(2, 4, 5, 6, dtype=torch.float64), ValueError),
        ("ggW", torch.randn(6, 2, 3, 2, dtype=torch.float64), ValueError),
        ("ggb", torch.randn(5, dtype=torch.float64), ValueError),
        ("ggb", torch.randn(6), TypeError),
        ("gO", torch.randn(2, 6, 3, 4, dtype=torch.float64), ValueError),
        ("output_mask", [True], ValueError),
    ],
)
def test_bad_input(which: str, value, error) -> None:
    case = Case(2, 4, 6, (6, 6), (3, 3), groups=2)
    x, w, _ = case.tensors()
    a = {"ggI": torch.randn_like(x), "ggW": torch.randn_like(w),
         "ggb": torch.randn(6, dtype=torch.float64),
         "gO": torch.randn(2, 6, 4, 4, dtype=torch.float64), "output_mask": [True] * 3}
    a[which] = value
    with pytest.raises(error, match=which):
        double_backward.convolution_double_backward(a["ggI"], a["ggW"], a["ggb"], a["gO"], w, x,
                                              *case.args(), a["output_mask"])


@pytest.mark.cuda
@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{c.dim}d-g{c.groups}-t{int(c.transposed)}")
def test_cuda_matches_aten(case: Case) -> None:
    compare(case, device="cuda")


# ---------------------------------------------------------------------------------------
# Through the autograd wrappers with create_graph=True up to third order (a gradient
# penalty, a Hessian-vector product, its gradient): every input requires grad, grad_output
# too. Transposed 1x1 convolutions once
# crashed here (an in-place add on a tensor that required grad in the col2im path).

WRAPPERS = {"function": cla.convolution, "op": cla.convolution_op}
CREATE_GRAPH_GRID = [
    Case(1, 2, 1, (5,), (1,), transposed=True),  # 1x1 transposed, C_out < C_in
    Case(1, 1, 3, (5,), (1,), transposed=True, bias=False),  # 1x1 transposed, C_out > C_in
    Case(2, 2, 3, (3, 4), (1, 1), stride=2, transposed=True, output_padding=1),
    Case(1, 4, 2, (4,), (1,), groups=2, transposed=True),
    Case(2, 3, 4, (4, 4), (1, 1)),  # 1x1, C_out > C_in
    Case(1, 2, 4, (6,), (3,), stride=2, padding=1, dilation=2),
    Case(1, 2, 2, (3, 3), (2, 2), padding=1, groups=2, transposed=True),  # depthwise transposed
]


def up_to_third_order(conv, case: Case, third: bool = True) -> list[torch.Tensor | None]:
    """Grads of y, of <v, grads> and (if ``third``) of |those|^2, with create_graph=True."""
    torch.manual_seed(1)
    x, w, b = case.tensors()
    leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
    y = conv(x, w, b, *case.args())
    # randn(shape), not randn_like: the same values whatever the result's memory layout.
    go = torch.randn(y.shape, dtype=y.dtype, requires_grad=True)
    first = torch.autograd.grad(y, leaves, go, create_graph=True)
    vs = [torch.randn(g.shape, dtype=g.dtype) for g in first]
    second = torch.autograd.grad(first, [go, *leaves], vs, allow_unused=True, create_graph=True)
    if not third:
        return [*first, *second]
    norm = sum(g.square().sum() for g in second if g is not None and g.requires_grad)
    return [*first, *second, *torch.autograd.grad(norm, [go, *leaves], allow_unused=True)]


def aten_conv(x, w, b, *args):
    return aten.convolution(x, w, b, *args)


def compare_up_to_third_order(case: Case, impl: str) -> None:
    ours = up_to_third_order(WRAPPERS[impl], case)
    try:
        ref = up_to_third_order(aten_conv, case)
    except RuntimeError as e:
        # ATen (2.13 at least) cannot differentiate its double backward of a transposed conv
        # with output_padding: it passes output_padding to a normal convolution, which
        # raises. Compare what ATen can compute; ours must still be finite.
        if "output_padding" not in str(e):
            raise
        ref = up_to_third_order(aten_conv, case, third=False)
        assert all(torch.isfinite(o).all() for o in ours[len(ref):] if o is not None)
    for o, r in zip(ours, ref, strict=False):
        if r is None:  # e.g. d(grad_bias)/d(bias): the bias does not reach the grads
            assert o is None or torch.count_nonzero(o) == 0
        else:
            torch.testing.assert_close(o, r, **TIGHT)


@pytest.mark.parametrize("impl", list(WRAPPERS))
@pytest.mark.parametrize("case", CREATE_GRAPH_GRID,
                         ids=lambda c: f"{c.dim}d-k{c.kernel[0]}-g{c.groups}-t{int(c.transposed)}")
def test_create_graph_through_wrappers_matches_aten(case: Case, impl: str) -> None:
    compare_up_to_third_order(case, impl)


@pytest.mark.parametrize("impl", list(WRAPPERS))
@pytest.mark.parametrize("case", CREATE_GRAPH_GRID[:4], ids=lambda c: f"{c.dim}d-g{c.groups}")
def test_gradgradcheck_through_wrappers(case: Case, impl: str) -> None:
    x, w, b = case.tensors()
    leaves = tuple(t.requires_grad_() for t in (x, w, b) if t is not None)

    def fn(*ts: torch.Tensor) -> torch.Tensor:
        return WRAPPERS[impl](ts[0], ts[1], ts[2] if b is not None else None, *case.args())

    assert torch.autograd.gradgradcheck(fn, leaves, fast_mode=True)


@settings(max_examples=20)
@given(case=cases(), impl=st.sampled_from(list(WRAPPERS)))
def test_hypothesis_create_graph_through_wrappers(case: Case, impl: str) -> None:
    compare_up_to_third_order(case, impl)
