"""convlab.aten.dispatch: the op recorder, the profiler tree and the `convlab trace` command."""

from __future__ import annotations

import pytest
import torch

from convlab.aten import dispatch
from convlab.aten.backends import available_backends, select_backend
from convlab.aten.dispatch import (
    OpRecorder,
    format_rows,
    format_tree,
    make_conv,
    profile_conv,
    profile_op_tree,
    trace_conv,
)
from convlab.cli import main as cli_main
from convlab.cli import trace as trace_cli


@pytest.fixture(autouse=True)
def _flags_restored():
    before = (torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled())
    yield
    assert (torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled()) == before


def ops(rec: OpRecorder, phase: str) -> list[str]:
    return [r.op for r in rec.records if r.phase == phase]


def test_recorder_sees_convolution_and_its_backward_with_backends() -> None:
    conv = make_conv([2, 4, 9, 9], [6, 4, 3, 3], padding=1, dtype=torch.float64)
    rec = trace_conv(conv)
    assert ops(rec, "forward") == ["aten::convolution"]
    assert "aten::convolution_backward" in ops(rec, "backward")
    conv_records = [r for r in rec.records if r.backend is not None]
    assert [r.backend for r in conv_records] == ["Slow2d", "Slow2d"]
    fwd = conv_records[0]
    assert fwd.shapes == [(2, 4, 9, 9), (6, 4, 3, 3), (6,)]
    bwd = conv_records[1]
    assert bwd.shapes[:3] == [(2, 6, 9, 9), (2, 4, 9, 9), (6, 4, 3, 3)]
    assert all(r.backend is None for r in rec.records if "convolution" not in r.op)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(dilation=2, dtype=torch.float64), "SlowDilated2d"),
        (dict(transposed=True, stride=2, dtype=torch.float64), "SlowTranspose2d"),
        (dict(dtype=torch.float32), "Mkldnn"),
    ],
)
def test_recorded_backend_is_select_backend(kwargs, expected) -> None:
    if expected == "Mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this build")
    ws = [4, 6, 3, 3] if kwargs.get("transposed") else [6, 4, 3, 3]
    conv = make_conv([2, 4, 9, 9], ws, **kwargs)
    rec = trace_conv(conv)
    backends = [r.backend for r in rec.records if r.backend]
    assert backends == [expected, expected]
    assert select_backend(*conv.args()) == expected


def test_trace_under_a_forced_backend() -> None:
    conv = make_conv([2, 4, 9, 9], [6, 4, 3, 3], dtype=torch.float32)
    rec = trace_conv(conv, backend="slow")
    assert [r.backend for r in rec.records if r.backend] == ["Slow2d", "Slow2d"]
    with pytest.raises(ValueError, match="cannot serve"):
        trace_conv(make_conv([2, 4, 9, 9], [6, 4, 3, 3], dtype=torch.float64), backend="mkldnn")


def test_table_lists_every_record() -> None:
    conv = make_conv([1, 2, 5, 5], [3, 2, 3, 3], dtype=torch.float64)
    rec = trace_conv(conv)
    table = rec.table()
    lines = table.splitlines()
    assert lines[0].split() == ["#", "pass", "aten", "op", "backend", "tensor", "shapes"]
    kept = [r for r in rec.records if r.op != "aten::detach"]
    assert len(lines) == 2 + len(kept)
    assert "aten::convolution_backward  Slow2d" in table
    assert "[1,2,5,5] [3,2,3,3] [3]" in table


def test_format_table_aligns_columns() -> None:
    text = format_rows(["a", "bb"], [["xxx", "y"], ["z", "wwww"]])
    assert text.splitlines() == ["a    bb", "---  ----", "xxx  y", "z    wwww"]


def test_profiler_shows_the_nesting_below_convolution() -> None:
    conv = make_conv([2, 4, 9, 9], [6, 4, 3, 3], dtype=torch.float64)
    trees = profile_conv(conv)
    fwd = trees["forward"]
    assert fwd[:3] == [(0, "aten::conv2d"), (1, "aten::convolution"), (2, "aten::_convolution")]
    # selection itself asks the dispatcher whether NNPACK is usable, then runs the kernel
    assert (3, "aten::_nnpack_available") in fwd
    assert fwd.index((3, "aten::thnn_conv2d")) + 1 == fwd.index((4, "aten::_slow_conv2d_forward"))
    bwd = trees["backward"]
    names = [n for _, n in bwd]
    assert bwd[:2] == [(0, "ConvolutionBackward0"), (1, "aten::convolution_backward")]
    assert (2, "aten::_slow_conv2d_backward") in bwd
    assert (3, "aten::sum") in bwd  # grad_bias, inside the slow kernel
    assert not any("empty" in n or "AccumulateGrad" in n for n in names)


def test_profiler_backward_rereads_the_flags() -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this build")
    conv = make_conv([2, 4, 9, 9], [6, 4, 3, 3], dtype=torch.float32)
    fwd = profile_op_tree(conv.forward)
    assert (3, "aten::mkldnn_convolution") in fwd
    y = conv.forward()
    saved = torch.backends.mkldnn.enabled
    try:
        torch.backends.mkldnn.enabled = False
        bwd = profile_op_tree(lambda: y.backward(torch.ones_like(y)))
    finally:
        torch.backends.mkldnn.enabled = saved
    assert "aten::_slow_conv2d_backward" in [n for _, n in bwd]


def test_profile_ops_unhidden_keeps_allocations() -> None:
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    rows = profile_op_tree(lambda: torch.nn.functional.conv2d(x, w), hide=False)
    assert any(name == "aten::empty" for _, name in rows)
    assert format_tree([(0, "a"), (1, "b")]) == "a\n  b"


def test_profile_ops_writes_nothing_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    profile_op_tree(lambda: torch.nn.functional.conv2d(x, w))
    assert capfd.readouterr().err == ""


def test_make_conv_validates() -> None:
    with pytest.raises(ValueError, match="groups=3 must divide"):
        make_conv([2, 4, 9, 9], [6, 4, 3, 3], groups=3)
    with pytest.raises(ValueError, match="3, 4 or 5 dims"):
        make_conv([2, 4], [6, 4])
    conv = make_conv([2, 4, 9, 9], [6, 4, 3, 3], channels_last=True, bias=False)
    assert conv.input.is_contiguous(memory_format=torch.channels_last) and conv.bias is None


def test_cli_trace_prints_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["trace", "--input", "2,4,9,9", "--weight", "6,4,3,3", "--dtype", "float64",
                   "--dilation", "2", "--no-bias", "--profile"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "conv2d  input [2, 4, 9, 9]  weight [6, 4, 3, 3]  bias False  torch.float64" in out
    assert "aten::convolution           SlowDilated2d" in out
    assert "aten::convolution_backward  SlowDilated2d" in out
    assert "aten::slow_conv_dilated2d" in out  # from the profiler tree


def test_cli_trace_transposed_3d_and_forced(capsys: pytest.CaptureFixture[str]) -> None:
    rc = trace_cli.main(["--input", "1,2,4,4,4", "--weight", "2,3,2,2,2", "--transposed",
                        "--stride", "2", "--dtype", "float64", "--backend", "slow"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "conv_transpose3d" in out and "forced backend: slow" in out
    assert out.count("SlowTranspose3d") == 2


def test_cli_trace_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    rc = trace_cli.main(["--input", "2,4,9,9", "--weight", "6,4,3,3", "--groups", "3"])
    assert rc == 2
    assert "groups=3 must divide in_channels=4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        trace_cli.main(["--input", "2,x"])
    rc = trace_cli.main(["--input", "2,4,9,9", "--weight", "6,4,3,3", "--dtype", "float64",
                        "--backend", "mkldnn"])
    assert rc == 2 and "cannot serve" in capsys.readouterr().err


@pytest.mark.cuda
def test_cuda_trace_shows_cudnn(capsys: pytest.CaptureFixture[str]) -> None:
    rc = trace_cli.main(["--input", "2,4,9,9", "--weight", "6,4,3,3", "--device", "cuda"])
    out = capsys.readouterr().out
    assert rc == 0
    expect = "Cudnn" if "cudnn" in available_backends("cuda") else "Slow2d"
    assert out.count(expect) >= 2


@pytest.mark.parametrize("argv, match", [
    (["--device", "cuda"], "cuda"),  # D6: no traceback on a CPU-only build
    (["--input", "1,3,8,8,8,8", "--weight", "4,3,3,3,3,3"], "3, 4 or 5 dims"),  # D7
    (["--padding", str(2**70)], "padding"),  # D8: beyond int64
    (["--stride", str(2**63)], "stride"),
    (["--stride", "0"], "stride"),
])
def test_cli_trace_bad_input_is_one_line_exit_2(argv, match, capsys) -> None:
    if argv[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    rc = trace_cli.main(["--input", "1,3,8,8", "--weight", "4,3,3,3", *argv[:]] if
                        "--input" not in argv else argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and match in err and "Traceback" not in err


def test_make_conv_rejects_4d_spatial_and_non_float() -> None:
    with pytest.raises(ValueError, match="3, 4 or 5 dims"):
        make_conv([1, 3, 8, 8, 8, 8], [4, 3, 3, 3, 3, 3])
    with pytest.raises(TypeError, match="floating"):
        make_conv([1, 3, 8, 8], [4, 3, 3, 3], dtype=torch.int32)


def test_dispatch_does_not_import_the_lab() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(dispatch))
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in modules if m and m.startswith("convlab.lab")]


def test_profile_op_tree_is_safe_from_two_threads() -> None:
    import threading

    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    results, errors = [], []

    def work() -> None:
        try:
            for _ in range(3):
                results.append(profile_op_tree(lambda: torch.nn.functional.conv2d(x, w)))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6
    assert all(r[:2] == [(0, "aten::conv2d"), (1, "aten::convolution")] for r in results)
