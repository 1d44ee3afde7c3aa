// fraglink fragments — common definitions shared by every family.
//
// Single source for three compilers:
//   * NVRTC (the build: `-dlto -rdc=true`, only device code exists),
//   * nvcc (should anyone compile the headers with it),
//   * a host C++ compiler (g++/clang++: tests compile metric.cuh / filter.cuh
//     against the Rust CPU reference). See fragments/README.md for the flags.
//
// Deliberately light: NVRTC compile time is dominated by headers. Measured with
// NVRTC 12.9: <cuda/std/cstdint> + cuda_fp16.h ≈ +35 ms over an empty file,
// <cuda/std/limits> ≈ +100 ms, <cuda/std/type_traits> ≈ +1.5 s (!). So no
// type_traits / limits here: the few traits we need are written out below.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FRAGLINK_CUDA_COMPILER 1
#define FRAGLINK_HD __host__ __device__
#define FRAGLINK_INLINE __forceinline__
#else
#define FRAGLINK_HD
#define FRAGLINK_INLINE inline
#endif

// Fixed-width integers. Under NVRTC this also declares ::int8_t, ::uint32_t, …
// (CCCL provides the global names there); on the host it includes <cstdint>.
#include <cuda/std/cstdint>
// __half. Host compilers need -I for the runtime wheel's include/ and a
// crt/host_defines.h (nvcc wheel's include/, or fragments/host/ — see README).
#include <cuda_fp16.h>

#if !defined(FRAGLINK_CUDA_COMPILER)
#include <cmath>
#endif

namespace fraglink {

// ---------------------------------------------------------------------------
// Element and index types, named by the `dtype` / `idx` matrix values.
// ---------------------------------------------------------------------------
typedef float data_f32;
typedef __half data_f16;
typedef int8_t data_i8;
typedef uint8_t data_u8;

typedef uint32_t idx_u32;
typedef int64_t idx_i64;

// Compile-time type equality (cuda/std/type_traits costs 1.5 s per NVRTC compile).
template <typename A, typename B>
struct same {
  static constexpr bool value = false;
};
template <typename A>
struct same<A, A> {
  static constexpr bool value = true;
};

// ---------------------------------------------------------------------------
// Correctly rounded float arithmetic, identical on host and device.
//
// The metrics use these instead of operators so that results do not depend on
// contraction (a*b+c → fma) or on fast-math flags given to NVRTC / nvJitLink:
// device code uses the explicit round-to-nearest intrinsics, host code uses
// IEEE operations and std::fma. A host reference that performs the same
// operations in the same order (Rust: f32::mul_add, f32::sqrt, / and -)
// reproduces the device result bit for bit.
// ---------------------------------------------------------------------------
FRAGLINK_HD FRAGLINK_INLINE float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
FRAGLINK_HD FRAGLINK_INLINE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FRAGLINK_HD FRAGLINK_INLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FRAGLINK_HD FRAGLINK_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FRAGLINK_HD FRAGLINK_INLINE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FRAGLINK_HD FRAGLINK_INLINE float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// Exact widening of an element to float (used by the float-accumulating types).
FRAGLINK_HD FRAGLINK_INLINE float to_float(float v) { return v; }
FRAGLINK_HD FRAGLINK_INLINE float to_float(__half v) { return __half2float(v); }
// Accumulator → float at finalisation (round to nearest, like Rust's `as f32`).
FRAGLINK_HD FRAGLINK_INLINE float to_float(int32_t v) { return static_cast<float>(v); }
FRAGLINK_HD FRAGLINK_INLINE float to_float(uint32_t v) { return static_cast<float>(v); }

}  // namespace fraglink
