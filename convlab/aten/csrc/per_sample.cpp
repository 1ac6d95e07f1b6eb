// per_sample.cpp: every sample's weight gradient without a column buffer
// (convlab_ext::per_sample_weight_grad), for convlab.aten.fast_per_sample.

#include "cpu_loops.h"
#include "per_sample_dots.h"

namespace convlab_ext {
namespace {

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

}  // namespace

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

}  // namespace convlab_ext
