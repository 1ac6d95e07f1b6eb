"""Claims of chapter 10: which gradients keep their bits across thread counts and ISAs."""

from __future__ import annotations

import hashlib
import math

import torch

from convlab.aten.native import convolution_backward
from convlab.lab.claims.core import Claim, Outcome, cannot, verdict
from convlab.lab.claims.probe import (
    AVX2_ENV,
    LOW_ISA_ENV,
    at_level_of,
    bitwise_equal,
    capped_env,
    facts_under,
    max_abs_diff,
    randn,
)

THREADS = (1, 2, 4)
# A 3->16 stem at 224x224: grad_weight's per-sample GEMM is 50176 long in K, long enough
# for a threaded BLAS to split it (small layers never show this).
STEM = {"x": (1, 3, 224, 224), "w": (16, 3, 3, 3), "padding": 1}


def grads_at_threads(backend: str, layer: dict, threads: tuple[int, ...] = THREADS
                     ) -> dict[int, tuple[torch.Tensor, ...]]:
    """threads -> (grad_input, grad_weight, grad_bias) of one seeded layer, ``backend``
    forced (``"slow"`` or ``"mkldnn"``)."""
    x, w = randn(*layer["x"]), randn(*layer["w"], seed=1)
    p = layer.get("padding", 0)
    out = torch.nn.functional.conv2d(x, w, padding=p)
    go = randn(*out.shape, seed=2)
    found = {}
    for t in threads:
        torch.set_num_threads(t)
        found[t] = convolution_backward(go, x, w, [w.shape[0]], 1, p, 1, False, 0, 1,
                                        [True, True, True], backend=backend)
    return found


def _bits_report(found: dict[int, tuple[torch.Tensor, ...]]) -> tuple[list[str], dict]:
    names = ("grad_input", "grad_weight", "grad_bias")
    base = found[min(found)]
    changed, diffs = [], {}
    for i, name in enumerate(names):
        d = [max_abs_diff(base[i], g[i]) for t, g in found.items() if t != min(found)]
        same = all(bitwise_equal(base[i], g[i]) for g in found.values())
        diffs[name] = max(d) if d else 0.0
        if not same:
            changed.append(name)
    return changed, diffs


def check_slow_bits_across_threads() -> Outcome:
    """Slow2d's grad_weight of a 3->16 224x224 stem (one long GEMM per sample) changes
    bits between 1, 2 and 4 threads."""
    changed, diffs = _bits_report(grads_at_threads("slow", STEM))
    what = ", ".join(f"{n} {diffs[n]:.1e}" for n in changed) or "all bit-identical"
    return verdict("grad_weight" in changed,
                   f"Slow2d stem 3->16 224^2, threads {THREADS}: {what}",
                   changed=changed, max_abs_diff=diffs)


NAMES = ("grad_input", "grad_weight", "grad_bias")
# Chapter 10's "3x3, 32 channels" case: N=4, 32->32, 12x12.
CASE = {"x": (4, 32, 12, 12), "w": (32, 32, 3, 3), "padding": 1}
MKL_SSE42_ENV = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def digests() -> dict[str, dict[str, str]]:
    """backend -> gradient -> a digest of its bits, for ``CASE`` at 1 thread (oneDNN and
    the slow path), to compare the bits across processes with other ISA caps."""
    found = {}
    backends = ["slow"] + (["mkldnn"] if torch.backends.mkldnn.is_available() else [])
    for b in backends:
        grads = grads_at_threads(b, CASE, (1,))[1]
        found[b] = {n: _digest(g) for n, g in zip(NAMES, grads, strict=True)}
    return found


def _across(env: dict[str, str], backend: str, names: tuple[str, ...]
            ) -> tuple[list[str], dict, dict]:
    here = digests()[backend]
    there = facts_under(env)["digests"].get(backend)
    if there is None:
        raise RuntimeError(f"no {backend} digests in the child process")
    return [n for n in names if here[n] != there[n]], here, there


def _blocks() -> tuple[int | None, int | None]:
    from convlab.lab.claims.onednn import implementations

    here = (implementations().get("stem_backward_data") or {}).get("block")
    there = (facts_under(AVX2_ENV)["onednn"].get("stem_backward_data") or {}).get("block")
    return here, there


def _block_changes(name: str) -> Outcome:
    if not torch.backends.mkldnn.is_available():
        return cannot("oneDNN is not built into this torch")
    here, there = _blocks()
    if here is None or there is None or here == there:
        return cannot(f"one channel block only (here {here}, AVX2 cap {there}): a CPU "
                      "above AVX2 is needed")
    changed, _, _ = _across(AVX2_ENV, "mkldnn", NAMES)
    return verdict(name in changed, f"oneDNN block {here} vs {there} (AVX2 cap), 1 thread: "
                   f"changed {', '.join(changed) or 'nothing'}", changed=changed,
                   blocks=[here, there])


def check_block_changes_grad_input() -> Outcome:
    """oneDNN's grad_input bits differ between its block here and the AVX2 block (8)."""
    return _block_changes("grad_input")


def check_slow_bits_same_across_isa() -> Outcome:
    """The slow path's gradients are bit-identical here and under the SSE4.1 setting
    (oneDNN and ATen capped; MKL as that setting leaves it)."""
    same = at_level_of(LOW_ISA_ENV)
    if same:
        return cannot(same)
    changed, _, _ = _across(LOW_ISA_ENV, "slow", NAMES)
    return verdict(not changed, "Slow2d, 1 thread, here vs SSE4.1 setting: changed "
                   f"{', '.join(changed) or 'nothing'}", changed=changed)


def check_slow_bits_follow_mkl_path() -> Outcome:
    """The slow path's grad_weight changes bits when MKL is capped at SSE4.2."""
    if not torch.backends.mkl.is_available():
        return cannot("this torch does not use MKL")
    if os_mkl_capped():
        return cannot("MKL_ENABLE_INSTRUCTIONS is already set in this process")
    from convlab.lab.claims.probe import facts_under
    from convlab.lab.method import verbose_probes

    path, capped = verbose_probes.mkl_probe(), facts_under(MKL_SSE42_ENV)["mkl"]
    if path == capped:
        return cannot(f"MKL announced the same code path under MKL_ENABLE_INSTRUCTIONS="
                      f"SSE4_2 ({path!r}): it does not take the cap on this CPU")
    changed, _, _ = _across(MKL_SSE42_ENV, "slow", NAMES)
    return verdict("grad_weight" in changed, "Slow2d, 1 thread, here vs "
                   f"MKL_ENABLE_INSTRUCTIONS=SSE4_2: changed {', '.join(changed) or 'nothing'}",
                   changed=changed)


def os_mkl_capped() -> bool:
    """Whether this process runs with MKL's instructions capped."""
    return "MKL_ENABLE_INSTRUCTIONS" in capped_env()


def check_onednn_input_keeps_bits_across_threads() -> Outcome:
    """oneDNN's grad_input is bit-identical at 1, 2 and 4 threads (only grad_weight and
    grad_bias may change)."""
    if not torch.backends.mkldnn.is_available():
        return cannot("oneDNN is not built into this torch")
    changed, diffs = _bits_report(grads_at_threads("mkldnn", CASE))
    return verdict("grad_input" not in changed,
                   f"oneDNN N=4 32->32 12^2, threads {THREADS}: changed "
                   f"{', '.join(changed) or 'nothing'}", changed=changed, max_abs_diff=diffs)


def check_kernels_repeat_bits() -> Outcome:
    """Every CPU backend gives the same bits on two calls at the same thread count."""
    backends = ["slow"] + (["mkldnn"] if torch.backends.mkldnn.is_available() else [])
    differ = []
    for b in backends:
        first = grads_at_threads(b, CASE, (torch.get_num_threads(),))
        again = grads_at_threads(b, CASE, (torch.get_num_threads(),))
        t = torch.get_num_threads()
        differ += [f"{b} {n}" for n, g, h in zip(NAMES, first[t], again[t], strict=True)
                   if not bitwise_equal(g, h)]
    return verdict(not differ, f"{', '.join(backends)} at {torch.get_num_threads()} "
                   f"threads, two calls: {', '.join(differ) or 'same bits'}", differ=differ)


def check_deterministic_mode_no_effect() -> Outcome:
    """``torch.use_deterministic_algorithms(True)`` changes no bit of a CPU conv backward."""
    backends = ["slow"] + (["mkldnn"] if torch.backends.mkldnn.is_available() else [])
    t = torch.get_num_threads()
    differ = []
    for b in backends:
        plain = grads_at_threads(b, CASE, (t,))[t]
        torch.use_deterministic_algorithms(True)
        try:
            strict = grads_at_threads(b, CASE, (t,))[t]
        finally:
            torch.use_deterministic_algorithms(False)
        differ += [f"{b} {n}" for n, g, h in zip(NAMES, plain, strict, strict=True)
                   if not bitwise_equal(g, h)]
    return verdict(not differ, f"{', '.join(backends)}: deterministic mode changed "
                   f"{', '.join(differ) or 'no bit'}", differ=differ)


# The f32 accumulator adds about sqrt(K) * 2**-24 of the largest entry (K = 576 terms for
# grad_weight here), about 2**-19: 2**-11 of a bf16 ULP there. "Rounded once" is then
# at most 0.5 ULP of the largest entry plus that margin.
HALF_ULP_MARGIN = 2.0**-9


def check_bf16_onednn_half_ulp() -> Outcome:
    """oneDNN's bf16 backward rounds once from an f32 accumulator: each gradient's largest
    error is within 0.5 bf16 ULP of its largest entry (against float64 on the same bf16
    operands)."""
    from convlab.aten.backends import select_backend
    from convlab.lab.method.float_errors import grad_error

    x, w = randn(*CASE["x"], dtype=torch.bfloat16), randn(*CASE["w"], seed=1,
                                                           dtype=torch.bfloat16)
    chosen = select_backend(x, w, None, 1, 1)
    if chosen != "Mkldnn":
        return cannot(f"bfloat16 goes to {chosen} here (oneDNN's bf16 check fails)")
    go = randn(4, 32, 12, 12, seed=2, dtype=torch.bfloat16)
    args = ([32], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])
    got = torch.ops.aten.convolution_backward(go, x, w, *args)
    exact = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), *args)
    worst = {n: grad_error(g, e, torch.bfloat16).ulps
             for n, g, e in zip(NAMES, got, exact, strict=True)}
    ok = all(math.isfinite(v) and v <= 0.5 + HALF_ULP_MARGIN for v in worst.values())
    return verdict(ok, "oneDNN bf16, ULP of the largest entry: " + ", ".join(
        f"{n[5:]} {v:.3f}" for n, v in worst.items()), ulps=worst)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch10_slow_bits_across_threads", 10,
          "On a 3 -> 16 stem at 224 x 224, the slow path's grad_weight changes bits between "
          "1, 2 and 4 threads.",
          "the BLAS's threading: a threaded MKL may split a long GEMM over threads",
          check_slow_bits_across_threads),
    Claim("ch10_onednn_input_keeps_bits_across_threads", 10,
          "oneDNN's grad_input therefore keeps its bits when the thread count changes.",
          "oneDNN's parallel split for this ISA", check_onednn_input_keeps_bits_across_threads),
    Claim("ch10_kernels_repeat_bits", 10,
          "oneDNN and the slow path return identical bits on a second call at the same "
          "thread count.",
          "no atomics in the CPU kernels", check_kernels_repeat_bits),
    Claim("ch10_deterministic_mode_no_effect_cpu", 10,
          "torch.use_deterministic_algorithms(True) changes no bit of the gradients of "
          "oneDNN or the slow path.",
          "CPU backends (on CUDA it restricts cuDNN's algorithms)",
          check_deterministic_mode_no_effect),
    Claim("ch10_block_changes_grad_input", 10,
          "oneDNN's kernel walks grad_input's sum over output channels block by block, so a "
          "32-channel 3x3 layer's grad_input changes its last bits between the 16-channel "
          "block of AVX-512 and the 8-channel block of AVX2.",
          "a CPU above AVX2 (block 16 here vs 8 under the AVX2 cap)",
          check_block_changes_grad_input),
    Claim("ch10_slow_bits_same_across_isa", 10,
          "Within one machine, capping oneDNN and ATen at SSE4.1 leaves the slow path's "
          "gradients bit for bit the same, since those caps do not touch MKL.",
          "MKL's code path, which ONEDNN_MAX_CPU_ISA does not cap; a process above the "
          "SSE4.1 setting's level (at it, the setting would be compared with itself)",
          check_slow_bits_same_across_isa),
    Claim("ch10_slow_bits_follow_mkl_path", 10,
          "Where MKL takes the cap, capping it at SSE4.2 (MKL_ENABLE_INSTRUCTIONS=SSE4_2) "
          "changes the bits of the slow path's grad_weight.",
          "MKL's code path above SSE4.2 on this CPU", check_slow_bits_follow_mkl_path),
    Claim("ch10_bf16_onednn_half_ulp", 10,
          "In bfloat16, oneDNN's largest error in each gradient is then at most 0.5 ULP of "
          "that gradient's largest entry, the cost of one rounding.",
          "ideep's bf16 rule (AVX-512, or AVX2 with AVX-NE-CONVERT)", check_bf16_onednn_half_ulp),
)
