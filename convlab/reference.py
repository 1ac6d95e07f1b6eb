"""Convolution forward, backward and double backward from torch ops: the team's yardstick.

Each function has the signature, argument order and return tuple of its ``torch.ops.aten``
twin (``convolution``, ``convolution_backward``, ``_convolution_double_backward``), works for
1-d, 2-d and 3-d convolutions with stride, padding, dilation, groups, ``transposed`` and
``output_padding``, and never calls a native convolution kernel: everything is an N-d
im2col (:mod:`convlab.im2col`), one batched GEMM over the groups, and an N-d col2im.

Three GEMMs make a convolution. With columns ``X = im2col(x)`` ``[G, C/G*k, N*L]``, the
weight as ``W`` ``[G, K/G, C/G*k]`` and the output as ``Y`` ``[G, K/G, N*L]``:

* forward: ``Y = W @ X``;
* grad_input: ``col2im(W^T @ dY)``;
* grad_weight: ``dY @ X^T`` (sums over the batch and the positions at once).

The batch goes through these GEMMs in chunks of samples whose columns fit in
``CHUNK_BYTES`` (grad_weight adds up the chunks' products), which keeps large batches fast.

With stride 1, grad_input is also a plain convolution (of the padded ``dY`` with the
flipped kernel); that gather form replaces the GEMM + col2im scatter when it is not larger.

A transposed convolution's forward is the grad_input of a normal one, so its backward swaps
the roles: its grad_input is a normal forward, its grad_weight a normal grad_weight with
input and grad_output exchanged.

All functions take any float dtype the device's matmul supports; device and dtype follow
the inputs, and the forward is differentiable by autograd.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from convlab.im2col import col2im, im2col
from convlab.params import (
    ConvParams,
    IntOrSeq,
    check_bias_sizes,
    check_output_mask,
    check_same,
    check_tensor,
)

__all__ = [
    "convolution",
    "convolution_backward",
    "convolution_double_backward",
    "convolution_jvp",
]

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
    return w.reshape(groups, w.shape[0] // groups, -1)


# Columns of a whole batch can be large (8 x 64*9 x 56*56 floats = 58 MB), so the GEMMs run
# over chunks of samples whose columns stay under CHUNK_BYTES, as ATen's slow path does per
# sample. Why 8 MB: glibc serves blocks over 32 MB (its largest mmap threshold) with fresh
# pages on every call (page faults + zeroing, ~15 ms for 58 MB) where a smaller block is
# reused from the heap, and a chunk stays in cache between its im2col and its GEMM, while
# the GEMMs stay large (2-16 MB measured about equally fast on CPU, 32 MB slower).
CHUNK_BYTES = 8 * 2**20


def _chunks(n: int, rows: int, positions: int, dtype: torch.dtype) -> list[slice]:
    """As few batch slices as possible, of about equal size (at least one sample each), whose
    columns ``[rows, n * positions]`` take at most ``CHUNK_BYTES``; one for an empty batch."""
    most = max(1, CHUNK_BYTES // max(1, rows * positions * dtype.itemsize))
    step = max(1, math.ceil(n / max(1, math.ceil(n / most))))
    return [slice(i, i + step) for i in range(0, max(n, 1), step)]


def _column_gemms(
    x: torch.Tensor, kernel: Sequence[int], out_size: Sequence[int], p: ConvParams,
    w: torch.Tensor | None = None, gy: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The GEMMs that read the columns ``X = im2col(x)``, made chunk by chunk: the forward
    ``W @ X`` ``[N, K, *out_size]`` if ``w`` is given, the weight gradient ``dY @ X^T``
    ``[G, K/G, C/G*k]`` if ``gy`` ``[N, K, *out_size]`` is given (else None)."""
    rows, positions = x.shape[1] * math.prod(kernel), math.prod(out_size)
    w_mat = None if w is None else _weight_matrix(w, p.groups)  # once: it may be a copy
    ys, gw = [], None
    for s in _chunks(x.shape[0], rows, positions, x.dtype):
        cols = im2col(x[s], kernel, out_size, p.stride, p.padding, p.dilation, p.groups)
        if w is not None:
            y = torch.matmul(w_mat, cols)  # [G, K/G, n*L]
            ys.append(y.reshape(w.shape[0], -1, *out_size).transpose(0, 1))
        if gy is not None:  # X @ dY^T = (dY @ X^T)^T: MKL is faster with X on the left
            term = torch.matmul(cols, _as_matrices(gy[s], p.groups).transpose(1, 2))
            gw = term if gw is None else gw + term
        del cols  # free it before the next chunk's im2col, so that its memory is reused
    y = torch.cat(ys) if w is not None else None  # cat: one copy to [N, K, *O]
    return y, (gw.transpose(1, 2) if gw is not None else None)


def _forward(
    x: torch.Tensor, w: torch.Tensor, out_size: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """Normal convolution ``[N, C, *S] -> [N, K, *out_size]``; ``out_size`` may be smaller
    than the full output (then only the first positions are computed)."""
    y, _ = _column_gemms(x, w.shape[2:], out_size, p, w=w)
    assert y is not None
    return y


def _grad_weight(
    gy: torch.Tensor, x: torch.Tensor, weight_shape: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """Weight gradient ``[K, C/G, *k]`` of a normal conv for ``gy`` ``[N, K, *O]``."""
    _, gw = _column_gemms(x, weight_shape[2:], gy.shape[2:], p, gy=gy)
    assert gw is not None
    return gw.reshape(weight_shape)


def _grad_input(
    gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """Input gradient ``[N, C, *S]`` of a normal conv for ``gy`` ``[N, K, *O]``.

    ``O`` may be smaller than the full output size.
    """
    kernel, out_size = w.shape[2:], gy.shape[2:]
    # The gather form unfolds gy (C_out rows per kernel offset), the scatter form writes
    # C_in rows per offset and then sums them: take the gather unless it has more rows.
    if all(s == 1 for s in p.stride) and w.shape[0] <= input_shape[1]:
        return _grad_input_unit_stride(gy, w, input_shape, p)
    w_t = _weight_matrix(w, p.groups).transpose(1, 2)
    parts = []
    for s in _chunks(gy.shape[0], input_shape[1] * math.prod(kernel), math.prod(out_size),
                     gy.dtype):
        chunk = gy[s]
        gcols = torch.matmul(w_t, _as_matrices(chunk, p.groups))
        shape = (chunk.shape[0], *input_shape[1:])
        parts.append(col2im(gcols, shape, kernel, out_size, p.stride, p.padding, p.dilation))
    return torch.cat(parts) if len(parts) > 1 else parts[0]  # col2im's are contiguous


def _grad_input_unit_stride(
    gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int], p: ConvParams
) -> torch.Tensor:
    """With stride 1, grad_input is itself a convolution: of ``gy`` padded by
    ``dilation * (k - 1) - padding`` with the flipped kernel, input and output channels
    swapped within each group. A gather (im2col) is cheaper than col2im's scatter-add."""
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
    unit = ConvParams.create(dim, 1, 0, p.dilation, False, 0, g)
    return _forward(gy, w_t, size, unit)


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
    >>> convolution(x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 2).shape
    torch.Size([2, 6, 4, 4])
    """
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
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
) -> Grads:
    """Gradients of :func:`convolution`, like ATen's ``aten::convolution_backward``.

    Shapes: grad_output ``[N, C_out, *O]``, input and weight as in :func:`convolution`;
    ``bias_sizes`` is None, ``[C_out]`` or ``[0]`` (as autograd passes it when there is no
    bias) and only checked. Returns ``(grad_input, grad_weight, grad_bias)`` with the shapes
    of input, weight and ``[C_out]``; an output whose ``output_mask`` entry is False is None.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> gy = torch.randn(2, 4, 6, 6)
    >>> gi, gw, gb = convolution_backward(
    ...     gy, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    >>> gi.shape, gw.shape, gb.shape
    (torch.Size([2, 3, 8, 8]), torch.Size([4, 3, 3, 3]), torch.Size([4]))
    """
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    p.check_grad_output(grad_output, input, weight)
    if not p.transposed and any(p.output_padding):
        raise ValueError(
            f"output_padding={p.output_padding} is only supported for transposed convolutions"
        )
    mask = check_output_mask(output_mask)
    out_channels = grad_output.shape[1]
    check_bias_sizes(bias_sizes, out_channels)

    grad_input = grad_weight = grad_bias = None
    if p.transposed and (mask[0] or mask[1]):
        # Normal-conv roles: "input" is grad_output (x-space), "grad_output" is input. Both
        # gradients read the columns of grad_output: one pass makes them once.
        grad_input, grad_weight = _column_gemms(
            grad_output, weight.shape[2:], input.shape[2:], p,
            w=weight if mask[0] else None, gy=input if mask[1] else None)
        if grad_weight is not None:
            grad_weight = grad_weight.reshape(weight.shape)
    else:
        if mask[0]:
            grad_input = _grad_input(grad_output, weight, input.shape, p)
        if mask[1]:
            grad_weight = _grad_weight(grad_output, input, weight.shape, p)
    if mask[2]:
        grad_bias = grad_output.sum([0, *range(2, grad_output.dim())])
    return grad_input, grad_weight, grad_bias


def convolution_double_backward(
    ggI: torch.Tensor | None,
    ggW: torch.Tensor | None,
    ggb: torch.Tensor | None,
    gO: torch.Tensor,
    weight: torch.Tensor,
    input: torch.Tensor,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    transposed: bool,
    output_padding: IntOrSeq,
    groups: int,
    output_mask: Mask,
) -> Grads:
    """Backward of :func:`convolution_backward`, like ATen's ``aten::_convolution_double_backward``.

    ``ggI``, ``ggW``, ``ggb`` are the gradients flowing into grad_input, grad_weight and
    grad_bias (shapes of input, weight and ``[C_out]``; any may be None); ``gO`` is the
    grad_output of the first backward. The convolution is bilinear in (input, weight), so:

    * ``ggO = conv(ggI, weight) + conv(input, ggW) + ggb`` (shape of gO);
    * ``gI`` = grad_input of a conv with weight ``ggW``, for grad_output ``gO``;
    * ``gW`` = grad_weight of a conv with input ``ggI``, for grad_output ``gO``.

    Returns ``(ggO, gI, gW)``. As in ATen (checked against torch 2.13), ``output_mask`` is
    validated but does not prune: a term is None exactly when the tensors it needs are None
    (``ggO`` when all three are None, ``gI`` without ``ggW``, ``gW`` without ``ggI``), and
    the convolution terms are None when ``input`` has no elements.

    >>> x, w, gO = torch.randn(1, 2, 5), torch.randn(3, 2, 3), torch.randn(1, 3, 3)
    >>> ggO, gI, gW = convolution_double_backward(
    ...     None, torch.ones_like(w), None, gO, w, x, [1], [0], [1], False, [0], 1,
    ...     [True, True, True])
    >>> ggO.shape, gI.shape, gW is None
    (torch.Size([1, 3, 3]), torch.Size([1, 2, 5]), True)
    """
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    try:
        p.check_grad_output(gO, input, weight)
    except (TypeError, ValueError) as e:
        raise type(e)(f"gO (the grad_output of the first backward): {e}") from None
    check_output_mask(output_mask)
    if ggI is not None:
        _check_like(ggI, input, "ggI", "input")
    if ggW is not None:
        _check_like(ggW, weight, "ggW", "weight")
    if ggb is not None:
        check_tensor(ggb, "ggb")
        check_same(input, ggb, "input", "ggb")
        if tuple(ggb.shape) != (gO.shape[1],):
            raise ValueError(f"ggb must have shape [{gO.shape[1]}], got {list(ggb.shape)}")
    # Like ATen, a normal conv ignores output_padding here (convolution_backward rejects it).
    output_pad = p.output_padding if p.transposed else (0,) * p.dim
    args = (p.stride, p.padding, p.dilation, p.transposed, output_pad, p.groups)
    has_elements = input.numel() != 0

    ggO = None
    if has_elements and ggI is not None:
        ggO = convolution(ggI, weight, None, *args)
    if has_elements and ggW is not None:
        term = convolution(input, ggW, None, *args)
        ggO = term if ggO is None else ggO + term
    if ggb is not None:
        term = _bias_view(ggb, p.dim).expand(gO.shape)
        ggO = term if ggO is None else ggO + term

    gI = gW = None
    if has_elements and ggW is not None:
        gI = convolution_backward(gO, input, ggW, None, *args, [True, False, False])[0]
    if has_elements and ggI is not None:
        gW = convolution_backward(gO, ggI, weight, None, *args, [False, True, False])[1]
    return ggO, gI, gW


def convolution_jvp(
    input_p: torch.Tensor,
    input_t: torch.Tensor | None,
    weight_p: torch.Tensor,
    weight_t: torch.Tensor | None,
    bias_p: torch.Tensor | None,
    bias_t: torch.Tensor | None,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    transposed: bool,
    output_padding: IntOrSeq,
    groups: int,
) -> torch.Tensor:
    """Forward-mode derivative (tangent of the output) of :func:`convolution`.

    The argument order is that of ATen's ``convolution_jvp``, the ``result:`` formula of
    ``convolution`` in ``derivatives.yaml``. The convolution is bilinear in input and
    weight, so the tangent is ``conv(input_t, weight_p) + conv(input_p, weight_t) + bias_t``;
    a ``None`` tangent counts as zero. Shapes as in :func:`convolution`; returns the output
    tangent ``[N, C_out, *O]``.

    >>> x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    >>> convolution_jvp(x, torch.ones_like(x), w, None, None, None,
    ...                 1, 0, 1, False, 0, 1).shape
    torch.Size([1, 3, 3, 3])
    """
    args = (stride, padding, dilation, transposed, output_padding, groups)
    p = ConvParams.for_tensors(input_p, weight_p, bias_p, *args)
    tangents = ((input_t, input_p, "input"), (weight_t, weight_p, "weight"))
    for tangent, primal, name in (*tangents, (bias_t, bias_p, "bias")):
        if tangent is not None:
            if primal is None:
                raise ValueError(f"{name}_t is given but {name}_p is None")
            _check_like(tangent, primal, f"{name}_t", f"{name}_p")
    out_shape = p.output_shape(tuple(input_p.shape), tuple(weight_p.shape))
    tangent = input_p.new_zeros(out_shape)
    if input_t is not None:
        tangent += convolution(input_t, weight_p, None, *args)
    if weight_t is not None:
        tangent += convolution(input_p, weight_t, None, *args)
    if bias_t is not None:
        tangent += _bias_view(bias_t, p.dim)
    return tangent


# ---------------------------------------------------------------------------------------
# Argument checks that ConvParams does not cover.


def _check_like(t: object, ref: torch.Tensor, name: str, ref_name: str) -> None:
    check_tensor(t, name)
    assert isinstance(t, torch.Tensor)
    check_same(ref, t, ref_name, name)
    if t.shape != ref.shape:
        raise ValueError(f"{name} must have the shape of {ref_name} {list(ref.shape)}, "
                         f"got {list(t.shape)}")

