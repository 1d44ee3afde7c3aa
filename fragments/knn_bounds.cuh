// fraglink fragments — error bounds of the tensor-core candidate scan (knn_tile.cuh).
//
// Header-only, __host__ __device__ and host-compilable (tests/host_headers.rs
// compiles it with g++ and compares every function with the Rust emulation in
// src/search/knn_bounds.rs bit for bit). Every float operation is an explicitly
// rounded one (common.cuh), so contraction or fast-math flags cannot change a bound.
//
// For a (query, row) pair with reference distance d (the metric fragment's in-order
// fold, fragments/README.md "Numerics") the candidate kernel has an approximate dot
// product `dot` from the tensor cores and precomputed f32 norms. From them it forms
// the approximate distance g and a bound e, and lo = g - e, hi = g + e satisfy
// lo <= d <= hi. The argument follows src/search/cpu.rs (module docs, "the margin"),
// with the dot product's error replaced by the tensor-core one:
//
// Notation: u = 2^-24, n = dim, gamma(m) = m u / (1 - m u), |q|, |x| Euclidean norms.
// The reference fold of n products (f32, round to nearest) errs by at most
// gamma(n) * sum |q_j x_j| <= gamma(n) |q||x| (Cauchy-Schwarz).
//
// Tensor-core dot product, assumptions (stated, not measured here):
//  (A1) the products the MMA forms from its inputs are exact (f16 x f16 and
//       s8/u8 x s8/u8 are; TF32 x TF32 has 22 significant bits, exact in f32);
//  (A2) accumulation is NOT assumed IEEE round-to-nearest: whatever the grouping
//       (4, 8 or 16 products aligned and added at once, truncation instead of
//       rounding, as Fasi, Higham, Mikaitis and Pranesh measured on V100/T4/A100),
//       each accumulation step errs by at most u_tc = 2^-20 = 16 u relative to the
//       magnitudes it adds, so m accumulated products err by at most
//       gamma_tc(m) * sum |products|, gamma_tc(m) = m u_tc / (1 - m u_tc);
//  (A3) flushing subnormal inputs, products or partial sums to zero errs by at most
//       2^-126 per element of the input (times the other operand's magnitude) and
//       per step: absorbed by the absolute term below;
//  (A4) f16 inputs (subnormals included) and integer inputs enter exactly.
// Input rounding: TF32 keeps 10 fraction bits; rounding f32 to TF32 (we convert with
// cvt.rna, round to nearest: 2^-11 relative; raw f32 fed to the MMA truncates:
// 2^-10) — the bound allows 2^-10 per input, so one product errs by at most
// 2 * 2^-10 + 2^-20 < 2^-8 relative (eps_in = 2^-8). 3xTF32 splits x = hi + lo
// (hi = tf32(x), lo = tf32(x - hi), x - hi exact) and sums hi*hi + hi*lo + lo*hi:
// what is missing (lo*lo and the residuals x - hi - lo, each <= 2^-20 |x|) is at
// most 3 * 2^-20 (1 + 2^-9) relative per product; eps_in = 2^-17 (8x that). The
// three MMAs accumulate 3n products: m = 3n. f16 and integers: eps_in = 0, m = n.
// So |dot_tc - dot| <= delta |q||x| + abs_tc with delta = eps_in + gamma_tc(m).
// f16copy (f32 rows and queries, the MMA reads their f16 copies, rounded to nearest
// on the host; every element finite and |v| <= 65504, else a search naming the
// variant is refused): rounding v to f16 errs by at most 2^-11 |v| + 2^-25 (the absolute part
// for f16's subnormal range), so with q~ = q + a, x~ = x + b one product errs by
// |q b + a x + a b| <= (2^-10 + 2^-22)|q_j x_j| + (2^-25 + 2^-36)(|q_j| + |x_j|) + 2^-50;
// the f16 products themselves are exact in f32 (m = n). Summed, with
// sum |q_j| <= sqrt(n) |q|: eps_in = 2^-10 + 2^-21 (rounded up), and an absolute part
// A1 (|q| + |x|) + A0, A1 = (2^-25 + 2^-36) r (r the least power of two >= sqrt(n)),
// A0 = n 2^-50. abs_in = 4 (A1 + A0) joins A below (l2 doubles the dot's error, and
// a factor 2 to spare), and cosine, which divides the dot by |q||x|, adds
// abs_in ((1/|q| + 1/|x|) + 1/(|q||x|)) per pair.
//
// Bounds used (each about twice what the derivation needs, which also covers the
// f32 rounding of the norms and of e itself, as in cpu.rs):
//  l2:     g = (qq + xx) - 2 dot;  e = (2 gamma(n+2) + delta + 12 u)(|q| + |x|)^2
//          + A (1 + |q| + |x|). The reference errs by gamma(n+2) D, D <= (|q|+|x|)^2;
//          g by 2 delta |q||x| <= delta/2 (|q|+|x|)^2 plus 5.2 u (|q|+|x|)^2 for its
//          own roundings and the f32 norms.
//  inner_product: g = -dot;  e = (2 gamma(n) + 2 delta + 4 u)|q||x| + A (1 + |q| + |x|).
//  cosine: g = 1 - (dot * (1/|q|)) * (1/|x|);  e = 4 gamma(n+6) + 2 delta + 24 u + A_cos.
//  A = (2m + n + 8) 2^-126 + abs_in (flushes and underflow, A3, times the operand magnitude
//  for the input flushes: hence the (1 + |q| + |x|) factor); for cosine, with
//  |q|, |x| >= 2^-30 (smaller are "special"), A_cos = (2m + n + 8) 2^-64; f16copy adds
//  abs_in ((q0 + x0) + q0 x0) (q0 = 1/|q|, x0 = 1/|x|, at most 2^30 each: finite).
// Rows and queries with a non-finite element, a squared norm above 2^100 or (cosine)
// below 2^-60 are "special" (as in cpu.rs): the host routes any search that meets
// one to the exact scan kernel, so every intermediate here is finite.
//
// Integers (precision int): the MMA dot product is exact (s32, no overflow within
// the dims the host admits: i8 <= 33025, u8 <= 32896 so that q.x < 2^31 and a squared
// norm's bits are no NaN pattern as a float), the squared
// norms are exact integers held as uint32 bits in the aux arrays, and g is computed
// from them exactly the way the reference finalises its exact integer accumulators,
// so lo = hi = d (e = 0).
#pragma once

#include "common.cuh"

namespace fraglink {
namespace knn {

// Precision of the candidate dot products (the `precision` matrix key).
// f16copy: f32 rows whose f16 copies the MMAs read (the exact fold reads the f32 rows).
enum precision_kind {
  precision_f16 = 0,
  precision_tf32 = 1,
  precision_tf32x3 = 2,
  precision_int = 3,
  precision_f16copy = 4
};
// Metric of the linked metric fragment, as knn_tile.cuh recognises it.
enum metric_kind { metric_l2 = 0, metric_inner_product = 1, metric_cosine = 2, metric_unknown = 3 };

// The bound constants of one search (dim and precision fixed), rounded up.
struct bound_consts {
  float c_l2;   // times (|q| + |x|)^2
  float c_ip;   // times |q||x|
  float c_cos;  // cosine's e, absolute terms included
  float abs;    // A, times (1 + |q| + |x|)
  float abs_in; // f16copy's input rounding (0 otherwise): cosine's per-pair term
};

// Whether `dim` is small enough for the bounds (gamma_tc(3 dim) < 1/2); larger dims
// use the exact scan.
FRAGLINK_HD FRAGLINK_INLINE bool dim_supported(uint32_t dim) { return dim >= 1 && dim <= (1u << 17); }

FRAGLINK_HD FRAGLINK_INLINE bound_consts make_bound_consts(uint32_t dim, int precision) {
  const double u = 5.9604644775390625e-08;        // 2^-24
  const double u_tc = 9.5367431640625e-07;        // 2^-20
  const double tiny = 1.1754943508222875e-38;     // 2^-126
  const double tiny_cos = 5.421010862427522e-20;  // 2^-64
  const double n = static_cast<double>(dim);
  const double m = precision == precision_tf32x3 ? 3.0 * n : n;
  const double eps_in = precision == precision_tf32     ? 0.00390625               // 2^-8
                        : precision == precision_tf32x3 ? 7.62939453125e-06        // 2^-17
                        : precision == precision_f16copy ? 0.000977039337158203125 // 2^-10 + 2^-21
                                                        : 0.0;
  const double gamma_tc = m * u_tc / (1.0 - m * u_tc);
  const double delta = eps_in + gamma_tc;
  const double g_n = n * u / (1.0 - n * u);
  const double g_n2 = (n + 2.0) * u / (1.0 - (n + 2.0) * u);
  const double g_n6 = (n + 6.0) * u / (1.0 - (n + 6.0) * u);
  const double abs_terms = 2.0 * m + n + 8.0;
  const double up = 1.0 + 1e-6;  // the f32 conversion below rounds; stay above
  double abs_in = 0.0;
  if (precision == precision_f16copy) {
    double r = 1.0;  // the least power of two >= sqrt(n), without a square root
    while (r * r < n) r *= 2.0;
    abs_in = 4.0 * ((2.98023223876953125e-08 + 1.4551915228366852e-11) * r  // (2^-25 + 2^-36) r
                    + n * 8.8817841970012523e-16);                          // n 2^-50
  }
  bound_consts c;
  c.c_l2 = static_cast<float>((2.0 * g_n2 + delta + 12.0 * u) * up);
  c.c_ip = static_cast<float>((2.0 * g_n + 2.0 * delta + 4.0 * u) * up);
  c.c_cos = static_cast<float>((4.0 * g_n6 + 2.0 * delta + 24.0 * u + abs_terms * tiny_cos) * up);
  c.abs = static_cast<float>((abs_terms * tiny + abs_in) * up);
  c.abs_in = static_cast<float>(abs_in * up);
  return c;
}

// lo, hi of one pair from an approximate float dot product. Per-vector values as
// src/search/cpu.rs's float_aux: l2 (|x|^2, |x|), inner_product (|x|, unused),
// cosine (1/|x|, unused); the same for the query.
FRAGLINK_HD FRAGLINK_INLINE void float_bounds(int metric, const bound_consts& c, float dot, float q0, float q1,
                                              float x0, float x1, float* lo, float* hi) {
  float g;
  float e;
  if (metric == metric_l2) {
    g = sub_rn(add_rn(q0, x0), mul_rn(2.0f, dot));
    const float s = add_rn(q1, x1);
    e = add_rn(mul_rn(c.c_l2, mul_rn(s, s)), mul_rn(c.abs, add_rn(1.0f, s)));
  } else if (metric == metric_inner_product) {
    g = -dot;
    e = add_rn(mul_rn(c.c_ip, mul_rn(q0, x0)), mul_rn(c.abs, add_rn(1.0f, add_rn(q0, x0))));
  } else {
    g = sub_rn(1.0f, mul_rn(mul_rn(dot, q0), x0));
    e = c.c_cos;
    if (c.abs_in > 0.0f) e = add_rn(e, mul_rn(c.abs_in, add_rn(add_rn(q0, x0), mul_rn(q0, x0))));
  }
  *lo = sub_rn(g, e);
  *hi = add_rn(g, e);
}

// The exact distance of one pair from an exact integer dot product and exact
// squared norms (integer dtypes): the reference's finalisation of its exact
// accumulators (l2: qq + xx - 2 dot = sum (q_j - x_j)^2, rounded to f32 once).
FRAGLINK_HD FRAGLINK_INLINE float int_distance(int metric, int64_t dot, uint32_t qq, uint32_t xx) {
  if (metric == metric_l2) {
    const int64_t d = static_cast<int64_t>(qq) + static_cast<int64_t>(xx) - 2 * dot;
    return static_cast<float>(d);
  }
  const float a = static_cast<float>(dot);
  if (metric == metric_inner_product) {
    return -a;
  }
  const float fq = static_cast<float>(qq);
  const float fx = static_cast<float>(xx);
  if (fq == 0.0f || fx == 0.0f) {
    return 1.0f;
  }
  return sub_rn(1.0f, div_rn(a, mul_rn(sqrt_rn(fq), sqrt_rn(fx))));
}

}  // namespace knn
}  // namespace fraglink
