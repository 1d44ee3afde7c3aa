#pragma once
template <typename T>
__device__ void axpy(T a, const T* x, T* y, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
