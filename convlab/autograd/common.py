"""What both autograd routes share: what a node saves, its backward, double backward and
forward-mode formulas, masks and batching rules.

Used by :mod:`convlab.autograd.function` (the ``torch.autograd.Function`` route) and
:mod:`convlab.autograd.library_op` (the ``torch.library`` operator route); each passes its
own differentiable convolution (or backward) in, so the formulas here run through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from convlab.scratch import double_backward
from convlab.scratch.params import ConvParams

Grads = tuple[Tensor | None, Tensor | None, Tensor | None]
BackwardFn = Callable[..., Sequence[Tensor | None]]


def _keep(grads: Sequence[Tensor | None], mask: Sequence[bool]) -> Grads:
    """``grads`` with ``None`` wherever ``mask`` is False.

    ``_convolution_double_backward`` (ATen's and convlab's) computes every term its inputs
    allow, whatever the mask, so the mask is applied here.
    """
    return tuple(g if m else None for g, m in zip(grads, mask, strict=True))  # type: ignore[return-value]


def _needs(ctx: Any, bias_sizes: Sequence[int] | None) -> list[bool]:
    """``output_mask`` for the first backward: what autograd asks for, bias only if there is one."""
    needs = ctx.needs_input_grad
    return [bool(needs[0]), bool(needs[1]), bias_sizes is not None and bool(needs[2])]


def _select(args: Sequence[Any], in_dims: Sequence[Any], i: int) -> list[Any]:
    """Element ``i`` of a vmapped batch: batched tensors indexed, everything else as is."""
    return [a.select(d, i) if isinstance(d, int) else a for a, d in zip(args, in_dims, strict=True)]


def _vmap_conv(
    apply: Callable[..., Tensor], info: Any, in_dims: Sequence[Any], *args: Any
) -> tuple[Tensor, int]:
    """Batching rule of a convolution ``apply(input, weight, bias, *hyper)``.

    A batch of inputs with a shared weight and bias is one convolution over ``B * N``
    samples (the common case, e.g. per-sample gradients); anything else is one call per
    batch element, so each call still goes through convlab's own derivative formulas.
    """
    input, weight, bias, *hyper = args
    x_dim = in_dims[0]
    if isinstance(x_dim, int) and in_dims[1] is None and in_dims[2] is None:
        x = input.movedim(x_dim, 0)
        return apply(x.flatten(0, 1), weight, bias, *hyper).unflatten(0, x.shape[:2]), 0
    return torch.stack([apply(*_select(args, in_dims, i)) for i in range(info.batch_size)]), 0


def _vmap_conv_backward(
    apply: Callable[..., Sequence[Tensor | None]], info: Any, in_dims: Sequence[Any], *args: Any
) -> tuple[tuple[Tensor | None, ...], tuple[int | None, ...]]:
    """Batching rule of a convolution backward: one call per batch element, then stacked."""
    outs = [apply(*_select(args, in_dims, i)) for i in range(info.batch_size)]
    stacked = tuple(
        None if parts[0] is None else torch.stack(parts) for parts in zip(*outs, strict=True)
    )
    return stacked, tuple(None if t is None else 0 for t in stacked)


def _backward_jvp(
    backward: BackwardFn,
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    tangents: tuple[Tensor | None, Tensor | None, Tensor | None],
    bias_sizes: Sequence[int] | None,
    hyper: Sequence[Any],
    mask: Sequence[bool],
) -> list[Tensor | None]:
    """Tangents of ``(grad_input, grad_weight, grad_bias)`` of a convolution backward.

    The backward is bilinear: grad_input is linear in (grad_output, weight), grad_weight in
    (grad_output, input) and grad_bias in grad_output alone. So the tangent is one backward
    with the grad_output tangent plus one with the input and weight tangents, as in the
    ``result0..2`` formulas of ``convolution_backward`` in ``derivatives.yaml``. ``backward``
    is :class:`ConvolutionBackward`'s ``apply`` or the operator, so the tangent is itself
    differentiable and vmappable. A ``None`` tangent counts as zero; an output whose tangent
    is zero gets ``None``.
    """
    go_t, in_t, w_t = tangents
    terms: list[Sequence[Tensor | None]] = []
    if go_t is not None:
        terms.append(_keep(backward(go_t, input, weight, bias_sizes, *hyper, list(mask)), mask))
    # grad_input(gO, weight_t) and grad_weight(gO, input_t); the primal stands in for a missing
    # tangent (only its shape is read) and the mask drops the term it would produce.
    cross = [mask[0] and w_t is not None, mask[1] and in_t is not None, False]
    if any(cross):
        inp = input if in_t is None else in_t
        wgt = weight if w_t is None else w_t
        terms.append(_keep(backward(grad_output, inp, wgt, bias_sizes, *hyper, cross), cross))
    out: list[Tensor | None] = []
    for i in range(3):
        parts = [t[i] for t in terms if t[i] is not None]
        out.append(None if not parts else parts[0] if len(parts) == 1 else parts[0] + parts[1])
    return out


def _conv_jvp(
    conv: Callable[..., Tensor],
    primals: tuple[Tensor, Tensor, Tensor | None],
    tangents: tuple[Tensor | None, Tensor | None, Tensor | None],
    hyper: Sequence[Any],
) -> Tensor:
    """Tangent of a convolution's output: ``conv(x_t, w) + conv(x, w_t) + b_t``.

    The formula of ``double_backward.convolution_jvp`` (convolution is bilinear in input and
    weight), evaluated with ``conv``, the wrapper's own differentiable, vmappable
    convolution: under ``jacfwd``/``hessian`` the tangents are batched, and the wrapper's
    batching rule handles that where the plain reference kernels would not. A ``None``
    tangent counts as zero.
    """
    (input, weight, _), (in_t, w_t, b_t) = primals, tangents
    p = ConvParams.create(weight.dim() - 2, *hyper)
    tangent = input.new_zeros(p.output_shape(tuple(input.shape), tuple(weight.shape)))
    if in_t is not None:
        tangent = tangent + conv(in_t, weight, None, *hyper)
    if w_t is not None:
        tangent = tangent + conv(input, w_t, None, *hyper)
    if b_t is not None:
        tangent = tangent + b_t.reshape(-1, *(1,) * p.dim)
    return tangent


def _save_conv_inputs(ctx: Any, inputs: tuple[Any, ...]) -> None:
    """Save what a convolution's backward and jvp need (both routes): input and weight,
    the bias too for the jvp, the normalised hyper-parameters and the bias size."""
    input, weight, bias, *hyper = inputs
    ctx.save_for_backward(input, weight)
    ctx.save_for_forward(input, weight, bias)
    ctx.hyper = tuple(ConvParams.create(weight.dim() - 2, *hyper).aten_args())
    ctx.bias_sizes = None if bias is None else list(bias.shape)


def _conv_backward(backward: BackwardFn, ctx: Any, grad_output: Tensor) -> tuple[Any, ...]:
    """A convolution node's backward: ``backward`` (the route's differentiable convolution
    backward) asked only for what autograd needs, then ``None`` for the six hyper-parameters."""
    input, weight = ctx.saved_tensors
    mask = _needs(ctx, ctx.bias_sizes)
    grads = backward(grad_output, input, weight, ctx.bias_sizes, *ctx.hyper, mask)
    return (*_keep(grads, mask), *(None,) * 6)


def _conv_node_jvp(conv: Callable[..., Tensor], ctx: Any,
                   tangents: tuple[Tensor | None, Tensor | None, Tensor | None]) -> Tensor:
    """A convolution node's jvp: :func:`_conv_jvp` on the saved primals."""
    input, weight, bias = ctx.saved_tensors
    return _conv_jvp(conv, (input, weight, bias), tangents, ctx.hyper)


def _save_backward_inputs(ctx: Any, inputs: tuple[Any, ...]) -> None:
    """Save what a convolution backward's own backward and jvp need (both routes)."""
    grad_output, input, weight, bias_sizes, *hyper, output_mask = inputs
    ctx.save_for_backward(grad_output, input, weight)
    ctx.save_for_forward(grad_output, input, weight)
    ctx.hyper = tuple(hyper)
    ctx.bias_sizes = bias_sizes
    ctx.output_mask = list(output_mask)
    ctx.set_materialize_grads(False)


def _double_backward(ctx: Any, ggI: Tensor | None, ggW: Tensor | None,
                     ggb: Tensor | None) -> tuple[Tensor | None, ...]:
    """A convolution-backward node's backward: ``(ggO, gI, gW)`` from
    :func:`convlab.scratch.double_backward.convolution_double_backward`, then ``None`` for
    the eight other arguments. Gradients of masked-off outputs (``None`` or empty) carry
    no information and are dropped first."""
    grad_output, input, weight = ctx.saved_tensors
    ggs = [g if m else None for g, m in zip((ggI, ggW, ggb), ctx.output_mask, strict=True)]
    mask = [bool(m) for m in ctx.needs_input_grad[:3]]
    if all(g is None for g in ggs) or not any(mask):
        return (None,) * 11
    grads = double_backward.convolution_double_backward(
        *ggs, grad_output, weight, input, *ctx.hyper, mask
    )
    return (*_keep(grads, mask), *(None,) * 8)


def _backward_node_jvp(backward: BackwardFn, ctx: Any,
                       tangents: tuple[Tensor | None, Tensor | None, Tensor | None]
                       ) -> list[Tensor | None]:
    """A convolution-backward node's jvp: :func:`_backward_jvp` on the saved primals."""
    grad_output, input, weight = ctx.saved_tensors
    return _backward_jvp(backward, grad_output, input, weight, tangents, ctx.bias_sizes,
                         ctx.hyper, ctx.output_mask)
