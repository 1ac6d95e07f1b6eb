"""Claims about oneDNN's kernels here (chapters 7 and 10): implementation, channel block,
what an ISA cap leaves, and whether the committed records cover this machine."""

from __future__ import annotations

import re
from typing import Any

import torch

from convlab.lab.claims.core import Claim, Outcome, cannot, verdict
from convlab.lab.claims.probe import LOW_ISA_ENV, facts_under, randn

# Vector width in float32 lanes of each oneDNN JIT ISA family (the prefix of "jit:<isa>").
_LANES = {"avx512": 16, "avx2": 8, "avx": 8, "sse41": 4}


def _trace(x_shape: tuple[int, ...], w_shape: tuple[int, ...], channels_last: bool = False
           ) -> list[Any]:
    from convlab.lab.method.profiling import onednn_trace

    x = randn(*x_shape).requires_grad_()
    w = randn(*w_shape, seed=1).requires_grad_()
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def run() -> None:
        xx = x.detach().to(memory_format=fmt).requires_grad_()
        torch.nn.functional.conv2d(xx, w, padding=1).sum().backward()

    return onednn_trace(run)


def _block(layouts: str, role: str = "src") -> int | None:
    """The channel block of ``role``'s layout tag in a verbose line (``aBcd16b`` -> 16)."""
    m = re.search(rf"{role}:f32:[a-z]*:blocked:([A-Za-z0-9]+)", layouts)
    if not m:
        return None
    digits = re.search(r"(\d+)b", m.group(1))
    return int(digits.group(1)) if digits else 1


def implementations() -> dict[str, Any]:
    """oneDNN's implementation per pass of a 16->16 3x3 layer (NCHW and channels_last), and
    the block and padding flag of the 3-channel stem's grad_input."""
    if not torch.backends.mkldnn.is_available():
        return {}
    found: dict[str, Any] = {}
    for name, cl in (("nchw", False), ("channels_last", True)):
        calls = _trace((2, 16, 12, 12), (16, 16, 3, 3), cl)
        found[name] = {c.prop: c.impl for c in calls if c.op == "convolution"}
    stem = [c for c in _trace((2, 3, 16, 16), (16, 3, 3, 3)) if c.op == "convolution"]
    bwd = next((c for c in stem if c.prop == "backward_data"), None)
    if bwd is not None:
        found["stem_backward_data"] = {
            "impl": bwd.impl, "block": _block(bwd.layouts),
            "padded": bool(re.search(r"src:f32:[a-z]*p[a-z]*:blocked", bwd.layouts))}
    return found


def _lanes(impl: str) -> int | None:
    m = re.match(r"jit:([a-z0-9]+?)(_core|_vnni|_bf16|_fp16|_amx)*$", impl or "")
    if not m:
        return None
    return next((v for k, v in _LANES.items() if m.group(1).startswith(k)), None)


def check_block_follows_isa() -> Outcome:
    """The stem's grad_input is held in a block of one vector register of float32 (16 on
    AVX-512, 8 on AVX2) and padded from 3 channels."""
    here = implementations()
    stem = here.get("stem_backward_data")
    if not stem:
        return cannot("oneDNN ran no backward_data here (oneDNN not built in?)")
    lanes = _lanes(stem["impl"])
    if lanes is None:
        return cannot(f"backward_data ran {stem['impl']}, not a direct JIT kernel",
                      **stem)
    want = max(lanes, 8)  # SSE4.1 kernels still block by 8 (two registers)
    return verdict(stem["block"] == want and stem["padded"],
                   f"{stem['impl']}: grad_input in a block of {stem['block']}"
                   f"{' (padded)' if stem['padded'] else ''}; vector {lanes} floats",
                   **stem, lanes=lanes)


def check_sse41_no_jit_backward() -> Outcome:
    """Capped at SSE4.1, oneDNN runs its forward with a JIT kernel but both backward passes
    on its GEMM fallback (a fresh process under the cap)."""
    low = facts_under(LOW_ISA_ENV)["onednn"]
    if not low:
        return cannot("oneDNN is not built into this torch")
    impl = low["nchw"]
    fwd = impl.get("forward_training", "?")
    bwd = {k: v for k, v in impl.items() if k.startswith("backward")}
    ok = fwd.startswith("jit") and bool(bwd) and not any(v.startswith("jit")
                                                         for v in bwd.values())
    text = ", ".join(f"{k} {v}" for k, v in impl.items())
    return verdict(ok, f"under SSE4.1: {text}", implementations=impl)


def check_channels_last_brgemm() -> Outcome:
    """A channels_last backward_data runs a brgemm kernel, not the NCHW path's JIT one."""
    here = implementations()
    if not here:
        return cannot("oneDNN is not built into this torch")
    cl, nchw = here["channels_last"].get("backward_data", "?"), here["nchw"].get(
        "backward_data", "?")
    if "gemm" in nchw and not cl.startswith("brg"):
        return cannot(f"no JIT backward at this ISA (NCHW {nchw}, channels_last {cl}): "
                      "the claim's condition, oneDNN's brgemm kernels, does not apply")
    return verdict(cl.startswith("brg") and cl != nchw,
                   f"backward_data: NCHW {nchw}, channels_last {cl}",
                   nchw=nchw, channels_last=cl)


def check_record_for_this_impl() -> Outcome:
    """Some committed record ran oneDNN's backward with this machine's implementation."""
    from convlab.lab.method import verbose_probes
    from convlab.lab.record import records

    impls = verbose_probes._onednn_probe_here().get("implementations") or {}
    assert isinstance(impls, dict)
    here = impls.get("backward_weights") or impls.get("backward_data")  # as fingerprint()
    if not here:
        return cannot("oneDNN ran no backward convolution here")
    found = records.load_records()
    same = [r.label for r in found if r.fingerprint.get("onednn_isa") == here]
    return verdict(bool(same), f"{here}: {len(same)} of {len(found)} records"
                   + (f" ({'; '.join(same)})" if same else ""), impl=here, records=same)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch7_block_follows_isa", 7,
          "For the 3-channel stem, oneDNN's JIT backward-data kernel computes grad_input in "
          "a padded block of channels as wide as one vector register (16 with AVX-512, 8 "
          "with AVX2).",
          "oneDNN's direct JIT kernel for this ISA", check_block_follows_isa),
    Claim("ch7_sse41_no_jit_backward", 7,
          "Capped at SSE4.1, oneDNN still has a JIT forward convolution (jit:sse41 in "
          "3.12), but no JIT backward for these shapes.",
          "oneDNN's kernels under ONEDNN_MAX_CPU_ISA=SSE41", check_sse41_no_jit_backward),
    Claim("ch7_channels_last_brgemm", 7,
          "With channels_last, oneDNN's backward_data runs a brgemm kernel (brg_conv_bwd on "
          "AVX2 and AVX-512 CPUs), not the jit: kernel of NCHW that the records' fingerprint "
          "names.",
          "oneDNN's brgemm kernels (AVX2 and up)", check_channels_last_brgemm),
    Claim("ch7_record_for_this_impl", 7,
          "some committed record ran oneDNN's backward with the implementation of the "
          "machine running this notebook.",
          "which machines have committed records", check_record_for_this_impl),
)
