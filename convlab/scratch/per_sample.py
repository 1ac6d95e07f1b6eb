"""Per-sample gradients of a convolution's weight and bias.

A convolution's weight gradient is a sum over the batch,
``grad_weight = sum_n grad_output_n · columns_nᵀ`` (per group). Keeping the terms of that
sum apart instead of adding them gives every sample's own gradient, which is what
differentially private training (DP-SGD) clips, or what gradient-noise and influence
estimates need. Two routes compute all of them at once:

* ``"grouped"``: fold the batch into the channels and run **one grouped weight-gradient
  convolution** (``groups * N`` groups) on whatever backend ATen selects; this is what
  ``torch.func.vmap``'s batching rule for ``convolution_backward`` does, and the trick that
  Rochette, Manoel and Tramel (2019, https://arxiv.org/abs/1912.06015) describe. BackPACK's
  ``BatchGrad`` uses the same trick with input and ``grad_output`` in swapped roles (or,
  with ``weight_jac_t_save_memory``, their higher-order convolution);
  ExpandedWeights takes it for ungrouped convs below batch 32.
* ``"im2col"``: build the im2col columns and contract them with ``grad_output`` in one
  batched GEMM (an ``einsum``), as Opacus's grad sampler does (``F.unfold`` + ``einsum``)
  and ExpandedWeights otherwise; it materialises the columns,
  ``N * C_in * prod(k) * prod(O)`` values.

The bias gradient of sample ``n`` is ``grad_output_n`` summed over its positions.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from convlab.scratch.im2col import im2col
from convlab.scratch.params import ConvParams, IntOrSeq, check_same, check_tensor

__all__ = ["METHODS", "per_sample_bias_grad", "per_sample_weight_grad"]

METHODS: tuple[str, ...] = ("grouped", "im2col")


def _weight_size(weight_size: object) -> tuple[int, ...]:
    if isinstance(weight_size, str | bytes) or not isinstance(weight_size, Sequence | torch.Size):
        raise TypeError(f"weight_size must be a sequence of ints, got {weight_size!r}")
    try:
        size = tuple(operator.index(s) for s in weight_size if not isinstance(s, bool))
    except TypeError:
        raise TypeError(f"weight_size must be a sequence of ints, got {weight_size!r}") from None
    if len(size) != len(weight_size):
        raise TypeError(f"weight_size must be a sequence of ints, got {weight_size!r}")
    if len(size) < 3:
        raise ValueError(
            f"weight_size must be [C_out, C_in/groups, *kernel] with at least one spatial "
            f"dimension, got {list(size)}"
        )
    return size


def per_sample_weight_grad(
    input: torch.Tensor,
    weight_size: Sequence[int],
    grad_output: torch.Tensor,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    method: str = "grouped",
) -> torch.Tensor:
    """Weight gradient of each sample of a (non-transposed) N-d convolution.

    Arguments follow :func:`torch.nn.grad.conv2d_weight` (ints or tuples).
    Shapes: input ``[N, C_in, *S]``, weight_size ``[C_out, C_in/groups, *k]``,
    grad_output ``[N, C_out, *O]``. ``method`` is ``"grouped"`` (one grouped convolution
    backward, no column buffer) or ``"im2col"`` (columns and a batched GEMM).
    Returns ``[N, C_out, C_in/groups, *k]``; its sum over the first dimension is the usual
    ``grad_weight``.

    >>> x, go = torch.randn(4, 3, 8, 8), torch.randn(4, 6, 6, 6)
    >>> per_sample_weight_grad(x, (6, 3, 3, 3), go).shape
    torch.Size([4, 6, 3, 3, 3])
    """
    check_tensor(input, "input")
    check_tensor(grad_output, "grad_output")
    check_same(input, grad_output, "input", "grad_output")
    weight_size = _weight_size(weight_size)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    p = ConvParams.create(len(weight_size) - 2, stride, padding, dilation, False, 0, groups)
    p.check_shapes(tuple(input.shape), weight_size)
    expected = p.output_shape(tuple(input.shape), weight_size)
    if tuple(grad_output.shape) != expected:
        raise ValueError(
            f"grad_output must have the forward output's shape {list(expected)}, "
            f"got {list(grad_output.shape)}"
        )
    n = input.shape[0]
    if n == 0 or math.prod(weight_size) == 0:
        return input.new_zeros((n, *weight_size))
    if method == "grouped":
        return _grouped(input, weight_size, grad_output, p)
    return _im2col(input, weight_size, grad_output, p, expected[2:])


def _grouped(input: torch.Tensor, weight_size: tuple[int, ...], grad_output: torch.Tensor,
             p: ConvParams) -> torch.Tensor:
    """Samples as groups: input ``[1, N*C_in, *S]``, grad_output ``[1, N*C_out, *O]``,
    ``N * groups`` groups; the grouped weight gradient ``[N*C_out, C_in/groups, *k]`` holds
    every sample's gradient, one block of C_out rows per sample."""
    n = input.shape[0]
    x = input.reshape(1, n * input.shape[1], *input.shape[2:])
    gy = grad_output.reshape(1, n * grad_output.shape[1], *grad_output.shape[2:])
    # Only the weight's shape matters for grad_weight: a zero-stride placeholder.
    placeholder = input.new_zeros(()).expand(n * weight_size[0], *weight_size[1:])
    stride, padding, dilation, transposed, output_padding, groups = p.aten_args()
    grad = torch.ops.aten.convolution_backward.default(
        gy, x, placeholder, None, stride, padding, dilation, transposed, output_padding,
        groups * n, [False, True, False],
    )[1]
    return grad.reshape(n, *weight_size)


def _im2col(input: torch.Tensor, weight_size: tuple[int, ...], grad_output: torch.Tensor,
            p: ConvParams, out_size: Sequence[int]) -> torch.Tensor:
    n, g = input.shape[0], p.groups
    positions = math.prod(out_size)
    # Columns [G, C/G*k, N*L]: the sample index is the outer part of the last dimension.
    cols = im2col(input, weight_size[2:], out_size, p.stride, p.padding, p.dilation, g)
    cols = cols.reshape(g, cols.shape[1], n, positions)
    gy = grad_output.reshape(n, g, weight_size[0] // g, positions)
    # One GEMM per (sample, group): [K/G, L] @ [L, C/G*k].
    grads = torch.einsum("ngol,gcnl->ngoc", gy, cols)
    return grads.reshape(n, *weight_size)


def per_sample_bias_grad(grad_output: torch.Tensor) -> torch.Tensor:
    """Bias gradient of each sample: ``grad_output [N, C_out, *O]`` summed over ``O``.

    Returns ``[N, C_out]``; its sum over the first dimension is the usual ``grad_bias``.

    >>> per_sample_bias_grad(torch.ones(2, 3, 4, 4))[0]
    tensor([16., 16., 16.])
    """
    check_tensor(grad_output, "grad_output")
    if grad_output.dim() < 3:
        raise ValueError(
            f"grad_output must be [N, C_out, *O] with at least one spatial dimension, "
            f"got shape {list(grad_output.shape)}"
        )
    return grad_output.sum(dim=tuple(range(2, grad_output.dim())))
