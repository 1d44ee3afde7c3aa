// Many kernels in one plain CUDA file, compiled as is (no template engine:
// `{{0.0f}}` below is C++). The matrix entry arrives as -DBLOCK=<n>.
#include <stdint.h>
#include <cmath>
#include <math.h>
#include <climits>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <type_traits>
#include <cuda_bf16.h>

#ifndef BLOCK
#error "BLOCK comes from the matrix as -DBLOCK=<n>"
#endif

template <typename T>
__device__ T affine_one(T x, T a, T b) {
  static_assert(std::is_floating_point<T>::value, "affine needs a float type");
  return a * x + b;
}

extern "C" __global__ void __launch_bounds__(BLOCK) affine_f32(const float* x, float* y, float a, float b, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = affine_one(x[i], a, b);
}

extern "C" __global__ void __launch_bounds__(BLOCK) affine_f64(const double* x, double* y, double a, double b, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = affine_one(x[i], a, b);
}

extern "C" __global__ void __launch_bounds__(BLOCK) relu_f32(const float* x, float* y, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.0f);
}

// INFINITY from <math.h>: the running maximum starts below every value.
extern "C" __global__ void __launch_bounds__(BLOCK) max_abs_f32(const float* x, float* out, uint32_t n) {
  float m = -INFINITY;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, std::fabs(x[i]));
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // |x| >= 0: int order is float order
}

// M_PI from <math.h>.
extern "C" __global__ void __launch_bounds__(BLOCK) deg2rad_f32(const float* x, float* y, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * static_cast<float>(M_PI / 180.0);
}

// Brace initialisation, which a template engine would read as a tag.
extern "C" __global__ void __launch_bounds__(BLOCK) fill_zero_f32(float* y, uint32_t n) {
  float zero[1] = {{0.0f}};
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) memcpy(&y[i], zero, sizeof(float));
}

// INT_MAX from <climits>, abs from <cstdlib>, assert from <cassert>.
extern "C" __global__ void __launch_bounds__(BLOCK) saturate_abs_i32(const int32_t* x, int32_t* y, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  assert(n <= UINT32_MAX);
  if (i < n) y[i] = x[i] == INT_MIN ? INT_MAX : abs(x[i]);
}

// bf16 arithmetic exists from sm_80: this kernel is in the compute_80 and
// sm_90 IR only, not in compute_75's.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
extern "C" __global__ void __launch_bounds__(BLOCK) affine_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, float a, float b, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __hfma(__float2bfloat16(a), x[i], __float2bfloat16(b));
}
#endif
