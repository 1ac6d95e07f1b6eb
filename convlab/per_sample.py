"""Per-sample weight gradients from the im2col columns.

A convolution's weight gradient is a sum over the batch,
``grad_weight = sum_n grad_output_n · columns_nᵀ`` (per group). Keeping the terms of that
sum apart instead of adding them gives every sample's own gradient, which is what
differentially private training (DP-SGD) clips, or what gradient-noise and
influence estimates need. One batched GEMM computes all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from convlab.im2col import im2col
from convlab.params import ConvParams, IntOrSeq, check_same, check_tensor

__all__ = ["per_sample_weight_grad"]


def per_sample_weight_grad(
    input: torch.Tensor,
    weight_size: Sequence[int],
    grad_output: torch.Tensor,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
) -> torch.Tensor:
    """Weight gradient of each sample of a (non-transposed) N-d convolution.

    Arguments follow :func:`torch.nn.grad.conv2d_weight` (ints or tuples).
    Shapes: input ``[N, C_in, *S]``, weight_size ``[C_out, C_in/groups, *k]``,
    grad_output ``[N, C_out, *O]``. Returns ``[N, C_out, C_in/groups, *k]``; its sum over
    the first dimension is the usual ``grad_weight``.

    >>> x, go = torch.randn(4, 3, 8, 8), torch.randn(4, 6, 6, 6)
    >>> per_sample_weight_grad(x, (6, 3, 3, 3), go).shape
    torch.Size([4, 6, 3, 3, 3])
    """
    check_tensor(input, "input")
    check_tensor(grad_output, "grad_output")
    check_same(input, grad_output, "input", "grad_output")
    weight_size = tuple(int(s) for s in weight_size)
    if len(weight_size) < 3:
        raise ValueError(
            f"weight_size must be [C_out, C_in/groups, *kernel] with at least one spatial "
            f"dimension, got {list(weight_size)}"
        )
    p = ConvParams.create(len(weight_size) - 2, stride, padding, dilation, False, 0, groups)
    p.check_shapes(tuple(input.shape), weight_size)
    expected = p.output_shape(tuple(input.shape), weight_size)
    if tuple(grad_output.shape) != expected:
        raise ValueError(
            f"grad_output must have the forward output's shape {list(expected)}, "
            f"got {list(grad_output.shape)}"
        )
    n, g = input.shape[0], p.groups
    out_size = expected[2:]
    positions = math.prod(out_size)
    # Columns [G, C/G*k, N*L]: the sample index is the outer part of the last dimension.
    cols = im2col(input, weight_size[2:], out_size, p.stride, p.padding, p.dilation, g)
    cols = cols.reshape(g, cols.shape[1], n, positions)
    gy = grad_output.reshape(n, g, weight_size[0] // g, positions)
    # One GEMM per (sample, group): [K/G, L] @ [L, C/G*k].
    grads = torch.einsum("ngol,gcnl->ngoc", gy, cols)
    return grads.reshape(n, *weight_size)
