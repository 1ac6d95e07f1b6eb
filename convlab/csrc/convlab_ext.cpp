// convlab_ext: two of ATen's convolution-backward entry points, called from C++.
//
// Lean on purpose: only <torch/library.h> and the two ATen/ops headers, no pybind11
// (torch/extension.h), so a cold build takes seconds instead of a minute. The ops are
// registered with TORCH_LIBRARY and reached from Python as torch.ops.convlab_ext.<op>.
//
// Both kernels are device-agnostic: at::convolution_backward and
// at::_slow_conv2d_backward_out go through the dispatcher, which picks the CPU or CUDA
// (cuDNN, ...) implementation from the tensors' device. No CUDA code is compiled here.

#include <ATen/ops/_slow_conv2d_backward.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <array>
#include <tuple>

namespace {

// ATen's signature, forwarded unchanged. Masked-off outputs come back undefined (None).
std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  return at::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
                                  dilation, transposed, output_padding, groups, output_mask);
}

// The explicit-buffer call of the old thnn_conv2d_backward, for today's ATen: the three
// outputs are the caller's tensors, resized in place when their shape is wrong.
// The slow kernel reads input and grad_output as contiguous NCHW, so make them so.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> slow_conv2d_backward_out(
    at::Tensor& grad_input, at::Tensor& grad_weight, at::Tensor& grad_bias,
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(input.dim() == 4, "slow_conv2d_backward_out: input must be 4-d [N, C, H, W], got ",
              input.dim(), "-d");
  TORCH_CHECK(kernel_size.size() == 2 && stride.size() == 2 && padding.size() == 2,
              "slow_conv2d_backward_out: kernel_size, stride and padding need 2 values each");
  at::_slow_conv2d_backward_out(grad_input, grad_weight, grad_bias, grad_output.contiguous(),
                                input.contiguous(), weight.contiguous(), kernel_size, stride,
                                padding);
  return std::forward_as_tuple(grad_input, grad_weight, grad_bias);
}

}  // namespace

TORCH_LIBRARY(convlab_ext, m) {
  m.def(
      "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, int[]? bias_sizes, "
      "int[] stride, int[] padding, int[] dilation, bool transposed, int[] output_padding, "
      "int groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      &convolution_backward);
  m.def(
      "slow_conv2d_backward_out(Tensor(a!) grad_input, Tensor(b!) grad_weight, "
      "Tensor(c!) grad_bias, Tensor grad_output, Tensor input, Tensor weight, int[2] kernel_size, "
      "int[2] stride, int[2] padding) -> (Tensor(a!), Tensor(b!), Tensor(c!))",
      &slow_conv2d_backward_out);
}
