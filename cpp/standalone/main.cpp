// Convolution backward from C++ with libtorch, three ways, checked against
// each other:
//   1. at::convolution_backward: the one entry point every backend shares;
//   2. at::convolution_backward_out: the same into caller-owned tensors
//      (generated out= variant: it computes into temporaries, then copies);
//   3. at::_slow_conv2d_backward_out: the im2col kernel's op, into caller
//      buffers.
// Run with the argument "abort-demo" to make the empty-batch call that aborts.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <ATen/ops/_slow_conv2d_backward.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

namespace {

// Largest absolute difference between two tensors of the same shape.
double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

const char* verdict(double diff) {
  return diff < 1e-10 ? "match" : "MISMATCH";
}

// Names of the ops that start while the recorder is installed (main thread
// only).
std::vector<std::string> recorded_ops;

std::unique_ptr<at::ObserverContext> record_op(const at::RecordFunction& fn) {
  recorded_ops.emplace_back(fn.name());
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  at::manual_seed(0);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const std::array<int64_t, 2> stride{1, 1}, padding{1, 1}, dilation{1, 1};
  const std::array<int64_t, 2> output_padding{0, 0};
  const std::array<bool, 3> mask{true, true, true};

  if (argc > 1 && std::string(argv[1]) == "abort-demo") {
    // Empty batch, bias_sizes=nullopt, grad_bias requested: the Empty branch
    // reads the missing bias sizes and the process aborts (bad optional
    // access).
    auto x = at::randn({0, 3, 8, 8}, opts), w = at::randn({4, 3, 3, 3}, opts);
    auto go = at::randn({0, 4, 8, 8}, opts);
    at::convolution_backward(go, x, w, std::nullopt, stride, padding,
                             dilation, false, output_padding, 1, mask);
    std::puts("returned normally");
    return 0;
  }

  auto x = at::randn({2, 3, 8, 8}, opts);
  auto w = at::randn({4, 3, 3, 3}, opts);
  auto y = at::convolution(x, w, std::nullopt, stride, padding, dilation, false,
                           output_padding, 1);
  auto go = at::randn(y.sizes(), opts);
  const std::array<int64_t, 1> bias_sizes{4};

  // 1. The shared entry point: returns (grad_input, grad_weight, grad_bias).
  auto [gi, gw, gb] = at::convolution_backward(
      go, x, w, bias_sizes, stride, padding, dilation, false, output_padding,
      1, mask);
  std::printf("sum grad_input  %.6f\n", gi.sum().item<double>());
  std::printf("sum grad_weight %.6f\n", gw.sum().item<double>());
  std::printf("sum grad_bias   %.6f\n", gb.sum().item<double>());

  // 2. Into caller-owned tensors. Record which ops run inside the out= call.
  auto gi2 = at::empty(x.sizes(), opts), gw2 = at::empty(w.sizes(), opts);
  auto gb2 = at::empty({4}, opts);
  const void* before = gi2.data_ptr();
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(record_op)
          .scopes({at::RecordScope::FUNCTION}));
  at::convolution_backward_out(gi2, gw2, gb2, go, x, w, bias_sizes, stride,
                               padding, dilation, false, output_padding, 1,
                               mask);
  at::removeCallback(handle);
  // The generated out= kernel calls the functional op, then copies into our
  // tensors.
  auto first = [](const char* name) {
    auto found = std::find(recorded_ops.begin(), recorded_ops.end(), name);
    return found - recorded_ops.begin();
  };
  const auto n_ops = static_cast<long>(recorded_ops.size());
  const long compute = first("aten::convolution_backward");
  const long copy = first("aten::copy_");
  std::printf("inside convolution_backward_out: aten::convolution_backward, "
              "then aten::copy_: %s\n",
              compute < copy && copy < n_ops ? "yes" : "no");
  std::printf("convolution_backward_out kept the caller's storage: %s\n",
              gi2.data_ptr() == before ? "yes" : "no");
  double d2 = std::max(
      {max_diff(gi, gi2), max_diff(gw, gw2), max_diff(gb, gb2)});
  std::printf("convolution_backward_out vs convolution_backward: %s\n",
              verdict(d2));

  // 3. The im2col kernel's op into caller buffers of size 0 (resized by the
  // kernel). No dilation or groups argument; kernel_size comes from the
  // weight.
  auto gi3 = at::empty({0}, opts), gw3 = at::empty({0}, opts);
  auto gb3 = at::empty({0}, opts);
  at::_slow_conv2d_backward_out(gi3, gw3, gb3, go, x, w, w.sizes().slice(2),
                                stride, padding);
  double d3 = std::max(
      {max_diff(gi, gi3), max_diff(gw, gw3), max_diff(gb, gb3)});
  std::printf("_slow_conv2d_backward_out vs convolution_backward: %s\n",
              verdict(d3));
  return d2 < 1e-10 && d3 < 1e-10 ? 0 : 1;
}
