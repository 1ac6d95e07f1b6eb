"""Timed claims under noise: a time ratio judged against the effect its sentence needs,
with extra rounds while the run cannot tell.

A timed claim compares two candidates of one interleaved run (:mod:`convlab.lab.method.timing`)
by their per-round time ratio ``r = x / y``. Its sentence holds where ``r`` lies in one
region and does not where it lies in another (e.g. "x is slower": ``r`` beyond the A/A
band's edge ``1 + band``, or not). :func:`judge` decides only where

* the median's order-statistic interval (:func:`convlab.lab.method.effect.median_ci`) lies
  inside one region, and
* the A/A band is narrower than the effect the sentence turns on (``effect``, a relative
  gap: 0.5 for "within x1.5"), or the interval lies beyond the band at both ends (an
  effect the run resolved over its own noise);

else the outcome is ``inconclusive``. :func:`adaptive` runs more rounds (a new interleaved
run, its rounds appended) while the outcome is inconclusive and a time budget lasts.

>>> judge([0.5, 0.52, 0.49, 0.51, 0.5, 0.48, 0.5], 0.1, faster(0.1), 0.25).status
'holds'
>>> judge([0.5, 1.6, 0.7, 1.2, 0.9, 1.1, 0.6], 1.5, faster(1.5), 0.25).status
'inconclusive'
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from convlab.lab.claims.core import FAILS, HOLDS, INCONCLUSIVE
from convlab.lab.method import timing
from convlab.lab.method.effect import MedianCI, median_ci

# Intervals of the ratio r = x / y, (low, high); a region is one or more of them.
Region = tuple[tuple[float, float], ...]
ROUNDS = 7  # rounds per batch (a verdict needs >= timing.MIN_ROUNDS)
MAX_ROUNDS = 35  # at most four extra batches
BUDGET_S = 20.0  # seconds of elapsed time one timed measurement may take, extra rounds included


def faster(band: float) -> tuple[Region, Region]:
    """Regions of "x is faster than y beyond the A/A band": holds below ``1 / (1 + band)``,
    does not hold at or above it."""
    edge = 1 / (1 + band)
    return ((0.0, edge),), ((edge, math.inf),)


def slower(band: float) -> tuple[Region, Region]:
    """Regions of "x is slower than y beyond the A/A band": holds above ``1 + band``, does
    not hold at or below it."""
    edge = 1 + band
    return ((edge, math.inf),), ((0.0, edge),)


def within(limit: float) -> tuple[Region, Region]:
    """Regions of "x and y within a factor ``limit`` of each other"."""
    return ((1 / limit, limit),), ((0.0, 1 / limit), (limit, math.inf))


@dataclass(frozen=True)
class Judgement:
    """What a run's ratios say: ``status`` (holds, does not hold or inconclusive), the
    median ratio's interval ``ci`` and the run's A/A ``band``."""

    status: str
    ci: MedianCI
    band: float

    @property
    def median(self) -> float:
        """The median per-round ratio."""
        return self.ci.median

    def __str__(self) -> str:
        band = "n/a" if math.isnan(self.band) else f"{self.band:.0%}"
        return f"{self.ci} (A/A band {band}, {self.ci.rounds} rounds)"

    def detail(self) -> dict[str, float | int]:
        """JSON-ready numbers for an outcome's detail."""
        return {"ratio": self.ci.median, "ci_low": self.ci.low, "ci_high": self.ci.high,
                "band": self.band, "rounds": self.ci.rounds}


def judge(ratios: Sequence[float], band: float, regions: tuple[Region, Region],
          effect: float) -> Judgement:
    """The status of per-round ``ratios`` against ``regions`` (holds, does not hold) and
    the A/A ``band`` (module docstring); ``effect`` is the smallest relative gap the
    sentence turns on (``band`` must be narrower, unless the interval clears the band)."""
    if effect <= 0:
        raise ValueError(f"effect must be > 0, got {effect!r}")
    ci = median_ci(ratios)
    holds, fails = regions

    def inside(region: Region) -> bool:
        return any(low <= ci.low and ci.high <= high for low, high in region)

    clear = not math.isnan(band) and (ci.low > 1 + band or ci.high < 1 / (1 + band))
    resolved = not math.isnan(band) and (band < effect or clear)
    if resolved and inside(holds):
        status = HOLDS
    elif resolved and inside(fails):
        status = FAILS
    else:
        status = INCONCLUSIVE
    return Judgement(status, ci, band)


def merged(first: dict[str, timing.Timing], more: dict[str, timing.Timing]
           ) -> dict[str, timing.Timing]:
    """The rounds of two runs of the same candidates, as one (the first's call count)."""
    return {k: timing.Timing(k, first[k].rounds + more[k].rounds, first[k].calls_per_round)
            for k in first}


def adaptive(measure: Callable[[int, int], dict[str, timing.Timing]],
             settled: Callable[[dict[str, timing.Timing]], bool],
             budget_s: float = BUDGET_S, max_rounds: int = MAX_ROUNDS
             ) -> dict[str, timing.Timing]:
    """``measure(rounds, seed)`` once (``ROUNDS`` rounds), then again with a new seed,
    rounds appended, while ``settled`` says no, the total stays within ``max_rounds`` and
    another batch (as long as the mean one so far) fits the ``budget_s`` seconds."""
    start = time.monotonic()
    found = measure(ROUNDS, 0)
    batches = 1
    while not settled(found) and len(next(iter(found.values())).rounds) + ROUNDS <= max_rounds:
        spent = time.monotonic() - start
        if spent + spent / batches > budget_s:
            break
        found = merged(found, measure(ROUNDS, batches))
        batches += 1
    return found
