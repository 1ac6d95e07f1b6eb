"""convlab.native against ATen: backend names and selection, forcing, native backward paths."""

from __future__ import annotations

import itertools
import re
import warnings
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import convlab.reference as ref
from convlab import native
from convlab.native import (
    CONV_BACKENDS,
    available_backends,
    backend_name,
    convolution_backward,
    select_backend,
    slow_conv2d_backward,
    use_backend,
)
from convlab.params import ConvParams

F64 = torch.float64
ALL_MASK = [True, True, True]


def raw_backend(x, w, b, stride, padding, dilation, transposed, output_padding, groups) -> str:
    """ATen's own answer, mapped by enum value (independent of convlab's argument handling)."""
    value = torch._C._select_conv_backend(
        x, w, b, stride, padding, dilation, transposed, output_padding, groups
    )
    return CONV_BACKENDS[int(value)]


def flags_now() -> tuple:
    return (
        torch.backends.mkldnn.enabled,
        torch._C._get_nnpack_enabled(),
        torch.backends.cudnn.enabled,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


@pytest.fixture(autouse=True)
def _flags_and_threads_restored():
    """Every test leaves global flags and the thread count as it found them."""
    before, threads = flags_now(), torch.get_num_threads()
    yield
    assert flags_now() == before, "a test (or convlab) leaked backend flags"
    assert torch.get_num_threads() == threads


# --- enum names ------------------------------------------------------------------------------


def test_names_match_the_installed_conv_utils_header() -> None:
    header = Path(torch.__file__).parent / "include/ATen/native/ConvUtils.h"
    body = re.search(r"enum class ConvBackend \{(.*?)\};", header.read_text(), re.S)
    assert body is not None, f"no ConvBackend enum in {header}"
    names = [n.strip() for n in body.group(1).split(",") if n.strip()]
    assert tuple(names) == CONV_BACKENDS


def test_names_agree_with_the_python_enum_and_fix_its_quirks() -> None:
    members = torch._C._ConvBackend.__members__
    for member_name, member in members.items():
        assert backend_name(member) == member_name.rstrip(",")
    assert "MpsTranspose," in members  # the binding's typo, mapped to "MpsTranspose"
    assert backend_name(22) == "MpsTranspose"
    assert "???" in str(torch._C._ConvBackend(9))  # no name in the binding
    assert backend_name(torch._C._ConvBackend(9)) == "MkldnnTranspose"
    with pytest.raises(ValueError, match="unknown ConvBackend value 99"):
        backend_name(99)


# --- select_backend --------------------------------------------------------------------------


def _case(shape_x, shape_w, dtype=F64, transposed=False, stride=1, padding=0, dilation=1,
          output_padding=0, groups=1, bias=True):
    x = torch.randn(*shape_x, dtype=dtype)
    w = torch.randn(*shape_w, dtype=dtype)
    out_ch = shape_w[1] * groups if transposed else shape_w[0]
    b = torch.randn(out_ch, dtype=dtype) if bias else None
    return x, w, b, dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                         output_padding=output_padding, groups=groups)


# (expected backend, input shape, weight shape, options, forced backend name or None)
DOCUMENTED = [
    ("Slow2d", (2, 4, 9, 9), (6, 4, 3, 3), {}, None),
    ("Slow2d", (2, 4, 9), (6, 4, 3), {}, None),  # fp64 conv1d is viewed as 2-d
    ("SlowDilated2d", (2, 4, 9, 9), (6, 4, 3, 3), {"dilation": 2}, None),
    ("SlowTranspose2d", (2, 4, 5, 5), (4, 3, 3, 3), {"transposed": True, "stride": 2}, None),
    ("Slow3d", (2, 4, 5, 6, 5), (6, 2, 3, 3, 2), {"groups": 2, "stride": (1, 2, 1)}, None),
    ("SlowDilated3d", (1, 2, 7, 7, 7), (3, 2, 3, 3, 3), {"dilation": 2}, None),
    ("SlowTranspose3d", (1, 2, 4, 4, 4), (2, 3, 2, 2, 2), {"transposed": True, "stride": 2}, None),
    ("Empty", (0, 4, 9, 9), (6, 4, 3, 3), {}, None),
    ("Mkldnn", (2, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, None),
    ("MkldnnTranspose", (2, 4, 5, 5), (4, 3, 3, 3),
     {"dtype": torch.float32, "transposed": True, "stride": 2, "output_padding": 1}, None),
    ("Slow2d", (2, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, "slow"),
    ("NnpackSpatial", (16, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, "nnpack"),
    ("NnpackSpatial", (16, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32, "stride": 2},
     "nnpack"),
    ("Slow2d", (16, 4, 9, 9), (6, 4, 3, 3), {"dtype": torch.float32}, "slow"),
]


def _available(forced: str | None) -> bool:
    return forced is None or forced in available_backends("cpu")


@pytest.mark.parametrize("expected, xs, ws, opts, forced", DOCUMENTED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(DOCUMENTED)])
def test_select_backend_gives_the_documented_backend(expected, xs, ws, opts, forced) -> None:
    if not _available(forced):
        pytest.skip(f"{forced} is not built into this torch")  # only NNPACK-less builds
    if expected.startswith("Mkldnn") and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    x, w, b, kw = _case(xs, ws, **opts)
    if forced is None:
        got = select_backend(x, w, b, **kw)
    else:
        with use_backend(forced, x, w, b, **kw) as got:
            pass
    assert got == expected


def test_mkldnn_disabled_falls_back_to_nnpack_then_slow() -> None:
    x, w, b, kw = _case((16, 4, 9, 9), (6, 4, 3, 3), dtype=torch.float32)
    saved = torch.backends.mkldnn.enabled
    try:
        torch.backends.mkldnn.enabled = False
        expect = "NnpackSpatial" if torch.backends.nnpack.is_available() else "Slow2d"
        assert select_backend(x, w, b, **kw) == expect
        with torch.backends.nnpack.flags(enabled=False):
            assert select_backend(x, w, b, **kw) == "Slow2d"
        assert select_backend(x[:2], w, b, **kw) == "Slow2d"  # N < 16: no NNPACK either
    finally:
        torch.backends.mkldnn.enabled = saved


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_thread_count_flips_a_pointwise_batch_one_conv() -> None:
    x = torch.randn(1, 64, 32, 32)  # N*C*H*W = 65536 > 20480, kernel 1x1, stride 1, N = 1
    w = torch.randn(64, 64, 1, 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert select_backend(x, w) == "Slow2d"
        torch.set_num_threads(2)
        assert select_backend(x, w) == "Mkldnn"
    finally:
        torch.set_num_threads(threads)


def test_meta_tensors_select_overrideable() -> None:
    x = torch.randn(2, 3, 8, 8, device="meta")
    w = torch.randn(4, 3, 3, 3, device="meta")
    assert select_backend(x, w) == "Overrideable"


GRID = list(itertools.product(
    [torch.float32, F64],  # dtype
    [1, 2],  # stride
    [0, 1],  # padding
    [1, 2],  # dilation
    [1, 2],  # groups
    [False, True],  # transposed
    [2, 3],  # spatial dims
))


@pytest.mark.parametrize("mkldnn", [True, False])
def test_select_backend_agrees_with_aten_on_a_grid(mkldnn: bool) -> None:
    saved = torch.backends.mkldnn.enabled
    seen = set()
    try:
        torch.backends.mkldnn.enabled = mkldnn
        for dtype, s, p, d, g, t, dim in GRID:
            xs = (2, 4) + (7,) * dim
            ws = ((4, 6 // g) if t else (6, 4 // g)) + (3,) * dim
            x, w, b, kw = _case(xs, ws, dtype=dtype, transposed=t, stride=s, padding=p,
                                dilation=d, groups=g, output_padding=1 if t and s > 1 else 0)
            got = select_backend(x, w, b, **kw)
            want = raw_backend(x, w, b, [s] * dim, [p] * dim, [d] * dim, t,
                               [kw["output_padding"]] * dim, g)
            assert got == want, (dtype, s, p, d, g, t, dim)
            seen.add(got)
    finally:
        torch.backends.mkldnn.enabled = saved
    assert len(seen) >= 5, seen  # the grid really exercises several backends


def test_select_backend_accepts_ints_and_sequences_and_validates() -> None:
    x, w = torch.randn(1, 4, 9, 9, dtype=F64), torch.randn(6, 2, 3, 3, dtype=F64)
    assert select_backend(x, w, None, 2, [1], (1, 1), False, 0, 2) == "Slow2d"
    with pytest.raises(ValueError, match="groups=3 must divide"):
        select_backend(x, w, groups=3)
    with pytest.raises(ValueError, match="stride"):
        select_backend(x, w, stride=(1, 2, 3), groups=2)
    with pytest.raises(TypeError, match="weight has dtype"):
        select_backend(x, w.float(), groups=2)



def test_backend_memory_format_follows_the_layout_rules() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    cl = x.to(memory_format=torch.channels_last)
    fmt = native.backend_memory_format
    assert fmt(x, w, "Slow2d") == torch.contiguous_format
    assert fmt(cl, w, "Slow2d") == torch.channels_last
    assert fmt(cl, w, "Mkldnn") == torch.channels_last
    assert fmt(cl, w, "Slow3d") == torch.contiguous_format  # no channels_last slow 3-d kernel
    x5 = torch.randn(1, 2, 4, 4, 4).to(memory_format=torch.channels_last_3d)
    assert fmt(x5, torch.randn(3, 2, 2, 2, 2), "Mkldnn") == torch.channels_last_3d
    with pytest.raises(ValueError, match="unknown backend 'Fast'"):
        fmt(x, w, "Fast")

# --- use_backend -----------------------------------------------------------------------------


def test_unknown_backend_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match="valid names: mkldnn, slow, nnpack, cudnn"):
        with use_backend("cudaa"):
            pass
    with pytest.raises(TypeError, match="backend must be a str"):
        with use_backend(3):  # type: ignore[arg-type]
            pass


def test_cudnn_on_cpu_tensors_raises() -> None:
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    for name in ("cudnn", "cudnn-deterministic", "cudnn-benchmark"):
        with pytest.raises(ValueError, match=f"backend '{name}' is not available"):
            with use_backend(name, x, w):
                pass
    if not torch.cuda.is_available():
        assert "cudnn" not in available_backends("cpu")
        with pytest.raises(ValueError, match="no CUDA device"):
            with use_backend("cudnn"):
                pass


def test_mkldnn_unavailable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert "mkldnn" not in available_backends("cpu")
    with pytest.raises(ValueError, match="built without oneDNN"):
        with use_backend("mkldnn"):
            pass


def test_forcing_a_backend_that_cannot_serve_the_inputs_raises() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    with pytest.raises(ValueError, match="'mkldnn' cannot serve these inputs.*selects Slow2d"):
        with use_backend("mkldnn", x, w):
            pass
    x32, w32 = x.float(), w.float()
    if "nnpack" in available_backends("cpu"):
        with pytest.raises(ValueError, match="selects Slow2d"):  # N=2 < 16
            with use_backend("nnpack", x32, w32):
                pass


def test_flags_are_set_inside_and_restored_after_an_exception() -> None:
    before = flags_now()
    with pytest.raises(RuntimeError, match="boom"):
        with use_backend("slow"):
            assert torch.backends.mkldnn.enabled is False
            assert torch._C._get_nnpack_enabled() is False
            assert torch.backends.cudnn.enabled is False
            raise RuntimeError("boom")
    assert flags_now() == before


def test_nested_forcing_restores_each_level() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with use_backend("slow", x, w) as outer:
        with use_backend("mkldnn", x, w) as inner:
            assert select_backend(x, w) == "Mkldnn"
        assert select_backend(x, w) == "Slow2d"
    assert (outer, inner) == ("Slow2d", "Mkldnn")


def test_use_backend_emits_no_warning() -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in available_backends("cpu"):
            xs = x.repeat(8, 1, 1, 1) if name == "nnpack" else x
            with use_backend(name, xs, w):
                pass


def test_use_backend_needs_both_tensors() -> None:
    with pytest.raises(ValueError, match="both input and weight"):
        with use_backend("slow", torch.randn(1, 2, 5, 5)):
            pass


# --- convolution_backward under each backend vs convlab.reference ---------------------------


def _grads_vs_reference(x, w, b, kw, backend, tol):
    p = ConvParams.for_tensors(x, w, b, **kw)
    out = torch.ops.aten.convolution(x, w, b, list(p.stride), list(p.padding), list(p.dilation),
                                     p.transposed, list(p.output_padding), p.groups)
    go = torch.randn_like(out)
    args = ([w.shape[1] * p.groups if p.transposed else w.shape[0]], p.stride, p.padding,
            p.dilation, p.transposed, p.output_padding, p.groups, ALL_MASK)
    got = convolution_backward(go, x, w, *args, backend=backend)
    want = ref.convolution_backward(go.double(), x.double(), w.double(), *args)
    for name, g, r in zip(("grad_input", "grad_weight", "grad_bias"), got, want, strict=True):
        assert g.dtype == x.dtype
        torch.testing.assert_close(g.double(), r, atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize("expected, xs, ws, opts, forced", DOCUMENTED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(DOCUMENTED)])
def test_every_cpu_backend_matches_the_reference(expected, xs, ws, opts, forced) -> None:
    if not _available(forced):
        pytest.skip(f"{forced} is not built into this torch")
    x, w, b, kw = _case(xs, ws, **opts)
    # float64 backends: tight. float32 (oneDNN, NNPACK-forward-selected cases, forced slow
    # fp32): each output sums <= N*C*k*k ~ 600 products of O(1) numbers in float32, whose
    # rounding error is ~ sqrt(600) * 6e-8 * |terms| ~ 1e-5 relative; 1e-4 leaves headroom.
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
    with pytest.raises(ValueError, match="cannot serve"):
        convolution_backward(go, x, w, [4], 1, 0, 1, False, 0, 1, ALL_MASK, backend="mkldnn")


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
    n=st.integers(1, 3),
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
    with pytest.raises(ValueError, match="output_mask must be 3 bools"):
        convolution_backward(go, x, w, *base, [True, True])
    with pytest.raises(TypeError, match="output_mask"):
        convolution_backward(go, x, w, *base, "yes")
    with pytest.raises(ValueError, match="bias_sizes must be \\[4\\]"):
        convolution_backward(go, x, w, [5], 1, 0, 1, False, 0, 1, ALL_MASK)
    with pytest.raises(ValueError, match="grad_output must have the forward output's shape"):
        convolution_backward(go[:, :, :5], x, w, *base, ALL_MASK)
    with pytest.raises(ValueError, match="groups=2 must divide in_channels=3"):
        convolution_backward(go, x, w, [4], 1, 0, 1, False, 0, 2, ALL_MASK)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        convolution_backward(go, None, w, *base, ALL_MASK)  # type: ignore[arg-type]


def test_empty_batch_with_no_bias_sizes_does_not_abort() -> None:
    # aten aborts the process (std::bad_optional_access) for this call with bias_sizes=None.
    x, w = torch.randn(0, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(0, 4, 6, 6, dtype=F64)
    gi, gw, gb = convolution_backward(go, x, w, None, 1, 0, 1, False, 0, 1, ALL_MASK)
    assert gi.shape == x.shape and gb.shape == (4,)
    assert gw.abs().sum() == 0 and gb.abs().sum() == 0


# --- slow_conv2d_backward ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1), ((1, 2), (2, 0))])
def test_slow_conv2d_backward_out_matches_reference(dtype, stride, padding) -> None:
    x, w = torch.randn(2, 3, 9, 8, dtype=dtype), torch.randn(5, 3, 3, 2, dtype=dtype)
    p = ConvParams.for_tensors(x, w, None, stride, padding)
    go = torch.randn(*p.output_shape(x.shape, w.shape), dtype=dtype)
    bufs = (torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype))
    got = slow_conv2d_backward(go, x, w, (3, 2), stride, padding, out=bufs)
    assert all(g is b for g, b in zip(got, bufs, strict=True))  # the buffers, resized
    want = ref.convolution_backward(go.double(), x.double(), w.double(), [5], p.stride,
                                    p.padding, 1, False, 0, 1, ALL_MASK)
    tol = 1e-10 if dtype == F64 else 1e-4  # float32: see test_every_cpu_backend_...
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), r, atol=tol, rtol=tol)


def test_slow_conv2d_backward_writes_into_large_enough_buffers() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    bufs = (torch.full((2, 3, 8, 8), 7.0, dtype=F64), torch.full((4, 3, 3, 3), 7.0, dtype=F64),
            torch.full((4,), 7.0, dtype=F64))
    ptrs = [b.data_ptr() for b in bufs]
    gi, gw, gb = slow_conv2d_backward(go, x, w, 3, out=bufs)
    assert [gi.data_ptr(), gw.data_ptr(), gb.data_ptr()] == ptrs
    want = torch.ops.aten.convolution_backward(go, x, w, [4], [1, 1], [0, 0], [1, 1], False,
                                               [0, 0], 1, ALL_MASK)
    for g, a in zip((gi, gw, gb), want, strict=True):
        torch.testing.assert_close(g, a, atol=1e-12, rtol=1e-12)
    big = torch.empty(1000, dtype=F64)  # more storage than needed: kept, viewed smaller
    ptr = big.data_ptr()
    gi, _, _ = slow_conv2d_backward(go, x, w, 3, out=(big, torch.empty(0, dtype=F64),
                                                      torch.empty(0, dtype=F64)))
    assert gi is big and big.data_ptr() == ptr and big.shape == x.shape


def test_slow_conv2d_backward_output_mask_form() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 4, 4, dtype=F64)
    gi, gw, gb = slow_conv2d_backward(go, x, w, 3, 2, 1, output_mask=[False, True, True])
    assert gi is None
    want = ref.convolution_backward(go, x, w, [4], 2, 1, 1, False, 0, 1, ALL_MASK)
    torch.testing.assert_close(gw, want[1], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(gb, want[2], atol=1e-10, rtol=1e-10)


def test_slow_conv2d_backward_makes_channels_last_inputs_contiguous() -> None:
    x = torch.randn(2, 3, 8, 8, dtype=F64).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    gi, gw, gb = slow_conv2d_backward(go, x, w, 3)
    want = ref.convolution_backward(go, x.contiguous(), w, [4], 1, 0, 1, False, 0, 1, ALL_MASK)
    torch.testing.assert_close(gi, want[0], atol=1e-10, rtol=1e-10)


def test_slow_conv2d_backward_rejects_bad_arguments() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    with pytest.raises(ValueError, match="kernel_size=\\[2, 2\\] must equal"):
        slow_conv2d_backward(go, x, w, 2)
    with pytest.raises(ValueError, match="4-d weight"):
        slow_conv2d_backward(go, x, w[..., 0], 3)
    with pytest.raises(TypeError, match="out must be a tuple of 3"):
        slow_conv2d_backward(go, x, w, 3, out=(torch.empty(0, dtype=F64),))
    with pytest.raises(TypeError, match="out grad_weight has dtype"):
        slow_conv2d_backward(go, x, w, 3, out=(torch.empty(0, dtype=F64), torch.empty(0),
                                               torch.empty(0, dtype=F64)))
    with pytest.raises(ValueError, match="grad_output must have"):
        slow_conv2d_backward(go, x, w, 3, stride=2)


def test_slow_conv2d_backward_rejects_devices_without_a_kernel() -> None:
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    with pytest.raises(ValueError, match="CPU and CUDA kernels only"):
        slow_conv2d_backward(go.to("meta"), x.to("meta"), w.to("meta"), 3)


def test_slow_conv2d_backward_makes_a_channels_last_weight_contiguous() -> None:
    # aten's kernel returns a wrong grad_weight for a contiguous input and a CL weight.
    x, w = torch.randn(2, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.randn(2, 4, 6, 6, dtype=F64)
    got = slow_conv2d_backward(go, x, w.to(memory_format=torch.channels_last), 3)
    want = ref.convolution_backward(go, x, w, [4], 1, 0, 1, False, 0, 1, ALL_MASK)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


@pytest.mark.cuda
def test_slow_conv2d_backward_on_cuda() -> None:
    # ATen registers CUDA kernels for both overloads of _slow_conv2d_backward.
    x = torch.randn(2, 3, 9, 9, dtype=F64, device="cuda")
    w = torch.randn(4, 3, 3, 3, dtype=F64, device="cuda")
    go = torch.randn(2, 4, 5, 5, dtype=F64, device="cuda")
    want = ref.convolution_backward(go, x, w, [4], 2, 1, 1, False, 0, 1, ALL_MASK)
    bufs = tuple(torch.empty(0, dtype=F64, device="cuda") for _ in range(3))
    for got in (slow_conv2d_backward(go, x, w, 3, 2, 1),
                slow_conv2d_backward(go, x, w, 3, 2, 1, out=bufs)):
        for g, r in zip(got, want, strict=True):
            assert g.device.type == "cuda"
            torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


# --- torch.nn.grad equivalents ----------------------------------------------------------------

NN_GRID = list(itertools.product([1, 2, 3], [1, 2], [0, 1], [1, 2], [1, 2]))


@pytest.mark.parametrize("dim, stride, padding, dilation, groups", NN_GRID)
def test_nn_grad_equivalents_match_torch_nn_grad(dim, stride, padding, dilation, groups):
    x = torch.randn(*(2, 4) + (7, 6, 5)[:dim], dtype=F64)
    w = torch.randn(*(6, 4 // groups) + (3, 2, 3)[:dim], dtype=F64)
    y = torch.ops.aten.convolution(x, w, None, [stride] * dim, [padding] * dim,
                                   [dilation] * dim, False, [0] * dim, groups)
    go = torch.randn_like(y)
    args = (stride, padding, dilation, groups)
    ours_in = getattr(native, f"conv{dim}d_input")(x.shape, w, go, *args)
    theirs_in = getattr(torch.nn.grad, f"conv{dim}d_input")(x.shape, w, go, *args)
    ours_w = getattr(native, f"conv{dim}d_weight")(x, w.shape, go, *args)
    theirs_w = getattr(torch.nn.grad, f"conv{dim}d_weight")(x, w.shape, go, *args)
    torch.testing.assert_close(ours_in, theirs_in, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ours_w, theirs_w, atol=1e-12, rtol=1e-12)
    want = ref.convolution_backward(go, x, w, None, *([stride], [padding], [dilation]), False,
                                    [0], groups, [True, True, False])
    torch.testing.assert_close(ours_in, want[0], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(ours_w, want[1], atol=1e-10, rtol=1e-10)


def test_nn_grad_input_keeps_autograds_channels_last_layout() -> None:
    # The reason for the dense placeholder (see the conv2d_input docstring).
    x = torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(16, 8, 3, 3)
    y = torch.nn.functional.conv2d(x, w)
    go = torch.randn_like(y)
    y.backward(go)
    ours = native.conv2d_input(x.shape, w, go)
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    assert ours.stride() == x.grad.stride()
    torch.testing.assert_close(ours, x.grad, atol=1e-5, rtol=1e-5)  # fp32, same kernel path


def test_nn_grad_equivalents_validate() -> None:
    w, go = torch.randn(4, 3, 3, 3), torch.randn(2, 4, 6, 6)
    with pytest.raises(ValueError, match="input_size must have 4 entries"):
        native.conv2d_input([2, 3, 8], w, go)
    with pytest.raises(TypeError, match="input_size must contain ints"):
        native.conv2d_input([2, 3, 8.0, 8], w, go)
    with pytest.raises(ValueError, match="weight must have 5 dimensions for conv3d"):
        native.conv3d_input([2, 3, 8, 8], w, go)
    with pytest.raises(ValueError, match="grad_output must have the forward output's shape"):
        native.conv2d_weight(torch.randn(2, 3, 9, 9), [4, 3, 3, 3], go)


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
