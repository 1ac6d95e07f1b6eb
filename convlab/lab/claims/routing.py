"""Claims of the introduction and chapter 3: which backend ATen selects, and what the
backward returns, on this machine."""

from __future__ import annotations

import json
import os
import signal

import torch

from convlab.aten.backends import select_backend
from convlab.aten.onednn_types import effective_isa, half_types_by_rule
from convlab.lab.claims.core import Claim, Outcome, cannot, fails, holds, verdict
from convlab.lab.claims.probe import LOW_ISA_ENV, aten_and_table, child, facts_under, randn
from convlab.lab.method import machine

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
    """ideep's rule, computed from this CPU's flags and the oneDNN cap, agrees with torch's
    own check and with the backend ATen selects."""
    if not torch.backends.mkldnn.is_available():
        return cannot("this torch has no oneDNN")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    try:
        isa = effective_isa(machine.cpu_flags(), cap)
        rule = half_types_by_rule(machine.cpu_flags(), cap)[name]
    except ValueError as err:
        return cannot(str(err))
    supported = _half_support(name)
    chosen = half_backends()[name]
    ok = rule == supported and (chosen == "Mkldnn") == rule
    return verdict(ok, f"oneDNN level {isa} (cap {cap or 'none'}): the rule says "
                       f"{'oneDNN' if rule else 'not oneDNN'} for {name}; torch's check "
                       f"{supported}; ATen selects {chosen}",
                   level=isa, rule=rule, supported=supported, backend=chosen)


def check_bf16_routes_mkldnn() -> Outcome:
    """bf16 goes to Mkldnn exactly when ideep's rule (level >= avx2_vnni_2) says so."""
    return _half_routes("bfloat16")


def check_fp16_routes_mkldnn() -> Outcome:
    """fp16 goes to Mkldnn exactly when ideep's rule (avx512_core_fp16 and up, or
    avx2_vnni_2) says so."""
    return _half_routes("float16")


def check_sse41_cap_sends_half_to_slow_path() -> Outcome:
    """Under the SSE4.1 cap make test also runs, ATen selects no oneDNN backend for bf16
    or fp16 (a fresh process with ``ONEDNN_MAX_CPU_ISA=SSE41``); here may differ."""
    here = half_backends()
    low = facts_under(LOW_ISA_ENV)["half"]
    text = ", ".join(f"{k} {low.get(k)} (here {here[k]})" for k in here)
    return verdict(all(v != "Mkldnn" for v in low.values()), f"under the SSE4.1 cap: {text}",
                   here=here, sse41=low)


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
    rc = done.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited {rc}"
    if rc != 0 and "bad_optional_access" in done.stderr:
        return holds(f"child {how}: std::bad_optional_access", returncode=rc)
    last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1]
    return fails(f"child {how}: {last.strip()[:80]}", returncode=rc,
                 output=json.dumps(done.stdout.strip()[-200:]))


def _backend(x_shape: tuple[int, ...], w_shape: tuple[int, ...], padding: int = 0,
             threads: int | None = None) -> str:
    if threads is not None:
        torch.set_num_threads(threads)  # restored by the registry (kept_flags)
    return select_backend(randn(*x_shape), randn(*w_shape, seed=1), None, 1, padding)


def check_threads_flip_1x1() -> Outcome:
    """One image with a 1x1 kernel (above the size bound) gets Slow2d at 1 thread and
    Mkldnn at 2."""
    if not torch.backends.mkldnn.is_available():
        return cannot("oneDNN is not built into this torch")
    one, two = (_backend((1, 64, 32, 32), (64, 64, 1, 1), 0, t) for t in (1, 2))
    return verdict((one, two) == ("Slow2d", "Mkldnn"),
                   f"N=1, 64->64 1x1, 32^2: 1 thread {one}, 2 threads {two}",
                   one_thread=one, two_threads=two)


def check_onednn_size_bound() -> Outcome:
    """A single-sample 3x3 float32 layer goes to oneDNN only above N*C*H*W = 20480."""
    if not torch.backends.mkldnn.is_available():
        return cannot("oneDNN is not built into this torch")
    at, above = _backend((1, 5, 64, 64), (8, 5, 3, 3)), _backend((1, 5, 64, 65), (8, 5, 3, 3))
    return verdict((at, above) == ("Slow2d", "Mkldnn"),
                   f"N*C*H*W 20480 -> {at}, 20800 -> {above}", at=at, above=above)


def check_nnpack_batch16() -> Outcome:
    """With oneDNN off, a float32 batch of 16 goes to NNPACK and a batch of 15 to Slow2d."""
    if not torch._nnpack_available():
        return cannot("NNPACK is not available in this build or on this CPU")
    torch.backends.mkldnn.enabled = False  # restored by the registry (kept_flags)
    got = {n: _backend((n, 8, 12, 12), (8, 8, 3, 3), 1) for n in (15, 16)}
    return verdict(got == {15: "Slow2d", 16: "NnpackSpatial"},
                   f"oneDNN off: N=15 -> {got[15]}, N=16 -> {got[16]}", backends=got)


def check_rule_table_matches_aten() -> Outcome:
    """convlab's rule table picks ATen's own backend on a grid over dtype, batch, kernel,
    image size, threads and the oneDNN flag (this torch, this CPU)."""
    differ, n = [], 0
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for batch, size, k, threads, dnn in [(1, 8, 1, 1, True), (1, 8, 1, 2, True),
                                             (1, 64, 3, 1, True), (16, 8, 3, 1, True),
                                             (2, 12, 3, 2, False), (16, 12, 3, 1, False),
                                             (0, 8, 3, 1, True), (4, 8, 5, 2, True)]:
            torch.set_num_threads(threads)
            torch.backends.mkldnn.enabled = dnn
            x, w = randn(batch, 5, size, size, dtype=dtype), randn(8, 5, k, k, dtype=dtype)
            args = ([1, 1], [k // 2] * 2, [1, 1], False, [0, 0], 1)
            aten, mine = aten_and_table(x, w, args)
            n += 1
            if mine != aten:
                differ.append(f"{dtype} N={batch} k={k} T={threads}: {aten} vs {mine}")
    return verdict(not differ, f"{n - len(differ)} of {n} configurations agree"
                   + (f"; first: {differ[0]}" if differ else ""), differ=differ)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch3_bf16_routes_mkldnn", 3,
          "A bfloat16 convolution therefore goes to oneDNN exactly when oneDNN's effective "
          "ISA is at least avx2_vnni_2.",
          "this CPU's flags under the oneDNN cap (not an AMX cap)", check_bf16_routes_mkldnn),
    Claim("ch3_fp16_routes_mkldnn", 3,
          "A float16 convolution goes to oneDNN exactly when the effective ISA is at least "
          "avx512_core_fp16 or exactly avx2_vnni_2.",
          "this CPU's flags under the oneDNN cap (not an AMX cap)", check_fp16_routes_mkldnn),
    Claim("intro_sse41_cap_sends_half_to_slow_path", "intro",
          "Capped at SSE4.1, neither bfloat16 nor float16 goes to oneDNN.",
          "a fresh process under ONEDNN_MAX_CPU_ISA=SSE41",
          check_sse41_cap_sends_half_to_slow_path),
    Claim("intro_output_mask_is_request", "intro",
          "On the CPU oneDNN computes grad_weight and grad_bias together, so asking for the "
          "bias without the weight also returns a grad_weight.",
          "float32 on a CPU with oneDNN (Mkldnn selected)", check_output_mask_is_request),
    Claim("intro_empty_batch_bias_sizes_none_aborts", "intro",
          "With bias_sizes=None and output_mask[2] true, an empty batch aborts the whole "
          "process (std::bad_optional_access).",
          "torch's Empty backend (checked in a child process)",
          check_empty_batch_bias_sizes_none_aborts),
    Claim("ch3_threads_flip_1x1", 3,
          "A pointwise (1x1) convolution on one large image therefore runs on oneDNN with "
          "two threads and on Slow2d with one.",
          "the thread count (and oneDNN built in)", check_threads_flip_1x1),
    Claim("ch3_onednn_size_bound", 3,
          "A single float32 image with a 3x3 kernel and one group goes to oneDNN only when "
          "`N*C*H*W > 20480`.",
          "torch's use_mkldnn (this version)", check_onednn_size_bound),
    Claim("ch3_nnpack_batch16", 3,
          "with oneDNN disabled, a float32 batch of 16 or more goes to NNPACK and a smaller "
          "one to Slow2d.",
          "NNPACK built in and supported by this CPU", check_nnpack_batch16),
    Claim("ch3_rule_table_matches_aten", 3,
          "The rule table also picks ATen's own backend on the CPU that runs it, for "
          "float32, float64, bfloat16 and float16 layers across batch, kernel, image size, "
          "thread count and the oneDNN flag.",
          "this torch version and CPU (the table follows 2.13's source)",
          check_rule_table_matches_aten),
)
