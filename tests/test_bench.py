"""convlab.bench: runs on tiny layers, writes valid CSV/JSON, counts FLOPs and memory honestly.

No timing assertions: only the bookkeeping around the timings is checked.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from convlab import bench
from convlab.bench import Layer, Result

TINY = Layer("tiny", (2, 3, 9, 8), (4, 3, 3, 3), stride=2, padding=1)
TINY_T = Layer("tiny_t", (2, 4, 5, 5), (4, 3, 3, 3), stride=2, padding=1, transposed=True,
               output_padding=1)
FAST = {"rounds": 1, "min_run_time": 0.002, "threads": 2}


@pytest.fixture(scope="module")
def report() -> bench.Report:
    """One run of every path and pass on two tiny layers, memory included."""
    return bench.benchmark([TINY, TINY_T], device="cpu", **FAST)


def test_every_applicable_path_and_pass_is_timed(report: bench.Report) -> None:
    got = {(r.layer, r.path, r.pass_) for r in report.results}
    tiny_paths = ["native", "mkldnn", "slow", "thnn", "reference", "numpy_ref"]
    want = {("tiny", p, s) for p in tiny_paths for s in bench.PASSES}
    # transposed: no THNN (2-d plain only) and no NumPy transposed conv
    want |= {("tiny_t", p, s) for p in ["native", "mkldnn", "slow", "reference"]
             for s in bench.PASSES}
    assert got == want
    skipped = {(s.layer, s.path) for s in report.skipped}
    assert skipped == {("tiny", "cudnn"), ("tiny_t", "cudnn"), ("tiny_t", "thnn"),
                       ("tiny_t", "numpy_ref")}
    assert all(s.reason for s in report.skipped)


def test_backend_column_names_the_aten_backend(report: bench.Report) -> None:
    backends = {(r.layer, r.path): r.backend for r in report.results}
    assert backends[("tiny", "native")] == "Mkldnn"
    assert backends[("tiny", "slow")] == "Slow2d"
    assert backends[("tiny_t", "slow")] == "SlowTranspose2d"
    assert backends[("tiny_t", "mkldnn")] == "MkldnnTranspose"
    assert backends[("tiny", "reference")] == "-"


def test_flop_formula_by_hand() -> None:
    # resnet56: N=8, C_in=C_out=64, 56x56 output ('same' 3x3), 3x3 kernel
    layer = bench.suite_layers(["resnet56"])[0]
    macs = 8 * 64 * 56 * 56 * 64 * 3 * 3
    assert layer.macs == macs == 924_844_032
    assert bench._flops(layer, "forward") == 2 * macs
    assert bench._flops(layer, "backward_input") == 2 * macs
    assert bench._flops(layer, "backward_weight") == 2 * macs
    assert bench._flops(layer, "backward") == 4 * macs
    # transposed: every input pixel scatters C_out/groups * k*k products
    t = bench.suite_layers(["transposed"])[0]
    assert t.macs == 8 * 64 * 14 * 14 * 32 * 4 * 4
    # depthwise: each output channel sees one input channel, so C_in/groups = 1
    d = bench.suite_layers(["depthwise"])[0]
    assert d.macs == 8 * 128 * 28 * 28 * 1 * 3 * 3


@st.composite
def layers(draw: st.DrawFn) -> Layer:
    dim = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 3))
    c_in, c_out = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    transposed = draw(st.booleans())
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    spatial = tuple(draw(st.integers(3, 7)) for _ in range(dim))
    weight = (c_in, c_out // groups) if transposed else (c_out, c_in // groups)
    layer = Layer(
        "h", (draw(st.integers(1, 3)), c_in, *spatial), (*weight, *kernel), stride=stride,
        padding=draw(st.integers(0, 2)), dilation=dilation, transposed=transposed,
        output_padding=draw(st.integers(0, max(stride, dilation) - 1)) if transposed else 0,
        groups=groups,
    )
    try:
        layer.params  # noqa: B018 - keep only valid configurations
    except ValueError:
        assume(False)
    return layer


def _counted(op, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        op(*args)
    return counter.get_total_flops()


@given(layers())
def test_flops_agree_with_torch_flop_counter(layer: Layer) -> None:
    x = torch.empty(layer.input_shape, device="meta")
    w = torch.empty(layer.weight_shape, device="meta")
    go = torch.empty(layer.output_shape, device="meta")
    args = layer.args()
    assert bench._flops(layer, "forward") == _counted(torch.ops.aten.convolution, x, w, None, *args)
    backward = torch.ops.aten.convolution_backward
    assert bench._flops(layer, "backward_input") == _counted(
        backward, go, x, w, None, *args, [True, False, False])
    # torch's counter ignores `groups` for grad_weight (it counts it as an ungrouped conv), so
    # it is only an independent check for groups == 1; grouped layers are counted by hand above.
    if layer.groups == 1:
        assert bench._flops(layer, "backward_weight") == _counted(
            backward, go, x, w, None, *args, [False, True, False])
        assert bench._flops(layer, "backward") == _counted(
            backward, go, x, w, None, *args, [True, True, False])


def test_flops_and_rates_in_results(report: bench.Report) -> None:
    tiny_macs = 2 * 4 * 5 * 4 * 3 * 3 * 3  # N * C_out * H_out * W_out * C_in * kh * kw
    for r in report.results:
        if r.layer == "tiny":
            assert r.flops == (4 if r.pass_ == "backward" else 2) * tiny_macs
        assert r.time_ms > 0 and r.round_spread >= 0
        assert r.gflops == pytest.approx(r.flops / (r.time_ms * 1e-3) / 1e9, rel=1e-12)
        assert r.ratio_gemm == pytest.approx(r.gemm_gflops / r.gflops, rel=1e-12)
        assert r.threads == 2 and r.dtype == "float32" and r.device == "cpu"


def test_ratio_to_fastest_native(report: bench.Report) -> None:
    for layer in ("tiny", "tiny_t"):
        for pass_ in bench.PASSES:
            rows = [r for r in report.results if (r.layer, r.pass_) == (layer, pass_)]
            native = [r for r in rows if r.path in bench.NATIVE_PATHS]
            fastest = min(r.time_ms for r in native)
            assert min(r.ratio_native for r in native) == 1.0
            for r in rows:
                assert r.ratio_native == pytest.approx(r.time_ms / fastest, rel=1e-12)


def test_memory_columns_see_the_outputs(report: bench.Report) -> None:
    """Every backward allocates at least its outputs; both measurements must see them."""
    for r in report.results:
        if r.pass_ != "backward" or r.layer != "tiny":
            continue
        out_bytes = 4 * (2 * 3 * 9 * 8 + 4 * 3 * 3 * 3 + 4)  # grad_input, grad_weight, grad_bias
        # torch paths: the profiler sees torch's allocator; numpy_ref: tracemalloc sees NumPy
        assert r.mem_alloc_mb * bench.MB >= out_bytes, r.path
        if sys.platform.startswith("linux"):
            assert r.mem_rss_mb >= 0


def test_alloc_peak_measures_torch_and_numpy() -> None:
    cpu = torch.device("cpu")
    peak = bench._alloc_peak(lambda: torch.empty(2**20), cpu)  # 4 MiB
    assert 4 * bench.MB <= peak < 4.5 * bench.MB
    peak = bench._alloc_peak(lambda: np.ones(2**20), cpu)  # 8 MiB of float64
    assert 8 * bench.MB <= peak < 8.5 * bench.MB

    def temporary() -> torch.Tensor:  # 16 MiB live at the peak, freed before returning
        big = torch.ones(2**22)
        return big.sum()

    assert bench._alloc_peak(temporary, cpu) >= 16 * bench.MB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS high-water mark is Linux")
def test_rss_peak_sees_touched_pages() -> None:
    peak = bench._rss_peak(lambda: torch.ones(2**22), torch.device("cpu"))  # 16 MiB touched
    assert peak >= 12 * bench.MB


def test_csv_and_json_are_written(report: bench.Report, tmp_path) -> None:
    csv_path, json_path = bench.write(report, tmp_path / "out")
    rows = bench.read_csv(csv_path)
    assert list(rows[0]) == list(bench.COLUMNS)
    assert len(rows) == len(report.results)
    for row, res in zip(rows, report.results, strict=True):
        assert (row["layer"], row["path"], row["pass"]) == (res.layer, res.path, res.pass_)
        assert float(row["time_ms"]) == pytest.approx(res.time_ms)
        assert int(row["flops"]) == res.flops
    data = json.loads(json_path.read_text())
    assert set(data) == {"meta", "columns", "results", "skipped", "targets"}
    assert data["columns"] == list(bench.COLUMNS)
    assert len(data["results"]) == len(report.results)
    assert data["meta"]["threads"] == 2 and "flops = 2 * MACs" in data["meta"]["flop_formula"]
    assert [t["name"] for t in data["targets"]] == [t.name for t in bench.targets(report.results)]
    assert {tuple(s.values()) for s in data["skipped"]} == {
        (s.layer, s.path, s.reason) for s in report.skipped
    }


def test_filters_select_paths_and_passes() -> None:
    results = bench.run([TINY], paths=["reference", "slow"], passes=["backward_input"],
                        memory=False, gemm=False, **FAST)
    assert sorted((r.path, r.pass_) for r in results) == [
        ("reference", "backward_input"), ("slow", "backward_input")
    ]
    assert all(math.isnan(r.ratio_gemm) and math.isnan(r.mem_alloc_mb) for r in results)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": ["nope"]}, r"layers: unknown layer name\(s\) 'nope'; choose from resnet56"),
        ({"paths": ["native", "fast"]}, r"paths: unknown name\(s\) 'fast'"),
        ({"passes": ["backwards"]}, r"passes: unknown name\(s\) 'backwards'"),
        ({"threads": 0}, r"threads must be a positive int"),
        ({"rounds": 0}, r"rounds must be a positive int"),
        ({"layers": [Layer("bad", (2, 3, 8, 8), (4, 2, 3, 3))]}, r"weight of shape"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench.run(**{"layers": [TINY], **kwargs, "memory": False})


def test_suite_layers_match_torch_shapes() -> None:
    for layer in bench.SUITE:
        x = torch.empty(layer.input_shape, device="meta")
        w = torch.empty(layer.weight_shape, device="meta")
        y = torch.ops.aten.convolution(x, w, None, *layer.args())
        assert tuple(y.shape) == layer.output_shape, layer.name
    assert bench.suite_layers(["cifar5"])[0].output_shape == (32, 16, 32, 32)  # 'same'
    assert set(bench.QUICK_LAYERS) <= {layer.name for layer in bench.SUITE}


def _result(layer: str, path: str, ms: float, ratio_native: float = math.nan) -> Result:
    return Result(layer, path, "backward", "-", "cpu", "float32", 2, ms, 0.0, 1, 1.0,
                  ratio_native=ratio_native)


def test_targets_pass_and_miss() -> None:
    results = [
        _result("a", "slow", 10.0, 1.0), _result("a", "thnn", 12.0),
        _result("a", "reference", 30.0, 3.0), _result("a", "numpy_ref", 20.0),
        _result("b", "slow", 10.0, 1.0), _result("b", "thnn", 13.0),
        _result("b", "reference", 15.0, 1.5),
    ]
    thnn_t, ref_t, np_t = bench.targets(results)
    assert thnn_t.ratios == {"a": 1.2, "b": 1.3} and thnn_t.status == "miss"
    assert thnn_t.worst == 1.3 and thnn_t.geomean == pytest.approx(math.sqrt(1.2 * 1.3))
    assert ref_t.ratios == {"a": 3.0, "b": 1.5} and ref_t.status == "miss"
    assert np_t.ratios == {"a": 2.0} and np_t.status == "pass"
    assert "not measured" in bench.Target("x", 1.0, {}).line()


def test_cli_writes_results_and_prints_targets(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    code = bench.main(["--layers", "conv1d", "--paths", "native,reference", "--passes",
                       "backward", "--rounds", "1", "--min-run-time", "0.002", "--threads", "2",
                       "--no-memory", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "threads 2" in text and "DESIGN targets" in text
    assert "reference.convolution_backward / fastest native" in text
    rows = bench.read_csv(out / "bench.csv")
    assert [(r["layer"], r["path"], r["pass"]) for r in rows] == [
        ("conv1d", "native", "backward"), ("conv1d", "reference", "backward")
    ]
    assert json.loads((out / "bench.json").read_text())["meta"]["rounds"] == 1


def test_cli_bad_layer_name_is_a_clear_error(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--layers", "resnet56,resnet99", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown layer name(s) 'resnet99'" in err and "resnet56" in err
    assert not list(tmp_path.iterdir())


def test_cli_list(capsys) -> None:
    assert bench.main(["--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [layer.name for layer in bench.SUITE]


def test_profile_ops_and_onednn_trace_keep_c_output_quiet(capfd) -> None:
    x, w, b, go = TINY.tensors(torch.device("cpu"), torch.float32)
    args = TINY.args()

    def backward() -> object:
        return torch.ops.aten.convolution_backward(go, x, w, [4], *args, [True, True, True])

    ops = bench.profile_ops(backward, top=3)
    assert ops[0].name.startswith("aten::") and ops[0].calls >= 1
    assert sum(o.share for o in ops) <= 1.0 + 1e-9
    calls = bench.onednn_trace(backward)  # float32 tiny conv: ATen picks oneDNN
    props = {c.prop for c in calls if c.op == "convolution"}
    assert props == {"backward_data", "backward_weights"}
    assert all(c.ms >= 0 for c in calls)
    torch.backends.mkldnn.enabled = False
    try:
        assert bench.onednn_trace(backward) == []  # the slow path runs no oneDNN primitive
    finally:
        torch.backends.mkldnn.enabled = True
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
