"""Per-sample weight gradients with one more route: convlab's C++ loop, no column buffer.

:mod:`convlab.scratch.per_sample` builds every route from ATen ops, and each of them
holds more than its result while it runs: oneDNN's blocked copies of the input and
``grad_output`` (``grouped``, ``forward``) or a chunk of im2col columns (``im2col``). The
``"loop"`` route is ``torch.ops.convlab_ext.per_sample_weight_grad``, a loop in convlab's
extension (:mod:`convlab.aten.extension`). Per (sample, input channel) plane it contracts
every kernel tap's row of the im2col columns with the group's ``grad_output`` rows, four
output channels by four taps per step (two by four in the AVX2 and baseline builds, which
have half the vector registers), the sums in vector registers and a tile's lanes summed
together by shuffles (the same pairs as a lane-by-lane halving, so the same bits). The
tap rows are never a buffer of the whole columns:

* 1x1 kernel, stride 1, no padding: the plane is the tap row, and the group's
  ``grad_output`` planes are read in place (the call holds no buffer);
* stride 1, finite plane: the plane is copied into a zero-padded buffer and the
  ``grad_output`` rows onto its row stride (once per sample and group when one block
  holds them), so tap ``t``'s row is the padded plane read from a fixed offset (the
  extra ``grad_output`` columns hold zeros and add ``0 * x``, which is exact only for
  finite ``x``);
* otherwise: the rows of a block of output rows are filled (at most 16384 values), zero
  where a tap reads padding, as unfold's columns hold;
* wide groups (``K/G * C/G * taps >= 4096``): a (sample, group)'s columns in blocks of
  131072 values, each handed to one GEMM (the BLAS's blocking wins there).

The buffers are per thread and come from torch's allocator, so
:func:`convlab.lab.method.profiling.measure_memory` counts them; what grows with the batch is
the result alone. Every result entry is summed by one thread: in a fixed order in the
tile forms, so the same bits at any thread count; in the GEMM form in the BLAS's order
inside that thread, where a test finds the same bits at 1 and 2 threads.
:func:`choose_method` says where the loop wins
(few channels per group for oneDNN's block, few samples, one sample with small kernels)
and where oneDNN's JIT kernels do (many samples with wider groups, large kernels).

:func:`per_sample_weight_grad` takes the same arguments as
:func:`convlab.scratch.per_sample.per_sample_weight_grad`, with ``"loop"`` among its
methods; every other route is that function's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from convlab.aten import extension
from convlab.scratch import per_sample, reference
from convlab.scratch.params import IntOrSeq

__all__ = ["METHODS", "ROUTES", "choose_method", "per_sample_weight_grad"]

ROUTES: tuple[str, ...] = (*per_sample.ROUTES, "loop")
METHODS: tuple[str, ...] = ("auto", *ROUTES)


def choose_method(n: int, channels_per_group: int, kernel: Sequence[int],
                  dtype: torch.dtype = torch.float32, block: int | None = None,
                  threads: int | None = None, groups: int = 1) -> str:
    """The route ``method="auto"`` takes: ``"loop"`` or the route of
    :func:`convlab.scratch.per_sample.choose_method` (same arguments: ``n`` samples,
    ``c`` = ``channels_per_group``, ``taps`` the kernel's size, oneDNN's ``block`` ``b``
    (default :func:`~convlab.scratch.per_sample.onednn_block`: the CPU's flags, read
    once per process, under ``ONEDNN_MAX_CPU_ISA``), ``threads`` (no
    rule reads it), the layer's ``groups``).

    ``"loop"`` for float32 and float64 when one of these holds, else the scratch rule:

    1. no JIT block (``b == 0``, oneDNN's GEMM fallback) and a kernel larger than 1x1,
       except depthwise with ``n > 8``;
    2. few channels for oneDNN's block (``2 * c <= b``: depthwise, a 3-channel stem, 8
       channels against a 16-wide block), except depthwise with ``n > 8`` from 5x5 on,
       where the forward route's convolution wins;
    3. ``c <= 8`` and ``n <= 8``;
    4. a 1x1 kernel with ``c <= b`` and ``n <= 8`` (the loop reads a pointwise layer's
       planes in place, as im2col does);
    5. one sample, ``c <= 16``, up to 3x3.

    What is left is where oneDNN's JIT kernels win: many samples with wider groups, or
    wide groups beyond 3x3. Fitted on the ``per_sample_auto`` sweeps
    (:mod:`convlab.lab.sections.per_sample_auto`, every route and the loop timed at every point;
    its 1x1 layers are pointwise: stride 1, no padding) of the 2-core AMD EPYC (cpuid
    family 25, model 17) at its AVX-512-BF16, AVX-512, AVX2 and SSE4.1 settings. On the
    sweeps stored now (120 points per setting, re-taken after the fit), the route it
    picks is within 10 % of the fastest at 112-118 of them, worst x1.14 (AVX-512) to x1.73
    (AVX2: the loop at 8 channels per group, N 8, 7x7, one thread, where grouped wins).
    Against the scratch rule alone on the same sweeps its route takes x0.63-x0.75 of the
    time (geometric means per setting; at best x0.19, at worst x1.73) and x0.30-x0.45 of
    the peak memory.
    """
    b = per_sample.onednn_block() if block is None else block
    route = per_sample.choose_method(n, channels_per_group, kernel, dtype, b, threads,
                                     groups)
    if dtype not in (torch.float32, torch.float64):
        return route
    taps, c = math.prod(kernel), channels_per_group
    depthwise_batch = c == 1 and n > 8  # the forward route's depthwise convolution
    no_jit = b == 0 and taps > 1 and not depthwise_batch
    few = 2 * c <= b and not (depthwise_batch and taps > 9)
    pointwise = taps == 1 and c <= b and n <= 8
    if no_jit or few or (c <= 8 and n <= 8) or pointwise or (
            n == 1 and c <= 16 and taps <= 9):
        return "loop"
    return route


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
    """Weight gradient of each sample, ``[N, C_out, C_in/groups, *k]``, as
    :func:`convlab.scratch.per_sample.per_sample_weight_grad` (same arguments and
    checks), with ``method`` one of ``"auto"`` (:func:`choose_method`), ``"loop"`` or a
    route of that function.

    The loop serves plain eager CPU float32 and float64 tensors with 1-3 spatial dims and
    no autograd; elsewhere (an input that requires grad under grad mode, a dispatch mode
    such as FakeTensor, ``torch.compile``, ``vmap``/``grad``) ``"auto"`` takes the route
    the scratch rule picks, which ATen can differentiate and trace, and ``method="loop"``
    raises ``ValueError``.

    >>> x, go = torch.randn(4, 3, 8, 8), torch.randn(4, 6, 6, 6)
    >>> per_sample_weight_grad(x, (6, 3, 3, 3), go, method="loop").shape
    torch.Size([4, 6, 3, 3, 3])
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    args = (stride, padding, dilation, groups)
    if method not in ("auto", "loop"):
        return per_sample.per_sample_weight_grad(input, weight_size, grad_output, *args,
                                                 method=method)
    size, p, _ = per_sample.check_args(input, weight_size, grad_output, *args)
    servable = _loop_serves(input, grad_output, p.dim)
    if method == "auto":
        method = "grouped" if input.device.type != "cpu" else choose_method(
            input.shape[0], size[1], size[2:], input.dtype, groups=p.groups)
        if method == "loop" and not servable:
            method = per_sample.choose_method(input.shape[0], size[1], size[2:],
                                              input.dtype, per_sample.onednn_block(),
                                              groups=p.groups)
    if method != "loop":
        return per_sample.per_sample_weight_grad(input, size, grad_output, *args,
                                                 method=method)
    if not servable:
        raise ValueError("method='loop' takes plain CPU float32 or float64 tensors with 1 "
                         "to 3 spatial dims, without autograd (an input requires grad), a "
                         "dispatch mode, torch.compile or a functorch transform")
    if input.shape[0] == 0 or math.prod(size) == 0:
        return input.new_zeros((input.shape[0], *size))
    return extension.load().ops.per_sample_weight_grad(
        input.contiguous(), grad_output.contiguous(), list(size[2:]), list(p.stride),
        list(p.padding), list(p.dilation), p.groups)


def _loop_serves(input: torch.Tensor, grad_output: torch.Tensor, dim: int) -> bool:
    """Whether the C++ loop takes these tensors (see :func:`per_sample_weight_grad`):
    plain eager CPU float32/float64 tensors with 1-3 spatial dims and no autograd; not
    under a dispatch mode, ``torch.compile`` or a functorch transform (the loop reads
    the tensors' memory, which those do not give it)."""
    if not (input.device.type == "cpu" and input.dtype in (torch.float32, torch.float64)
            and input.layout == torch.strided and 1 <= dim <= 3):
        return False
    if torch.is_grad_enabled() and (input.requires_grad or grad_output.requires_grad):
        return False
    return all(reference.values_readable(t) for t in (input, grad_output))
