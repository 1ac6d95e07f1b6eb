"""Convolution forward and backward in plain NumPy: the definition, then im2col + GEMM.

Two implementations of the same maths, N-d (1-d, 2-d, 3-d, ...), with stride, padding,
dilation and groups, for a normal (not transposed) convolution:

* :func:`convolution_naive` / :func:`convolution_backward_naive`: nested loops that
  follow the definition term by term. Readable, exact, slow: tiny sizes only.
* :func:`convolution` / :func:`convolution_backward`: :func:`im2col` turns every input
  patch into a column, so the convolution becomes a matrix product (GEMM); the backward
  is two GEMMs and a :func:`col2im`.

Arrays follow ATen's layout: input ``[N, C_in, *spatial]``, weight
``[C_out, C_in / groups, *kernel]``, bias ``[C_out]``. Argument order mirrors
``aten::convolution`` and ``aten::convolution_backward`` without ``transposed`` and
``output_padding``. No torch inside: :class:`~convlab.scratch.params.ConvParams` only validates
shapes and arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from convlab.scratch.params import (
    ConvParams,
    IntOrSeq,
    check_bias_sizes,
    check_output_mask,
    normalize,
)

Mask = Sequence[bool]


def _check_array(a: object, name: str) -> None:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must have a floating-point dtype, got {a.dtype}")


def _check_bias(bias: object, input: np.ndarray) -> None:
    if bias is None:
        return
    if not isinstance(bias, np.ndarray):
        raise TypeError(f"bias must be a numpy.ndarray of shape [C_out] or None, "
                        f"got {type(bias).__name__} {bias!r}")
    _check_array(bias, "bias")
    _check_same_dtype(input, bias, "input", "bias")


def _check_same_dtype(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{name_b} has dtype {b.dtype} but {name_a} has dtype {a.dtype}")


def _params(
    input: np.ndarray,
    weight: np.ndarray,
    bias_shape: Sequence[int] | None,
    stride: IntOrSeq,
    padding: IntOrSeq,
    dilation: IntOrSeq,
    groups: int,
) -> ConvParams:
    """Validate arrays and arguments together (types, dtypes, ranks, channels, sizes)."""
    _check_array(input, "input")
    _check_array(weight, "weight")
    _check_same_dtype(input, weight, "input", "weight")
    if weight.ndim < 3:
        raise ValueError(
            f"weight must have at least 3 dimensions [out, in/groups, *kernel], "
            f"got shape {list(weight.shape)}"
        )
    if weight.shape[0] == 0:
        raise ValueError(f"weight must have at least one output channel (ATen refuses an "
                         f"empty weight.shape[0]), got shape {list(weight.shape)}")
    params = ConvParams.create(weight.ndim - 2, stride, padding, dilation, groups=groups)
    params.check_shapes(input.shape, weight.shape, bias_shape)
    return params


def _check_grad_output(
    grad_output: np.ndarray, input: np.ndarray, weight: np.ndarray, params: ConvParams
) -> None:
    _check_array(grad_output, "grad_output")
    _check_same_dtype(input, grad_output, "input", "grad_output")
    expected = params.output_shape(input.shape, weight.shape)
    if tuple(grad_output.shape) != expected:
        raise ValueError(
            f"grad_output must have the forward output's shape {list(expected)}, "
            f"got {list(grad_output.shape)}"
        )


def _pad(x: np.ndarray, padding: Sequence[int]) -> np.ndarray:
    if not any(padding):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])


# --------------------------------------------------------------------------- the definition


def _tap(pos: tuple[int, ...], k: tuple[int, ...], params: ConvParams) -> tuple[int, ...]:
    """Spatial index in the padded input that output ``pos`` reads at kernel offset ``k``."""
    return tuple(
        p * s + kk * d for p, s, kk, d in zip(pos, params.stride, k, params.dilation, strict=True)
    )


def convolution_naive(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
) -> np.ndarray:
    """Convolution (cross-correlation) by its definition, one output element at a time.

    ``y[n, o, p] = b[o] + sum_{c, k} x_pad[n, g*C_g + c, p*stride + k*dilation] * w[o, c, k]``
    where ``g`` is the group of output channel ``o``. Input ``[N, C_in, *size]``, weight
    ``[C_out, C_in/groups, *kernel]``; returns ``[N, C_out, *out]``.

    >>> x = np.ones((1, 1, 3, 3)); w = np.ones((1, 1, 2, 2))
    >>> convolution_naive(x, w)[0, 0]
    array([[4., 4.],
           [4., 4.]])
    """
    _check_array(input, "input")
    _check_bias(bias, input)
    params = _params(
        input, weight, None if bias is None else bias.shape, stride, padding, dilation, groups
    )
    out_shape = params.output_shape(input.shape, weight.shape)
    x = _pad(input, params.padding)
    c_out, c_group = weight.shape[0], weight.shape[1]
    out_per_group = c_out // groups
    y = np.zeros(out_shape, dtype=input.dtype)
    for n in range(input.shape[0]):
        for o in range(c_out):
            g = o // out_per_group
            for pos in np.ndindex(*out_shape[2:]):
                acc = 0.0 if bias is None else bias[o]
                for c in range(c_group):
                    for k in np.ndindex(*weight.shape[2:]):
                        idx = _tap(pos, k, params)
                        acc += x[(n, g * c_group + c, *idx)] * weight[(o, c, *k)]
                y[(n, o, *pos)] = acc
    return y


def convolution_backward_naive(
    grad_output: np.ndarray,
    input: np.ndarray,
    weight: np.ndarray,
    bias_sizes: Sequence[int] | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    output_mask: Mask = (True, True, True),
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Gradients by differentiating the definition term by term (same loops as the forward).

    Each product ``x[n, c, idx] * w[o, c, k]`` that fed ``y[n, o, p]`` sends
    ``grad_output[n, o, p] * w`` to ``grad_input`` and ``grad_output[n, o, p] * x`` to
    ``grad_weight``; ``grad_bias[o]`` sums ``grad_output[:, o]``. Returns
    ``(grad_input, grad_weight, grad_bias)`` shaped like input, weight and ``[C_out]``,
    ``None`` where ``output_mask`` is false.

    >>> x = np.ones((1, 1, 3, 3))
    >>> w, go = np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2))
    >>> convolution_backward_naive(go, x, w)[0][0, 0]
    array([[1., 2., 1.],
           [2., 4., 2.],
           [1., 2., 1.]])
    """
    mask = check_output_mask(output_mask)
    params = _params(input, weight, None, stride, padding, dilation, groups)
    check_bias_sizes(bias_sizes, weight.shape[0])
    _check_grad_output(grad_output, input, weight, params)
    x = _pad(input, params.padding)
    grad_x = np.zeros_like(x)
    grad_w = np.zeros_like(weight)
    c_out, c_group = weight.shape[0], weight.shape[1]
    out_per_group = c_out // groups
    for n in range(input.shape[0]):
        for o in range(c_out):
            g = o // out_per_group
            for pos in np.ndindex(*grad_output.shape[2:]):
                go = grad_output[(n, o, *pos)]
                for c in range(c_group):
                    for k in np.ndindex(*weight.shape[2:]):
                        idx = _tap(pos, k, params)
                        grad_x[(n, g * c_group + c, *idx)] += go * weight[(o, c, *k)]
                        grad_w[(o, c, *k)] += go * x[(n, g * c_group + c, *idx)]
    crop = (slice(None), slice(None)) + tuple(
        slice(p, p + s) for p, s in zip(params.padding, input.shape[2:], strict=True)
    )
    sum_axes = (0, *range(2, grad_output.ndim))
    return (
        np.ascontiguousarray(grad_x[crop]) if mask[0] else None,
        grad_w if mask[1] else None,
        grad_output.sum(axis=sum_axes) if mask[2] else None,
    )


# --------------------------------------------------------------------------- im2col + GEMM


def _patches(
    input: np.ndarray, kernel: Sequence[int], params: ConvParams, batch_last: bool
) -> np.ndarray:
    """Read-only strided view of every patch of the padded input, no copy.

    Shape ``[N, C, *kernel, *out]``, or ``[C, *kernel, N, *out]`` with ``batch_last`` (the
    layout whose reshape is one ``[C*prod(kernel), N*prod(out)]`` matrix for the batch).
    """
    n, c = input.shape[:2]
    out = params.output_size(input.shape[2:], kernel)
    x = _pad(input, params.padding)
    sp = x.strides[2:]
    taps = tuple(s * d for s, d in zip(sp, params.dilation, strict=True))
    steps = tuple(s * st for s, st in zip(sp, params.stride, strict=True))
    s_n, s_c = x.strides[:2]
    if batch_last:
        shape, strides = (c, *kernel, n, *out), (s_c, *taps, s_n, *steps)
    else:
        shape, strides = (n, c, *kernel, *out), (s_n, s_c, *taps, *steps)
    return as_strided(x, shape=shape, strides=strides, writeable=False)


def _fold(
    cols: np.ndarray, size: Sequence[int], kernel: Sequence[int], params: ConvParams
) -> np.ndarray:
    """Adjoint of :func:`_patches`: ``cols`` ``[A, B, *kernel, *out]`` -> ``[A, B, *size]``.

    One strided in-place add per kernel offset into a zero-padded image, then a crop (a
    view). ``A, B`` are ``N, C`` or ``C, N``: the loop does not care.
    """
    out = cols.shape[2 + len(kernel) :]
    lead = cols.shape[:2]
    padded = np.zeros(
        (*lead, *(i + 2 * p for i, p in zip(size, params.padding, strict=True))), cols.dtype
    )
    both = (slice(None), slice(None))
    for k in np.ndindex(*kernel):
        window = tuple(
            slice(kk * d, kk * d + s * (o - 1) + 1, s)
            for kk, d, s, o in zip(k, params.dilation, params.stride, out, strict=True)
        )
        padded[(*both, *window)] += cols[(*both, *k)]
    crop = tuple(slice(p, p + i) for p, i in zip(params.padding, size, strict=True))
    return padded[(*both, *crop)]


def im2col(
    input: np.ndarray,
    kernel_size: IntOrSeq,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
) -> np.ndarray:
    """Unfold every (dilated) input patch into a column: ``[N, C*prod(kernel), prod(out)]``.

    Row ``c*prod(kernel) + flat(k)`` holds channel ``c`` at kernel offset ``k``, column
    ``flat(p)`` the patch of output position ``p``: the per-sample layout of
    ``torch.nn.functional.unfold`` and of THNN's ``finput`` (:func:`convlab.scratch.thnn.im2col_`).
    :func:`convlab.scratch.im2col.im2col` instead folds the batch into the columns and splits the
    groups. Built as one strided view of the padded input, then copied once.

    >>> im2col(np.arange(9.0).reshape(1, 1, 3, 3), 2)[0]
    array([[0., 1., 3., 4.],
           [1., 2., 4., 5.],
           [3., 4., 6., 7.],
           [4., 5., 7., 8.]])
    """
    _check_array(input, "input")
    dim = input.ndim - 2
    if dim < 1:
        raise ValueError(f"input must have at least 3 dimensions [N, C, *size], got {input.shape}")
    kernel = normalize(kernel_size, dim, "kernel_size")
    params = ConvParams.create(dim, stride, padding, dilation)
    params.check_shapes(input.shape, (1, input.shape[1], *kernel))
    view = _patches(input, kernel, params, batch_last=False)
    n, c = input.shape[:2]
    out = params.output_size(input.shape[2:], kernel)
    return view.reshape(n, c * math.prod(kernel), math.prod(out))


def col2im(
    columns: np.ndarray,
    input_shape: Sequence[int],
    kernel_size: IntOrSeq,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
) -> np.ndarray:
    """Inverse layout of :func:`im2col`: add every column entry back onto its input pixel.

    ``columns`` is ``[N, C*prod(kernel), prod(out)]``; returns ``input_shape``. Overlapping
    patches sum, so ``col2im(im2col(x))`` counts each pixel once per patch that covers it.
    The loop runs over kernel offsets (``prod(kernel)`` strided slices), not over pixels.

    >>> col2im(np.ones((1, 4, 4)), (1, 1, 3, 3), 2)[0, 0]
    array([[1., 2., 1.],
           [2., 4., 2.],
           [1., 2., 1.]])
    """
    _check_array(columns, "columns")
    input_shape = tuple(input_shape)
    dim = len(input_shape) - 2
    if dim < 1:
        raise ValueError(f"input_shape must be [N, C, *size], got {list(input_shape)}")
    kernel = normalize(kernel_size, dim, "kernel_size")
    params = ConvParams.create(dim, stride, padding, dilation)
    params.check_shapes(input_shape, (1, input_shape[1], *kernel))
    n, c = input_shape[:2]
    out = params.output_size(input_shape[2:], kernel)
    expected = (n, c * math.prod(kernel), math.prod(out))
    if columns.shape != expected:
        raise ValueError(
            f"columns must have shape {list(expected)} for input_shape {list(input_shape)}, "
            f"got {list(columns.shape)}"
        )
    folded = _fold(columns.reshape(n, c, *kernel, *out), input_shape[2:], kernel, params)
    return np.ascontiguousarray(folded)


def convolution(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
) -> np.ndarray:
    """Convolution as ``weight @ im2col(input)`` (one GEMM per sample and group), plus bias.

    Input ``[N, C_in, *size]``, weight ``[C_out, C_in/groups, *kernel]``, bias ``[C_out]``;
    returns ``[N, C_out, *out]``.

    >>> x = np.ones((1, 2, 4, 4))
    >>> convolution(x, np.ones((4, 1, 3, 3)), groups=2)[0, :, 0, 0]
    array([9., 9., 9., 9.])
    """
    _check_array(input, "input")
    _check_bias(bias, input)
    params = _params(
        input, weight, None if bias is None else bias.shape, stride, padding, dilation, groups
    )
    out_shape = params.output_shape(input.shape, weight.shape)
    n, c_out = out_shape[:2]
    cols = im2col(input, weight.shape[2:], params.stride, params.padding, params.dilation)
    cols = cols.reshape(n, groups, cols.shape[1] // groups, cols.shape[-1])  # [N, G, K_g, L]
    w = weight.reshape(groups, c_out // groups, math.prod(weight.shape[1:]))  # [G, C_out/G, K_g]
    y = np.matmul(w, cols).reshape(out_shape)  # broadcast over N: [N, G, C_out/G, L]
    if bias is not None:
        y += bias.reshape((1, c_out) + (1,) * params.dim)
    return y


# The backward folds the batch into the GEMMs: the columns of all samples form one
# [C*prod(kernel), N*L] matrix per group (see _patches), so each gradient is one GEMM.


def _grad_input(
    go: np.ndarray,
    w: np.ndarray,
    input_shape: Sequence[int],
    kernel: Sequence[int],
    params: ConvParams,
) -> np.ndarray:
    """``col2im(wᵀ @ go)`` with ``go`` ``[G, C_out/G, N*L]`` and ``w`` ``[G, C_out/G, K_g]``."""
    n, c = input_shape[:2]
    dim = len(kernel)
    grad_cols = np.matmul(w.transpose(0, 2, 1), go)  # [G, K_g, N*L] = [C*prod(k), N*L]
    out = params.output_size(input_shape[2:], kernel)
    view = np.moveaxis(grad_cols.reshape(c, *kernel, n, *out), 1 + dim, 1)  # [C, N, *k, *out]
    return np.ascontiguousarray(_fold(view, input_shape[2:], kernel, params).swapaxes(0, 1))


def _grad_weight(
    go: np.ndarray, input: np.ndarray, weight_shape: Sequence[int], params: ConvParams
) -> np.ndarray:
    """``go @ columnsᵀ`` per group, with ``go`` ``[G, C_out/G, N*L]``; shaped like the weight."""
    groups = go.shape[0]
    cols = _patches(input, weight_shape[2:], params, batch_last=True)
    rows = math.prod(weight_shape[1:])
    cols = cols.reshape(groups, rows, go.shape[-1])  # the one copy: [G, K_g, N*L]
    return np.matmul(go, cols.transpose(0, 2, 1)).reshape(weight_shape)


def convolution_backward(
    grad_output: np.ndarray,
    input: np.ndarray,
    weight: np.ndarray,
    bias_sizes: Sequence[int] | None = None,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    output_mask: Mask = (True, True, True),
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Backward by two GEMMs and a col2im (per group).

    * ``grad_input = col2im(weightᵀ @ grad_output)``
    * ``grad_weight = sum_n grad_output[n] @ im2col(input)[n]ᵀ``
    * ``grad_bias = grad_output`` summed over batch and space.

    The columns of the whole batch form one matrix (``[C*prod(kernel), N*L]``), so each
    gradient is a single GEMM per group. Shapes as in :func:`convolution_backward_naive`;
    ``None`` where ``output_mask`` is false.

    >>> x = np.ones((1, 1, 3, 3))
    >>> w, go = np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2))
    >>> gi, gw, gb = convolution_backward(go, x, w, [1])
    >>> gw[0, 0], gb
    (array([[4., 4.],
           [4., 4.]]), array([4.]))
    """
    mask = check_output_mask(output_mask)
    params = _params(input, weight, None, stride, padding, dilation, groups)
    check_bias_sizes(bias_sizes, weight.shape[0])
    _check_grad_output(grad_output, input, weight, params)
    n, c_out = grad_output.shape[:2]
    positions = math.prod(grad_output.shape[2:])
    go = grad_output.reshape(n, groups, c_out // groups, positions).transpose(1, 2, 0, 3)
    go = go.reshape(groups, c_out // groups, n * positions)  # a copy: [G, C_out/G, N*L]
    w = weight.reshape(groups, c_out // groups, math.prod(weight.shape[1:]))  # [G, C_out/G, K_g]
    # Each gradient in its own function, so its big temporary (the columns or their
    # gradient) is freed before the next one is allocated.
    grad_input = _grad_input(go, w, input.shape, weight.shape[2:], params) if mask[0] else None
    grad_weight = _grad_weight(go, input, weight.shape, params) if mask[1] else None
    grad_bias = grad_output.sum(axis=(0, *range(2, grad_output.ndim))) if mask[2] else None
    return grad_input, grad_weight, grad_bias
