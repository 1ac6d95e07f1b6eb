"""N-d im2col and col2im with torch ops: the data movement behind every GEMM convolution.

The columns layout is ``[G, C/G * prod(kernel), N * L]``: one matrix per group whose rows
are (input channel, kernel offset) pairs and whose columns are (sample, output position)
pairs, ``L = prod(out_size)``. With all samples of a batch (or of a chunk of it, see
:mod:`convlab.reference`) in one matrix, a convolution's forward, grad_input and
grad_weight are each a single batched GEMM over the groups.

``im2col`` is a chain of views (pad, one ``unfold`` per spatial dimension, a strided slice
for dilation) followed by one copy. ``col2im`` is its adjoint: one strided slice-add per
kernel offset into a zero-padded input, so overlapping windows are summed. (Undoing the
views with ``unfold_backward``, the adjoint of ``unfold``, avoids that Python loop but is
4-5x slower on CPU: its kernel is a scalar loop with integer divisions per element.)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

Ints = Sequence[int]


def _extent(kernel: Ints, dilation: Ints) -> list[int]:
    return [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]


def _pad_arg(padding: Ints) -> list[int]:
    # F.pad takes (left, right) pairs starting from the last dimension.
    return [p for pad in reversed(padding) for p in (pad, pad)]


def _windows(
    x: torch.Tensor, kernel: Ints, out_size: Ints, stride: Ints, padding: Ints, dilation: Ints
) -> torch.Tensor:
    """View ``x`` ``[N, C, *S]`` as windows ``[N, C, *out_size, *kernel]`` (copies only to pad)."""
    dim = len(kernel)
    if any(padding):
        x = F.pad(x, _pad_arg(padding))
    extent = _extent(kernel, dilation)
    for i in range(dim):
        # unfold appends the window dimension last; it may yield more windows than out_size
        # (a transposed conv whose output_padding >= stride), so keep the first out_size.
        x = x.unfold(2 + i, extent[i], stride[i]).narrow(2 + i, 0, out_size[i])
    if any(d > 1 for d in dilation):
        x = x[(..., *(slice(None, None, d) for d in dilation))]
    return x


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

    ``out_size`` is the number of windows per spatial dimension (normally the conv's output
    size; it may be smaller than what fits).

    >>> x = torch.arange(16.0).view(1, 1, 4, 4)
    >>> im2col(x, (3, 3), (2, 2), (1, 1), (0, 0), (1, 1), 1).shape
    torch.Size([1, 9, 4])
    """
    dim = len(kernel)
    n, c = x.shape[:2]
    win = _windows(x, kernel, out_size, stride, padding, dilation)
    # [N, C, *O, *k] -> [C, *k, N, *O]; the reshape is the one copy.
    order = [1, *range(2 + dim, 2 + 2 * dim), 0, *range(2, 2 + dim)]
    rows = c // groups * math.prod(kernel)
    return win.permute(order).reshape(groups, rows, n * math.prod(out_size))


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
    sum of the column entries that were copied from it. Returns a contiguous tensor.

    >>> x = torch.ones(1, 1, 3, 3)
    >>> cols = im2col(x, (2, 2), (2, 2), (1, 1), (0, 0), (1, 1), 1)
    >>> col2im(cols, x.shape, (2, 2), (2, 2), (1, 1), (0, 0), (1, 1))[0, 0]
    tensor([[1., 2., 1.],
            [2., 4., 2.],
            [1., 2., 1.]])
    """
    n, c = input_shape[:2]
    spatial = list(input_shape[2:])
    padded = [s + 2 * p for s, p in zip(spatial, padding, strict=True)]
    g = cols.reshape(c, *kernel, n, *out_size)
    out = cols.new_zeros(n, c, *padded)
    # One strided slice-add per kernel offset: the rows of that offset go back to the input
    # positions they were copied from (stride apart, shifted by offset * dilation).
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = [slice(o * d, o * d + (size - 1) * st + 1, st)
                  for o, d, size, st in zip(offset, dilation, out_size, stride, strict=True)]
        out.transpose(0, 1)[(slice(None), slice(None), *window)] += g[(slice(None), *offset)]
    for i, (p, s) in enumerate(zip(padding, spatial, strict=True)):
        if p:
            out = out.narrow(2 + i, p, s)
    return out.contiguous()
