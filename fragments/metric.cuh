// fraglink fragments — distance metrics (algorithm code of the `metric` family).
//
// Header-only, __host__ __device__: the metric fragments (templates/metric.cu.j2)
// instantiate these for one (metric, dtype) and export them under the ABI names of
// abi.cuh; host tests include this header directly and compare with the Rust CPU
// reference.
//
// A metric is a struct with three static functions over a metric_state<Acc>:
//   init(s)              zero the state
//   accumulate(s, q, x)  fold in one element pair (query element q, row element x)
//   finalize(s) -> float the distance; SMALLER IS CLOSER for every metric
// The scan calls accumulate for j = 0, 1, …, dim-1 in that order, so a host
// reference that folds in the same order reproduces device results exactly
// (see "Numerics" in fragments/README.md).
//
// Metrics:
//   l2             squared Euclidean distance  sum_j (q_j - x_j)^2   (no sqrt)
//   inner_product  NEGATED dot product         -sum_j q_j * x_j
//   cosine         1 - dot / (|q| * |x|); 1 when either norm is zero
//
// Accumulator per data type (the only combinations that compile — there is no
// generic fallback, so a wrong `acc_type` in the matrix is a compile error):
//   f32 → float     fused multiply-add per element (one rounding per step)
//   f16 → float     elements are widened exactly to float; a half accumulator
//                   has an 11-bit significand and overflows at 65504, so sums of
//                   squares of even moderate vectors would be wrong or inf
//   i8  → int32_t   exact; products are at most 128*128, squared differences at
//                   most 255^2 = 65025, so every sum is exact for dim <= 33025
//   u8  → uint32_t  exact; products and squared differences at most 65025, so
//                   every sum is exact for dim <= 66051
// Integer sums are converted to float once, in finalize.
#pragma once

#include "abi.cuh"  // metric_state<Acc>, accumulator types

namespace fraglink {

namespace metric {

// ----- element operations, one overload per supported (accumulator, element) ----

// acc + q * x
FRAGLINK_HD FRAGLINK_INLINE float mul_add(float acc, float q, float x) { return fma_rn(q, x, acc); }
FRAGLINK_HD FRAGLINK_INLINE float mul_add(float acc, __half q, __half x) {
  return fma_rn(to_float(q), to_float(x), acc);
}
FRAGLINK_HD FRAGLINK_INLINE int32_t mul_add(int32_t acc, int8_t q, int8_t x) {
  return acc + static_cast<int32_t>(q) * static_cast<int32_t>(x);
}
FRAGLINK_HD FRAGLINK_INLINE uint32_t mul_add(uint32_t acc, uint8_t q, uint8_t x) {
  return acc + static_cast<uint32_t>(q) * static_cast<uint32_t>(x);
}

// acc + (q - x)^2
FRAGLINK_HD FRAGLINK_INLINE float diff_sq_add(float acc, float q, float x) {
  const float d = sub_rn(q, x);
  return fma_rn(d, d, acc);
}
FRAGLINK_HD FRAGLINK_INLINE float diff_sq_add(float acc, __half q, __half x) {
  const float d = sub_rn(to_float(q), to_float(x));
  return fma_rn(d, d, acc);
}
FRAGLINK_HD FRAGLINK_INLINE int32_t diff_sq_add(int32_t acc, int8_t q, int8_t x) {
  const int32_t d = static_cast<int32_t>(q) - static_cast<int32_t>(x);
  return acc + d * d;
}
FRAGLINK_HD FRAGLINK_INLINE uint32_t diff_sq_add(uint32_t acc, uint8_t q, uint8_t x) {
  const int32_t d = static_cast<int32_t>(q) - static_cast<int32_t>(x);
  return acc + static_cast<uint32_t>(d * d);
}

// ----- the metrics ---------------------------------------------------------------

template <typename T, typename Acc>
struct l2 {
  typedef metric_state<Acc> state;
  static FRAGLINK_HD FRAGLINK_INLINE void init(state& s) {
    s.a = Acc(0);
    s.qq = Acc(0);
    s.xx = Acc(0);
  }
  static FRAGLINK_HD FRAGLINK_INLINE void accumulate(state& s, T q, T x) { s.a = diff_sq_add(s.a, q, x); }
  static FRAGLINK_HD FRAGLINK_INLINE float finalize(const state& s) { return to_float(s.a); }
};

template <typename T, typename Acc>
struct inner_product {
  typedef metric_state<Acc> state;
  static FRAGLINK_HD FRAGLINK_INLINE void init(state& s) {
    s.a = Acc(0);
    s.qq = Acc(0);
    s.xx = Acc(0);
  }
  static FRAGLINK_HD FRAGLINK_INLINE void accumulate(state& s, T q, T x) { s.a = mul_add(s.a, q, x); }
  // Negated so that, like every metric, smaller is closer.
  static FRAGLINK_HD FRAGLINK_INLINE float finalize(const state& s) { return -to_float(s.a); }
};

template <typename T, typename Acc>
struct cosine {
  typedef metric_state<Acc> state;
  static FRAGLINK_HD FRAGLINK_INLINE void init(state& s) {
    s.a = Acc(0);
    s.qq = Acc(0);
    s.xx = Acc(0);
  }
  static FRAGLINK_HD FRAGLINK_INLINE void accumulate(state& s, T q, T x) {
    s.a = mul_add(s.a, q, x);
    s.qq = mul_add(s.qq, q, q);
    s.xx = mul_add(s.xx, x, x);
  }
  // 1 - dot / (sqrt(qq) * sqrt(xx)), each operation rounded once, in this order.
  // A zero vector has no direction: its distance to anything is defined as 1
  // (cosine similarity 0). The result is not clamped; rounding may leave it a few
  // ulps outside [0, 2].
  static FRAGLINK_HD FRAGLINK_INLINE float finalize(const state& s) {
    const float dot = to_float(s.a);
    const float qq = to_float(s.qq);
    const float xx = to_float(s.xx);
    if (qq == 0.0f || xx == 0.0f) {
      return 1.0f;
    }
    const float denom = mul_rn(sqrt_rn(qq), sqrt_rn(xx));
    return sub_rn(1.0f, div_rn(dot, denom));
  }
};

}  // namespace metric
}  // namespace fraglink
