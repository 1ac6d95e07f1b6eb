"""convlab.lab.method.timing: the method's bookkeeping and its statistics, on synthetic timings
(never real timings: no test here depends on how fast anything ran)."""

from __future__ import annotations

import contextlib
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convlab.lab.method import timing
from convlab.lab.method.timing import (
    BAND_QUANTILE,
    MIN_ROUNDS,
    Timing,
    aa_band,
    band_from_ratios,
    compare,
    differs,
    interleaved,
    noise_band,
    plan_calls,
    ratio,
    sign_test,
    verdict_of,
)


def test_rounds_interleave_in_a_seeded_shuffled_order(monkeypatch):
    monkeypatch.setattr(timing, "plan_calls", lambda *args: (1, 1))
    order: list[str] = []
    fns = {name: (lambda n=name: order.append(n)) for name in "abcd"}
    result = interleaved(fns, rounds=8, min_run_time=0.001, min_calls=1, seed=3)
    assert list(result) == list("abcd")
    assert all(len(t.rounds) == 8 and t.calls_per_round == 1 for t in result.values())
    # warm-up + estimate: each candidate twice, in the order of fns
    assert order[:8] == ["a", "a", "b", "b", "c", "c", "d", "d"]
    rounds = [order[8 + 4 * i: 12 + 4 * i] for i in range(8)]
    assert all(sorted(r) == list("abcd") for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1, "the order must change between rounds"
    # the same seed gives the same orders; seed=None keeps the order of fns
    again: list[str] = []
    fns2 = {name: (lambda n=name: again.append(n)) for name in "abcd"}
    interleaved(fns2, rounds=8, min_run_time=0.001, min_calls=1, seed=3)
    assert again == order
    plain: list[str] = []
    fns3 = {name: (lambda n=name: plain.append(n)) for name in "abcd"}
    interleaved(fns3, rounds=2, min_run_time=0.001, min_calls=1, seed=None)
    assert plain[8:] == list("abcd") * 2


def test_every_round_runs_at_least_min_calls():
    counts = {"a": 0}

    def fn():
        counts["a"] += 1

    result = interleaved({"a": fn}, rounds=3, min_run_time=1e-9, min_calls=20)
    assert result["a"].calls_per_round >= 20
    # the warm-up, the estimate, then at least 20 timed calls in each of 3 rounds
    assert counts["a"] >= 2 + 3 * 20


@pytest.mark.parametrize(("per_call", "min_calls", "min_time", "want"), [
    (0.073, 20, 0.1, (10, 2)),      # a big layer: 20 calls, never two 1-call blocks
    (1.0, 20, 0.1, (10, 2)),
    (0.01, 20, 0.5, (10, 5)),       # min_run_time decides: 50 calls
    (1e-6, 1, 0.01, (10, 1000)),
    (0.5, 3, 0.1, (3, 1)),          # fewer calls than MAX_BLOCKS: one call per block
])
def test_plan_calls(per_call, min_calls, min_time, want):
    blocks, number = plan_calls(per_call, min_calls, min_time)
    assert (blocks, number) == want
    assert blocks * number >= min_calls
    assert blocks * number * per_call >= min_time * (1 - 1e-9)


def test_summaries():
    t = Timing("x", (1.0, 2.0, 3.0, 4.0, 10.0), 7)
    assert t.median == 3.0
    assert t.quartiles == (2.0, 4.0)
    assert t.spread == pytest.approx(3.0)


@pytest.mark.parametrize("kwargs", [
    {"rounds": 0}, {"rounds": 2.0}, {"min_run_time": 0}, {"min_calls": 0},
    {"threads": 0}, {"threads": -1}, {"threads": 2.5}, {"threads": True},
])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        interleaved({"a": lambda: None}, **kwargs)


def test_threads_per_candidate():
    import torch

    seen: dict[str, set[int]] = {"one": set(), "two": set()}
    fns = {name: (lambda n=name: seen[n].add(torch.get_num_threads())) for name in seen}
    before = torch.get_num_threads()
    interleaved(fns, rounds=2, min_run_time=0.001, min_calls=2, threads={"one": 1, "two": 2})
    assert seen == {"one": {1}, "two": {2}}
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="unknown candidates"):
        interleaved(fns, threads={"three": 1})
    with pytest.raises(ValueError, match="threads"):
        interleaved(fns, threads={"one": 0})


@pytest.mark.parametrize("threads", [0, -1, 1.5, "2"])
def test_blas_threads_rejects_bad_counts(threads):
    with pytest.raises(ValueError, match="threads"), timing.blas_threads(threads):
        pass


def test_around_holds_a_context_per_candidate():
    state = {"held": False}
    seen: list[bool] = []

    @contextlib.contextmanager
    def hold():
        state["held"] = True
        yield
        state["held"] = False

    result = interleaved({"a": lambda: seen.append(state["held"]), "b": lambda: None},
                         rounds=2, min_run_time=0.001, min_calls=2, around={"a": hold})
    assert seen and all(seen) and not state["held"]
    assert set(result) == {"a", "b"}
    with pytest.raises(ValueError, match="unknown candidates"):
        interleaved({"a": lambda: None}, around={"z": hold})


def test_ratio_is_per_round():
    x = Timing("x", (2.0, 4.0, 6.0), 1)
    y = Timing("y", (1.0, 4.0, 2.0), 1)
    r = ratio(x, y)
    assert (r.median, r.low, r.high) == (2.0, 1.0, 3.0)
    assert r.per_round == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError):
        ratio(x, Timing("z", (1.0,), 1))


def test_sign_test_matches_the_binomial():
    assert sign_test(7, 7) == 1 / 128
    assert sign_test(6, 7) == 8 / 128
    assert sign_test(0, 5) == 1.0
    assert MIN_ROUNDS == 6  # 2 * 0.5**6 = 0.031 <= 0.05 < 2 * 0.5**5
    with pytest.raises(ValueError):
        sign_test(8, 7)


def test_band_is_a_quantile_of_pooled_log_ratios():
    # 19 ratios within 2 %, one at 1.5: the 95th percentile (rank 19 of 20) ignores it
    ratios = [1.02] * 10 + [1 / 1.02] * 9 + [1.5]
    assert band_from_ratios(ratios) == pytest.approx(0.02)
    assert band_from_ratios(ratios, quantile=1.0) == pytest.approx(0.5)
    assert math.isnan(band_from_ratios([]))
    with pytest.raises(ValueError):
        band_from_ratios([1.0], quantile=0)


def test_band_pools_every_pair_not_one():
    """One lucky pair (0 % gap) must not set the band: pooling keeps the noisy pair's rounds."""
    quiet = (Timing("a", (1.0,) * 7, 1), Timing("a'", (1.0,) * 7, 1))
    noisy = (Timing("b", (1.0,) * 7, 1), Timing("b'", (1.2, 0.85, 1.1, 0.9, 1.15, 1.0, 1.0), 1))
    assert noise_band(*quiet) == 0.0
    pooled = aa_band([quiet, noisy])
    assert pooled == pytest.approx(0.2)  # rank 14 of 14: the 1.2 round of the noisy pair
    assert math.isnan(aa_band([]))


def _timings(ratios, base=0.01):
    y = Timing("y", tuple(base for _ in ratios), 20)
    x = Timing("x", tuple(base * r for r in ratios), 20)
    return x, y


def test_verdict_needs_every_round_beyond_the_band_with_seven_rounds():
    x, y = _timings([1.3, 1.25, 1.4, 1.31, 1.28, 1.35, 1.3])
    v = compare(x, y, band=0.1)
    assert v.verdict == "slower" and v.above == 7 and v.p_value == pytest.approx(2 / 128)
    assert differs(x, y, band=0.1)
    assert compare(y, x, band=0.1).verdict == "faster"
    # the median is far outside the band, but one round is not: no verdict with 7 rounds
    x, y = _timings([1.3, 1.25, 1.4, 0.95, 1.28, 1.35, 1.3])
    v = compare(x, y, band=0.1)
    assert v.ratio.median > 1.1 and v.verdict == "within noise"
    assert not differs(x, y, band=0.1)


def test_verdict_ratios_on_both_sides_of_one_are_noise():
    """The stored resnet14 fwd+bwd case: median 1.14x, rounds on both sides of 1."""
    v = verdict_of([1.14, 0.92, 1.3, 1.05, 1.2, 0.97, 1.16], band=0.03)
    assert v.ratio.median == pytest.approx(1.14) and v.verdict == "within noise"


def test_verdict_inside_the_band_is_noise_even_if_one_sided():
    v = verdict_of([1.03, 1.04, 1.02, 1.05, 1.03, 1.04, 1.02], band=0.08)
    assert v.verdict == "within noise" and v.above == 0


def test_too_few_rounds_never_give_a_verdict():
    assert verdict_of([2.0] * (MIN_ROUNDS - 1), band=0.01).verdict == "within noise"
    assert verdict_of([2.0] * MIN_ROUNDS, band=0.01).verdict == "slower"


def test_verdict_without_a_band():
    assert verdict_of([2.0] * 7, band=math.nan).verdict == "?"
    with pytest.raises(ValueError):
        verdict_of([], band=0.1)
    with pytest.raises(ValueError):
        verdict_of([1.0], band=-0.1)


def test_false_positive_rate_on_synthetic_aa_noise():
    """Pure noise (lognormal per-round jitter, no true difference): the band from pooled
    A/A pairs and the sign test call almost no pair different."""
    rng = random.Random(0)
    calls = 0
    for _ in range(300):
        pairs = []
        for _ in range(6):
            a = tuple(math.exp(rng.gauss(0, 0.05)) for _ in range(7))
            b = tuple(math.exp(rng.gauss(0, 0.05)) for _ in range(7))
            pairs.append((Timing("a", a, 20), Timing("b", b, 20)))
        band = aa_band(pairs[:5])
        calls += compare(*pairs[5], band).verdict != "within noise"
    assert calls <= 3  # the sign test alone allows 2 * 0.5**7 = 1.6 %; the band cuts more


def test_true_difference_is_found_on_synthetic_noise():
    rng = random.Random(1)
    found = 0
    for _ in range(100):
        aa = [(Timing("a", tuple(math.exp(rng.gauss(0, 0.03)) for _ in range(7)), 20),
               Timing("b", tuple(math.exp(rng.gauss(0, 0.03)) for _ in range(7)), 20))
              for _ in range(5)]
        x = Timing("x", tuple(1.5 * math.exp(rng.gauss(0, 0.03)) for _ in range(7)), 20)
        y = Timing("y", tuple(math.exp(rng.gauss(0, 0.03)) for _ in range(7)), 20)
        found += compare(x, y, aa_band(aa)).verdict == "slower"
    assert found >= 95


def test_blas_threads_reports_what_it_limited():
    pytest.importorskip("threadpoolctl")
    from threadpoolctl import threadpool_info

    from convlab.lab.method.timing import blas_threads

    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with blas_threads(1) as text:
        inside = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        assert "threadpoolctl" in text
    assert all(n == 1 for n in inside)
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


# ------------------------------------------------------------- E6: bad values at the edges


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e300, timing.MAX_RUN_TIME * 2,
                                 0, -0.5, True, "0.1", None])
def test_min_run_time_is_refused_before_any_call(bad):
    """inf used to pass the check and die with OverflowError after the warm-up, and 1e300
    never returned: every bad value must be refused before the candidate runs once."""
    calls = []
    with pytest.raises(ValueError, match="min_run_time must be seconds in"):
        interleaved({"a": lambda: calls.append(1)}, rounds=1, min_run_time=bad)
    assert calls == []


def test_min_run_time_up_to_the_bound_is_accepted():
    assert timing.check_run_time(timing.MAX_RUN_TIME) == timing.MAX_RUN_TIME
    assert timing.check_run_time(1) == 1.0
    t = interleaved({"a": lambda: None}, rounds=1, min_run_time=1e-6, min_calls=1)
    assert len(t["a"].rounds) == 1


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1.0])
def test_a_bad_ratio_is_refused_wherever_it_stands(position, bad):
    """``[nan, 1, 1]`` gave 0.0 and ``[1, 1, nan]`` gave nan: now both are refused, naming
    the position; the verdict refuses them the same way."""
    ratios = [1.0, 1.0]
    ratios.insert(position, bad)
    with pytest.raises(ValueError, match=rf"ratios\[{position}\] must be a finite positive"):
        band_from_ratios(ratios)
    with pytest.raises(ValueError, match=rf"ratios\[{position}\] must be a finite positive"):
        verdict_of(ratios, band=0.05)


ratio_values = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
maybe_bad = st.one_of(ratio_values, st.sampled_from([math.nan, math.inf, 0.0, -2.0]))


@given(st.lists(maybe_bad, min_size=1, max_size=12), st.randoms(use_true_random=False),
       st.sampled_from([0.5, BAND_QUANTILE, 1.0]))
def test_band_does_not_depend_on_the_order_of_the_ratios(ratios, rnd, quantile):
    """Class property: any permutation of the ratios gives the same band, or the same
    refusal (bad values included, anywhere)."""
    shuffled = list(ratios)
    rnd.shuffle(shuffled)

    def outcome(values):
        try:
            return band_from_ratios(values, quantile)
        except ValueError:
            return "refused"

    assert outcome(ratios) == outcome(shuffled)
    bad = any(not (math.isfinite(r) and r > 0) for r in ratios)
    assert (outcome(ratios) == "refused") == bad


def test_cpu_clock_counts_cpu_seconds_not_waiting():
    """A call that sleeps takes wall time but almost no CPU time: the clocks differ in
    what they count (not a speed assertion: sleeping >= 5 ms is guaranteed, and costs
    the process microseconds of CPU)."""
    import time

    fns = {"sleep": lambda: time.sleep(0.005)}
    kw = {"rounds": 2, "min_run_time": 0.01, "min_calls": 2}
    assert timing.interleaved(fns, clock="wall", **kw)["sleep"].median >= 0.005
    assert timing.interleaved(fns, clock="cpu", **kw)["sleep"].median < 0.002


def test_clock_default_and_bad_clocks(monkeypatch):
    monkeypatch.delenv(timing.CLOCK_ENV, raising=False)
    assert timing.default_clock() == "wall"
    monkeypatch.setenv(timing.CLOCK_ENV, "cpu")
    assert timing.default_clock() == "cpu"
    monkeypatch.setenv(timing.CLOCK_ENV, "sundial")
    with pytest.raises(ValueError, match="CONVLAB_CLOCK must be one of wall, cpu"):
        timing.default_clock()
    with pytest.raises(ValueError, match="clock must be one of"):
        timing.interleaved({"a": lambda: None}, rounds=1, clock="gpu")
