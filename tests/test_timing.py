"""convlab.lab.timing: the interleaved method's bookkeeping (never its numbers)."""

from __future__ import annotations

import pytest

from convlab.lab.timing import Timing, differs, interleaved, noise_band


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


def test_around_holds_a_context_per_candidate():
    import contextlib

    state = {"held": False}
    seen: list[bool] = []

    @contextlib.contextmanager
    def hold():
        state["held"] = True
        yield
        state["held"] = False

    result = interleaved({"a": lambda: seen.append(state["held"]), "b": lambda: None},
                         rounds=2, min_run_time=0.001, around={"a": hold})
    assert seen and all(seen) and not state["held"]
    assert set(result) == {"a", "b"}
    with pytest.raises(ValueError, match="unknown candidates"):
        interleaved({"a": lambda: None}, around={"z": hold})


def test_ratio_is_per_round():
    from convlab.lab.timing import ratio

    x = Timing("x", (2.0, 4.0, 6.0), 1)
    y = Timing("y", (1.0, 4.0, 2.0), 1)
    r = ratio(x, y)
    assert (r.median, r.low, r.high) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError):
        ratio(x, Timing("z", (1.0,), 1))


def test_blas_threads_reports_what_it_limited():
    pytest.importorskip("threadpoolctl")
    from threadpoolctl import threadpool_info

    from convlab.lab.timing import blas_threads

    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with blas_threads(1) as text:
        inside = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        assert "threadpoolctl" in text
    assert all(n == 1 for n in inside)
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before
