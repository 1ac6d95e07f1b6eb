"""Convolution as a twice-differentiable autograd op whose derivatives are convlab's own.

Two ways to plug :mod:`convlab.reference` into autograd:

* :class:`Convolution` (a :class:`torch.autograd.Function`) and its functional form
  :func:`convolution`. Its backward is a second Function, :class:`ConvolutionBackward`, whose
  forward is ``reference.convolution_backward`` and whose backward is
  ``reference.convolution_double_backward``. So ``gradgradcheck`` exercises convlab's
  double-backward formulas, not autograd recorded through the ops of the first backward.
* The custom operators ``torch.ops.convlab.convolution`` and
  ``torch.ops.convlab.convolution_backward`` (:mod:`torch.library`), with fake (meta)
  implementations and autograd formulas wired the same way, so they work under
  ``torch.compile`` and pass ``torch.library.opcheck``. :func:`convolution_op` is the
  functional form.

Both mirror ATen: ``convolution`` has ``aten::convolution``'s arguments, the backward has
``aten::convolution_backward``'s and the double backward follows
``aten::_convolution_double_backward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from convlab import reference
from convlab.params import ConvParams, IntOrSeq, check_output_mask, check_tensor, normalize

__all__ = [
    "Convolution",
    "ConvolutionBackward",
    "convolution",
    "convolution_op",
]

Grads = tuple[Tensor | None, Tensor | None, Tensor | None]


def _check_backward_args(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_sizes: Sequence[int] | None,
    p: ConvParams,
    output_mask: Sequence[bool],
) -> None:
    # ATen's convention: None or [0] means "no bias".
    bias_shape = None if bias_sizes is None or list(bias_sizes) == [0] else tuple(bias_sizes)
    p.check_shapes(tuple(input.shape), tuple(weight.shape), bias_shape)
    p.check_grad_output(grad_output, input, weight)
    check_output_mask(output_mask)


def _keep(grads: Sequence[Tensor | None], mask: Sequence[bool]) -> Grads:
    """``grads`` with ``None`` wherever ``mask`` is False.

    ``_convolution_double_backward`` (ATen's and convlab's) computes every term its inputs
    allow, whatever the mask, so the mask is applied here.
    """
    return tuple(g if m else None for g, m in zip(grads, mask, strict=True))  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# torch.autograd.Function
# --------------------------------------------------------------------------------------------


class ConvolutionBackward(torch.autograd.Function):
    """First-order conv backward as a differentiable Function.

    ``forward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask)`` returns ``(grad_input, grad_weight, grad_bias)``
    (``None`` where masked) from ``reference.convolution_backward``; ``backward`` takes the
    gradients of those three (``ggI, ggW, ggb``) and returns ``(ggO, gI, gW)`` from
    ``reference.convolution_double_backward``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        grad_output: Tensor,
        input: Tensor,
        weight: Tensor,
        bias_sizes: list[int] | None,
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        transposed: bool,
        output_padding: list[int],
        groups: int,
        output_mask: list[bool],
    ) -> Grads:
        ctx.save_for_backward(grad_output, input, weight)
        ctx.hyper = (stride, padding, dilation, transposed, output_padding, groups)
        ctx.set_materialize_grads(False)
        grads = reference.convolution_backward(
            grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
            output_padding, groups, output_mask,
        )
        return _keep(grads, output_mask)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, ggI: Tensor | None, ggW: Tensor | None, ggb: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        grad_output, input, weight = ctx.saved_tensors
        mask = [bool(m) for m in ctx.needs_input_grad[:3]]
        if all(g is None for g in (ggI, ggW, ggb)) or not any(mask):
            return (None,) * 11
        grads = reference.convolution_double_backward(
            ggI, ggW, ggb, grad_output, weight, input, *ctx.hyper, mask
        )
        return (*_keep(grads, mask), *(None,) * 8)


class Convolution(torch.autograd.Function):
    """``reference.convolution`` with convlab's backward, differentiable twice.

    Arguments are those of ``aten::convolution`` (see :func:`convolution`). The backward
    asks only for the gradients autograd needs (``ctx.needs_input_grad`` becomes
    ``output_mask``) and runs through :class:`ConvolutionBackward`.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        stride: IntOrSeq,
        padding: IntOrSeq,
        dilation: IntOrSeq,
        transposed: bool,
        output_padding: IntOrSeq,
        groups: int,
    ) -> Tensor:
        p = ConvParams.for_tensors(
            input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        )
        ctx.save_for_backward(input, weight)
        ctx.params = p
        ctx.bias_sizes = None if bias is None else list(bias.shape)
        return reference.convolution(input, weight, bias, *p.aten_args())

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        input, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        mask = [bool(needs[0]), bool(needs[1]), ctx.bias_sizes is not None and bool(needs[2])]
        grads = ConvolutionBackward.apply(
            grad_output, input, weight, ctx.bias_sizes, *ctx.params.aten_args(), mask
        )
        return (*grads, None, None, None, None, None, None)


def convolution(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
) -> Tensor:
    """N-d convolution through :class:`Convolution` (``aten::convolution``'s arguments).

    input ``[N, C_in, *spatial]``; weight ``[C_out, C_in/groups, *k]`` (transposed:
    ``[C_in, C_out/groups, *k]``); bias ``[C_out]`` or None. Returns ``[N, C_out, *out]``.

    >>> x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    >>> w = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    >>> convolution(x, w, stride=2).shape
    torch.Size([1, 3, 2, 2])
    """
    return Convolution.apply(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )


# --------------------------------------------------------------------------------------------
# torch.library custom ops
# --------------------------------------------------------------------------------------------
#
# Custom-op schemas cannot return ``Tensor?``, so convlab::convolution_backward returns an
# empty tensor (shape [0]) for a masked-off gradient; the autograd glue maps it back to None.


@torch.library.custom_op("convlab::convolution", mutates_args=())
def _convolution_op(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> Tensor:
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    # A custom op's output must be a fresh tensor with the strides the fake impl promises.
    return reference.convolution(input, weight, bias, *p.aten_args()).contiguous()


@_convolution_op.register_fake
def _convolution_fake(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> Tensor:
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    return input.new_empty(p.output_shape(tuple(input.shape), tuple(weight.shape)))


@torch.library.custom_op("convlab::convolution_backward", mutates_args=())
def _convolution_backward_op(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_sizes: list[int] | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    _check_backward_args(grad_output, input, weight, bias_sizes, p, output_mask)
    grads = reference.convolution_backward(
        grad_output, input, weight, bias_sizes, *p.aten_args(), output_mask
    )
    empty = input.new_empty(0)
    return tuple(  # type: ignore[return-value]
        g.contiguous() if m else empty.clone()
        for g, m in zip(grads, output_mask, strict=True)
    )


@_convolution_backward_op.register_fake
def _convolution_backward_fake(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_sizes: list[int] | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    _check_backward_args(grad_output, input, weight, bias_sizes, p, output_mask)
    out_channels = p.output_shape(tuple(input.shape), tuple(weight.shape))[1]
    shapes = (tuple(input.shape), tuple(weight.shape), (out_channels,))
    return tuple(  # type: ignore[return-value]
        input.new_empty(s if m else (0,)) for s, m in zip(shapes, output_mask, strict=True)
    )


def _conv_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    input, weight, bias, *hyper = inputs
    ctx.save_for_backward(input, weight)
    ctx.hyper = hyper
    ctx.bias_sizes = None if bias is None else list(bias.shape)


def _conv_backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
    input, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = [bool(needs[0]), bool(needs[1]), ctx.bias_sizes is not None and bool(needs[2])]
    grads = torch.ops.convlab.convolution_backward(
        grad_output, input, weight, ctx.bias_sizes, *ctx.hyper, mask
    )
    return (*_keep(grads, mask), *(None,) * 6)


def _conv_backward_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    grad_output, input, weight, _bias_sizes, *hyper, output_mask = inputs
    ctx.save_for_backward(grad_output, input, weight)
    ctx.hyper = hyper
    ctx.output_mask = output_mask


def _conv_double_backward(
    ctx: Any, ggI: Tensor | None, ggW: Tensor | None, ggb: Tensor | None
) -> tuple[Tensor | None, ...]:
    grad_output, input, weight = ctx.saved_tensors
    # Gradients of masked-off (empty) outputs carry no information.
    ggs = [g if m else None for g, m in zip((ggI, ggW, ggb), ctx.output_mask, strict=True)]
    mask = [bool(m) for m in ctx.needs_input_grad[:3]]
    if all(g is None for g in ggs) or not any(mask):
        return (None,) * 11
    grads = reference.convolution_double_backward(
        *ggs, grad_output, weight, input, *ctx.hyper, mask
    )
    return (*_keep(grads, mask), *(None,) * 8)


_convolution_op.register_autograd(_conv_backward, setup_context=_conv_setup_context)
_convolution_backward_op.register_autograd(
    _conv_double_backward, setup_context=_conv_backward_setup_context
)


def convolution_op(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    transposed: bool = False,
    output_padding: IntOrSeq = 0,
    groups: int = 1,
) -> Tensor:
    """N-d convolution through the custom op ``torch.ops.convlab.convolution``.

    Same arguments, shapes and result as :func:`convolution`; ints are expanded to
    lists here because the op's schema takes ``int[]``. Works under ``torch.compile``.

    >>> x = torch.randn(1, 2, 5, dtype=torch.float64)
    >>> w = torch.randn(3, 2, 3, dtype=torch.float64)
    >>> convolution_op(x, w, padding=1).shape
    torch.Size([1, 3, 5])
    """
    check_tensor(weight, "weight")
    dim = max(weight.dim() - 2, 1)
    return torch.ops.convlab.convolution(
        input,
        weight,
        bias,
        list(normalize(stride, dim, "stride")),
        list(normalize(padding, dim, "padding")),
        list(normalize(dilation, dim, "dilation")),
        transposed,
        list(normalize(output_padding, dim, "output_padding")),
        groups,
    )
