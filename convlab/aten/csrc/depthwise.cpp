// depthwise.cpp: the fused one-pass backward of a 2-d depthwise convolution
// (convlab_ext::depthwise2d_backward), the plane loops compiled per ISA.

#include "cpu_loops.h"

namespace convlab_ext {
namespace {

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

}  // namespace

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

}  // namespace convlab_ext
