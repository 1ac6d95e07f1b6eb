"""The fast reference's grad_input: per-sample columns and col2im, as ATen's slow path.

The simple reference (:mod:`convlab.scratch.reference`) folds the batch into the columns
(``[G, C/G*k, N*L]``), so each GEMM is one big matrix product, but a product that makes a
gradient comes out as ``[K, n*L]`` and needs a copy back to ``[n, K, *O]`` per chunk, and
its col2im is one strided slice-add per kernel offset: ``k^2`` whole-chunk passes, each a
Python call. Here the columns keep unfold's per-sample layout ``[C*k, L]``, as ATen's
slow path does, and col2im is one pass of a small C++ loop (per (sample, channel) plane,
every column entry added onto the pixel it was copied from, entries that read padding
dropped), written straight into ``grad_input``. Two drivers:

* **by sample** (at least as many samples as threads): convlab's C++ op
  ``torch.ops.convlab_ext.grad_input_by_sample`` splits the samples over the threads;
  each thread makes one sample's columns ``W_gᵀ @ gy[n, g]`` with a single-threaded GEMM
  into its own buffer and col2im's them at once, while they are still in its core's
  cache. This is the structure of ATen's ``slow_conv2d_backward``. It needs MKL held to
  one thread per GEMM inside the parallel region (the op does that per thread, and puts
  it back): left to itself, MKL ran two threads per GEMM from each of the two threads.
* **batched** (fewer samples than threads, where splitting samples would idle a
  thread): the GEMMs of a chunk of samples as one batched ``matmul`` (threaded inside)
  into one column buffer, then ``torch.ops.convlab_ext.col2im_add_`` over the chunk's
  planes. A chunk holds as many samples as fit ``limit`` bytes of columns.

Measured on the AMD EPYC (2 threads, float32, grad_input alone over ATen's slow path,
interleaved, a noisy shared machine): the batched driver took the 1-d layer x1.05-1.38
and resnet14 x1.14-1.25 (its columns pass through memory between the GEMM and col2im,
and its GEMMs split thin matrices over threads); by sample, x1.10-1.11 and x1.04, the
3x3 64-channel layer x0.92, the 3-d layer x0.45 (ATen's 3-d path is not this one), and
the 3-channel 5x5 stem x0.96-0.98 once each thread allocated its own columns (x1.2-1.6
with one buffer of the calling thread, sliced per thread). In the whole backward
(records' ``reference_speed``) the 1-d layer stays x1.03-1.14 behind ATen's.
grad_weight keeps the batch-folded GEMM (one long inner dimension
``N*L``): per-sample products summed over the batch were slower on every layer timed
(:mod:`convlab.aten.fast_reference`).
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
    ops = extension.load().ops
    if n >= torch.get_num_threads():
        return ops.grad_input_by_sample(gy.contiguous(), w.contiguous(), list(input_shape),
                                        list(p.stride), list(p.padding), list(p.dilation),
                                        g)
    kernel, out_size = list(w.shape[2:]), list(gy.shape[2:])
    ck, positions = c // g * math.prod(kernel), math.prod(out_size)
    w_t = w.reshape(g, k // g, ck).transpose(1, 2)  # [G, C/G*k, K/G]
    gi = gy.new_zeros(n, c, *input_shape[2:])
    if n == 0:
        return gi
    slices = reference.sample_chunks(
        n, c * math.prod(kernel) * positions * gy.element_size(), limit)
    buf = gy.new_empty(min(slices[0].stop, n), g, ck, positions)
    for s in slices:
        m = min(s.stop, n) - s.start
        cols = torch.matmul(w_t, gy[s].reshape(m, g, k // g, positions), out=buf[:m])
        ops.col2im_add_(gi[s].view(m * c, *input_shape[2:]), cols.view(m * c, -1), kernel,
                        out_size, list(p.stride), list(p.padding), list(p.dilation))
    return gi
