"""E8: relative_error, grad_error and ulp_error scale before they subtract.

Near 1e308, ``actual - exact`` overflows in float64 before any later scaling can help
(``1.5e308 - -1.5e308`` is inf). The checks here compare with exact rational arithmetic
(:class:`fractions.Fraction`) over hypothesis floats that reach the top of float64's range,
and check that the errors do not change when both tensors are scaled by a power of two.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from convlab.lab.method import float_errors

F64 = torch.float64
MAX = Fraction(sys.float_info.max)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def as_float(x: Fraction) -> float:
    """The float64 nearest ``x``, inf beyond the largest finite one (float() would raise)."""
    return math.inf if x > MAX else float(x)


def sqrt_of(x: Fraction) -> float:
    """``sqrt(x)`` to float64 accuracy for any positive rational ``x`` (inf past the range)."""
    half = (x.numerator.bit_length() - x.denominator.bit_length()) // 2
    try:
        return math.ldexp(math.sqrt(float(x / Fraction(4) ** half)), half)
    except OverflowError:
        return math.inf


def exact_ulp(e: float, dtype: torch.dtype) -> Fraction:
    """``float_errors.ulp``'s definition, exactly: the gap above ``|e|`` at its binade, the
    subnormal spacing below the smallest normal number."""
    info = torch.finfo(dtype)
    lowest = math.frexp(info.tiny)[1]
    exponent = lowest if e == 0 else max(math.frexp(abs(e))[1], lowest)
    return Fraction(info.eps) * Fraction(2) ** (exponent - 1)


def test_opposite_values_near_the_top_of_the_range() -> None:
    """The issue's case: the true relative error is 2, where the subtraction gave inf."""
    a, e = t(1.5e308, 1.0), t(-1.5e308, 1.0)
    assert float_errors.relative_error(a, e) == 2.0
    assert float_errors.relative_error(a, e, norm="max") == 2.0
    err = float_errors.grad_error(a, e, F64)
    assert (err.rel, err.max_rel) == (2.0, 2.0)
    want = as_float(2 * Fraction(1.5e308) / exact_ulp(1.5e308, F64))
    assert err.ulps == err.max_ulp == want
    assert float_errors.ulp_error(a, e).tolist() == [want, 0.0]


def test_an_error_past_the_float64_range_is_inf_not_nan() -> None:
    a, e = t(1.5e308), t(1e-10)
    assert float_errors.relative_error(a, e) == math.inf
    assert float_errors.grad_error(a, e, F64).max_rel == math.inf
    assert not math.isnan(float_errors.ulp_error(a, e).item())


# Magnitudes within 2**±500 of each other, then moved together by up to 2**523: the entries
# reach 2**1024 (opposite signs overflow a - e), and stay normal numbers.
moderate = st.one_of(
    st.just(0.0),
    st.builds(lambda m, k, s: s * math.ldexp(m, k), st.floats(0.5, 1.0, exclude_max=True),
              st.one_of(st.just(500), st.integers(-500, 500)), st.sampled_from([1.0, -1.0])),
)
shift = st.one_of(st.just(523), st.integers(-520, 523))  # 523: entries near the top


@st.composite
def pairs(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    n = draw(st.integers(1, 6))
    k = draw(shift)
    a = [math.ldexp(v, k) for v in draw(st.lists(moderate, min_size=n, max_size=n))]
    e = [math.ldexp(v, k) for v in draw(st.lists(moderate, min_size=n, max_size=n))]
    return a, e


@given(pairs())
def test_relative_error_matches_exact_arithmetic(pair: tuple[list[float], list[float]]) -> None:
    a, e = pair
    diff = [Fraction(x) - Fraction(y) for x, y in zip(a, e, strict=True)]
    ref = [Fraction(y) for y in e]
    got_max = float_errors.relative_error(t(*a), t(*e), norm="max")
    top = max(abs(d) for d in ref)
    if top == 0:
        assert got_max == (0.0 if not any(diff) else math.inf)
        return
    assert got_max == pytest.approx(as_float(max(abs(d) for d in diff) / top), rel=1e-15)
    squared = sum(d * d for d in diff) / sum(r * r for r in ref)  # exact, then one sqrt
    want = sqrt_of(squared) if squared else 0.0
    assert float_errors.relative_error(t(*a), t(*e)) == pytest.approx(want, rel=1e-14)


@given(pairs(), st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]))
def test_ulp_error_matches_exact_arithmetic(pair: tuple[list[float], list[float]],
                                            dtype: torch.dtype) -> None:
    a, e = pair
    want = [as_float(abs(Fraction(x) - Fraction(y)) / exact_ulp(y, dtype))
            for x, y in zip(a, e, strict=True)]
    got = float_errors.ulp_error(t(*a), t(*e), dtype).tolist()
    assert got == pytest.approx(want, rel=1e-15)
    err = float_errors.grad_error(t(*a), t(*e), dtype)
    assert err.max_ulp == pytest.approx(max(want), rel=1e-15)
    top = max(abs(y) for y in e)
    worst = max(abs(Fraction(x) - Fraction(y)) for x, y in zip(a, e, strict=True))
    assert err.ulps == pytest.approx(as_float(worst / exact_ulp(top, dtype)), rel=1e-15)


@given(pairs(), st.integers(-400, 400))
def test_relative_errors_are_scale_invariant(pair: tuple[list[float], list[float]],
                                             k: int) -> None:
    """Multiplying both tensors by 2**k changes no relative error (where the scaled values
    are still normal float64 numbers): the class property the subtraction broke."""
    a, e = pair
    top = max(abs(x) for x in a + e)
    if top and not -1000 < math.frexp(top)[1] + k < 1024:
        k = 0
    nonzero = [abs(x) for x in a + e if x]
    if nonzero and math.frexp(min(nonzero))[1] + k < -1000:
        k = 0
    scaled_a, scaled_e = t(*(math.ldexp(x, k) for x in a)), t(*(math.ldexp(y, k) for y in e))
    for norm in ("fro", "max"):
        assert float_errors.relative_error(scaled_a, scaled_e, norm) == \
            float_errors.relative_error(t(*a), t(*e), norm)
    one = float_errors.grad_error(t(*a), t(*e), F64)
    two = float_errors.grad_error(scaled_a, scaled_e, F64)
    assert (one.rel, one.max_rel) == (two.rel, two.max_rel)
