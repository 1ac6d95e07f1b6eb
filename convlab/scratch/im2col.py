"""N-d im2col and col2im with torch ops: the data movement behind every GEMM convolution.

:func:`im2col` gives **columns** ``[G, C/G * prod(kernel), N * L]``: one matrix per group,
rows are (input channel, kernel offset) pairs, columns are (sample, output position) pairs,
``L = prod(out_size)``. That is ``torch.nn.functional.unfold``'s per-sample
``[C * prod(kernel), L]`` with the batch folded into the columns and the channels split by
group. (Two other layouts in convlab: :func:`convlab.scratch.numpy_ref.im2col` returns unfold's
``[N, C * prod(kernel), L]``, and :func:`convlab.scratch.thnn.im2col_` writes that same layout into
THNN's ``finput`` buffer.) With all samples of a batch (or of a chunk of it, see
:mod:`convlab.scratch.reference`) in one matrix, a convolution's forward, grad_input and
grad_weight are each a single batched GEMM over the groups.

``im2col`` is a chain of views (pad, one ``unfold`` per spatial dimension, a strided slice
for dilation) followed by one copy. :func:`col2im` is its adjoint: it adds every column
entry back onto the input element it was copied from (overlapping windows sum, entries
that read padding are dropped), one strided slice-add per kernel offset.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from convlab.scratch.params import as_int

Ints = Sequence[int]


def _extent(kernel: Ints, dilation: Ints) -> list[int]:
    return [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]


def _pad_arg(padding: Ints) -> list[int]:
    # F.pad takes (left, right) pairs starting from the last dimension.
    return [p for pad in reversed(padding) for p in (pad, pad)]


def _ints(value: object, name: str, dim: int | None, minimum: int) -> tuple[int, ...]:
    """``value`` as a tuple of ints, each ``>= minimum`` (and ``dim`` of them, when given)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__} "
                        f"{value!r}")
    items = tuple(as_int(v, f"each entry of {name}") for v in value)
    if dim is not None and len(items) != dim:
        raise ValueError(f"{name} must have {dim} entries (one per kernel dimension), "
                         f"got {list(items)}")
    if any(v < minimum for v in items):
        raise ValueError(f"{name} must be >= {minimum} in every dimension, got {list(items)}")
    return items


def _check_args(
    kernel: object, out_size: object, stride: object, padding: object, dilation: object,
    shape: object,
) -> tuple[tuple[int, ...], ...]:
    """Validate the geometry :func:`im2col` and :func:`col2im` share, before any work.

    Every argument must be a sequence of ints with one entry per kernel dimension;
    ``kernel``, ``stride``, ``dilation`` >= 1, ``out_size``, ``padding`` >= 0; ``shape`` (the
    input's) ``[N, C, *size]``; and the last window of every dimension must fit the padded
    input: ``(out_size - 1) * stride + dilation * (kernel - 1) + 1 <= size + 2 * padding``.
    """
    kernel = _ints(kernel, "kernel", None, 1)
    dim = len(kernel)
    if dim == 0:
        raise ValueError("kernel must have at least one entry (one per spatial dimension)")
    out_size = _ints(out_size, "out_size", dim, 0)
    stride = _ints(stride, "stride", dim, 1)
    padding = _ints(padding, "padding", dim, 0)
    dilation = _ints(dilation, "dilation", dim, 1)
    shape = _ints(shape, "the input shape", None, 0)
    if len(shape) != dim + 2:
        raise ValueError(f"the input must be [N, C, *size] with {dim} spatial dimensions, "
                         f"got shape {list(shape)}")
    for i, (o, s, e, size, pad) in enumerate(zip(out_size, stride, _extent(kernel, dilation),
                                                 shape[2:], padding, strict=True)):
        if o > 0 and (o - 1) * s + e > size + 2 * pad:
            raise ValueError(
                f"out_size={list(out_size)} windows do not fit dimension {i}: the last one "
                f"ends at ({o} - 1) * stride {s} + extent {e} = {(o - 1) * s + e} > padded "
                f"size {size} + 2 * {pad}"
            )
    return kernel, out_size, stride, padding, dilation, shape


def _check_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} (convert a "
                        f"NumPy array with torch.from_numpy, or use convlab.scratch.numpy_ref)")
    return t


def tap_windows(
    kernel: Ints, out_size: Ints, stride: Ints, dilation: Ints
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For every kernel offset, the spatial slices of the *padded* input that it reads.

    Yields ``(offset, slices)``; ``padded_input[..., *slices]`` has shape ``[..., *out_size]``
    and holds, at output position ``o``, the element ``o * stride + offset * dilation``.
    """
    for offset in itertools.product(*(range(k) for k in kernel)):
        yield offset, tuple(
            slice(o * d, o * d + (size - 1) * st + 1, st)
            for o, d, size, st in zip(offset, dilation, out_size, stride, strict=True)
        )


def windows(
    x: torch.Tensor, kernel: Ints, out_size: Ints, stride: Ints, dilation: Ints, first: int
) -> torch.Tensor:
    """View the (already padded) spatial dims ``first .. first+dim`` of ``x`` as windows:
    each spatial dim becomes ``out_size[i]``, a kernel dim ``kernel[i]`` is appended."""
    extent = _extent(kernel, dilation)
    for i in range(len(kernel)):
        # unfold appends the window dimension last; it may yield more windows than out_size
        # (a transposed conv whose output_padding >= stride), so keep the first out_size.
        x = x.unfold(first + i, extent[i], stride[i]).narrow(first + i, 0, out_size[i])
    if any(d > 1 for d in dilation):
        x = x[(..., *(slice(None, None, d) for d in dilation))]
    return x


def _padded_windows(x: torch.Tensor, kernel: Ints, out_size: Ints, stride: Ints,
                    padding: Ints, dilation: Ints) -> torch.Tensor:
    """The view ``[N, C, *O, *k]`` of ``x`` ``[N, C, *S]`` zero-padded (a copy only where
    there is padding): window ``o`` at kernel offset ``k``."""
    if any(padding):
        x = F.pad(x, _pad_arg(padding))
    return windows(x, kernel, out_size, stride, dilation, first=2)


def im2col(
    x: torch.Tensor,
    kernel: Ints,
    out_size: Ints,
    stride: Ints,
    padding: Ints,
    dilation: Ints,
    groups: int,
) -> torch.Tensor:
    """Unfold ``x`` ``[N, C, *S]`` into columns ``[G, C/G * prod(kernel), N * prod(out_size)]``.

    Row ``c * prod(kernel) + flat(offset)`` of group ``g`` holds channel ``g * C/G + c`` at
    that kernel offset; column ``n * L + flat(position)`` is sample ``n``'s window at that
    output position. ``out_size`` is the number of windows per spatial dimension (normally
    the conv's output size; it may be smaller than what fits). Padding reads as zero.
    A non-tensor ``x`` raises ``TypeError``; a stride, dilation or kernel below 1, negative
    padding, ``groups`` that does not divide ``C`` or windows that do not fit the padded
    input raise ``ValueError`` naming the argument, before any work.

    >>> x = torch.arange(16.0).view(1, 1, 4, 4)
    >>> im2col(x, (3, 3), (2, 2), (1, 1), (0, 0), (1, 1), 1).shape
    torch.Size([1, 9, 4])
    """
    x = _check_tensor(x, "x")
    kernel, out_size, stride, padding, dilation, _ = _check_args(
        kernel, out_size, stride, padding, dilation, x.shape)
    groups = as_int(groups, "groups")
    c = x.shape[1]
    if groups < 1 or c % groups:
        raise ValueError(f"groups={groups} must be a positive divisor of the input's "
                         f"{c} channels")
    return columns(x, kernel, out_size, stride, padding, dilation, groups)


def columns(x: torch.Tensor, kernel: Ints, out_size: Ints, stride: Ints, padding: Ints,
            dilation: Ints, groups: int) -> torch.Tensor:
    """:func:`im2col` without its checks, for callers that checked the geometry once
    (:mod:`convlab.scratch.reference` calls it per chunk of samples): same arguments (int
    sequences and an int) and result."""
    dim, (n, c) = len(kernel), x.shape[:2]
    win = _padded_windows(x, kernel, out_size, stride, padding, dilation)
    # [N, C, *O, *k] -> [C, *k, N, *O]; the reshape is the one copy.
    order = [1, *range(2 + dim, 2 + 2 * dim), 0, *range(2, 2 + dim)]
    rows = c // groups * math.prod(kernel)
    return win.permute(order).reshape(groups, rows, n * math.prod(out_size))


def sample_columns(
    out: torch.Tensor | None,
    x: torch.Tensor,
    kernel: Ints,
    out_size: Ints,
    stride: Ints,
    padding: Ints,
    dilation: Ints,
) -> torch.Tensor:
    """Write the columns of ``x`` ``[N, C, *S]`` per sample into ``out``
    ``[N, C * prod(kernel), L]`` (one copy) and return ``out``; with ``out=None``, a new
    tensor (no in-place write, so autograd, ``vmap`` and tracing see one reshape).

    The layout of ``torch.nn.functional.unfold`` and of ATen's slow path (one
    ``[C * k, L]`` matrix per sample): a GEMM batched over the samples reads it as it
    lies, where :func:`im2col`'s batch-folded layout makes one long GEMM. ``out`` is
    typically a buffer reused for every chunk of samples; geometry as :func:`im2col`
    (not re-checked here: callers pass validated sizes).
    """
    n, c, dim = x.shape[0], x.shape[1], len(kernel)
    win = _padded_windows(x, kernel, out_size, stride, padding, dilation)
    order = [0, 1, *range(2 + dim, 2 + 2 * dim), *range(2, 2 + dim)]
    if out is None:
        return win.permute(order).reshape(n, c * math.prod(kernel), math.prod(out_size))
    out.view(n, c, *kernel, *out_size).copy_(win.permute(order))
    return out


def col2im(
    cols: torch.Tensor,
    input_shape: Ints,
    kernel: Ints,
    out_size: Ints,
    stride: Ints,
    padding: Ints,
    dilation: Ints,
) -> torch.Tensor:
    """Sum columns ``[G, C/G * prod(kernel), N * prod(out_size)]`` back into ``[N, C, *S]``.

    The adjoint of :func:`im2col` with the same arguments: every input element receives the
    sum of the column entries that were copied from it (entries that read padding are
    dropped). Returns a new contiguous tensor; differentiable by autograd.

    >>> x = torch.ones(1, 1, 3, 3)
    >>> cols = im2col(x, (2, 2), (2, 2), (1, 1), (0, 0), (1, 1), 1)
    >>> col2im(cols, x.shape, (2, 2), (2, 2), (1, 1), (0, 0), (1, 1))[0, 0]
    tensor([[1., 2., 1.],
            [2., 4., 2.],
            [1., 2., 1.]])
    """
    cols = _check_tensor(cols, "cols")
    kernel, out_size, stride, padding, dilation, input_shape = _check_args(
        kernel, out_size, stride, padding, dilation, input_shape)
    n, c = input_shape[:2]
    want_rows, want_cols = c * math.prod(kernel), n * math.prod(out_size)
    if (cols.dim() != 3 or cols.shape[0] < 1 or c % cols.shape[0]
            or cols.shape[0] * cols.shape[1] != want_rows or cols.shape[2] != want_cols):
        raise ValueError(
            f"cols must be [G, C/G * prod(kernel), N * prod(out_size)] with G dividing "
            f"C={c}, prod(kernel)={math.prod(kernel)} and N * prod(out_size)={want_cols}, "
            f"got shape {list(cols.shape)}")
    spatial = list(input_shape[2:])
    padded = [s + 2 * p for s, p in zip(spatial, padding, strict=True)]
    g = cols.reshape(c, *kernel, n, *out_size)
    out = cols.new_zeros(c, n, *padded)
    # One strided slice-add per kernel offset: the rows of that offset go back to the input
    # positions they were copied from (stride apart, shifted by offset * dilation).
    for offset, window in tap_windows(kernel, out_size, stride, dilation):
        out[(slice(None), slice(None), *window)].add_(g[(slice(None), *offset)])
    crop = tuple(slice(p, p + s) for p, s in zip(padding, spatial, strict=True))
    return out[(slice(None), slice(None), *crop)].transpose(0, 1).contiguous()
