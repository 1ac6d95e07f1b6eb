"""Claims of chapter 10: which gradients keep their bits across thread counts and ISAs."""

from __future__ import annotations

import torch

from convlab.aten.native import convolution_backward
from convlab.lab.claims.core import Claim, Outcome, verdict
from convlab.lab.claims.probe import bitwise_equal, max_abs_diff, randn

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
    """Slow2d's three gradients of a 3->16 224x224 stem are bit-identical at 1, 2, 4
    threads."""
    changed, diffs = _bits_report(grads_at_threads("slow", STEM))
    what = ", ".join(f"{n} {diffs[n]:.1e}" for n in changed) or "all bit-identical"
    return verdict(not changed, f"Slow2d stem 3->16 224^2, threads {THREADS}: {what}",
                   changed=changed, max_abs_diff=diffs)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch10_slow_bits_across_threads", 10,
          "The slow kernels keep their bits across thread counts.",
          "the BLAS's threading: a threaded MKL may split a long GEMM over threads",
          check_slow_bits_across_threads),
)
