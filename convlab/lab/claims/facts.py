"""The facts the claims compare across ISA caps, gathered in one child process per cap.

A module of its own because it reads every topic table (which all import
:mod:`~convlab.lab.claims.probe`); :func:`convlab.lab.claims.probe.facts_under` runs
:func:`facts` in a fresh process with the cap's environment.
"""

from __future__ import annotations

from typing import Any

from convlab.lab.claims.bits import digests
from convlab.lab.claims.memory import per_sample_peaks
from convlab.lab.claims.onednn import implementations
from convlab.lab.claims.perf import mkl_gflops
from convlab.lab.claims.routing import half_backends
from convlab.lab.method import verbose_probes


def facts() -> dict[str, Any]:
    """What the checks compare across ISA caps, measured in this process: MKL's announced
    path, the bf16/fp16 backends, oneDNN's implementations and blocks, digests of seeded
    gradients, the per-sample routes' peak memory and MKL's 1-thread GEMM rate."""
    return {"mkl": verbose_probes.mkl_probe(), "half": half_backends(),
            "onednn": implementations(), "digests": digests(),
            "memory": per_sample_peaks(), "mkl_gflops": mkl_gflops()}
