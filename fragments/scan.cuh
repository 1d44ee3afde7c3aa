// fraglink fragments — the brute-force top-k scan (algorithm code of the `scan` family).
//
// Device-only. templates/scan.cu.j2 instantiates fraglink::scan::run<T, Idx, VL, CAP>
// inside an extern "C" __global__ entry point named after the fragment. Distances
// and filtering come from the metric and filter fragments linked beside it (abi.cuh).
//
// Algorithm (one block of FRAGLINK_SCAN_BLOCK threads per query, grid-stride over
// queries; with gridDim.y > 1, per query and row split, see "Row splits" below):
//   shared memory holds S = next_pow2(CAP + BLOCK) (distance, id) keys. Slots
//   [0, CAP) are the best keys so far, sorted ascending; slots [CAP, S) are scratch.
//   for each tile of BLOCK consecutive rows:
//     thread t computes the distance of row tile + t (if it exists and the filter
//     allows it), folding elements in order through the metric; a NaN distance
//     becomes +inf. The rows come through shared memory in 128-byte chunks, the
//     next chunk in flight while one is folded (RowStage; from sm_80), where the variant's
//     copies are 4 or 16 bytes; else each thread loads its row with VL-element
//     vector loads.
//     the key is a candidate iff it is smaller than the current k-th best key.
//     if any thread of the block has a candidate (__syncthreads_or): the tile's keys
//     (candidates, else the sentinel) take the next BLOCK scratch slots, and once
//     the scratch is full a bitonic sort of all S slots restores "best CAP keys,
//     sorted" in [0, CAP) (BlockTopK).
//   finally what is pending is sorted in, and slots [0, k) are the answer.
// Keys compare lexicographically by (distance, id as unsigned): equal distances are
// broken by the smaller id, and the sentinel (+inf, all-ones id) sorts after every
// real row, +inf-distance rows included. Correctness: a key that was not a
// candidate was not smaller than the k-th best at that time, and the k-th best only
// decreases, so it cannot be among the final k; the sorts keep the CAP >= k smallest
// of everything that was a candidate. Hence the result is exactly the k smallest keys
// over all allowed rows, padded with sentinels when fewer than k rows are allowed.
#pragma once

#include "abi.cuh"
#include "copy_async.cuh"

// Threads per block. The launcher must launch exactly this many (blockDim = (128,1,1)).
#define FRAGLINK_SCAN_BLOCK 128

namespace fraglink {
namespace scan {

// ----- the linked metric, by element type ---------------------------------------
template <typename T>
struct metric_abi;

template <>
struct metric_abi<float> {
  typedef fraglink_metric_state_f32 state;
  static __device__ FRAGLINK_INLINE void init(state* s) { fraglink_metric_init_f32(s); }
  static __device__ FRAGLINK_INLINE void accumulate(state* s, float q, float x) {
    fraglink_metric_accumulate_f32(s, q, x);
  }
  static __device__ FRAGLINK_INLINE float finalize(const state* s) { return fraglink_metric_finalize_f32(s); }
};
template <>
struct metric_abi<__half> {
  typedef fraglink_metric_state_f16 state;
  static __device__ FRAGLINK_INLINE void init(state* s) { fraglink_metric_init_f16(s); }
  static __device__ FRAGLINK_INLINE void accumulate(state* s, __half q, __half x) {
    fraglink_metric_accumulate_f16(s, q, x);
  }
  static __device__ FRAGLINK_INLINE float finalize(const state* s) { return fraglink_metric_finalize_f16(s); }
};
template <>
struct metric_abi<int8_t> {
  typedef fraglink_metric_state_i8 state;
  static __device__ FRAGLINK_INLINE void init(state* s) { fraglink_metric_init_i8(s); }
  static __device__ FRAGLINK_INLINE void accumulate(state* s, int8_t q, int8_t x) {
    fraglink_metric_accumulate_i8(s, q, x);
  }
  static __device__ FRAGLINK_INLINE float finalize(const state* s) { return fraglink_metric_finalize_i8(s); }
};
template <>
struct metric_abi<uint8_t> {
  typedef fraglink_metric_state_u8 state;
  static __device__ FRAGLINK_INLINE void init(state* s) { fraglink_metric_init_u8(s); }
  static __device__ FRAGLINK_INLINE void accumulate(state* s, uint8_t q, uint8_t x) {
    fraglink_metric_accumulate_u8(s, q, x);
  }
  static __device__ FRAGLINK_INLINE float finalize(const state* s) { return fraglink_metric_finalize_u8(s); }
};

// ----- the linked filter and the id conventions, by index type --------------------
template <typename Idx>
struct idx_abi;

template <>
struct idx_abi<uint32_t> {
  typedef uint32_t ukey;                                // ids compare as this type
  static constexpr uint32_t invalid = 0xFFFFFFFFu;      // padding id: all ones
  static __device__ FRAGLINK_INLINE bool allows(const uint32_t* bits, uint32_t query, uint32_t row) {
    return fraglink_filter_u32(bits, query, row);
  }
};
template <>
struct idx_abi<int64_t> {
  typedef uint64_t ukey;
  static constexpr int64_t invalid = -1;                // all ones: largest as unsigned
  static __device__ FRAGLINK_INLINE bool allows(const uint32_t* bits, uint32_t query, int64_t row) {
    return fraglink_filter_i64(bits, query, row);
  }
};

// ----- helpers ---------------------------------------------------------------------
__device__ FRAGLINK_INLINE float pos_inf() { return __int_as_float(0x7f800000); }

__host__ __device__ constexpr int next_pow2(int v) {
  int p = 1;
  while (p < v) {
    p <<= 1;
  }
  return p;
}

// (da, ia) < (db, ib): by distance, then by id as unsigned. Distances are never NaN.
template <typename Idx>
__device__ FRAGLINK_INLINE bool key_less(float da, Idx ia, float db, Idx ib) {
  typedef typename idx_abi<Idx>::ukey U;
  return da < db || (da == db && static_cast<U>(ia) < static_cast<U>(ib));
}

// VL consecutive elements, aligned to their total size (16 bytes for the vector
// variants), so one row chunk is a single vector load.
template <typename T, int VL>
struct alignas(sizeof(T) * VL) vec {
  T v[VL];
};

template <typename T, int VL>
__device__ FRAGLINK_INLINE vec<T, VL> load_vec(const T* __restrict__ p) {
  return *reinterpret_cast<const vec<T, VL>*>(p);
}

// Distance between a query and a row of `dim` elements through the linked metric.
// Elements are folded strictly in order j = 0 .. dim-1 (whatever VL is).
// Requires dim % VL == 0 and both pointers aligned to sizeof(T) * VL (run() checks it
// with launch_ok before the first load).
template <typename T, int VL>
__device__ FRAGLINK_INLINE float distance(const T* __restrict__ q, const T* __restrict__ x, uint32_t dim) {
  typedef metric_abi<T> M;
  typename M::state st;
  M::init(&st);
  for (uint32_t j = 0; j < dim; j += VL) {
    const vec<T, VL> qv = load_vec<T, VL>(q + j);
    const vec<T, VL> xv = load_vec<T, VL>(x + j);
#pragma unroll
    for (int e = 0; e < VL; ++e) {
      M::accumulate(&st, qv.v[e], xv.v[e]);
    }
  }
  return M::finalize(&st);
}

// The comparators of an ascending bitonic sorting network over n slots (n a power of
// two), spread over BLOCK threads: cas(lo, hi, ascending) orders slots lo < hi, with
// a block barrier after each stage. Must be called by all threads of the block; ends
// with a barrier. One network for the scan's (distance, id) pairs and the select's
// 64-bit keys; n may be a compile-time constant after inlining.
//
// The stage loops stay rolled. Each stage ends in a block barrier, so unrolling saves
// only the loop's few integer instructions per stage, yet fully unrolled (n constant)
// the network was the larger part of the linked kernel: the cold link of
// scan_f32_u32_v4_k32 + metric_l2_f32 + filter_none_u32 for sm_90 took 139 ms in
// nvJitLink unrolled and 64 ms rolled (NVRTC/nvJitLink 12.9, a 2-core x86 VM), the
// first call on a new configuration being what issue 9 times.
template <int BLOCK, typename CompareSwap>
__device__ FRAGLINK_INLINE void bitonic_network(uint32_t n, CompareSwap cas) {
#pragma unroll 1
  for (uint32_t size = 2; size <= n; size <<= 1) {
#pragma unroll 1
    for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (uint32_t t = threadIdx.x; t < n / 2; t += BLOCK) {
        const uint32_t lo = 2 * t - (t & (stride - 1));  // pair t: lo, lo + stride
        cas(lo, lo + stride, (lo & size) == 0);
      }
      __syncthreads();
    }
  }
}

// The comparator of the scan's (distance, id) keys in shared memory, in key_less
// order. A struct with a forced-inline call, not a lambda: ptxas kept a lambda's
// captures in a stack frame in some variants (ivf_scan_i8_v16_k128 with inner product
// and a bitset: 8 bytes of spill on sm_90).
template <typename Idx>
struct PairCompareSwap {
  float* d;
  Idx* id;
  __device__ FRAGLINK_INLINE void operator()(uint32_t lo, uint32_t hi, bool ascending) const {
    const float dl = d[lo];
    const float dh = d[hi];
    const Idx il = id[lo];
    const Idx ih = id[hi];
    const bool swap = ascending ? key_less(dh, ih, dl, il) : key_less(dl, il, dh, ih);
    if (swap) {
      d[lo] = dh;
      d[hi] = dl;
      id[lo] = ih;
      id[hi] = il;
    }
  }
};

// Ascending bitonic sort of S (a power of two) (distance, id) keys in shared memory
// by BLOCK threads, in key_less order. Must be called by all threads of the block;
// ends with a barrier.
template <int S, int BLOCK, typename Idx>
__device__ FRAGLINK_INLINE void bitonic_sort(float* d, Idx* id) {
  bitonic_network<BLOCK>(S, PairCompareSwap<Idx>{d, id});
}

// The block-wide top-k shared by every scan (the IVF scan and the k-NN re-rank too),
// over S (distance, id) slots in shared memory: [0, CAP) the best keys so far, sorted
// (what the candidate test reads: slot k - 1), [CAP, S) scratch. The scratch holds
// PHASES = (S - CAP) / BLOCK tiles of offers: a tile with any candidate takes the next
// phase (thread t's slot CAP + phase * BLOCK + t: its key, or the sentinel), and the
// bitonic sort of all S slots runs only when every phase is taken, or at the last
// offer. A capacity of 1024 (S = 2048) thus sorts once per 8 tiles with candidates
// instead of once per tile. Deferring is exact: a key that was no candidate was not
// below the k-th best of the sorted slots at the time, and that k-th best only
// decreases. Scratch slots no phase wrote since the last sort hold keys that sort put
// there; each is above CAP keys that stay, so no later sort lifts it into [0, CAP).
// `phase` is the same in every thread (it changes only after a block-wide vote). offer
// must be called by all threads of the block.
//
// The sort has one call site, in offer: the caller's last offer says it is `last`,
// rather than a flush after the loop. The network is inlined where it is called, and
// a second site (that flush) doubled it wherever PHASES > 1: the cold link of
// scan_f16_u32_v8_k256 for sm_90 took 100 ms in nvJitLink with two, 79 ms with one
// (12.9; with PHASES = 1 the flush's sort was dead code). A caller that cannot tell
// its last tile ahead (the IVF scan) ends with one more offer, of no candidate.
template <int CAP, int S, int BLOCK, typename Idx>
struct BlockTopK {
  static constexpr int PHASES = (S - CAP) / BLOCK;
  static_assert(PHASES >= 1, "scratch must hold one candidate per thread");
  float* d;
  Idx* id;
  int phase;

  __device__ FRAGLINK_INLINE BlockTopK(float* dist, Idx* ids) : d(dist), id(ids), phase(0) {}

  // Thread t offers key (key, key_id) when `candidate` (it beats the k-th best).
  // `last` (the same in every thread): no offer follows, so what is pending is sorted
  // in; afterwards [0, CAP) holds the best CAP keys of all offers, visible to every
  // thread (the sort ends with a barrier; without a sort nothing was written since the
  // previous sort's barrier, and the vote is a barrier too). With no offer at all,
  // [0, CAP) is as the caller initialised it.
  __device__ FRAGLINK_INLINE void offer(bool candidate, float key, Idx key_id, bool last) {
    if (__syncthreads_or(candidate)) {
      const int slot = CAP + phase * BLOCK + static_cast<int>(threadIdx.x);
      d[slot] = candidate ? key : pos_inf();
      id[slot] = candidate ? key_id : idx_abi<Idx>::invalid;
      ++phase;
    }
    if (phase == PHASES || (last && phase != 0)) {
      __syncthreads();  // every phase's writes before the network reads them
      bitonic_sort<S, BLOCK>(d, id);
      phase = 0;
    }
  }
};

// Order-preserving u32 key of a float: a < b exactly when key(a) < key(b), and
// -0 and +0 share one key (they compare equal, as scan::key_less has them).
__device__ FRAGLINK_INLINE uint32_t order_key(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t c = u == 0x80000000u ? 0u : u;
  return (c & 0x80000000u) != 0u ? ~c : (c | 0x80000000u);
}

// The float of an order_key.
__device__ FRAGLINK_INLINE float from_order_key(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0u ? (key & 0x7fffffffu) : ~key);
}

// ----- the launch's dynamic shared memory ------------------------------------------
#if defined(FRAGLINK_HOST_SIMT)
__device__ FRAGLINK_INLINE unsigned char* dynamic_shared() { return simt::dynamic_shared(); }
__device__ FRAGLINK_INLINE uint32_t dynamic_shared_bytes() { return simt::dynamic_shared_bytes(); }
#else
__device__ FRAGLINK_INLINE unsigned char* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char fraglink_dynamic_shared[];
  return fraglink_dynamic_shared;
}
// What the launch gave (cuLaunchKernel's sharedMemBytes).
__device__ FRAGLINK_INLINE uint32_t dynamic_shared_bytes() {
  uint32_t r;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
  return r;
}
#endif

// Low bits of a pointer that must be zero for `align`-byte alignment (a power of two).
template <int ALIGN>
__device__ FRAGLINK_INLINE uint64_t misaligned_bits(const void* p) {
  static_assert(ALIGN >= 1 && (ALIGN & (ALIGN - 1)) == 0, "alignment must be a power of two");
  return reinterpret_cast<uint64_t>(p) & static_cast<uint64_t>(ALIGN - 1);
}

// The launch contract the kernel can check by itself (fragments/README.md): 1 <= k <=
// CAP, block = (BLOCK, 1, 1), dim % VL == 0, dataset and queries aligned to
// sizeof(T) * VL bytes (the vector loads), the filter words, ids and distances to their
// own size. Every operand is a kernel argument or the block shape, so the answer is the
// same for every thread of the grid: a violating launch writes nothing at all (no
// partial results) and, above all, never issues a misaligned load — that fault is
// sticky and would kill the caller's CUDA context. A caller detects a refused launch by
// pre-filling out_dists with NaN: a valid result never holds NaN (NaN ranks as +inf,
// padding is +inf), so NaN left in place means nothing was written. The host side checks the
// same rules first and names the argument (src/gpu/launch.rs, ScanContract). Checks
// that are constant for a variant (VL = 1, byte elements) compile away.
template <typename T, typename Idx, int VL, int CAP>
__device__ FRAGLINK_INLINE bool launch_ok(const T* dataset, const T* queries, const uint32_t* filter_bits,
                                          uint32_t dim, uint32_t k, const Idx* out_ids, const float* out_dists) {
  constexpr int VEC_BYTES = static_cast<int>(sizeof(T)) * VL;
  const uint64_t bad = misaligned_bits<VEC_BYTES>(dataset) | misaligned_bits<VEC_BYTES>(queries) |
                        misaligned_bits<static_cast<int>(sizeof(uint32_t))>(filter_bits) |
                        misaligned_bits<static_cast<int>(sizeof(Idx))>(out_ids) |
                        misaligned_bits<static_cast<int>(sizeof(float))>(out_dists) |
                        static_cast<uint64_t>(dim & static_cast<uint32_t>(VL - 1));
  return bad == 0 && k != 0 && k <= static_cast<uint32_t>(CAP) && blockDim.x == FRAGLINK_SCAN_BLOCK &&
         blockDim.y == 1 && blockDim.z == 1;
}

// Row splits: block (x, y) of a grid gridDim.y high scans the row tiles y, y + gridDim.y,
// y + 2 gridDim.y, ... of its queries (tile t: rows [t * BLOCK, min((t + 1) * BLOCK,
// n_rows))) and writes that split's best k at out[(q * gridDim.y + y) * k ...]; the host
// merges each query's splits in the same key order (src/search/splits.rs). So a few
// queries over many rows still fill the GPU; gridDim.y = 1 is one block per query.
// Interleaved tiles, not a contiguous range per split: the range's ends took divisions
// by gridDim.y, and ptxas expands each division into a long inline sequence (64-bit:
// about 8 ms of every cold scan link, nvJitLink 12.9, sm_90, a 2-core VM). The splits'
// results are the same either way: the merge orders by (distance, id).
//
// n_rows must stay below 2^63 (the kernel refuses the launch otherwise), so a tile's
// stride never wraps around.
constexpr uint64_t kMaxRows = 1ull << 63;

// ----- rows staged through shared memory -----------------------------------------
// The scan reads its rows in chunks of 128 bytes per row: a block copies the chunk
// of each of its tile's 128 rows into shared memory (the 16- or 4-byte copies of one
// row's chunk are consecutive threads' copies, so a warp reads whole 128-byte lines),
// and then each thread folds its own row's chunk from there, in element order. The
// next chunk (of this tile, else of the next) is in flight while the current one is
// folded, as a cp.async group from sm_80. Loading each thread's row straight from
// global memory instead touched 32 lines per warp load, 16 of 128 bytes used, and
// kept one load per thread in flight: on an H200 (GPU.md, commit 6f7ea6a) the scan
// of one query over 1M x 128 f32 took 695 us, 6.5x the 107 us its 512 MB take at
// the H200's 4.8 TB/s. Variants whose copies would be 1 or 2 bytes (f16, i8, u8 at
// veclen 1) keep the direct loads: cp.async copies 4, 8 or 16 bytes.
//
// From sm_80 only (and under the kernel emulator): before, the copies are plain loads
// and stores that overlap nothing, and the stages' 36 KB would leave one block on an
// sm_75 SM (64 KB of shared memory), so sm_75 keeps the direct loads.
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(FRAGLINK_HOST_SIMT)
#define FRAGLINK_SCAN_ROW_STAGES 1
#else
#define FRAGLINK_SCAN_ROW_STAGES 0
#endif
template <typename T, int VL>
struct RowStage {
  static constexpr int VEC = static_cast<int>(sizeof(T)) * VL;  // bytes of one copy
  static constexpr bool ENABLED = FRAGLINK_SCAN_ROW_STAGES && (VEC == 4 || VEC == 16);
  static constexpr int CHUNK_BYTES = 128;
  static constexpr int CH = CHUNK_BYTES / static_cast<int>(sizeof(T));  // elements
  static constexpr int PIECES = CHUNK_BYTES / VEC;                       // copies a row
  // A row's chunk is VEC bytes longer in shared memory than in global memory, so the
  // threads of a warp, each reading its own row, hit distinct banks.
  static constexpr int LD = CHUNK_BYTES + VEC;
  static constexpr int BYTES = FRAGLINK_SCAN_BLOCK * LD;  // one stage
};

__device__ FRAGLINK_INLINE uint32_t min_u32(uint64_t a, uint32_t b) {
  return a < b ? static_cast<uint32_t>(a) : b;
}

// Starts the copy of chunk c (elements [c * CH, min(dim, (c + 1) * CH))) of rows
// [tile, tile + rows) into `stage` (row r at r * LD bytes) as one commit group. Must be
// called by all threads of the block.
template <typename T, int VL>
__device__ FRAGLINK_INLINE void stage_chunk(unsigned char* stage, const T* __restrict__ dataset, uint64_t tile,
                                            uint32_t rows, uint32_t dim, uint32_t c) {
  typedef RowStage<T, VL> RS;
  const uint32_t first = c * static_cast<uint32_t>(RS::CH);
  const uint32_t pieces = min_u32(dim - first, static_cast<uint32_t>(RS::CH)) / VL;
  // Rolled: the copies are asynchronous, so they are all in flight either way.
#pragma unroll 1
  for (int pass = 0; pass < RS::PIECES; ++pass) {
    const uint32_t i = static_cast<uint32_t>(pass * FRAGLINK_SCAN_BLOCK) + threadIdx.x;
    const uint32_t r = i / RS::PIECES;
    const uint32_t p = i % RS::PIECES;
    if (r < rows && p < pieces) {
      copy_async<RS::VEC, false>(stage + r * RS::LD + p * RS::VEC, dataset + (tile + r) * dim + first + p * VL, true);
    }
  }
  copy_commit();
}

// Folds `elems` elements of a row chunk `x` (staged in shared memory here; a whole
// row in global memory for knn_tile.cuh's rare exact pass) and the query's `q` into
// `st`, in order: the same steps as distance() takes over those elements. Rolled: the scan is
// bound by memory with ample issue slots to spare (by estimate about 10 of 128 per SM
// and cycle at an H200's bandwidth for f32), and unrolled (whole chunks, or two vectors a step)
// the loop made the cold link 30 to 90 ms longer (nvJitLink 12.9, sm_90).
template <typename T, int VL>
__device__ FRAGLINK_INLINE void fold_chunk(typename metric_abi<T>::state* st, const unsigned char* x,
                                           const T* __restrict__ q, uint32_t elems) {
  typedef metric_abi<T> M;
#pragma unroll 1
  for (uint32_t j = 0; j < elems; j += VL) {
    const vec<T, VL> xv = *reinterpret_cast<const vec<T, VL>*>(x + j * sizeof(T));
    const vec<T, VL> qv = load_vec<T, VL>(q + j);
#pragma unroll
    for (int e = 0; e < VL; ++e) {
      M::accumulate(st, qv.v[e], xv.v[e]);
    }
  }
}

// The whole scan; see the top of this file and fragments/README.md for the contract.
template <typename T, typename Idx, int VL, int CAP>
__device__ FRAGLINK_INLINE void run(const T* __restrict__ dataset, const T* __restrict__ queries,
                                    const uint32_t* __restrict__ filter_bits, uint64_t n_rows, uint32_t dim,
                                    uint32_t n_queries, uint32_t k, Idx* __restrict__ out_ids,
                                    float* __restrict__ out_dists) {
  constexpr int BLOCK = FRAGLINK_SCAN_BLOCK;
  constexpr int S = next_pow2(CAP + BLOCK);
  static_assert(VL >= 1 && (VL & (VL - 1)) == 0, "veclen must be a power of two");
  static_assert(CAP >= 1 && (CAP & (CAP - 1)) == 0, "capacity must be a power of two");

  typedef RowStage<T, VL> RS;

  __shared__ float s_dist[S];
  __shared__ Idx s_id[S];
  // Two stages of row chunks (RowStage), where the variant stages its rows.
  __shared__ __align__(16) unsigned char s_rows[RS::ENABLED ? 2 * RS::BYTES : 16];

  // Contract violations write nothing: every block returns before its first memory
  // access (see launch_ok).
  if (!launch_ok<T, Idx, VL, CAP>(dataset, queries, filter_bits, dim, k, out_ids, out_dists)) {
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const float inf = pos_inf();
  const Idx invalid = idx_abi<Idx>::invalid;
  if (n_rows >= kMaxRows) {
    return;
  }
  const uint64_t split = blockIdx.y;
  const uint64_t splits = gridDim.y;
  const uint64_t first_tile = split * BLOCK;
  const uint64_t stride = splits * BLOCK;  // between this split's tiles

  for (uint64_t q = blockIdx.x; q < n_queries; q += gridDim.x) {  // 64-bit: no wrap-around
    // The short loops stay rolled: unrolled (4x, with a remainder) they run the
    // same stores and cost ptxas time at every cold link.
#pragma unroll 1
    for (int i = tid; i < S; i += BLOCK) {
      s_dist[i] = inf;
      s_id[i] = invalid;
    }
    __syncthreads();

    const T* __restrict__ qrow = queries + q * dim;
    BlockTopK<CAP, S, BLOCK, Idx> top(s_dist, s_id);
    // The staged rows' chunk count, and their first chunk in flight (RowStage).
    uint32_t chunks = 0;
    int stage = 0;  // the stage the current chunk is in
    if constexpr (RS::ENABLED) {
      chunks = (dim + RS::CH - 1) / RS::CH;
      if (chunks != 0 && first_tile < n_rows) {
        stage_chunk<T, VL>(s_rows, dataset, first_tile, min_u32(n_rows - first_tile, BLOCK), dim, 0);
      }
    } else {
      (void)s_rows;
      (void)chunks;
      (void)stage;
    }
    for (uint64_t tile = first_tile; tile < n_rows; tile += stride) {
      const bool last = tile + stride >= n_rows;
      const uint64_t row = tile + static_cast<uint64_t>(tid);
      const bool active =
          row < n_rows && idx_abi<Idx>::allows(filter_bits, static_cast<uint32_t>(q), static_cast<Idx>(row));
      float d = inf;
      if constexpr (RS::ENABLED) {
        typedef metric_abi<T> M;
        typename M::state st;
        M::init(&st);
#pragma unroll 1
        for (uint32_t c = 0; c < chunks; ++c) {
          // The next chunk into the other stage (whose last reader passed the barrier
          // that ended the previous step), or an empty group: the wait counts groups.
          // One call site: each is inlined, and the copies' loop is ptxas time.
          const bool same_tile = c + 1 < chunks;
          const uint64_t next_tile = same_tile ? tile : tile + stride;
          if (next_tile < n_rows) {
            stage_chunk<T, VL>(s_rows + (stage ^ 1) * RS::BYTES, dataset, next_tile, min_u32(n_rows - next_tile, BLOCK),
                               dim, same_tile ? c + 1 : 0);
          } else {
            copy_commit();
          }
          copy_wait<1>();
          __syncthreads();  // every thread's copies of this chunk have landed
          if (active) {
            const uint32_t first = c * static_cast<uint32_t>(RS::CH);
            fold_chunk<T, VL>(&st, s_rows + stage * RS::BYTES + tid * RS::LD, qrow + first,
                              min_u32(dim - first, static_cast<uint32_t>(RS::CH)));
          }
          __syncthreads();  // read before the next step copies into this stage
          stage ^= 1;
        }
        if (active) {
          d = M::finalize(&st);
        }
      } else if (active) {
        d = distance<T, VL>(qrow, dataset + row * dim, dim);
      }
      Idx id = invalid;
      bool candidate = false;
      if (active) {
        if (d != d) {
          d = inf;  // NaN → +inf: the row stays a valid (last-ranked) result
        }
        id = static_cast<Idx>(row);
        candidate = key_less(d, id, s_dist[k - 1], s_id[k - 1]);
      }
      top.offer(candidate, d, id, last);
    }

    const uint64_t out = (q * splits + split) * k;
#pragma unroll 1
    for (uint32_t j = static_cast<uint32_t>(tid); j < k; j += BLOCK) {
      out_ids[out + j] = s_id[j];
      out_dists[out + j] = s_dist[j];
    }
    __syncthreads();  // the next query re-initialises the shared keys
  }
}

}  // namespace scan
}  // namespace fraglink
