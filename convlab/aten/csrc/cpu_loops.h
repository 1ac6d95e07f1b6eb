// cpu_loops.h: what convlab's own CPU loops (depthwise.cpp, col2im.cpp,
// per_sample.cpp) share, and the ops they define for convlab_ext.cpp to
// register. Everything here is inline or a template, in namespace
// convlab_ext, so each source compiles alone.

#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/Version.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace convlab_ext {

// The plane loop compiled three times, for AVX-512, for AVX2+FMA and for the
// baseline (x86-64: SSE2), and picked by ATen's CPU capability, as ATen's own
// DispatchStub kernels are: ATEN_CPU_CAPABILITY caps it the same way, and the
// build does not depend on the building machine's ISA.
#if defined(__x86_64__) && defined(__GNUC__)
#define CONVLAB_X86 1
#define CONVLAB_AVX512                                                        \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,"        \
                        "prefer-vector-width=512")))
#define CONVLAB_AVX2 __attribute__((target("avx2,fma")))
#else
#define CONVLAB_X86 0
#endif
// Plain copy loops, not memcpy calls: the rows are a few dozen values.
#define CONVLAB_NO_MEMCPY \
  __attribute__((optimize("no-tree-loop-distribute-patterns")))

// The independent lanes of a loop's partial sums (the flat depthwise loop,
// all_finite).
constexpr int64_t kLanes = 32;

// Which compiled plane loop ATen's capability selects: "avx512", "avx2" or
// "default" (also every non-x86 build).
inline std::string depthwise2d_variant() {
#if CONVLAB_X86
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512") return "avx512";
  if (capability == "AVX2") return "avx2";
#endif
  return "default";
}

// Whether all n values are finite: v * 0 is NaN exactly when v is not, summed
// in kLanes independent lanes so the loop vectorises.
template <typename T>
bool all_finite(const T* v, int64_t n) {
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += v[i + l] * T(0);
  }
  T probe = 0;
  for (; i < n; ++i) probe += v[i] * T(0);
  for (int64_t l = 0; l < kLanes; ++l) probe += lanes[l];
  return probe == T(0);
}

// The checks every one of convlab's CPU loops makes of its two tensors: CPU,
// one dtype, float32 or float64, contiguous (messages name the op and both).
inline void check_cpu_float_pair(const char* op, const at::Tensor& a,
                          const char* a_name, const at::Tensor& b,
                          const char* b_name) {
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), op, ": CPU only");
  TORCH_CHECK(a.scalar_type() == b.scalar_type() &&
                  (a.scalar_type() == at::kFloat ||
                   a.scalar_type() == at::kDouble),
              op, ": ", a_name, " and ", b_name,
              " must both be float32 or float64");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), op, ": ", a_name,
              " and ", b_name, " must be contiguous");
}

// MKL (linked into libtorch_cpu on x86) threads each GEMM by its own count,
// also when the GEMM is called from inside one of ATen's parallel regions
// (at::set_num_threads sets that count per thread and turns MKL's dynamic
// adjustment off): two threads each calling at::mm_out ran two GEMM threads
// each on two cores (measured: the per-sample columns' GEMMs of a 5x5 stem
// took x1.4 of their time with MKL_NUM_THREADS=1). SerialBlas sets the
// calling thread's MKL count to one for its life and restores it after
// (MKL's thread-local setting, MKL_Set_Num_Threads_Local, the C entry that
// mkl.h's lower-case name stands for; a no-op where torch has no MKL).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
struct SerialBlas {
  int previous = 0;
  SerialBlas() {
    if (MKL_Set_Num_Threads_Local) previous = MKL_Set_Num_Threads_Local(1);
  }
  ~SerialBlas() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous);
  }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;
};

// The ops convlab_ext.cpp registers, one family per source file.

// depthwise.cpp: the one-pass backward of a 2-d depthwise convolution.
std::tuple<at::Tensor, at::Tensor> depthwise2d_backward(
    const at::Tensor& grad_output_, const at::Tensor& input_,
    const at::Tensor& weight_, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation);

// col2im.cpp: col2im alone, and after each sample's GEMM (grad_input).
at::Tensor& col2im_add_(at::Tensor& out, const at::Tensor& cols,
                        at::IntArrayRef kernel_size,
                        at::IntArrayRef output_size, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation);
at::Tensor grad_input_by_sample(const at::Tensor& grad_output,
                                const at::Tensor& weight,
                                at::IntArrayRef input_size,
                                at::IntArrayRef stride,
                                at::IntArrayRef padding,
                                at::IntArrayRef dilation, int64_t groups);

// per_sample.cpp: every sample's weight gradient without a column buffer.
at::Tensor per_sample_weight_grad(const at::Tensor& input,
                                  const at::Tensor& grad_output,
                                  at::IntArrayRef kernel_size,
                                  at::IntArrayRef stride,
                                  at::IntArrayRef padding,
                                  at::IntArrayRef dilation, int64_t groups);

}  // namespace convlab_ext
