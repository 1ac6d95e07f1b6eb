"""convlab.aten.kernels: each CPU backend's backward enters its expected C++ kernel (under gdb)."""

from __future__ import annotations

import shutil
import time
from types import SimpleNamespace

import pytest
import torch

from convlab.aten import kernels
from convlab.aten.backends import available_backends
from convlab.aten.kernels import (
    CPU_CASES,
    EXPECTED_CPU_KERNEL,
    ConvCase,
    KernelTrace,
    trace_kernels,
)
from convlab.cli import trace as trace_cli

needs_gdb = pytest.mark.skipif(
    shutil.which("gdb") is None and shutil.which("cuda-gdb") is None,
    reason="gdb is not installed (make test installs it)",
)


def _selectable() -> list[str]:
    names = [n for n in CPU_CASES if n not in {"Mkldnn", "MkldnnTranspose", "NnpackSpatial"}]
    if "mkldnn" in available_backends("cpu"):
        names += ["Mkldnn", "MkldnnTranspose"]
    if "nnpack" in available_backends("cpu"):
        names.append("NnpackSpatial")
    return names


@pytest.fixture(scope="module")
def traces() -> dict[str, KernelTrace]:
    names = _selectable()
    start = time.perf_counter()
    result = trace_kernels([CPU_CASES[n] for n in names])
    # Reported, not asserted (no timing assertions): one session traces every case.
    print(f"\nkernel trace of {len(names)} cases: {time.perf_counter() - start:.1f} s")
    return dict(zip(names, result, strict=True))


@needs_gdb
@pytest.mark.parametrize("name", list(CPU_CASES))
def test_backend_hits_expected_kernel(traces: dict[str, KernelTrace], name: str) -> None:
    if name not in traces:
        pytest.skip(f"{name} is not selectable in this build")
    trace = traces[name]
    assert trace.backend == name, "the case no longer selects the backend it is named for"
    assert trace.calls[0] == "convolution_backward"
    assert trace.kernel == EXPECTED_CPU_KERNEL[name], trace.path


@needs_gdb
def test_nnpack_backward_is_not_nnpack(traces: dict[str, KernelTrace]) -> None:
    if "NnpackSpatial" not in traces:
        pytest.skip("NNPACK is not available in this build")
    assert not any("nnpack" in c for c in traces["NnpackSpatial"].calls)
    assert traces["NnpackSpatial"].kernel == traces["SlowDilated2d"].kernel


@needs_gdb
def test_empty_batch_runs_no_kernel(traces: dict[str, KernelTrace]) -> None:
    assert traces["Empty"].calls == ["convolution_backward"]


def test_case_validation() -> None:
    with pytest.raises(ValueError, match="input_shape"):
        ConvCase("bad", (1, 2, 3), (1, 2, 3))
    with pytest.raises(ValueError, match="dtype"):
        ConvCase("bad", (1, 2, 3, 3), (1, 2, 3, 3), dtype="floaty")
    with pytest.raises(ValueError, match="disable"):
        ConvCase("bad", (1, 2, 3, 3), (1, 2, 3, 3), disable=("cudnn",))
    with pytest.raises(ValueError, match="at least one"):
        trace_kernels([])
    with pytest.raises(TypeError, match="ConvCase"):
        trace_kernels(["Slow2d"])  # type: ignore[list-item]


def test_missing_gdb_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install"):
        trace_kernels([CPU_CASES["Slow2d"]])


def test_refused_ptrace_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "ptrace_refusal", lambda: "ptrace_scope is 3")
    with pytest.raises(RuntimeError, match="ptrace"):
        trace_kernels([CPU_CASES["Slow2d"]], debugger="/bin/false")


def test_split_log_rejects_a_truncated_log() -> None:
    log = "@@MARK\n@@K convolution_backward\n@@K convolution_backward\n@@MARK\n@@MARK\n"
    with pytest.raises(RuntimeError, match="expected 2"):
        kernels._split_log(log, 2)
    assert kernels._split_log(log + "@@MARK\n", 2) == [["convolution_backward"], []]


def test_case_from_cli_args() -> None:
    args = SimpleNamespace(
        input=[2, 3, 8, 8], weight=[4, 3, 3, 3], stride=[1], padding=[0, 0], dilation=[2],
        transposed=False, groups=1, no_bias=False, dtype=torch.float64, device="cpu",
        backend="nnpack",
    )
    case = trace_cli.case_from_args(args)
    assert case.dilation == 2 and case.dtype == "float64" and case.disable == ("mkldnn",)
    args.stride = [1, 2]
    with pytest.raises(ValueError, match="--stride"):
        trace_cli.case_from_args(args)


def test_nm_finds_every_cpu_kernel() -> None:
    if shutil.which("nm") is None:
        pytest.skip("binutils' nm is not installed (tracing then sets breakpoints by name)")
    lib = kernels._torch_libs()["libtorch_cpu"]
    found = {short for _, short in kernels.symbol_offsets(lib, kernels.CPU_KERNELS)}
    assert found == {short for _, short in kernels.CPU_KERNELS}


def test_mangled_prefix_matches_only_the_named_function() -> None:
    pattern = kernels._mangled_prefix("at::native::convolution_backward")
    assert pattern.match("_ZN2at6native20convolution_backwardERKNS_6TensorE")
    assert not pattern.match("_ZN2at6native20convolution_backwardERKNS_6TensorE.cold")
    assert not pattern.match("_ZN2at6native31convolution_backward_overrideableE")
    anon = kernels._mangled_prefix("at::native::(anonymous namespace)::mkldnn_x")
    assert anon.match("_ZN2at6native12_GLOBAL__N_18mkldnn_xEv")


def test_falls_back_to_names_without_nm(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    def no_nm(*args: object) -> list[tuple[int, str]]:
        raise RuntimeError("nm (binutils) is not installed")

    monkeypatch.setattr(kernels, "symbol_offsets", no_nm)
    script = kernels._trace_script(tmp_path, kernels._torch_libs(), kernels.CPU_KERNELS)
    assert "break 'at::native::(anonymous namespace)::mkldnn_convolution_backward'" in script
    assert "python" not in script.splitlines()


@pytest.mark.parametrize("kwargs, match", [
    (dict(stride=0), "stride"),
    (dict(padding=-1), "padding"),
    (dict(weight_shape=(4, 2, 3, 3)), "channels"),
    (dict(dtype="int32"), "floating"),
    (dict(dtype="nonsense"), "dtype"),
    (dict(groups=0), "groups"),
])
def test_conv_case_validates_before_a_debugger_starts(kwargs, match) -> None:
    base = dict(label="x", input_shape=(2, 3, 8, 8), weight_shape=(4, 3, 3, 3))
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        ConvCase(**{**base, **kwargs})
    assert time.perf_counter() - start < 1.0  # rejected at once, no gdb run


def test_trace_kernels_rejects_bad_timeout_and_debugger() -> None:
    case = CPU_CASES["Slow2d"]
    for timeout in (0, -1, float("nan"), True):
        with pytest.raises(ValueError, match="timeout"):
            trace_kernels([case], timeout=timeout)
    with pytest.raises(ValueError, match="debugger"):
        trace_kernels([case], debugger="/no/such/gdb")


def test_cli_args_keep_output_padding_and_channels_last() -> None:
    args = SimpleNamespace(
        input=[2, 4, 5, 5], weight=[4, 3, 3, 3], stride=[2], padding=[1], dilation=[1],
        output_padding=[1], transposed=True, groups=1, no_bias=True, dtype=torch.float32,
        device="cpu", backend=None, channels_last=True,
    )
    case = trace_cli.case_from_args(args)
    assert case.output_padding == 1 and case.channels_last and case.transposed


@pytest.mark.slow
def test_traced_case_uses_output_padding_and_channels_last() -> None:
    if kernels.ptrace_refusal() or shutil.which("gdb") is None:
        pytest.skip("needs gdb and ptrace")
    case = ConvCase("t", (2, 4, 5, 5), (4, 3, 3, 3), dtype="float64", stride=2,
                    transposed=True, output_padding=1, channels_last=True)
    (trace,) = trace_kernels([case])
    assert trace.backend == "SlowTranspose2d"
    assert trace.kernel == "slow_conv_transpose2d_backward_cpu"


def test_backward_kernel_map_labels_what_was_traced() -> None:
    assert kernels.backward_kernel("Slow2d", "cpu") == ("slow_conv2d_backward_cpu", True)
    name, checked = kernels.backward_kernel("Cudnn", "cuda")
    assert name == "cudnn_convolution_backward" and not checked
    assert "raises" in kernels.backward_kernel("Xnnpack2d", "cpu")[0]
