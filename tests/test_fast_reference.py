"""convlab.aten.fast_reference against convlab.scratch.reference and ATen, in float64.

Every form (shift-and-accumulate, L2-chunked im2col, the fused C++ depthwise loop) is run
forced and by :func:`choose_form`'s choice, over a grid and hypothesis (empty batches,
groups, stride/dilation/padding, 1-d to 3-d), with every output mask.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
import torch
from conftest import devices
from hypothesis import assume, given
from hypothesis import strategies as st

from convlab.aten import extension
from convlab.aten import fast_reference as fast
from convlab.lab import paths
from convlab.lab.method import isa_settings
from convlab.scratch import reference
from convlab.scratch.params import ConvParams

aten = torch.ops.aten
F64 = torch.float64
MASKS = [[True, True, True], [True, False, False], [False, True, False], [False, False, True]]
# (x shape, w shape, stride, padding, dilation, groups)
GRID = [
    ((2, 16, 7, 6), (16, 16, 3, 2), (1, 1), (1, 1), (1, 2), 1),
    ((2, 32, 9), (32, 16, 3), (1,), (2,), (2,), 2),
    ((2, 16, 4, 5, 4), (16, 16, 3, 3, 2), (1, 1, 1), (1, 1, 0), (1, 1, 1), 1),
    ((0, 16, 5, 5), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((3, 16, 5, 5), (16, 16, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    ((2, 3, 8, 8), (4, 3, 5, 5), (1, 1), (2, 2), (1, 1), 1),
    ((2, 4, 9, 8), (6, 4, 3, 3), (2, 2), (1, 0), (1, 1), 1),
    ((2, 6, 7, 7), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6),
    ((2, 6, 9, 8), (6, 1, 3, 2), (2, 3), (1, 2), (2, 1), 6),
    ((0, 6, 7, 7), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6),
    ((2, 4, 6, 6), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4),
    ((2, 4, 9), (4, 1, 3), (1,), (1,), (1,), 4),
]


def tensors(xs, ws, stride, padding, dilation, groups, transposed=False, out_pad=None):
    x = torch.randn(xs, dtype=F64)
    w = torch.randn(ws, dtype=F64)
    out_pad = list(out_pad) if out_pad is not None else [0] * len(stride)
    args = (list(stride), list(padding), list(dilation), transposed, out_pad, groups)
    gy = torch.randn_like(aten.convolution(x, w, None, *args))
    return gy, x, w, args


def forms_for(x: torch.Tensor, w: torch.Tensor, args) -> list[str | None]:
    """None (the rule's choice) and every form these shapes allow."""
    ok: list[str | None] = [None]
    for form in ("shift", "im2col", "depthwise"):
        try:
            fast.check_form(form, x, w, ConvParams.for_tensors(x, w, None, *args))
        except ValueError:
            continue
        ok.append(form)
    return ok


def check_all(gy, x, w, args, masks=MASKS) -> None:
    for form in forms_for(x, w, args):
        for mask in masks:
            sizes = [gy.shape[1]]
            want = aten.convolution_backward(gy, x, w, sizes, *args, mask)
            simple = reference.convolution_backward(gy, x, w, sizes, *args, mask)
            got = fast.convolution_backward(gy, x, w, sizes, *args, mask, form=form)
            for g, e, s, m in zip(got, want, simple, mask, strict=True):
                assert (g is None) == (not m), (form, mask)
                if m:
                    assert g.shape == e.shape and g.dtype == e.dtype
                    torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
                    torch.testing.assert_close(g, s, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", GRID, ids=lambda c: f"{len(c[0]) - 2}d-g{c[5]}-{c[0]}")
def test_grid_matches_aten_and_the_simple_form(case) -> None:
    check_all(*tensors(*case))


@st.composite
def cases(draw: st.DrawFn):
    dim = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    c_g = 1 if depthwise else draw(st.integers(1, 3))
    k_g = 1 if depthwise and draw(st.booleans()) else draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3 if dim < 3 else 2)) for _ in range(dim))
    stride = tuple(draw(st.sampled_from([1, 1, 2, 3])) for _ in range(dim))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(dim))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(dim))
    size = tuple(draw(st.integers(1, 7 if dim < 3 else 4)) for _ in range(dim))
    n = draw(st.integers(0, 3))
    transposed = draw(st.booleans())
    out_pad = tuple(draw(st.integers(0, max(s, d) - 1)) if transposed else 0
                    for s, d in zip(stride, dilation, strict=True))
    # transposed: x is the x-space of nothing; its weight is [C_in, C_out/G, *k]
    xs = (n, (k_g if transposed else c_g) * groups, *size)
    ws = (k_g * groups, c_g, *kernel)
    x, w = torch.empty(xs), torch.empty(ws)
    try:
        ConvParams.for_tensors(x, w, None, stride, padding, dilation, transposed, out_pad,
                               groups)
    except ValueError:
        assume(False)
    return xs, ws, stride, padding, dilation, groups, transposed, out_pad


@given(cases())
def test_hypothesis_matches_aten_and_the_simple_form(case) -> None:
    check_all(*tensors(*case), masks=MASKS[:3])


def test_transposed_in_the_shift_form_matches_aten() -> None:
    x, w = torch.randn(2, 32, 5, 5, dtype=F64), torch.randn(32, 16, 3, 3, dtype=F64)
    args = ([2, 2], [1, 1], [1, 1], True, [1, 1], 2)
    p = ConvParams.for_tensors(x, w, None, *args)
    assert fast.choose_form(x.shape, w.shape, p, F64) == "im2col"  # the rule's choice
    gy = torch.randn_like(aten.convolution(x, w, None, *args))
    for mask in MASKS:
        got = fast.convolution_backward(gy, x, w, [32], *args, mask, form="shift")
        want = aten.convolution_backward(gy, x, w, [32], *args, mask)
        for g, e, m in zip(got, want, mask, strict=True):
            assert (g is None) == (not m)
            if m:
                torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_reduced_precision_takes_the_im2col_form() -> None:
    x = torch.empty(2, 16, 28, 28)
    p = ConvParams.for_tensors(x, torch.empty(16, 16, 3, 3), None, *_unit(2))
    assert fast.choose_form(x.shape, (16, 16, 3, 3), p, torch.float32, 1) == "shift"
    assert fast.choose_form(x.shape, (16, 16, 3, 3), p, torch.bfloat16, 1) == "im2col"


@contextlib.contextmanager
def one_thread():
    """torch at one thread (the shift form's setting), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _unit(dim: int):
    return [1] * dim, [1] * dim, [1] * dim, False, [0] * dim, 1  # padding 1


@pytest.mark.parametrize(("where", "value"), [("input", math.inf), ("weight", math.nan)])
def test_non_finite_values_leave_the_shift_form_and_match_the_simple_form(
        where: str, value: float) -> None:
    gy, x, w, args = tensors((2, 16, 28, 28), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    (x if where == "input" else w)[0, 3, 2, 2] = value
    p = ConvParams.for_tensors(x, w, None, *args)
    assert fast.choose_form(x.shape, w.shape, p, F64, 1) == "shift"  # shapes say shift
    mask = [True, True, True]
    with one_thread():
        got = fast.convolution_backward(gy, x, w, [16], *args, mask)
    simple = reference.convolution_backward(gy, x, w, [16], *args, mask)
    for g, s in zip(got, simple, strict=True):
        torch.testing.assert_close(g, s, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_inputs_that_require_grad_take_the_simple_differentiable_form() -> None:
    gy, x, w, args = tensors((2, 16, 6, 6), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    w.requires_grad_(True)
    gi, _, _ = fast.convolution_backward(gy, x, w, [16], *args, [True, True, True])
    assert gi.requires_grad  # the shift form runs under no_grad; the simple one does not
    want = aten.convolution_backward(gy, x, w, [16], *args, [True, True, True])[0]
    torch.testing.assert_close(gi.detach(), want, rtol=1e-12, atol=1e-12)


FORCED = {  # form: (x shape, w shape, groups)
    "shift": ((2, 16, 6, 6), (16, 16, 3, 3), 1),
    "im2col": ((2, 3, 7, 7), (8, 3, 3, 3), 1),
    "depthwise": ((2, 8, 7, 7), (8, 1, 3, 3), 8),
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("form", sorted(FORCED))
def test_every_forced_form_runs_on_the_device(form: str, device: str) -> None:
    # The fused depthwise loop is CPU code: on a GPU that form runs as the simple one.
    xs, ws, g = FORCED[form]
    gy, x, w, args = (t.to(device) if isinstance(t, torch.Tensor) else t
                      for t in tensors(xs, ws, (1, 1), (1, 1), (1, 1), g))
    mask = [True, True, True]
    got = fast.convolution_backward(gy, x, w, [ws[0]], *args, mask, form=form)
    want = aten.convolution_backward(gy, x, w, [ws[0]], *args, mask)
    for a, e in zip(got, want, strict=True):
        assert a.device == e.device
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


# The rule's choice on the suite's layers, as choose_form's docstring states it.
EXPECTED_FORMS = {
    "resnet56": "shift", "resnet28": "shift", "resnet14": "im2col", "cifar5": "im2col",
    "strided": "im2col", "grouped": "im2col", "depthwise": "depthwise", "dilated": "im2col",
    "transposed": "im2col", "conv1d": "shift", "conv3d": "im2col",
}


@pytest.mark.parametrize("layer", paths.SUITE, ids=lambda layer: layer.name)
def test_rule_on_the_suite_layers(layer: paths.Layer) -> None:
    p = layer.params
    got = fast.choose_form(layer.input_shape, layer.weight_shape, p, torch.float32, 1)
    assert got == EXPECTED_FORMS[layer.name]
    two = fast.choose_form(layer.input_shape, layer.weight_shape, p, torch.float32, 2)
    assert two == ("im2col" if got == "shift" else got)


def test_more_than_one_thread_takes_im2col_instead_of_shift() -> None:
    x, w = torch.empty(8, 64, 28, 28), torch.empty(64, 64, 3, 3)
    p = ConvParams.for_tensors(x, w, None, *_unit(2))
    assert fast.choose_form(x.shape, w.shape, p, torch.float32, 1) == "shift"
    assert fast.choose_form(x.shape, w.shape, p, torch.float32, 2) == "im2col"
    with one_thread():
        assert fast.choose_form(x.shape, w.shape, p, torch.float32) == "shift"


@pytest.mark.parametrize("threads", [0, -1, 1.0, True, "2"])
def test_a_bad_thread_count_is_refused(threads: object) -> None:
    x, w = torch.empty(2, 16, 8, 8), torch.empty(16, 16, 3, 3)
    p = ConvParams.for_tensors(x, w, None, *_unit(2))
    with pytest.raises(ValueError, match="threads"):
        fast.choose_form(x.shape, w.shape, p, torch.float32, threads)


def test_a_form_that_cannot_serve_the_call_is_refused() -> None:
    gy, x, w, args = tensors((2, 6, 7, 7), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6)
    with pytest.raises(ValueError, match="form='shift'"):
        fast.convolution_backward(gy, x, w, None, *args, [True] * 3, form="shift")
    gy, x, w, args = tensors((2, 4, 9, 8), (6, 4, 3, 3), (2, 2), (1, 0), (1, 1), 1)
    with pytest.raises(ValueError, match="form='depthwise'"):
        fast.convolution_backward(gy, x, w, None, *args, [True] * 3, form="depthwise")
    with pytest.raises(ValueError, match="form must be"):
        fast.convolution_backward(gy, x, w, None, *args, [True] * 3, form="fft")
    with pytest.raises(ValueError, match="output_mask"):
        fast.convolution_backward(gy, x, w, None, *args, [True])


def test_depthwise_loop_follows_atens_cpu_capability() -> None:
    """The C++ loop is compiled for AVX-512, AVX2 and the baseline and picks the variant
    by ATen's CPU capability, so ATEN_CPU_CAPABILITY caps it as it caps ATen's kernels."""
    from convlab.aten import extension

    here = torch.backends.cpu.get_cpu_capability()
    want = {"AVX512": "avx512", "AVX2": "avx2"}.get(here, "default")
    assert extension.load().ops.depthwise2d_variant() == want
    code = ("import torch; from convlab.aten import extension; "
            "print(torch.backends.cpu.get_cpu_capability(), "
            "extension.load().ops.depthwise2d_variant(), sep='|')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}, check=True)
    capability, variant = run.stdout.strip().split("|")
    # torch 2.4 and 2.5 name the baseline "NO AVX" (isa_settings.aten_capability)
    assert (isa_settings.aten_capability(capability), variant) == ("DEFAULT", "default")


def test_float32_depthwise_loop_matches_aten() -> None:
    x = torch.randn(4, 32, 14, 14)
    w = torch.randn(32, 1, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 32)
    gy = torch.randn_like(aten.convolution(x, w, None, *args))
    mask = [True, True, True]
    got = fast.convolution_backward(gy, x, w, [32], *args, mask, form="depthwise")
    want = aten.convolution_backward(gy, x, w, [32], *args, mask)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)  # float32 sums of 784 terms


# The im2col form's grad_input (convlab.aten.fast_grad_input), called directly: chunks of
# one sample and of the whole batch, views and channels-last inputs.
SAMPLE_CASES = [  # x shape, w shape, stride, padding, dilation, groups
    ((3, 8, 9, 7), (12, 4, 3, 2), (1, 1), (1, 0), (2, 1), 2),  # K > C, groups
    ((3, 8, 9, 7), (4, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1),   # K <= C
    ((3, 4, 9, 8), (6, 4, 3, 3), (2, 2), (1, 0), (1, 1), 1),   # stride 2
    ((2, 3, 10), (5, 3, 4), (1,), (2,), (1,), 1),              # 1-d
    ((2, 4, 5, 4, 4), (4, 2, 2, 3, 2), (1, 2, 1), (1, 1, 0), (1, 1, 2), 2),  # 3-d
    ((2, 3, 4, 5), (4, 3, 5, 3), (3, 2), (3, 0), (1, 2), 1),   # kernel wider than input
]


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# threads -> driver: one thread, by sample (C++); more threads than samples, batched with
# chunks of one sample or one chunk for the batch.
DRIVERS = {"by-sample": (1, 2**30), "batched-one-sample-chunks": (8, 1),
           "batched-one-chunk": (8, 2**30)}


@pytest.mark.parametrize("case", SAMPLE_CASES, ids=lambda c: f"{len(c[0]) - 2}d-{c[1]}")
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_fast_grad_input_matches_aten(case, driver: str) -> None:
    from convlab.aten import fast_grad_input

    threads, limit = DRIVERS[driver]
    gy, x, w, args = tensors(*case)
    p = ConvParams.for_tensors(x, w, None, *args)
    before = [t.clone() for t in (gy, x, w)]
    want = aten.convolution_backward(gy, x, w, None, *args, [True, False, False])[0]
    with torch.no_grad(), torch_threads(threads):
        got = fast_grad_input.grad_input(gy, w, x.shape, p, limit)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for t, b in zip((gy, x, w), before, strict=True):
        assert torch.equal(t, b)  # inputs are read, never written


def test_fast_grad_input_takes_views_and_channels_last() -> None:
    gy, x, w, args = tensors((4, 8, 9, 9), (8, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    views = {
        "channels-last": (gy.contiguous(memory_format=torch.channels_last),
                          x.contiguous(memory_format=torch.channels_last), w),
        "strided batch": (torch.stack([gy, gy], 1)[:, 0], torch.stack([x, x], 1)[:, 0], w),
        "transposed weight": (gy, x, w.transpose(0, 1).contiguous().transpose(0, 1)),
    }
    want = aten.convolution_backward(gy, x, w, [8], *args, [True, True, True])
    for name, (g, xv, wv) in views.items():
        got = fast.convolution_backward(g, xv, wv, [8], *args, [True, True, True],
                                        form="im2col")
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12, msg=name)


def test_fast_grad_input_refuses_a_transposed_convolution() -> None:
    from convlab.aten import fast_grad_input

    gy, x, w, args = tensors((2, 4, 5, 5), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1), 1,
                             transposed=True, out_pad=(1, 1))
    p = ConvParams.for_tensors(x, w, None, *args)
    with pytest.raises(ValueError, match="transposed"):
        fast_grad_input.grad_input(gy, w, x.shape, p, 2**20)


def _mkl_local_threads_after(fn: Callable[[], object], value: int = 3) -> int | None:
    """MKL's thread-local count of this thread after ``fn()``, when it was ``value``
    before (None where torch has no MKL); the count is put back after."""
    lib = pathlib.Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        set_local = ctypes.CDLL(str(lib)).MKL_Set_Num_Threads_Local
    except (OSError, AttributeError):
        return None
    set_local.argtypes, set_local.restype = [ctypes.c_int], ctypes.c_int
    before = set_local(value)
    try:
        fn()
    finally:
        after = set_local(before)
    return after


def test_grad_input_by_sample_op_matches_aten_at_any_thread_count() -> None:
    """Per sample one single-threaded GEMM and col2im, as ATen's slow path: float64
    equal to ATen's slow path, and the same bits at 1, 2 and 3 threads (each sample is
    made by one thread in a fixed order); MKL's per-thread count is left as it was."""
    ops = extension.load().ops
    gy, x, w, args = tensors((5, 6, 9, 8), (8, 3, 3, 2), (2, 1), (1, 0), (1, 2), 2)
    with torch.backends.mkldnn.flags(enabled=False):
        want = aten.convolution_backward(gy, x, w, None, *args, [True, False, False])[0]
    outs = []
    for n in (1, 2, 3):
        with torch_threads(n):
            outs.append(ops.grad_input_by_sample(gy, w, list(x.shape), [2, 1], [1, 0],
                                                 [1, 2], 2))
    assert all(torch.equal(o, outs[0]) for o in outs)
    torch.testing.assert_close(outs[0], want, rtol=1e-13, atol=1e-13)
    # the op holds MKL to one thread inside its threads and puts the count back
    run = functools.partial(ops.grad_input_by_sample, gy, w, list(x.shape), [2, 1], [1, 0],
                            [1, 2], 2)
    assert _mkl_local_threads_after(run) in (3, None)


def test_grad_input_by_sample_op_empty_and_bad_input() -> None:
    ops = extension.load().ops
    w, gy = torch.randn(4, 3, 3, 3), torch.randn(0, 4, 5, 5)
    got = ops.grad_input_by_sample(gy, w, [0, 3, 5, 5], [1, 1], [1, 1], [1, 1], 1)
    assert got.shape == (0, 3, 5, 5)
    gy = torch.randn(2, 4, 5, 5)
    with pytest.raises(RuntimeError, match="does not follow"):
        ops.grad_input_by_sample(gy, w, [2, 3, 5, 5], [1, 1], [0, 0], [1, 1], 1)
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.grad_input_by_sample(gy.transpose(2, 3), w, [2, 3, 5, 5], [1, 1], [1, 1],
                                 [1, 1], 1)
    with pytest.raises(RuntimeError, match="groups must divide"):
        ops.grad_input_by_sample(gy, w, [2, 3, 5, 5], [1, 1], [1, 1], [1, 1], 2)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ops.grad_input_by_sample(gy.half(), w.half(), [2, 3, 5, 5], [1, 1], [1, 1],
                                 [1, 1], 1)


def test_the_im2col_form_is_exact_for_a_non_finite_weight() -> None:
    gy, x, w, args = tensors((2, 8, 7, 7), (4, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    w[1, 2, 0, 0] = math.inf  # a gather would multiply it by padding zeros: NaN
    got = fast.convolution_backward(gy, x, w, [4], *args, [True, False, False],
                                    form="im2col")[0]
    want = aten.convolution_backward(gy, x, w, [4], *args, [True, False, False])[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert torch.isfinite(got).any() and not torch.isnan(got).all()


# convlab's C++ col2im (torch.ops.convlab_ext.col2im_add_), against the readable
# slice-add col2im of convlab.scratch.im2col and, in 2-d, ATen's own (F.fold).
COL2IM_CASES = [  # (N, C, *size), kernel, stride, padding, dilation
    ((2, 3, 11), (3,), (1,), (1,), (1,)),
    ((2, 3, 11), (4,), (3,), (0,), (2,)),
    ((2, 2, 7, 6), (3, 2), (1, 1), (1, 0), (1, 1)),
    ((1, 2, 9, 8), (3, 3), (2, 3), (2, 1), (2, 1)),
    ((2, 1, 3, 4), (5, 5), (1, 1), (2, 2), (1, 1)),  # every tap reads some padding
    ((1, 2, 5, 4, 6), (2, 3, 2), (2, 1, 3), (1, 1, 0), (1, 2, 1)),
]


def _col2im_geometry(case):
    shape, kernel, stride, padding, dilation = case
    out_size = [(s + 2 * p - d * (k - 1) - 1) // st + 1 for s, k, st, p, d
                in zip(shape[2:], kernel, stride, padding, dilation, strict=True)]
    return shape, list(kernel), out_size, list(stride), list(padding), list(dilation)


@pytest.mark.parametrize("case", COL2IM_CASES, ids=lambda c: f"{len(c[1])}d-{c[1]}-{c[2]}")
def test_col2im_loop_matches_the_readable_col2im(case) -> None:
    from convlab.aten import extension
    from convlab.scratch import im2col

    shape, kernel, out_size, stride, padding, dilation = _col2im_geometry(case)
    n, c = shape[:2]
    taps, positions = math.prod(kernel), math.prod(out_size)
    cols = torch.randn(n * c, taps * positions, dtype=F64)
    start = torch.randn(n * c, *shape[2:], dtype=F64)
    out = start.clone()
    got = extension.load().ops.col2im_add_(out, cols, kernel, out_size, stride, padding,
                                           dilation)
    assert got.data_ptr() == out.data_ptr()  # in place, and returned
    batch_folded = cols.view(n, c, taps, positions).permute(1, 2, 0, 3).reshape(
        1, c * taps, n * positions)
    want = im2col.col2im(batch_folded, shape, kernel, out_size, stride, padding, dilation)
    torch.testing.assert_close(out.view(shape), start.view(shape) + want,
                               rtol=1e-12, atol=1e-12)
    if len(kernel) == 2:
        folded = torch.nn.functional.fold(
            cols.view(n, c * taps, positions), shape[2:], kernel, dilation=dilation,
            padding=padding, stride=stride)
        torch.testing.assert_close(out.view(shape), start.view(shape) + folded,
                                   rtol=1e-12, atol=1e-12)


def test_col2im_loop_drops_entries_that_read_padding() -> None:
    """An infinite column entry copied from padding is never added (as in ATen's col2im)."""
    from convlab.aten import extension

    out = torch.zeros(1, 5, dtype=F64)
    cols = torch.ones(1, 3 * 5, dtype=F64)
    cols[0, 0] = math.inf  # tap 0, output 0 reads x[-1]: padding
    extension.load().ops.col2im_add_(out, cols, [3], [5], [1], [1], [1])
    assert out.tolist() == [[2.0, 3.0, 3.0, 3.0, 2.0]]


@pytest.mark.parametrize(("change", "message"), [
    ({"output_size": [4]}, "output_size does not follow"),
    ({"cols": torch.ones(2, 14, dtype=F64)}, r"cols must be \[2, 15\]"),
    ({"cols": torch.ones(2, 15)}, "both be float32 or float64"),
    ({"cols": torch.ones(15, 2, dtype=F64).t()}, "must be contiguous"),
    ({"stride": [0]}, "must be positive"),
    ({"kernel_size": [3, 1]}, "need 1 values each"),
    ({"out": torch.zeros(2, dtype=F64)}, "1 to 3 spatial dims"),
])
def test_col2im_loop_refuses_bad_arguments(change: dict, message: str) -> None:
    from convlab.aten import extension

    args = {"out": torch.zeros(2, 5, dtype=F64), "cols": torch.ones(2, 15, dtype=F64),
            "kernel_size": [3], "output_size": [5], "stride": [1], "padding": [1],
            "dilation": [1]}
    args.update(change)
    before = args["out"].clone()
    with pytest.raises(RuntimeError, match=message):
        extension.load().ops.col2im_add_(*args.values())
    assert torch.equal(args["out"], before)  # nothing written


def test_col2im_loop_refuses_overlapping_out_and_cols() -> None:
    from convlab.aten import extension

    cols = torch.ones(2, 15, dtype=F64)
    with pytest.raises(RuntimeError, match="single memory location"):
        extension.load().ops.col2im_add_(cols.view(-1)[:10].view(2, 5), cols, [3], [5],
                                         [1], [1], [1])
    shared = torch.zeros(40, dtype=F64)
    with pytest.raises(RuntimeError, match="single memory location"):
        extension.load().ops.col2im_add_(shared[:10].view(2, 5),
                                         shared[5:35].view(2, 15), [3], [5], [1], [1], [1])


@pytest.mark.parametrize(("where", "value"), [
    ("input", math.inf), ("input", math.nan), ("weight", math.inf), ("grad_output", math.nan)])
def test_depthwise_loop_matches_aten_with_a_non_finite_value(where: str, value: float) -> None:
    """A plane with a non-finite input or weight leaves the padded flat loop (whose extra
    columns would multiply it by zero) for the bounded one; NaN lands where ATen puts it."""
    gy, x, w, args = tensors((2, 6, 9, 8), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6)
    # column 0: the flat loop's extra columns of g read it
    {"input": x, "weight": w, "grad_output": gy}[where][1, 0, 1, 0] = value
    mask = [True, True, True]
    got = fast.convolution_backward(gy, x, w, [6], *args, mask, form="depthwise")
    want = aten.convolution_backward(gy, x, w, [6], *args, mask)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12, equal_nan=True)
        assert torch.equal(torch.isnan(g), torch.isnan(e))
    assert torch.isfinite(got[0]).any()


# Shapes each form serves when the rule picks it (at one thread): x, w, padding, groups.
VMAP_CASES = {
    "shift": ((2, 16, 32), (16, 16, 3), (1,), 1),
    "im2col": ((2, 3, 7, 7), (8, 3, 3, 3), (1, 1), 1),
    "depthwise": ((2, 8, 7, 7), (8, 1, 3, 3), (1, 1), 8),
}


@pytest.mark.parametrize(("form", "batched"), [
    pytest.param(form, batched, id=f"{batched}-{form}")
    for form in sorted(VMAP_CASES) for batched in ("grad_output", "input", "weight")])
def test_vmap_over_any_argument_matches_aten(form: str, batched: str) -> None:
    """Under vmap every fast form falls back to the simple reference, whichever argument
    is batched (it failed in ``mm.out`` over grad_output and in ``.item()`` over weight)."""
    xs, ws, padding, groups = VMAP_CASES[form]
    ones = (1,) * len(padding)
    gy, x, w, args = tensors(xs, ws, ones, padding, ones, groups)
    p = ConvParams.for_tensors(x, w, None, *args)
    assert fast.choose_form(x.shape, w.shape, p, F64, 1) == form
    operands = {"grad_output": gy, "input": x, "weight": w}
    operands[batched] = torch.stack([operands[batched] + i for i in range(3)])
    in_dims = tuple(0 if name == batched else None for name in operands)

    def run(fn: Callable[..., tuple]) -> tuple:
        return torch.func.vmap(lambda a, b, c: tuple(fn(a, b, c, [ws[0]], *args,
                                                         [True, True, True])),
                                in_dims=in_dims)(*operands.values())

    with one_thread():
        got = run(fast.convolution_backward)
    want = run(aten.convolution_backward)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)
