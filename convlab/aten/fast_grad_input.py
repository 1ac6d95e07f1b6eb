"""The fast reference's grad_input: per-sample columns, batched GEMMs, col2im in C++.

The simple reference (:mod:`convlab.scratch.reference`) folds the batch into the columns
(``[G, C/G*k, N*L]``), so each GEMM is one big matrix product, but a product that makes a
gradient comes out as ``[K, n*L]`` and needs a copy back to ``[n, K, *O]`` per chunk, and
its col2im is one strided slice-add per kernel offset: ``k^2`` whole-chunk passes, each a
Python call. Here the columns keep unfold's per-sample layout ``[n, C*k, L]``, as ATen's
slow path does (one ``[C*k, L]`` matrix per sample):

* the GEMMs ``Wᵀ @ gy[n]`` are batched over the samples of a chunk (``gy`` read as it
  lies, ``[G, C/G*k, K/G] @ [n, G, K/G, L]``) into one column buffer;
* col2im is one pass of convlab's C++ loop, ``torch.ops.convlab_ext.col2im_add_``: per
  (sample, channel) plane, every column entry added onto the pixel it was copied from,
  entries that read padding dropped, the planes split over threads. It writes straight
  into ``grad_input`` (no padded copy to crop).

One column buffer per call serves every chunk of samples; a chunk holds as many samples
as fit ``limit`` bytes of columns. The C++ loop replaced ``k^2`` slice-adds per chunk
(and, with unit stride and no more output than input channels, a gather form: a forward
of the padded ``gy`` through an ``im2col`` copy of it). On the AMD EPYC (2 threads,
float32, grad_input alone over ATen's slow path, 8 L2 of columns per chunk) it took the
5x5 stem from x1.6-1.9 to x1.1-1.2 and the 3-d layer from 8.1 to 6.7 ms, and tied the
gather where that had run (1-d, resnet14, dilated: x0.97-1.02). grad_weight keeps the
batch-folded GEMM (one long inner dimension ``N*L``): per-sample products summed over the
batch were slower on every layer timed (:mod:`convlab.aten.fast_reference`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from convlab.aten import extension
from convlab.scratch import reference
from convlab.scratch.params import ConvParams

__all__ = ["grad_input"]


def grad_input(gy: torch.Tensor, w: torch.Tensor, input_shape: Sequence[int],
               p: ConvParams, limit: int) -> torch.Tensor:
    """grad_input ``[N, C, *S]`` of a normal convolution (``gy`` ``[N, K, *O]``, ``w``
    ``[K, C/G, *k]``), float32 or float64 plain tensors under
    ``no_grad`` (:mod:`convlab.aten.fast_reference` checks both). ``limit``: column bytes
    per chunk of samples.

    Exact for any weight: like ATen's col2im, the loop adds only the products of real
    (not padding) positions, so a non-finite weight gives what ATen gives.
    """
    if p.transposed:
        raise ValueError("grad_input serves normal convolutions (a transposed one's "
                         "grad_input is a forward)")
    n, k, g, c = gy.shape[0], gy.shape[1], p.groups, input_shape[1]
    kernel, out_size = list(w.shape[2:]), list(gy.shape[2:])
    ck, positions = c // g * math.prod(kernel), math.prod(out_size)
    w_t = w.reshape(g, k // g, ck).transpose(1, 2)  # [G, C/G*k, K/G]
    gi = gy.new_zeros(n, c, *input_shape[2:])
    if n == 0:
        return gi
    slices = reference.sample_chunks(
        n, c * math.prod(kernel) * positions * gy.element_size(), limit)
    buf = gy.new_empty(min(slices[0].stop, n), g, ck, positions)
    col2im_add_ = extension.load().ops.col2im_add_
    for s in slices:
        m = min(s.stop, n) - s.start
        cols = torch.matmul(w_t, gy[s].reshape(m, g, k // g, positions), out=buf[:m])
        col2im_add_(gi[s].view(m * c, *input_shape[2:]), cols.view(m * c, -1), kernel,
                    out_size, list(p.stride), list(p.padding), list(p.dilation))
    return gi
