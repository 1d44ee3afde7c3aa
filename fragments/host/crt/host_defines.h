/* fraglink — minimal stand-in for CUDA's crt/host_defines.h, for HOST compilers only.
 *
 * cuda_fp16.h (runtime wheel) includes "crt/host_defines.h", which ships only in
 * the nvcc wheel (nvidia-cuda-nvcc-cu12, include/crt/). Host tests that compile
 * fragments/metric.cuh and fragments/filter.cuh with g++/clang++ may put
 * `-I fragments/host` after the runtime and CCCL include dirs instead of
 * installing that 40 MB wheel. This file reproduces what the real header defines
 * for a GNU-compatible host compiler outside CUDA (no __CUDACC__): execution-space
 * and builtin annotations expand to nothing, alignment and inlining to GNU
 * attributes. It must never be seen by NVRTC or nvcc (they bring their own), and
 * it is not on NVRTC's include path: NVRTC gets -I fragments/, and nothing there
 * includes "host/...".
 */
#if !defined(__HOST_DEFINES_H__)
#define __HOST_DEFINES_H__

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#error "fragments/host/crt/host_defines.h is for host compilers only; use the CUDA toolkit's crt/host_defines.h"
#endif
#if !defined(__GNUC__)
#error "fragments/host/crt/host_defines.h supports GNU-compatible host compilers (g++, clang++) only"
#endif

#define __no_return__ __attribute__((noreturn))
#undef __forceinline__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __inline_hint__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __maxnreg__(a)
#define __local_maxnreg__(a)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a)
#define __location__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __specialization_static

#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __grid_constant__
#define __nv_pure__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __block_size__(...)
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__

#define __CUDA_ARCH_HAS_FEATURE__(_FEAT) __CUDA_ARCH_FEAT_##_FEAT
#define __CUDA_HAS_ARCH_FAMILY_SPECIFIC(N) 0
#define __CUDA_HAS_ARCH_SPECIFIC(N) 0

#endif /* !__HOST_DEFINES_H__ */
