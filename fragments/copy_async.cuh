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

// Asks L2 for the 32-byte sector that holds `p`, the first of `bytes` the caller
// wants there (prefetch.L2): a hint with no ordering, no result and no
// fault, so a block's cp.async pipeline, whose depth shared memory caps, finds
// rows a few steps ahead already on chip. A plain per-thread instruction: the
// sm_90 bulk form (cp.async.bulk.prefetch.L2) takes a warp-uniform address, and
// for one row segment per thread ptxas looped over the lanes. Under the kernel
// emulator the bytes are checked against the rows the running block may name
// (simt::prefetch).
__device__ FRAGLINK_INLINE void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(FRAGLINK_HOST_SIMT)
  simt::prefetch(p, bytes);
#elif defined(__CUDA_ARCH__)
  (void)bytes;
  asm volatile("prefetch.L2 [%0];\n" ::"l"(p));  // generic addressing: `p` is a generic pointer
#endif
}

// The bytes [begin, end) of `base`, a sector per thread in turn among `threads`
// (this one `tid`); only addresses inside the range are named.
__device__ FRAGLINK_INLINE void prefetch_l2_span(const void* base, uint64_t begin, uint64_t end, uint32_t tid,
                                                 uint32_t threads) {
  const char* const b = static_cast<const char*>(base);
  // Rolled: unrolled, these loops were a third of a knn_tile kernel's SASS.
#pragma unroll 1
  for (uint64_t at = begin + 32u * static_cast<uint64_t>(tid); at < end; at += 32u * static_cast<uint64_t>(threads)) {
    prefetch_l2(b + at, end - at < 32u ? static_cast<uint32_t>(end - at) : 32u);
  }
}

}  // namespace fraglink
