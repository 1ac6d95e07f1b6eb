"""convlab.aten.explain and ``convlab explain``: the three worked cases, flips, buffers,
labels for devices not here, bad input."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from convlab.aten import explain as ex
from convlab.aten.conv_query import ConvQuery, Environment
from convlab.cli import main as cli_main


def env(**kw) -> Environment:
    return ex.replace(Environment.current(), **kw)


def test_issue_27974_layer_runs_onednn_both_ways() -> None:
    q = ConvQuery.create([32, 8, 32, 32], [8, 8, 5, 5], padding=2)
    e = ex.explain(q)
    assert e.forward.backend == e.backward.backend == e.aten.backend == "Mkldnn"
    assert e.kernel == "mkldnn_convolution_backward" and e.kernel_checked
    assert e.autograd_node == "ConvolutionBackward0"
    assert any(f.change.startswith("torch.backends.mkldnn.enabled off") for f in e.flips)


def test_issue_67797_layer_flips_with_threads() -> None:
    q = ConvQuery.create([1, 64, 1000, 15], [128, 64, 1, 1])
    one, two = ex.explain(q, env(threads=1)), ex.explain(q, env(threads=2))
    assert (one.forward.backend, two.forward.backend) == ("Slow2d", "Mkldnn")
    assert one.flips[0].line() == "torch.set_num_threads(2) instead of 1 -> Mkldnn"
    assert one.buffers[0].name == "columns"


def test_issue_38057_grad_weight_goes_through_the_same_selection() -> None:
    q = ConvQuery.create([8, 32, 28, 28], [32, 32, 3, 3], stride=2, padding=1)
    e = ex.explain(q)
    assert e.backward.backend == "Mkldnn"
    x, w = torch.randn(8, 32, 28, 28), torch.randn(32, 32, 3, 3)
    g = torch.randn(8, 32, 14, 14)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.nn.grad.conv2d_weight(x, w.shape, g, stride=2, padding=1)
    names = {e.name for e in prof.events()}
    assert "aten::convolution_backward" in names and "aten::mkldnn_convolution" not in names


def test_bf16_flip_follows_the_cpu_isa_check() -> None:
    q = ConvQuery.create([8, 3, 32, 32], [16, 3, 7, 7], stride=2, dtype=torch.bfloat16)
    e = ex.explain(q)
    if Environment.current().mkldnn_bf16:
        assert e.forward.backend == "Mkldnn"
    else:
        assert e.forward.backend == "Slow2d"
        assert any(f.line() == "float32 instead of bfloat16 -> Mkldnn" for f in e.flips)


def test_slow2d_columns_match_the_profiled_allocation() -> None:
    q = ConvQuery.create([4, 16, 32, 32], [8, 16, 3, 3], padding=1, dtype=torch.float64)
    (columns,) = [b for b in ex.explain(q).buffers if b.name == "columns"]
    x = torch.randn(4, 16, 32, 32, dtype=torch.float64)
    w = torch.randn(8, 16, 3, 3, dtype=torch.float64)
    g = torch.randn(4, 8, 32, 32, dtype=torch.float64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.ops.aten.convolution_backward(g, x, w, [0], [1, 1], [1, 1], [1, 1], False,
                                            [0, 0], 1, [True, True, False])
    biggest = max(e.cpu_memory_usage for e in prof.events() if e.name == "aten::empty")
    assert biggest == columns.megabytes * 1e6


def test_a_device_not_here_is_answered_from_the_rule() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    q = ConvQuery.create([8, 3, 224, 224], [64, 3, 7, 7], stride=2, padding=3,
                         dtype=torch.bfloat16, device="cuda", channels_last=True)
    e = ex.explain(q)
    assert e.aten.backend is None and not e.forward.checked_here
    assert e.forward.backend == "Cudnn" and e.backward.memory_format == "channels_last"
    assert "from source, not run" in ex.format_explanation(e)


def test_explain_rejects_a_non_query() -> None:
    with pytest.raises(TypeError, match="ConvQuery"):
        ex.explain([8, 3, 224, 224])


def test_cli_explain_prints_the_answer(capsys) -> None:
    rc = cli_main(["explain", "--input", "8,3,224,224", "--weight", "64,3,7,7", "--stride",
                   "2", "--padding", "3", "--dtype", "float64"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "forward backend:  Slow2d" in out and "float32 instead of float64 -> Mkldnn" in out
    assert "columns [8, 147, 12544] float64: 118.0 MB" in out
    assert "autograd node:    ConvolutionBackward0" in out


@pytest.mark.parametrize("argv", [
    ["--input", "1,2"],
    ["--input", "2,x"],
    ["--dtype", "int32"],
    ["--device", "tpu"],
    ["--groups", "3"],
    ["--stride", "0"],
    ["--padding", str(2**70)],
    ["--threads", "0"],
    ["--input", "1,3,8,8,8,8", "--weight", "4,3,3,3,3,3"],
    ["--input", "1,3,0,8"],
])
def test_cli_explain_bad_input_is_one_line_exit_2(argv, capsys) -> None:
    try:
        rc = cli_main(["explain", *argv])
    except SystemExit as stop:  # argparse's own usage errors
        rc = stop.code
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
