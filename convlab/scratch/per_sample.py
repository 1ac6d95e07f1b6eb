"""Per-sample gradients of a convolution's weight and bias.

A convolution's weight gradient is a sum over the batch,
``grad_weight = sum_n grad_output_n · columns_nᵀ`` (per group). Keeping the terms of that
sum apart instead of adding them gives every sample's own gradient, which is what
differentially private training (DP-SGD) clips, or what gradient-noise and influence
estimates need. Four routes compute all of them at once:

* ``"grouped"``: fold the batch into the channels and run **one grouped weight-gradient
  convolution** (``groups * N`` groups) on whatever backend ATen selects; this is what
  ``torch.func.vmap``'s batching rule for ``convolution_backward`` does, and the trick that
  Rochette, Manoel and Tramel (2019, https://arxiv.org/abs/1912.06015) describe.
  ExpandedWeights takes it for ungrouped convs below batch 32. On a CPU convlab makes
  that call once per chunk of samples whose gradients fit ``GROUPED_CHUNK_BYTES`` (one
  call holds its result twice: oneDNN's blocked layout, then ATen's). BackPACK's ``BatchGrad``
  (``backpack/core/derivatives/convnd.py``) instead runs a *forward* convolution with
  ``C_in * N`` groups, one input channel per group, ``grad_output`` repeated
  ``C_in / groups`` times as its weight, and stride and dilation swapped.
* ``"grouped_cl"``: the same grouped backward with the folded input and ``grad_output`` in
  channels-last memory. oneDNN then reads them without reordering them to its blocked
  layout, and with few channels per group it runs its JIT kernel (on padded weights)
  where the NCHW call falls back to its GEMM (``ONEDNN_VERBOSE`` on the AVX-512 machine
  of the sweep: ``jit:avx512_core`` against ``x64:gemm:jit`` at 1 and 3 channels per
  group).
* ``"im2col"``: build each sample's im2col columns and contract them with its
  ``grad_output`` in one GEMM batched over samples and groups, chunk by chunk over the
  samples so that the columns of one chunk stay under ``CHUNK_BYTES`` (one buffer for all
  chunks); a 1x1 kernel with stride 1 and no padding contracts the input itself, no copy.
  Opacus's ``nn.Conv2d`` grad sampler does the same contraction on its own unfold
  (``F.pad`` + ``as_strided``; for ``groups > 1`` it contracts over every pair of groups
  and keeps the diagonal, ``groups`` times the work), and ExpandedWeights does it from
  batch 32 on.
* ``"forward"``: BackPACK's route (above), one forward convolution in which the input is
  the input and ``grad_output`` the weight. With one input channel per group its kernels
  are ``grad_output``'s planes as they lie, and oneDNN's depthwise forward runs it.

``"auto"`` (the default) picks one of these routes with :func:`choose_method`, a rule fitted on a
timed sweep (channels per group, batch, kernel, threads, instruction set); its docstring
gives the rule and the sweep it came from. :mod:`convlab.aten.fast_per_sample` adds a
fifth route, convlab's C++ loop, and a rule that takes it where it wins.

The bias gradient of sample ``n`` is ``grad_output_n`` summed over its positions.
"""

from __future__ import annotations

import functools
import math
import operator
import os
from collections.abc import Sequence

import torch

from convlab.scratch.im2col import sample_columns
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_same,
    check_tensor,
    threads_or_current,
)
from convlab.scratch.reference import CHUNK_BYTES, sample_chunks, values_readable

__all__ = ["GROUPED_CHUNK_BYTES", "METHODS", "ROUTES", "check_args", "choose_method",
           "onednn_block",
           "per_sample_bias_grad", "per_sample_weight_grad"]

ROUTES: tuple[str, ...] = ("grouped", "grouped_cl", "im2col", "forward")
METHODS: tuple[str, ...] = ("auto", *ROUTES)
# The grouped routes' budget of per-sample gradients per call (CPU). On the 2-core AMD EPYC
# with 1 MiB of L2 (AVX-512), N = 64 at 16x16 with C/G = 64, one call against 2 MiB
# chunks: 3x3 20.5 -> 11.2 ms and 27 -> 15 MiB peak, 5x5 40 -> 28 ms and 75 -> 31 MiB,
# 7x7 108 -> 98 ms and 147 -> 56 MiB (1 MiB chunks: as fast, but x1.3 slower at N = 8,
# 3x3, where 2 MiB does not split).
GROUPED_CHUNK_BYTES = 2 * 2**20
# oneDNN's vector block (channels per register) for the ISA caps that change it.
_BLOCKS: tuple[tuple[str, int], ...] = (("AVX512", 16), ("AVX10", 16), ("AVX2", 8))


def _weight_size(weight_size: object) -> tuple[int, ...]:
    if isinstance(weight_size, str | bytes) or not isinstance(weight_size, Sequence | torch.Size):
        raise TypeError(f"weight_size must be a sequence of ints, got {weight_size!r}")
    try:
        size = tuple(operator.index(s) for s in weight_size if not isinstance(s, bool))
    except TypeError:
        raise TypeError(f"weight_size must be a sequence of ints, got {weight_size!r}") from None
    if len(size) != len(weight_size):
        raise TypeError(f"weight_size must be a sequence of ints, got {weight_size!r}")
    if len(size) < 3:
        raise ValueError(
            f"weight_size must be [C_out, C_in/groups, *kernel] with at least one spatial "
            f"dimension, got {list(size)}"
        )
    return size


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's flags, read once per process (they cannot change while it runs)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def _block(cap: str | None, flags: frozenset[str]) -> int:
    cpu = 16 if "avx512f" in flags else 8 if "avx2" in flags else 0
    if cap is None or cap.upper() in ("", "ALL", "DEFAULT"):
        return cpu
    for prefix, width in _BLOCKS:
        if cap.upper().startswith(prefix):
            return min(cpu, width)
    return 0  # SSE41 and below: no JIT backward-weights kernel (oneDNN's GEMM fallback)


def onednn_block() -> int:
    """Channels in one of oneDNN's vector registers for float32 here: 16 on AVX-512, 8 on
    AVX2, 0 where its convolution backward has no JIT kernel (SSE4.1 caps, non-x86 CPUs),
    from the CPU's flags capped by ``ONEDNN_MAX_CPU_ISA`` (which oneDNN reads at start)."""
    if not torch.backends.mkldnn.is_available():
        return 0
    return _block(os.environ.get("ONEDNN_MAX_CPU_ISA"), _cpu_flags())


def choose_method(n: int, channels_per_group: int, kernel: Sequence[int],
                  dtype: torch.dtype = torch.float32, block: int | None = None,
                  threads: int | None = None, groups: int = 1) -> str:
    """The route ``method="auto"`` takes: ``"grouped"``, ``"grouped_cl"``, ``"im2col"`` or
    ``"forward"``.

    ``n`` samples, ``channels_per_group`` ``c`` = ``C_in / groups``, ``kernel`` the
    kernel's sizes (``taps`` = their product), ``block`` ``b`` (default:
    :func:`onednn_block`; 0 where oneDNN has no JIT kernel), ``threads`` (default
    torch's current count; no rule reads it, see below) and the layer's ``groups``.
    The rule, first match wins:

    1. A dtype oneDNN does not take (float64): ``im2col``.
    2. ``taps == 1``: ``im2col`` (the columns are the input itself, no copy).
    3. Depthwise (``c == 1``): ``im2col`` for one sample up to 5x5; ``grouped`` up to
       3x3 with a JIT block; else ``forward`` (oneDNN's depthwise forward with
       ``grad_output``'s planes as kernels).
    4. One sample: ``im2col`` for a grouped layer (``groups > 1``); else ``grouped``
       for 3x3, and for larger kernels with a JIT block and ``c >= 8``; else
       ``im2col``.
    5. No JIT block (``b == 0``): ``im2col``.
    6. Few channels (``c < b / 2``, e.g. a 3-channel stem): ``grouped_cl`` from 5x5 on
       with 16-wide blocks and ``n >= 32``, else ``im2col``.
    7. Otherwise ``grouped``.

    Fitted on ``per_sample_auto`` sweeps (:mod:`convlab.lab.sections.per_sample_auto`: channels
    per group 1, 3, 8, 16, 64; N 1, 8, 64; kernels 1, 3, 5, 7; 1 and 2 threads; 16x16,
    float32) of a 2-core AMD EPYC with 32 MiB of L3 (cpuid family 25, model 17) at its
    AVX-512-BF16, AVX-512, AVX2 and SSE4.1 settings. On the sweeps of those settings
    stored now (120 points each, taken after the fit, with
    :mod:`convlab.aten.fast_per_sample`'s loop as a fifth route), the route it picks is
    within 10 % of the fastest of these four at 114, 117, 112 and 119 points, worst
    x1.23, x1.19, x1.61 and x1.35 (one sample, 5x5 or 7x7, where grouped was faster).
    Rule 4's groups term rests on the sweep's one grouped layer
    (16 channels in 2 groups): for one sample at 3x3 im2col was faster than grouped
    under every setting (x1.1-x1.7 on the stored sweeps). A thread term did not pay on
    the sweeps it was fitted on. The sweep has N = 8 and 64 only, so rule 6's 32 is a
    midpoint, not a measured crossover.
    """
    block = onednn_block() if block is None else block
    threads_or_current(threads)  # validated; no rule reads it (docstring)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    c, taps = channels_per_group, math.prod(kernel)
    if dtype not in (torch.float32, torch.bfloat16) or taps == 1:
        return "im2col"
    if c == 1:
        if n == 1 and taps <= 25:
            return "im2col"
        return "grouped" if taps <= 9 and block else "forward"
    if n == 1:
        if groups > 1:
            return "im2col"
        return "grouped" if taps == 9 or (block and c >= 8) else "im2col"
    if block == 0:
        return "im2col"
    if 2 * c < block:
        return "grouped_cl" if block >= 16 and taps >= 25 and n >= 32 else "im2col"
    return "grouped"


def per_sample_weight_grad(
    input: torch.Tensor,
    weight_size: Sequence[int],
    grad_output: torch.Tensor,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    method: str = "auto",
) -> torch.Tensor:
    """Weight gradient of each sample of a (non-transposed) N-d convolution.

    Arguments follow :func:`torch.nn.grad.conv2d_weight` (ints or tuples).
    Shapes: input ``[N, C_in, *S]``, weight_size ``[C_out, C_in/groups, *k]``,
    grad_output ``[N, C_out, *O]``. ``method`` is ``"grouped"`` (one grouped convolution
    backward, no column buffer), ``"grouped_cl"`` (the same in channels-last memory),
    ``"im2col"`` (columns and a batched GEMM, chunked over the samples), ``"forward"``
    (one forward convolution with ``grad_output`` as the weight) or ``"auto"``
    (:func:`choose_method`). Returns ``[N, C_out, C_in/groups, *k]``; its sum over the
    first dimension is the usual ``grad_weight``.

    >>> x, go = torch.randn(4, 3, 8, 8), torch.randn(4, 6, 6, 6)
    >>> per_sample_weight_grad(x, (6, 3, 3, 3), go).shape
    torch.Size([4, 6, 3, 3, 3])
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    weight_size, p, expected = check_args(input, weight_size, grad_output, stride,
                                          padding, dilation, groups)
    n = input.shape[0]
    if n == 0 or math.prod(weight_size) == 0:
        return input.new_zeros((n, *weight_size))
    if method == "auto":
        method = (choose_method(n, weight_size[1], weight_size[2:], input.dtype,
                                groups=p.groups)
                  if input.device.type == "cpu" else "grouped")
    if method == "im2col":
        return _im2col(input, weight_size, grad_output, p, expected[2:])
    if method == "forward":
        return _forward(input, weight_size, grad_output, p)
    return _grouped(input, weight_size, grad_output, p, method == "grouped_cl")


def check_args(input: torch.Tensor, weight_size: Sequence[int], grad_output: torch.Tensor,
               stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1,
               groups: int = 1) -> tuple[tuple[int, ...], ConvParams, tuple[int, ...]]:
    """The arguments of :func:`per_sample_weight_grad`, checked (``ValueError`` or
    ``TypeError`` naming the argument): ``(weight_size as ints, ConvParams, the forward
    output's shape)``. A geometry of plain ints seen before costs a dictionary lookup."""
    check_tensor(input, "input")
    check_tensor(grad_output, "grad_output")
    check_same(input, grad_output, "input", "grad_output")
    weight_size = _weight_size(weight_size)
    key = (tuple(input.shape), weight_size, _frozen(stride), _frozen(padding),
           _frozen(dilation), groups, tuple(grad_output.shape))
    try:
        hash(key)
        plain = all(type(v) is int for part in key for v in
                    (part if isinstance(part, tuple) else (part,)))
    except TypeError:
        plain = False
    p, expected = _checked(*key) if plain else _check(*key)
    return weight_size, p, expected


def _check(input_shape: tuple[int, ...], weight_size: tuple[int, ...], stride: IntOrSeq,
           padding: IntOrSeq, dilation: IntOrSeq, groups: int,
           grad_output_shape: tuple[int, ...]) -> tuple[ConvParams, tuple[int, ...]]:
    """The geometry of a call, checked (``ValueError``/``TypeError`` naming the argument):
    its ``ConvParams`` and the forward output's shape, which ``grad_output`` must have."""
    p = ConvParams.create(len(weight_size) - 2, stride, padding, dilation, False, 0, groups)
    p.check_shapes(input_shape, weight_size)
    expected = p.output_shape(input_shape, weight_size)
    if grad_output_shape != expected:
        raise ValueError(
            f"grad_output must have the forward output's shape {list(expected)}, "
            f"got {list(grad_output_shape)}"
        )
    return p, expected


# A training step asks about the same few layers every time: the checks of a geometry
# seen before cost a dictionary lookup (the checks take longer than a small layer's ATen
# call). Only plain-int geometries are kept; an error is never cached.
_checked = functools.lru_cache(maxsize=512)(_check)


def _frozen(value: object) -> object:
    """Lists as tuples (so that a geometry can be a cache key); anything else as is."""
    return tuple(value) if isinstance(value, list) else value


def _grouped(input: torch.Tensor, weight_size: tuple[int, ...], grad_output: torch.Tensor,
             p: ConvParams, channels_last: bool = False) -> torch.Tensor:
    """:func:`_grouped_call` over chunks of samples whose gradients take at most
    ``GROUPED_CHUNK_BYTES`` (CPU; one call elsewhere), each written into its rows of
    the result. One call holds its result twice (oneDNN computes it in its blocked
    layout, then reorders it), so chunks bound that copy to one chunk's size."""
    n = input.shape[0]
    chunks = sample_chunks(n, math.prod(weight_size) * input.element_size(),
                           GROUPED_CHUNK_BYTES)
    if len(chunks) == 1 or input.device.type != "cpu":
        return _grouped_call(input, weight_size, grad_output, p, channels_last)
    out = input.new_empty((n, *weight_size))
    for s in chunks:
        out[s].copy_(_grouped_call(input[s], weight_size, grad_output[s], p, channels_last))
    return out


def _grouped_call(input: torch.Tensor, weight_size: tuple[int, ...],
                  grad_output: torch.Tensor, p: ConvParams,
                  channels_last: bool = False) -> torch.Tensor:
    """Samples as groups: input ``[1, N*C_in, *S]``, grad_output ``[1, N*C_out, *O]``,
    ``N * groups`` groups; the grouped weight gradient ``[N*C_out, C_in/groups, *k]`` holds
    every sample's gradient, one block of C_out rows per sample. ``channels_last`` (4-d
    and 5-d) hands both over in channels-last memory."""
    n = input.shape[0]
    x = input.reshape(1, n * input.shape[1], *input.shape[2:])
    gy = grad_output.reshape(1, n * grad_output.shape[1], *grad_output.shape[2:])
    # (a memory layout only: under vmap, which cannot query one, the plain call)
    if channels_last and x.dim() in (4, 5) \
            and not torch._C._functorch.is_functorch_wrapped_tensor(x):
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        x, gy = x.contiguous(memory_format=fmt), gy.contiguous(memory_format=fmt)
    # Only the weight's shape matters for grad_weight: a zero-stride placeholder.
    placeholder = input.new_zeros(()).expand(n * weight_size[0], *weight_size[1:])
    stride, padding, dilation, transposed, output_padding, groups = p.aten_args()
    grad = torch.ops.aten.convolution_backward.default(
        gy, x, placeholder, None, stride, padding, dilation, transposed, output_padding,
        groups * n, [False, True, False],
    )[1]
    return grad.reshape(n, *weight_size)


def _im2col(input: torch.Tensor, weight_size: tuple[int, ...], grad_output: torch.Tensor,
            p: ConvParams, out_size: Sequence[int]) -> torch.Tensor:
    """Per-sample columns ``[n, G, C/G*k, L]`` of a chunk of ``n`` samples (at most
    ``CHUNK_BYTES``, at least one sample), contracted with its ``grad_output`` in one
    batched GEMM per chunk, ``[K/G, L] @ [L, C/G*k]`` per sample and group, written
    straight into the result. A 1x1 kernel with stride 1 and no padding reads the input
    itself as its columns (no copy)."""
    n, g = input.shape[0], p.groups
    k_g, ck = weight_size[0] // g, math.prod(weight_size[1:])
    positions = math.prod(out_size)
    gy = grad_output.reshape(n, g, k_g, positions)
    # Under autograd (an input that requires grad), a functorch transform or a dispatch
    # mode, out= and a reused buffer would cut the graph or are not supported: every
    # chunk gets its own columns and product, joined at the end.
    graph = ((torch.is_grad_enabled()
              and (input.requires_grad or grad_output.requires_grad))
             or not all(values_readable(t) for t in (input, grad_output)))
    if math.prod(weight_size[2:]) == 1 and all(s == 1 for s in p.stride) \
            and not any(p.padding):
        cols_t = input.reshape(n, g, ck, positions).transpose(2, 3)
        if graph:
            return torch.matmul(gy, cols_t).reshape(n, *weight_size)
        out = input.new_empty((n, g, k_g, ck))
        torch.matmul(gy, cols_t, out=out)
        return out.reshape(n, *weight_size)
    sample_bytes = input.element_size() * input.shape[1] * math.prod(weight_size[2:]) * positions
    step = min(n, max(1, CHUNK_BYTES // max(1, sample_bytes)))
    out = None if graph else input.new_empty((n, g, k_g, ck))
    buf = None if graph else input.new_empty((step, g, ck, positions))
    parts = []
    for lo in range(0, n, step):
        m = min(step, n - lo)
        into = None if buf is None else buf[:m].view(m, g * ck, positions)
        cols = sample_columns(into, input[lo:lo + m], weight_size[2:], out_size,
                              p.stride, p.padding, p.dilation).view(m, g, ck, positions)
        if out is None:
            parts.append(torch.matmul(gy[lo:lo + m], cols.transpose(2, 3)))
        else:
            torch.matmul(gy[lo:lo + m], cols.transpose(2, 3), out=out[lo:lo + m])
    result = torch.cat(parts) if out is None else out
    return result.reshape(n, *weight_size)


def _forward(input: torch.Tensor, weight_size: tuple[int, ...], grad_output: torch.Tensor,
             p: ConvParams) -> torch.Tensor:
    """BackPACK's route: one *forward* convolution, the input ``[1, N*C_in, *S]`` as its
    input, ``grad_output`` as its weight (one ``[*O]`` kernel per sample, output and
    input channel, repeated ``C_in/groups`` times), ``N * C_in`` groups, stride and
    dilation swapped; its ``[1, N*C_in*K/G, *k']`` output holds every sample's
    ``[K/G, *k]`` block per input channel (``k'`` may pass ``k`` by less than a stride:
    cropped)."""
    n, c = input.shape[:2]
    g, dim = p.groups, p.dim
    k_g, c_g, kernel = weight_size[0] // g, weight_size[1], weight_size[2:]
    out_size = grad_output.shape[2:]
    gy = grad_output.reshape(n, g, 1, k_g, *out_size)
    if c_g > 1:  # each input channel of a group needs its group's K/G kernels
        gy = gy.expand(n, g, c_g, k_g, *out_size)
    kernels = gy.reshape(n * c * k_g, 1, *out_size)
    x = input.reshape(1, n * c, *input.shape[2:])
    y = torch.ops.aten.convolution.default(
        x, kernels, None, list(p.dilation), list(p.padding), list(p.stride), False,
        [0] * dim, n * c)
    y = y[(..., *(slice(0, k) for k in kernel))]  # [1, N*C*K/G, *k]
    return (y.reshape(n, g, c_g, k_g, *kernel).transpose(2, 3)
            .reshape(n, *weight_size))


def per_sample_bias_grad(grad_output: torch.Tensor) -> torch.Tensor:
    """Bias gradient of each sample: ``grad_output [N, C_out, *O]`` summed over ``O``.

    Returns ``[N, C_out]``; its sum over the first dimension is the usual ``grad_bias``.

    >>> per_sample_bias_grad(torch.ones(2, 3, 4, 4))[0]
    tensor([16., 16., 16.])
    """
    check_tensor(grad_output, "grad_output")
    if grad_output.dim() < 3:
        raise ValueError(
            f"grad_output must be [N, C_out, *O] with at least one spatial dimension, "
            f"got shape {list(grad_output.shape)}"
        )
    return grad_output.sum(dim=tuple(range(2, grad_output.dim())))
