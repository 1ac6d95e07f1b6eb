"""Chapter 3, worked case 3 (pytorch#67797): subnormal weights and the kernel's speed.

The sentences hold "on a CPU that takes a microcode assist for subnormal operands", so
the condition has a probe of its own (:func:`measure_assist`, shared by the three
claims): one float32 elementwise multiply whose operands and products are subnormal,
timed against the same multiply on normal numbers, with flush-to-zero off. Where it
finds no assist the claims cannot run here; where it cannot tell they are inconclusive
(:func:`gated`).

Where it finds one, one interleaved timing run (shared by the three claims) times a small
forward convolution with normal and with subnormal weights on Slow2d (1 thread) and
oneDNN (the one thread too), each with an A/A twin, and with
``torch.set_flush_denormal(True)``. Both runs use the CPU clock, with extra rounds while
they cannot tell (:mod:`convlab.lab.claims.resolve`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace
from typing import Any

import torch

from convlab.aten.backends import use_backend
from convlab.lab.claims.core import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    Claim,
    Outcome,
    _flush_denormal_on,
    cannot,
    decided,
    inconclusive,
    shared,
)
from convlab.lab.claims.probe import randn
from convlab.lab.claims.resolve import Judgement, Region, adaptive, judge, slower
from convlab.lab.method import timing

# About 1e-42, as in the issue: far below float32's smallest normal number (1.2e-38).
SUBNORMAL_SCALE = 1e-42
CLOCK = "cpu"  # one thread: the process's CPU seconds are the thread's
# The smallest slow-down each sentence turns on: Slow2d "several times slower" (x2),
# oneDNN slowed "as well" (x1.5); the flushed run must resolve x1.5 to say it is not slower.
PENALTY_EFFECT = {"slow": 1.0, "mkldnn": 0.5}
FLUSH_EFFECT = 0.5
# The assist probe: one float32 multiply of 2**16 elements (256 KiB per operand, in L2;
# a vectorised ATen kernel), subnormal ``a`` times ``b`` in [0.5, 1.5) (the products stay
# subnormal) against normal ``a`` times the same ``b``.
ASSIST_SIZE = 1 << 16
# The slow-down of that multiply from which a CPU "takes a microcode assist": x1.5. An
# assist costs on the order of a hundred cycles per instruction that meets a subnormal,
# against about one for a vector multiply, so where it is taken the multiply runs tens of
# times slower; a CPU that handles subnormals in hardware (AMD Zen) stays within a few
# percent of the normal multiply. x1.5 lies far below the first and above the second,
# and above the noise a quiet run's A/A band spans; a small penalty under it is no assist.
ASSIST_RATIO = 1.5


@contextmanager
def flush_denormal(on: bool) -> Iterator[None]:
    """``torch.set_flush_denormal(on)`` inside the block; the previous state after."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be a bool, got {on!r}")
    before = _flush_denormal_on()
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


@contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread inside the block; the previous count after. The flush-to-zero
    state is per thread (a pool thread keeps the one it was created with), so an op that
    must see subnormals runs on this thread, whose state :func:`flush_denormal` sets."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def flushing() -> AbstractContextManager[None]:
    """``torch.set_flush_denormal(True)`` inside the block; the previous state after."""
    return flush_denormal(True)


def all_subnormal(t: torch.Tensor) -> bool:
    """Whether every element of float32 ``t`` is a nonzero subnormal."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise TypeError(f"t must be a float32 tensor, got {t!r:.80}")
    return bool(((t != 0) & (t.abs() < torch.finfo(torch.float32).tiny)).all())


# ------------------------------------------------------------------ the assist probe


def assist_operands(n: int = ASSIST_SIZE) -> dict[str, torch.Tensor]:
    """Seeded float32 operands of ``n`` elements for the probe: ``normal`` in [1, 2),
    ``subnormal`` (the same times ``SUBNORMAL_SCALE``, made with flush-to-zero off) and
    ``b`` in [0.5, 1.5), whose products with ``subnormal`` are subnormal too (the assist's
    inputs and outputs)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {n!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    gen = torch.Generator().manual_seed(3)
    base = torch.rand(n, generator=gen, dtype=torch.float64) + 1
    b = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5
    with one_thread(), flush_denormal(False):
        sub = (base * SUBNORMAL_SCALE).float()
    return {"normal": base.float(), "subnormal": sub, "b": b.float()}


def assist_regions() -> tuple[Region, Region]:
    """Regions of "takes an assist" for the subnormal / normal multiply time ratio:
    holds at or above ``ASSIST_RATIO``, does not hold below it."""
    return ((ASSIST_RATIO, math.inf),), ((0.0, ASSIST_RATIO),)


def assist_judgement(ratios: Sequence[float], band: float) -> Judgement:
    """The judgement (:func:`convlab.lab.claims.resolve.judge`) of per-round subnormal /
    normal multiply ``ratios`` under the A/A ``band``: holds (an assist), does not hold
    (none, or a penalty under ``ASSIST_RATIO``) or inconclusive."""
    return judge(ratios, band, assist_regions(), ASSIST_RATIO - 1)


def measure_assist(n: int = ASSIST_SIZE) -> Judgement:
    """Whether this CPU takes a microcode assist on subnormal float32: ``torch.mul`` of
    ``n`` subnormal by normal elements against normal by normal (:func:`assist_operands`),
    with an A/A twin, one thread, flush-to-zero off, CPU clock; more rounds while
    inconclusive. Returns :func:`assist_judgement` of the run."""
    ops = assist_operands(n)
    a, sub, b = ops["normal"], ops["subnormal"], ops["b"]
    out = torch.empty_like(b)
    with one_thread(), flush_denormal(False):
        torch.mul(sub, b, out=out)
        if not (all_subnormal(sub) and all_subnormal(out)):
            raise RuntimeError("the probe's operands or products are not all subnormal")
    fns: dict[str, Callable[[], object]] = {
        "normal": lambda: torch.mul(a, b, out=out),
        "normal'": lambda: torch.mul(a, b, out=out),
        "subnormal": lambda: torch.mul(sub, b, out=out)}
    around = dict.fromkeys(fns, lambda: flush_denormal(False))

    def run(rounds: int, seed: int) -> dict[str, timing.Timing]:
        return timing.interleaved(fns, rounds=rounds, min_run_time=0.01, min_calls=10,
                                  threads=1, around=around, seed=seed, clock=CLOCK)

    def judged(t: dict[str, timing.Timing]) -> Judgement:
        band = timing.aa_band([(t["normal"], t["normal'"])])
        return assist_judgement(timing.round_ratios(t["subnormal"], t["normal"]), band)

    return judged(adaptive(run, lambda t: judged(t).status != INCONCLUSIVE))


def _assist() -> Judgement:
    return shared("subnormal assist", measure_assist)


def gated(assist: Judgement, check: Callable[[], Outcome]) -> Outcome:
    """``check()`` where the probe ``assist`` found a microcode assist (its numbers added
    to the detail); else cannot run here (no assist) or inconclusive (could not tell),
    without running ``check``: the sentences are about CPUs that take one."""
    if not isinstance(assist, Judgement):
        raise TypeError(f"assist must be a Judgement, got {type(assist).__name__}")
    if not callable(check):
        raise TypeError(f"check must be callable, got {type(check).__name__}")
    probe = (f"elementwise multiply, CPU time, subnormal / normal: {assist}; "
             f"an assist is x{ASSIST_RATIO:g} or more")
    if assist.status == HOLDS:
        out = check()
        return replace(out, detail={**out.detail, "assist": assist.detail()})
    if assist.status == FAILS:
        return cannot(f"this CPU takes no microcode assist on subnormal float32 ({probe})",
                      assist=assist.detail())
    if assist.status == INCONCLUSIVE:
        return inconclusive("could not tell whether this CPU takes a microcode assist on "
                            f"subnormal float32 ({probe})", assist=assist.detail())
    raise ValueError(f"assist: unknown status {assist.status!r}")


# ------------------------------------------------------------------ the convolution run


def measure() -> dict[str, Any]:
    """Per-backend judgements (:func:`convlab.lab.claims.resolve.judge`) of subnormal
    weights against normal ones (holds: slower) and, where flushing is supported, of
    flushed subnormal ones against normal ones (holds: not slower); the pooled A/A
    ``band`` and ``can_flush``. More rounds while a penalty (or a found penalty's flush)
    is inconclusive."""
    x = randn(2, 8, 24, 24)
    w = randn(8, 8, 3, 3, seed=1)
    sub = (w.double().sign() * (w.double().abs() + 1) * SUBNORMAL_SCALE).float()
    if not bool((sub != 0).all() and (sub.abs() < torch.finfo(torch.float32).tiny).all()):
        raise RuntimeError("the scaled weights are not all subnormal")
    can_flush = torch.set_flush_denormal(_flush_denormal_on())  # True where supported
    backends = ["slow"] + (["mkldnn"] if torch.backends.mkldnn.is_available() else [])
    fns: dict[str, Callable[[], object]] = {}
    around: dict[str, Callable[[], AbstractContextManager[object]]] = {}
    for b in backends:
        cases = {"normal": w, "normal'": w, "subnormal": sub}
        if can_flush:
            cases["flushed"] = sub
        for case, weight in cases.items():
            name = f"{b} {case}"
            fns[name] = lambda weight=weight: torch.nn.functional.conv2d(x, weight, padding=1)

            def ctx(b: str = b, case: str = case) -> AbstractContextManager[object]:
                stack = ExitStack()
                stack.enter_context(use_backend(b, x, w, None, 1, 1))
                if case == "flushed":
                    stack.enter_context(flushing())
                return stack

            around[name] = ctx
    # One thread for both: the claim is about subnormals, and on a busy machine a
    # multi-threaded oneDNN call of this size waits on descheduled threads (ms of noise).
    def run(rounds: int, seed: int) -> dict[str, timing.Timing]:
        return timing.interleaved(fns, rounds=rounds, min_run_time=0.01, min_calls=10,
                                  threads=1, around=around, seed=seed, clock=CLOCK)

    def judged(t: dict[str, timing.Timing]) -> dict[str, Any]:
        band = timing.aa_band([(t[f"{b} normal"], t[f"{b} normal'"]) for b in backends])
        found: dict[str, Any] = {"band": band}
        for b in backends:
            found[f"{b} subnormal"] = judge(
                timing.round_ratios(t[f"{b} subnormal"], t[f"{b} normal"]), band,
                slower(band), PENALTY_EFFECT[b])
            if f"{b} flushed" in t:  # holds: flushed is not slower (the regions swapped)
                holds, fails = slower(band)
                found[f"{b} flushed"] = judge(
                    timing.round_ratios(t[f"{b} flushed"], t[f"{b} normal"]), band,
                    (fails, holds), FLUSH_EFFECT)
        return found

    def settled(t: dict[str, timing.Timing]) -> bool:
        found = judged(t)
        penalties = [found[f"{b} subnormal"] for b in backends]
        flushed = [found[f"{b} flushed"] for b in backends
                   if found[f"{b} subnormal"].status == HOLDS and f"{b} flushed" in found]
        return all(j.status != INCONCLUSIVE for j in penalties + flushed)

    return {"can_flush": can_flush, **judged(adaptive(run, settled))}


def _measured() -> dict[str, Any]:
    return shared("subnormal timing", measure)


def _penalty(backend: str, label: str) -> Outcome:
    j = _measured().get(f"{backend} subnormal")
    if j is None:
        return cannot(f"{label} is not available here")
    return decided(j.status, f"{label}, CPU time, subnormal / normal weights: {j}",
                   **j.detail())


def check_subnormal_slows_slow2d() -> Outcome:
    """On a CPU that takes an assist, subnormal weights make Slow2d (1 thread) slower,
    beyond the A/A band."""
    return gated(_assist(), lambda: _penalty("slow", "Slow2d, 1 thread"))


def check_subnormal_slows_onednn() -> Outcome:
    """On a CPU that takes an assist, subnormal weights make oneDNN slower, beyond the
    A/A band."""
    return gated(_assist(), lambda: _penalty("mkldnn", "oneDNN, 1 thread"))


def check_flush_removes_penalty() -> Outcome:
    """On a CPU that takes an assist, with ``set_flush_denormal(True)`` no backend is
    slower on subnormal weights, where at least one was without it."""
    return gated(_assist(), _flush_removes_penalty)


def _flush_removes_penalty() -> Outcome:
    """The flush claim's check, on a CPU that takes an assist (see :func:`gated`)."""
    found = _measured()
    if not found["can_flush"]:
        return cannot("torch.set_flush_denormal is not supported on this CPU")
    penalties = {b: found[f"{b} subnormal"] for b in ("slow", "mkldnn")
                 if f"{b} subnormal" in found}
    slowed = [b for b, j in penalties.items() if j.status == HOLDS]
    if not slowed:
        if any(j.status == INCONCLUSIVE for j in penalties.values()):
            return inconclusive("could not tell whether subnormals slow a backend here "
                                "(see the two claims above)")
        return cannot("no subnormal penalty here to remove (see the two claims above)")
    flushed = {b: found[f"{b} flushed"] for b in slowed}
    statuses = {j.status for j in flushed.values()}
    status = FAILS if FAILS in statuses else INCONCLUSIVE if INCONCLUSIVE in statuses \
        else HOLDS
    text = "; ".join(f"{b} {j}" for b, j in flushed.items())
    return decided(status, f"flushed / normal, CPU time: {text}",
                   ratios={b: j.median for b, j in flushed.items()},
                   statuses={b: j.status for b, j in flushed.items()})


# The condition the sentences state (chapter 3), and how the probe tests it.
ASSIST_CONDITION = (f"a CPU that takes a microcode assist for subnormal operands, as the "
                    f"Intel cores of our records do (probe: a float32 multiply on "
                    f"subnormals at least x{ASSIST_RATIO:g} slower)")

CLAIMS: tuple[Claim, ...] = (
    Claim("ch3_subnormal_slows_slow2d", 3,
          "On a CPU that takes a microcode assist for subnormal operands, subnormal weights "
          "make Slow2d slower.",
          ASSIST_CONDITION, check_subnormal_slows_slow2d),
    Claim("ch3_subnormal_slows_onednn", 3,
          "Subnormal weights slow oneDNN as well, so the thread-count flip to oneDNN "
          "(below) does not cure the issue.",
          ASSIST_CONDITION, check_subnormal_slows_onednn),
    Claim("ch3_flush_denormal_removes_penalty", 3,
          "torch.set_flush_denormal(True), which makes the CPU treat subnormals as zero, "
          "removes the penalty.",
          f"{ASSIST_CONDITION}, with FTZ/DAZ support (SSE3 and up)",
          check_flush_removes_penalty),
)
