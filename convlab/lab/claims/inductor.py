"""Chapter 9's ``torch.compile`` claims, inspected in the installed torch.

The GPU branch of Inductor's decomposition is run on fake CUDA tensors
(``FakeTensorMode``: shapes and devices only, no GPU needed), with a dispatch mode
recording the ATen ops it calls.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from convlab.lab.claims.core import Claim, Outcome, cannot, verdict


class _Ops(TorchDispatchMode):
    """Records each ATen op called (name and output_mask of convolution_backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        name = str(func.overloadpacket.__name__)
        if name == "convolution_backward":
            name += f" mask={list(args[10])}"
        self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _decomposed(device: str) -> tuple[bool, list[str]]:
    """(whether Inductor's decomposition declined, the ops it called) for ``device``."""
    from torch._inductor import decomposition
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), _Ops() as ops:
        x = torch.empty(2, 3, 8, 8, device=device)
        w = torch.empty(4, 3, 3, 3, device=device)
        g = torch.empty(2, 4, 6, 6, device=device)
        out = decomposition.convolution_backward(g, x, w, [4], [1, 1], [0, 0], [1, 1], False,
                                                 [0, 0], 1, [True, True, True])
    return out is NotImplemented, [c for c in ops.calls if c != "empty"]


def check_gpu_bias_split() -> Outcome:
    """Inductor keeps ATen's operator on the CPU (its decomposition declines) and, on a
    GPU, computes grad_bias as a ``sum`` and asks ATen for the other two only."""
    cpu_declines, _ = _decomposed("cpu")
    gpu_declines, calls = _decomposed("cuda")
    ok = (cpu_declines and not gpu_declines and "sum" in calls
          and "convolution_backward mask=[True, True, False]" in calls)
    return verdict(ok, f"CPU: {'declines' if cpu_declines else 'decomposes'}; CUDA (fake "
                   f"tensors): {', '.join(calls) or 'declines'}", cpu_declines=cpu_declines,
                   cuda_calls=calls)


_ENV = ("TORCHINDUCTOR_MAX_AUTOTUNE_BWD_WEIGHT_CONV_BACKENDS",
        "TORCHINDUCTOR_MAX_AUTOTUNE_BWD_INPUT_CONV_BACKENDS")


def check_triton_conv_bwd_rocm_only() -> Outcome:
    """Inductor's candidate backends for conv backward include Triton exactly on ROCm
    builds (this torch's defaults)."""
    set_here = [k for k in _ENV if k in os.environ]
    if set_here:
        return cannot(f"{', '.join(set_here)} set in this environment: not the defaults")
    from torch._inductor import config

    names = {"weight": "max_autotune_conv_bwd_weight_backends",
             "input": "max_autotune_conv_bwd_input_backends"}
    missing = [n for n in names.values() if not hasattr(config, n)]
    if missing:  # the knobs are newer than torch 2.11
        return cannot(f"this torch's Inductor has no {', '.join(missing)}")
    found = {k: getattr(config, n) for k, n in names.items()}
    rocm = bool(torch.version.hip)
    ok = all(("TRITON" in v) == rocm for v in found.values())
    return verdict(ok, f"{'ROCm' if rocm else 'non-ROCm'} build: backward weight "
                   f"{found['weight']}, input {found['input']}", rocm=rocm, **found)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch9_inductor_gpu_bias_split", 9,
          "Inductor calls ATen's convolution_backward, on GPUs after splitting off the bias "
          "gradient as a sum.",
          "torch's Inductor decomposition (this version)", check_gpu_bias_split),
    Claim("ch9_inductor_triton_conv_bwd_rocm_only", 9,
          "For convolution backward, Inductor's default candidate backends include Triton "
          "on ROCm builds only.",
          "torch's Inductor configuration (this version and build)",
          check_triton_conv_bwd_rocm_only),
)
