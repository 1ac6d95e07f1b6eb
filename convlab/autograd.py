"""Convolution as a twice-differentiable autograd op whose derivatives are convlab's own.

Two ways to plug :mod:`convlab.scratch.reference` into autograd:

* :class:`Convolution` (a :class:`torch.autograd.Function`) and its functional form
  :func:`convolution`. Its backward is a second Function, :class:`ConvolutionBackward`, whose
  forward is ``reference.convolution_backward`` and whose backward is
  ``reference.convolution_double_backward``. So ``gradgradcheck`` exercises convlab's
  double-backward formulas, not autograd recorded through the ops of the first backward.
* The operators ``torch.ops.convlab.convolution`` and ``torch.ops.convlab.convolution_backward``
  (:mod:`torch.library`), with fake (meta) kernels for ``torch.compile`` and autograd kernels
  wired the same way; :func:`convolution_op` is the functional form. They pass
  ``torch.library.opcheck`` and appear as single nodes in AOTAutograd graphs.

Both mirror ATen: ``convolution`` has ``aten::convolution``'s arguments, the backward has
``aten::convolution_backward``'s and the double backward follows
``aten::_convolution_double_backward``. Both support forward mode (``jvp``, from the
``result:`` formulas of ``derivatives.yaml``) and the ``torch.func`` transforms (``grad``,
``vmap``, ``jvp``, ``hessian``): the Functions use the "new-style" form (``forward`` without
``ctx`` plus ``setup_context``), which is what ``torch.func`` requires.

Why the operators are defined with ``torch.library.Library`` and not
``torch.library.custom_op``: ``custom_op.register_autograd`` wraps the formula in an
old-style Function that ``torch.func`` refuses and that has no forward-mode formula, so
``torch.func.grad`` crashed and ``torch.func.jvp`` returned zero tangents. Registering our own
new-style Function as the ``Autograd`` kernel fixes both and works on every torch >= 2.4.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.forward_ad import _set_fwd_grad_enabled
from torch.autograd.function import _SingleLevelFunction

from convlab.scratch import reference
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_bias_sizes,
    check_output_mask,
    check_tensor,
    normalize,
)

__all__ = [
    "Convolution",
    "ConvolutionBackward",
    "convolution",
    "convolution_op",
]

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

    The formula of ``reference.convolution_jvp`` (convolution is bilinear in input and
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


# --------------------------------------------------------------------------------------------
# torch.autograd.Function
# --------------------------------------------------------------------------------------------


def _save_backward_inputs(ctx: Any, inputs: tuple[Any, ...]) -> None:
    """Save what a convolution backward's own backward and jvp need (both wrappers)."""
    grad_output, input, weight, bias_sizes, *hyper, output_mask = inputs
    ctx.save_for_backward(grad_output, input, weight)
    ctx.save_for_forward(grad_output, input, weight)
    ctx.hyper = tuple(hyper)
    ctx.bias_sizes = bias_sizes
    ctx.output_mask = list(output_mask)
    ctx.set_materialize_grads(False)


class ConvolutionBackward(torch.autograd.Function):
    """First-order conv backward as a differentiable Function.

    ``apply(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask)`` returns ``(grad_input, grad_weight, grad_bias)``
    (``None`` where masked) from ``reference.convolution_backward``. ``backward`` takes the
    gradients of those three (``ggI, ggW, ggb``) and returns ``(ggO, gI, gW)`` from
    ``reference.convolution_double_backward``; ``jvp`` is ``_backward_jvp``; ``vmap`` is
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
        """``(ggO, gI, gW)`` from ``reference.convolution_double_backward``."""
        grad_output, input, weight = ctx.saved_tensors
        mask = [bool(m) for m in ctx.needs_input_grad[:3]]
        if all(g is None for g in (ggI, ggW, ggb)) or not any(mask):
            return (None,) * 11
        grads = reference.convolution_double_backward(
            ggI, ggW, ggb, grad_output, weight, input, *ctx.hyper, mask
        )
        return (*_keep(grads, mask), *(None,) * 8)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, go_t: Tensor | None, in_t: Tensor | None, w_t: Tensor | None, *_: Any
    ) -> tuple[Tensor | None, ...]:
        """Tangents of the three gradients (``None`` where masked or zero)."""
        grad_output, input, weight = ctx.saved_tensors
        return tuple(_backward_jvp(
            ConvolutionBackward.apply, grad_output, input, weight, (go_t, in_t, w_t),
            ctx.bias_sizes, ctx.hyper, ctx.output_mask,
        ))

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
        input, weight, bias, *hyper = inputs
        ctx.save_for_backward(input, weight)
        ctx.save_for_forward(input, weight, bias)
        ctx.aten_args = ConvParams.create(weight.dim() - 2, *hyper).aten_args()
        ctx.bias_sizes = None if bias is None else list(bias.shape)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        """Gradients of input, weight and bias through :class:`ConvolutionBackward`."""
        input, weight = ctx.saved_tensors
        grads = ConvolutionBackward.apply(
            grad_output, input, weight, ctx.bias_sizes, *ctx.aten_args,
            _needs(ctx, ctx.bias_sizes),
        )
        return (*grads, None, None, None, None, None, None)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, in_t: Tensor | None, w_t: Tensor | None, b_t: Tensor | None, *_: Any
    ) -> Tensor:
        """Output tangent ``conv(x_t, w) + conv(x, w_t) + b_t``, computed with this Function."""
        input, weight, bias = ctx.saved_tensors
        return _conv_jvp(Convolution.apply, (input, weight, bias), (in_t, w_t, b_t),
                         ctx.aten_args)

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
    """
    return Convolution.apply(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )


# --------------------------------------------------------------------------------------------
# torch.library operators
# --------------------------------------------------------------------------------------------
#
# An operator schema cannot return ``Tensor?``, so convlab::convolution_backward returns an
# empty tensor (shape [0]) for a masked-off gradient; the autograd kernels map it to None.
# The schemas are written out (not inferred from type hints) so that they parse on every
# torch >= 2.4; they are those of aten::convolution and aten::convolution_backward.

_LIB = torch.library.Library("convlab", "FRAGMENT")  # noqa: TOR901 - lives as long as the module
_HYPER = (
    "SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, "
    "SymInt[] output_padding, SymInt groups"
)
_LIB.define(
    f"convolution(Tensor input, Tensor weight, Tensor? bias, {_HYPER}) -> Tensor",
    tags=(torch.Tag.pt2_compliant_tag,),
)
_LIB.define(
    "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, "
    f"SymInt[]? bias_sizes, {_HYPER}, bool[] output_mask) -> (Tensor, Tensor, Tensor)",
    tags=(torch.Tag.pt2_compliant_tag,),
)


def _fresh(t: Tensor) -> Tensor:
    """``t`` as an ordinary tensor: contiguous strides, offset 0, a storage of its own size.

    An operator's output must match what its fake kernel promises (``new_empty``), and
    ``.contiguous()`` alone keeps a narrowed view (offset 1, strides (10, 10, 1) for shape
    [1, 1, 8]) because size-1 dimensions do not count for contiguity.
    """
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    ordinary = (
        t.storage_offset() == 0
        and tuple(reversed(strides)) == t.stride()
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )
    return t if ordinary else t.clone(memory_format=torch.contiguous_format)


def _check_backward_args(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_sizes: Sequence[int] | None,
    p: ConvParams,
    output_mask: Sequence[bool],
) -> None:
    p.check_shapes(tuple(input.shape), tuple(weight.shape))
    check_bias_sizes(bias_sizes, p.output_shape(tuple(input.shape), tuple(weight.shape))[1])
    p.check_grad_output(grad_output, input, weight)
    check_output_mask(output_mask)


def _convolution_kernel(
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
    """Real kernel of ``convlab::convolution``: ``reference.convolution``, ordinary output."""
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    return _fresh(reference.convolution(input, weight, bias, *p.aten_args()))


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
    """Fake kernel: validates like the real one and returns an empty tensor of the output shape."""
    p = ConvParams.for_tensors(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    return input.new_empty(p.output_shape(tuple(input.shape), tuple(weight.shape)))


def _convolution_backward_kernel(
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
    """Real kernel of ``convlab::convolution_backward``; shape [0] where the mask is False."""
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    _check_backward_args(grad_output, input, weight, bias_sizes, p, output_mask)
    grads = reference.convolution_backward(
        grad_output, input, weight, bias_sizes, *p.aten_args(), output_mask
    )
    return tuple(  # type: ignore[return-value]
        _fresh(g) if m else input.new_empty(0) for g, m in zip(grads, output_mask, strict=True)
    )


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
    """Fake kernel: validates like the real one; empty tensors of the gradients' shapes."""
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    _check_backward_args(grad_output, input, weight, bias_sizes, p, output_mask)
    out_channels = p.output_shape(tuple(input.shape), tuple(weight.shape))[1]
    shapes = (tuple(input.shape), tuple(weight.shape), (out_channels,))
    return tuple(  # type: ignore[return-value]
        input.new_empty(s if m else (0,)) for s, m in zip(shapes, output_mask, strict=True)
    )


@contextlib.contextmanager
def _below_autograd() -> Iterator[None]:
    """Run an operator's real kernel from its autograd kernel's ``forward``.

    Skips the ``Autograd`` key (the node is being recorded by the caller) and turns grad
    and forward grad back on, which ``Function.apply`` turns off: under nested
    ``torch.func`` transforms the outer levels must still see the operator.
    """
    with torch.enable_grad(), _set_fwd_grad_enabled(True), torch._C._AutoDispatchBelowAutograd():
        yield


class ConvolutionOpFunction(_SingleLevelFunction):
    """Autograd kernel of ``convlab::convolution`` (graph node ``ConvolutionOpFunctionBackward``).

    ``forward`` runs the operator below the autograd key, so AOTAutograd records the op
    itself; ``backward`` calls ``convlab::convolution_backward``; ``jvp`` is ``_conv_jvp``
    evaluated with the operator. ``torch.vmap`` reaches the operators' batching rules
    before this kernel, so the Function needs no vmap rule of its own.
    """

    @staticmethod
    def forward(*args: Any) -> Tensor:  # type: ignore[override]
        with _below_autograd():
            return torch.ops.convlab.convolution.default(*args)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        input, weight, bias, *hyper = inputs
        ctx.save_for_backward(input, weight)
        ctx.save_for_forward(input, weight, bias)
        ctx.hyper = tuple(hyper)
        ctx.bias_sizes = None if bias is None else list(bias.shape)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        input, weight = ctx.saved_tensors
        mask = _needs(ctx, ctx.bias_sizes)
        grads = torch.ops.convlab.convolution_backward(
            grad_output, input, weight, ctx.bias_sizes, *ctx.hyper, mask
        )
        return (*_keep(grads, mask), *(None,) * 6)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, in_t: Tensor | None, w_t: Tensor | None, b_t: Tensor | None, *_: Any
    ) -> Tensor:
        input, weight, bias = ctx.saved_tensors
        return _conv_jvp(torch.ops.convlab.convolution, (input, weight, bias), (in_t, w_t, b_t),
                         ctx.hyper)


class ConvolutionBackwardOpFunction(_SingleLevelFunction):
    """Autograd kernel of ``convlab::convolution_backward``.

    ``backward`` is ``reference.convolution_double_backward`` (gradients of the empty,
    masked-off outputs are dropped); ``jvp`` is ``_backward_jvp`` through the operator.
    """

    @staticmethod
    def forward(*args: Any) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        with _below_autograd():
            return torch.ops.convlab.convolution_backward.default(*args)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _save_backward_inputs(ctx, inputs)

    @staticmethod
    def backward(  # type: ignore[override]
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

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, go_t: Tensor | None, in_t: Tensor | None, w_t: Tensor | None, *_: Any
    ) -> tuple[Tensor, ...]:
        grad_output, input, weight = ctx.saved_tensors
        mask = ctx.output_mask
        tangents = _backward_jvp(
            torch.ops.convlab.convolution_backward, grad_output, input, weight,
            (go_t, in_t, w_t), ctx.bias_sizes, ctx.hyper, mask,
        )
        # Every output has a tangent: zeros where no input tangent reaches it, and an empty
        # tangent for an empty (masked-off) output.
        shapes = (input.shape, weight.shape, (grad_output.shape[1],))
        return tuple(
            t if t is not None else grad_output.new_zeros(s if m else (0,))
            for t, s, m in zip(tangents, shapes, mask, strict=True)
        )


def _autograd_kernel(fn: type[torch.autograd.Function]) -> Callable[..., Any]:
    """The ``Autograd``-key kernel that records ``fn``'s node on the operator's inputs.

    ``fn`` is a single-level Function, recorded the way ATen's generated autograd kernels
    record their nodes: when ``torch.func`` reaches this key it has already wrapped the
    inputs for its current level, and a full ``torch.autograd.Function`` would hand the call
    back to ``torch.func`` (from Python before torch 2.15, from C++ since), which has no
    kernel at this key. ``torch.func`` refuses single-level Functions unless told they are
    allowed, which is true here for the kernel's duration.
    """
    single_level_apply = fn.apply
    functorch = torch._C._functorch

    def kernel(*args: Any) -> Any:
        previous = functorch.get_single_level_autograd_function_allowed()
        functorch.set_single_level_autograd_function_allowed(True)
        try:
            return single_level_apply(*args)
        finally:
            functorch.set_single_level_autograd_function_allowed(previous)

    return kernel


_LIB.impl("convolution", _convolution_kernel, "CompositeExplicitAutograd")
_LIB.impl("convolution_backward", _convolution_backward_kernel, "CompositeExplicitAutograd")
torch.library.register_fake("convlab::convolution", _convolution_fake, lib=_LIB)
torch.library.register_fake("convlab::convolution_backward", _convolution_backward_fake, lib=_LIB)
_LIB.impl("convolution", _autograd_kernel(ConvolutionOpFunction), "Autograd")
_LIB.impl("convolution_backward", _autograd_kernel(ConvolutionBackwardOpFunction), "Autograd")
if hasattr(torch.library, "register_vmap"):  # torch >= 2.5; older: torch's per-sample loop
    torch.library.register_vmap(
        "convlab::convolution", functools.partial(_vmap_conv, torch.ops.convlab.convolution),
        lib=_LIB,
    )
    torch.library.register_vmap(
        "convlab::convolution_backward",
        functools.partial(_vmap_conv_backward, torch.ops.convlab.convolution_backward),
        lib=_LIB,
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
    """N-d convolution through the operator ``torch.ops.convlab.convolution``.

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
