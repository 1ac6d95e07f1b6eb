"""The fast reference's grad_input: per-sample columns, batched GEMMs, output in place.

The simple reference (:mod:`convlab.scratch.reference`) folds the batch into the columns
(``[G, C/G*k, N*L]``), so each GEMM is one big matrix product, but a product that makes a
gradient comes out as ``[K, n*L]`` and needs a copy back to ``[n, K, *O]`` per chunk, and
a ``cat`` of the chunks. Here the columns keep unfold's per-sample layout
``[n, C*k, L]``, as ATen's slow path does (one ``[C*k, L]`` matrix per sample), and the
GEMMs are batched over the samples:

* gather (stride 1) is a forward of the padded ``gy``:
  ``W [G, C/G, K/G*k] @ cols [n, G, K/G*k, L]`` lands straight in ``out[n]``, which
  already is ``[n, C, *S]``;
* scatter (any stride): per sample ``Wᵀ @ gy[n]`` (``gy`` read as it lies) into a column
  buffer, then one slice-add per kernel offset.

One column buffer per call serves every chunk of samples; a chunk holds as many samples
as fit ``limit`` bytes of columns. grad_weight keeps the batch-folded GEMM (one long
inner dimension ``N*L``): per-sample products summed over the batch were slower on
every layer timed (:mod:`convlab.aten.fast_reference`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from convlab.scratch import reference
from convlab.scratch.im2col import sample_columns, tap_windows
from convlab.scratch.params import ConvParams

__all__ = ["grad_input"]


def _chunks(n: int, sample_bytes: int, limit: int) -> tuple[list[slice], int]:
    """Batch slices of at most ``limit`` bytes (at least one sample each), and their size."""
    most = max(1, limit // max(1, sample_bytes))
    step = max(1, math.ceil(n / max(1, math.ceil(n / most))))
    return [slice(i, min(n, i + step)) for i in range(0, n, step)], step


def _forward(x: torch.Tensor, w: torch.Tensor, out_size: Sequence[int], p: ConvParams,
             limit: int) -> torch.Tensor:
    """Normal convolution ``[N, C, *S] -> [N, K, *out_size]``, chunk by chunk: per sample
    ``W [G, K/G, C/G*k] @ cols [G, C/G*k, L]``, written straight into the output."""
    n, c, k, g = x.shape[0], x.shape[1], w.shape[0], p.groups
    kernel = w.shape[2:]
    ck, positions = c // g * math.prod(kernel), math.prod(out_size)
    slices, step = _chunks(n, c * math.prod(kernel) * positions * x.element_size(), limit)
    buf = x.new_empty(min(step, n), c * math.prod(kernel), positions)
    y = x.new_empty(n, k, *out_size)
    w_mat = w.reshape(g, k // g, ck)
    for s in slices:
        m = s.stop - s.start
        cols = sample_columns(buf[:m], x[s], kernel, out_size, p.stride, p.padding,
                              p.dilation).view(m, g, ck, positions)
        torch.matmul(w_mat, cols, out=y[s].view(m, g, k // g, positions))
    return y


def _grad_input_gather(gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int],
                       p: ConvParams, limit: int) -> torch.Tensor:
    """Stride 1: the forward of :func:`convlab.scratch.reference.gather_operands`."""
    gy, w_t, unit = reference.gather_operands(gy, w, input_shape, p)
    return _forward(gy, w_t, input_shape[2:], unit, limit)


def _grad_input_scatter(gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int],
                        p: ConvParams, limit: int) -> torch.Tensor:
    """Any stride: per sample ``Wᵀ @ gy[n]`` (columns), then one slice-add per offset."""
    n, k, g, c = gy.shape[0], gy.shape[1], p.groups, input_shape[1]
    kernel, out_size = w.shape[2:], gy.shape[2:]
    ck, positions = c // g * math.prod(kernel), math.prod(out_size)
    w_t = w.reshape(g, k // g, ck).transpose(1, 2)  # [G, C/G*k, K/G]
    padded = [s + 2 * q for s, q in zip(input_shape[2:], p.padding, strict=True)]
    gi = gy.new_zeros(n, c, *padded)
    slices, step = _chunks(n, c * math.prod(kernel) * positions * gy.element_size(), limit)
    buf = gy.new_empty(min(step, n), g, ck, positions)
    for s in slices:
        m = s.stop - s.start
        cols = torch.matmul(w_t, gy[s].reshape(m, g, k // g, positions), out=buf[:m])
        per_offset = cols.view(m, c, *kernel, *out_size)
        target = gi[s]
        for offset, window in tap_windows(kernel, out_size, p.stride, p.dilation):
            target[(slice(None), slice(None), *window)].add_(
                per_offset[(slice(None), slice(None), *offset)])
    crop = tuple(slice(q, q + s) for q, s in zip(p.padding, input_shape[2:], strict=True))
    return gi[(slice(None), slice(None), *crop)].contiguous()


def grad_input(gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int],
               p: ConvParams, limit: int) -> torch.Tensor:
    """grad_input ``[N, C, *S]`` of a normal convolution (``gy`` ``[N, K, *O]``, ``w``
    ``[K, C/G, *k]``, more than one input channel per group), for plain tensors under
    ``no_grad`` (:mod:`convlab.aten.fast_reference` checks both). ``limit``: column bytes
    per chunk of samples.

    With stride 1, no more output than input channels and a finite weight, the gather
    (a forward of the padded ``gy``, fewer columns), else the scatter (exact for any
    weight, as ATen's col2im adds only real products).
    """
    if p.transposed:
        raise ValueError("grad_input serves normal convolutions (a transposed one's "
                         "grad_input is a forward)")
    gather = (all(s == 1 for s in p.stride) and w.shape[0] <= input_shape[1]
              and reference.all_finite(w))
    return (_grad_input_gather if gather else _grad_input_scatter)(gy, w, input_shape, p,
                                                                   limit)
