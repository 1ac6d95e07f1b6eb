"""Interleaved timing: the one measurement method every comparison in convlab uses.

The method, step by step:

1. **Calls per round.** After a warm-up call, one timed call estimates a candidate's cost
   ``t``; every round then times ``n = max(min_calls, ceil(min_run_time / t))`` calls of it
   (at least 20 by default, however big the layer), in up to 10 blocks of equal size
   (``torch.utils.benchmark.Timer``); the round's value is the median over its blocks of
   seconds per call, so one interrupted block does not move it.
2. **Interleaving in random order.** Each round times every candidate once; the order of
   the candidates is shuffled afresh each round (seeded, so a run is repeatable), so a slow
   phase of a shared machine, or a cache warmed by the candidate before, hits all of them
   alike rather than always the same one.
3. **Per-round ratios.** Round ``i`` of two candidates ran side by side; their ratio
   ``x_i / y_i`` cancels a slow phase both saw. :func:`ratio` summarises them.
4. **The A/A band** (:func:`aa_band`): pairs that run the same kernel reached two ways (an
   A/A pair) differ only by noise. Their per-round ratios are pooled over *every* pair of
   the run (never one pair: one pair's gap is itself a noisy number), and the band is the
   95th percentile of ``|log ratio|``, written as a relative gap ``exp(q) - 1``.
5. **The verdict** (:func:`compare`), a **sign test** against the band's edges: ``x`` is
   *slower* than ``y`` only when so many per-round ratios lie above ``1 + band`` that the
   two-sided sign test rejects "the median ratio is at most ``1 + band``" at
   ``alpha = 0.05`` (each direction at ``alpha / 2``); *faster* likewise below
   ``1 / (1 + band)``; else *within noise*. With 7 rounds this means all 7 ratios on one
   side of 1 and outside the band; fewer than ``MIN_ROUNDS`` rounds never give a
   verdict.

**The clock** (``clock``): ``"wall"`` times elapsed seconds (``time.perf_counter``);
``"cpu"`` times the CPU seconds of the whole process (``time.process_time``: every thread,
user and system), for a busy machine where a preempted call's wall time counts other jobs'
work. A CPU-time second is not an elapsed one: with ``t`` threads busy a call's CPU time is
up to ``t`` times its wall time, so CPU-time rates are per core-second and ratios compare
the work two candidates made the cores do (time spinning in a thread pool counts as work).
``CONVLAB_CLOCK=cpu`` in the environment makes ``"cpu"`` the default (the records runner's
``--clock cpu`` sets it in its child processes).

>>> import torch
>>> x = torch.randn(256, 256)
>>> t = interleaved({"mm": lambda: x @ x, "matmul": lambda: torch.matmul(x, x)},
...                 rounds=3, min_run_time=0.01, min_calls=5)
>>> sorted(t)
['matmul', 'mm']
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # imported where used: torch.utils.benchmark imports cpp_extension, which
    # warns on a CUDA wheel without a CUDA runtime, so importing convlab must not
    from torch.utils.benchmark import Timer

ALPHA = 0.05
BAND_QUANTILE = 0.95
MAX_BLOCKS = 10
# The largest ``min_run_time`` accepted, in seconds per candidate and round. A benchmark
# round longer than an hour per candidate is a mistake, not a measurement (7 rounds of two
# candidates would take most of a day), and the bound keeps ``ceil(min_run_time / t)`` a
# call count a loop can finish (1e300 s would never return; inf overflows to an int).
MAX_RUN_TIME = 3600.0


# clock name -> the function that reads it (module docstring, "The clock")
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK_ENV = "CONVLAB_CLOCK"


def check_clock(clock: object, name: str = "clock") -> str:
    """``clock`` as one of ``CLOCKS`` (``ValueError`` naming ``name`` otherwise)."""
    if not isinstance(clock, str) or clock not in CLOCKS:
        raise ValueError(f"{name} must be one of {', '.join(CLOCKS)}, got {clock!r}")
    return clock


def default_clock() -> str:
    """The clock :func:`interleaved` uses when given none: ``$CONVLAB_CLOCK`` or wall."""
    return check_clock(os.environ.get(CLOCK_ENV, "wall"), CLOCK_ENV)


def _min_rounds(alpha: float) -> int:
    n = 1
    while 2 * 0.5**n > alpha:
        n += 1
    return n


# The fewest rounds with which the two-sided sign test can reject at ALPHA (all on one side).
MIN_ROUNDS = _min_rounds(ALPHA)


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


def check_threads(threads: object, name: str = "threads") -> int:
    """``threads`` as a positive int (``ValueError`` naming ``name`` otherwise)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name} must be a positive int, got {threads!r}")
    return threads


def check_run_time(min_run_time: object, name: str = "min_run_time") -> float:
    """``min_run_time`` as seconds in ``(0, MAX_RUN_TIME]`` (``ValueError`` naming ``name``
    for NaN, inf, zero, negative, too large or a non-number)."""
    if isinstance(min_run_time, bool) or not isinstance(min_run_time, int | float) \
            or not 0 < min_run_time <= MAX_RUN_TIME:
        raise ValueError(f"{name} must be seconds in (0, {MAX_RUN_TIME:g}], "
                         f"got {min_run_time!r}")
    return float(min_run_time)


def check_ratios(ratios: Iterable[float], name: str = "ratios") -> list[float]:
    """``ratios`` as a list of finite positive floats (``ValueError`` naming ``name`` and
    the first bad position otherwise).

    Why refuse rather than drop: a time ratio is finite and positive by construction, so a
    NaN, inf, zero or negative one means a broken measurement; dropping it would shrink
    the band's sample without saying so, and keeping it made the answer depend on where
    in the list it stood (``sorted`` and ``max`` are not order-free with NaN).
    """
    out = []
    for i, r in enumerate(ratios):
        if isinstance(r, bool) or not isinstance(r, int | float) \
                or not (math.isfinite(r) and r > 0):
            raise ValueError(f"{name}[{i}] must be a finite positive ratio, got {r!r}")
        out.append(float(r))
    return out


def plan_calls(seconds_per_call: float, min_calls: int, min_run_time: float) -> tuple[int, int]:
    """``(blocks, calls per block)`` for one round: at least ``min_calls`` calls and
    ``min_run_time`` seconds, in at most ``MAX_BLOCKS`` blocks of equal size.

    >>> plan_calls(0.073, 20, 0.1)     # a 73 ms layer: 20 calls, 10 blocks of 2
    (10, 2)
    >>> plan_calls(1e-5, 20, 0.1)      # 10 us: 10000 calls in 10 blocks
    (10, 1000)
    """
    per_call = max(seconds_per_call, 1e-9)
    calls = max(min_calls, math.ceil(min_run_time / per_call))
    blocks = min(MAX_BLOCKS, calls)
    return blocks, math.ceil(calls / blocks)


def _time_block(timer: Timer, number: int) -> float:
    """Seconds per call of ``number`` calls (the Timer's thread setting applied)."""
    from torch.utils.benchmark.utils import common

    with common.set_torch_threads(timer._task_spec.num_threads):
        return timer._timeit(number) / number


def interleaved(
    fns: Mapping[str, Callable[[], object]],
    rounds: int = 7,
    min_run_time: float = 0.1,
    threads: int | Mapping[str, int] | None = None,
    around: Mapping[str, Callable[[], AbstractContextManager[object]]] | None = None,
    min_calls: int = 20,
    seed: int | None = 0,
    clock: str | None = None,
) -> dict[str, Timing]:
    """Time every callable in ``fns`` in ``rounds`` interleaved rounds (module docstring).

    Args:
        fns: name -> zero-argument callable (run once before timing, as a warm-up).
        rounds: number of rounds (>= 1; >= ``MIN_ROUNDS`` for a verdict); each times every
            candidate once, in an order shuffled per round.
        min_run_time: seconds each candidate runs at least per round, in
            ``(0, MAX_RUN_TIME]``.
        threads: torch threads for the timed calls (default: the current setting), or
            name -> threads per candidate (e.g. to measure thread scaling side by side;
            candidates not named get the current setting).
        around: name -> context-manager factory entered around that candidate's warm-up
            and each of its rounds (e.g. a forced backend), so that its set-up is not timed.
        min_calls: calls each candidate runs at least per round (>= 1).
        seed: seed of the per-round shuffle (None: keep the order of ``fns``).
        clock: ``"wall"`` or ``"cpu"`` (module docstring); None: :func:`default_clock`.

    Returns:
        name -> :class:`Timing`, in the order of ``fns``.
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    check_run_time(min_run_time)
    check_threads(min_calls, "min_calls")
    read_clock = CLOCKS[default_clock() if clock is None else check_clock(clock)]
    default = torch.get_num_threads()
    if isinstance(threads, Mapping):
        if set(threads) - set(fns):
            raise ValueError("threads names unknown candidates: "
                             f"{sorted(set(threads) - set(fns))}")
        per_fn = {name: check_threads(threads.get(name, default)) for name in fns}
    else:
        per_fn = dict.fromkeys(fns, default if threads is None else check_threads(threads))
    around = dict(around or {})
    unknown = set(around) - set(fns)
    if unknown:
        raise ValueError(f"around names unknown candidates: {sorted(unknown)}")

    def context(name: str) -> AbstractContextManager[object]:
        return around[name]() if name in around else contextlib.nullcontext()

    from torch.utils.benchmark import Timer

    timers = {name: Timer(stmt="fn()", globals={"fn": fn}, num_threads=per_fn[name],
                          timer=read_clock)
              for name, fn in fns.items()}
    plans: dict[str, tuple[int, int]] = {}
    for name in fns:
        with context(name):
            _time_block(timers[name], 1)  # the warm-up, with the candidate's threads
            start = read_clock()
            _time_block(timers[name], 1)
            plans[name] = plan_calls(read_clock() - start, min_calls, min_run_time)
    order = list(fns)
    shuffle = random.Random(seed).shuffle if seed is not None else None
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        if shuffle is not None:
            shuffle(order)
        for name in order:
            blocks, number = plans[name]
            with context(name):
                times = [_time_block(timers[name], number) for _ in range(blocks)]
            per_round[name].append(statistics.median(times))
    return {name: Timing(name, tuple(per_round[name]), plans[name][0] * plans[name][1])
            for name in fns}


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Ratio:
    """Time ratio x / y: median of the per-round ratios, their range, and the ratios."""

    median: float
    low: float
    high: float
    per_round: tuple[float, ...] = ()

    def __str__(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


def round_ratios(x: Timing, y: Timing) -> list[float]:
    """``x_i / y_i`` for every round ``i`` of one :func:`interleaved` run."""
    if len(x.rounds) != len(y.rounds):
        raise ValueError(f"{x.name} and {y.name} have different round counts")
    return [a / b for a, b in zip(x.rounds, y.rounds, strict=True)]


def ratio(x: Timing, y: Timing) -> Ratio:
    """Per-round ratio ``x / y`` of two candidates of one :func:`interleaved` run."""
    per_round = round_ratios(x, y)
    return Ratio(statistics.median(per_round), min(per_round), max(per_round),
                 tuple(per_round))


def band_from_ratios(ratios: Iterable[float], quantile: float = BAND_QUANTILE) -> float:
    """The A/A band of pooled per-round A/A ratios: ``exp(q) - 1`` with ``q`` the
    ``quantile`` (nearest rank, rounding up) of ``|log ratio|``; NaN without ratios.
    A NaN, infinite, zero or negative ratio is refused (:func:`check_ratios`), wherever
    it stands, so the band never depends on the order of the ratios.

    >>> round(band_from_ratios([1.02, 0.95, 1.01, 1.10]), 3)
    0.1
    """
    if isinstance(quantile, bool) or not isinstance(quantile, int | float) \
            or not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    logs = sorted(abs(math.log(r)) for r in check_ratios(ratios))
    if not logs:
        return math.nan
    return math.exp(logs[math.ceil(quantile * len(logs)) - 1]) - 1


def aa_band(pairs: Iterable[tuple[Timing, Timing]], quantile: float = BAND_QUANTILE) -> float:
    """The noise band of a run, pooled over the per-round ratios of *all* its A/A pairs
    (each pair: two candidates running the same kernel); see :func:`band_from_ratios`."""
    return band_from_ratios([r for a, b in pairs for r in round_ratios(a, b)], quantile)


def noise_band(a: Timing, b: Timing) -> float:
    """The band of one A/A pair alone (:func:`aa_band` over ``[(a, b)]``).

    One pair is a noisy estimate of the noise: pool every pair of a run with
    :func:`aa_band` where a run has several.
    """
    return aa_band([(a, b)])


def sign_test(above: int, n: int) -> float:
    """One-sided sign-test p-value: ``P(K >= above)`` for ``K ~ Binomial(n, 1/2)``.

    >>> sign_test(7, 7)
    0.0078125
    """
    if not 0 <= above <= n:
        raise ValueError(f"need 0 <= above <= n, got above={above}, n={n}")
    return sum(math.comb(n, k) for k in range(above, n + 1)) / 2**n


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`compare`: ``verdict`` is slower, faster, within noise or ``?``
    (no band); ``above``/``below`` count rounds beyond the band's edges; ``p_value`` is the
    two-sided sign-test p-value of the side with more rounds beyond its edge."""

    ratio: Ratio
    band: float
    above: int
    below: int
    p_value: float
    verdict: str

    def __str__(self) -> str:
        band = "n/a" if math.isnan(self.band) else f"{self.band:.0%}"
        return f"{self.ratio} (A/A band {band}, p={self.p_value:.3f}): {self.verdict}"


def verdict_of(ratios: Sequence[float], band: float, alpha: float = ALPHA) -> Verdict:
    """The sign-test verdict of per-round ratios against ``band`` (module docstring, step 5).

    ``ratios`` must be finite and positive (:func:`check_ratios`); a NaN ``band`` (no A/A
    pair) gives the verdict ``?``."""
    ratios = check_ratios(ratios)
    if not ratios:
        raise ValueError("ratios: need at least one per-round ratio")
    summary = Ratio(statistics.median(ratios), min(ratios), max(ratios), tuple(ratios))
    if math.isnan(band):
        return Verdict(summary, band, 0, 0, math.nan, "?")
    if band < 0:
        raise ValueError(f"band must be >= 0, got {band!r}")
    n = len(ratios)
    above = sum(r > 1 + band for r in ratios)
    below = sum(r < 1 / (1 + band) for r in ratios)
    p = min(1.0, 2 * sign_test(max(above, below), n))
    if p <= alpha and above > below:
        word = "slower"
    elif p <= alpha and below > above:
        word = "faster"
    else:
        word = "within noise"
    return Verdict(summary, band, above, below, p, word)


def compare(x: Timing, y: Timing, band: float, alpha: float = ALPHA) -> Verdict:
    """Is ``x`` slower or faster than ``y`` (same run) beyond the A/A ``band``? A sign test."""
    return verdict_of(round_ratios(x, y), band, alpha)


def differs(x: Timing, y: Timing, band: float) -> bool:
    """Whether :func:`compare` finds ``x`` and ``y`` different (slower or faster)."""
    return compare(x, y, band).verdict in ("slower", "faster")


# ----------------------------------------------------------------------- NumPy's threads


@contextlib.contextmanager
def blas_threads(threads: int) -> Iterator[str]:
    """Limit NumPy's BLAS (and OpenMP pools threadpoolctl sees) to ``threads`` inside the block.

    Yields a description of what was limited, for reports. Without ``threadpoolctl``
    installed nothing is limited and the description says so. ``threads`` must be a
    positive int (``ValueError`` before anything is limited).
    """
    check_threads(threads)
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
