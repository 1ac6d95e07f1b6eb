"""The condition of chapter 3's subnormal claims: the microcode-assist probe and its gate.

The decision tests feed made-up ratios and judgements, so they hold on any CPU; the live
test only checks that the probe returns a well-formed judgement here (whatever it finds).
"""

from __future__ import annotations

import math

import pytest
import torch

from convlab.lab import claims
from convlab.lab.claims import core, resolve, subnormal
from convlab.lab.method.effect import median_ci

IDS = ["ch3_subnormal_slows_slow2d", "ch3_subnormal_slows_onednn",
       "ch3_flush_denormal_removes_penalty"]


def _judged(status: str, median: float, band: float = 0.05) -> resolve.Judgement:
    """A made-up judgement of ``status`` around ``median`` (7 rounds)."""
    return resolve.Judgement(status, median_ci([median] * 7), band)


def _spread(median: float, step: float = 0.02) -> list[float]:
    """Seven ratios around ``median``, ``step`` apart."""
    return [median + step * k for k in range(-3, 4)]


@pytest.mark.parametrize(("ratios", "band", "status"), [
    (_spread(30.0, 1.0), 0.05, core.HOLDS),         # an assist: tens of times slower
    (_spread(1.7), 0.05, core.HOLDS),               # just over the threshold
    (_spread(1.02), 0.05, core.FAILS),              # none (AMD Zen)
    (_spread(1.3), 0.05, core.FAILS),               # a small penalty is no assist
    (_spread(1.5, 0.1), 0.05, core.INCONCLUSIVE),   # the interval straddles x1.5
    (_spread(1.0), 0.8, core.INCONCLUSIVE),         # noise wider than the effect
    (_spread(30.0, 1.0), 0.8, core.HOLDS),          # ... but cleared by an assist
])
def test_the_probe_judges_against_the_assist_threshold(
        ratios: list[float], band: float, status: str) -> None:
    assert subnormal.assist_judgement(ratios, band).status == status


def test_the_gate_runs_the_check_only_where_an_assist_was_found() -> None:
    calls: list[int] = []

    def check(status: str = core.HOLDS) -> core.Outcome:
        calls.append(1)
        return core.decided(status, "the check's evidence", ratio=40.0)

    got = subnormal.gated(_judged(core.HOLDS, 35.0), check)
    assert got.status == core.HOLDS and got.evidence == "the check's evidence"
    assert got.detail["ratio"] == 40.0 and got.detail["assist"]["ratio"] == 35.0
    assert len(calls) == 1
    got = subnormal.gated(_judged(core.HOLDS, 35.0), lambda: check(core.FAILS))
    assert got.status == core.FAILS and len(calls) == 2

    got = subnormal.gated(_judged(core.FAILS, 1.02), check)
    assert got.status == core.CANNOT and len(calls) == 2
    assert "no microcode assist" in got.evidence and "x1.02" in got.evidence
    assert got.detail["assist"]["ratio"] == pytest.approx(1.02)

    got = subnormal.gated(_judged(core.INCONCLUSIVE, 1.4, band=0.9), check)
    assert got.status == core.INCONCLUSIVE and len(calls) == 2
    assert "could not tell" in got.evidence and "x1.40" in got.evidence


def test_the_gate_refuses_bad_input() -> None:
    with pytest.raises(TypeError, match="assist"):
        subnormal.gated(1.5, lambda: core.holds("x"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="check"):
        subnormal.gated(_judged(core.HOLDS, 35.0), "check")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="assist"):
        subnormal.gated(_judged("maybe", 35.0), lambda: core.holds("x"))


def _conv_found(slow: str, mkldnn: str, flushed: str) -> dict:
    """A made-up result of :func:`subnormal.measure` (the convolution run)."""
    median = {core.HOLDS: 40.0, core.FAILS: 1.0, core.INCONCLUSIVE: 1.3}
    return {"band": 0.05, "can_flush": True,
            "slow subnormal": _judged(slow, median[slow]),
            "mkldnn subnormal": _judged(mkldnn, median[mkldnn]),
            "slow flushed": _judged(flushed, 1.0 if flushed == core.HOLDS else 40.0),
            "mkldnn flushed": _judged(flushed, 1.0 if flushed == core.HOLDS else 40.0)}


@pytest.mark.parametrize(("assist", "conv", "want"), [
    (core.FAILS, None, [core.CANNOT] * 3),
    (core.INCONCLUSIVE, None, [core.INCONCLUSIVE] * 3),
    (core.HOLDS, (core.HOLDS, core.HOLDS, core.HOLDS), [core.HOLDS] * 3),
    (core.HOLDS, (core.HOLDS, core.FAILS, core.FAILS), [core.HOLDS, core.FAILS, core.FAILS]),
    (core.HOLDS, (core.FAILS, core.FAILS, core.HOLDS), [core.FAILS, core.FAILS, core.CANNOT]),
])
def test_the_three_claims_follow_the_probe(monkeypatch: pytest.MonkeyPatch, assist: str,
                                           conv: tuple[str, str, str] | None,
                                           want: list[str]) -> None:
    probes: list[int] = []

    def fake_assist() -> resolve.Judgement:
        probes.append(1)
        return _judged(assist, {core.HOLDS: 35.0, core.FAILS: 1.02}.get(assist, 1.4))

    def fake_measure() -> dict:
        if conv is None:
            raise AssertionError("the convolution ran without an assist")
        return _conv_found(*conv)

    monkeypatch.setattr(subnormal, "measure_assist", fake_assist)
    monkeypatch.setattr(subnormal, "measure", fake_measure)
    got = claims.evaluate(ids=IDS)
    assert [o.status for o in got] == want, [o.evidence for o in got]
    assert len(probes) == 1  # one probe for the three claims
    if assist == core.FAILS:
        assert all("no microcode assist" in o.evidence for o in got)


def test_the_claims_state_the_assist_condition() -> None:
    rows = [c for c in claims.CLAIMS if c.id in IDS]
    assert len(rows) == 3
    assert all("microcode assist" in c.condition for c in rows)


def test_flush_denormal_sets_and_restores_the_state() -> None:
    with core.kept_flags():
        for start in (False, True):
            torch.set_flush_denormal(start)
            for on in (False, True):
                with subnormal.flush_denormal(on):
                    assert core._flush_denormal_on() == on
                assert core._flush_denormal_on() == start
    with pytest.raises(TypeError, match="on"):
        with subnormal.flush_denormal(1):  # type: ignore[arg-type]
            pass


def test_the_operands_are_subnormal_even_under_flush() -> None:
    with core.kept_flags():
        torch.set_flush_denormal(True)
        ops = subnormal.assist_operands(1000)
        with subnormal.one_thread(), subnormal.flush_denormal(False):
            assert subnormal.all_subnormal(ops["subnormal"])
            assert subnormal.all_subnormal(ops["subnormal"] * ops["b"])
        tiny = torch.finfo(torch.float32).tiny
        assert bool((ops["normal"] >= 1).all() and (ops["b"] >= 0.5).all())
        assert bool((ops["normal"].abs() > tiny).all())
    for bad, err in ((0, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(err, match="n must"):
            subnormal.assist_operands(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="t must"):
        subnormal.all_subnormal(torch.zeros(3, dtype=torch.float64))


def test_the_probe_returns_a_judgement_here() -> None:
    with core.kept_flags():
        torch.set_flush_denormal(True)  # the probe turns it off for itself, then back
        before = core.flags()
        got = subnormal.measure_assist()
        assert core.flags() == before
    assert isinstance(got, resolve.Judgement)
    assert got.status in (core.HOLDS, core.FAILS, core.INCONCLUSIVE)
    assert math.isfinite(got.median) and got.median > 0
    assert got.ci.low <= got.median <= got.ci.high
    assert got.ci.rounds >= resolve.ROUNDS and got.band >= 0
