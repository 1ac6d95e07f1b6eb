"""The book's CUDA sentences (chapters 3, 7, 10, 12), checked where a CUDA device exists.

Without one every check says "cannot run here"; on a GPU (Colab, ``make gpu-check``) they
select, time nothing, and compare bits and errors on the device.
"""

from __future__ import annotations

import torch

from convlab.aten.backends import select_backend, use_backend
from convlab.lab.claims.core import Claim, Outcome, cannot, verdict
from convlab.lab.claims.probe import aten_and_table, bitwise_equal, randn
from convlab.lab.claims.transposed import wrong_output_padding

NO_CUDA = "no CUDA device here (torch.cuda.is_available() is False)"
DEVICE = "cuda"  # the checks' device (a test's CPU stand-in replaces it)


def _cuda(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return randn(*shape, seed=seed, dtype=dtype).to(DEVICE)


def _backward(x: torch.Tensor, w: torch.Tensor, go: torch.Tensor, groups: int = 1,
              stride: int = 1, padding: int = 1) -> tuple[torch.Tensor, ...]:
    out = torch.ops.aten.convolution_backward(go, x, w, [w.shape[0]], [stride] * 2,
                                              [padding] * 2, [1, 1], False, [0, 0], groups,
                                              [True, True, True])
    torch.cuda.synchronize()
    return tuple(out)


def check_cudnn_replaces_onednn() -> Outcome:
    """A float32 3x3 layer on CUDA goes to cuDNN."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    chosen = select_backend(_cuda(2, 16, 14, 14), _cuda(16, 16, 3, 3, seed=1), None, 1, 1)
    return verdict(chosen == "Cudnn", f"float32 16->16 3x3 on CUDA: {chosen}",
                   backend=chosen)


def check_depthwise_not_cudnn() -> Outcome:
    """A float32 NCHW depthwise layer on CUDA goes to ATen's CudaDepthwise2d."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    chosen = select_backend(_cuda(2, 32, 28, 28), _cuda(32, 1, 3, 3, seed=1), None, 1, 1,
                            groups=32)
    return verdict(chosen == "CudaDepthwise2d", f"float32 depthwise 32ch on CUDA: {chosen}",
                   backend=chosen)


def check_slow_is_cuda_im2col() -> Outcome:
    """Forced off cuDNN, a CUDA conv backward runs ATen's slow (im2col) kernel."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    from torch.profiler import ProfilerActivity, profile

    from convlab.aten.capture import PROFILER_LOCK, redirect_fd

    x, w = _cuda(2, 16, 14, 14), _cuda(16, 16, 3, 3, seed=1)
    go = _cuda(2, 16, 14, 14, seed=2)
    with use_backend("slow", x, w, None, 1, 1) as chosen:
        with PROFILER_LOCK, redirect_fd(2), profile(activities=[ProfilerActivity.CPU]) as prof:
            _backward(x, w, go)
    ops = sorted({e.key for e in prof.key_averages() if "conv" in e.key})
    return verdict(chosen == "Slow2d" and any("slow_conv2d_backward" in o for o in ops),
                   f"cuDNN off: {chosen}; ops {', '.join(ops)}", backend=chosen, ops=ops)


def _rel(a: torch.Tensor, e: torch.Tensor) -> float:
    return float((a.double() - e).norm() / e.norm())


def check_tf32_error() -> Outcome:
    """With cuDNN's TF32 on (the default), a float32 conv's grad_weight is off by about
    1e-3 relative; with it off, about 1e-6."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return cannot(f"compute capability {major}.{minor}: TF32 needs 8.0 (Ampere)")
    default = torch.backends.cudnn.allow_tf32
    x, w, go = _cuda(8, 64, 28, 28), _cuda(64, 64, 3, 3, seed=1), _cuda(8, 64, 28, 28, seed=2)
    exact = _backward(x.double(), w.double(), go.double())[1]
    errs = {}
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32  # restored by the registry (kept_flags)
        errs[tf32] = _rel(_backward(x, w, go)[1], exact)
    # "Near 1e-3": TF32's 10-bit mantissa gives 2**-11 = 5e-4 per product, so the TF32
    # error lies in [1e-4, 1e-2]; "instead of 1e-6": float32 is at least 10x closer
    # (cuDNN may pick a Winograd/FFT algorithm whose float32 error exceeds 1e-6).
    ok = default and 1e-4 < errs[True] < 1e-2 and errs[False] * 10 < errs[True]
    return verdict(ok, f"allow_tf32 default {default}; grad_weight rel. error TF32 "
                   f"{errs[True]:.1e}, float32 {errs[False]:.1e}",
                   default=default, tf32=errs[True], fp32=errs[False])


# Layers for the repeat checks: name -> (N, C_in, C_out, size, kernel, stride, padding).
REPEAT_LAYERS: dict[str, tuple[int, ...]] = {
    "64->64 3x3 N=32 32^2": (32, 64, 64, 32, 3, 1, 1),
    "3->64 7x7/2 stem N=64 224^2": (64, 3, 64, 224, 7, 2, 3),
    "256->64 1x1 N=64 56^2": (64, 256, 64, 56, 1, 1, 0),
}


def _repeats(deterministic: bool, tf32: bool, times: int = 4,
             layer: str = "64->64 3x3 N=32 32^2", benchmark: bool = False) -> list[str]:
    """The gradients whose bits differ between the first of ``times + 1`` backward calls
    of ``layer`` and any later one."""
    torch.use_deterministic_algorithms(deterministic)  # restored by the registry
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = benchmark
    n, c_in, c_out, size, k, stride, pad = REPEAT_LAYERS[layer]
    x, w = _cuda(n, c_in, size, size), _cuda(c_out, c_in, k, k, seed=1)
    out = (size + 2 * pad - k) // stride + 1
    go = _cuda(n, c_out, out, out, seed=2)
    first = _backward(x, w, go, stride=stride, padding=pad)
    differ = set()
    for _ in range(times):
        again = _backward(x, w, go, stride=stride, padding=pad)
        differ |= {n for n, a, b in zip(("grad_input", "grad_weight", "grad_bias"), first,
                                        again, strict=True) if not bitwise_equal(a, b)}
    return sorted(differ)


def check_deterministic_repeats() -> Outcome:
    """Under ``use_deterministic_algorithms(True)`` five cuDNN backward calls give the same
    bits."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    differ = _repeats(True, False)
    return verdict(not differ, f"deterministic, 5 calls: {', '.join(differ) or 'same bits'}",
                   differ=differ)


def check_default_nondeterministic() -> Outcome:
    """Without deterministic mode, at least one of three layers (a 3x3, a 7x7 stem, a 1x1),
    with ``cudnn.benchmark`` off or on, gives different bits over five backward calls."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    found = {}
    for layer in REPEAT_LAYERS:
        for benchmark in (False, True):
            differ = _repeats(False, False, layer=layer, benchmark=benchmark)
            if differ:
                found[f"{layer}{', benchmark' if benchmark else ''}"] = differ
    evidence = "; ".join(f"{k}: {', '.join(v)} differ" for k, v in found.items())
    return verdict(bool(found), "default, 5 calls each: " + (
        evidence or f"same bits for all {2 * len(REPEAT_LAYERS)} (layer, benchmark) pairs"),
        differ=found)


def check_tf32_deterministic() -> Outcome:
    """TF32 on, deterministic mode on: five cuDNN backward calls give the same bits."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    differ = _repeats(True, True)
    return verdict(not differ, f"TF32 + deterministic, 5 calls: "
                   f"{', '.join(differ) or 'same bits'}", differ=differ)


# Chapter 3's CUDA cases (and three more): name -> (x, w, groups, transposed, channels_last,
# dtype, cuDNN enabled).
SELECTION_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], int, bool, bool,
                                 torch.dtype, bool]] = {
    "3x3": ((8, 32, 32, 32), (64, 32, 3, 3), 1, False, False, torch.float32, True),
    "depthwise fp32": ((8, 32, 32, 32), (32, 1, 3, 3), 32, False, False, torch.float32,
                       True),
    "depthwise, channels_last": ((8, 32, 32, 32), (32, 1, 3, 3), 32, False, True,
                                 torch.float32, True),
    "depthwise fp16, 64 ch": ((8, 64, 32, 32), (64, 1, 3, 3), 64, False, False,
                              torch.float16, True),
    "depthwise 3-d": ((2, 8, 8, 8, 8), (8, 1, 3, 3, 3), 8, False, False, torch.float32,
                      True),
    "transposed 3-d, no cuDNN": ((2, 8, 4, 4, 4), (8, 4, 3, 3, 3), 1, True, False,
                                 torch.float32, False),
    "3-d, no cuDNN": ((2, 8, 8, 8, 8), (4, 8, 3, 3, 3), 1, False, False, torch.float32,
                      False),
    "3x3 float64": ((8, 32, 32, 32), (64, 32, 3, 3), 1, False, False, torch.float64, True),
    "transposed 2-d": ((8, 32, 16, 16), (32, 16, 3, 3), 1, True, False, torch.float32,
                       True),
}


def check_rule_table_matches_aten() -> Outcome:
    """convlab's rule table, asked with this process's CUDA build, picks ATen's own
    backend for chapter 3's CUDA cases."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    differ, picked = [], {}
    for name, (xs, ws, groups, transposed, cl, dtype, cudnn) in SELECTION_CASES.items():
        torch.backends.cudnn.enabled = cudnn  # restored by the registry
        x = randn(*xs, dtype=dtype).to(DEVICE)
        if cl:
            x = x.to(memory_format=torch.channels_last)
        w = randn(*ws, seed=1, dtype=dtype).to(DEVICE)
        d = len(xs) - 2
        args = ([1] * d, [1] * d, [1] * d, transposed, [0] * d, groups)
        aten, mine = aten_and_table(x, w, args)
        picked[name] = aten
        if mine != aten:
            differ.append(f"{name}: ATen {aten}, table {mine}")
    return verdict(not differ, f"{len(picked) - len(differ)} of {len(picked)} cases agree"
                   + (f"; {'; '.join(differ)}" if differ else ""), aten=picked, differ=differ)


def check_cudnn_ignores_output_padding() -> Outcome:
    """cuDNN's transposed backward (float32, deterministic algorithms) accepts a wrong
    ``output_padding`` and returns the same gradients as with the right one."""
    if not torch.cuda.is_available():
        return cannot(NO_CUDA)
    torch.backends.cudnn.deterministic = True  # restored by the registry
    got = wrong_output_padding(DEVICE, torch.float32)
    evidence = f"float32 {got['backend']}: refused {got['refused']}, same {got['same']}"
    if got["backend"] != "CudnnTranspose":
        return cannot(f"cuDNN not selected here: {evidence}")
    return verdict(not got["refused"] and bool(got["same"]), evidence, **got)


CLAIMS: tuple[Claim, ...] = (
    Claim("ch3_cuda_cudnn_replaces_onednn", 3,
          "With a CUDA device (for instance a Colab GPU runtime), a float32 3x3 convolution "
          "goes to cuDNN, which takes the place of oneDNN.",
          "a CUDA device with cuDNN", check_cudnn_replaces_onednn),
    Claim("ch3_cuda_rule_table_matches_aten", 3,
          "On a CUDA device the rule table picks ATen's own backend for every case of that "
          "table and three more (a float16 depthwise layer, a float64 one and a transposed "
          "2-d one).",
          "a CUDA device with cuDNN", check_rule_table_matches_aten),
    Claim("ch3_cuda_slow_is_im2col", 3,
          "Under use_backend(\"slow\") a CUDA convolution's backward falls back to ATen's "
          "CUDA im2col kernels.",
          "a CUDA device", check_slow_is_cuda_im2col),
    Claim("ch7_cuda_depthwise_not_cudnn", 7,
          "A float32 NCHW depthwise layer on CUDA usually goes to ATen's own "
          "CudaDepthwise2d kernel, not cuDNN.",
          "a CUDA device; cuDNN's depthwise heuristic", check_depthwise_not_cudnn),
    Claim("ch7_cuda_tf32_error", 7,
          "On Ampere and newer GPUs TF32 is on by default for convolutions, and a float32 "
          "grad_weight then has errors near 1e-3 relative, at least ten times those with "
          "TF32 off.",
          "a CUDA device of compute capability 8.0 or more", check_tf32_error),
    Claim("ch10_cuda_deterministic_repeats", 10,
          "Under torch.use_deterministic_algorithms(True), cuDNN's backward gives the same "
          "bits on every call.",
          "a CUDA device with cuDNN", check_deterministic_repeats),
    Claim("ch10_cuda_default_nondeterministic", 10,
          "Outside deterministic mode, cuDNN's backward of some layers gives different bits "
          "from call to call.",
          "a CUDA device; cuDNN's algorithm choice for the layers tried",
          check_default_nondeterministic),
    Claim("ch10_cuda_tf32_deterministic", 10,
          "TF32 is deterministic: under deterministic algorithms, cuDNN's backward with TF32 "
          "on gives the same bits on every call, so TF32 costs accuracy, not "
          "reproducibility.",
          "a CUDA device with cuDNN", check_tf32_deterministic),
    Claim("ch12_cuda_cudnn_ignores_output_padding", 12,
          "cuDNN's transposed backward does not check output_padding either: a wrong one "
          "gives the same gradients.",
          "a CUDA device with cuDNN", check_cudnn_ignores_output_padding),
)
