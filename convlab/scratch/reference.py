"""Convolution forward and backward from torch ops: the exact yardstick.

Each function has the signature, argument order and return tuple of its ``torch.ops.aten``
twin (``convolution``, ``convolution_backward``; the second order, built on these two, is
:mod:`convlab.scratch.double_backward`), works for 1-d, 2-d and 3-d convolutions with
stride, padding, dilation, groups, ``transposed`` and ``output_padding``, and never calls
a native convolution kernel: everything is an N-d im2col
(:func:`convlab.scratch.im2col.im2col`), one batched GEMM over the groups, and an N-d col2im.

Three GEMMs make a convolution. With columns ``X = im2col(x)`` ``[G, C/G*k, N*L]`` (one
column per sample and output position), the weight as ``W`` ``[G, K/G, C/G*k]`` and the
output gradient as ``dY`` ``[G, K/G, N*L]``:

* forward: ``Y = W @ X``;
* grad_input: ``col2im(Wᵀ @ dY)`` (a scatter-add: each product lands on the input element
  it came from); with stride 1 and finite weights, the equivalent gather: a forward of the
  padded ``dY`` with the flipped kernel;
* grad_weight: ``dY @ Xᵀ`` (sums over the batch and the positions at once).

The batch goes through these GEMMs in chunks of samples whose columns fit in
``CHUNK_BYTES`` (grad_weight adds up the chunks' products), so the peak memory stays
bounded.

Depthwise convolutions (one input channel per group) make these GEMMs degenerate (inner
dimension ``k``), so they take a direct form instead: a sum over the kernel offsets of
strided slices of the input times one weight per channel, accumulated in float32 for
bfloat16/float16 tensors like ATen's kernels (and rounded once at the end).

A transposed convolution's forward is the grad_input of a normal one, so its backward swaps
the roles: its grad_input is a normal forward, its grad_weight a normal grad_weight with
input and grad_output exchanged.

Products with padding zeros happen exactly where ATen's slow kernels make them (forward and
grad_weight read zero-padded windows; grad_input never multiplies a padding zero), so NaN
and inf propagate as in ATen. All functions take any float dtype the device's matmul
supports; device and dtype follow the inputs, and every function is differentiable by
autograd (inputs may require grad).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from convlab.scratch.im2col import col2im, columns, tap_windows
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_bias_sizes,
    check_output_mask,
    check_same,
    check_tensor,
)

__all__ = ["all_finite", "check_backward_args", "column_grad_weight", "convolution",
           "convolution_backward", "gather_operands", "sample_chunks", "values_readable"]

Mask = Sequence[bool]
Grads = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


# ---------------------------------------------------------------------------------------
# The three GEMMs of a normal (non-transposed) convolution, without bias.
# Here `x` is the input [N, C, *S], `w` the weight [K, C/G, *k], `gy` the grad of the
# output [N, K, *O]; `p` holds stride/padding/dilation/groups (transposed is ignored).


def _as_matrices(y: torch.Tensor, groups: int) -> torch.Tensor:
    """``[N, K, *O]`` -> ``[G, K/G, N*L]`` (one copy)."""
    n, k, positions = y.shape[0], y.shape[1], math.prod(y.shape[2:])
    per_group = k // groups
    return (
        y.reshape(n, groups, per_group, positions)
        .permute(1, 2, 0, 3)
        .reshape(groups, per_group, n * positions)
    )


def _weight_matrix(w: torch.Tensor, groups: int) -> torch.Tensor:
    """``[K, C/G, *k]`` -> ``[G, K/G, C/G*k]`` (a view when ``w`` is contiguous)."""
    return w.reshape(groups, w.shape[0] // groups, math.prod(w.shape[1:]))


# The columns of a whole batch are prod(kernel) times the input (8 x 64*9 x 56*56 floats
# are 58 MB), so the GEMMs run over chunks of samples whose columns stay under
# CHUNK_BYTES, as ATen's slow path works per sample: the peak memory stays bounded and the
# allocator reuses one chunk's columns for the next, while each GEMM stays large.
CHUNK_BYTES = 8 * 2**20


def sample_chunks(n: int, sample_bytes: int, limit: int | None = None) -> list[slice]:
    """As few batch slices as possible, of about equal size (at least one sample each),
    whose per-sample data (columns, gradients) take at most ``limit`` bytes (default
    ``CHUNK_BYTES``; ``sample_bytes`` per sample); one for N = 0."""
    limit = CHUNK_BYTES if limit is None else limit
    most = max(1, limit // max(1, sample_bytes))
    step = max(1, math.ceil(n / max(1, math.ceil(n / most))))
    return [slice(i, i + step) for i in range(0, max(n, 1), step)]


def _is_depthwise(w: torch.Tensor, groups: int) -> bool:
    """One input channel per group (in normal-conv roles): the direct form applies."""
    return groups > 1 and w.shape[1] == 1


def _column_gemms(
    x: torch.Tensor, kernel: Sequence[int], out_size: Sequence[int], p: ConvParams,
    w: torch.Tensor | None = None, gy: torch.Tensor | None = None,
    chunk_bytes: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The GEMMs that read the columns ``X = im2col(x)``, made chunk by chunk: the forward
    ``W @ X`` ``[N, K, *out_size]`` if ``w`` is given, the weight gradient ``dY @ Xᵀ``
    ``[G, K/G, C/G*k]`` if ``gy`` ``[N, K, *out_size]`` is given (else None)."""
    sample_bytes = x.shape[1] * math.prod(kernel) * math.prod(out_size) * x.element_size()
    w_mat = None if w is None else _weight_matrix(w, p.groups)  # once: it may be a copy
    ys, gw = [], None
    for s in sample_chunks(x.shape[0], sample_bytes, chunk_bytes):
        cols = columns(x[s], kernel, out_size, p.stride, p.padding, p.dilation, p.groups)
        if w_mat is not None:
            y = torch.matmul(w_mat, cols)  # [G, K/G, n*L]
            ys.append(y.reshape(w_mat.shape[0] * w_mat.shape[1], x[s].shape[0], *out_size)
                      .transpose(0, 1))
        if gy is not None:  # computed as X @ dYᵀ = (dY @ Xᵀ)ᵀ, the long dimension inside
            term = torch.matmul(cols, _as_matrices(gy[s], p.groups).transpose(1, 2))
            gw = term if gw is None else gw + term
        del cols  # free it before the next chunk's im2col, so that its memory is reused
    y = torch.cat(ys) if w_mat is not None else None  # cat: one copy to [N, K, *O]
    return y, (gw.transpose(1, 2) if gw is not None else None)


def _forward(
    x: torch.Tensor, w: torch.Tensor, out_size: Sequence[int], p: ConvParams,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """Normal convolution ``[N, C, *S] -> [N, K, *out_size]``; ``out_size`` may be smaller
    than the full output (then only the first positions are computed)."""
    if _is_depthwise(w, p.groups):
        return _depthwise_forward(x, w, out_size, p)
    y, _ = _column_gemms(x, w.shape[2:], out_size, p, w=w, chunk_bytes=chunk_bytes)
    assert y is not None
    return y


def column_grad_weight(
    gy: torch.Tensor, x: torch.Tensor, weight_shape: Sequence[int], p: ConvParams,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """Weight gradient ``[K, C/G, *k]`` of a normal conv for ``gy`` ``[N, K, *O]`` and
    ``x`` ``[N, C, *S]``: the batch-folded GEMM ``dY @ Xᵀ`` over chunks of columns of at
    most ``chunk_bytes`` (default ``CHUNK_BYTES``). Arguments are not checked here
    (:func:`check_backward_args` does)."""
    if p.groups > 1 and weight_shape[1] == 1:
        return _depthwise_grad_weight(gy, x, weight_shape, p)
    _, gw = _column_gemms(x, weight_shape[2:], gy.shape[2:], p, gy=gy,
                          chunk_bytes=chunk_bytes)
    assert gw is not None
    return gw.reshape(weight_shape)


def _grad_input(
    gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int], p: ConvParams,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """Input gradient ``[N, C, *S]`` of a normal conv for ``gy`` ``[N, K, *O]``:
    ``col2im(Wᵀ @ dY)``, chunk by chunk. ``O`` may be smaller than the full output size."""
    if _is_depthwise(w, p.groups):
        return _depthwise_grad_input(gy, w, input_shape, p)
    # The gather form unfolds gy (K/G rows per kernel offset) where the scatter form writes
    # C/G rows per offset: take it when that is not more, and when every weight is finite
    # (it multiplies the weight by padding zeros: 0 * inf is NaN where ATen's scatter, which
    # adds only real products, has a number). Finiteness is a fact about the values, so the
    # gather form is an eager-only shortcut: traced code takes the scatter form, exact for
    # every weight, and has no data-dependent branch.
    if (all(s == 1 for s in p.stride) and w.shape[0] <= input_shape[1]
            and values_readable(w) and all_finite(w)):
        return _grad_input_unit_stride(gy, w, input_shape, p, chunk_bytes)
    kernel, out_size = w.shape[2:], gy.shape[2:]
    w_t = _weight_matrix(w, p.groups).transpose(1, 2)  # [G, C/G*k, K/G]
    sample_bytes = input_shape[1] * math.prod(kernel) * math.prod(out_size) * gy.element_size()
    parts = []
    for s in sample_chunks(gy.shape[0], sample_bytes, chunk_bytes):
        chunk = gy[s]
        gcols = torch.matmul(w_t, _as_matrices(chunk, p.groups))  # [G, C/G*k, n*L]
        shape = (chunk.shape[0], *input_shape[1:])
        parts.append(col2im(gcols, shape, kernel, out_size, p.stride, p.padding, p.dilation))
    return torch.cat(parts) if len(parts) > 1 else parts[0]  # col2im's are contiguous


def values_readable(t: torch.Tensor) -> bool:
    """Whether a branch on ``t``'s values is allowed: a plain eager tensor with real data.

    False for meta and fake tensors, tensor subclasses, ``torch.func`` wrappers (vmap, grad,
    jvp levels), under any ``TorchDispatchMode`` (fake, proxy/``make_fx``, AOTAutograd)
    and under ``torch.compile``: there the values are unknown or reading them would guard
    on data.
    """
    if type(t) is not torch.Tensor or t.device.type == "meta":
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    if torch._C._len_torch_dispatch_stack() > 0:
        return False
    return not torch.compiler.is_compiling()


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite, in one reduction.

    A sum with a NaN or an infinity among its terms is NaN or infinite (IEEE addition never
    turns them back into a number), so a finite sum proves every element finite. A sum of
    finite values that overflows reads as not finite: the caller then takes its path that
    is exact for any value. One pass, where ``isfinite(t).all()`` makes three (20x slower
    on a ResNet weight). ``t`` must be a plain eager tensor with real values.
    """
    return math.isfinite(t.detach().sum().item())


def gather_operands(gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int],
                    p: ConvParams) -> tuple[torch.Tensor, torch.Tensor, ConvParams]:
    """With stride 1, grad_input is itself a convolution (a gather): of ``gy`` padded by
    ``dilation * (k - 1) - padding`` with the flipped kernel, input and output channels
    swapped within each group. Returns ``(padded gy, that kernel, its ConvParams)``."""
    g, dim = p.groups, p.dim
    kernel, out_size, size = w.shape[2:], gy.shape[2:], input_shape[2:]
    pads = []
    for k, o, s, pad, d in zip(kernel, out_size, size, p.padding, p.dilation, strict=True):
        left = d * (k - 1) - pad
        pads.append((left, s + d * (k - 1) - o - left))  # negative values crop
    gy = F.pad(gy, [v for pair in reversed(pads) for v in pair])
    c_out, c_in_g = w.shape[:2]
    w_t = (w.reshape(g, c_out // g, c_in_g, *kernel).transpose(1, 2)
           .reshape(g * c_in_g, c_out // g, *kernel).flip(list(range(2, 2 + dim))))
    return gy, w_t, ConvParams.create(dim, 1, 0, p.dilation, False, 0, g)


def _grad_input_unit_stride(
    gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int], p: ConvParams,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """grad_input as the gather of :func:`gather_operands`, in column GEMMs."""
    gy, w_t, unit = gather_operands(gy, w, input_shape, p)
    y, _ = _column_gemms(gy, w.shape[2:], input_shape[2:], unit, w=w_t,
                         chunk_bytes=chunk_bytes)
    assert y is not None
    return y


# ---------------------------------------------------------------------------------------
# Depthwise (C/G = 1): no GEMM, one strided multiply-add per kernel offset.
# `x` [N, G, *S], `w` [G*M, 1, *k] (M outputs per input channel), `gy` [N, G*M, *O].


def _accumulator(t: torch.Tensor) -> torch.dtype:
    """The dtype the depthwise sums run in: float32 for bf16/fp16 taps, as ATen's kernels
    accumulate reduced-precision products in float32; else ``t``'s own dtype."""
    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def _padded(x: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
    return F.pad(x, [v for pad in reversed(padding) for v in (pad, pad)]) if any(padding) else x


def _depthwise_forward(
    x: torch.Tensor, w: torch.Tensor, out_size: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """``y[n, g*M + m] = sum over offsets of w[g*M + m, 0, offset] * x_pad[n, g, window]``."""
    n, g, dim = x.shape[0], p.groups, p.dim
    m = w.shape[0] // g
    taps = w.reshape(g, m, -1)  # [G, M, k]
    ones = (1,) * dim
    acc = _accumulator(x)
    xp = _padded(x, p.padding).to(acc)
    taps = taps.to(acc)
    # Zeros batched like both operands: under vmap over the weight, an in-place add into
    # zeros made from x alone cannot take a batched term.
    y = x.new_zeros(n, g, m, *out_size, dtype=acc) + taps.new_zeros(())
    for t, (_, window) in enumerate(tap_windows(w.shape[2:], out_size, p.stride, p.dilation)):
        y.addcmul_(xp[(slice(None), slice(None), *window)].unsqueeze(2),
                   taps[:, :, t].reshape(1, g, m, *ones))
    return y.reshape(n, g * m, *out_size).to(x.dtype)


def _depthwise_grad_input(
    gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """Scatter form: each offset adds ``w * gy`` onto the input window it read."""
    n, g, dim = gy.shape[0], p.groups, p.dim
    m = w.shape[0] // g
    out_size, spatial = gy.shape[2:], input_shape[2:]
    acc = _accumulator(gy)
    taps = w.reshape(g, m, -1).to(acc)
    gyv = gy.reshape(n, g, m, *out_size).to(acc)
    ones = (1,) * dim
    padded = [s + 2 * pad for s, pad in zip(spatial, p.padding, strict=True)]
    gi = gy.new_zeros(n, g, *padded, dtype=acc) + taps.new_zeros(())  # batched like both
    for t, (_, window) in enumerate(tap_windows(w.shape[2:], out_size, p.stride, p.dilation)):
        target = gi[(slice(None), slice(None), *window)]
        if m == 1:
            target.addcmul_(gyv[:, :, 0], taps[:, 0, t].reshape(1, g, *ones))
        else:
            target.add_((gyv * taps[:, :, t].reshape(1, g, m, *ones)).sum(2))
    crop = tuple(slice(pad, pad + s) for pad, s in zip(p.padding, spatial, strict=True))
    return gi[(slice(None), slice(None), *crop)].to(gy.dtype).contiguous()


def _depthwise_grad_weight(
    gy: torch.Tensor, x: torch.Tensor, weight_shape: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """``gw[g*M + m, 0, offset] = sum over n and positions of gy * x_pad[window]``."""
    n, g = x.shape[0], p.groups
    m = weight_shape[0] // g
    out_size = gy.shape[2:]
    acc = _accumulator(gy)
    gyv = gy.reshape(n, g, m, *out_size).to(acc)
    xp = _padded(x, p.padding).to(acc)
    reduce = (0, *range(3, 3 + p.dim))
    taps = [(gyv * xp[(slice(None), slice(None), *window)].unsqueeze(2)).sum(reduce)
            for _, window in tap_windows(weight_shape[2:], out_size, p.stride, p.dilation)]
    # [G, M, k] -> [G*M, 1, *k]
    return torch.stack(taps, -1).reshape(weight_shape).to(gy.dtype)


def _bias_view(bias: torch.Tensor, dim: int) -> torch.Tensor:
    return bias.reshape(1, -1, *([1] * dim))


# ---------------------------------------------------------------------------------------
# Public API (ATen signatures).


def convolution(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    transposed: bool,
    output_padding: IntOrSeq,
    groups: int,
) -> torch.Tensor:
    """N-d convolution (or transposed convolution), like ATen's ``aten::convolution``.

    Shapes: input ``[N, C_in, *S]``; weight ``[C_out, C_in/groups, *k]`` (normal) or
    ``[C_in, C_out/groups, *k]`` (transposed); bias ``[C_out]`` or None.
    Returns the output ``[N, C_out, *O]`` (contiguous), differentiable by autograd.

    >>> x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 2, 3, 3)
    >>> y = convolution(x, w, None, [2, 2], [1, 1], [1, 1], False,
    ...                 [0, 0], 2)
    >>> y.shape
    torch.Size([2, 6, 4, 4])
    """
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    _check_like_aten(p, weight)
    out_shape = p.output_shape(tuple(input.shape), tuple(weight.shape))
    if p.transposed:
        # The transposed conv is the grad_input of the normal conv that maps out -> input.
        y = _grad_input(input, weight, out_shape, p)
    else:
        y = _forward(input, weight, out_shape[2:], p)
    if bias is not None:
        y = y + _bias_view(bias, p.dim)
    return y


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
    output_mask: Mask,
    *,
    chunk_bytes: int | None = None,
) -> Grads:
    """Gradients of :func:`convolution`, like ATen's ``aten::convolution_backward``.

    Shapes: grad_output ``[N, C_out, *O]``, input and weight as in :func:`convolution`;
    ``bias_sizes`` is None, ``[C_out]`` or ``[0]`` (as autograd passes it when there is no
    bias) and only checked. Returns ``(grad_input, grad_weight, grad_bias)`` with the shapes
    of input, weight and ``[C_out]``; an output whose ``output_mask`` entry is False is None.
    ``chunk_bytes`` (keyword only, not in ATen's signature) bounds each chunk's columns
    (default ``CHUNK_BYTES``; :mod:`convlab.aten.fast_reference` passes the L2 size).

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> gy = torch.randn(2, 4, 6, 6)
    >>> gi, gw, gb = convolution_backward(
    ...     gy, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
    ...     [True, True, True])
    >>> gi.shape, gw.shape, gb.shape
    (torch.Size([2, 3, 8, 8]), torch.Size([4, 3, 3, 3]), torch.Size([4]))
    """
    p, mask = check_backward_args(grad_output, input, weight, bias_sizes, stride, padding,
                                  dilation, transposed, output_padding, groups, output_mask,
                                  chunk_bytes=chunk_bytes)
    cb = chunk_bytes
    grad_input = grad_weight = grad_bias = None
    if p.transposed and (mask[0] or mask[1]) and not _is_depthwise(weight, p.groups):
        # Normal-conv roles: "input" is grad_output (x-space), "grad_output" is input. Both
        # gradients read the columns of grad_output: one pass makes them once.
        grad_input, grad_weight = _column_gemms(
            grad_output, weight.shape[2:], input.shape[2:], p,
            w=weight if mask[0] else None, gy=input if mask[1] else None, chunk_bytes=cb)
        if grad_weight is not None:
            grad_weight = grad_weight.reshape(weight.shape)
    elif p.transposed:
        if mask[0]:
            grad_input = _forward(grad_output, weight, input.shape[2:], p, cb)
        if mask[1]:
            grad_weight = column_grad_weight(input, grad_output, weight.shape, p, cb)
    else:
        if mask[0]:
            grad_input = _grad_input(grad_output, weight, input.shape, p, cb)
        if mask[1]:
            grad_weight = column_grad_weight(grad_output, input, weight.shape, p, cb)
    if mask[2]:
        grad_bias = grad_output.sum([0, *range(2, grad_output.dim())])
    return grad_input, grad_weight, grad_bias


def check_backward_args(
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
    output_mask: Mask,
    *,
    chunk_bytes: int | None = None,
) -> tuple[ConvParams, tuple[bool, bool, bool]]:
    """Check :func:`convolution_backward`'s arguments as it does (what ATen refuses, plus
    ``chunk_bytes``) and return the parameters and the mask, so that a caller that runs
    the gradients itself (:mod:`convlab.aten.fast_reference`) checks them once.

    Raises ``ValueError`` or ``TypeError`` naming the argument.
    """
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    _check_like_aten(p, weight)
    p.check_grad_output(grad_output, input, weight)
    if not p.transposed and any(p.output_padding):
        raise ValueError(
            f"output_padding={p.output_padding} is only supported for transposed convolutions"
        )
    mask = check_output_mask(output_mask)
    if chunk_bytes is not None and (not isinstance(chunk_bytes, int) or chunk_bytes < 1):
        raise ValueError(f"chunk_bytes must be a positive int or None, got {chunk_bytes!r}")
    check_bias_sizes(bias_sizes, grad_output.shape[1])
    return p, mask


# ---------------------------------------------------------------------------------------
# Argument checks that ConvParams does not cover.

def _check_like_aten(p: ConvParams, weight: torch.Tensor) -> None:
    """What ATen refuses beyond ConvParams (which checks the int64 limits): an empty
    weight.shape[0]."""
    if weight.shape[0] == 0:
        raise ValueError(f"weight must have weight.shape[0] >= 1 (ATen refuses an empty "
                         f"one), got shape {list(weight.shape)}")


def _check_like(t: object, ref: torch.Tensor, name: str, ref_name: str) -> None:
    check_tensor(t, name)
    assert isinstance(t, torch.Tensor)
    check_same(ref, t, ref_name, name)
    if t.shape != ref.shape:
        raise ValueError(f"{name} must have the shape of {ref_name} {list(ref.shape)}, "
                         f"got {list(t.shape)}")

