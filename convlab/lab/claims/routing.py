"""Claims of the introduction and chapter 3: which backend ATen selects, and what the
backward returns, on this machine."""

from __future__ import annotations

import json

import torch

from convlab.aten.backends import select_backend
from convlab.lab.claims.core import Claim, Outcome, cannot, fails, holds, verdict
from convlab.lab.claims.probe import LOW_ISA_ENV, child, child_json, randn

_HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _half_support(name: str) -> bool:
    fn = (torch.ops.mkldnn._is_mkldnn_bf16_supported if name == "bfloat16"
          else torch.ops.mkldnn._is_mkldnn_fp16_supported)
    return bool(torch.backends.mkldnn.is_available() and fn())


def half_backends() -> dict[str, str]:
    """dtype name -> the backend ATen selects here for a 16->16 3x3 layer in that dtype."""
    found = {}
    for name, dtype in _HALF.items():
        x, w = randn(2, 16, 14, 14, dtype=dtype), randn(16, 16, 3, 3, seed=1, dtype=dtype)
        found[name] = select_backend(x, w, None, 1, 1)
    return found


def _half_routes(name: str) -> Outcome:
    supported = _half_support(name)
    chosen = half_backends()[name]
    ok = (chosen == "Mkldnn") == supported
    return verdict(ok, f"oneDNN {name} check {supported}; ATen selects {chosen}",
                   supported=supported, backend=chosen)


def check_bf16_routes_mkldnn() -> Outcome:
    """bf16 goes to Mkldnn exactly when oneDNN's bf16 check passes."""
    return _half_routes("bfloat16")


def check_fp16_routes_mkldnn() -> Outcome:
    """fp16 goes to Mkldnn exactly when oneDNN's fp16 check passes."""
    return _half_routes("float16")


_CHILD_HALF = ("import json; from convlab.lab.claims.routing import half_backends; "
               "print(json.dumps(half_backends()))")


def check_same_outputs_any_x86() -> Outcome:
    """The bf16/fp16 backend here equals the one under the lowest ISA setting make test
    compares against (a fresh process with ``ONEDNN_MAX_CPU_ISA=SSE41``)."""
    here = half_backends()
    low = child_json(_CHILD_HALF, LOW_ISA_ENV)
    differ = sorted(k for k in here if here[k] != low.get(k))
    text = ", ".join(f"{k} {here[k]} vs {low.get(k)}" for k in here)
    return verdict(not differ, f"here vs SSE4.1 cap: {text}", here=here, sse41=low)


def check_output_mask_is_request() -> Outcome:
    """oneDNN returns grad_weight although only grad_input and grad_bias were asked for."""
    x, w = randn(2, 3, 8, 8), randn(4, 3, 3, 3, seed=1)
    if select_backend(x, w, None) != "Mkldnn":
        return cannot(f"ATen selects {select_backend(x, w, None)} for float32, not Mkldnn")
    go = randn(2, 4, 6, 6, seed=2)
    got = torch.ops.aten.convolution_backward(go, x, w, [4], [1, 1], [0, 0], [1, 1], False,
                                              [0, 0], 1, [True, False, True])
    shapes = [None if g is None else list(g.shape) for g in got]
    return verdict(got[1] is not None,
                   f"Mkldnn, mask [T, F, T] -> grad_weight {shapes[1]}", shapes=shapes)


_CHILD_EMPTY = """
import torch
x, w, g = torch.zeros(0, 3, 8, 8), torch.zeros(4, 3, 3, 3), torch.zeros(0, 4, 6, 6)
r = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [0, 0], [1, 1], False,
                                        [0, 0], 1, [True, True, True])
print([None if t is None else list(t.shape) for t in r])
"""


def check_empty_batch_bias_sizes_none_aborts() -> Outcome:
    """On an empty batch, ``bias_sizes=None`` with ``output_mask[2]`` kills the process
    (run in a child process, never here)."""
    done = child(_CHILD_EMPTY)
    last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1]
    aborted = done.returncode != 0 and "bad_optional_access" in done.stderr
    if aborted:
        return holds(f"child exited {done.returncode}: {last[:80]}", returncode=done.returncode)
    return fails(f"child exited {done.returncode}: {last[:80]}", returncode=done.returncode,
                 output=json.dumps(done.stdout.strip()[-200:]))


CLAIMS: tuple[Claim, ...] = (
    Claim("ch3_bf16_routes_mkldnn", 3,
          "bfloat16 goes to oneDNN whenever the CPU passes oneDNN's bf16 check, and to "
          "Slow2d otherwise.",
          "oneDNN's bf16 support (avx512_core and up)", check_bf16_routes_mkldnn),
    Claim("ch3_fp16_routes_mkldnn", 3,
          "float16 goes to oneDNN whenever the CPU passes oneDNN's fp16 check, and to "
          "Slow2d otherwise.",
          "oneDNN's fp16 support (avx512_core_fp16 and up)", check_fp16_routes_mkldnn),
    Claim("intro_same_outputs_any_x86", "intro",
          "Apart from what depends on the machine, every output is the same on any x86 "
          "CPU (bf16/fp16 backend selection included).",
          "the CPU's bf16/fp16 support: make test compares against an SSE4.1 cap",
          check_same_outputs_any_x86),
    Claim("intro_output_mask_is_request", "intro",
          "output_mask is a request: oneDNN returns grad_weight when only the bias "
          "gradient is asked for.",
          "float32 on a CPU with oneDNN (Mkldnn selected)", check_output_mask_is_request),
    Claim("intro_empty_batch_bias_sizes_none_aborts", "intro",
          "With bias_sizes=None and output_mask[2] true, an empty batch aborts the process "
          "(std::bad_optional_access): pass [C_out], or mask the bias.",
          "torch's Empty backend (checked in a child process)",
          check_empty_batch_bias_sizes_none_aborts),
)
