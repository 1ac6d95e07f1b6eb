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
// per_sample_weight_grad are convlab's own CPU code (no ATen conv kernel): the
// fused one-pass backward of a 2-d depthwise convolution; col2im (every column
// entry added back onto the pixel it was copied from) in one pass, alone or
// after each sample's GEMM, that convlab.aten.fast_reference uses for
// grad_input; and every sample's weight gradient without a column buffer, that
// convlab.aten.fast_per_sample uses.

#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/_slow_conv2d_backward.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/Version.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

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

// One (sample, channel) plane of a depthwise backward, every tap, one pass over
// grad_output per tap: grad_input gets the scatter-adds w * g at the positions
// the forward read (never a padding product, as ATen's slow path), and
// acc[t * Wo + ow] the products g * x of tap t in output column ow (a padding
// position adds g * 0, as ATen's zero-padded columns do, so a non-finite g
// gives NaN there too). Keeping one partial sum per output column keeps the
// inner loops free of a reduction, so the compiler vectorises them.
template <typename T>
inline __attribute__((always_inline)) void depthwise_plane(
    const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
    T* __restrict__ gi, T* __restrict__ acc,
                     int64_t H, int64_t W, int64_t Ho, int64_t Wo, int64_t kh,
                     int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                     int64_t pw, int64_t dh, int64_t dw) {
  for (int64_t i = 0; i < kh; ++i) {
    for (int64_t j = 0; j < kw; ++j) {
      const int64_t t = i * kw + j;
      const T wt = w[t];
      T* a = acc + t * Wo;
      const int64_t off = j * dw - pw;
      // ow with 0 <= ow * sw + off < W
      int64_t lo = off >= 0 ? 0 : (-off + sw - 1) / sw;
      int64_t hi = W - 1 - off < 0 ? 0 : (W - 1 - off) / sw + 1;
      lo = std::min(lo, Wo);
      hi = std::max(lo, std::min(hi, Wo));
      for (int64_t oh = 0; oh < Ho; ++oh) {
        const T* grow = g + oh * Wo;
        const int64_t ih = oh * sh - ph + i * dh;
        if (ih < 0 || ih >= H) {
          for (int64_t ow = 0; ow < Wo; ++ow) a[ow] += grow[ow] * T(0);
          continue;
        }
        const T* xrow = x + ih * W;
        T* girow = gi + ih * W;
        for (int64_t ow = 0; ow < lo; ++ow) a[ow] += grow[ow] * T(0);
        if (sw == 1) {
          for (int64_t ow = lo; ow < hi; ++ow) {
            girow[ow + off] += wt * grow[ow];
            a[ow] += grow[ow] * xrow[ow + off];
          }
        } else {
          for (int64_t ow = lo; ow < hi; ++ow) {
            girow[ow * sw + off] += wt * grow[ow];
            a[ow] += grow[ow] * xrow[ow * sw + off];
          }
        }
        for (int64_t ow = hi; ow < Wo; ++ow) a[ow] += grow[ow] * T(0);
      }
    }
  }
}

// Stride 1, finite input and weight: one (sample, channel) plane copied into a
// zero-padded buffer xpad with row stride Wp, and grad_output onto the same row
// stride (gpad = gext + smax: zeros in its Wp - Wo extra columns, before it and
// after it), so that tap t pairs output q with padded input q + s_t,
// s_t = i * dh * Wp + j * dw, for every q: no bounds inside the loops.
// grad_weight of tap t: one flat dot product of gpad and xpad + s_t, summed in
// kLanes independent lanes (acc[t * kLanes + l]). grad_input at padded position
// p: the gather sum_t w_t * gpad[p - s_t] in registers, one store per position
// (gipad), the interior copied out. The extra columns hold g = 0 and add
// 0 * x = 0 and w * 0 = 0, which is why x and w must be finite here.
constexpr int64_t kLanes = 32;

template <typename T>
inline __attribute__((always_inline)) void depthwise_plane_flat(
    const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
    T* __restrict__ gi, T* __restrict__ acc, T* __restrict__ xpad,
    T* __restrict__ gext, T* __restrict__ gipad, int64_t H, int64_t W,
    int64_t Ho, int64_t Wo, int64_t kh, int64_t kw, int64_t ph, int64_t pw,
    int64_t dh, int64_t dw, int64_t Wp, int64_t span, int64_t padded) {
  const int64_t smax = (kh - 1) * dh * Wp + (kw - 1) * dw;
  T* __restrict__ gpad = gext + smax;
  for (int64_t q = 0; q < padded; ++q) xpad[q] = T(0);
  for (int64_t r = 0; r < H; ++r) {
    for (int64_t c = 0; c < W; ++c) xpad[(r + ph) * Wp + pw + c] = x[r * W + c];
  }
  for (int64_t r = 0; r < Ho; ++r) {
    for (int64_t c = 0; c < Wo; ++c) gpad[r * Wp + c] = g[r * Wo + c];
  }
  for (int64_t i = 0; i < kh; ++i) {
    for (int64_t j = 0; j < kw; ++j) {
      const int64_t t = i * kw + j;
      const T* __restrict__ xs = xpad + i * dh * Wp + j * dw;
      T sum[kLanes] = {};
      for (int64_t q = 0; q < span; q += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) sum[l] += gpad[q + l] * xs[q + l];
      }
      for (int64_t l = 0; l < kLanes; ++l) acc[t * kLanes + l] += sum[l];
    }
  }
  const int64_t first = ph * Wp, last = (ph + H) * Wp;
  for (int64_t p = first; p < last; p += kLanes) {
    T out[kLanes] = {};
    for (int64_t i = 0; i < kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        const T wt = w[i * kw + j];
        const T* __restrict__ src = gpad + p - i * dh * Wp - j * dw;
        for (int64_t l = 0; l < kLanes; ++l) out[l] += wt * src[l];
      }
    }
    for (int64_t l = 0; l < kLanes; ++l) gipad[p + l] = out[l];
  }
  for (int64_t r = 0; r < H; ++r) {
    for (int64_t c = 0; c < W; ++c) gi[r * W + c] = gipad[(r + ph) * Wp + pw + c];
  }
}

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
#define CONVLAB_PLANE_ARGS                                                    \
  int64_t H, int64_t W, int64_t Ho, int64_t Wo, int64_t kh, int64_t kw,       \
      int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw
#define CONVLAB_PLANE_CALL                                                    \
  depthwise_plane<T>(g, x, w, gi, acc, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw,  \
                     dh, dw)

template <typename T>
void plane_default(const T* g, const T* x, const T* w, T* gi, T* acc,
                   CONVLAB_PLANE_ARGS) {
  CONVLAB_PLANE_CALL;
}
#if CONVLAB_X86
template <typename T>
CONVLAB_AVX2 void plane_avx2(const T* g, const T* x, const T* w, T* gi, T* acc,
                             CONVLAB_PLANE_ARGS) {
  CONVLAB_PLANE_CALL;
}
template <typename T>
CONVLAB_AVX512 void plane_avx512(const T* g, const T* x, const T* w, T* gi,
                                 T* acc, CONVLAB_PLANE_ARGS) {
  CONVLAB_PLANE_CALL;
}
#endif

#define CONVLAB_FLAT_ARGS                                                     \
  T *xpad, T *gext, T *gipad, int64_t H, int64_t W, int64_t Ho, int64_t Wo,    \
      int64_t kh, int64_t kw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, \
      int64_t Wp, int64_t span, int64_t padded
#define CONVLAB_FLAT_CALL                                                     \
  depthwise_plane_flat<T>(g, x, w, gi, acc, xpad, gext, gipad, H, W, Ho, Wo,  \
                          kh, kw, ph, pw, dh, dw, Wp, span, padded)
// Plain copy loops, not memcpy calls: the rows are a few dozen values.
#define CONVLAB_NO_MEMCPY \
  __attribute__((optimize("no-tree-loop-distribute-patterns")))
template <typename T>
CONVLAB_NO_MEMCPY void flat_default(const T* g, const T* x, const T* w, T* gi,
                                    T* acc, CONVLAB_FLAT_ARGS) {
  CONVLAB_FLAT_CALL;
}
#if CONVLAB_X86
template <typename T>
CONVLAB_AVX2 CONVLAB_NO_MEMCPY void flat_avx2(const T* g, const T* x,
                                              const T* w, T* gi, T* acc,
                                              CONVLAB_FLAT_ARGS) {
  CONVLAB_FLAT_CALL;
}
template <typename T>
CONVLAB_AVX512 CONVLAB_NO_MEMCPY void flat_avx512(const T* g, const T* x,
                                                  const T* w, T* gi, T* acc,
                                                  CONVLAB_FLAT_ARGS) {
  CONVLAB_FLAT_CALL;
}
#endif

// Which compiled plane loop ATen's capability selects: "avx512", "avx2" or
// "default" (also every non-x86 build).
std::string depthwise2d_variant() {
#if CONVLAB_X86
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512") return "avx512";
  if (capability == "AVX2") return "avx2";
#endif
  return "default";
}

template <typename T>
using PlaneFn = void (*)(const T*, const T*, const T*, T*, T*, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t);

template <typename T>
using FlatFn = void (*)(const T*, const T*, const T*, T*, T*, T*, T*, T*,
                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t);

template <typename T>
std::pair<PlaneFn<T>, FlatFn<T>> pick_loops() {
#if CONVLAB_X86
  const std::string variant = depthwise2d_variant();
  if (variant == "avx512") return {&plane_avx512<T>, &flat_avx512<T>};
  if (variant == "avx2") return {&plane_avx2<T>, &flat_avx2<T>};
#endif
  return {&plane_default<T>, &flat_default<T>};
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

// col2im of one plane (one sample's channel), 3 spatial dims (fewer are
// padded with leading size-1 dims): col holds the plane's column rows, one
// per kernel tap (row-major over the taps), each over the output positions
// (row-major), as unfold lays them out; every entry is added onto the pixel of
// out it was copied from, and entries that read padding are dropped (never
// added, as in ATen's col2im). One pass over the columns, innermost along the
// last output dimension, so the loop is a strided add the compiler vectorises.
template <typename T>
inline __attribute__((always_inline)) void col2im_plane(
    const T* __restrict__ col, T* __restrict__ out, const int64_t* k,
    const int64_t* o, const int64_t* s, const int64_t* p, const int64_t* d,
    const int64_t* size) {
  const int64_t positions = o[0] * o[1] * o[2];
  for (int64_t a = 0; a < k[0]; ++a) {
    for (int64_t b = 0; b < k[1]; ++b) {
      for (int64_t c = 0; c < k[2]; ++c) {
        const T* tap = col + ((a * k[1] + b) * k[2] + c) * positions;
        const int64_t off = c * d[2] - p[2];
        // o2 with 0 <= o2 * s[2] + off < size[2]
        int64_t lo = off >= 0 ? 0 : (-off + s[2] - 1) / s[2];
        int64_t hi = size[2] - 1 - off < 0 ? 0 : (size[2] - 1 - off) / s[2] + 1;
        lo = std::min(lo, o[2]);
        hi = std::max(lo, std::min(hi, o[2]));
        for (int64_t u = 0; u < o[0]; ++u) {
          const int64_t i0 = u * s[0] - p[0] + a * d[0];
          if (i0 < 0 || i0 >= size[0]) continue;
          for (int64_t v = 0; v < o[1]; ++v) {
            const int64_t i1 = v * s[1] - p[1] + b * d[1];
            if (i1 < 0 || i1 >= size[1]) continue;
            const T* src = tap + (u * o[1] + v) * o[2];
            T* row = out + (i0 * size[1] + i1) * size[2];
            if (s[2] == 1) {
              for (int64_t w = lo; w < hi; ++w) row[w + off] += src[w];
            } else {
              for (int64_t w = lo; w < hi; ++w) row[w * s[2] + off] += src[w];
            }
          }
        }
      }
    }
  }
}

#define CONVLAB_COL2IM_ARGS                                                   \
  const T *col, T *out, const int64_t *k, const int64_t *o, const int64_t *s, \
      const int64_t *p, const int64_t *d, const int64_t *size
#define CONVLAB_COL2IM_CALL col2im_plane<T>(col, out, k, o, s, p, d, size)
template <typename T>
void col2im_default(CONVLAB_COL2IM_ARGS) {
  CONVLAB_COL2IM_CALL;
}
#if CONVLAB_X86
template <typename T>
CONVLAB_AVX2 void col2im_avx2(CONVLAB_COL2IM_ARGS) {
  CONVLAB_COL2IM_CALL;
}
template <typename T>
CONVLAB_AVX512 void col2im_avx512(CONVLAB_COL2IM_ARGS) {
  CONVLAB_COL2IM_CALL;
}
#endif

template <typename T>
using Col2imFn = void (*)(const T*, T*, const int64_t*, const int64_t*,
                          const int64_t*, const int64_t*, const int64_t*,
                          const int64_t*);

// The same choice as the depthwise loops: depthwise2d_variant() names it.
template <typename T>
Col2imFn<T> pick_col2im() {
#if CONVLAB_X86
  const std::string variant = depthwise2d_variant();
  if (variant == "avx512") return &col2im_avx512<T>;
  if (variant == "avx2") return &col2im_avx2<T>;
#endif
  return &col2im_default<T>;
}

// The checks every one of convlab's CPU loops makes of its two tensors: CPU,
// one dtype, float32 or float64, contiguous (messages name the op and both).
void check_cpu_float_pair(const char* op, const at::Tensor& a,
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

// out [P, *size] += col2im(cols [P, prod(kernel) * prod(output_size)]), 1-3
// spatial dims: P independent planes (samples times channels), split over
// threads, so every pixel is summed by one thread in a fixed order.
at::Tensor& col2im_add_(at::Tensor& out, const at::Tensor& cols,
                        at::IntArrayRef kernel_size,
                        at::IntArrayRef output_size, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation) {
  const int64_t dim = out.dim() - 1;
  TORCH_CHECK(dim >= 1 && dim <= 3,
              "col2im_add_: out must be [planes, *size] with 1 to 3 spatial "
              "dims, got ", out.dim(), "-d");
  TORCH_CHECK(kernel_size.size() == static_cast<size_t>(dim) &&
                  output_size.size() == static_cast<size_t>(dim) &&
                  stride.size() == static_cast<size_t>(dim) &&
                  padding.size() == static_cast<size_t>(dim) &&
                  dilation.size() == static_cast<size_t>(dim),
              "col2im_add_: kernel_size, output_size, stride, padding and "
              "dilation need ", dim, " values each (one per spatial dim)");
  check_cpu_float_pair("col2im_add_", out, "out", cols, "cols");
  std::array<int64_t, 3> k{1, 1, 1}, o{1, 1, 1}, s{1, 1, 1}, p{0, 0, 0},
      d{1, 1, 1}, size{1, 1, 1};
  for (int64_t i = 0; i < dim; ++i) {
    const int64_t j = 3 - dim + i;
    k[j] = kernel_size[i];
    o[j] = output_size[i];
    s[j] = stride[i];
    p[j] = padding[i];
    d[j] = dilation[i];
    size[j] = out.size(1 + i);
    TORCH_CHECK(k[j] > 0 && s[j] > 0 && d[j] > 0 && p[j] >= 0 && o[j] >= 0,
                "col2im_add_: kernel_size, stride and dilation must be "
                "positive, padding and output_size not negative");
    const int64_t span = size[j] + 2 * p[j] - d[j] * (k[j] - 1) - 1;
    TORCH_CHECK(o[j] == (span < 0 ? 0 : span / s[j] + 1),
                "col2im_add_: output_size does not follow from out's size, "
                "kernel_size, stride, padding and dilation");
  }
  const int64_t planes = out.size(0);
  const int64_t per_plane = k[0] * k[1] * k[2] * o[0] * o[1] * o[2];
  TORCH_CHECK(cols.dim() == 2 && cols.size(0) == planes &&
                  cols.size(1) == per_plane,
              "col2im_add_: cols must be [", planes, ", ", per_plane,
              "] (planes, kernel taps times output positions), got ",
              cols.sizes());
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, cols);
  const int64_t plane_size = size[0] * size[1] * size[2];
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "col2im_add_", [&] {
    const scalar_t* cp = cols.const_data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const Col2imFn<scalar_t> loop = pick_col2im<scalar_t>();
    at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        loop(cp + i * per_plane, op + i * plane_size, k.data(), o.data(),
             s.data(), p.data(), d.data(), size.data());
      }
    });
  });
  return out;
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

// The Fortran GEMMs libtorch_cpu exports (MKL's on x86, the ones ATen's
// slow path calls), reached directly: through at::mm_out each per-sample
// product paid the dispatcher and four tensor views, about a tenth of a
// 5x5 stem's grad_input at one thread. Weak: where they are absent, or a
// size does not fit BLAS's int, blas_cols falls back to at::mm_out.
extern "C" void sgemm_(const char*, const char*, const int*, const int*,
                       const int*, const float*, const float*, const int*,
                       const float*, const int*, const float*, float*,
                       const int*) __attribute__((weak));
extern "C" void dgemm_(const char*, const char*, const int*, const int*,
                       const int*, const double*, const double*, const int*,
                       const double*, const int*, const double*, double*,
                       const int*) __attribute__((weak));

// cols [ck, L] = w_g^T @ g, w_g [kg, ck] and g [kg, L] row-major (one
// sample's group): in BLAS's column-major terms cols^T = g^T @ w_g, the call
// of ATen's slow_conv2d_backward_update_grad_input_frame.
template <typename T>
bool blas_cols(int64_t ck, int64_t L, int64_t kg, const T* w_g, const T* g,
               T* cols) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (ck > kMax || L > kMax || kg > kMax) return false;
  const int m = static_cast<int>(L), n = static_cast<int>(ck),
            k = static_cast<int>(kg);
  const T one = 1, zero = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (!sgemm_) return false;
    sgemm_("N", "T", &m, &n, &k, &one, g, &m, w_g, &n, &zero, cols, &m);
  } else {
    if (!dgemm_) return false;
    dgemm_("N", "T", &m, &n, &k, &one, g, &m, w_g, &n, &zero, cols, &m);
  }
  return true;
}

// grad_input [N, C, *size] of a (non-transposed) convolution, 1-3 spatial
// dims, from grad_output [N, K, *o] and weight [K, C/groups, *kernel]: as
// ATen's slow path does it, the samples split over threads, and per sample
// the columns W_g^T @ grad_output_g of every group into the thread's own
// buffer (one sample's columns, [C * taps, positions]), then col2im of its C
// planes into grad_input. The GEMMs inside a thread are single-threaded, so
// each thread's columns stay in its core's cache between the GEMM and col2im.
at::Tensor grad_input_by_sample(const at::Tensor& grad_output,
                                const at::Tensor& weight,
                                at::IntArrayRef input_size,
                                at::IntArrayRef stride,
                                at::IntArrayRef padding,
                                at::IntArrayRef dilation, int64_t groups) {
  const int64_t dim = weight.dim() - 2;
  TORCH_CHECK(dim >= 1 && dim <= 3 && grad_output.dim() == dim + 2 &&
                  input_size.size() == static_cast<size_t>(dim + 2),
              "grad_input_by_sample: grad_output [N, K, *o], weight "
              "[K, C/groups, *kernel] and input_size [N, C, *size] need the "
              "same 1 to 3 spatial dims");
  TORCH_CHECK(stride.size() == static_cast<size_t>(dim) &&
                  padding.size() == static_cast<size_t>(dim) &&
                  dilation.size() == static_cast<size_t>(dim),
              "grad_input_by_sample: stride, padding and dilation need ", dim,
              " values each (one per spatial dim)");
  check_cpu_float_pair("grad_input_by_sample", grad_output, "grad_output",
                       weight, "weight");
  const int64_t N = input_size[0], C = input_size[1], K = weight.size(0);
  TORCH_CHECK(groups > 0 && C % groups == 0 && K % groups == 0 &&
                  weight.size(1) * groups == C && grad_output.size(0) == N &&
                  grad_output.size(1) == K,
              "grad_input_by_sample: groups must divide C and K, weight must "
              "be [K, C/groups, *kernel] and grad_output [N, K, *o]");
  std::array<int64_t, 3> k{1, 1, 1}, o{1, 1, 1}, s{1, 1, 1}, p{0, 0, 0},
      d{1, 1, 1}, size{1, 1, 1};
  for (int64_t i = 0; i < dim; ++i) {
    const int64_t j = 3 - dim + i;
    k[j] = weight.size(2 + i);
    o[j] = grad_output.size(2 + i);
    s[j] = stride[i];
    p[j] = padding[i];
    d[j] = dilation[i];
    size[j] = input_size[2 + i];
    TORCH_CHECK(s[j] > 0 && d[j] > 0 && p[j] >= 0 && size[j] >= 0,
                "grad_input_by_sample: stride and dilation must be positive, "
                "padding and input_size not negative");
    const int64_t span = size[j] + 2 * p[j] - d[j] * (k[j] - 1) - 1;
    TORCH_CHECK(o[j] == (span < 0 ? 0 : span / s[j] + 1),
                "grad_input_by_sample: grad_output's spatial size does not "
                "follow from input_size, the kernel, stride, padding and "
                "dilation");
  }
  auto gi = at::zeros(input_size, weight.options());
  const int64_t taps = k[0] * k[1] * k[2];
  const int64_t positions = o[0] * o[1] * o[2];
  const int64_t plane = size[0] * size[1] * size[2];
  if (gi.numel() == 0 || positions == 0 || K == 0) return gi;
  at::NoGradGuard no_grad;  // the result is not differentiable
  const int64_t cpg = C / groups, k_g = K / groups, ck = cpg * taps;
  const int64_t per_plane = taps * positions;
  const auto wt = weight.view({groups, k_g, ck});
  const auto gv = grad_output.view({N, groups, k_g, positions});
  const int64_t runs = std::min<int64_t>(at::get_num_threads(), N);
  AT_DISPATCH_FLOATING_TYPES(weight.scalar_type(), "grad_input_by_sample",
                             [&] {
    scalar_t* gip = gi.data_ptr<scalar_t>();
    const scalar_t* wp = weight.const_data_ptr<scalar_t>();
    const scalar_t* gp = grad_output.const_data_ptr<scalar_t>();
    const Col2imFn<scalar_t> loop = pick_col2im<scalar_t>();
    at::parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
      at::NoGradGuard no_grad_here;  // grad mode is per thread
      const SerialBlas serial;
      for (int64_t run = begin; run < end; ++run) {
        // the run's columns, allocated by its own thread as ATen's slow path
        // does (one buffer of the calling thread, sliced per run, took x1.2-1.6
        // of ATen's time on the 5x5 stem at two threads in three of four
        // interleaved runs; this, x0.85-0.98)
        const at::Tensor buf = at::empty({C * per_plane}, weight.options());
        scalar_t* bp = buf.data_ptr<scalar_t>();
        for (int64_t n = run * N / runs; n < (run + 1) * N / runs; ++n) {
          for (int64_t g = 0; g < groups; ++g) {
            scalar_t* cp = bp + g * ck * positions;
            if (!blas_cols<scalar_t>(ck, positions, k_g,
                                     wp + g * k_g * ck,
                                     gp + (n * K + g * k_g) * positions, cp)) {
              auto cols = buf.narrow(0, g * ck * positions, ck * positions)
                              .view({ck, positions});
              at::mm_out(cols, wt[g].t(), gv[n][g]);
            }
          }
          for (int64_t c = 0; c < C; ++c) {
            loop(bp + c * per_plane, gip + (n * C + c) * plane, k.data(),
                 o.data(), s.data(), p.data(), d.data(), size.data());
          }
        }
      }
    });
  });
  return gi;
}

// Values of one block of tap rows (taps * rows * o[2] filled, or K/G rows of gpad, at least one row).
constexpr int64_t kRowBlock = 16384;

// Per-sample weight gradients without a column buffer. One (sample, channel)
// plane at a time: every kernel tap's row of the plane's im2col columns is
// contracted with the group's grad_output rows, out[j][t] (= or +=)
// sum_q g_j[q] * row_t[q], a tile of output channels by four taps per step
// (block_dots), so the rows are read from the core's cache and the op takes
// its result and one bounded buffer per thread. The tap rows come from one of
// three places:
// * pointwise (one tap, stride 1, no padding): the plane itself, met by the
//   group's grad_output planes where they lie, so the call holds no buffer;
// * flat (stride 1, finite plane): the plane copied once into a zero-padded
//   buffer xpad, and grad_output's rows onto xpad's row stride (gpad: zeros
//   in the extra columns), so tap t's row is xpad + offset_t, no copy per tap
//   (the extra columns add 0 * x = 0, which is why the plane must be finite);
// * filled (any stride): fill_rows writes each tap's row over a block of
//   output rows, 0 where the tap reads padding, as unfold's columns hold.
template <typename T>
inline __attribute__((always_inline)) void fill_rows(
    const T* __restrict__ x, T* __restrict__ rows, const int64_t* k,
    const int64_t* o, const int64_t* s, const int64_t* p, const int64_t* d,
    const int64_t* size, int64_t r0, int64_t r1) {
  const int64_t len = (r1 - r0) * o[2];
  for (int64_t a = 0; a < k[0]; ++a) {
    for (int64_t b = 0; b < k[1]; ++b) {
      for (int64_t c = 0; c < k[2]; ++c) {
        T* row = rows + ((a * k[1] + b) * k[2] + c) * len;
        const int64_t off = c * d[2] - p[2];
        int64_t lo = off >= 0 ? 0 : (-off + s[2] - 1) / s[2];
        int64_t hi = size[2] - 1 - off < 0 ? 0 : (size[2] - 1 - off) / s[2] + 1;
        lo = std::min(lo, o[2]);
        hi = std::max(lo, std::min(hi, o[2]));
        for (int64_t r = r0; r < r1; ++r) {
          T* dst = row + (r - r0) * o[2];
          const int64_t i0 = (r / o[1]) * s[0] - p[0] + a * d[0];
          const int64_t i1 = (r % o[1]) * s[1] - p[1] + b * d[1];
          if (i0 < 0 || i0 >= size[0] || i1 < 0 || i1 >= size[1]) {
            for (int64_t w = 0; w < o[2]; ++w) dst[w] = T(0);
            continue;
          }
          const T* src = x + (i0 * size[1] + i1) * size[2];
          for (int64_t w = 0; w < lo; ++w) dst[w] = T(0);
          if (s[2] == 1) {
            for (int64_t w = lo; w < hi; ++w) dst[w] = src[w + off];
          } else {
            for (int64_t w = lo; w < hi; ++w) dst[w] = src[w * s[2] + off];
          }
          for (int64_t w = hi; w < o[2]; ++w) dst[w] = T(0);
        }
      }
    }
  }
}

// The horizontal sums of M accumulators of V lanes, vectorised: two vectors
// whose lanes are segments of W partial sums (one segment per accumulator)
// become one of segments of W / 2, each lane the sum of the two halves of its
// segment, so log2(V) steps of shuffles and adds reduce V accumulators at
// once. Every lane meets the same partner as in the scalar halving
// lanes[l] += lanes[l + W / 2], so the sums keep their order and bits.
constexpr int halved_lane(int64_t V, int64_t W, std::size_t lane, bool high) {
  const int64_t h = W / 2, seg = static_cast<int64_t>(lane) / h,
                l = static_cast<int64_t>(lane) % h, per = V / W;
  const int64_t src = seg < per ? seg * W + l : V + (seg - per) * W + l;
  return static_cast<int>(high ? src + h : src);
}

template <typename vec, int64_t V, int64_t W, std::size_t... L>
inline __attribute__((always_inline)) vec halve_pair(
    vec a, vec b, std::index_sequence<L...>) {
  return __builtin_shufflevector(a, b, halved_lane(V, W, L, false)...) +
         __builtin_shufflevector(a, b, halved_lane(V, W, L, true)...);
}

// M vectors of segments of W lanes (accumulator i * V / W + s in segment s of
// vector i), while there are two or more and W > 1 halved in pairs; then each
// segment's lanes summed by the scalar halving into sums[accumulator].
template <typename T, typename vec, int64_t V, int64_t M, int64_t W>
inline __attribute__((always_inline)) void reduce_lanes(const vec* v,
                                                          T* sums) {
  if constexpr (M >= 2 && W >= 2) {
    vec half[M / 2];
    for (int64_t i = 0; i < M / 2; ++i) {
      half[i] = halve_pair<vec, V, W>(v[2 * i], v[2 * i + 1],
                                      std::make_index_sequence<V>{});
    }
    reduce_lanes<T, vec, V, M / 2, W / 2>(half, sums);
  } else {
    for (int64_t i = 0; i < M; ++i) {
      T lanes[V];
      __builtin_memcpy(lanes, &v[i], sizeof(vec));
      for (int64_t s = 0; s < V / W; ++s) {
        T* seg = lanes + s * W;
        for (int64_t w = W / 2; w >= 1; w /= 2) {
          for (int64_t l = 0; l < w; ++l) seg[l] += seg[l + w];
        }
        sums[i * (V / W) + s] = seg[0];
      }
    }
  }
}

// J grad_output rows (g, g + gstride, ...) against TT tap rows r[0..TT) at
// once: J * TT sums, each in V lanes (V values fill one vector register of
// the variant, so the accumulators stay in registers and every load feeds
// several FMAs), the lanes then summed pairwise (reduce_lanes, halving the
// width each level), and the tail (len % V values) added in order.
template <typename T, int64_t V, int64_t J, int64_t TT>
inline __attribute__((always_inline)) void dots(
    const T* __restrict__ g, int64_t gstride, const T* const* r, int64_t len,
    T* __restrict__ out, int64_t ostride, bool first) {
  typedef T vec __attribute__((vector_size(V * sizeof(T))));
  // the same vector read from any T-aligned address (an unaligned load)
  typedef T uvec __attribute__((vector_size(V * sizeof(T)), aligned(sizeof(T))));
  const int64_t body = len / V * V;
  vec acc[J * TT] = {};
  for (int64_t q = 0; q < body; q += V) {
    vec gv[J], rv[TT];
    for (int64_t j = 0; j < J; ++j) {
      gv[j] = *reinterpret_cast<const uvec*>(g + j * gstride + q);
    }
    for (int64_t t = 0; t < TT; ++t) {
      rv[t] = *reinterpret_cast<const uvec*>(r[t] + q);
    }
    for (int64_t j = 0; j < J; ++j) {
      for (int64_t t = 0; t < TT; ++t) acc[j * TT + t] += gv[j] * rv[t];
    }
  }
  T sums[J * TT];
  reduce_lanes<T, vec, V, J * TT, V>(acc, sums);
  for (int64_t j = 0; j < J; ++j) {
    for (int64_t t = 0; t < TT; ++t) {
      T sum = sums[j * TT + t];
      for (int64_t q = body; q < len; ++q) sum += g[j * gstride + q] * r[t][q];
      T& o = out[j * ostride + t];
      o = first ? sum : o + sum;
    }
  }
}

// Every k_g x taps sum of one block: JB x 4 tiles (JB = 4 where 32 vector
// registers hold the 16 accumulators, AVX-512; 2 with 16 registers), then the
// leftover taps and output channels in JB x 1, 1 x 4 and 1 x 1 tiles.
template <typename T, int64_t V, int64_t JB>
inline __attribute__((always_inline)) void block_dots(
    const T* g, int64_t gstride, int64_t k_g, const T* const* r, int64_t taps,
    int64_t len, T* out, int64_t stride_k, bool first) {
  int64_t j = 0;
  for (; j + JB <= k_g; j += JB) {
    const T* gj = g + j * gstride;
    T* oj = out + j * stride_k;
    int64_t t = 0;
    for (; t + 4 <= taps; t += 4) {
      dots<T, V, JB, 4>(gj, gstride, r + t, len, oj + t, stride_k, first);
    }
    for (; t < taps; ++t) {
      dots<T, V, JB, 1>(gj, gstride, r + t, len, oj + t, stride_k, first);
    }
  }
  for (; j < k_g; ++j) {
    const T* gj = g + j * gstride;
    T* oj = out + j * stride_k;
    int64_t t = 0;
    for (; t + 4 <= taps; t += 4) {
      dots<T, V, 1, 4>(gj, gstride, r + t, len, oj + t, stride_k, first);
    }
    for (; t < taps; ++t) {
      dots<T, V, 1, 1>(gj, gstride, r + t, len, oj + t, stride_k, first);
    }
  }
}

// The geometry of one call, padded to 3 spatial dims (leading size-1 dims).
struct GradwGeometry {
  const int64_t *k, *o, *s, *p, *d, *size;
  int64_t k_g;       // output channels per group
  int64_t stride_k;  // result values per output channel (C/G * taps)
  int64_t block;     // output rows per filled block
  bool unit_stride;
  bool finite;       // every plane finite (checked once per call)
  bool pointwise;    // one tap, stride 1, no padding: the tap row is the plane
};

// One thread's buffers, slices of one tensor the call allocates up front
// (from torch's allocator, in the calling thread, so that a measure of the
// call's memory counts them): filled tap rows, the padded plane,
// grad_output's rows on its row stride; and the tap row pointers. gpad_of:
// the grad_output planes gpad holds whole (one block covers them), so that
// the next channel of the same sample and group reuses them.
template <typename T>
struct GradwBuffers {
  T *rows, *xpad, *gpad;
  std::vector<const T*> ptr;
  const T* gpad_of = nullptr;
};

// One (sample, channel) plane: x the plane, g its group's first grad_output
// plane (K/G planes of `positions` values, one after another), out its first
// result entry (K/G blocks of stride_k values, `taps` of them used). V: the
// lanes of dots.
#define CONVLAB_GRADW_ARGS                                                    \
  const T *x, const T *g, T *out, const GradwGeometry &geo,                   \
      GradwBuffers<T> &buf
template <typename T, int64_t V>
inline __attribute__((always_inline)) void grad_weight_plane(
    CONVLAB_GRADW_ARGS) {
  const int64_t *k = geo.k, *o = geo.o, *s = geo.s, *p = geo.p, *d = geo.d,
                *size = geo.size;
  const int64_t taps = k[0] * k[1] * k[2];
  const int64_t positions = o[0] * o[1] * o[2];
  const int64_t plane = size[0] * size[1] * size[2];
  buf.ptr.resize(taps);
  if (geo.pointwise) {
    // the plane is its only tap row and grad_output's planes are the rows it
    // meets: no copy, no buffer, and no padding product (any value goes)
    buf.ptr[0] = x;
    block_dots<T, V, V * sizeof(T) == 64 ? 4 : 2>(g, positions, geo.k_g, buf.ptr.data(), 1,
                     positions, out, geo.stride_k, true);
    return;
  }
  if (geo.unit_stride && (geo.finite || all_finite(x, plane))) {
    const int64_t P1 = size[1] + 2 * p[1], P2 = size[2] + 2 * p[2];
    const int64_t P0 = size[0] + 2 * p[0];
    T* xpad = buf.xpad;  // P0 * P1 * P2 values and V zeros past the end
    std::fill(xpad, xpad + P0 * P1 * P2 + V, T(0));
    for (int64_t a = 0; a < size[0]; ++a) {
      for (int64_t b = 0; b < size[1]; ++b) {
        const T* src = x + (a * size[1] + b) * size[2];
        T* dst = xpad + ((a + p[0]) * P1 + b + p[1]) * P2 + p[2];
        for (int64_t c = 0; c < size[2]; ++c) dst[c] = src[c];
      }
    }
    const int64_t rows = std::max<int64_t>(1, kRowBlock / (geo.k_g * P2));
    for (int64_t u = 0; u < o[0]; ++u) {
      for (int64_t v0 = 0; v0 < o[1]; v0 += rows) {
        const int64_t v1 = std::min(v0 + rows, o[1]);
        // whole vectors: the gpad values past the last output are zeros
        const int64_t len = ((v1 - v0 - 1) * P2 + o[2] + V - 1) / V * V;
        const T* base = xpad + (u * P1 + v0) * P2;
        for (int64_t a = 0, t = 0; a < k[0]; ++a) {
          for (int64_t b = 0; b < k[1]; ++b) {
            for (int64_t c = 0; c < k[2]; ++c, ++t) {
              buf.ptr[t] = base + (a * d[0] * P1 + b * d[1]) * P2 + c * d[2];
            }
          }
        }
        T* gpad = buf.gpad;
        const bool whole = o[0] == 1 && v0 == 0 && v1 == o[1];
        if (!whole || buf.gpad_of != g) {
          std::fill(gpad, gpad + geo.k_g * len, T(0));
          for (int64_t j = 0; j < geo.k_g; ++j) {
            for (int64_t v = v0; v < v1; ++v) {
              const T* src = g + j * positions + (u * o[1] + v) * o[2];
              T* dst = gpad + j * len + (v - v0) * P2;
              for (int64_t w = 0; w < o[2]; ++w) dst[w] = src[w];
            }
          }
        }
        buf.gpad_of = whole ? g : nullptr;
        block_dots<T, V, V * sizeof(T) == 64 ? 4 : 2>(gpad, len, geo.k_g, buf.ptr.data(), taps, len, out,
                         geo.stride_k, u == 0 && v0 == 0);
      }
    }
    return;
  }
  for (int64_t r0 = 0; r0 < o[0] * o[1]; r0 += geo.block) {
    const int64_t r1 = std::min(r0 + geo.block, o[0] * o[1]);
    const int64_t len = (r1 - r0) * o[2];
    T* rows = buf.rows;
    fill_rows<T>(x, rows, k, o, s, p, d, size, r0, r1);
    for (int64_t t = 0; t < taps; ++t) buf.ptr[t] = rows + t * len;
    block_dots<T, V, V * sizeof(T) == 64 ? 4 : 2>(g + r0 * o[2], positions, geo.k_g, buf.ptr.data(), taps,
                     len, out, geo.stride_k, r0 == 0);
  }
}
#define CONVLAB_GRADW_CALL(bytes)                                             \
  grad_weight_plane<T, (bytes) / sizeof(T)>(x, g, out, geo, buf)
template <typename T>
void gradw_default(CONVLAB_GRADW_ARGS) {
  CONVLAB_GRADW_CALL(16);
}
#if CONVLAB_X86
template <typename T>
CONVLAB_AVX2 void gradw_avx2(CONVLAB_GRADW_ARGS) {
  CONVLAB_GRADW_CALL(32);
}
template <typename T>
CONVLAB_AVX512 void gradw_avx512(CONVLAB_GRADW_ARGS) {
  CONVLAB_GRADW_CALL(64);
}
#endif

template <typename T>
using GradwFn = void (*)(const T*, const T*, T*, const GradwGeometry&,
                         GradwBuffers<T>&);

template <typename T>
GradwFn<T> pick_gradw() {
#if CONVLAB_X86
  const std::string variant = depthwise2d_variant();
  if (variant == "avx512") return &gradw_avx512<T>;
  if (variant == "avx2") return &gradw_avx2<T>;
#endif
  return &gradw_default<T>;
}

// Values of one block of a (sample, group)'s columns in the GEMM form.
constexpr int64_t kColBlock = 131072;
// Multiply-adds per output position of one (sample, group) from which the
// GEMM form runs: K/G * C/G * taps (on the AMD EPYC, the loop was faster at
// 1600 and below, the GEMM at 4608).
constexpr int64_t kGemmWork = 4096;

// Every sample's weight gradient of a (non-transposed) convolution, 1-3
// spatial dims: input [N, C, *size], grad_output [N, K, *o] ->
// [N, K, C/groups, *kernel_size]. The (sample, channel) planes are split over
// threads; each result entry is summed by one thread in a fixed order.
at::Tensor per_sample_weight_grad(const at::Tensor& input,
                                  const at::Tensor& grad_output,
                                  at::IntArrayRef kernel_size,
                                  at::IntArrayRef stride,
                                  at::IntArrayRef padding,
                                  at::IntArrayRef dilation, int64_t groups) {
  const int64_t dim = input.dim() - 2;
  TORCH_CHECK(dim >= 1 && dim <= 3 && grad_output.dim() == input.dim(),
              "per_sample_weight_grad: input and grad_output must be "
              "[N, C, *size] and [N, K, *o] with 1 to 3 spatial dims, got ",
              input.dim(), "-d and ", grad_output.dim(), "-d");
  TORCH_CHECK(kernel_size.size() == static_cast<size_t>(dim) &&
                  stride.size() == static_cast<size_t>(dim) &&
                  padding.size() == static_cast<size_t>(dim) &&
                  dilation.size() == static_cast<size_t>(dim),
              "per_sample_weight_grad: kernel_size, stride, padding and "
              "dilation need ", dim, " values each (one per spatial dim)");
  check_cpu_float_pair("per_sample_weight_grad", input, "input", grad_output,
                       "grad_output");
  const int64_t N = input.size(0), C = input.size(1), K = grad_output.size(1);
  TORCH_CHECK(groups > 0 && C % groups == 0 && K % groups == 0 &&
                  grad_output.size(0) == N,
              "per_sample_weight_grad: groups must be positive and divide "
              "C and K, and grad_output must have input's N");
  std::array<int64_t, 3> k{1, 1, 1}, o{1, 1, 1}, s{1, 1, 1}, p{0, 0, 0},
      d{1, 1, 1}, size{1, 1, 1};
  for (int64_t i = 0; i < dim; ++i) {
    const int64_t j = 3 - dim + i;
    k[j] = kernel_size[i];
    s[j] = stride[i];
    p[j] = padding[i];
    d[j] = dilation[i];
    size[j] = input.size(2 + i);
    o[j] = grad_output.size(2 + i);
    TORCH_CHECK(k[j] > 0 && s[j] > 0 && d[j] > 0 && p[j] >= 0,
                "per_sample_weight_grad: kernel_size, stride and dilation "
                "must be positive, padding not negative");
    const int64_t span = size[j] + 2 * p[j] - d[j] * (k[j] - 1) - 1;
    TORCH_CHECK(span >= 0 && o[j] == span / s[j] + 1,
                "per_sample_weight_grad: grad_output's spatial size does not "
                "follow from the input, kernel_size, stride, padding and "
                "dilation");
  }
  std::vector<int64_t> shape{N, K, C / groups};
  shape.insert(shape.end(), kernel_size.begin(), kernel_size.end());
  const int64_t taps = k[0] * k[1] * k[2];
  const int64_t positions = o[0] * o[1] * o[2];
  auto out = at::empty(shape, input.options());
  if (out.numel() == 0) return out;
  const int64_t cpg = C / groups, k_g = K / groups;
  const int64_t plane = size[0] * size[1] * size[2];
  if (k_g * cpg * taps >= kGemmWork) {
    // (sample, group) items: the columns of the group's channels over a block
    // of output rows, [cpg * taps, len] in a per-thread buffer, then one GEMM
    // into the item's [K/G, cpg * taps] rows of the result (the first block
    // writes them, the others add). The result is not differentiable: the
    // GEMMs run without autograd whatever the inputs' requires_grad.
    at::NoGradGuard no_grad;
    const int64_t rows_total = o[0] * o[1];
    const int64_t gblock =
        std::max<int64_t>(1, kColBlock / (cpg * taps * o[2]));
    const int64_t items = N * groups;
    auto outv = out.view({N * groups, k_g, cpg * taps});
    auto gv = grad_output.view({N * groups, k_g, positions});
    // a pointwise layer's columns are the group's input planes themselves
    const bool pointwise = taps == 1 && s[0] == 1 && s[1] == 1 && s[2] == 1 &&
                           p[0] == 0 && p[1] == 0 && p[2] == 0;
    auto xv = input.view({N * groups, cpg, plane});
    AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "per_sample_weight_grad",
                               [&] {
      const scalar_t* xp = input.const_data_ptr<scalar_t>();
      // One item's columns over output rows [r0, r1) into buf, the channels
      // [j0, j1) of its group; then its result rows [k0, k1) (= or +=) the
      // grad_output rows times the columns.
      auto fill = [&](int64_t i, scalar_t* bp, int64_t r0, int64_t r1,
                      int64_t j0, int64_t j1) {
        const int64_t n = i / groups, g = i % groups, len = (r1 - r0) * o[2];
        for (int64_t j = j0; j < j1; ++j) {
          fill_rows<scalar_t>(xp + (n * C + g * cpg + j) * plane,
                              bp + j * taps * len, k.data(), o.data(),
                              s.data(), p.data(), d.data(), size.data(), r0,
                              r1);
        }
      };
      auto gemm = [&](int64_t i, const at::Tensor& buf, int64_t r0,
                      int64_t r1, int64_t k0, int64_t k1) {
        at::NoGradGuard no_grad_here;  // grad mode is per thread
        const SerialBlas serial;       // one GEMM per thread
        const int64_t len = (r1 - r0) * o[2];
        auto cols = pointwise
                        ? xv[i].narrow(1, r0 * o[2], len)
                        : buf.narrow(0, 0, cpg * taps * len).view({cpg * taps, len});
        auto gy = gv[i].narrow(1, r0 * o[2], len).narrow(0, k0, k1 - k0);
        auto dst = outv[i].narrow(0, k0, k1 - k0);
        if (r0 == 0) {
          at::mm_out(dst, gy, cols.t());
        } else {
          dst.addmm_(gy, cols.t());
        }
      };
      const int64_t buf_size =
          pointwise ? 0 : cpg * taps * std::min(gblock, rows_total) * o[2];
      const int64_t threads = at::get_num_threads();
      if (items >= threads) {
        // items split into `threads` runs, each with its own columns; the
        // GEMMs inside a run single-threaded
        const at::Tensor bufs = at::empty({threads, buf_size}, input.options());
        at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
          for (int64_t run = begin; run < end; ++run) {
            const at::Tensor buf = bufs[run];
            scalar_t* bp = buf.data_ptr<scalar_t>();
            for (int64_t i = run * items / threads;
                 i < (run + 1) * items / threads; ++i) {
              for (int64_t r0 = 0; r0 < rows_total; r0 += gblock) {
                const int64_t r1 = std::min(r0 + gblock, rows_total);
                if (!pointwise) fill(i, bp, r0, r1, 0, cpg);
                gemm(i, buf, r0, r1, 0, k_g);
              }
            }
          }
        });
      } else {
        // fewer items than threads: the threads share each item, splitting
        // its channels to fill the columns, then its output channels
        const at::Tensor buf = at::empty({buf_size}, input.options());
        scalar_t* bp = buf.data_ptr<scalar_t>();
        for (int64_t i = 0; i < items; ++i) {
          for (int64_t r0 = 0; r0 < rows_total; r0 += gblock) {
            const int64_t r1 = std::min(r0 + gblock, rows_total);
            if (!pointwise) {
              at::parallel_for(0, cpg, 1, [&](int64_t j0, int64_t j1) {
                fill(i, bp, r0, r1, j0, j1);
              });
            }
            at::parallel_for(0, k_g, 1, [&](int64_t k0, int64_t k1) {
              gemm(i, buf, r0, r1, k0, k1);
            });
          }
        }
      }
    });
    return out;
  }
  GradwGeometry geo{k.data(), o.data(), s.data(), p.data(), d.data(),
                    size.data(), k_g, cpg * taps,
                    std::max<int64_t>(1, kRowBlock / (taps * o[2])),
                    s[0] == 1 && s[1] == 1 && s[2] == 1, false,
                    taps == 1 && s[0] == 1 && s[1] == 1 && s[2] == 1 &&
                        p[0] == 0 && p[1] == 0 && p[2] == 0};
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "per_sample_weight_grad",
                             [&] {
    const scalar_t* xp = input.const_data_ptr<scalar_t>();
    const scalar_t* gp = grad_output.const_data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const GradwFn<scalar_t> loop = pick_gradw<scalar_t>();
    // Buffer sizes for the widest variant's vectors (vmax values).
    const int64_t vmax = 64 / sizeof(scalar_t);
    const int64_t P1 = size[1] + 2 * p[1], P2 = size[2] + 2 * p[2];
    const int64_t padded = (size[0] + 2 * p[0]) * P1 * P2;
    const int64_t flat_rows = std::min(
        std::max<int64_t>(1, kRowBlock / (k_g * P2)), o[1]);
    // a pointwise call holds no buffer at all
    const bool flat = geo.unit_stride && !geo.pointwise;
    const int64_t xpad_size = flat ? padded + vmax : 0;
    const int64_t gpad_size =
        flat ? k_g * (((flat_rows - 1) * P2 + o[2] + vmax - 1) / vmax * vmax)
             : 0;
    // filled tap rows serve strides above 1 and non-finite planes; a call
    // whose planes all take the flat form holds no room for them
    geo.finite = flat && all_finite(xp, N * C * plane);
    const bool fills = !geo.finite && !geo.pointwise;
    const int64_t rows_size =
        fills ? taps * std::min(geo.block, o[0] * o[1]) * o[2] : 0;
    const int64_t per_run = rows_size + xpad_size + gpad_size;
    // the planes split into runs, one buffer each
    const int64_t runs = std::min<int64_t>(at::get_num_threads(), N * C);
    const at::Tensor bufs = at::empty({runs, per_run}, input.options());
    scalar_t* bp = bufs.data_ptr<scalar_t>();
    at::parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
      GradwBuffers<scalar_t> buf;
      for (int64_t run = begin; run < end; ++run) {
        buf.rows = bp + run * per_run;
        buf.xpad = buf.rows + rows_size;
        buf.gpad = buf.xpad + xpad_size;
        buf.gpad_of = nullptr;
        for (int64_t i = run * N * C / runs; i < (run + 1) * N * C / runs;
             ++i) {
          const int64_t n = i / C, c = i % C, g = c / cpg;
          loop(xp + i * plane, gp + (n * K + g * k_g) * positions,
               op + ((n * K + g * k_g) * cpg + c % cpg) * taps, geo, buf);
        }
      }
    });
  });
  return out;
}

// The backward of a 2-d depthwise convolution (weight [C, 1, kh, kw], groups =
// C) in one pass: (grad_input, grad_weight). Threads split the channels, so
// each grad_weight entry is summed by one thread in a fixed order.
std::tuple<at::Tensor, at::Tensor> depthwise2d_backward(
    const at::Tensor& grad_output_, const at::Tensor& input_,
    const at::Tensor& weight_, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation) {
  TORCH_CHECK(input_.dim() == 4 && weight_.dim() == 4 &&
                  grad_output_.dim() == 4,
              "depthwise2d_backward: grad_output, input and weight must be "
              "4-d");
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
              "depthwise2d_backward: stride, padding and dilation need 2 "
              "values each");
  TORCH_CHECK(input_.device().is_cpu(), "depthwise2d_backward: CPU only");
  const auto go = grad_output_.contiguous();
  const auto x = input_.contiguous();
  const auto w = weight_.contiguous();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t kh = w.size(2), kw = w.size(3);
  const int64_t Ho = go.size(2), Wo = go.size(3);
  TORCH_CHECK(w.size(0) == C && w.size(1) == 1 && go.size(0) == N &&
                  go.size(1) == C,
              "depthwise2d_backward: need weight [C, 1, kh, kw] and "
              "grad_output [N, C, Ho, Wo] for input [N, C, H, W]");
  for (int64_t d = 0; d < 2; ++d) {
    const int64_t size = x.size(2 + d), k = w.size(2 + d);
    TORCH_CHECK(stride[d] > 0 && padding[d] >= 0 && dilation[d] > 0 &&
                    go.size(2 + d) ==
                        (size + 2 * padding[d] - dilation[d] * (k - 1) - 1) /
                                stride[d] + 1,
                "depthwise2d_backward: grad_output's spatial size does not "
                "follow from the input, weight, stride, padding and dilation");
  }
  auto gi = at::zeros_like(x);
  auto gw = at::zeros_like(w);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "depthwise2d_backward", [&] {
    const scalar_t* gp = go.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    scalar_t* gip = gi.data_ptr<scalar_t>();
    scalar_t* gwp = gw.data_ptr<scalar_t>();
    const auto loops = pick_loops<scalar_t>();
    const PlaneFn<scalar_t> plane = loops.first;
    const FlatFn<scalar_t> flat = loops.second;
    const int64_t sh = stride[0], sw = stride[1], ph = padding[0],
                  pw = padding[1], dh = dilation[0], dw = dilation[1];
    const int64_t taps = kh * kw, Wp = W + 2 * pw;
    // the flat form's buffers (stride 1): see depthwise_taps_flat
    const bool unit_stride = sh == 1 && sw == 1;
    const int64_t span = (Ho * Wp + kLanes - 1) / kLanes * kLanes;
    const int64_t smax = (kh - 1) * dh * Wp + (kw - 1) * dw;
    const int64_t padded = span + smax;  // >= (H + 2 * ph) * Wp: xpad's rows
    at::parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> acc(taps * Wo), lanes(taps * kLanes);
      std::vector<scalar_t> xpad, gext, gipad;
      if (unit_stride) {
        xpad.resize(padded);
        gipad.resize(padded + kLanes);
        gext.assign(smax + padded + kLanes, scalar_t(0));  // zeros stay zeros
      }
      for (int64_t c = begin; c < end; ++c) {
        std::fill(acc.begin(), acc.end(), scalar_t(0));
        std::fill(lanes.begin(), lanes.end(), scalar_t(0));
        const scalar_t* wc = wp + c * taps;
        bool w_finite = true;
        for (int64_t t = 0; t < taps; ++t) w_finite &= std::isfinite(wc[t]);
        for (int64_t n = 0; n < N; ++n) {
          const scalar_t* g = gp + (n * C + c) * Ho * Wo;
          const scalar_t* xn = xp + (n * C + c) * H * W;
          scalar_t* gin = gip + (n * C + c) * H * W;
          if (unit_stride && w_finite) {
            if (all_finite(xn, H * W)) {
              flat(g, xn, wc, gin, lanes.data(), xpad.data(), gext.data(),
                   gipad.data(), H, W, Ho, Wo, kh, kw, ph, pw, dh, dw, Wp, span,
                   padded);
              continue;
            }
          }
          plane(g, xn, wc, gin, acc.data(), H, W, Ho, Wo, kh, kw, sh, sw, ph,
                pw, dh, dw);
        }
        for (int64_t t = 0; t < taps; ++t) {
          scalar_t sum = 0;
          for (int64_t ow = 0; ow < Wo; ++ow) sum += acc[t * Wo + ow];
          for (int64_t l = 0; l < kLanes; ++l) sum += lanes[t * kLanes + l];
          gwp[c * taps + t] = sum;
        }
      }
    });
  });
  return std::make_tuple(gi, gw);
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
      &depthwise2d_backward);
  m.def("depthwise2d_variant() -> str", &depthwise2d_variant);
  m.def(
      "per_sample_weight_grad(Tensor input, Tensor grad_output, "
      "int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
      "int groups) -> Tensor",
      &per_sample_weight_grad);
  m.def(
      "grad_input_by_sample(Tensor grad_output, Tensor weight, "
      "int[] input_size, int[] stride, int[] padding, int[] dilation, "
      "int groups) -> Tensor",
      &grad_input_by_sample);
  m.def(
      "col2im_add_(Tensor(a!) out, Tensor cols, int[] kernel_size, "
      "int[] output_size, int[] stride, int[] padding, int[] dilation) -> "
      "Tensor(a!)",
      &col2im_add_);
}
