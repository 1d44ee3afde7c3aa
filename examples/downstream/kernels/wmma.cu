// WMMA (tensor cores, sm_70+): <mma.h> needs CUDA's crt/mma.h.
#include <mma.h>
#include <cuda_fp16.h>

// One warp computes a 16x16 tile: C = A (16x16, row-major) * B (16x16, col-major).
extern "C" __global__ void wmma_16x16x16_f16(const __half* a, const __half* b, float* c) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
