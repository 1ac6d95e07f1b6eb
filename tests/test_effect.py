"""convlab.lab.method.effect: median ratios with an order-statistic CI, and the smallest ratio a
run resolves, on synthetic per-round times whose true ratio is known."""

from __future__ import annotations

import math
import random

import pytest

from convlab.lab.method import effect
from convlab.lab.method.timing import band_from_ratios, verdict_of


def synthetic(ratio: float, rounds: int, noise: float, seed: int) -> tuple[list, list]:
    """Per-round seconds of two candidates whose true ratio is ``ratio``: both share a
    slow phase per round, each has its own log-normal noise of width ``noise``."""
    rng = random.Random(seed)
    xs, ys = [], []
    for _ in range(rounds):
        phase = math.exp(rng.gauss(0, 0.3))
        ys.append(0.01 * phase * math.exp(rng.gauss(0, noise)))
        xs.append(0.01 * ratio * phase * math.exp(rng.gauss(0, noise)))
    return xs, ys


@pytest.mark.parametrize("ratio", [0.5, 1.0, 1.3, 3.0])
def test_known_ratio_inside_its_interval(ratio):
    hits = 0
    trials = 200
    for seed in range(trials):
        xs, ys = synthetic(ratio, 15, 0.1, seed)
        ci = effect.median_ci(effect.rounds_ratios(xs, ys))
        assert ci.low <= ci.median <= ci.high
        hits += ci.low <= ratio <= ci.high
    # the interval covers at least 95 %: allow the binomial spread of 200 trials
    # (3 standard deviations of 200 * 0.05), not a looser rule
    assert hits >= trials * 0.95 - 3 * math.sqrt(trials * 0.05 * 0.95)


def test_interval_narrows_with_more_rounds():
    def mean_width(rounds):
        widths = []
        for seed in range(50):
            xs, ys = synthetic(1.5, rounds, 0.1, seed)
            ci = effect.median_ci(effect.rounds_ratios(xs, ys))
            widths.append(math.log(ci.high / ci.low))
        return sum(widths) / len(widths)

    w7, w30, w120 = mean_width(7), mean_width(30), mean_width(120)
    assert w7 > w30 > w120


def test_coverage_is_exact_binomial():
    ci = effect.median_ci([1.0 + i / 100 for i in range(7)])
    assert (ci.low, ci.high) == (1.0, 1.06)
    assert ci.coverage == pytest.approx(1 - 2 / 2**7)
    few = effect.median_ci([1.2, 1.1, 1.3])
    assert (few.low, few.high) == (1.1, 1.3) and few.coverage < 0.95
    many = effect.median_ci([1.0 + i / 100 for i in range(20)])
    assert many.coverage >= 0.95
    assert (many.low, many.high) == pytest.approx((1.05, 1.14))


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf], [0.0], [-1.2], [True]])
def test_bad_ratios_refused(bad):
    with pytest.raises(ValueError, match="ratio"):
        effect.median_ci(bad)


def test_bad_rounds_refused():
    with pytest.raises(ValueError, match="x_rounds"):
        effect.rounds_ratios([0.1, math.nan], [0.1, 0.1])
    with pytest.raises(ValueError, match="y_rounds"):
        effect.rounds_ratios([0.1], [-0.1])
    with pytest.raises(ValueError, match="differ in length"):
        effect.rounds_ratios([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="x_rounds"):
        effect.rounds_ratios([], [])
    with pytest.raises(ValueError, match="alpha"):
        effect.median_ci([1.0], alpha=1.5)
    with pytest.raises(ValueError, match="aa_ratios"):
        effect.resolvable([], 7)
    with pytest.raises(ValueError, match="aa_ratios"):
        effect.resolvable([1.0, math.nan], 7)
    with pytest.raises(ValueError, match="n must"):
        effect.rounds_needed(0)


def test_resolvable_shrinks_with_rounds_and_noise():
    rng = random.Random(1)
    noisy = [math.exp(rng.gauss(0, 0.2)) for _ in range(60)]
    quiet = [math.exp(rng.gauss(0, 0.02)) for _ in range(60)]
    assert math.isinf(effect.resolvable(noisy, 4))  # 4 rounds never reject at 5 %
    r6, r20, r100 = (effect.resolvable(noisy, n) for n in (6, 20, 100))
    assert r6 > r20 > r100 > 1
    assert effect.resolvable(quiet, 6) < r6
    band = band_from_ratios(noisy)
    # 6 rounds: all 6 needed, each with p = 0.5 ** (1 / 6) = 0.891 for power 1/2, so
    # the band's edge times the A/A gap at the 2 p - 1 = 78.2 % quantile
    gaps = sorted(abs(math.log(r)) for r in noisy)
    level = 2 * 0.5 ** (1 / 6) - 1
    assert r6 == pytest.approx((1 + band) * math.exp(gaps[math.ceil(level * 60) - 1]))
    assert r100 >= 1 + band


def test_resolvable_ratio_is_resolved_by_the_sign_test():
    """A true ratio well above the resolvable one gets a verdict from timing's sign test;
    one well below it does not (same noise, same rounds)."""
    rng = random.Random(2)
    aa = [math.exp(rng.gauss(0, 0.05)) for _ in range(40)]
    band = band_from_ratios(aa)
    limit = effect.resolvable(aa, 30)
    above = [limit * 1.1 * math.exp(rng.gauss(0, 0.05)) for _ in range(30)]
    below = [(1 + band) * math.exp(rng.gauss(0, 0.05)) for _ in range(30)]
    assert verdict_of(above, band).verdict == "slower"
    assert verdict_of(below, band).verdict == "within noise"


def test_summary_from_rounds():
    xs, ys = [0.2, 0.22, 0.21, 0.2, 0.23, 0.21], [0.1] * 6
    out = effect.ratio_summary(xs, ys, [1.01, 0.99, 1.02, 0.98])
    assert out["median"] == pytest.approx(2.1) and out["rounds"] == 6
    assert out["ci_low"] == pytest.approx(2.0) and out["ci_high"] == pytest.approx(2.3)
    # 4 A/A ratios: the 78 % quantile of their gaps is the largest, 1/0.98
    assert out["resolvable"] == pytest.approx((1 / 0.98) ** 2)
    assert effect.ratio_summary(xs, ys, None)["resolvable"] is None
    assert effect.ratio_summary(xs[:4], ys[:4], [1.01])["resolvable"] is None
