"""Small helpers the checks share: seeded tensors, a fresh-process probe, low-ISA env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import torch

# The setting `make test` reruns everything under (the most unlike ISA).
LOW_ISA_ENV = {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"}
TIMEOUT_S = 120


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A seeded normal tensor (never touches the global generator)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def child(code: str, env: Mapping[str, str] | None = None,
          timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` in a fresh process (this interpreter, this ``sys.path``), with
    ``env`` added to this process's environment; returns the finished process."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full, check=False)


def child_json(code: str, env: Mapping[str, str] | None = None,
               timeout: float = TIMEOUT_S) -> Any:
    """:func:`child` for code whose last stdout line is JSON; that value.

    Raises RuntimeError with the child's last stderr line if it failed."""
    done = child(code, env, timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"child exited {done.returncode}: {last}")
    return json.loads(lines[-1])


def aten_and_table(x: torch.Tensor, w: torch.Tensor, args: tuple[Any, ...]) -> tuple[str, str]:
    """The backend ATen's own selection picks for ``x``, ``w`` and the convolution
    ``args`` (stride .. groups, no bias), and the one convlab's rule table
    (:mod:`convlab.aten.selection`) picks for the same call."""
    from convlab.aten import selection
    from convlab.aten.backends import backend_name

    aten = backend_name(torch._C._select_conv_backend(x, w, None, *args))
    return aten, selection.select(selection.ConvQuery.from_tensors(x, w, None, *args)).backend


def bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Same shape and the same bits in every element (NaNs included)."""
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, in float64."""
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
_FACTS_CODE = ("import json; from convlab.lab.claims.facts import facts; "
               "print(json.dumps(facts()))")


def facts_under(env: Mapping[str, str]) -> dict[str, Any]:
    """:func:`convlab.lab.claims.facts.facts` from a fresh process with ``env`` added
    (shared within one
    evaluation, :func:`convlab.lab.claims.core.shared`)."""
    from convlab.lab.claims.core import shared

    key = "facts " + " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    return shared(key, lambda: child_json(_FACTS_CODE, env))


# Each cap's levels, lowest first (an unknown value caps nothing we can rank).
ATEN_LEVELS = ("default", "avx2", "avx512")
MKL_LEVELS = ("sse4_2", "avx", "avx2", "avx512", "avx512_e1", "avx512_e2", "avx512_e3",
              "avx512_e4")


def _rank(name: str, value: str) -> int | None:
    """The level a cap's ``value`` names (higher is wider; None: not one we know)."""
    from convlab.lab.method.isa_settings import ONEDNN_ISA_RANK

    value = value.strip().lower()
    if name == "ONEDNN_MAX_CPU_ISA":
        return ONEDNN_ISA_RANK.get(value)
    levels = ATEN_LEVELS if name == "ATEN_CPU_CAPABILITY" else MKL_LEVELS
    return levels.index(value) if value in levels else None


def cpu_rank(name: str) -> int:
    """The level of cap ``name`` the CPU itself reaches (from its cpuinfo flags)."""
    from convlab.lab.method import machine
    from convlab.lab.method.isa_settings import available_settings

    flags = machine.cpu_flags()
    ranks = [0]
    for s in available_settings(flags):
        value = {"ONEDNN_MAX_CPU_ISA": s.onednn, "ATEN_CPU_CAPABILITY": s.aten_env,
                 "MKL_ENABLE_INSTRUCTIONS": s.mkl}[name]
        ranks.append(_rank(name, value) or 0)
    if "avx" in flags:  # AVX without AVX2: oneDNN's and MKL's avx level
        ranks.append(_rank(name, "avx") or 0)
    return max(ranks)


def capped_env() -> dict[str, str]:
    """The ISA caps this process runs under that bind: a cap at or above the CPU's own
    level (or one we cannot rank) counts as uncapped."""
    names = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
    found = {}
    for k in names:
        rank = _rank(k, os.environ[k]) if k in os.environ else None
        if rank is not None and rank < cpu_rank(k):
            found[k] = os.environ[k]
    return found


def at_level_of(env: Mapping[str, str]) -> str | None:
    """Why this process already runs at or below every cap of ``env`` (its own caps or
    the CPU's level), so that a comparison with ``env`` would compare a setting with
    itself; None where some cap of ``env`` would lower something here."""
    here = capped_env()
    for k, v in env.items():
        want = _rank(k, v)
        if want is None or want >= cpu_rank(k):
            continue  # that cap lowers nothing on this CPU
        have = _rank(k, here[k]) if k in here else cpu_rank(k)
        if have is None or have > want:
            return None
    setting = " ".join(f"{k}={v}" for k, v in env.items())
    caps = " ".join(f"{k}={v}" for k, v in here.items()) or "no binding cap, the CPU's own"
    return (f"this process already runs at or below {setting} ({caps}): comparing with "
            "it would compare a setting with itself")
