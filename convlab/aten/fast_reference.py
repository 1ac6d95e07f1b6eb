"""The from-scratch backward at the speed of ATen's C++: same maths, less data movement.

:func:`convolution_backward` has the signature and return tuple of
:func:`convlab.scratch.reference.convolution_backward` (ATen's ``convolution_backward``)
and gives the same gradients (tests compare both, and ATen, in float64). It differs only
in how data moves; :func:`choose_form` picks one of three forms per call:

* ``"shift"``: channels-last **shift-and-accumulate** (kn2row), no column buffer. The
  input is copied once to channels-last, zero-padded, with the batch stacked as one tall
  image ``[N * prod(padded), C]``; ``grad_output`` is copied onto the same padded grid
  (zeros outside the output). With stride 1, kernel tap ``t`` reads the input rows shifted
  by a fixed offset ``o_t`` (``sum_d tap_d * dilation_d * row_stride_d``); with stride
  ``s`` the input is first split into its ``prod(s)`` stride phases (``x_pad[s * u + r]``),
  stacked, and a tap reads one phase at a shift. Either way each tap is one GEMM on two
  *views*: ``grad_weight[:, :, t] = G^T @ X[o_t:]`` and
  ``grad_input[o_t:] += G @ W_t`` (an in-place ``addmm_`` on a view). Grid positions
  outside the output hold zeros, so they add nothing, at the cost of
  ``prod(grid) / prod(out)`` more multiply-adds. A transposed convolution runs in the
  roles of the normal one it transposes: its grad_input is that convolution's forward
  (``Y[:] += X[o_t:] @ W_t^T`` per tap), its grad_weight that convolution's grad_weight.
* ``"im2col"``: grad_input from :mod:`convlab.aten.fast_grad_input` (per-sample columns,
  ATen's slow-path layout, and col2im in one pass of a small C++ loop straight into the
  result; with at least as many samples as threads, each thread takes whole samples, a
  single-threaded GEMM and col2im per sample, as ATen's slow path does), grad_weight
  from the simple reference's batch-folded GEMM; both in chunks of ``L2_PER_CHUNK``
  times :func:`convlab.aten.cpu_cache.l2_cache_bytes` of columns (scaled to the
  machine, not a constant). For float32/float64 plain tensors of a normal convolution;
  the rest (transposed, whose simple form makes both gradients from one pass over the
  columns, reduced precision, autograd, traced, ``vmap`` over any argument) take the
  simple form, :func:`convlab.scratch.reference.convolution_backward`, with the same
  chunks.
* ``"depthwise"``: one fused pass of a small C++ loop in convlab's extension
  (``torch.ops.convlab_ext.depthwise2d_backward``: per channel and sample, every tap
  scatter-adds into grad_input and sums into grad_weight while the planes sit in L1),
  compiled for AVX-512, AVX2 and the baseline and picked by ATen's CPU capability
  (``torch.ops.convlab_ext.depthwise2d_variant()``, which names the col2im loop's
  variant too), so ``ATEN_CPU_CAPABILITY`` caps it.

The shift form multiplies zeros that are not padding (the grid's margin) by the weight and
the input, so it needs both finite (as ATen's scatter col2im adds only real products); like
the reference's gather form it is an eager-only branch on the values, and traced or
non-finite calls take the im2col form. Results of the fast forms are not differentiable
(they are for measuring; the double backward builds on the simple reference).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal

import torch

from convlab.aten import cpu_cache, extension, fast_grad_input
from convlab.scratch import reference
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    threads_or_current,
)

__all__ = ["SHIFT_MAX_OVERHEAD", "SHIFT_MIN_CHANNELS", "check_form", "choose_form",
           "convolution_backward"]

Form = Literal["shift", "im2col", "depthwise"]
Grads = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]

# Fitted on the suite layers (see choose_form): below this many channels (in and out) the
# shift form's GEMMs are too thin to beat im2col's one deep GEMM.
SHIFT_MIN_CHANNELS = 16
# Above this ratio of grid to output positions the wasted multiply-adds of the shift
# form's margin cost more than im2col's copies save.
SHIFT_MAX_OVERHEAD = 1.2
# The im2col form's column budget, in L2 caches. On the 1 MiB-L2 AMD EPYC (2 threads, per
# fast / ATen slow, conv1d, mid3x3, cifar5, resnet14), 1 L2: 1.62, 1.34, 1.83, 1.18;
# 4: 1.06, 0.91, 0.96, 1.07; 8: 0.89, 0.84, 0.67, 1.00; 16 and 32 no better than 8. With
# grad_input's col2im in C++ (grad_input alone over ATen's, cifar5, conv1d, resnet14),
# 2 L2: 1.20, 1.03, 0.94; 4: 1.10, 1.07, 0.97; 8: 1.09, 1.15, 0.99; 16: 1.18, 1.20, 1.25.
# grad_input by sample (at least as many samples as threads) needs no budget: it holds one
# sample's columns per thread.
L2_PER_CHUNK = 8
_FAST_DTYPES = (torch.float32, torch.float64)


def choose_form(
    input_shape: Sequence[int], weight_shape: Sequence[int], p: ConvParams,
    dtype: torch.dtype, threads: int | None = None,
) -> Form:
    """Which form :func:`convolution_backward` runs for this call (values not looked at).

    Shift when: one thread (``threads``, default torch's current count), one group,
    stride 1, not transposed, ``C`` and ``K`` at least ``SHIFT_MIN_CHANNELS`` (the shift
    GEMMs have ``C`` or ``K`` as their small dimension), and the extra work
    ``prod(grid) / prod(out)`` at most ``SHIFT_MAX_OVERHEAD``. Depthwise 2-d
    float32/float64 with one output per channel: the fused C++ loop. Else im2col.

    Measured here (Xeon, AVX-512, 2 MiB L2, float32, shift time / im2col time at 1 and 2
    threads; noisy shared machine, A/A band about 0.2): the 3x3 layer with 64 channels at
    28x28 (overhead 1.15) 0.83 / 0.86 and 1-d (1.01) 1.01 / 0.82: shift wins; resnet14
    (1.31) 1.05 / 0.97 and dilated (1.31) 1.05 / 0.89: a tie; conv3d (1.42) 1.17 / 1.15,
    stride 2 1.29 / 1.07, 4 groups 1.46 / 1.42, transposed 1.22 / 1.19 and the 3-channel
    stem 2.5 / 2.0: im2col wins. So the crossover in overhead lies between 1.15 and 1.31
    (the rule takes 1.2), and groups, strides and transposition (more, thinner GEMMs per
    tap) stay with im2col.

    Threads: the records' ``reference_speed`` sections (2 threads, float32) found the shift
    form slower than im2col on both layers the 1-thread fit gave it, under every ISA
    setting of the 480 MiB-L3 Xeon: 3x3 with 64 channels x1.12 (AMX), x1.12 (AVX2),
    x1.03 (SSE4.1); 1-d x1.14, x1.08, x1.08. Its k^2 GEMMs are thin (``C`` or ``K`` wide)
    and split poorly over threads where im2col's one deep GEMM per chunk splits well, so
    with more than one thread the rule takes im2col.

    Those ratios are against the earlier im2col form (the simple reference, 4 L2 per
    chunk). Against the per-sample-columns form, at one thread on the AMD EPYC (1 MiB
    L2): the 3x3 64-channel layer 1.00, 1-d 0.95, resnet14 1.15; with its col2im in C++,
    0.99, 0.91 and 1.09: the crossover holds.
    """
    threads = threads_or_current(threads)
    dim = len(input_shape) - 2
    c_g, k_g = weight_shape[1], weight_shape[0] // p.groups
    if dtype not in _FAST_DTYPES:
        return "im2col"
    if c_g == 1 and p.groups > 1:
        if dim == 2 and k_g == 1 and not p.transposed:
            return "depthwise"
        return "im2col"
    if (p.groups > 1 or p.transposed or any(s != 1 for s in p.stride)
            or min(c_g, k_g) < SHIFT_MIN_CHANNELS):
        return "im2col"
    if threads > 1:
        return "im2col"
    x_size, out = _normal_roles(input_shape, weight_shape, p)
    grid = _phases(x_size, p)
    if math.prod(out) == 0 or math.prod(grid) / math.prod(out) > SHIFT_MAX_OVERHEAD:
        return "im2col"
    return "shift"


def _normal_roles(input_shape: Sequence[int], weight_shape: Sequence[int],
                  p: ConvParams) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Spatial sizes of the normal convolution's input and output: the call's own for a
    normal convolution, swapped for a transposed one (its output is the x-space)."""
    if p.transposed:
        return tuple(p.output_shape(tuple(input_shape), tuple(weight_shape))[2:]), tuple(
            input_shape[2:])
    return tuple(input_shape[2:]), tuple(p.output_size(input_shape[2:], weight_shape[2:]))


def convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Sequence[int] | None,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    transposed: bool,
    output_padding: IntOrSeq,
    groups: int,
    output_mask: Sequence[bool],
    *,
    form: Form | None = None,
) -> Grads:
    """:func:`convlab.scratch.reference.convolution_backward`, fast (module docstring).

    Shapes and returns as there: ``(grad_input, grad_weight, grad_bias)``, None where
    ``output_mask`` is False. Not differentiable (runs under ``torch.no_grad``).
    ``form`` (keyword only) forces a form instead of :func:`choose_form`'s, for measuring
    the crossover; a form that cannot serve the call raises ``ValueError``. The fused
    depthwise loop is CPU code: on another device that form runs as the simple reference.

    >>> x, w = torch.randn(2, 16, 8, 8), torch.randn(16, 16, 3, 3)
    >>> gi, gw, gb = convolution_backward(
    ...     torch.randn(2, 16, 8, 8), x, w, [16], [1, 1], [1, 1], [1, 1], False,
    ...     [0, 0], 1, [True, True, True])
    >>> gi.shape, gw.shape
    (torch.Size([2, 16, 8, 8]), torch.Size([16, 16, 3, 3]))
    """
    args = (stride, padding, dilation, transposed, output_padding, groups)
    p, mask = reference.check_backward_args(grad_output, input, weight, bias_sizes, *args,
                                            output_mask)
    if form is None:
        form = choose_form(input.shape, weight.shape, p, input.dtype)
        if form != "im2col" and not _fast_allowed(grad_output, input, weight, form, mask,
                                                  p.transposed):
            form = "im2col"
    else:
        check_form(form, input, weight, p)
    if form == "depthwise" and not _on_cpu(grad_output, input, weight):
        form = "im2col"  # the fused loop is CPU code: elsewhere the simple form runs
    limit = L2_PER_CHUNK * cpu_cache.l2_cache_bytes()
    if form == "im2col" and (p.transposed or input.dtype not in _FAST_DTYPES
                             or not _plain(grad_output, input, weight)
                             or (p.groups > 1 and weight.shape[1] == 1)):
        return reference.convolution_backward(
            grad_output, input, weight, bias_sizes, *args, list(mask), chunk_bytes=limit)
    with torch.no_grad():
        if form == "depthwise":
            gi, gw = _depthwise(grad_output, input, weight, p)
        elif form == "im2col":
            gi = fast_grad_input.grad_input(grad_output, weight, input.shape, p,
                                           limit) if mask[0] else None
            gw = reference.column_grad_weight(grad_output, input, weight.shape, p,
                                              limit) if mask[1] else None
        elif p.transposed:  # normal roles: x is grad_output, the output gradient is input
            gi, _, gw = _shift(input, grad_output, weight, p, (False, mask[1]), mask[0])
        else:
            _, gi, gw = _shift(grad_output, input, weight, p, mask[:2])
        gb = grad_output.sum([0, *range(2, grad_output.dim())]) if mask[2] else None
    return (gi if mask[0] else None), (gw if mask[1] else None), gb


def check_form(form: object, x: torch.Tensor, w: torch.Tensor, p: ConvParams) -> None:
    """A forced ``form`` must be one this call's shapes allow (values are not checked)."""
    if form not in ("shift", "im2col", "depthwise"):
        raise ValueError(f"form must be 'shift', 'im2col', 'depthwise' or None, got {form!r}")
    depthwise = p.groups > 1 and w.shape[1] == 1
    if form == "depthwise" and not (depthwise and p.dim == 2 and w.shape[0] == x.shape[1]
                                    and not p.transposed and x.dtype in _FAST_DTYPES):
        raise ValueError("form='depthwise' needs a 2-d float32/float64 depthwise "
                         "convolution with one output channel per input channel")
    if form == "shift" and depthwise:
        raise ValueError("form='shift' needs more than one input channel per group")


def _on_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors)


def _plain(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Eager CPU tensors of one dtype that need no autograd: no subclass, functorch
    wrapper, dispatch mode or compilation (the fast forms read values and write in place).

    Every tensor is checked: ``vmap`` over ``grad_output`` or ``weight`` alone wraps only
    that one (the shift form's ``mm(out=)`` has no batching rule, ``all_finite``'s
    ``.item()`` cannot run under vmap); such calls take the simple reference."""
    tensors = (gy, x, w)
    if not _on_cpu(*tensors) or any(t.requires_grad or t.dtype != x.dtype for t in tensors):
        return False
    return all(reference.values_readable(t) for t in tensors)


def _fast_allowed(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, form: Form,
                  mask: tuple[bool, bool, bool], transposed: bool) -> bool:
    """Plain eager CPU tensors of one dtype, no autograd needed; for the shift form, finite
    weight (grad_input) and input (grad_weight) values (module docstring)."""
    if not _plain(gy, x, w):
        return False
    if form == "depthwise":
        return True
    if transposed:  # its grad_input is a forward (ATen's products), grad_weight reads gy
        return not mask[1] or reference.all_finite(gy)
    return ((not mask[0] or reference.all_finite(w))
            and (not mask[1] or reference.all_finite(x)))


def _depthwise(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
               p: ConvParams) -> tuple[torch.Tensor, torch.Tensor]:
    ops = extension.load().ops
    gi, gw = ops.depthwise2d_backward(gy, x, w, list(p.stride), list(p.padding),
                                      list(p.dilation))
    return gi, gw


def _phases(size: Sequence[int], p: ConvParams) -> list[int]:
    """Per dimension, the length ``U`` of each stride phase of the padded input
    (``ceil((S + 2 * padding) / stride)``): the shift form's grid."""
    return [-(-(s + 2 * q) // st) for s, q, st in zip(size, p.padding, p.stride, strict=True)]


def _to_phases(t: torch.Tensor, p: ConvParams, phases: Sequence[int]) -> torch.Tensor:
    """``[N, C, *S]`` -> ``[prod(stride), N, *U, C]`` (one copy): zero-padded, each stride
    phase ``t_pad[..., stride * u + r]`` as its own channels-last image."""
    n, c, dim = t.shape[0], t.shape[1], p.dim
    pads = []
    for s, q, st, u in zip(t.shape[2:], p.padding, p.stride, phases, strict=True):
        pads.append((q, u * st - s - q))
    t = torch.nn.functional.pad(t, [v for pair in reversed(pads) for v in pair])
    split = t.reshape(n, c, *(v for u, st in zip(phases, p.stride, strict=True)
                              for v in (u, st)))
    order = [3 + 2 * d for d in range(dim)] + [0] + [2 + 2 * d for d in range(dim)] + [1]
    return split.permute(order)


def _from_phases(t: torch.Tensor, p: ConvParams, phases: Sequence[int],
                 size: Sequence[int]) -> torch.Tensor:
    """The inverse of :func:`_to_phases`, cropped to ``size`` (one copy)."""
    dim = p.dim
    n, c = t.shape[dim], t.shape[-1]
    order = [dim, 2 * dim + 1] + [v for d in range(dim) for v in (dim + 1 + d, d)]
    full = t.permute(order).reshape(n, c, *(u * st for u, st in
                                            zip(phases, p.stride, strict=True)))
    crop = tuple(slice(q, q + s) for q, s in zip(p.padding, size, strict=True))
    return full[(slice(None), slice(None), *crop)].contiguous()


def _shift(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, p: ConvParams,
           mask: Sequence[bool], forward: bool = False) -> tuple[torch.Tensor | None, ...]:
    """The shift-and-accumulate form (N-d, groups, any stride): module docstring.

    In normal-convolution roles (``p.transposed`` is ignored): ``x`` ``[N, C, *S]``, ``w``
    ``[K, C/G, *k]``, ``gy`` ``[N, K, *O]`` (only its shape is read when ``mask`` is all
    False). Returns ``(y, grad_input, grad_weight)``: the forward ``[N, K, *O]`` if
    ``forward``, the gradients where ``mask`` asks for them, else None.

    With stride ``s``, tap ``t`` reads ``x_pad[s * o + t * dilation]``: write
    ``t * dilation = s * q + r``; it reads phase ``r`` (``x_pad[s * u + r]``) at ``o + q``,
    a stride-1 shift. All phases are stacked in one tall channels-last matrix, so each tap
    is still one GEMM on views.
    """
    n, c = x.shape[:2]
    k, g = w.shape[0], p.groups
    c_g, k_g = c // g, k // g
    kernel, out = w.shape[2:], gy.shape[2:]
    phases = _phases(x.shape[2:], p)
    per_phase = n * math.prod(phases)
    row_stride = [math.prod(phases[d + 1:]) for d in range(p.dim)]
    phase_stride = [math.prod(p.stride[d + 1:]) for d in range(p.dim)]
    offsets = []
    for tap in _taps(kernel):
        qr = [divmod(t * d, st) for t, d, st in zip(tap, p.dilation, p.stride, strict=True)]
        phase = sum(r * ps for (_, r), ps in zip(qr, phase_stride, strict=True))
        offsets.append(phase * per_phase
                       + sum(q * rs for (q, _), rs in zip(qr, row_stride, strict=True)))
    stacked_rows = math.prod(p.stride) * per_phase
    rows = max(stacked_rows, max(offsets) + per_phase)  # a margin for the last shifts
    if mask[0] or mask[1]:
        grid = gy.new_zeros(n, *phases, k)
        grid[(slice(None), *(slice(0, o) for o in out))] = gy.movedim(1, -1)
        gflat = grid.reshape(per_phase, k)
    y = gi = gw = None
    if mask[1] or forward:
        xflat = x.new_zeros(rows, c)
        xflat[:stacked_rows].view(
            *p.stride, n, *phases, c).copy_(_to_phases(x, p, phases))
    w_taps = w.reshape(k, c_g, -1).permute(2, 0, 1).contiguous()  # [taps, K, C/G]
    if forward:
        yflat = x.new_zeros(per_phase, k)
        for t, off in enumerate(offsets):
            xs = xflat[off:off + per_phase]
            for j in range(g):
                yflat[:, j * k_g:(j + 1) * k_g].addmm_(
                    xs[:, j * c_g:(j + 1) * c_g], w_taps[t, j * k_g:(j + 1) * k_g].t())
        y = (yflat.view(n, *phases, k)[(slice(None), *(slice(0, o) for o in out))]
             .movedim(-1, 1).contiguous())
    if mask[1]:
        gw_taps = x.new_empty(len(offsets), k, c_g)
        for t, off in enumerate(offsets):
            xs = xflat[off:off + per_phase]
            for j in range(g):
                torch.mm(gflat[:, j * k_g:(j + 1) * k_g].t(), xs[:, j * c_g:(j + 1) * c_g],
                         out=gw_taps[t, j * k_g:(j + 1) * k_g])
        gw = gw_taps.permute(1, 2, 0).reshape(w.shape)
    if mask[0]:
        gil = x.new_zeros(rows, c)
        for t, off in enumerate(offsets):
            target = gil[off:off + per_phase]
            for j in range(g):
                target[:, j * c_g:(j + 1) * c_g].addmm_(
                    gflat[:, j * k_g:(j + 1) * k_g], w_taps[t, j * k_g:(j + 1) * k_g])
        stacked = gil[:stacked_rows].view(*p.stride, n, *phases, c)
        gi = _from_phases(stacked, p, phases, x.shape[2:])
    return y, gi, gw


def _taps(kernel: Sequence[int]) -> list[tuple[int, ...]]:
    """Kernel offsets in row-major order (the weight's own order of its taps)."""
    return list(itertools.product(*(range(s) for s in kernel)))
