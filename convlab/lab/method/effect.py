"""How big a time ratio is, and how big one a run could have told apart from noise.

:mod:`convlab.lab.method.timing` gives a verdict (slower, faster, within noise); this module gives
the effect size beside it, computed from the per-round times a record stores:

* :func:`median_ci`: the median of the per-round ratios ``x_i / y_i`` with a
  distribution-free confidence interval, the order-statistic interval of a median
  (the binomial one: ``[r_(k), r_(n-k+1)]`` of the sorted ratios, ``k`` the largest rank
  with ``P(Binomial(n, 1/2) < k) <= alpha / 2``). It assumes only that the rounds are
  independent draws of one ratio distribution; its coverage is at least ``1 - alpha``,
  and is stated exactly (with few rounds the interval is the whole range).
* :func:`resolvable`: the smallest ratio the run's sign test calls "slower" at least
  every other time (power 1/2), from the A/A ratios (the noise) and the number of
  rounds. The sign test needs ``m`` of ``n`` rounds beyond the band's edge ``1 + band``;
  a round of a true ratio ``R`` is beyond it when its noise factor ``e`` has
  ``log e > log(1 + band) - log R``, with probability ``p``; the test then says "slower"
  with probability ``P(Binomial(n, p) >= m)``, which reaches 1/2 at some ``p*``. With
  the noise symmetric about 1 (an A/A pair), ``P(log e > -t) = (1 + F(t)) / 2`` for
  ``F`` the distribution of ``|log e|`` over the A/A ratios, so
  ``log R = log(1 + band) + Q(2 p* - 1)``, ``Q`` the quantile of ``|log e|``. With 6
  rounds (all 6 needed, ``p* = 0.89``) that is the band's edge times the 78th
  percentile of the A/A gaps; with many rounds ``p*`` falls towards 1/2 and ``R``
  towards ``1 + band``.

>>> ci = median_ci([1.10, 1.25, 1.18, 1.30, 1.21, 1.15, 1.22])
>>> str(ci), round(ci.coverage, 3)
('x1.21 [1.10, 1.30]', 0.984)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from convlab.lab.method.timing import (
    ALPHA,
    BAND_QUANTILE,
    band_from_ratios,
    check_ratios,
    sign_test,
)


@dataclass(frozen=True)
class MedianCI:
    """The median of per-round ratios and its order-statistic interval."""

    median: float
    low: float
    high: float
    coverage: float  # the interval's exact coverage (>= 1 - alpha where rounds allow)
    rounds: int

    def __str__(self) -> str:
        return f"x{self.median:.2f} [{self.low:.2f}, {self.high:.2f}]"


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return float(alpha)


def _binom_cdf_below(k: int, n: int) -> float:
    """``P(K < k)`` for ``K ~ Binomial(n, 1/2)``."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n


def median_ci(ratios: Iterable[float], alpha: float = ALPHA) -> MedianCI:
    """Median of ``ratios`` (finite, positive) and its order-statistic CI (module docstring).

    With fewer rounds than a ``1 - alpha`` interval needs (5 at 95 %), the interval is
    the whole range and ``coverage`` says how much less it covers. ``ValueError`` for an
    empty list, a NaN/inf/non-positive ratio or an ``alpha`` outside ``(0, 1)``.
    """
    values = sorted(check_ratios(ratios))
    alpha = _check_alpha(alpha)
    n = len(values)
    if not n:
        raise ValueError("ratios: need at least one per-round ratio")
    k = 1
    while k + 1 <= n - k and _binom_cdf_below(k + 1, n) <= alpha / 2:
        k += 1
    coverage = 1 - 2 * _binom_cdf_below(k, n)
    return MedianCI(statistics.median(values), values[k - 1], values[n - k], coverage, n)


def rounds_ratios(x_rounds: Sequence[float], y_rounds: Sequence[float]) -> list[float]:
    """``x_i / y_i`` of two candidates' per-round seconds (same run, same round count)."""
    xs, ys = check_ratios(x_rounds, "x_rounds"), check_ratios(y_rounds, "y_rounds")
    if len(xs) != len(ys):
        raise ValueError(f"x_rounds and y_rounds differ in length ({len(xs)} vs {len(ys)})")
    if not xs:
        raise ValueError("x_rounds: need at least one round")
    return [a / b for a, b in zip(xs, ys, strict=True)]


def rounds_needed(n: int, alpha: float = ALPHA) -> int | None:
    """Rounds ``m`` of ``n`` that must lie beyond the band on one side for the two-sided
    sign test to reject at ``alpha`` (None: ``n`` rounds cannot).

    >>> rounds_needed(6), rounds_needed(7), rounds_needed(20), rounds_needed(4)
    (6, 7, 15, None)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    alpha = _check_alpha(alpha)
    for m in range(n // 2 + 1, n + 1):
        if 2 * sign_test(m, n) <= alpha:
            return m
    return None


def resolvable(aa_ratios: Iterable[float], rounds: int, alpha: float = ALPHA,
               quantile: float = BAND_QUANTILE) -> float:
    """The smallest ratio (> 1) a run of ``rounds`` rounds resolves from the noise of its
    A/A ratios (module docstring); ``inf`` where ``rounds`` are too few for any verdict.

    ``ValueError`` for no A/A ratios or a NaN/inf/non-positive one.
    """
    aa = check_ratios(aa_ratios, "aa_ratios")
    if not aa:
        raise ValueError("aa_ratios: need at least one A/A ratio")
    band = band_from_ratios(aa, quantile)
    m = rounds_needed(rounds, alpha)
    if m is None:
        return math.inf
    logs = sorted(abs(math.log(r)) for r in aa)
    level = 2 * power_half(m, rounds) - 1
    at = logs[max(math.ceil(level * len(logs)) - 1, 0)] if level > 0 else 0.0
    return (1 + band) * math.exp(at)


def power_half(m: int, n: int) -> float:
    """The round probability ``p`` at which ``P(Binomial(n, p) >= m) = 1/2`` (bisection).

    >>> round(power_half(6, 6), 4), round(power_half(15, 20), 2)
    (0.8909, 0.72)
    """
    low, high = 0.0, 1.0
    for _ in range(60):
        p = (low + high) / 2
        at_least = sum(math.comb(n, k) * p**k * (1 - p)**(n - k) for k in range(m, n + 1))
        low, high = (p, high) if at_least < 0.5 else (low, p)
    return (low + high) / 2


def ratio_summary(x_rounds: Sequence[float], y_rounds: Sequence[float],
                  aa_ratios: Iterable[float] | None, alpha: float = ALPHA) -> dict[str, float]:
    """JSON-ready: the median ratio ``x / y`` over rounds, its CI and coverage, and the
    smallest ratio the run resolves (None without A/A ratios)."""
    ci = median_ci(rounds_ratios(x_rounds, y_rounds), alpha)
    aa = list(aa_ratios or [])
    res = resolvable(aa, ci.rounds, alpha) if aa else None
    return {"median": ci.median, "ci_low": ci.low, "ci_high": ci.high,
            "coverage": ci.coverage, "rounds": ci.rounds,
            "resolvable": None if res is None or math.isinf(res) else res}
