"""The THNN-era 2-d convolution (``SpatialConvolutionMM`` / ``thnn_conv2d_*``) in torch ops.

Up to PyTorch 1.10 the CPU "slow" 2-d convolution kept two work buffers that the caller
owned and autograd saved between forward and backward:

* ``finput``: the im2col columns of the input, ``[N, C_in*kH*kW, H_out*W_out]`` (the
  per-sample layout of ``torch.nn.functional.unfold``), filled by the forward and read
  again by the backward for ``grad_weight``;
* ``fgrad_input``: scratch of the same shape for ``weightᵀ @ grad_output`` (the gradient
  of the columns), folded back into ``grad_input`` by col2im.

This module re-creates that algorithm and that calling convention, following
``aten/src/ATen/native/ConvolutionMM2d.cpp`` at tag v1.9.0 (``slow_conv2d_forward_out_cpu``,
``slow_conv2d_backward_out_cpu_template`` and ``slow_conv2d_backward_parameters_out_cpu_template``):

* the backward never recomputes the columns: it reads ``finput[t]`` for ``grad_weight`` and
  resizes ``fgrad_input`` like ``finput`` for ``grad_input``. An empty ``finput``
  (``at::empty({0})``, as in a widely copied 2020 recipe) therefore failed on CPU, with an
  index error on an empty tensor; here it raises a ValueError that says so. (The CUDA
  op of that era handed the two to the legacy THCUNN ``SpatialConvolutionMM``, which used
  them as scratch, columns and a vector of ones, so the recipe could run there: from
  source, not run here.)
* a 1x1 kernel with stride 1 and no padding needs no im2col: the forward then returns a
  view of the (contiguous) input as ``finput`` and leaves the buffer passed in untouched.

Deviations, all on the side of refusing rather than guessing: ``finput=None`` in the
backward makes convlab recompute the columns (the old op had no such option); a buffer that
overlaps an input or the other buffer is refused; a buffer is only resized when the resize
stays inside it or it owns its whole storage (decided from the storage, so a
``big[:10].detach()`` or ``.data`` slice counts as a window on ``big``, while a buffer
convlab shrank for a smaller layer stays its own and grows back for a bigger one; see
:mod:`convlab.scratch.storage`), so nothing outside the caller's view is ever written;
buffers of another dtype or device are refused. Like the original: 2-d only, no dilation, no
groups, and an explicit backward (both functions run under ``torch.no_grad``). It uses
strided copies (im2col/col2im, one per kernel offset) and GEMMs, never a native convolution
op. A buffer is plain memory without a lock: do not pass the same buffer to calls running in
different threads at the same time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_output_mask,
    check_same,
    check_tensor,
    normalize,
)
from convlab.scratch.storage import owns_storage, resize_owned


def _weight_4d(weight: torch.Tensor, kernel: tuple[int, int], input: torch.Tensor) -> torch.Tensor:
    """View ``weight`` as ``[C_out, C_in, kH, kW]``, accepting the old 2-d layout too."""
    if weight.dim() == 2:
        c_in = input.shape[1] if input.dim() == 4 else -1
        if c_in <= 0 or weight.shape[1] != c_in * kernel[0] * kernel[1]:
            raise ValueError(
                f"a 2-d weight must be [C_out, C_in*kH*kW] = [*, {c_in}*{kernel[0]}*{kernel[1]}],"
                f" got shape {list(weight.shape)}"
            )
        return weight.reshape(weight.shape[0], c_in, *kernel)
    if weight.dim() != 4:
        raise ValueError(
            f"weight must be [C_out, C_in, kH, kW] (or the 2-d [C_out, C_in*kH*kW]), "
            f"got shape {list(weight.shape)}"
        )
    if tuple(weight.shape[2:]) != kernel:
        raise ValueError(
            f"kernel_size={list(kernel)} does not match weight of shape {list(weight.shape)}"
        )
    return weight


def _validate(
    input: torch.Tensor,
    weight: torch.Tensor,
    kernel_size: IntOrSeq,
    bias: torch.Tensor | None,
    stride: IntOrSeq,
    padding: IntOrSeq,
) -> tuple[ConvParams, torch.Tensor, tuple[int, int]]:
    """Check everything up front; return the params, the 4-d weight and the kernel size."""
    check_tensor(input, "input")
    check_tensor(weight, "weight")
    check_same(input, weight, "input", "weight")
    kernel = normalize(kernel_size, 2, "kernel_size")
    if any(k <= 0 for k in kernel):
        raise ValueError(f"kernel_size must be positive, got {list(kernel)}")
    if input.dim() != 4:
        raise ValueError(f"input must be [N, C_in, H, W], got shape {list(input.shape)}")
    w4 = _weight_4d(weight, kernel, input)
    if bias is not None:
        check_tensor(bias, "bias")
        check_same(input, bias, "input", "bias")
    params = ConvParams.create(2, stride, padding)
    params.check_shapes(
        tuple(input.shape), tuple(w4.shape), None if bias is None else tuple(bias.shape)
    )
    return params, w4, kernel  # type: ignore[return-value]


def _valid(size: int, out: int, k: int, stride: int, pad: int) -> tuple[slice, slice] | None:
    """For kernel offset ``k``: the output positions that read a real (not padding) pixel,
    and the input pixels they read, as two slices of equal length; None if there are none."""
    lo = max(0, -((k - pad) // stride))  # first o with o*stride + k - pad >= 0
    hi = min(out - 1, (size - 1 + pad - k) // stride)  # last o with o*stride + k - pad < size
    if hi < lo:
        return None
    start = lo * stride + k - pad
    return slice(lo, hi + 1), slice(start, start + stride * (hi - lo) + 1, stride)


def _offsets(
    input_size: Sequence[int], out: Sequence[int], kernel: Sequence[int], params: ConvParams
) -> Iterator[tuple[int, int, tuple[slice, slice], tuple[slice, slice]]]:
    """Yield ``(i, j, out_slices, in_slices)`` for every kernel offset that touches the input."""
    for i in range(kernel[0]):
        rows = _valid(input_size[0], out[0], i, params.stride[0], params.padding[0])
        if rows is None:
            continue
        for j in range(kernel[1]):
            cols = _valid(input_size[1], out[1], j, params.stride[1], params.padding[1])
            if cols is not None:
                yield i, j, (rows[0], cols[0]), (rows[1], cols[1])


def im2col_(
    input: torch.Tensor, finput: torch.Tensor, kernel: Sequence[int], params: ConvParams
) -> torch.Tensor:
    """Write the columns of ``input`` [N, C, H, W] into ``finput`` [N, C*kH*kW, L] in place.

    The layout is ``torch.nn.functional.unfold``'s (row ``c*kH*kW + i*kW + j``, column
    ``flat(output position)``), as THNN's ``finput`` had it.

    One strided copy per kernel offset (kH*kW copies, each over all pixels at once); the
    entries that read padding are zeroed.
    """
    n, c, h, w = input.shape
    out = params.output_size((h, w), kernel)
    view = finput.view(n, c, *kernel, *out)
    if any(params.padding):
        finput.zero_()
    for i, j, o, x in _offsets((h, w), out, kernel, params):
        view[:, :, i, j, o[0], o[1]].copy_(input[:, :, x[0], x[1]])
    return finput


def col2im_(
    columns: torch.Tensor, grad_input: torch.Tensor, kernel: Sequence[int], params: ConvParams
) -> torch.Tensor:
    """Sum ``columns`` [N, C*kH*kW, L] back onto ``grad_input`` [N, C, H, W] in place.

    The inverse layout of :func:`im2col_`: one strided ``add_`` per kernel offset.
    """
    n, c, h, w = grad_input.shape
    out = params.output_size((h, w), kernel)
    view = columns.view(n, c, *kernel, *out)
    grad_input.zero_()
    for i, j, o, x in _offsets((h, w), out, kernel, params):
        grad_input[:, :, x[0], x[1]].add_(view[:, :, i, j, o[0], o[1]])
    return grad_input


def columns_shape(
    input_shape: Sequence[int],
    kernel_size: IntOrSeq,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
) -> tuple[int, int, int]:
    """Shape of ``finput`` (and ``fgrad_input``) for an input of ``input_shape``
    ``(N, C_in, H, W)``: ``(N, C_in*kH*kW, H_out*W_out)``.

    >>> columns_shape((8, 64, 56, 56), 3, 1, 1)
    (8, 576, 3136)
    """
    if isinstance(input_shape, str | bytes) or not isinstance(input_shape, Sequence):
        raise TypeError(f"input_shape must be a sequence of 4 ints (N, C_in, H, W), "
                        f"got {input_shape!r}")
    shape = tuple(input_shape)
    if len(shape) != 4 or any(isinstance(v, bool) or not isinstance(v, int) for v in shape):
        raise ValueError(f"input_shape must be 4 ints (N, C_in, H, W), got {list(shape)}")
    if shape[0] < 0 or shape[1] < 0 or shape[2] <= 0 or shape[3] <= 0:
        raise ValueError(f"input_shape must have N, C_in >= 0 and H, W > 0, got {list(shape)}")
    kernel = normalize(kernel_size, 2, "kernel_size")
    if any(k <= 0 for k in kernel):
        raise ValueError(f"kernel_size must be positive, got {list(kernel)}")
    params = ConvParams.create(2, stride, padding)
    padded = [s + 2 * p for s, p in zip(shape[2:], params.padding, strict=True)]
    if any(k > s for k, s in zip(kernel, padded, strict=True)):
        raise ValueError(f"kernel_size={list(kernel)} is larger than the padded input "
                         f"{padded} (input_shape {list(shape)}, padding {list(params.padding)})")
    out = params.output_size(shape[2:], kernel)
    return (shape[0], shape[1] * math.prod(kernel), math.prod(out))


def _check_buffer(buf: object, name: str, input: torch.Tensor) -> torch.Tensor:
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(buf).__name__}")
    check_same(input, buf, "input", name)
    if buf.requires_grad:
        raise ValueError(f"{name} is a work buffer and must not require grad")
    if buf.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name} was made in inference mode and cannot be written here; "
                         "allocate it outside torch.inference_mode()")
    return buf


def _byte_range(t: torch.Tensor, numel_after: int | None = None) -> tuple[int, int, int]:
    """``(storage id, first byte, end byte)`` of the memory ``t`` covers; ``numel_after``:
    the elements it will cover once resized (see :func:`convlab.scratch.storage.safe_to_resize`:
    a buffer owning its storage grows from offset 0, any other stays inside itself)."""
    ptr = t.untyped_storage().data_ptr()
    if numel_after is not None and t.untyped_storage().nbytes() == 0:
        return ptr, 0, 0  # resizing allocates fresh memory
    if numel_after is not None and owns_storage(t):
        end = max(t.untyped_storage().nbytes(), numel_after * t.element_size())
        return ptr, 0, end
    start = t.storage_offset() * t.element_size()
    if numel_after is not None:
        return ptr, start, start + numel_after * t.element_size()
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(),
                                                                  strict=True))
    if t.numel() == 0:
        return ptr, 0, 0
    return ptr, start, start + extent * t.element_size()


def _check_no_overlap(
    written: dict[str, tuple[torch.Tensor, int | None]], others: dict[str, torch.Tensor | None]
) -> None:
    """Raise if a buffer that will be written shares memory with another argument.

    ``written`` maps a name to ``(buffer, elements after resizing or None)``. Like ATen's
    ``assert_no_overlap``, this compares memory ranges, not values.
    """
    ranges = {name: _byte_range(t, n) for name, (t, n) in written.items()}
    ranges.update({name: _byte_range(t) for name, t in others.items() if t is not None})
    names = list(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (pa, sa, ea), (pb, sb, eb) = ranges[a], ranges[b]
            if (a in written or b in written) and pa == pb and sa < eb and sb < ea:
                raise ValueError(f"{a} shares memory with {b}: a work buffer must not "
                                 f"overlap the inputs or the other buffer")


def _fit(buf: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """Give ``buf`` the contiguous ``shape`` in place: as it is when it already has that
    shape; else ``resize_`` (storage kept when large enough), but only when
    :func:`convlab.scratch.storage.safe_to_resize` says the resize writes nothing outside
    ``buf``: memory outside a caller's view is never written. A buffer shrunk here stays
    its storage's owner (:func:`convlab.scratch.storage.resize_owned`): a later bigger layer
    grows it again in the same storage."""
    if tuple(buf.shape) == shape:
        if not buf.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {buf.stride()}")
        return buf
    return resize_owned(buf, shape, name)


def _needs_resize(buf: torch.Tensor | None, shape: tuple[int, ...]) -> int | None:
    """Elements the buffer will cover after :func:`_fit`, if it will be resized."""
    if buf is None or tuple(buf.shape) == shape:
        return None
    return math.prod(shape)


def _buffer(
    buf: torch.Tensor | None, shape: tuple[int, ...], name: str, input: torch.Tensor
) -> torch.Tensor:
    if buf is None:
        return input.new_empty(shape)
    return _fit(_check_buffer(buf, name, input), shape, name)


def _is_pointwise(kernel: Sequence[int], params: ConvParams) -> bool:
    """1x1 kernel, stride 1, no padding: the columns are the input itself."""
    return (tuple(kernel) == (1, 1) and params.stride == (1, 1)
            and params.padding == (0, 0))


@torch.no_grad()
def conv2d_forward(
    input: torch.Tensor,
    weight: torch.Tensor,
    kernel_size: IntOrSeq,
    bias: torch.Tensor | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    finput: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """THNN forward: ``finput = im2col(input)``, ``output = weight @ finput + bias``.

    Shapes: input ``[N, C_in, H, W]``; weight ``[C_out, C_in, kH, kW]`` or
    ``[C_out, C_in*kH*kW]``; bias ``[C_out]`` or None. ``finput`` is a buffer for the
    columns ``[N, C_in*kH*kW, H_out*W_out]`` or None to allocate one: a tensor that owns its
    memory may have any size (resized in place, storage kept when large enough); a view of
    a bigger tensor must already have that shape. It must not overlap input, weight or bias.

    Returns ``(output [N, C_out, H_out, W_out], finput)``; keep ``finput`` for the backward.
    With a 1x1 kernel, stride 1 and no padding the returned ``finput`` is a view of the
    input (as in 1.x) and the buffer passed in is not touched.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> buf = torch.empty(0)
    >>> out, cols = conv2d_forward(x, w, 3, None, 1, 1, buf)
    >>> out.shape, cols is buf, tuple(buf.shape)
    (torch.Size([2, 4, 8, 8]), True, (2, 27, 64))
    """
    params, w4, kernel = _validate(input, weight, kernel_size, bias, stride, padding)
    n, c_out, h_out, w_out = params.output_shape(tuple(input.shape), tuple(w4.shape))
    shape = columns_shape(input.shape, kernel, params.stride, params.padding)
    if finput is not None:
        _check_buffer(finput, "finput", input)
    if _is_pointwise(kernel, params):
        # As in 1.x: no im2col, the columns are a view of the input ([N, C_in, H*W]).
        finput = input.detach().contiguous().view(shape)
    else:
        if finput is not None:
            _check_no_overlap({"finput": (finput, _needs_resize(finput, shape))},
                              {"input": input, "weight": weight, "bias": bias})
        finput = _buffer(finput, shape, "finput", input)
        im2col_(input, finput, kernel, params)
    # One GEMM per sample, batched; the weight is broadcast (stride 0), not copied.
    output = torch.bmm(w4.reshape(c_out, -1).expand(n, -1, -1), finput)
    if bias is not None:
        output.add_(bias.view(1, c_out, 1))
    return output.view(n, c_out, h_out, w_out), finput


@torch.no_grad()
def conv2d_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    kernel_size: IntOrSeq,
    stride: IntOrSeq,
    padding: IntOrSeq,
    finput: torch.Tensor | None,
    fgrad_input: torch.Tensor | None,
    output_mask: Sequence[bool] = (True, True, True),
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """THNN backward with explicit buffers: two GEMMs and a col2im.

    * ``fgrad_input = weightᵀ @ grad_output`` (per sample), ``grad_input = col2im(fgrad_input)``;
    * ``grad_weight = sum_n grad_output[n] @ finput[n]ᵀ``;
    * ``grad_bias = grad_output`` summed over batch and space.

    ``finput`` must hold the columns ``[N, C_in*kH*kW, H_out*W_out]`` that
    :func:`conv2d_forward` returned for this input (see :func:`columns_shape`); it is only
    read, never checked against the input (as in 1.x). When ``grad_input`` or
    ``grad_weight`` is asked for, a ``finput`` of another shape (e.g. ``torch.empty(0)``)
    raises ValueError: the 1.x CPU op indexed ``finput[t]`` and failed on it. ``None`` makes
    convlab recompute the columns (a convenience the old op did not have).
    ``fgrad_input`` is scratch: resized in place like ``finput`` (storage kept when large
    enough; a view of a bigger tensor must already have the right shape) and overwritten.
    Neither buffer may overlap grad_output, input, weight or the other buffer (``finput``
    may be the view of the input that a 1x1 forward returns: it is only read).

    Returns ``(grad_input, grad_weight, grad_bias)`` shaped like input, weight (as passed)
    and ``[C_out]``; ``None`` where ``output_mask`` is false.

    >>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    >>> out, cols = conv2d_forward(x, w, 3, None, 1, 1)
    >>> go = torch.ones_like(out)
    >>> gi, gw, gb = conv2d_backward(go, x, w, 3, 1, 1, cols,
    ...                              torch.empty(0))
    >>> gi.shape, gw.shape, gb.shape
    (torch.Size([2, 3, 8, 8]), torch.Size([4, 3, 3, 3]), torch.Size([4]))
    """
    mask = check_output_mask(output_mask)
    params, w4, kernel = _validate(input, weight, kernel_size, None, stride, padding)
    params.check_grad_output(grad_output, input, w4)
    n, c_out = grad_output.shape[:2]
    shape = columns_shape(input.shape, kernel, params.stride, params.padding)
    # Check both buffers before any work, even the one this mask does not use.
    if finput is not None:
        _check_buffer(finput, "finput", input)
        if (mask[0] or mask[1]) and tuple(finput.shape) != shape:
            raise ValueError(
                f"finput must hold the forward's columns, shape {list(shape)} (as "
                f"conv2d_forward returns them), got shape {list(finput.shape)}; the 1.x CPU "
                f"op read finput[t] and failed on an empty one. Pass None to recompute them")
        if mask[1] and not finput.is_contiguous():
            raise ValueError(f"finput must be contiguous, got strides {finput.stride()}")
    if fgrad_input is not None:
        _check_buffer(fgrad_input, "fgrad_input", input)
        if mask[0]:
            written = {"fgrad_input": (fgrad_input, _needs_resize(fgrad_input, shape))}
            _check_no_overlap(written, {"grad_output": grad_output, "input": input,
                                        "weight": weight, "finput": finput})
    go = grad_output.contiguous().view(n, c_out, shape[2])  # [N, C_out, L]
    w2 = w4.reshape(c_out, -1)  # [C_out, K]
    grad_input = grad_weight = grad_bias = None
    if mask[0]:
        fgrad_input = _buffer(fgrad_input, shape, "fgrad_input", input)
        torch.bmm(w2.t().expand(n, -1, -1), go, out=fgrad_input)
        grad_input = torch.empty_like(input, memory_format=torch.contiguous_format)
        col2im_(fgrad_input, grad_input, kernel, params)
    if mask[1]:
        if finput is None:
            finput = input.new_empty(shape)
            im2col_(input, finput, kernel, params)
        # Accumulate per sample, as THNN did: no [N, C_out, K] temporary.
        grad_weight = w2.new_zeros(w2.shape)
        for i in range(n):
            grad_weight.addmm_(go[i], finput[i].t())
        grad_weight = grad_weight.view(weight.shape)
    if mask[2]:
        grad_bias = go.sum(dim=(0, 2))
    return grad_input, grad_weight, grad_bias
