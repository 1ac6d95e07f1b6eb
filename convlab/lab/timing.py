"""Interleaved timing: the one measurement method every comparison in convlab uses.

Each round times every candidate once with ``torch.utils.benchmark``'s
``blocked_autorange`` (so a round holds many calls, not one); rounds alternate between
candidates, so a slow phase of a shared machine hits all of them alike. The result of a
candidate is the median over rounds of the per-round medians, with the spread across
rounds (min, quartiles, max). Two candidates differ only when their gap exceeds the noise
band that an A/A pair (the same kernel reached two ways) shows in the same run.

>>> import torch
>>> x = torch.randn(256, 256)
>>> t = interleaved({"mm": lambda: x @ x, "matmul": lambda: torch.matmul(x, x)},
...                 rounds=5, min_run_time=0.01)
>>> sorted(t)
['matmul', 'mm']
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch.utils.benchmark import Timer


@dataclass(frozen=True)
class Timing:
    """Per-round median seconds per call of one candidate, and summaries of them."""

    name: str
    rounds: tuple[float, ...]
    calls_per_round: int

    @property
    def median(self) -> float:
        """Median over rounds (seconds per call)."""
        return statistics.median(self.rounds)

    @property
    def quartiles(self) -> tuple[float, float]:
        """First and third quartile over rounds (seconds per call)."""
        if len(self.rounds) < 2:
            return self.rounds[0], self.rounds[0]
        q = statistics.quantiles(self.rounds, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def spread(self) -> float:
        """The relative spread across rounds, ``(max - min) / median``."""
        return (max(self.rounds) - min(self.rounds)) / self.median

    def __str__(self) -> str:
        q1, q3 = self.quartiles
        return (f"{self.name}: {self.median * 1e3:.3g} ms "
                f"(IQR {q1 * 1e3:.3g}-{q3 * 1e3:.3g}, {len(self.rounds)} rounds "
                f"x {self.calls_per_round} calls)")


def interleaved(
    fns: Mapping[str, Callable[[], object]],
    rounds: int = 5,
    min_run_time: float = 0.1,
    threads: int | None = None,
    around: Mapping[str, Callable[[], AbstractContextManager[object]]] | None = None,
) -> dict[str, Timing]:
    """Time every callable in ``fns`` in ``rounds`` interleaved rounds.

    Args:
        fns: name -> zero-argument callable (run once before timing, as a warm-up).
        rounds: number of rounds (>= 1); each times every candidate once.
        min_run_time: seconds of ``blocked_autorange`` per candidate and round.
        threads: torch threads for the timed calls (default: the current setting).
        around: name -> context-manager factory entered around that candidate's warm-up
            and each of its ``blocked_autorange`` blocks (e.g. a forced backend), so
            that its set-up is not timed.

    Returns:
        name -> :class:`Timing`, in the order of ``fns``.
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if not min_run_time > 0:
        raise ValueError(f"min_run_time must be positive, got {min_run_time!r}")
    threads = torch.get_num_threads() if threads is None else threads
    around = dict(around or {})
    unknown = set(around) - set(fns)
    if unknown:
        raise ValueError(f"around names unknown candidates: {sorted(unknown)}")

    def context(name: str) -> AbstractContextManager[object]:
        return around[name]() if name in around else contextlib.nullcontext()

    for name, fn in fns.items():
        with context(name):
            fn()
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    calls: dict[str, int] = dict.fromkeys(fns, 0)
    for _ in range(rounds):
        for name, fn in fns.items():
            timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
            with context(name):
                m = timer.blocked_autorange(min_run_time=min_run_time)
            per_round[name].append(m.median)
            calls[name] += m.number_per_run * len(m.times)
    return {name: Timing(name, tuple(per_round[name]), calls[name] // rounds)
            for name in fns}


def noise_band(a: Timing, b: Timing) -> float:
    """Relative gap ``abs(a - b) / min(a, b)`` between the medians of an A/A pair."""
    return abs(a.median - b.median) / min(a.median, b.median)


def differs(x: Timing, y: Timing, band: float) -> bool:
    """Whether the medians of ``x`` and ``y`` differ by more than ``band`` (relative)."""
    return abs(x.median - y.median) / min(x.median, y.median) > band


@dataclass(frozen=True)
class Ratio:
    """Time ratio x / y: median of the per-round ratios and their range.

    Rounds are interleaved, so round ``i`` of ``x`` and of ``y`` ran side by side; the
    per-round ratio cancels a slow phase of the machine that both saw.
    """

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


def ratio(x: Timing, y: Timing) -> Ratio:
    """Per-round ratio ``x / y`` of two candidates of one :func:`interleaved` run."""
    if len(x.rounds) != len(y.rounds):
        raise ValueError(f"{x.name} and {y.name} have different round counts")
    per_round = [a / b for a, b in zip(x.rounds, y.rounds, strict=True)]
    return Ratio(statistics.median(per_round), min(per_round), max(per_round))


@contextlib.contextmanager
def blas_threads(threads: int) -> Iterator[str]:
    """Limit NumPy's BLAS (and OpenMP pools threadpoolctl sees) to ``threads`` inside the block.

    Yields a description of what was limited, for reports. Without ``threadpoolctl``
    installed nothing is limited and the description says so.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield "NumPy BLAS threads: library default (threadpoolctl not installed)"
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        libs = sorted({f"{info['internal_api']}={info['num_threads']}"
                       for info in _blas_info()})
        yield f"NumPy BLAS threads: {threads} via threadpoolctl ({', '.join(libs) or 'none'})"


def _blas_info() -> list[dict[str, object]]:
    from threadpoolctl import threadpool_info

    return [info for info in threadpool_info() if info.get("user_api") == "blas"]
