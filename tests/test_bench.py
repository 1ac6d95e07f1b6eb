"""convlab.lab.bench and the `convlab bench` command: bookkeeping around the timings.

No timing assertions: tiny layers, one or two short rounds, and checks of what is
recorded (spreads, ratios, A/A pairs, files, errors), never of how fast anything is.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch

from convlab import cli
from convlab.lab import bench, bench_report, paths
from convlab.lab.bench_report import Report, Result
from convlab.lab.method import profiling
from convlab.lab.method.timing import Timing
from convlab.lab.paths import Layer

TINY = Layer("tiny", (2, 3, 9, 8), (4, 3, 3, 3), stride=2, padding=1)
TINY_T = Layer("tiny_t", (2, 4, 5, 5), (4, 3, 3, 3), stride=2, padding=1, transposed=True,
               output_padding=1)
FAST = {"rounds": 2, "min_run_time": 0.001, "threads": 1, "min_calls": 2}


@pytest.fixture(scope="module")
def report() -> Report:
    """One run of every path and pass on two tiny layers; memory for the backward only."""
    out = bench.benchmark([TINY, TINY_T], device="cpu", memory=False, **FAST)
    mem = bench.benchmark([TINY], device="cpu", passes=["backward"], gemm=False, **FAST)
    out.results += mem.results
    return out


def _main(report: Report) -> list[Result]:
    return [r for r in report.results if math.isnan(r.mem_alloc_mb)]


def test_every_applicable_path_and_pass_is_timed(report: Report) -> None:
    got = {(r.layer, r.path, r.pass_) for r in _main(report)}
    want = {("tiny", p, s) for p in ["native", "mkldnn", "slow", "thnn", "reference",
                                     "numpy_ref"] for s in paths.PASSES}
    want |= {("tiny_t", p, s) for p in ["native", "mkldnn", "slow", "reference"]
             for s in paths.PASSES}
    assert got == want
    skipped = {(s.layer, s.path) for s in report.skipped}
    assert skipped == {("tiny", "cudnn"), ("tiny_t", "cudnn"), ("tiny", "nnpack"),
                       ("tiny_t", "nnpack"), ("tiny_t", "thnn"), ("tiny_t", "numpy_ref")}
    assert all(s.reason for s in report.skipped)


def test_backend_column_names_the_aten_backend(report: Report) -> None:
    backends = {(r.layer, r.path): r.backend for r in _main(report)}
    assert backends[("tiny", "native")] == "Mkldnn"
    assert backends[("tiny", "slow")] == "Slow2d"
    assert backends[("tiny_t", "slow")] == "SlowTranspose2d"
    assert backends[("tiny_t", "mkldnn")] == "MkldnnTranspose"
    assert backends[("tiny", "reference")] == "-"


def test_spread_columns_come_from_the_rounds(report: Report) -> None:
    for r in _main(report):
        rounds = r.timing.rounds
        assert r.rounds == len(rounds) == 2 and r.calls_per_round >= 1
        assert r.min_ms == pytest.approx(min(rounds) * 1e3)
        assert r.max_ms == pytest.approx(max(rounds) * 1e3)
        assert r.min_ms <= r.q1_ms <= r.time_ms <= r.q3_ms <= r.max_ms
        assert r.round_spread == pytest.approx((r.max_ms - r.min_ms) / r.time_ms)
        assert r.gflops == pytest.approx(r.flops / (r.time_ms * 1e-3) / 1e9, rel=1e-12)
        assert r.gbytes_s == pytest.approx(r.min_bytes / (r.time_ms * 1e-3) / 1e9, rel=1e-12)
        assert r.ratio_gemm == pytest.approx(r.gemm_gflops / r.gflops, rel=1e-12)
        assert r.threads == 1 and r.dtype == "float32" and r.device == "cpu"


def test_ratio_to_fastest_native_is_per_round(report: Report) -> None:
    rows = [r for r in _main(report) if (r.layer, r.pass_) == ("tiny", "backward")]
    fastest = min((r for r in rows if r.path in bench_report.NATIVE_PATHS), key=lambda r: r.time_ms)
    for r in rows:
        per_round = [a / b for a, b in zip(r.timing.rounds, fastest.timing.rounds,
                                           strict=True)]
        assert r.ratio_native == pytest.approx(float(np.median(per_round)))
        assert r.ratio_native_low == pytest.approx(min(per_round))
        assert r.ratio_native_high == pytest.approx(max(per_round))


def test_native_brings_its_a_a_twin() -> None:
    rep = bench.benchmark([TINY], paths=["native"], passes=["backward"], memory=False,
                          gemm=False, **FAST)
    assert [(r.path, r.backend) for r in rep.results] == [("native", "Mkldnn"),
                                                          ("mkldnn", "Mkldnn")]
    assert rep.results[0].aa_band == rep.results[1].aa_band >= 0
    rep64 = bench.benchmark([TINY], paths=["native"], passes=["backward"], memory=False,
                            gemm=False, dtype=torch.float64, **FAST)
    assert [(r.path, r.backend) for r in rep64.results] == [("native", "Slow2d"),
                                                            ("slow", "Slow2d")]


def test_a_repeat_times_a_path_twice_as_its_own_a_a_pair() -> None:
    rep = bench.benchmark([TINY], paths=["mkldnn", "slow"], passes=["backward"], memory=False,
                          gemm=False, repeats=["slow_aa"], **FAST)
    assert [(r.path, r.backend) for r in rep.results] == [
        ("mkldnn", "Mkldnn"), ("slow", "Slow2d"), ("slow_aa", "Slow2d")]
    pairs = bench_report.all_aa_pairs(rep.results)
    assert [(a.path, b.path) for a, b in pairs] == [("slow", "slow_aa")]
    assert len(bench_report.aa_pairs(rep.results)) == 1
    assert "slow_aa" not in paths.PATH_NAMES  # not a path of its own: defaults skip it
    with pytest.raises(ValueError, match="repeats"):  # its path must be timed too
        bench.benchmark([TINY], paths=["mkldnn"], repeats=["slow_aa"], **FAST)
    with pytest.raises(ValueError, match="repeats"):
        bench.benchmark([TINY], paths=["slow"], repeats=["mkldnn"], **FAST)
    with pytest.raises(TypeError, match="repeats"):
        bench.benchmark([TINY], paths=["slow"], repeats="slow_aa", **FAST)
    with pytest.raises(ValueError, match="not a repeat"):
        paths.repeat_path("slow")


def _result(layer: str, path: str, rounds: tuple[float, ...], backend: str = "-") -> Result:
    t = Timing(path, rounds, 1)
    return Result(layer, path, "backward", backend, "cpu", "float32", 1, t.median * 1e3,
                  0, 0, 0, 0, len(rounds), 1, t.spread, 1, 1.0, 1, 1.0, timing=t)


def test_aa_band_comparisons_and_warnings() -> None:
    rows = [
        _result("a", "native", (1.0,) * 7, "Mkldnn"),
        _result("a", "mkldnn", (1.05, 0.98, 1.0, 1.0, 1.01, 0.99, 1.0), "Mkldnn"),
        _result("a", "reference", (2.0, 2.2, 1.9, 2.1, 2.0, 1.95, 2.05)),
        _result("a", "numpy_ref", (1.02, 1.0, 0.99, 1.0, 1.0, 1.0, 1.0)),
    ]
    # per-round ratios of the A/A pair: the largest |log| is log(1.05)
    assert bench_report.aa_band(rows) == pytest.approx(0.05)
    bench_report._fill_ratios(rows)
    by_label = {c.label: c for c in bench_report.comparisons(rows)}
    ref = by_label["reference / fastest native"]
    assert ref.ratio.median == pytest.approx(2.0) and ref.verdict == "slower"
    assert ref.outcome.above == 7 and ref.outcome.p_value == pytest.approx(2 / 128)
    assert ref.band == bench_report.run_band(rows) == pytest.approx(0.05)
    assert "numpy_ref / aten slow" not in by_label  # no slow path in this run
    assert bench_report.noise_warnings(rows) == []
    noisy = [_result("b", "native", (1.0,) * 7, "Mkldnn"),
             _result("b", "mkldnn", (1.5, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0), "Mkldnn")]
    bench_report._fill_ratios(noisy)
    text = "\n".join(bench_report.noise_warnings(noisy))
    assert "per-round ratios reach 50%" in text and "rounds spread" in text
    # pooled over both pairs' 14 ratios: rank 14 of 14 is the 1.5 round
    assert bench_report.run_band(rows + noisy) == pytest.approx(0.5)
    # the same 2x with rounds on both sides of the band's edge is no verdict
    mixed = [*rows[:2], _result("a", "reference", (2.0, 2.2, 1.9, 1.0, 2.0, 1.95, 2.05))]
    bench_report._fill_ratios(mixed)
    assert {c.label: c for c in bench_report.comparisons(mixed)}[
        "reference / fastest native"].verdict == "within noise"


def test_bench_does_not_import_the_cli() -> None:
    import subprocess

    code = ("import sys, convlab.lab.bench, convlab.lab.bench_report; sys.exit(any("
            "m == 'convlab.cli' or m.startswith('convlab.cli.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_memory_columns_see_the_outputs(report: Report) -> None:
    """Every backward allocates at least its outputs; the measurement must see them."""
    rows = [r for r in report.results if not math.isnan(r.mem_alloc_mb)]
    assert {r.path for r in rows} >= {"native", "slow", "thnn", "reference", "numpy_ref"}
    out_bytes = 4 * (2 * 3 * 9 * 8 + 4 * 3 * 3 * 3 + 4)  # grad_input, grad_weight, grad_bias
    for r in rows:
        assert r.mem_alloc_mb * bench_report.MB >= out_bytes, r.path
        if sys.platform.startswith("linux"):
            assert r.mem_rss_mb >= 0


def test_alloc_peak_measures_torch_and_numpy() -> None:
    cpu = torch.device("cpu")
    peak = profiling.alloc_peak(lambda: torch.empty(2**20), cpu)  # 4 MiB
    assert 4 * bench_report.MB <= peak < 4.5 * bench_report.MB
    peak = profiling.alloc_peak(lambda: np.ones(2**20), cpu)  # 8 MiB of float64
    assert 8 * bench_report.MB <= peak < 8.5 * bench_report.MB

    def temporary() -> torch.Tensor:  # 16 MiB live at the peak, freed before returning
        return torch.ones(2**22).sum()

    assert profiling.alloc_peak(temporary, cpu) >= 16 * bench_report.MB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS high-water mark is Linux")
def test_rss_peak_sees_touched_pages() -> None:
    peak = profiling.rss_peak(lambda: torch.ones(2**22), torch.device("cpu"))  # 16 MiB touched
    assert peak >= 12 * bench_report.MB


def test_csv_and_json_are_written(report: Report, tmp_path) -> None:
    csv_path, json_path = bench_report.write(report, tmp_path / "out")
    rows = bench_report.read_csv(csv_path)
    assert list(rows[0]) == list(bench_report.COLUMNS)
    assert len(rows) == len(report.results)
    for row, res in zip(rows, report.results, strict=True):
        assert (row["layer"], row["path"], row["pass"]) == (res.layer, res.path, res.pass_)
        assert float(row["time_ms"]) == pytest.approx(res.time_ms)
    data = json.loads(json_path.read_text())
    assert set(data) == {"meta", "columns", "results", "skipped", "comparisons"}
    first = data["results"][0]
    assert len(first["rounds_ms"]) == 2 and first["time_ms"] == pytest.approx(
        float(np.median(first["rounds_ms"])))
    assert data["meta"]["threads"] == 1 and "2 * MACs" in data["meta"]["flop_formula"]
    assert "NumPy BLAS threads" in data["meta"]["numpy_blas_threads"]
    assert {c["label"] for c in data["comparisons"]} >= {"reference / fastest native",
                                                        "thnn / aten slow (forward+backward)"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": ["nope"]}, r"layers: unknown layer name\(s\) 'nope'; choose from resnet56"),
        ({"layers": []}, r"layers: empty list"),
        ({"paths": ["native", "fast"]}, r"paths: unknown name\(s\) 'fast'"),
        ({"paths": []}, r"paths: empty list"),
        ({"passes": ["backwards"]}, r"passes: unknown name\(s\) 'backwards'"),
        ({"threads": 0}, r"threads must be an int from 1 to"),
        ({"threads": 2**31}, r"threads must be an int from 1 to"),
        ({"rounds": 0}, r"rounds must be a positive int"),
        ({"min_run_time": math.inf}, r"min_run_time must be seconds in"),
        ({"min_run_time": math.nan}, r"min_run_time must be seconds in"),
        ({"min_run_time": 1e300}, r"min_run_time must be seconds in"),
        ({"device": "gpu"}, r"device must be cpu or cuda, got 'gpu'"),
        ({"device": "meta"}, r"device must be cpu or cuda, got 'meta'"),
        ({"layers": [Layer("bad", (2, 3, 8, 8), (4, 2, 3, 3))]}, r"weight of shape"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bench.benchmark(**{"layers": [TINY], "memory": False, **kwargs})


CLI_FAST = ["--rounds", "1", "--min-run-time", "0.001", "--threads", "1", "--no-memory"]


def test_cli_writes_results_prints_spreads_and_ratios(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    code = cli.main(["bench", "--layers", "conv1d", "--paths", "native,reference", "--passes",
                       "backward", *CLI_FAST, "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "torch threads 1" in text and "NumPy BLAS threads" in text
    assert "range ms" in text and "measured ratios" in text
    assert "reference / fastest native" in text and "A/A band" in text
    assert "target" not in text.lower()
    rows = bench_report.read_csv(out / "bench.csv")
    assert [(r["path"], r["pass"]) for r in rows] == [
        ("native", "backward"), ("mkldnn", "backward"), ("reference", "backward")]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "resnet56,resnet99"], "unknown layer name(s) 'resnet99'"),
        (["--paths", ""], "paths: empty list"),
        (["--device", "gpu"], "device must be cpu or cuda, got 'gpu'"),
        (["--threads", "30000"], "threads must be an int from 1 to"),
        (["--threads", "2147483648"], "threads must be an int from 1 to"),
        (["--rounds", "0"], "rounds must be a positive int"),
    ],
)
def test_cli_bad_arguments_are_one_line_errors(argv, message, tmp_path, capsys) -> None:
    out = tmp_path / "never"
    assert cli.main(["bench", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_cli_unwritable_out_fails_before_running(tmp_path, capsys, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(bench, "benchmark", lambda *a, **k: pytest.fail("ran anyway"))
    assert cli.main(["bench", "--layers", "conv1d", "--out", str(blocker / "sub")]) == 2
    assert "out: cannot write to" in capsys.readouterr().err


def test_cli_ctrl_c_keeps_finished_layers(tmp_path, capsys, monkeypatch) -> None:
    real = bench._bench_layer
    calls = []

    def interrupt_second(layer, *args, **kwargs):
        calls.append(layer.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(layer, *args, **kwargs)

    monkeypatch.setattr(bench, "_bench_layer", interrupt_second)
    out = tmp_path / "res"
    code = cli.main(["bench", "--layers", "conv1d,cifar5", "--paths", "reference", "--passes",
                       "backward", *CLI_FAST, "--out", str(out)])
    assert code == cli.INTERRUPTED == 130
    assert "interrupted: wrote the 1 results" in capsys.readouterr().out
    assert [r["layer"] for r in bench_report.read_csv(out / "bench.csv")] == ["conv1d"]
    assert json.loads((out / "bench.json").read_text())["meta"]["interrupted"] is True


def test_cli_list(capsys) -> None:
    assert cli.main(["bench", "--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [layer.name for layer in paths.SUITE]


def test_profile_ops_and_onednn_trace_keep_c_output_quiet(capfd) -> None:
    x, w, b, go = TINY.tensors(torch.device("cpu"), torch.float32)
    args = TINY.args()

    def backward() -> object:
        return torch.ops.aten.convolution_backward(go, x, w, [4], *args, [True, True, True])

    ops = profiling.profile_ops(backward, top=3)
    assert ops[0].name.startswith("aten::") and ops[0].calls >= 1
    assert sum(o.share for o in ops) <= 1.0 + 1e-9
    calls = profiling.onednn_trace(backward)  # float32 tiny conv: ATen picks oneDNN
    assert {c.prop for c in calls if c.op == "convolution"} == {"backward_data",
                                                                "backward_weights"}
    torch.backends.mkldnn.enabled = False
    try:
        assert profiling.onednn_trace(backward) == []  # the slow path runs no oneDNN primitive
    finally:
        torch.backends.mkldnn.enabled = True
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_cli_quick_defaults(tmp_path, monkeypatch) -> None:
    seen = {}

    def fake(layers, paths, passes, device, dtype, threads, rounds, min_run_time, memory,
             progress, report):
        seen.update(layers=layers, passes=passes, rounds=rounds, min_run_time=min_run_time,
                    memory=memory)
        return report

    monkeypatch.setattr(bench, "benchmark", fake)
    assert cli.main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    assert seen == {"layers": list(paths.QUICK_LAYERS), "passes": ["backward",
                    "forward_backward"], "rounds": 7, "min_run_time": 0.1, "memory": False}
