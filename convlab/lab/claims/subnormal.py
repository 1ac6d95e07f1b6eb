"""Chapter 3, worked case 3 (pytorch#67797): subnormal weights and the kernel's speed.

One interleaved timing run (shared by the three claims) times a small forward
convolution with normal and with subnormal weights on Slow2d (1 thread) and oneDNN (the
one thread too), each with an A/A twin, and with ``torch.set_flush_denormal(True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import torch

from convlab.aten.backends import use_backend
from convlab.lab import timing
from convlab.lab.claims.core import Claim, Outcome, _flush_denormal_on, cannot, shared, verdict
from convlab.lab.claims.probe import randn

# About 1e-42, as in the issue: far below float32's smallest normal number (1.2e-38).
SUBNORMAL_SCALE = 1e-42
ROUNDS = 7


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
    """Per-backend timings of normal / subnormal / subnormal+flush weights, the pooled A/A
    band, and the verdicts (subnormal and flushed, each against normal)."""
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
    t = timing.interleaved(fns, rounds=ROUNDS, min_run_time=0.01, min_calls=10,
                           threads=1, around=around)
    band = timing.aa_band([(t[f"{b} normal"], t[f"{b} normal'"]) for b in backends])
    found: dict[str, Any] = {"band": band, "can_flush": can_flush}
    for b in backends:
        for case in ("subnormal", "flushed"):
            if f"{b} {case}" in t:
                found[f"{b} {case}"] = timing.compare(t[f"{b} {case}"], t[f"{b} normal"], band)
    return found


def _measured() -> dict[str, Any]:
    return shared("subnormal timing", measure)


def _penalty(backend: str, label: str) -> Outcome:
    found = _measured()
    v = found.get(f"{backend} subnormal")
    if v is None:
        return cannot(f"{label} is not available here")
    return verdict(v.verdict == "slower",
                   f"{label}, subnormal / normal weights: x{v.ratio.median:.2f} "
                   f"(A/A band {v.band:.0%}, {ROUNDS} rounds): {v.verdict}",
                   ratio=v.ratio.median, band=v.band, verdict=v.verdict)


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
    slowed = [b for b in ("slow", "mkldnn")
              if f"{b} subnormal" in found and found[f"{b} subnormal"].verdict == "slower"]
    if not slowed:
        return cannot("no subnormal penalty here to remove (see the two claims above)")
    flushed = {b: found[f"{b} flushed"] for b in slowed}
    text = ", ".join(f"{b} x{v.ratio.median:.2f} ({v.verdict})" for b, v in flushed.items())
    return verdict(all(v.verdict != "slower" for v in flushed.values()),
                   f"flushed / normal: {text}; A/A band {found['band']:.0%}",
                   ratios={b: v.ratio.median for b, v in flushed.items()})


CLAIMS: tuple[Claim, ...] = (
    Claim("ch3_subnormal_slows_slow2d", 3,
          "Subnormal weights (about 1e-42) make Slow2d several times slower on CPUs that "
          "take a microcode assist for subnormal operands.",
          "the CPU's handling of subnormals (penalty on Intel cores in our records)",
          check_subnormal_slows_slow2d),
    Claim("ch3_subnormal_slows_onednn", 3,
          "Subnormal weights slow oneDNN as well, so the thread-count flip to oneDNN "
          "does not cure #67797.",
          "the CPU's handling of subnormals", check_subnormal_slows_onednn),
    Claim("ch3_flush_denormal_removes_penalty", 3,
          "torch.set_flush_denormal(True) removes the subnormal penalty.",
          "a CPU with a subnormal penalty and FTZ/DAZ support (SSE3 and up)",
          check_flush_removes_penalty),
)
