"""The ``torch.library`` route: the operators ``convlab::convolution`` and
``convlab::convolution_backward``.

Both have fake (meta) kernels for ``torch.compile`` and autograd kernels whose derivatives
are convlab's own (:class:`ConvolutionOpFunction`, :class:`ConvolutionBackwardOpFunction`);
:func:`convolution_op` is the functional form. They pass ``torch.library.opcheck`` and
appear as single nodes in AOTAutograd graphs.

Why ``torch.library.Library`` and not ``torch.library.custom_op``:
``custom_op.register_autograd`` wraps the formula in an old-style Function that
``torch.func`` refuses and that has no forward-mode formula, so ``torch.func.grad`` crashed
and ``torch.func.jvp`` returned zero tangents. Registering our own new-style Function as
the ``Autograd`` kernel fixes both and works on every torch >= 2.4.
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

from convlab.autograd.common import (
    _backward_node_jvp,
    _conv_backward,
    _conv_node_jvp,
    _double_backward,
    _save_backward_inputs,
    _save_conv_inputs,
    _vmap_conv,
    _vmap_conv_backward,
)
from convlab.scratch import reference
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_bias_sizes,
    check_output_mask,
)

__all__ = ["ConvolutionBackwardOpFunction", "ConvolutionOpFunction", "convolution_op"]

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


def _backward_params(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_sizes: Sequence[int] | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: Sequence[bool],
) -> ConvParams:
    """The backward's hyper-parameters, every argument validated (real and fake kernels)."""
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    p.check_shapes(tuple(input.shape), tuple(weight.shape))
    check_bias_sizes(bias_sizes, p.output_shape(tuple(input.shape), tuple(weight.shape))[1])
    p.check_grad_output(grad_output, input, weight)
    check_output_mask(output_mask)
    return p


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
    p = _backward_params(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask)
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
    p = _backward_params(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask)
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
        _save_conv_inputs(ctx, inputs)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        return _conv_backward(torch.ops.convlab.convolution_backward, ctx, grad_output)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, in_t: Tensor | None, w_t: Tensor | None, b_t: Tensor | None, *_: Any
    ) -> Tensor:
        return _conv_node_jvp(torch.ops.convlab.convolution, ctx, (in_t, w_t, b_t))


class ConvolutionBackwardOpFunction(_SingleLevelFunction):
    """Autograd kernel of ``convlab::convolution_backward``.

    ``backward`` is ``double_backward.convolution_double_backward`` (gradients of the
    empty, masked-off outputs are dropped); ``jvp`` is ``_backward_jvp`` through the operator.
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
        return _double_backward(ctx, ggI, ggW, ggb)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, go_t: Tensor | None, in_t: Tensor | None, w_t: Tensor | None, *_: Any
    ) -> tuple[Tensor, ...]:
        grad_output, input, weight = ctx.saved_tensors
        mask = ctx.output_mask
        tangents = _backward_node_jvp(torch.ops.convlab.convolution_backward, ctx,
                                      (go_t, in_t, w_t))
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

    Same arguments, shapes and result as :func:`convlab.autograd.function.convolution`;
    validated by :class:`~convlab.scratch.params.ConvParams` first (so a bad argument is a
    ValueError naming it, not a schema error), ints expanded to the lists the op's schema
    takes. Works under ``torch.compile``, also with ``fullgraph=True``.

    >>> x = torch.randn(1, 2, 5, dtype=torch.float64)
    >>> w = torch.randn(3, 2, 3, dtype=torch.float64)
    >>> convolution_op(x, w, padding=1).shape
    torch.Size([1, 3, 5])
    """
    p = ConvParams.for_tensors(  # the one validation, before the op (and its schema) sees it
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    return torch.ops.convlab.convolution(input, weight, bias, *p.aten_args())
