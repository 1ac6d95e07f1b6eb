"""convlab.timing: the interleaved method's bookkeeping (never its numbers)."""

from __future__ import annotations

import pytest

from convlab.timing import Timing, differs, interleaved, noise_band


def test_rounds_interleave_and_count_calls():
    order: list[str] = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    result = interleaved(fns, rounds=3, min_run_time=0.001)
    assert list(result) == ["a", "b"]
    assert all(len(t.rounds) == 3 and t.calls_per_round >= 1 for t in result.values())
    # after the warm-up (a, b), every round runs all of a's calls before b's
    firsts = [i for i, name in enumerate(order) if name == "b"]
    assert order[:2] == ["a", "b"] and order[firsts[1] - 1] == "a"


def test_summaries():
    t = Timing("x", (1.0, 2.0, 3.0, 4.0, 10.0), 7)
    assert t.median == 3.0
    assert t.quartiles == (2.0, 4.0)
    assert t.spread == pytest.approx(3.0)
    u = Timing("y", (3.3,) * 5, 7)
    assert noise_band(t, u) == pytest.approx(0.1)
    assert differs(t, u, band=0.05) and not differs(t, u, band=0.2)


@pytest.mark.parametrize("kwargs", [{"rounds": 0}, {"rounds": 2.0}, {"min_run_time": 0}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        interleaved({"a": lambda: None}, **kwargs)
