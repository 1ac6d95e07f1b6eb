"""Chapter 3, worked case 3 (pytorch#67797): subnormal weights and the kernel's speed.

One interleaved timing run (shared by the three claims) times a small forward
convolution with normal and with subnormal weights on Slow2d (1 thread) and oneDNN (the
one thread too), each with an A/A twin, and with ``torch.set_flush_denormal(True)``, on
the CPU clock, with extra rounds while it cannot tell (:mod:`convlab.lab.claims.resolve`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
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
from convlab.lab.claims.resolve import adaptive, judge, slower
from convlab.lab.method import timing

# About 1e-42, as in the issue: far below float32's smallest normal number (1.2e-38).
SUBNORMAL_SCALE = 1e-42
CLOCK = "cpu"  # one thread: the process's CPU seconds are the thread's
# The smallest slow-down each sentence turns on: Slow2d "several times slower" (x2),
# oneDNN slowed "as well" (x1.5); the flushed run must resolve x1.5 to say it is not slower.
PENALTY_EFFECT = {"slow": 1.0, "mkldnn": 0.5}
FLUSH_EFFECT = 0.5


@contextmanager
def flushing() -> Iterator[None]:
    """``torch.set_flush_denormal(True)`` inside the block; the previous state after."""
    before = _flush_denormal_on()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


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
    """Subnormal weights make Slow2d (1 thread) slower, beyond the A/A band."""
    return _penalty("slow", "Slow2d, 1 thread")


def check_subnormal_slows_onednn() -> Outcome:
    """Subnormal weights make oneDNN slower, beyond the A/A band."""
    return _penalty("mkldnn", "oneDNN, 1 thread")


def check_flush_removes_penalty() -> Outcome:
    """With ``set_flush_denormal(True)`` no backend is slower on subnormal weights, where
    at least one was without it."""
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


CLAIMS: tuple[Claim, ...] = (
    Claim("ch3_subnormal_slows_slow2d", 3,
          "On a CPU that takes a microcode assist for subnormal operands, subnormal weights "
          "make Slow2d slower.",
          "the CPU's handling of subnormals (penalty on Intel cores in our records)",
          check_subnormal_slows_slow2d),
    Claim("ch3_subnormal_slows_onednn", 3,
          "Subnormal weights slow oneDNN as well, so the thread-count flip to oneDNN "
          "(below) does not cure the issue.",
          "the CPU's handling of subnormals", check_subnormal_slows_onednn),
    Claim("ch3_flush_denormal_removes_penalty", 3,
          "torch.set_flush_denormal(True), which makes the CPU treat subnormals as zero, "
          "removes the penalty.",
          "a CPU with a subnormal penalty and FTZ/DAZ support (SSE3 and up)",
          check_flush_removes_penalty),
)
