// per_sample_dots.h: the dot-product tiles of per_sample.cpp's loop, J
// grad_output rows against TT tap rows at once, their lanes summed in a fixed
// order.

#pragma once

#include "cpu_loops.h"

namespace convlab_ext {

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

}  // namespace convlab_ext
