"""Claims of chapter 12 on the transposed backward: which kernels read ``output_padding``.

A stride-2 transposed convolution's output size needs ``output_padding`` to be unique, so
its backward takes the forward's value; :func:`wrong_output_padding` passes a wrong one and
reports whether the backend ATen selects refuses it or returns the right gradients anyway.
"""

from __future__ import annotations

import torch

from convlab.aten.backends import select_backend
from convlab.lab.claims.core import Claim, Outcome, cannot, verdict
from convlab.lab.claims.probe import randn

# A grouped transposed layer, stride 2, output_padding 1: 6x6 -> 12x12.
CONFIG = ([2, 2], [1, 1], [1, 1], True, [1, 1], 2)


def wrong_output_padding(device: str = "cpu", dtype: torch.dtype = torch.float64
                         ) -> dict[str, object]:
    """``{"backend", "refused", "same"}``: the backend ATen selects for the layer of
    ``CONFIG`` on ``device`` in ``dtype``, whether its backward refuses ``output_padding``
    [0, 0] instead of [1, 1] (a RuntimeError), and, when it does not, whether both
    gradients equal the right call's bit for bit (None when refused)."""
    aten = torch.ops.aten
    x = randn(2, 4, 6, 6, dtype=dtype).to(device)
    w = randn(4, 3, 3, 3, seed=1, dtype=dtype).to(device)
    go = randn(2, 6, 12, 12, seed=2, dtype=dtype).to(device)
    backend = select_backend(x, w, None, *CONFIG)
    mask = [True, True, False]
    right = aten.convolution_backward(go, x, w, None, *CONFIG, mask)
    try:
        wrong = aten.convolution_backward(go, x, w, None, *CONFIG[:4], [0, 0], CONFIG[5],
                                          mask)
    except RuntimeError:
        return {"backend": backend, "refused": True, "same": None}
    same = all(torch.equal(a, b) for a, b in zip(wrong[:2], right[:2], strict=True))
    return {"backend": backend, "refused": False, "same": same}


def check_only_slow_reads_output_padding() -> Outcome:
    """float64 (the slow kernel) refuses the wrong value; float32 (oneDNN) returns the
    same gradients as with the right one."""
    slow = wrong_output_padding("cpu", torch.float64)
    onednn = wrong_output_padding("cpu", torch.float32)
    evidence = (f"float64 {slow['backend']}: refused {slow['refused']}; float32 "
                f"{onednn['backend']}: refused {onednn['refused']}, same gradients "
                f"{onednn['same']}")
    if slow["backend"] != "SlowTranspose2d" or onednn["backend"] != "MkldnnTranspose":
        return cannot(f"other backends selected here: {evidence}")
    return verdict(bool(slow["refused"] and not onednn["refused"] and onednn["same"]),
                   evidence, slow=slow, onednn=onednn)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch12_only_slow_transposed_reads_output_padding", 12,
          "On a CPU only ATen's slow transposed kernel checks output_padding in the "
          "backward, and oneDNN's returns the right gradients with a wrong one.",
          "oneDNN selected for float32 transposed layers (torch built with it, enabled)",
          check_only_slow_reads_output_padding),
)
