// convlab_ext: two of ATen's convolution-backward entry points, called from
// C++.
//
// Lean on purpose: only <torch/library.h> and a few ATen headers, no pybind11
// (torch/extension.h), so a cold build takes seconds instead of a minute. The
// ops are registered with TORCH_LIBRARY and reached from Python as
// torch.ops.convlab_ext.<op>.
//
// Both kernels are device-agnostic: at::convolution_backward and
// at::_slow_conv2d_backward_out go through the dispatcher, which picks the CPU
// or CUDA (cuDNN, ...) implementation from the tensors' device. No CUDA code is
// compiled here.
//
// depthwise2d_backward, col2im_add_, grad_input_by_sample and
// per_sample_weight_grad are convlab's own CPU code (no ATen conv kernel),
// registered here and defined beside this file, one kernel family per file:
// depthwise.cpp (the fused one-pass backward of a 2-d depthwise convolution),
// col2im.cpp (col2im in one pass, alone or after each sample's GEMM, that
// convlab.aten.fast_reference uses for grad_input) and per_sample.cpp (every
// sample's weight gradient without a column buffer, that
// convlab.aten.fast_per_sample uses); cpu_loops.h holds what they share.

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_slow_conv2d_backward.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_loops.h"

namespace {

// ATen's signature, forwarded unchanged. Masked-off outputs come back
// undefined (None).
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, at::OptionalIntArrayRef bias_sizes,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  return at::convolution_backward(grad_output, input, weight, bias_sizes,
                                  stride, padding, dilation, transposed,
                                  output_padding, groups, output_mask);
}

using Named = std::pair<const at::Tensor*, const char*>;

// An out= buffer of the wrong shape is resized, and resize_ keeps a storage
// that is big enough and writes from the buffer's offset. Whether that stays
// inside the buffer is a fact about its storage, not about autograd's view
// bookkeeping: big.narrow(0, 10, 2).detach() is no view, yet shares big's
// storage. The rule of convlab/scratch/storage.py: resize only a buffer that
// spans its whole storage, or a contiguous one that already has the elements
// the new shape needs. A buffer of the right shape must not overlap the other
// arguments (the kernel would read what it has already overwritten).
bool safe_to_resize(const at::Tensor& buf, at::IntArrayRef shape) {
  int64_t extent = buf.numel() == 0 ? 0 : 1;
  if (extent) {
    for (int64_t d = 0; d < buf.dim(); ++d) {
      extent += (buf.size(d) - 1) * buf.stride(d);
    }
  }
  const bool spans =
      buf.storage_offset() == 0 &&
      extent * static_cast<int64_t>(buf.element_size()) ==
          static_cast<int64_t>(buf.storage().nbytes());
  return spans ||
         (buf.is_contiguous() && c10::multiply_integers(shape) <= buf.numel());
}

void check_buffer(const Named& out, at::IntArrayRef shape,
                  const std::vector<Named>& others) {
  const at::Tensor& buf = *out.first;
  if (buf.sizes() != shape) {
    TORCH_CHECK(safe_to_resize(buf, shape), "slow_conv2d_backward_out: ",
                out.second,
                " has the wrong shape and shares its storage with memory "
                "outside it (a view, or a .detach()/.data of a slice): "
                "resizing it would write outside it");
    for (const auto& other : others) {
      TORCH_CHECK(!buf.is_alias_of(*other.first),
                  "slow_conv2d_backward_out: ", out.second,
                  " has the wrong shape and shares storage with ",
                  other.second);
    }
    return;
  }
  at::assert_no_internal_overlap(buf);
  for (const auto& other : others) {
    at::assert_no_overlap(buf, *other.first);
  }
}

// The explicit-buffer call of the old thnn_conv2d_backward, for today's ATen:
// the three outputs are the caller's tensors, resized in place when their
// shape is wrong. The slow kernel reads input and grad_output as contiguous
// NCHW, so make them so.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> slow_conv2d_backward_out(
    at::Tensor& grad_input, at::Tensor& grad_weight, at::Tensor& grad_bias,
    const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(input.dim() == 4 && weight.dim() == 4,
              "slow_conv2d_backward_out: input and weight must be 4-d, got ",
              input.dim(), "-d and ", weight.dim(), "-d");
  TORCH_CHECK(
      kernel_size.size() == 2 && stride.size() == 2 && padding.size() == 2,
      "slow_conv2d_backward_out: kernel_size, stride and padding need "
      "2 values each");
  const Named gi{&grad_input, "grad_input"}, gw{&grad_weight, "grad_weight"},
      gb{&grad_bias, "grad_bias"}, go{&grad_output, "grad_output"},
      x{&input, "input"}, w{&weight, "weight"};
  const int64_t out_channels = weight.size(0);
  check_buffer(gi, input.sizes(), {go, x, w, gw, gb});
  check_buffer(gw, weight.sizes(), {go, x, w, gi, gb});
  check_buffer(gb, at::IntArrayRef(&out_channels, 1), {go, x, w, gi, gw});
  at::_slow_conv2d_backward_out(grad_input, grad_weight, grad_bias,
                                grad_output.contiguous(), input.contiguous(),
                                weight.contiguous(), kernel_size, stride,
                                padding);
  return std::forward_as_tuple(grad_input, grad_weight, grad_bias);
}

}  // namespace

TORCH_LIBRARY(convlab_ext, m) {
  m.def(
      "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, "
      "int[]? bias_sizes, int[] stride, int[] padding, int[] dilation, "
      "bool transposed, int[] output_padding, int groups, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      &convolution_backward);
  m.def(
      "slow_conv2d_backward_out(Tensor(a!) grad_input, "
      "Tensor(b!) grad_weight, Tensor(c!) grad_bias, Tensor grad_output, "
      "Tensor input, Tensor weight, int[2] kernel_size, int[2] stride, "
      "int[2] padding) -> (Tensor(a!), Tensor(b!), Tensor(c!))",
      &slow_conv2d_backward_out);
  m.def(
      "depthwise2d_backward(Tensor grad_output, Tensor input, Tensor weight, "
      "int[2] stride, int[2] padding, int[2] dilation) -> (Tensor, Tensor)",
      &convlab_ext::depthwise2d_backward);
  m.def("depthwise2d_variant() -> str", &convlab_ext::depthwise2d_variant);
  m.def(
      "per_sample_weight_grad(Tensor input, Tensor grad_output, "
      "int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
      "int groups) -> Tensor",
      &convlab_ext::per_sample_weight_grad);
  m.def(
      "grad_input_by_sample(Tensor grad_output, Tensor weight, "
      "int[] input_size, int[] stride, int[] padding, int[] dilation, "
      "int groups) -> Tensor",
      &convlab_ext::grad_input_by_sample);
  m.def(
      "col2im_add_(Tensor(a!) out, Tensor cols, int[] kernel_size, "
      "int[] output_size, int[] stride, int[] padding, int[] dilation) -> "
      "Tensor(a!)",
      &convlab_ext::col2im_add_);
}
