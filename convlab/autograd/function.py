"""The ``torch.autograd.Function`` route: :class:`Convolution` and its backward Function.

:class:`Convolution` (and its functional form :func:`convolution`) runs
``reference.convolution``; its backward is a second Function, :class:`ConvolutionBackward`,
whose forward is ``reference.convolution_backward`` and whose backward is
``double_backward.convolution_double_backward`` (both in :mod:`convlab.scratch`). So
``gradgradcheck`` exercises convlab's double-backward formulas, not autograd recorded
through the ops of the first backward.
Both use the "new-style" form (``forward`` without ``ctx`` plus ``setup_context``), which
``torch.func`` requires, and have ``jvp`` and ``vmap`` rules.

``torch.compile(fullgraph=True)`` cannot trace ``Convolution.apply``: dynamo refuses a
``torch.autograd.Function`` with a custom ``jvp`` when an input requires grad ("Unsupported
custom jvp"; pinned by ``tests/test_meta_opcheck.py``), and the ``jvp`` is what makes
forward mode and ``torch.func.jvp`` work. So :func:`convolution`, when compiled, calls the
operator route (:func:`convlab.autograd.library_op.convolution_op`, the same kernels and
formulas), which dynamo traces as one node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from convlab.autograd.common import (
    Grads,
    _backward_node_jvp,
    _conv_backward,
    _conv_node_jvp,
    _double_backward,
    _keep,
    _save_backward_inputs,
    _save_conv_inputs,
    _vmap_conv,
    _vmap_conv_backward,
)
from convlab.autograd.library_op import convolution_op
from convlab.scratch import reference
from convlab.scratch.params import ConvParams, IntOrSeq

__all__ = ["Convolution", "ConvolutionBackward", "convolution"]


class ConvolutionBackward(torch.autograd.Function):
    """First-order conv backward as a differentiable Function.

    ``apply(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask)`` returns ``(grad_input, grad_weight, grad_bias)``
    (``None`` where masked) from ``reference.convolution_backward``. ``backward`` takes the
    gradients of those three (``ggI, ggW, ggb``) and returns ``(ggO, gI, gW)`` from
    ``double_backward.convolution_double_backward``; ``jvp`` is ``_backward_jvp``; ``vmap`` is
    one call per batch element (``generate_vmap_rule`` cannot be used: with list arguments
    its forward-mode path fails inside torch).
    """

    @staticmethod
    def forward(  # type: ignore[override]
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
        """``reference.convolution_backward``, ``None`` where ``output_mask`` is False."""
        grads = reference.convolution_backward(
            grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
            output_padding, groups, output_mask,
        )
        return _keep(grads, output_mask)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        """Save grad_output, input and weight for ``backward`` and ``jvp``."""
        _save_backward_inputs(ctx, inputs)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, ggI: Tensor | None, ggW: Tensor | None, ggb: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """``(ggO, gI, gW)`` from ``double_backward.convolution_double_backward``."""
        return _double_backward(ctx, ggI, ggW, ggb)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, go_t: Tensor | None, in_t: Tensor | None, w_t: Tensor | None, *_: Any
    ) -> tuple[Tensor | None, ...]:
        """Tangents of the three gradients (``None`` where masked or zero)."""
        return tuple(_backward_node_jvp(ConvolutionBackward.apply, ctx, (go_t, in_t, w_t)))

    @staticmethod
    def vmap(info: Any, in_dims: Sequence[Any], *args: Any) -> Any:  # type: ignore[override]
        """Batching rule: one call per batch element, results stacked along dim 0."""
        return _vmap_conv_backward(ConvolutionBackward.apply, info, in_dims, *args)


class Convolution(torch.autograd.Function):
    """``reference.convolution`` with convlab's backward, differentiable twice.

    ``apply`` takes ``aten::convolution``'s arguments (see :func:`convolution`). The backward
    asks only for the gradients autograd needs (``ctx.needs_input_grad`` becomes
    ``output_mask``) and runs through :class:`ConvolutionBackward`; ``jvp`` is
    ``_conv_jvp`` evaluated with this Function; ``vmap`` is ``_vmap_conv``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
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
        """``reference.convolution`` after validating every argument."""
        p = ConvParams.for_tensors(
            input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        )
        # Contiguous like ATen's result for contiguous inputs (the reference may return a
        # permuted layout), so that e.g. ``randn_like(y)`` draws the same values for both.
        return reference.convolution(input, weight, bias, *p.aten_args()).contiguous()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        """Save input and weight for ``backward``, and the bias too for ``jvp``."""
        _save_conv_inputs(ctx, inputs)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        """Gradients of input, weight and bias through :class:`ConvolutionBackward`."""
        return _conv_backward(ConvolutionBackward.apply, ctx, grad_output)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, in_t: Tensor | None, w_t: Tensor | None, b_t: Tensor | None, *_: Any
    ) -> Tensor:
        """Output tangent ``conv(x_t, w) + conv(x, w_t) + b_t``, computed with this Function."""
        return _conv_node_jvp(Convolution.apply, ctx, (in_t, w_t, b_t))

    @staticmethod
    def vmap(info: Any, in_dims: Sequence[Any], *args: Any) -> Any:  # type: ignore[override]
        """Batching rule: one convolution over ``B * N`` samples, or one call per element."""
        return _vmap_conv(Convolution.apply, info, in_dims, *args)


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

    Under ``torch.compile`` this calls :func:`convlab.autograd.library_op.convolution_op`
    instead: the same reference kernels and derivative formulas, through the route dynamo
    can trace, so ``torch.compile(fullgraph=True)`` works on this function (not on
    ``Convolution.apply`` itself: "Unsupported custom jvp").
    """
    if torch.compiler.is_compiling():
        return convolution_op(
            input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
        )
    return Convolution.apply(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
