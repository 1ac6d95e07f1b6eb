"""PyTorch's own convolution backward, called from Python.

* :func:`convolution_backward`: ``aten::convolution_backward``, optionally under a forced
  backend (:func:`convlab.aten.backends.use_backend`);
* :func:`conv_input`, :func:`conv_weight`: the ``torch.nn.grad.conv{1,2,3}d_{input,weight}``
  functions with the dimension taken from the tensors (``conv2d_input``/``conv2d_weight``
  are kept as names for the 2-d case).

Backend selection and forcing live in :mod:`convlab.aten.backends` (import
``select_backend``, ``use_backend`` and so on from there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from convlab.aten.backends import (
    SLOW_BACKENDS,
    backend_memory_format,
    backend_name,
    use_backend,
)
from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_bias_sizes,
    check_output_mask,
    check_tensor,
)

__all__ = [
    "aten_bias_sizes",
    "backward_params",
    "call_convolution_backward",
    "canonical_strides",
    "conv2d_input",
    "conv2d_weight",
    "conv_input",
    "conv_weight",
    "convolution_backward",
]

Grads = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def aten_bias_sizes(
    bias_sizes: object, out_channels: int, output_mask: Sequence[bool]
) -> list[int] | None:
    """Validate ``bias_sizes`` (:func:`convlab.scratch.params.check_bias_sizes`) and return what to
    pass to ATen.

    When the bias gradient is wanted this is ``[out_channels]``: ATen's empty-batch branch
    returns ``zeros(bias_sizes)`` (so ``[0]`` would give a 0-element gradient there, ``[C_out]``
    everywhere else) and aborts the process on ``None``.
    """
    sizes = check_bias_sizes(bias_sizes, out_channels)
    return [out_channels] if output_mask[2] else sizes


def backward_params(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    transposed: bool,
    output_padding: IntOrSeq,
    groups: int,
) -> ConvParams:
    """Validate the tensors and hyper-parameters of a ``convolution_backward`` call.

    Checks what :meth:`convlab.scratch.params.ConvParams.for_tensors` checks, ``grad_output``
    against the forward output's shape, dtype and device, and that ``output_padding`` is
    zero unless ``transposed`` (ATen rejects it there too, with a RuntimeError).
    """
    p = ConvParams.for_tensors(
        input, weight, None, stride, padding, dilation, transposed, output_padding, groups
    )
    p.check_grad_output(grad_output, input, weight)
    if not p.transposed and any(p.output_padding):
        raise ValueError(
            f"output_padding={list(p.output_padding)} is only supported for transposed "
            "convolutions"
        )
    return p


def _needs_contiguous(backend: str, *tensors: torch.Tensor) -> bool:
    """Whether to hand ATen's slow kernels dense NCHW tensors instead of these.

    ATen's ``_slow_conv2d_backward`` returns a wrong ``grad_weight`` when it gets an input
    that counts as NCHW with a channels-last weight; grouped convolutions reach that state
    from a channels-last input whose size-1 dimensions carry unusual strides (e.g. input
    strides ``(16, 1, 1, 4)`` for shape ``[1, 4, 1, 4]``). Dense NCHW operands avoid it.
    """
    return backend in SLOW_BACKENDS and not all(t.is_contiguous() for t in tensors)


def canonical_strides(t: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """``t``, or a copy with ``fmt``'s own strides when ``t`` is dense in ``fmt`` without them.

    A dense tensor may carry any stride on a size-1 dimension (``as_strided``, some
    ``permute`` + ``view`` chains): ``is_contiguous`` ignores those strides, so ATen's
    ``t.contiguous(fmt)`` hands ``t`` on unchanged, but kernels that read a layout from the
    raw strides do not ignore them. With a channels-last input, a grouped convolution whose
    weight is channels-last dense with an odd stride on a size-1 kernel dimension gets a
    wrong ``grad_input`` from the oneDNN (Mkldnn) backend (plain ``F.conv2d`` autograd too),
    and in float64 the slow kernel refuses the same weight ("grad_weight must be
    contiguous"). ``fmt`` is the format ATen runs the convolution in
    (:func:`convlab.aten.backends.backend_memory_format`, decided from the tensors as given),
    so the copy changes no decision ATen makes, only the strides the kernel reads.
    """
    if t.numel() == 0 or not t.is_contiguous(memory_format=fmt):
        return t  # empty, or ATen makes it dense in fmt itself (with fmt's own strides)
    canonical = torch.empty(t.shape, device="meta", memory_format=fmt).stride()
    return t if t.stride() == canonical else t.clone(memory_format=fmt)


def call_convolution_backward(
    op: Callable[..., Grads],
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: list[int] | None,
    p: ConvParams,
    mask: tuple[bool, bool, bool],
) -> Grads:
    """Call ``op`` (``aten::convolution_backward`` or the C++ extension's twin) with guarded
    operands, under the current flags.

    The guards, one place for every backend and route convlab calls: every operand gets
    canonical strides (:func:`canonical_strides`), and the slow kernels get dense NCHW
    operands (``_needs_contiguous``), their results put back in the layout ATen gives.
    """
    args = (bias_sizes, *p.aten_args(), list(mask))
    backend = backend_name(torch._C._select_conv_backend(input, weight, None, *p.aten_args()))
    fmt = backend_memory_format(input, weight, backend) if input.dim() > 3 else None
    layout = torch.contiguous_format if fmt is None else fmt
    grad_output, input, weight = (canonical_strides(t, layout)
                                  for t in (grad_output, input, weight))
    if not _needs_contiguous(backend, grad_output, input, weight):
        return op(grad_output, input, weight, *args)
    grads = op(grad_output.contiguous(), input.contiguous(), weight.contiguous(), *args)
    if fmt is None or fmt == torch.contiguous_format:
        return grads
    # Same layout as ATen's own result: it runs these kernels in `fmt`.
    gi, gw, gb = grads
    return (
        None if gi is None else gi.contiguous(memory_format=fmt),
        None if gw is None else gw.contiguous(memory_format=fmt),
        gb,
    )


def _call_aten(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: list[int] | None,
    p: ConvParams,
    mask: tuple[bool, bool, bool],
) -> Grads:
    return call_convolution_backward(torch.ops.aten.convolution_backward.default, grad_output,
                                     input, weight, bias_sizes, p, mask)


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
    backend: str | None = None,
) -> Grads:
    """``torch.ops.aten.convolution_backward``, optionally under a forced backend.

    Shapes: ``grad_output`` is the forward output's shape ``[N, C_out, *out]``; returns
    ``(grad_input [N, C_in, *in], grad_weight like weight, grad_bias [C_out])`` with ``None``
    where ``output_mask`` is False. ``bias_sizes`` is ``None``, ``[C_out]`` or ``[0]``
    (:func:`convlab.scratch.params.check_bias_sizes`). ``backend`` is a
    :func:`convlab.aten.backends.use_backend` name (checked against ATen's selection) or
    ``None`` for the current flags.

    Differences from calling ATen directly, each to avoid a wrong or fatal result:
    ``grad_bias`` always has shape ``[C_out]`` (ATen aborts the process for an empty batch
    with ``bias_sizes=None``); every operand gets its memory format's canonical strides
    (a dense tensor with an odd stride on a size-1 dimension gets a wrong ``grad_input``
    from oneDNN, and plain ``F.conv2d`` autograd too: :func:`canonical_strides`); ATen's
    slow kernels get dense NCHW operands (one of them, ``_slow_conv2d_backward``, returns a
    wrong ``grad_weight`` for some channels-last inputs), and the results keep the layout
    ATen would give.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> go = torch.ones(2, 4, 6, 6)
    >>> mask = [True, True, True]
    >>> gi, gw, gb = convolution_backward(go, x, w, [4], 1, 0, 1, False,
    ...                                   0, 1, mask, backend="slow")
    >>> gb
    tensor([72., 72., 72., 72.])
    """
    p = backward_params(
        grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups
    )
    mask = check_output_mask(output_mask)
    out_channels = p.output_shape(tuple(input.shape), tuple(weight.shape))[1]
    sizes = aten_bias_sizes(bias_sizes, out_channels, mask)
    if backend is None:
        grads = _call_aten(grad_output, input, weight, sizes, p, mask)
    else:
        with use_backend(backend, input, weight, None, *p.aten_args()):
            grads = _call_aten(grad_output, input, weight, sizes, p, mask)
    return tuple(g if m else None for g, m in zip(grads, mask, strict=True))  # type: ignore[return-value]


# --- torch.nn.grad equivalents -------------------------------------------------------------


def _dense_placeholder(size: Sequence[int], like: torch.Tensor, name: str) -> torch.Tensor:
    """An uninitialised tensor of ``size`` (never read: its gradient slot is masked off)."""
    if isinstance(size, torch.Size):
        size = tuple(size)
    if isinstance(size, str | bytes) or not isinstance(size, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(size).__name__}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise TypeError(f"{name} must contain ints, got {list(size)}")
    if len(size) != like.dim():
        raise ValueError(
            f"{name} must have {like.dim()} entries to match a {like.dim()}-d tensor, "
            f"got {list(size)}"
        )
    if any(s < 0 for s in size):
        raise ValueError(f"{name} must be non-negative, got {list(size)}")
    fmt = torch.preserve_format
    if like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last):
        fmt = torch.channels_last
    elif like.dim() == 5 and like.is_contiguous(memory_format=torch.channels_last_3d):
        fmt = torch.channels_last_3d
    if fmt is torch.preserve_format:
        return like.new_empty(tuple(size))
    return torch.empty(tuple(size), dtype=like.dtype, device=like.device, memory_format=fmt)


def conv_input(
    input_size: Sequence[int],
    weight: torch.Tensor,
    grad_output: torch.Tensor,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
) -> torch.Tensor:
    """Gradient of a 1-, 2- or 3-d convolution w.r.t. its input, like
    ``torch.nn.grad.conv{1,2,3}d_input``; the dimension comes from ``weight``.

    Shapes: ``input_size`` ``[N, C_in, *S]`` (it fixes the sizes a strided conv leaves
    ambiguous), weight ``[C_out, C_in/groups, *K]``, grad_output ``[N, C_out, *O]``.
    Calls ``aten::convolution_backward`` with output_mask ``[True, False, False]`` and an
    uninitialised input of ``input_size`` that is never read.

    Why a dense placeholder: torch.nn.grad passes a zero-memory ``new_empty(1).expand(size)``
    for the operand whose gradient is not wanted. Backends choose memory formats (and
    oneDNN/cuDNN their layouts) from that operand's strides, and a stride-0 view looks
    non-contiguous to those heuristics. An uninitialised dense tensor (channels_last when the
    other operand is) makes exactly the call autograd makes, for one unfilled allocation.

    >>> w, go = torch.randn(4, 3, 3, 3), torch.randn(2, 4, 6, 6)
    >>> list(conv_input([2, 3, 8, 8], w, go).shape)
    [2, 3, 8, 8]
    """
    check_tensor(weight, "weight")
    check_tensor(grad_output, "grad_output")
    placeholder = _dense_placeholder(input_size, grad_output, "input_size")
    grad_input, _, _ = convolution_backward(
        grad_output, placeholder, weight, None, stride, padding, dilation, False, 0, groups,
        [True, False, False],
    )
    assert grad_input is not None
    return grad_input


def conv_weight(
    input: torch.Tensor,
    weight_size: Sequence[int],
    grad_output: torch.Tensor,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
) -> torch.Tensor:
    """Gradient of a 1-, 2- or 3-d convolution w.r.t. its weight, like
    ``torch.nn.grad.conv{1,2,3}d_weight``; the dimension comes from ``input``.

    Shapes: input ``[N, C_in, *S]``, ``weight_size`` ``[C_out, C_in/groups, *K]``,
    grad_output ``[N, C_out, *O]``. Calls ``aten::convolution_backward`` with output_mask
    ``[False, True, False]`` and an uninitialised weight of ``weight_size`` that is never
    read (see :func:`conv_input` for why it is dense).

    >>> x, go = torch.randn(2, 3, 8, 8), torch.randn(2, 4, 6, 6)
    >>> list(conv_weight(x, [4, 3, 3, 3], go).shape)
    [4, 3, 3, 3]
    """
    check_tensor(input, "input")
    check_tensor(grad_output, "grad_output")
    placeholder = _dense_placeholder(weight_size, input, "weight_size")
    _, grad_weight, _ = convolution_backward(
        grad_output, input, placeholder, None, stride, padding, dilation, False, 0, groups,
        [False, True, False],
    )
    assert grad_weight is not None
    return grad_weight


def conv2d_input(
    input_size: Sequence[int], weight: torch.Tensor, grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """:func:`conv_input` for a 4-d ``weight`` (the name ``torch.nn.grad`` uses)."""
    _check_dim(weight, 4, "weight")
    return conv_input(input_size, weight, grad_output, stride, padding, dilation, groups)


def conv2d_weight(
    input: torch.Tensor, weight_size: Sequence[int], grad_output: torch.Tensor,
    stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
) -> torch.Tensor:
    """:func:`conv_weight` for a 4-d ``input`` (the name ``torch.nn.grad`` uses)."""
    _check_dim(input, 4, "input")
    return conv_weight(input, weight_size, grad_output, stride, padding, dilation, groups)


def _check_dim(t: torch.Tensor, dim: int, name: str) -> None:
    check_tensor(t, name)
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions for conv2d, got {list(t.shape)}")
