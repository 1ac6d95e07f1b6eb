"""The C++ extension (convlab.aten.extension) against ATen and convlab.scratch.reference.

The extension calls the same ATen kernels as ``torch.ops.aten``, so the comparison with
the aten twin is exact; the comparison with convlab.scratch.reference (an independent
implementation) uses a tight float64 tolerance.
"""

from __future__ import annotations

import itertools
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from convlab.aten import extension
from convlab.scratch import reference
from convlab.scratch.params import ConvParams

F64 = torch.float64
MASKS = [list(m) for m in itertools.product([True, False], repeat=3)]
EXACT = {"rtol": 0.0, "atol": 0.0}
TIGHT = {"rtol": 1e-10, "atol": 1e-10}

# (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
CONFIGS = {
    "1d-grouped-strided": ((2, 4, 9), (6, 2, 3), 2, 1, 1, False, 0, 2),
    "2d-plain": ((2, 3, 7, 6), (4, 3, 3, 2), 1, 0, 1, False, 0, 1),
    "2d-stride-dilation": ((2, 3, 9, 8), (5, 3, 3, 2), (2, 1), (1, 2), (2, 1), False, 0, 1),
    "2d-groups3": ((2, 6, 6, 6), (6, 2, 3, 3), 1, 1, 1, False, 0, 3),
    "2d-transposed": ((2, 4, 5, 5), (4, 3, 3, 3), 2, 1, 1, True, 1, 1),
    "2d-transposed-grouped-dilated": ((2, 4, 4, 5), (4, 2, 2, 3), (2, 3), 0, 2, True, (1, 0), 2),
    "3d-strided": ((1, 2, 5, 4, 4), (4, 2, 2, 3, 2), (1, 2, 1), 1, 1, False, 0, 1),
    "3d-transposed": ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), 2, 0, 1, True, 1, 1),
}


@pytest.fixture(scope="module")
def ext() -> extension.NativeExtension:
    return extension.load()


def make_case(
    cfg: tuple, device: str = "cpu", dtype: torch.dtype = F64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """Random input, weight and grad_output for one config, plus the aten hyper-parameters."""
    x_shape, w_shape, stride, padding, dilation, transposed, output_padding, groups = cfg
    p = ConvParams.create(len(w_shape) - 2, stride, padding, dilation, transposed,
                          output_padding, groups)
    x = torch.randn(x_shape, dtype=dtype, device=device)
    w = torch.randn(w_shape, dtype=dtype, device=device)
    go = torch.randn(p.output_shape(x_shape, w_shape), dtype=dtype, device=device)
    out_channels = go.shape[1]
    args = [[out_channels], list(p.stride), list(p.padding), list(p.dilation), p.transposed,
            list(p.output_padding), p.groups]
    return go, x, w, args


def assert_grads(actual: tuple, expected: tuple, mask: list[bool], **tol: float) -> None:
    assert len(actual) == 3
    for a, e, m in zip(actual, expected, mask, strict=True):
        if m:
            torch.testing.assert_close(a, e, **tol)
        else:
            assert a is None, "a masked-off output must come back as None"


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "".join("1" if b else "0" for b in m))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_convolution_backward_matches_aten_and_reference(ext, name: str, mask: list) -> None:
    go, x, w, args = make_case(CONFIGS[name])
    ours = ext.convolution_backward(go, x, w, *args, mask)
    aten = torch.ops.aten.convolution_backward(go, x, w, *args, mask)
    ref = reference.convolution_backward(go, x, w, *args, mask)
    assert_grads(ours, aten, mask, **EXACT)
    assert_grads(ours, ref, mask, **TIGHT)


def test_raw_op_is_registered_and_matches_aten(ext) -> None:
    go, x, w, args = make_case(CONFIGS["2d-groups3"])
    raw = torch.ops.convlab_ext.convolution_backward(go, x, w, *args, [True, True, True])
    aten = torch.ops.aten.convolution_backward(go, x, w, *args, [True, True, True])
    assert_grads(raw, aten, [True, True, True], **EXACT)


@pytest.mark.parametrize("n", [2, 0])
@pytest.mark.parametrize("sizes", [None, [4], [0], [7], [], [4, 1]], ids=repr)
def test_bias_sizes_follow_the_one_rule(ext, n: int, sizes) -> None:
    """The rule of params.check_bias_sizes, for every mask: None, [C_out] and [0] accepted,
    anything else rejected; grad_bias is [C_out] (ATen's answer for a non-empty batch)."""
    cfg = ((n, 3, 7, 6), (4, 3, 3, 2), 1, 0, 1, False, 0, 1)
    go, x, w, args = make_case(cfg)
    for mask in MASKS:
        want = reference.convolution_backward(go, x, w, *args, mask)
        if sizes is not None and sizes not in ([4], [0]):
            with pytest.raises(ValueError, match="bias_sizes"):
                ext.convolution_backward(go, x, w, sizes, *args[1:], mask)
            continue
        ours = ext.convolution_backward(go, x, w, sizes, *args[1:], mask)
        assert_grads(ours, want, mask, **TIGHT)


def test_empty_batch_without_bias_sizes_does_not_abort(ext) -> None:
    # ATen itself aborts the process (bad optional access) on bias_sizes=None with N=0.
    x, w = torch.zeros(0, 3, 8, 8, dtype=F64), torch.randn(4, 3, 3, 3, dtype=F64)
    go = torch.zeros(0, 4, 6, 6, dtype=F64)
    gi, gw, gb = ext.convolution_backward(go, x, w, None, 1, 0, 1, False, 0, 1, [True] * 3)
    assert gi.shape == x.shape
    torch.testing.assert_close(gw, torch.zeros_like(w), **EXACT)
    torch.testing.assert_close(gb, torch.zeros(4, dtype=F64), **EXACT)


@given(
    dim=st.integers(1, 3),
    n=st.integers(1, 2),
    groups=st.integers(1, 2),
    cin_per_group=st.integers(1, 2),
    cout_per_group=st.integers(1, 2),
    size=st.integers(3, 6),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    padding=st.integers(0, 1),
    dilation=st.integers(1, 2),
    transposed=st.booleans(),
    mask=st.sampled_from(MASKS),
)
def test_convolution_backward_hypothesis(
    ext, dim, n, groups, cin_per_group, cout_per_group, size, kernel, stride, padding, dilation,
    transposed, mask,
) -> None:
    cin, cout = groups * cin_per_group, groups * cout_per_group
    if transposed:
        w_shape = (cin, cout_per_group) + (kernel,) * dim
        output_padding = stride - 1  # largest legal value: exercises the extra row
    else:
        w_shape = (cout, cin_per_group) + (kernel,) * dim
        output_padding = 0
        if dilation * (kernel - 1) + 1 > size + 2 * padding:
            return  # kernel does not fit: not a valid convolution
    cfg = ((n, cin) + (size,) * dim, w_shape, stride, padding, dilation, transposed,
           output_padding, groups)
    go, x, w, args = make_case(cfg)
    ours = ext.convolution_backward(go, x, w, *args, mask)
    assert_grads(ours, torch.ops.aten.convolution_backward(go, x, w, *args, mask), mask, **EXACT)
    assert_grads(ours, reference.convolution_backward(go, x, w, *args, mask), mask, **TIGHT)


# --- the slow 2-d path into caller buffers -------------------------------------------------

SLOW = {  # input shape, weight shape, stride, padding
    "plain": ((2, 3, 7, 6), (4, 3, 3, 2), 1, 0),
    "strided-padded": ((2, 3, 9, 8), (5, 3, 3, 3), (2, 1), (1, 2)),
    "1x1": ((3, 4, 5, 5), (2, 4, 1, 1), 2, 0),
}


def slow_case(name: str, dtype: torch.dtype = F64, device: str = "cpu"):
    x_shape, w_shape, stride, padding = SLOW[name]
    go, x, w, args = make_case((x_shape, w_shape, stride, padding, 1, False, 0, 1), device, dtype)
    return go, x, w, list(w_shape[2:]), args[1], args[2]


@pytest.mark.parametrize("name", list(SLOW))
def test_slow_conv2d_backward_out_reuses_buffers_that_fit(ext, name: str) -> None:
    go, x, w, k, s, p = slow_case(name)
    bufs = (torch.full_like(x, float("nan")), torch.full_like(w, float("nan")),
            torch.full((w.shape[0],), float("nan"), dtype=F64))
    ptrs = [b.data_ptr() for b in bufs]
    out = ext.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    assert all(o is b for o, b in zip(out, bufs, strict=True))
    assert [b.data_ptr() for b in bufs] == ptrs, "a buffer of the right size was reallocated"
    aten = torch.ops.aten._slow_conv2d_backward.output_mask(go, x, w, k, s, p, [True] * 3)
    assert_grads(out, aten, [True] * 3, **EXACT)
    ref = reference.convolution_backward(go, x, w, None, s, p, 1, False, 0, 1, [True] * 3)
    assert_grads(out, ref, [True] * 3, **TIGHT)


@pytest.mark.parametrize("name", list(SLOW))
def test_slow_conv2d_backward_out_resizes_empty_buffers(ext, name: str) -> None:
    go, x, w, k, s, p = slow_case(name)
    bufs = tuple(torch.empty(0, dtype=F64) for _ in range(3))
    gi, gw, gb = ext.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    assert gi is bufs[0] and gw is bufs[1] and gb is bufs[2]
    assert (gi.shape, gw.shape, gb.shape) == (x.shape, w.shape, torch.Size([w.shape[0]]))
    aten = torch.ops.aten.convolution_backward(go, x, w, [w.shape[0]], s, p, [1, 1], False,
                                               [0, 0], 1, [True] * 3)
    assert_grads((gi, gw, gb), aten, [True] * 3, **TIGHT)


@pytest.mark.parametrize("layout", ["channels_last", "transposed_view"])
def test_slow_conv2d_backward_out_accepts_non_contiguous_input(ext, layout: str) -> None:
    go, x, w, k, s, p = slow_case("strided-padded")
    if layout == "channels_last":
        x_nc = x.to(memory_format=torch.channels_last)
    else:
        x_nc = x.transpose(2, 3).contiguous().transpose(2, 3)
    assert not x_nc.is_contiguous() and torch.equal(x_nc, x)
    expected = ext.slow_conv2d_backward_out(*(torch.empty(0, dtype=F64) for _ in range(3)),
                                            go, x, w, k, s, p)
    got = ext.slow_conv2d_backward_out(*(torch.empty(0, dtype=F64) for _ in range(3)),
                                       go, x_nc, w, k, s, p)
    assert_grads(got, expected, [True] * 3, **EXACT)


# --- aliasing and unsafe buffers (caught before the kernel writes) -------------------------


def _fresh() -> torch.Tensor:
    return torch.empty(0, dtype=F64)


def _aliasing_cases(go, x, w):
    """(description, buffers) whose writing would corrupt an input, another buffer or
    memory outside a view."""
    big = torch.zeros(4096, dtype=F64)
    gw_ok, gb_ok = torch.empty_like(w), torch.empty(w.shape[0], dtype=F64)
    shared = torch.empty(x.numel() + w.numel(), dtype=F64)
    return {
        "grad_input is input": ([x, gw_ok, gb_ok], "grad_input.*input"),
        "grad_input is grad_output (resized)": ([go, gw_ok, gb_ok], "grad_input"),
        "grad_weight is weight": ([_fresh(), w, gb_ok], "grad_weight.*weight"),
        "grad_bias aliases grad_weight": ([_fresh(), gw_ok, gw_ok.view(-1)[: w.shape[0]]],
                                          "grad_weight|grad_bias"),
        "grad_input a slice of a bigger tensor": ([big[:10], gw_ok, gb_ok], "view"),
        "grad_input a detached slice": ([big[10:12].detach(), gw_ok, gb_ok], "grad_input"),
        "grad_weight a .data slice": ([_fresh(), big[10:12].data, gb_ok], "grad_weight"),
        "two outputs overlap in one storage": (
            [shared[: x.numel()].view(x.shape), shared[x.numel() - 1:][: w.numel()].view(w.shape),
             gb_ok], "grad_input.*grad_weight"),
        "grad_bias expanded": ([_fresh(), gw_ok, torch.zeros(1, dtype=F64).expand(w.shape[0])],
                               "grad_bias"),
    }, big


@pytest.mark.parametrize("case", ["grad_input is input", "grad_input is grad_output (resized)",
                                  "grad_weight is weight", "grad_bias aliases grad_weight",
                                  "grad_input a slice of a bigger tensor",
                                  "grad_input a detached slice", "grad_weight a .data slice",
                                  "two outputs overlap in one storage", "grad_bias expanded"])
def test_slow_conv2d_backward_out_refuses_unsafe_buffers(ext, case: str) -> None:
    go, x, w, k, s, p = slow_case("strided-padded")
    cases, big = _aliasing_cases(go, x, w)
    bufs, pattern = cases[case]
    before = [t.clone() for t in (go, x, w, big)]
    with pytest.raises(ValueError, match=pattern):
        ext.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    for t, b in zip((go, x, w, big), before, strict=True):
        assert torch.equal(t, b), "a refused call must not have written anything"


@pytest.mark.parametrize("case", ["grad_input is input", "grad_input is grad_output (resized)",
                                  "grad_input a slice of a bigger tensor",
                                  "grad_input a detached slice", "grad_weight a .data slice",
                                  "grad_bias aliases grad_weight"])
def test_raw_op_refuses_unsafe_buffers_in_cpp(ext, case: str) -> None:
    go, x, w, k, s, p = slow_case("strided-padded")
    cases, big = _aliasing_cases(go, x, w)
    bufs, _ = cases[case]
    before = [t.clone() for t in (go, x, w, big)]
    with pytest.raises(RuntimeError):
        ext.ops.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    for t, b in zip((go, x, w, big), before, strict=True):
        assert torch.equal(t, b)


BUFFER_KINDS = ["empty", "right", "big_owned", "input", "grad_output", "weight", "view",
                "detached_view", "data_view",
                "same_as_previous"]


@given(kinds=st.tuples(*[st.sampled_from(BUFFER_KINDS)] * 3))
def test_any_buffer_choice_is_refused_or_right(ext, kinds) -> None:
    """Property over buffer choices: a call either raises ValueError having written nothing,
    or returns the right gradients; memory outside the buffers is never touched."""
    go, x, w, k, s, p = slow_case("plain")
    shapes = [x.shape, w.shape, (w.shape[0],)]
    guard = torch.full((4096,), 7.0, dtype=F64)
    bufs: list[torch.Tensor] = []
    for kind, shape in zip(kinds, shapes, strict=True):
        bufs.append({
            "empty": lambda: _fresh(),
            "right": lambda shape=shape: torch.empty(shape, dtype=F64),
            "big_owned": lambda: torch.empty(1000, dtype=F64),
            "input": lambda: x, "grad_output": lambda: go, "weight": lambda: w,
            "view": lambda: guard[5:9],
            "detached_view": lambda: guard[5:9].detach(),  # no view to autograd (D3)
            "data_view": lambda: guard[5:9].data,
            "same_as_previous": lambda: bufs[-1] if bufs else _fresh(),
        }[kind]())
    before = [t.clone() for t in (go, x, w, guard)]
    try:
        out = ext.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    except ValueError:
        for t, b in zip((go, x, w, guard), before, strict=True):
            assert torch.equal(t, b)
        return
    want = reference.convolution_backward(before[0], before[1], before[2], None, s, p, 1,
                                          False, 0, 1, [True] * 3)
    assert_grads(out, want, [True] * 3, **TIGHT)
    for t, b in zip((go, x, w), before[:3], strict=True):
        assert torch.equal(t, b)
    outside = torch.ones(4096, dtype=torch.bool)
    outside[5:9] = False  # the view may be written (when it has the right shape)
    assert torch.equal(guard[outside], before[3][outside])


def test_inference_mode_buffers_get_a_clear_error(ext) -> None:
    go, x, w, k, s, p = slow_case("plain")
    with torch.inference_mode():
        gi = torch.empty(0, dtype=F64)
    with pytest.raises(ValueError, match="grad_input is an inference tensor"):
        ext.slow_conv2d_backward_out(gi, _fresh(), _fresh(), go, x, w, k, s, p)
    with torch.inference_mode():  # inside inference mode the same buffer is fine
        out = ext.slow_conv2d_backward_out(gi, _fresh(), _fresh(), go, x, w, k, s, p)
    assert out[0] is gi and gi.shape == x.shape


# --- bad input ------------------------------------------------------------------------------


def test_convolution_backward_rejects_bad_input(ext) -> None:
    go, x, w, args = make_case(CONFIGS["2d-plain"])
    mask = [True, True, True]
    with pytest.raises(ValueError, match="groups"):
        ext.convolution_backward(go, x, w, *args[:-1], 2, mask)
    with pytest.raises(ValueError, match="grad_output"):
        ext.convolution_backward(go[:, :, 1:], x, w, *args, mask)
    with pytest.raises(ValueError, match="output_mask"):
        ext.convolution_backward(go, x, w, *args, [True, True])
    with pytest.raises(TypeError, match="output_mask"):
        ext.convolution_backward(go, x, w, *args, [1, 1, 1])
    with pytest.raises(ValueError, match="bias_sizes"):
        ext.convolution_backward(go, x, w, [7], *args[1:], mask)
    with pytest.raises(TypeError, match="input"):
        ext.convolution_backward(go, x.long(), w, *args, mask)
    with pytest.raises(TypeError, match="weight"):
        ext.convolution_backward(go, x, w.float(), *args, mask)
    with pytest.raises(ValueError, match="stride"):
        ext.convolution_backward(go, x, w, args[0], [1, 1, 1], *args[2:], mask)


def test_slow_conv2d_backward_out_rejects_bad_input(ext) -> None:
    go, x, w, k, s, p = slow_case("plain")

    def bufs() -> list[torch.Tensor]:
        return [torch.empty(0, dtype=F64) for _ in range(3)]

    with pytest.raises(ValueError, match="kernel_size"):
        ext.slow_conv2d_backward_out(*bufs(), go, x, w, [3, 3], s, p)
    with pytest.raises(ValueError, match="4-d"):
        ext.slow_conv2d_backward_out(*bufs(), go[..., 0], x[..., 0], w[..., 0], [3], 1, 0)
    wrong = bufs()
    wrong[1] = torch.empty(0, dtype=torch.float32)
    with pytest.raises(TypeError, match="grad_weight"):
        ext.slow_conv2d_backward_out(*wrong, go, x, w, k, s, p)
    strided = bufs()
    strided[0] = torch.empty(*x.shape[:3], 2 * x.shape[3], dtype=F64)[..., ::2]
    with pytest.raises(ValueError, match="grad_input"):
        ext.slow_conv2d_backward_out(*strided, go, x, w, k, s, p)
    with pytest.raises(TypeError, match="grad_bias"):
        ext.slow_conv2d_backward_out(*bufs()[:2], None, go, x, w, k, s, p)


@pytest.mark.parametrize("arg", ["grad_output", "input", "weight"])
def test_slow_conv2d_backward_out_refuses_inputs_that_require_grad(ext, arg: str) -> None:
    go, x, w, k, s, p = slow_case("plain")
    tensors = {"grad_output": go, "input": x, "weight": w}
    tensors[arg] = tensors[arg].clone().requires_grad_()
    bufs = [torch.full((1,), 7.0, dtype=F64) for _ in range(3)]
    with pytest.raises(ValueError, match=f"{arg} requires grad.*not differentiable"):
        ext.slow_conv2d_backward_out(*bufs, *tensors.values(), k, s, p)
    assert all(b.shape == (1,) and b.item() == 7.0 for b in bufs), "refused after work"
    with torch.no_grad():
        out = ext.slow_conv2d_backward_out(*bufs, *tensors.values(), k, s, p)
    aten = torch.ops.aten._slow_conv2d_backward.output_mask(go, x, w, k, s, p, [True] * 3)
    assert_grads(out, aten, [True] * 3, **EXACT)


def test_raw_out_op_records_no_usable_derivative(ext) -> None:
    """What the Python guard protects against: the raw out= op, like ATen's own, records a
    node with no derivative, while the functional op records the real double backward."""
    go, x, w, k, s, p = slow_case("plain")
    x = x.clone().requires_grad_()
    bufs = [torch.empty(0, dtype=F64) for _ in range(3)]
    out = ext.ops.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    assert type(out[0].grad_fn).__name__ == "NotImplemented"
    aten_out = torch.ops.aten._slow_conv2d_backward.grad_input(
        go, x, w, k, s, p, grad_input=torch.empty(0, dtype=F64),
        grad_weight=torch.empty(0, dtype=F64), grad_bias=torch.empty(0, dtype=F64))
    assert type(aten_out[0].grad_fn).__name__ == "NotImplemented"
    functional = ext.ops.convolution_backward(go, x, w, [w.shape[0]], s, p, [1, 1], False,
                                              [0, 0], 1, [True] * 3)
    assert type(functional[1].grad_fn).__name__ == "ConvolutionBackwardBackward0"


# --- loading: cache, stale lock, toolchain errors -------------------------------------------


def test_load_is_cached(ext) -> None:
    again = extension.load()
    assert again is ext
    assert again.ops is torch.ops.convlab_ext
    assert Path(again.library).is_file()
    assert Path(again.library).parent == extension.build_directory()


@pytest.mark.timeout(300)
def test_load_removes_a_stale_lock(ext, monkeypatch: pytest.MonkeyPatch) -> None:
    # A killed build leaves torch's `lock` file behind; without cleanup this load hangs.
    lock = extension.build_directory() / "lock"
    lock.write_text("")
    monkeypatch.setattr(extension, "_LOADED", None)
    fresh = extension.load()  # hangs (until the timeout) without the guard
    assert fresh is not ext and fresh.library == ext.library
    # Newer torch keeps its (now fcntl-based) `lock` file in the build folder, so whether
    # the file exists afterwards says nothing; what matters is that load returned.


def test_library_path_does_not_rely_on_cpp_extension_return_value(ext, monkeypatch) -> None:
    # torch 2.4's cpp_extension.load(..., is_python_module=False) returns None.
    import torch.utils.cpp_extension as cpp

    real = cpp.load
    monkeypatch.setattr(cpp, "load", lambda *args, **kwargs: (real(*args, **kwargs), None)[1])
    monkeypatch.setattr(extension, "_LOADED", None)
    fresh = extension.load()
    assert fresh.library == ext.library and Path(fresh.library).is_file()


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks")
def test_build_lock_keeps_a_torch_lock_that_a_live_build_holds(tmp_path) -> None:
    # Newer torch holds an OS lock on `lock` while it builds: that file must stay.
    import fcntl

    lock = tmp_path / "lock"
    with open(lock, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with extension._build_lock(tmp_path):
            assert lock.exists()
    with extension._build_lock(tmp_path):  # nobody holds it any more: a leftover
        assert not lock.exists()


def test_load_without_a_compiler_raises_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extension, "_LOADED", None)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler found"):
        extension.load()


def _fake_bin(tmp_path: Path, with_ninja: bool) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    if with_ninja:
        ninja = folder / "ninja"
        ninja.write_text("#!/bin/sh\necho 1.13.0\n")
        ninja.chmod(ninja.stat().st_mode | stat.S_IEXEC)
    return folder


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX executables")
def test_ensure_ninja_adds_the_interpreters_bin(tmp_path, monkeypatch) -> None:
    folder = _fake_bin(tmp_path, with_ninja=True)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(folder / "python"))
    assert extension.ensure_ninja() == str(folder / "ninja")
    assert os.environ["PATH"].split(os.pathsep)[0] == str(folder)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX executables")
def test_ensure_ninja_raises_clearly_without_ninja(tmp_path, monkeypatch) -> None:
    folder = _fake_bin(tmp_path, with_ninja=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(folder / "python"))
    with pytest.raises(RuntimeError, match="ninja is needed"):
        extension.ensure_ninja()


def test_build_directory_follows_torch_extensions_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extension.build_directory() == tmp_path / "convlab_ext"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert extension.build_directory().name == "convlab_ext"
    assert extension.build_directory().parent.name.startswith(f"py{sys.version_info.major}")


# --- CUDA: the same ops dispatch to the CUDA kernels (cuDNN where it applies) --------------


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(CONFIGS))
def test_convolution_backward_on_cuda_matches_aten(ext, name: str) -> None:
    go, x, w, args = make_case(CONFIGS[name], device="cuda")
    mask = [True, True, True]
    ours = ext.convolution_backward(go, x, w, *args, mask)
    assert all(t.device.type == "cuda" for t in ours)
    aten = torch.ops.aten.convolution_backward(go, x, w, *args, mask)
    # cuDNN may pick non-deterministic algorithms (atomics in grad_weight): the two calls can
    # differ in the last bits, so compare with a float64 tolerance instead of bit equality.
    assert_grads(ours, aten, mask, **TIGHT)
    cpu = reference.convolution_backward(go.cpu(), x.cpu(), w.cpu(), *args, mask)
    assert_grads(tuple(t.cpu() for t in ours), cpu, mask, **TIGHT)


@pytest.mark.cuda
def test_convolution_backward_on_cuda_float32_cudnn(ext) -> None:
    go, x, w, args = make_case(CONFIGS["2d-stride-dilation"], device="cuda", dtype=torch.float32)
    mask = [True, True, True]
    old = torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = True, False
    try:
        ours = ext.convolution_backward(go, x, w, *args, mask)
        aten = torch.ops.aten.convolution_backward(go, x, w, *args, mask)
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = old
    assert_grads(ours, aten, mask, **EXACT)


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(SLOW))
def test_slow_conv2d_backward_out_on_cuda(ext, name: str) -> None:
    go, x, w, k, s, p = slow_case(name, device="cuda")
    bufs = (torch.empty_like(x), torch.empty_like(w), torch.empty(w.shape[0], dtype=F64,
                                                                    device="cuda"))
    ptrs = [b.data_ptr() for b in bufs]
    out = ext.slow_conv2d_backward_out(*bufs, go, x, w, k, s, p)
    assert [b.data_ptr() for b in out] == ptrs
    ref = reference.convolution_backward(go.cpu(), x.cpu(), w.cpu(), None, s, p, 1, False, 0, 1,
                                         [True] * 3)
    assert_grads(tuple(t.cpu() for t in out), ref, [True] * 3, **TIGHT)
