// Convolution backward from C++ with libtorch, three ways, checked against
// each other:
//   1. at::convolution_backward: the one entry point every backend shares;
//   2. at::convolution_backward_out: the same into caller-owned tensors
//      (generated out= variant: it computes into temporaries, then copies);
//   3. at::_slow_conv2d_backward_out: the im2col kernel's op, into caller
//      buffers.
// Run with the argument "abort-demo" to make the empty-batch call that aborts,
// "out-limits" to print the errors of the out= calls' unsupported uses, or
// "force-slow" to run a float32 backward with oneDNN switched off by a guard
// that restores ATen's process-wide flag (also when an exception leaves it).
// Builds against libtorch 2.0 and later (C++17 up to 2.11, C++20 from 2.12:
// CMakeLists.txt picks it). An absent bias_sizes is at::OptionalIntArrayRef{},
// whose default constructor every version has: std::nullopt does not convert
// to it on 2.0 and 2.1, and in 2.13 c10::nullopt is a deprecated alias of
// std::nullopt (c10/util/Optional.h), gone under -DC10_NODEPRECATED. An absent
// bias is an undefined at::Tensor.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <ATen/ops/_slow_conv2d_backward.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <functional>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace {

// Largest absolute difference between two tensors of the same shape.
double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

const char* verdict(double diff) {
  return diff < 1e-10 ? "match" : "MISMATCH";
}

// Runs `call` and prints the first line of the c10::Error it throws.
void first_error_line(const char* label, const std::function<void()>& call) {
  try {
    call();
    std::printf("%s: no error\n", label);
  } catch (const c10::Error& err) {
    const std::string what = err.what_without_backtrace();
    std::printf("%s: %s\n", label, what.substr(0, what.find('\n')).c_str());
  }
}

// Names of the ops that start while the recorder is installed (main thread
// only).
std::vector<std::string> recorded_ops;

std::unique_ptr<at::ObserverContext> record_op(const at::RecordFunction& fn) {
  recorded_ops.emplace_back(fn.name());
  return nullptr;
}

// Runs `call` with the recorder installed; returns the ops that started.
std::vector<std::string> ops_started_in(const std::function<void()>& call) {
  recorded_ops.clear();
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(record_op)
          .scopes({at::RecordScope::FUNCTION}));
  try {
    call();
  } catch (...) {
    at::removeCallback(handle);
    throw;
  }
  at::removeCallback(handle);
  return recorded_ops;
}

bool contains(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const char* on_off(bool flag) {
  return flag ? "on" : "off";
}

// Sets ATen's oneDNN flag (torch.backends.mkldnn.enabled) for the guard's
// lifetime, and puts back the value it found when the scope ends, by return
// or by exception. The flag is a plain bool of the one process-wide
// at::Context, not thread-local: every thread's convolutions see it while
// the guard lives.
class MkldnnFlagGuard {
 public:
  explicit MkldnnFlagGuard(bool enabled)
      : saved_(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(enabled);
  }
  ~MkldnnFlagGuard() { at::globalContext().setUserEnabledMkldnn(saved_); }
  MkldnnFlagGuard(const MkldnnFlagGuard&) = delete;
  MkldnnFlagGuard& operator=(const MkldnnFlagGuard&) = delete;

 private:
  bool saved_;
};

}  // namespace

int main(int argc, char** argv) {
  at::manual_seed(0);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const std::array<int64_t, 2> stride{1, 1}, padding{1, 1}, dilation{1, 1};
  const std::array<int64_t, 2> output_padding{0, 0};
  const std::array<bool, 3> mask{true, true, true};

  if (argc > 1 && std::string(argv[1]) == "abort-demo") {
    // Empty batch, bias_sizes=nullopt, grad_bias requested: the Empty branch
    // dereferences the missing bias sizes. OptionalArrayRef's operator* is
    // noexcept, so its bad_optional_access calls std::terminate: the catch
    // below never runs and the process aborts.
    auto x = at::randn({0, 3, 8, 8}, opts), w = at::randn({4, 3, 3, 3}, opts);
    auto go = at::randn({0, 4, 8, 8}, opts);
    try {
      at::convolution_backward(go, x, w, at::OptionalIntArrayRef{}, stride,
                               padding, dilation, false, output_padding, 1,
                               mask);
    } catch (const std::exception& err) {
      std::printf("caught: %s\n", err.what());
      return 1;
    }
    std::puts("returned normally");
    return 0;
  }

  if (argc > 1 && std::string(argv[1]) == "force-slow") {
    // float32, which oneDNN serves on the CPU (float64 always runs the slow
    // kernel). The backend is selected inside at::convolution_backward, from
    // the flags as they are when it runs; the recorder shows which kernel ran.
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    auto x = at::randn({2, 3, 8, 8}, f32), w = at::randn({4, 3, 3, 3}, f32);
    auto go = at::randn({2, 4, 8, 8}, f32);
    const std::array<int64_t, 1> bias_sizes{4};
    std::tuple<at::Tensor, at::Tensor, at::Tensor> grads;
    auto backward = [&] {
      grads = at::convolution_backward(go, x, w, bias_sizes, stride, padding,
                                       dilation, false, output_padding, 1,
                                       mask);
    };
    const char* slow = "aten::_slow_conv2d_backward";
    const bool before = at::globalContext().userEnabledMkldnn();
    std::printf("oneDNN flag before: %s\n", on_off(before));
    const bool default_slow = contains(ops_started_in(backward), slow);
    std::printf("default backward ran %s: %s\n", slow,
                default_slow ? "yes" : "no");
    const auto [gi, gw, gb] = grads;
    bool forced_slow = false;
    {
      MkldnnFlagGuard no_onednn(false);
      std::printf("inside the guard, oneDNN flag: %s\n",
                  on_off(at::globalContext().userEnabledMkldnn()));
      forced_slow = contains(ops_started_in(backward), slow);
    }
    const bool after = at::globalContext().userEnabledMkldnn();
    std::printf("forced backward ran %s: %s\n", slow,
                forced_slow ? "yes" : "no");
    const auto& [gi_s, gw_s, gb_s] = grads;
    const double d = std::max(
        {max_diff(gi, gi_s), max_diff(gw, gw_s), max_diff(gb, gb_s)});
    // The two kernels sum in different orders: equal up to float32 rounding.
    const bool close = d < 1e-4;
    std::printf("forced vs default, largest difference < 1e-4: %s\n",
                close ? "match" : "MISMATCH");
    std::printf("oneDNN flag after the guard: %s\n", on_off(after));
    try {
      MkldnnFlagGuard no_onednn(false);
      TORCH_CHECK(false, "thrown inside the guard");
    } catch (const c10::Error& err) {
      const std::string what = err.what_without_backtrace();
      std::printf("caught \"%s\"; oneDNN flag after the guard: %s\n",
                  what.substr(0, what.find('\n')).c_str(),
                  on_off(at::globalContext().userEnabledMkldnn()));
    }
    const bool restored =
        after == before && at::globalContext().userEnabledMkldnn() == before;
    const bool changed = forced_slow && !default_slow;
    return close && restored && (changed || !at::hasMKLDNN()) ? 0 : 1;
  }

  auto x = at::randn({2, 3, 8, 8}, opts);
  auto w = at::randn({4, 3, 3, 3}, opts);
  if (argc > 1 && std::string(argv[1]) == "out-limits") {
    // The uses of the two out= calls that throw (each error is caught).
    auto go = at::randn({2, 4, 8, 8}, opts);
    const std::array<int64_t, 1> bias_sizes{4};
    auto buffers = [&] {
      return std::array<at::Tensor, 3>{at::empty({0}, opts),
                                       at::empty({0}, opts),
                                       at::empty({0}, opts)};
    };
    first_error_line("convolution_backward_out, mask {1, 0, 0}", [&] {
      auto b = buffers();
      at::convolution_backward_out(b[0], b[1], b[2], go, x, w, bias_sizes,
                                   stride, padding, dilation, false,
                                   output_padding, 1, {true, false, false});
    });
    first_error_line("convolution_backward_out, undefined out1, out2", [&] {
      at::Tensor gi = at::empty({0}, opts), none1, none2;
      at::convolution_backward_out(gi, none1, none2, go, x, w, bias_sizes,
                                   stride, padding, dilation, false,
                                   output_padding, 1, {true, false, false});
    });
    first_error_line("_slow_conv2d_backward_out, undefined grad_weight", [&] {
      at::Tensor gi = at::empty({0}, opts), none1, none2;
      at::_slow_conv2d_backward_out(gi, none1, none2, go, x, w,
                                    w.sizes().slice(2), stride, padding);
    });
    return 0;
  }
  auto y = at::convolution(x, w, at::Tensor{}, stride, padding, dilation, false,
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
  const auto ops = ops_started_in([&] {
    at::convolution_backward_out(gi2, gw2, gb2, go, x, w, bias_sizes, stride,
                                 padding, dilation, false, output_padding, 1,
                                 mask);
  });
  // The generated out= kernel calls the functional op, then copies into our
  // tensors.
  auto first = [&ops](const char* name) {
    return std::find(ops.begin(), ops.end(), name) - ops.begin();
  };
  const auto n_ops = static_cast<long>(ops.size());
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
