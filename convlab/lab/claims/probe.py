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


def child_json(code: str, env: Mapping[str, str] | None = None) -> Any:
    """:func:`child` for code whose last stdout line is JSON; that value.

    Raises RuntimeError with the child's last stderr line if it failed."""
    done = child(code, env)
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


def capped_env() -> dict[str, str]:
    """The environment this process runs under, as far as ISA caps go."""
    names = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
    return {k: os.environ[k] for k in names if k in os.environ}
