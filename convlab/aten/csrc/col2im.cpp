// col2im.cpp: col2im (every column entry added back onto the pixel it was
// copied from) in one pass, alone (convlab_ext::col2im_add_) or after each
// sample's GEMM (convlab_ext::grad_input_by_sample), for
// convlab.aten.fast_reference's grad_input.

#include <ATen/MemoryOverlap.h>

#include "cpu_loops.h"

namespace convlab_ext {
namespace {

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

}  // namespace

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

}  // namespace convlab_ext
