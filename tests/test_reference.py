"""convlab.scratch.reference (forward and backward) against its torch.ops.aten twins.

Everything is compared in float64 with tight tolerances over a parameter grid and hypothesis
configurations; the low-precision dtypes get a looser bound with its reason next to it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from conftest import devices
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from convlab.scratch import double_backward, reference
from convlab.scratch.params import ConvParams

aten = torch.ops.aten
MASKS = [list(m) for m in itertools.product([False, True], repeat=3)]
TIGHT = {"rtol": 1e-10, "atol": 1e-10}
NATIVE_CONV = ("convolution", "conv2d", "conv3d", "conv_depthwise", "slow_conv", "mkldnn",
               "cudnn", "thnn")


@dataclass(frozen=True)
class Case:
    """One convolution configuration; ``size`` and ``kernel`` are spatial."""

    n: int
    c_in: int
    c_out: int
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] = 0
    dilation: int | tuple[int, ...] = 1
    groups: int = 1
    transposed: bool = False
    output_padding: int | tuple[int, ...] = 0
    bias: bool = True

    @property
    def dim(self) -> int:
        return len(self.kernel)

    def args(self) -> tuple:
        """(stride, padding, dilation, transposed, output_padding, groups) as ATen lists."""
        p = ConvParams.create(self.dim, self.stride, self.padding, self.dilation,
                              self.transposed, self.output_padding, self.groups)
        return (list(p.stride), list(p.padding), list(p.dilation), p.transposed,
                list(p.output_padding), p.groups)

    def tensors(self, dtype=torch.float64, device="cpu"):
        """Random (input, weight, bias-or-None)."""
        wshape = ((self.c_in, self.c_out // self.groups) if self.transposed
                  else (self.c_out, self.c_in // self.groups))
        x = torch.randn(self.n, self.c_in, *self.size, dtype=dtype, device=device)
        w = torch.randn(*wshape, *self.kernel, dtype=dtype, device=device)
        b = torch.randn(self.c_out, dtype=dtype, device=device) if self.bias else None
        return x, w, b


GRID = [
    # 1-d
    Case(2, 3, 4, (9,), (3,)),
    Case(2, 4, 6, (11,), (3,), stride=2, padding=1, dilation=2, groups=2, bias=False),
    Case(1, 4, 4, (8,), (3,), stride=2, padding=1, groups=4, transposed=True, output_padding=1),
    # 2-d
    Case(2, 3, 5, (7, 6), (3, 2)),
    Case(2, 4, 6, (9, 8), (3, 3), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
    Case(3, 6, 6, (7, 7), (3, 3), padding=1, groups=6, bias=False),  # depthwise
    Case(2, 3, 6, (6, 6), (3, 3), stride=2, groups=3),  # depthwise, channel multiplier 2
    Case(2, 4, 6, (5, 4), (3, 2), stride=(2, 3), padding=(1, 0), dilation=(1, 2), groups=2,
         transposed=True, output_padding=(1, 2)),
    Case(1, 3, 2, (4, 4), (2, 2), stride=1, padding=1, dilation=2, transposed=True,
         output_padding=1),  # output_padding >= stride (allowed since < dilation)
    Case(2, 2, 3, (5, 5), (1, 1), stride=2),  # 1x1 kernel, stride larger than kernel
    Case(1, 1, 1, (4, 5), (4, 5), bias=False),  # kernel equal to the input, one channel
    # 3-d
    Case(2, 2, 3, (5, 4, 6), (2, 3, 2), stride=(1, 2, 2), padding=(1, 0, 1), dilation=(2, 1, 1)),
    Case(1, 4, 4, (4, 4, 4), (3, 3, 3), padding=1, groups=4),
    Case(2, 4, 2, (3, 3, 2), (2, 2, 2), stride=2, padding=(0, 1, 0), groups=2, transposed=True,
         output_padding=(1, 0, 1), bias=False),
    Case(2, 2, 3, (4, 3), (1, 2), padding=(1, 2)),  # padding wider than the kernel
]


def run_both(case: Case, masks=MASKS, dtype=torch.float64, device="cpu", check=None):
    """Forward and every backward mask, reference against aten; returns nothing, asserts."""
    check = check or (lambda a, e: torch.testing.assert_close(a, e, **TIGHT))
    x, w, b = case.tensors(dtype, device)
    args = case.args()
    expected = aten.convolution(x, w, b, *args)
    actual = reference.convolution(x, w, b, *args)
    assert actual.device == x.device and actual.dtype == x.dtype
    check(actual, expected)
    gy = torch.randn_like(expected)
    bias_sizes = [case.c_out] if case.bias else None
    for mask in masks:
        exp = aten.convolution_backward(gy, x, w, bias_sizes, *args, mask)
        act = reference.convolution_backward(gy, x, w, bias_sizes, *args, mask)
        for a, e, m in zip(act, exp, mask, strict=True):
            assert (a is None) == (not m)
            if m:
                assert a.shape == e.shape and a.dtype == e.dtype and a.device == e.device
                check(a, e)


@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{c.dim}d-g{c.groups}-t{int(c.transposed)}")
def test_grid_matches_aten(case: Case) -> None:
    run_both(case)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Small valid configurations of every kind, degenerate ones included."""
    dim = draw(st.integers(1, 3))
    small = 2 if dim == 3 else 3
    groups = draw(st.integers(1, 3))
    c_in = groups * draw(st.integers(1, 2))
    c_out = groups * draw(st.integers(1, 2))
    transposed = draw(st.booleans())
    kernel = tuple(draw(st.integers(1, small)) for _ in range(dim))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(dim))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(dim))
    size = tuple(draw(st.integers(1, 6 if dim < 3 else 4)) for _ in range(dim))
    output_padding = 0
    if transposed:
        output_padding = tuple(draw(st.integers(0, max(s, d) - 1))
                               for s, d in zip(stride, dilation, strict=True))
    case = Case(draw(st.integers(1, 3)), c_in, c_out, size, kernel, stride, padding, dilation,
                groups, transposed, output_padding, draw(st.booleans()))
    x, w, _ = case.tensors()
    try:
        ConvParams.for_tensors(x, w, None, *case.args())
    except ValueError:
        assume(False)
    return case


@given(cases())
def test_hypothesis_matches_aten(case: Case) -> None:
    run_both(case, masks=[[True, True, True], [True, False, False], [False, True, False]])


def test_empty_batch_matches_aten() -> None:
    run_both(Case(0, 4, 6, (5, 5), (3, 3), padding=1, groups=2))
    run_both(Case(0, 4, 6, (3, 3), (3, 3), stride=2, groups=2, transposed=True,
                  output_padding=1))


def test_bias_sizes_as_autograd_passes_them() -> None:
    case = Case(2, 3, 4, (6, 6), (3, 3), bias=False)
    x, w, _ = case.tensors()
    gy = torch.randn(2, 4, 4, 4, dtype=torch.float64)
    expected = aten.convolution_backward(gy, x, w, [0], *case.args(), [True] * 3)
    for sizes in ([0], [4], None):
        actual = reference.convolution_backward(gy, x, w, sizes, *case.args(), [True] * 3)
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a, e, **TIGHT)


def test_non_contiguous_inputs() -> None:
    case = Case(2, 4, 6, (7, 7), (3, 3), stride=2, padding=1, groups=2)
    x, w, b = case.tensors()
    x_cl = x.to(memory_format=torch.channels_last)
    w_t = w.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    gy = torch.randn(2, 6, 4, 4, dtype=torch.float64).transpose(2, 3).contiguous().transpose(2, 3)
    torch.testing.assert_close(reference.convolution(x_cl, w_t, b, *case.args()),
                               aten.convolution(x, w, b, *case.args()), **TIGHT)
    act = reference.convolution_backward(gy, x_cl, w_t, [6], *case.args(), [True] * 3)
    exp = aten.convolution_backward(gy, x, w, [6], *case.args(), [True] * 3)
    for a, e in zip(act, exp, strict=True):
        torch.testing.assert_close(a, e, **TIGHT)


def test_float32_matches_aten() -> None:
    # float32 sums in a different order than oneDNN/the slow path: allow a few ulps of the
    # result's scale (values are O(1-10), sums of at most ~50 products).
    def check(a, e):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)

    for case in GRID:
        run_both(case, masks=[[True, True, True]], dtype=torch.float32, check=check)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_on_cpu(dtype: torch.dtype) -> None:
    """bf16/fp16 against the exact (float64) result of the same rounded inputs."""
    for case in GRID:
        x, w, b = case.tensors(dtype)
        args = case.args()
        exact = aten.convolution(x.double(), w.double(), None if b is None else b.double(), *args)
        gy = torch.randn_like(exact).to(dtype)
        exact_b = aten.convolution_backward(gy.double(), x.double(), w.double(), None, *args,
                                            [True] * 3)
        ours = (reference.convolution(x, w, b, *args),
                *reference.convolution_backward(gy, x, w, None, *args, [True] * 3))
        for a, e in zip(ours, (exact, *exact_b), strict=True):
            assert a.dtype == dtype
            # Unit roundoff u is 2^-9 (bf16) / 2^-12 (fp16). The GEMM accumulates in fp32 and
            # rounds once, col2im adds a few rounded terms, the output rounds again: a few u
            # of the result's scale (measured: <= 3u here; ATen's own bf16 result <= 1.5u).
            tol = 8 * (2.0**-9 if dtype == torch.bfloat16 else 2.0**-12)
            scale = e.abs().max().item() + 1.0
            err = (a.double() - e).abs().max().item()
            assert err <= tol * scale, f"{case}: error {err:.3g} > {tol * scale:.3g}"


# Tiny versions of the grid's kinds: gradcheck costs one forward per input element.
GRADCHECK = {
    "1d": Case(1, 2, 4, (7,), (3,), stride=2, padding=1, dilation=2, groups=2),
    "2d": Case(1, 2, 4, (5, 4), (2, 2), stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
    "2d-transposed": Case(1, 4, 2, (3, 3), (3, 2), stride=2, padding=1, groups=2,
                          transposed=True, output_padding=1),
    "2d-transposed-op": Case(1, 2, 2, (3, 3), (2, 2), padding=1, dilation=2, transposed=True,
                             output_padding=1),
    "3d-transposed": Case(1, 2, 2, (2, 2, 2), (2, 2, 2), stride=2, groups=2, transposed=True,
                          output_padding=1, bias=False),
}


@pytest.mark.parametrize("case", GRADCHECK.values(), ids=GRADCHECK.keys())
def test_gradcheck_forward(case: Case) -> None:
    """The forward is built from differentiable ops: autograd's grads are numerically right."""
    x, w, b = case.tensors()
    inputs = [t.requires_grad_() for t in (x, w, b) if t is not None]

    def f(*ts):
        return reference.convolution(ts[0], ts[1], ts[2] if len(ts) > 2 else None, *case.args())

    assert torch.autograd.gradcheck(f, inputs)


def test_autograd_of_forward_matches_backward() -> None:
    case = GRID[7]
    x, w, b = case.tensors()
    x.requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    y = reference.convolution(x, w, b, *case.args())
    gy = torch.randn_like(y)
    auto = torch.autograd.grad(y, (x, w, b), gy)
    ours = reference.convolution_backward(gy, x.detach(), w.detach(), [case.c_out],
                                          *case.args(), [True] * 3)
    for a, o in zip(auto, ours, strict=True):
        torch.testing.assert_close(a, o, **TIGHT)


# --- the batch processed in chunks (reference.CHUNK_BYTES) ---------------------------------

def test_chunks_cover_the_batch_in_equal_bounded_slices(monkeypatch) -> None:
    monkeypatch.setattr(reference, "CHUNK_BYTES", 100)
    for n in (0, 1, 5, 7, 32):
        for per_sample in (1, 30, 40, 100, 1000):  # bytes of one sample's rows
            slices = reference.sample_chunks(n, per_sample)
            covered = [i for s in slices for i in range(n)[s]]
            assert covered == list(range(n))
            most = max(1, 100 // per_sample)  # samples whose rows fit in CHUNK_BYTES
            assert len(slices) == max(1, math.ceil(n / most))  # as few chunks as possible
            assert all(len(range(n)[s]) <= most for s in slices)


CHUNKED = [  # batches of 5 so that the chunks (1 to 3 samples) leave a remainder
    Case(5, 4, 6, (11,), (3,), stride=2, padding=1, dilation=2, groups=2),  # 1-d, scatter
    Case(5, 4, 4, (7, 6), (3, 2), padding=1),  # stride 1
    Case(5, 4, 6, (9, 8), (3, 3), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
    Case(5, 4, 6, (5, 4), (3, 2), stride=(2, 3), padding=(1, 0), dilation=(1, 2), groups=2,
         transposed=True, output_padding=(1, 2)),
    Case(5, 2, 3, (5, 4, 6), (2, 3, 2), stride=(1, 2, 2), padding=(1, 0, 1), dilation=(2, 1, 1)),
]


# From one sample per chunk to chunks of 2 or 3 samples plus a remainder, depending on the case.
@pytest.mark.parametrize("chunk_bytes", [1, 10_000, 30_000])
@pytest.mark.parametrize("case", CHUNKED, ids=["1d", "2d-stride1", "2d", "2d-transposed", "3d"])
def test_chunked_batch_matches_aten(case: Case, chunk_bytes: int, monkeypatch) -> None:
    monkeypatch.setattr(reference, "CHUNK_BYTES", chunk_bytes)
    run_both(case, masks=[[True, True, True], [True, False, False], [False, True, False]])


def test_chunked_forward_is_differentiable(monkeypatch) -> None:
    monkeypatch.setattr(reference, "CHUNK_BYTES", 1)
    for case in (Case(3, 2, 2, (5, 4), (2, 2), stride=(2, 1), padding=1),
                 Case(3, 2, 2, (3, 3), (2, 2), stride=2, padding=1, transposed=True,
                      output_padding=1)):
        x, w, b = case.tensors()
        inputs = [t.requires_grad_() for t in (x, w, b)]
        assert torch.autograd.gradcheck(
            lambda *ts, case=case: reference.convolution(*ts, *case.args()), inputs)


class OpRecorder(TorchDispatchMode):
    """Records the name of every ATen op that runs inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.name()))
        return func(*args, **(kwargs or {}))


def native_conv_ops(names: list[str]) -> list[str]:
    return [n for n in names if any(bad in n for bad in NATIVE_CONV)]


def test_recorder_sees_native_convolution() -> None:
    """The recorder is not blind: it does catch a native convolution."""
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with OpRecorder() as rec:
        torch.nn.functional.conv2d(x, w)
    assert native_conv_ops(rec.names)


@pytest.mark.parametrize("case", [GRID[4], GRID[7], GRID[11]], ids=["2d", "2d-transposed", "3d"])
def test_no_native_convolution_runs(case: Case) -> None:
    x, w, b = case.tensors()
    args = case.args()
    with OpRecorder() as rec:
        y = reference.convolution(x, w, b, *args)
        gy = torch.ones_like(y)
        reference.convolution_backward(gy, x, w, [case.c_out], *args, [True] * 3)
        double_backward.convolution_double_backward(torch.ones_like(x), torch.ones_like(w),
                                              torch.ones_like(b), gy, w, x, *args, [True] * 3)
    assert any("mm" in n for n in rec.names), rec.names  # the GEMMs were recorded
    assert native_conv_ops(rec.names) == []


# --- bad input -----------------------------------------------------------------------------

def _valid():
    case = Case(2, 4, 6, (6, 6), (3, 3), groups=2)
    x, w, b = case.tensors()
    gy = torch.randn(2, 6, 4, 4, dtype=torch.float64)
    return x, w, b, gy, case.args()


@pytest.mark.parametrize(
    ("change", "error", "word"),
    [
        (lambda a: a.update(gy=torch.randn(2, 6, 5, 4, dtype=torch.float64)), ValueError,
         "grad_output"),
        (lambda a: a.update(gy=torch.randn(2, 6, 4, 4)), TypeError, "grad_output"),
        (lambda a: a.update(mask=[True, True]), ValueError, "output_mask"),
        (lambda a: a.update(mask=[1, 1, 1]), TypeError, "output_mask"),
        (lambda a: a.update(mask="yyy"), TypeError, "output_mask"),
        (lambda a: a.update(bias_sizes=[5]), ValueError, "bias_sizes"),
        (lambda a: a.update(bias_sizes=4), TypeError, "bias_sizes"),
        (lambda a: a.update(x=torch.randn(2, 4, 6, dtype=torch.float64)), ValueError, "input"),
        (lambda a: a.update(w=torch.randn(6, 3, 3, 3, dtype=torch.float64)), ValueError,
         "weight"),
        (lambda a: a.update(groups=4), ValueError, "groups"),
        (lambda a: a.update(stride=[1, 1, 1]), ValueError, "stride"),
        (lambda a: a.update(x=torch.ones(2, 4, 6, 6, dtype=torch.int64)), TypeError, "input"),
    ],
)
def test_backward_bad_input(change, error, word) -> None:
    x, w, _, gy, args = _valid()
    a = {"x": x, "w": w, "gy": gy, "bias_sizes": [6], "mask": [True, True, True],
         "stride": args[0], "groups": args[5]}
    change(a)
    with pytest.raises(error, match=word):
        reference.convolution_backward(a["gy"], a["x"], a["w"], a["bias_sizes"], a["stride"],
                                       args[1], args[2], args[3], args[4], a["groups"], a["mask"])


def test_output_padding_of_a_normal_conv() -> None:
    """ATen's forward ignores it, its backward rejects it: so do we."""
    x, w, b, gy, args = _valid()
    stride, padding, dilation, _, _, groups = args
    torch.testing.assert_close(
        reference.convolution(x, w, b, stride, padding, dilation, False, [1, 1], groups),
        aten.convolution(x, w, b, stride, padding, dilation, False, [1, 1], groups), **TIGHT)
    with pytest.raises(ValueError, match="output_padding"):
        reference.convolution_backward(gy, x, w, None, stride, padding, dilation, False, [1, 1],
                                       groups, [True] * 3)


def test_forward_bad_input() -> None:
    x, w, b, _, args = _valid()
    with pytest.raises(ValueError, match="bias"):
        reference.convolution(x, w, b[:3], *args)
    with pytest.raises(ValueError, match="kernel"):
        reference.convolution(x[..., :2, :2], w, b, *args)
    with pytest.raises(TypeError, match="transposed"):
        reference.convolution(x, w, b, args[0], args[1], args[2], 1, args[4], args[5])


# --- CUDA --------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{c.dim}d-g{c.groups}-t{int(c.transposed)}")
def test_cuda_matches_aten(case: Case) -> None:
    run_both(case, device="cuda")


@pytest.mark.cuda
def test_cuda_float32_matches_aten() -> None:
    # cuDNN may use TF32 (10-bit mantissa) for float32 convolutions: compare at TF32 precision.
    def check(a, e):
        torch.testing.assert_close(a, e, rtol=1e-2, atol=1e-2)

    for case in GRID:
        run_both(case, masks=[[True, True, True]], dtype=torch.float32, device="cuda",
                 check=check)


@pytest.mark.parametrize("device", devices())
def test_device_follows_inputs(device: str) -> None:
    case = GRID[4]
    x, w, b = case.tensors(device=device)
    y = reference.convolution(x, w, b, *case.args())
    grads = reference.convolution_backward(torch.ones_like(y), x, w, [6], *case.args(),
                                           [True] * 3)
    assert y.device == x.device
    assert all(g.device == x.device for g in grads)


# ---------------------------------------------------------------------------------------
# Forward mode: convolution_jvp against torch.func.jvp of aten.convolution.

JVP_CASES = [
    # input shape, weight shape, bias, stride, padding, dilation, transposed, output_padding, groups
    ((2, 4, 9), (6, 2, 3), True, [2], [1], [1], False, [0], 2),
    ((2, 4, 11, 11), (6, 2, 3, 3), True, [2, 1], [1, 0], [2, 1], False, [0, 0], 2),
    ((1, 2, 4, 4, 4), (2, 3, 3, 3, 3), True, [2, 2, 2], [1, 1, 1], [1, 1, 1], True, [1, 1, 1], 1),
    ((2, 3, 5, 5), (3, 1, 2, 2), False, [1, 1], [0, 0], [1, 1], False, [0, 0], 3),
]


@pytest.mark.parametrize("case", JVP_CASES)
@pytest.mark.parametrize("which", ["input", "weight", "bias", "all"])
def test_convolution_jvp_matches_torch_func_jvp(case, which) -> None:
    in_shape, w_shape, has_bias, *args = case
    opts = {"dtype": torch.float64}
    x, w = torch.randn(in_shape, **opts), torch.randn(w_shape, **opts)
    out_channels = w_shape[1] * args[-1] if args[3] else w_shape[0]
    b = torch.randn(out_channels, **opts) if has_bias else None
    tangents = {
        "input": torch.randn_like(x) if which in ("input", "all") else None,
        "weight": torch.randn_like(w) if which in ("weight", "all") else None,
        "bias": torch.randn_like(b) if b is not None and which in ("bias", "all") else None,
    }
    ours = double_backward.convolution_jvp(
        x, tangents["input"], w, tangents["weight"], b, tangents["bias"], *args
    )

    def f(x, w, b):
        return aten.convolution(x, w, b, *args)

    zeros = [torch.zeros_like(t) if t is not None else None for t in (x, w, b)]
    given = [t if t is not None else z for t, z in zip(tangents.values(), zeros, strict=True)]
    if b is None:
        _, expected = torch.func.jvp(lambda x, w: f(x, w, None), (x, w), tuple(given[:2]))
    else:
        _, expected = torch.func.jvp(f, (x, w, b), tuple(given))
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


def test_convolution_jvp_bad_tangents_name_the_argument() -> None:
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    args = (1, 0, 1, False, 0, 1)
    with pytest.raises(ValueError, match=r"weight_t must have the shape of weight_p"):
        double_backward.convolution_jvp(x, None, w, torch.zeros(3, 2, 2, 2, dtype=w.dtype),
                                        None, None, *args)
    with pytest.raises(ValueError, match="bias_t is given but bias_p is None"):
        double_backward.convolution_jvp(x, None, w, None, None, torch.zeros(3, dtype=w.dtype),
                                        *args)
    with pytest.raises(TypeError, match="input_t has dtype torch.float32"):
        double_backward.convolution_jvp(x, x.float(), w, None, None, None, *args)


# --- NaN and inf propagate as in ATen -----------------------------------------------------

INF = float("inf")


def test_inf_weight_of_a_stride1_transposed_conv_gives_a_number() -> None:
    """Regression: the stride-1 grad_input path used to multiply padding zeros by inf."""
    x = torch.ones(1, 1, 3, dtype=torch.float64)
    w = torch.tensor([[[INF, 1.0]]], dtype=torch.float64)
    expected = aten.convolution(x, w, None, [1], [0], [1], True, [0], 1)
    assert expected[0, 0, -1].item() == 1.0  # ATen's own value, not NaN
    torch.testing.assert_close(reference.convolution(x, w, None, 1, 0, 1, True, 0, 1), expected)
    # the same data path: grad_input of a normal stride-1 conv with an inf weight
    w_n = torch.tensor([[[1.0, INF]]], dtype=torch.float64)
    gy = torch.ones(1, 1, 2, dtype=torch.float64)
    exp = aten.convolution_backward(gy, x, w_n, None, [1], [0], [1], False, [0], 1,
                                    [True, False, False])[0]
    act = reference.convolution_backward(gy, x, w_n, None, 1, 0, 1, False, 0, 1,
                                         [True, False, False])[0]
    torch.testing.assert_close(act, exp, equal_nan=True)


def _sprinkle(t: torch.Tensor, seed: int) -> torch.Tensor:
    """A copy of ``t`` with about 15% +inf, 10% -inf and 5% NaN entries."""
    u = torch.rand(t.shape, generator=torch.Generator().manual_seed(seed), dtype=t.dtype)
    out = t.clone()
    out[u < 0.15] = INF
    out[(u >= 0.15) & (u < 0.25)] = -INF
    out[(u >= 0.25) & (u < 0.30)] = float("nan")
    return out


@settings(max_examples=30, deadline=None)
@given(cases(), st.sampled_from(["input", "weight", "grad_output", "input+weight"]),
       st.integers(0, 2**16))
def test_hypothesis_nan_and_inf_match_aten(case: Case, where: str, seed: int) -> None:
    """Forward and backward agree with ATen including the position of every NaN and inf."""
    x, w, b = case.tensors()
    if "input" in where:
        x = _sprinkle(x, seed)
    if "weight" in where:
        w = _sprinkle(w, seed + 1)
    args = case.args()
    y = aten.convolution(x, w, b, *args)
    torch.testing.assert_close(reference.convolution(x, w, b, *args), y, equal_nan=True,
                               **TIGHT)
    gy = torch.randn_like(y)
    if where == "grad_output":
        gy = _sprinkle(gy, seed + 2)
    mask = [True, True, True]
    expected = aten.convolution_backward(gy, x, w, None, *args, mask)
    actual = reference.convolution_backward(gy, x, w, None, *args, mask)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True, **TIGHT)


# --- inputs that require grad -------------------------------------------------------------

def test_requires_grad_regressions() -> None:
    """Regression: in-place adds on tensors that autograd tracks used to raise."""
    x = torch.randn(1, 2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 1, 1, dtype=torch.float64, requires_grad=True)
    y = reference.convolution(x, w, None, 1, 0, 1, True, 0, 1)  # 1x1 transposed
    torch.testing.assert_close(y, aten.convolution(x, w, None, [1], [0], [1], True, [0], 1))
    # a normal backward with C_out > C_in whose grad_output requires grad
    x2 = torch.randn(1, 1, 5, dtype=torch.float64)
    w2 = torch.randn(3, 1, 2, dtype=torch.float64)
    gy = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    gi = reference.convolution_backward(gy, x2, w2, None, 1, 0, 1, False, 0, 1,
                                        [True, False, False])[0]
    gi.sum().backward()
    assert gy.grad is not None
    # double backward with create_graph through the forward (1x1 transposed)
    (g_x,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    g_x.sum().backward()
    assert w.grad is not None


# Tiny cases of each kind (normal, transposed, depthwise, 1-d/3-d): gradcheck is expensive.
DIFFERENTIABLE = [
    Case(1, 2, 3, (5,), (2,), stride=1, padding=1),
    Case(1, 2, 2, (3, 3), (2, 2), stride=2, padding=1, transposed=True, output_padding=1),
    Case(1, 2, 2, (4, 3), (3, 2), padding=1, groups=2),  # depthwise
    Case(1, 2, 4, (3, 3), (2, 2), stride=2, groups=2, transposed=True),  # depthwise transposed
    Case(1, 1, 2, (3, 2, 2), (2, 1, 2), padding=(1, 0, 0), bias=False),
]


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=str)
def test_every_function_is_differentiable(case: Case) -> None:
    """With every input requiring grad, each function gives ATen's values and autograd
    through it is numerically right (first and second order)."""
    x, w, b = case.tensors()
    args = case.args()
    y = aten.convolution(x, w, b, *args)
    gy = torch.randn_like(y)
    xs = [t.requires_grad_() for t in (x, w, gy)]
    expected = aten.convolution_backward(gy, x, w, None, *args, [True, True, False])
    actual = reference.convolution_backward(gy, x, w, None, *args, [True, True, False])
    for a, e in zip(actual[:2], expected[:2], strict=True):
        torch.testing.assert_close(a, e, **TIGHT)
    assert torch.autograd.gradcheck(
        lambda gy, x, w: reference.convolution_backward(gy, x, w, None, *args,
                                                        [True, True, False])[:2],
        (xs[2], xs[0], xs[1]))
    assert torch.autograd.gradgradcheck(
        lambda x, w: reference.convolution(x, w, None, *args), (xs[0], xs[1]))
    ggI, ggW = torch.randn_like(x), torch.randn_like(w)
    assert torch.autograd.gradcheck(
        lambda ggI, ggW: tuple(t for t in double_backward.convolution_double_backward(
            ggI, ggW, None, gy.detach(), w.detach(), x.detach(), *args, [True] * 3)
            if t is not None),
        (ggI.requires_grad_(), ggW.requires_grad_()))


# --- depthwise (direct form) --------------------------------------------------------------

DEPTHWISE = [
    Case(2, 4, 4, (9,), (3,), stride=2, padding=1, groups=4),
    Case(2, 3, 3, (8, 7), (3, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=3),
    Case(2, 2, 6, (6, 6), (5, 3), padding=2, groups=2),  # channel multiplier 3
    Case(2, 3, 3, (4, 4), (3, 3), stride=2, padding=1, groups=3, transposed=True,
         output_padding=1),
    Case(1, 2, 2, (3, 4, 3), (2, 3, 2), stride=(1, 2, 1), padding=1, groups=2),
]


@pytest.mark.parametrize("case", DEPTHWISE, ids=str)
def test_depthwise_matches_aten(case: Case) -> None:
    run_both(case)


@pytest.mark.parametrize(
    ("change", "word"),
    [({"w": torch.zeros(0, 2, 3, 3, dtype=torch.float64)}, "weight.shape"),
     ({"padding": 10**20}, "padding=.*int64"),
     ({"stride": [1, 2**63]}, "stride=.*int64")],
)
def test_what_aten_refuses_is_a_named_value_error(change, word) -> None:
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    kwargs = {"w": torch.randn(6, 2, 3, 3, dtype=torch.float64), "stride": 1, "padding": 0}
    kwargs.update(change)
    with pytest.raises(ValueError, match=word):
        reference.convolution(x, kwargs["w"], None, kwargs["stride"], kwargs["padding"], 1,
                              False, 0, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_all_finite_sees_one_non_finite_element(dtype: torch.dtype, bad: float) -> None:
    t = torch.randn(3, 5, 7, dtype=dtype)
    assert reference.all_finite(t)
    for index in [(0, 0, 0), (2, 4, 6), (1, 2, 3)]:
        u = t.clone()
        u[index] = bad
        assert not reference.all_finite(u)
        assert not reference.all_finite(u.transpose(0, 2))  # a view reads the same values


def test_all_finite_is_conservative_on_overflow_and_true_when_empty() -> None:
    huge = torch.full((4,), torch.finfo(torch.float32).max)
    assert bool(torch.isfinite(huge).all()) and not reference.all_finite(huge)
    assert reference.all_finite(torch.empty(0, 3))
    grad = torch.randn(4, requires_grad=True)
    assert reference.all_finite(grad) and grad.grad is None


@pytest.mark.parametrize("batched", ["input", "weight"])
def test_depthwise_under_vmap_matches_aten(batched: str) -> None:
    """The depthwise form (in-place adds into zeros) works under vmap over either operand:
    its zeros are batched like both, so a batched weight's terms can land in them."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 7, 7, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 4, 1, 3, 3, generator=gen, dtype=torch.float64)
    gy = torch.randn(3, 2, 4, 7, 7, generator=gen, dtype=torch.float64)
    if batched == "input":
        w = w[0]
    else:
        x, gy = x[0], gy[0]
    dims = (0 if batched == "input" else None, 0 if batched == "weight" else None)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 4)

    def ours_fwd(x, w):
        return reference.convolution(x, w, None, *args)

    def aten_fwd(x, w):
        return torch.ops.aten.convolution(x, w, None, *args)

    torch.testing.assert_close(torch.vmap(ours_fwd, dims)(x, w), torch.vmap(aten_fwd, dims)(x, w))
    gdims = (dims[0], *dims)

    def ours_bwd(gy, x, w):
        return reference.convolution_backward(gy, x, w, None, *args, [True, True, False])[:2]

    def aten_bwd(gy, x, w):
        return torch.ops.aten.convolution_backward(gy, x, w, None, *args,
                                                   [True, True, False])[:2]

    torch.testing.assert_close(torch.vmap(ours_bwd, gdims)(gy, x, w),
                               torch.vmap(aten_bwd, gdims)(gy, x, w))
