"""Chapters 11-13 beyond nbval: the calling contract's clauses, the cookbook's placeholder
calls, and the bug repros of chapter 13 as standalone programs (``scripts/old_torch_runs.py``
runs them with another torch).

The contract tests state what holds on every backend and CPU (requested slots are right,
the bias rule, ``out=`` writing into the caller's storage); the backend-specific
observations of the chapters (oneDNN's extra ``grad_weight``) are printed there, not
asserted here. A repro's verdict depends on the torch version and, for oneDNN, on the CPU,
so only its form is tested: it runs alone and prints one ``bug present:`` line.
"""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64
aten = torch.ops.aten


def _script():
    spec = importlib.util.spec_from_file_location(
        "old_torch_runs", ROOT / "scripts" / "old_torch_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _conv(dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 9, generator=g, dtype=dtype)
    w = torch.randn(6, 2, 3, 3, generator=g, dtype=dtype)
    go = torch.randn(2, 6, 4, 4, generator=g, dtype=dtype)
    args = ([2, 2], [1, 1], [2, 2], False, [0, 0], 2)
    return x, w, go, args


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=3)))
def test_every_requested_slot_is_defined_and_right(dtype, mask) -> None:
    x, w, go, args = _conv(dtype)
    want = aten.convolution_backward(go.double(), x.double(), w.double(), [6],
                                     *args, [True] * 3)
    got = aten.convolution_backward(go, x, w, [6], *args, list(mask))
    # float32 against the float64 result: sums of ~20 products of size ~1
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    for asked, g, r in zip(mask, got, want, strict=True):
        if asked:
            assert g is not None
            torch.testing.assert_close(g.double(), r, rtol=0, atol=tol)


@pytest.mark.parametrize("groups", [1, 2])
def test_transposed_bias_sizes_is_weight_dim1_times_groups(groups: int) -> None:
    x = torch.randn(2, 4, 5, 5, dtype=F64)
    w = torch.randn(4, 3, 3, 3, dtype=F64)
    b = torch.zeros(w.shape[1] * groups, dtype=F64, requires_grad=True)
    y = F.conv_transpose2d(x, w, b, groups=groups)
    assert list(y.grad_fn._saved_bias_sym_sizes_opt) == [w.shape[1] * groups]
    assert y.shape[1] == w.shape[1] * groups


def test_empty_batch_grad_bias_takes_the_shape_of_bias_sizes() -> None:
    x, w = torch.randn(0, 3, 8, 8), torch.randn(4, 3, 3, 3)
    go = torch.randn(0, 4, 6, 6)
    conv = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    for sizes in ([4], [5]):
        gb = aten.convolution_backward(go, x, w, sizes, *conv, [True] * 3)[2]
        assert list(gb.shape) == sizes


def test_out_overload_writes_into_the_callers_storage() -> None:
    x, w, go, args = _conv(F64)
    mine = [torch.empty(0, dtype=F64) for _ in range(3)]
    outs = dict(out0=mine[0], out1=mine[1], out2=mine[2])
    aten.convolution_backward.out(go, x, w, [6], *args, [True] * 3, **outs)
    ptrs = [t.data_ptr() for t in mine]
    result = aten.convolution_backward.out(go, x, w, [6], *args, [True] * 3, **outs)
    assert all(r is m for r, m in zip(result, mine, strict=True))
    assert [t.data_ptr() for t in mine] == ptrs
    want = aten.convolution_backward(go, x, w, [6], *args, [True] * 3)
    for got, ref in zip(mine, want, strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("transposed", [False, True])
def test_placeholder_weight_gives_autograds_grad_weight(transposed: bool) -> None:
    """The cookbook's replacement for ``cudnn_convolution{,_transpose}_backward_weight``."""
    x = torch.randn(2, 4, 5, 5, dtype=F64)
    w = torch.randn(4, 3, 3, 3, dtype=F64, requires_grad=True)
    if not transposed:
        w = torch.randn(6, 2, 3, 3, dtype=F64, requires_grad=True)
    conf = dict(stride=2, padding=1, groups=2)
    fwd = F.conv_transpose2d if transposed else F.conv2d
    extra = dict(output_padding=1) if transposed else {}
    y = fwd(x, w, None, **conf, **extra)
    go = torch.randn_like(y)
    placeholder = x.new_empty(1).expand(w.shape)
    assert placeholder.untyped_storage().nbytes() == x.element_size()
    got = aten.convolution_backward(
        go, x, placeholder, None, [2, 2], [1, 1], [1, 1], transposed,
        [1, 1] if transposed else [0, 0], 2, [False, True, False])[1]
    torch.testing.assert_close(got, torch.autograd.grad(y, w, go)[0], rtol=0, atol=1e-12)


def test_the_removed_operators_stay_removed() -> None:
    """Chapter 12 prints these errors; on a torch that brings one back it must change."""
    for name in ("cudnn_convolution_backward_weight", "mkldnn_convolution_backward",
                 "thnn_conv2d_backward"):
        assert not hasattr(aten, name), name


def test_chapter_13_has_its_repros() -> None:
    names = set(_script().repros())
    assert {"onednn_odd_stride_weight", "slow_mixed_layout_grad_weight",
            "empty_batch_bias_sizes_abort", "flop_counter_grouped_grad_weight"} <= names
    nb = nbformat.read(ROOT / "book" / "13_bugs_found.ipynb", as_version=4)
    for cell in nb.cells:
        if "repro" in cell.metadata:
            assert cell.execution_count is not None
            text = "".join(o.get("text", "") for o in cell.outputs)
            assert "bug present: " in text, cell.metadata["repro"]


def test_repros_run_alone_and_print_a_verdict() -> None:
    """Each repro is a whole program: run by itself it prints one verdict line."""
    script = _script()
    for name, source in script.repros().items():
        line = script.run(sys.executable, source, timeout=300)
        assert line in ("bug present: True", "bug present: False"), (name, line)


def test_old_torch_runs_refuses_a_missing_interpreter(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "old_torch_runs.py"),
         str(tmp_path / "no-python")], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    # the one line, and nothing else (importing the script imports no cpp_extension, whose
    # warning a CUDA wheel without a GPU prints: tests/test_imports.py)
    assert done.stderr.splitlines() == [
        f"old_torch_runs: error: no interpreter at {tmp_path / 'no-python'}"]


@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=3)))
def test_the_meta_kernel_follows_the_mask_exactly(mask) -> None:
    """Chapter 11's contract: a result if and only if asked for, as the meta kernel
    (FakeTensor, torch.compile) has it; eager oneDNN's extra slot is chapter 13's bug."""
    x, w, go, args = (t.to("meta") if isinstance(t, torch.Tensor) else t
                      for t in _conv(torch.float32))
    got = aten.convolution_backward(go, x, w, [6], *args, list(mask))
    assert [g is not None for g in got] == list(mask)


def test_cudnn_flags_turn_cudnn_off_unless_enabled_is_given() -> None:
    """Chapter 12's advice spells ``enabled=True`` because the default is False."""
    before = torch.backends.cudnn.enabled
    with torch.backends.cudnn.flags(benchmark=True, deterministic=True, allow_tf32=False):
        assert torch.backends.cudnn.enabled is False
    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        assert torch.backends.cudnn.enabled is True
    assert torch.backends.cudnn.enabled == before


def test_size1_stride_splits_the_two_layout_tests() -> None:
    """Chapter 13's shared cause: ``is_contiguous(channels_last)`` skips a size-1
    dimension's stride, ``suggest_memory_format`` reads it; ``.to`` re-strides."""
    from torch._prims_common import suggest_memory_format

    cl = torch.channels_last
    w = torch.randn(4, 3, 2).unsqueeze(-1).permute(0, 2, 3, 1)  # no as_strided
    assert w.stride() == (6, 1, 1, 2)
    assert w.is_contiguous(memory_format=cl)
    assert suggest_memory_format(w) == torch.contiguous_format
    assert w.contiguous(memory_format=cl).stride() == (6, 1, 1, 2)
    assert w.to(memory_format=cl).stride() == (6, 1, 6, 2)


def test_opacus_zero_padding_is_exact_and_padding_mode_is_lost() -> None:
    """Chapter 13's Opacus section: per-sample weight gradients against torch.func.
    If Opacus learns ``padding_mode``, the chapter's section must change."""
    pytest.importorskip("opacus")
    import copy
    import warnings

    from opacus import GradSampleModule
    from torch.func import functional_call, grad, vmap

    def error(mode: str) -> float:
        torch.manual_seed(0)
        layer = torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode).double()
        xs = torch.randn(3, 2, 5, 5, dtype=F64)
        plain = copy.deepcopy(layer)
        params = {k: v.detach() for k, v in plain.named_parameters()}
        want = vmap(grad(lambda p, xi: functional_call(plain, p, (xi[None],)).sum()),
                    in_dims=(None, 0))(params, xs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = GradSampleModule(layer, loss_reduction="sum")
            model(xs).sum().backward()
        return (layer.weight.grad_sample - want["weight"]).abs().max().item()

    assert error("zeros") < 1e-12
    assert error("reflect") > 1e-3
