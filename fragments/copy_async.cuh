// fraglink fragments — global -> shared memory copies for kernels that pipeline
// their loads (the scan's row chunks, the k-NN candidates' tiles).
//
// Device-only, header-only, namespace fraglink. Included by scan.cuh, so every
// family that includes it has them.
#pragma once

#include "common.cuh"

namespace fraglink {

// 16- and 4-byte asynchronous copies (cp.async, sm_80+; zero-filled when `valid` is
// false), one commit group per pipeline step, and a wait until at most N groups of
// the calling thread are pending. L1: keep the data in L1 (`.ca`: the query tile,
// copied again every row iteration); else 16-byte copies bypass it (`.cg`: rows,
// read once). Before sm_80 (the f16 and integer variants on sm_75) they are plain
// loads and stores: correct, without the overlap. Under the kernel emulator a copy
// lands at issue or only at the wait that completes it (seeded), so a read that
// lacks its wait or barrier, or a copy into a stage still being read, gives wrong
// results.
template <int BYTES, bool L1>
__device__ FRAGLINK_INLINE void copy_async(void* dst, const void* src, bool valid) {
  static_assert(BYTES == 16 || BYTES == 4, "cp.async copies 4, 8 or 16 bytes");
#if defined(FRAGLINK_HOST_SIMT)
  simt::copy_async(dst, src, BYTES, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const uint32_t n = valid ? BYTES : 0u;
  if (BYTES == 16 && !L1) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(n) : "memory");
  } else if (BYTES == 16) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(n) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(src), "r"(n) : "memory");
  }
#else
  if (BYTES == 16) {
    *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
  } else {
    *static_cast<uint32_t*>(dst) = valid ? *static_cast<const uint32_t*>(src) : 0u;
  }
#endif
}

__device__ FRAGLINK_INLINE void copy_commit() {
#if defined(FRAGLINK_HOST_SIMT)
  simt::copy_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ FRAGLINK_INLINE void copy_wait() {
#if defined(FRAGLINK_HOST_SIMT)
  simt::copy_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace fraglink
