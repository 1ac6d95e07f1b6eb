"""convlab.lab.sections.numerics: ULPs, relative errors and the float64 oracle comparison.

These test the machinery, not the machine: no assertion depends on which backend this CPU
picks, its thread count or the size of its rounding errors in low precision.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from convlab.aten import backends
from convlab.lab.method import float_errors
from convlab.lab.sections import numerics

LOW = [torch.float16, torch.bfloat16, torch.float32]


def _next_up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, math.inf))


@pytest.mark.parametrize("dtype", LOW + [torch.float64])
def test_ulp_is_the_gap_to_the_next_number(dtype: torch.dtype) -> None:
    x = torch.tensor([1.0, 1.5, 3.0, -6.0, 1000.0], dtype=dtype)
    gap = (_next_up(x.abs()) - x.abs()).double()
    assert torch.equal(float_errors.ulp(x.double(), dtype), gap)


@pytest.mark.parametrize("dtype", LOW)
def test_ulp_below_the_normal_range_is_the_subnormal_spacing(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    tiny_gap = info.tiny * info.eps
    got = float_errors.ulp(torch.tensor([0.0, info.tiny / 4], dtype=torch.float64), dtype)
    assert got.tolist() == [tiny_gap, tiny_gap]


@pytest.mark.parametrize("dtype", LOW)
def test_representable_values_score_zero_ulps(dtype: torch.dtype) -> None:
    x = torch.randn(100, dtype=torch.float64).to(dtype)
    assert float_errors.ulp_error(x, x.double()).max().item() == 0.0


@pytest.mark.parametrize("dtype", LOW)
def test_the_next_number_scores_one_ulp(dtype: torch.dtype) -> None:
    # 1.5 * 2**k: not powers of two, where the gap below is half the gap above.
    x = (1.5 * 2.0 ** torch.arange(-4, 5, dtype=torch.float64)).to(dtype)
    up = _next_up(x)
    down = torch.nextafter(x, torch.full_like(x, -math.inf))
    assert torch.equal(float_errors.ulp_error(up, x.double()), torch.ones(9, dtype=torch.float64))
    assert torch.equal(float_errors.ulp_error(down, x.double()), torch.ones(9, dtype=torch.float64))


def test_halfway_value_scores_half_an_ulp() -> None:
    exact = torch.tensor([1.0 + 2.0**-8], dtype=torch.float64)  # halfway in bfloat16
    rounded = exact.to(torch.bfloat16)
    assert float_errors.ulp_error(rounded, exact).item() == 0.5


def test_ulp_error_counts_in_the_given_dtype() -> None:
    exact = torch.tensor([1.0], dtype=torch.float64)
    actual = torch.tensor([1.0 + 2.0**-7], dtype=torch.float64)
    assert float_errors.ulp_error(actual, exact, torch.bfloat16).item() == 1.0
    assert float_errors.ulp_error(actual, exact, torch.float16).item() == 8.0


def test_ulp_error_nan_and_inf() -> None:
    nan, inf = math.nan, math.inf
    actual = torch.tensor([nan, nan, 1.0, inf, inf, -inf])
    exact = torch.tensor([nan, 1.0, nan, inf, -inf, -inf], dtype=torch.float64)
    got = float_errors.ulp_error(actual, exact).tolist()
    assert got == [0.0, inf, inf, 0.0, inf, 0.0]


def test_relative_error_of_identical_tensors_is_zero() -> None:
    x = torch.randn(3, 4, dtype=torch.float64)
    assert float_errors.relative_error(x, x) == 0.0
    assert float_errors.relative_error(x, x, norm="max") == 0.0
    assert float_errors.relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert float_errors.relative_error(torch.empty(0), torch.empty(0)) == 0.0


def test_relative_error_values() -> None:
    exact = torch.tensor([3.0, 4.0], dtype=torch.float64)  # norm 5, max 4
    actual = torch.tensor([3.0, 4.5], dtype=torch.float64)
    assert float_errors.relative_error(actual, exact) == pytest.approx(0.1)
    assert float_errors.relative_error(actual, exact, norm="max") == pytest.approx(0.125)
    assert float_errors.relative_error(torch.ones(2), torch.zeros(2)) == math.inf


def test_relative_error_nan_handling() -> None:
    exact = torch.tensor([1.0, math.nan, 2.0], dtype=torch.float64)
    same = torch.tensor([1.0, math.nan, 2.0])
    assert float_errors.relative_error(same, exact) == 0.0
    assert float_errors.relative_error(torch.tensor([1.0, 0.0, 2.0]), exact) == math.inf
    assert float_errors.relative_error(torch.tensor([math.nan, math.nan, 2.0]), exact) == math.inf


def test_grad_error_fields() -> None:
    exact = torch.tensor([1.5, -0.25], dtype=torch.float64)
    actual = _next_up(exact.to(torch.bfloat16))
    err = float_errors.grad_error(actual, exact, torch.bfloat16)
    assert err.ulps == 1.0  # one ulp at the largest entry, 1.5
    assert err.max_ulp == 1.0
    assert err.max_rel == pytest.approx(2.0**-7 / 1.5)
    assert err.rel > 0.0


@pytest.mark.parametrize(
    ("kwargs", "groups"),
    [({"stride": 1, "padding": 1}, 1), ({"stride": 2, "dilation": 2}, 1),
     ({"padding": 1}, 3)],
)
def test_backward_error_of_float64_is_zero_to_rounding(kwargs: dict, groups: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 9, 9, dtype=torch.float64)
    w = torch.randn(6, 6 // groups, 3, 3, dtype=torch.float64)
    y = torch.nn.functional.conv2d(x, w, groups=groups, **kwargs)
    errs = float_errors.backward_error(
        torch.randn_like(y), x, w, groups=groups, dtype=torch.float64, **kwargs
    )
    assert set(errs) == {"grad_input", "grad_weight", "grad_bias"}
    for err in errs.values():
        assert err.rel < 1e-13
        assert err.ulps < 1e3  # float64 ulps: a few hundred at most from summation order


def test_backward_error_slow_backend_and_mask() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    go = torch.randn(2, 4, 6, 6)
    errs = float_errors.backward_error(
        go, x, w, dtype=torch.float32, backend="slow", output_mask=(False, True, False)
    )
    assert list(errs) == ["grad_weight"]
    assert errs["grad_weight"].rel < 1e-5  # float32: a few eps, far below 1e-5


def test_backward_error_detects_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from convlab.aten import native

    real = native.convolution_backward

    def off_by_one_percent(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        gi, gw, gb = real(*args, **kwargs)
        return gi, gw * 1.01, gb

    monkeypatch.setattr(native, "convolution_backward", off_by_one_percent)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    errs = float_errors.backward_error(torch.randn(2, 4, 6, 6), x, w, dtype=torch.float64)
    assert errs["grad_weight"].rel == pytest.approx(0.01, rel=1e-6)
    assert errs["grad_input"].rel < 1e-13


@pytest.mark.parametrize(
    ("call", "exc", "word"),
    [
        (lambda: float_errors.ulp(torch.ones(2), "float32"), TypeError, "dtype"),
        (lambda: float_errors.ulp(torch.ones(2), torch.int32), ValueError, "dtype"),
        (lambda: float_errors.ulp([1.0], torch.float32), TypeError, "values"),
        (lambda: float_errors.ulp_error(torch.ones(2), torch.ones(3)), ValueError, "shape"),
        (lambda: float_errors.ulp_error(torch.ones(2, dtype=torch.int64), torch.ones(2)),
         TypeError, "actual"),
        (lambda: float_errors.ulp_error(torch.ones(2), None), TypeError, "exact"),
        (lambda: float_errors.relative_error(torch.ones(2), torch.ones(2), norm="l1"),
         ValueError, "norm"),
        (lambda: float_errors.backward_error(
            torch.ones(1, 1, 1, 1), torch.ones(1, 1, 3, 3), torch.ones(1, 1, 3, 3),
            dtype=torch.int8), ValueError, "dtype"),
        (lambda: float_errors.backward_error(
            torch.ones(1, 1, 1, 1), torch.ones(1, 1, 3, 3), torch.ones(1, 1, 3, 3),
            backend="fastest"), ValueError, "backend"),
        (lambda: float_errors.backward_error(
            torch.ones(1, 1, 1, 1), torch.ones(1, 1, 3, 3), torch.ones(1, 1, 3, 3),
            backend=3), TypeError, "backend"),
        (lambda: float_errors.backward_error(
            torch.ones(1, 1, 1, 1), [[1.0]], torch.ones(1, 1, 3, 3)), TypeError, "input"),
    ],
)
def test_bad_arguments_name_the_argument(call, exc: type, word: str) -> None:  # noqa: ANN001
    with pytest.raises(exc, match=word):
        call()


def test_doctor_lines_one_per_dtype() -> None:
    lines = float_errors.doctor_lines((torch.float32,))
    assert len(lines) == 1
    assert lines[0].startswith("float32: ")
    assert "ulp" in lines[0]


def test_grad_error_nonfinite() -> None:
    exact = torch.tensor([1.0, math.nan], dtype=torch.float64)
    agree = float_errors.grad_error(torch.tensor([1.0, math.nan]), exact, torch.float32)
    assert agree == float_errors.GradError(0.0, 0.0, 0.0, 0.0)
    differ = float_errors.grad_error(torch.tensor([1.0, 2.0]), exact, torch.float32)
    assert differ.rel == differ.ulps == math.inf


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_relative_and_grad_error_hold_at_extreme_magnitudes(scale: float) -> None:
    # Unscaled float64 norms overflow (1e200**2) or underflow (1e-200**2) to inf or 0.
    exact = torch.tensor([3.0, 4.0], dtype=torch.float64)  # norm 5
    actual = torch.tensor([3.0, 4.5], dtype=torch.float64)  # error norm 0.5
    assert float_errors.relative_error(actual * scale, exact * scale) == pytest.approx(0.1)
    err = float_errors.grad_error(actual * scale, exact * scale, torch.float64)
    assert err.rel == pytest.approx(0.1)
    assert err.max_rel == pytest.approx(0.125)


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_backward_error_float64_at_extreme_magnitudes(scale: float) -> None:
    # grad_output scaled, input and weight of order 1: every product stays in range.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    go = torch.randn(2, 4, 6, 6, dtype=torch.float64) * scale
    errs = float_errors.backward_error(go, x, w, dtype=torch.float64)
    for err in errs.values():
        assert math.isfinite(err.rel) and err.rel < 1e-13


def test_record_quick_is_consistent_with_this_machine() -> None:
    rec = numerics.record(quick=True)
    json.dumps(rec)  # JSON-serialisable
    routing = rec["routing"]
    assert routing["mkldnn_bf16_supported"] == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    x = torch.randn(8, 16, 16, 16, dtype=torch.bfloat16)
    w = torch.randn(16, 16, 3, 3, dtype=torch.bfloat16)
    bf16 = next(r for r in routing["rows"] if (r["conv"], r["dtype"]) == ("3x3", "bfloat16"))
    assert bf16["backend"] == str(backends.select_backend(x, w, padding=1))
    # Every row of the accuracy table is a backend ATen lets serve that dtype here.
    for row in rec["accuracy"]:
        assert row["dtype"] in ("float32", "bfloat16", "float16")
        assert set(row["ulps"]) == set(float_errors.GRAD_NAMES)
        assert all(v >= 0.0 and math.isfinite(v) for v in row["ulps"].values())
    served = {r["backend"] for r in rec["accuracy"] if r["dtype"] == "bfloat16"}
    assert ("Mkldnn" in served) == routing["mkldnn_bf16_supported"]
    assert rec["float64_worst_rel"] < 1e-13
    assert rec["threads_bits"]["counts"] == [1, 2, 4]
    # The slow kernels keep their bits run to run (a fixed loop around a GEMM).
    assert all(all(r["same_bits"]) for r in rec["run_to_run"]
               if r["backend"].startswith("Slow"))
    assert torch.get_num_threads() == rec["threads"]  # restored after the thread sweep
