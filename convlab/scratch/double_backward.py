"""Second order from torch ops: the double backward and the forward-mode derivative.

:func:`convolution_double_backward` (ATen's ``_convolution_double_backward``) and
:func:`convolution_jvp` (the ``result:`` formula of ``convolution`` in ``derivatives.yaml``),
both built from :func:`convlab.scratch.reference.convolution` and
:func:`convlab.scratch.reference.convolution_backward`: a convolution is bilinear in
(input, weight), so every second-order term is one more convolution or convolution
backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_output_mask,
    check_same,
    check_tensor,
)
from convlab.scratch.reference import (
    _bias_view,
    _check_like,
    convolution,
    convolution_backward,
)

__all__ = ["convolution_double_backward", "convolution_jvp"]

Mask = Sequence[bool]
Grads = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


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
    """Backward of :func:`~convlab.scratch.reference.convolution_backward`.

    Like ATen's ``aten::_convolution_double_backward``.

    ``ggI``, ``ggW``, ``ggb`` are the gradients flowing into grad_input, grad_weight and
    grad_bias (shapes of input, weight and ``[C_out]``; any may be None); ``gO`` is the
    grad_output of the first backward. The convolution is bilinear in (input, weight), so:

    * ``ggO = conv(ggI, weight) + conv(input, ggW) + ggb`` (shape of gO);
    * ``gI`` = grad_input of a conv with weight ``ggW``, for grad_output ``gO``;
    * ``gW`` = grad_weight of a conv with input ``ggI``, for grad_output ``gO``.

    Returns ``(ggO, gI, gW)``. As in ATen's ``_convolution_double_backward``, ``output_mask`` is
    validated but does not prune: a term is None exactly when the tensors it needs are None
    (``ggO`` when all three are None, ``gI`` without ``ggW``, ``gW`` without ``ggI``), and
    the convolution terms are None when ``input`` has no elements.

    >>> x, w = torch.randn(1, 2, 5), torch.randn(3, 2, 3)
    >>> gO = torch.randn(1, 3, 3)
    >>> ggO, gI, gW = convolution_double_backward(
    ...     None, torch.ones_like(w), None, gO, w, x, [1], [0], [1],
    ...     False, [0], 1, [True, True, True])
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
    """Forward-mode derivative (output tangent) of :func:`~convlab.scratch.reference.convolution`.

    The argument order is that of ATen's ``convolution_jvp``, the ``result:`` formula of
    ``convolution`` in ``derivatives.yaml``. The convolution is bilinear in input and
    weight, so the tangent is ``conv(input_t, weight_p) + conv(input_p, weight_t) + bias_t``;
    a ``None`` tangent counts as zero. Shapes as in
    :func:`~convlab.scratch.reference.convolution`; returns the output tangent
    ``[N, C_out, *O]``.

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
    # Out of place: under vmap (torch.func.jacfwd, hessian) the tangents are batched and the
    # zeros are not, and an in-place add cannot grow a tensor.
    tangent = input_p.new_zeros(out_shape)
    if input_t is not None:
        tangent = tangent + convolution(input_t, weight_p, None, *args)
    if weight_t is not None:
        tangent = tangent + convolution(input_p, weight_t, None, *args)
    if bias_t is not None:
        tangent = tangent + _bias_view(bias_t, p.dim)
    return tangent
