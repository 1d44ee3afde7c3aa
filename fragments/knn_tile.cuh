// fraglink fragments — exact k-NN from tensor-core candidates (families `knn_tile`
// and `knn_rerank`).
//
// Device-only. Two kernels, each linked with one metric fragment of its dtype
// (knn_tile also with one filter_*_u32 fragment), exactly like the scan family:
//
// knn_tile<T, PREC, QT, RT, CAP, STAGING> — candidates. Grid = (query tiles, row chunks):
//   block (x, y) takes queries [QT x, QT x + QT) and rows [chunk_rows y,
//   chunk_rows (y + 1)), so a small batch (nq = 1) still spreads over every SM (the
//   "small batch split"). Four warps; per row iteration the block covers QT queries
//   x RT rows, each warp FQ x FR tiles of 16 x 16 dot products from the tensor
//   cores (tile_shape: WMMA f16 -> f32 accumulation, TF32 or 3xTF32 for f32, s8/u8
//   -> s32; f16copy: f32 rows whose f16 copies, made once by the host, the f16 MMA
//   reads: half the bytes of the f32 rows, the exact fold still on the f32 rows),
//   loading each operand fragment once for FQ or FR MMAs. K is consumed in
//   chunks of 64 bytes staged in shared memory (zero padded, so any dim), laid out
//   in slabs of one MMA K step, rows padded so fragment loads are free of bank
//   conflicts and 32-byte aligned. Chunks come through a pipeline of STAGES
//   buffers (cp.async where the arch, dim and alignment allow), so the next
//   STAGES - 1 chunks' global loads overlap the MMAs and the select; the
//   `prefetch` chunks after those are asked of L2 (prefetch_l2). STAGING
//   (staging_any, staging_a16) decides which copies a variant holds: any dim and
//   alignment (16-byte, 4-byte or element copies, chosen at run time), or rows
//   that are whole 16-byte groups, 16-byte aligned, only (the host picks it for such
//   data; the kernel refuses other launches). The other two copy paths are about
//   30% of a variant's code, and so of its link time (883 -> 598 ms for
//   q64_r64_k32 tf32x3 on sm_90, nvJitLink 13.0). From each dot product and the precomputed norms (knn_bounds.cuh) a
//   pair gets lo <= d <= hi (integers: lo = hi = d). The select is fused: per
//   query a buffer of BUF = CAP + RT (lo, hi, id) entries in dynamic shared memory
//   takes the rows with lo < T, T an upper bound of the k-th smallest key of the chunk so far; the
//   distance matrix is never written. When a buffer holds more than CAP entries a
//   warp compacts it: T = min(T, k-th smallest hi of the buffer), keep lo <= T; if
//   more than CAP remain (many equal distances), the members' exact distances come
//   from the linked metric's in-order fold and the exact best k by (d, id) stay
//   (lo = hi = d). At the chunk's end the same compaction (down to <= CAP) and the
//   entries go to out_{count, lo, hi, ids}[(q * n_chunks + chunk) * CAP + j].
//   Why no true neighbour is lost: a row is dropped only (a) at insertion with
//   lo >= T, T justified by k rows of the same chunk with smaller ids (T changes only
//   between iterations, and iterations go up in id) whose hi <= T, so k keys
//   (d', id') < (d, id) exist; (b) at compaction with lo > T: k members have
//   d' <= hi' <= T < lo <= d; (c) by the exact reduction: k members precede it by
//   exact key; (d) at insertion or compaction (the chunk's last too) with lo > B, B
//   the bound the query's chunks share (shared_bound: the least T any of them
//   published, or the union bound of their certificates), so k rows, of one chunk or of
//   several, have d' <= B < lo <= d. src/search/cpu.rs uses rules (a)-(c).
//
// knn_rerank<T, CAP> — merge and exact re-rank, one block per query and group of chunks
//   (grid-stride; with many chunks a merge launch over groups of chunks comes first,
//   see run_rerank). Each pass visits the written slots only, packed by a prefix sum
//   of the chunks' counts (pack_counts):
//   pass 1: U = the k-th smallest hi over the chunks' candidates (a block-wide top-k of
//   (hi, id) keys, scan.cuh's BlockTopK); pass 2: every candidate with lo <= U gets
//   its exact distance from the linked metric (the in-order fold of the scan kernel,
//   NaN -> +inf) and the k smallest (d, id) keys are the result, padded with
//   (+inf, 0xFFFFFFFF) as the scan pads. A candidate with lo > U has k candidates
//   with d' <= hi' <= U < lo <= d. So results equal the scan kernel's and the CPU
//   path's bit for bit. Where every candidate is exact already (exact_bounds: integer
//   candidates, and the final launch over a merge level's exact best k), pass 1's
//   (hi, id) keys are the (d, id) keys and pass 2 is skipped.
//
// Not handled here (the host routes such searches to the scan kernel, or where
// k > 256, the scan's largest capacity, to the two-pass select of knn_select.cuh): rows or queries that are
// "special" for the bounds (knn_bounds.cuh), k > CAP (1024 at most), n_rows >=
// 2^32 - 1 (ids are u32), dim beyond knn::dim_supported, u8 dim > 32896; and for
// f16copy (searches that name it, else refused with an error) rows or queries with
// an element beyond f16's finite range.
#pragma once

#include <mma.h>

#include "knn_bounds.cuh"
#include "scan.cuh"

// Threads per block of both kernels (blockDim = (128, 1, 1) exactly).
#define FRAGLINK_KNN_BLOCK 128

namespace fraglink {
namespace knn {

namespace wmma = nvcuda::wmma;

// ----- the tensor-core step per (element type, precision) ------------------------
// Operands come from shared memory as K-element slabs: 16 query rows (A, row-major)
// or 16 dataset rows (B, col-major: a dataset row is a column of B), row r at r * LD,
// LD a multiple of 16 bytes, every fragment 32-byte aligned. load_a / load_b bring one
// fragment into registers in the form the MMA takes (converted to TF32, or split
// into TF32 hi + lo), so a warp that computes several 16 x 16 tiles loads each
// operand once and reuses it; `multiply` adds one 16 x 16 x K product to `acc`.
template <typename T, int PREC>
struct mma;

// m16n16k16 with the inputs as they are: f16 -> f32, s8/u8 -> s32.
template <typename E, typename Acc>
struct mma_k16 {
  static constexpr int K = 16;
  typedef E staged;
  typedef Acc acc_t;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 16, Acc> acc_frag;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a_op;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> b_op;
  static __device__ FRAGLINK_INLINE void load_a(a_op& a, const staged* p, unsigned ld) {
    wmma::load_matrix_sync(a, p, ld);
  }
  static __device__ FRAGLINK_INLINE void load_b(b_op& b, const staged* p, unsigned ld) {
    wmma::load_matrix_sync(b, p, ld);
  }
  static __device__ FRAGLINK_INLINE void multiply(acc_frag& acc, const a_op& a, const b_op& b) {
    wmma::mma_sync(acc, a, b, acc);
  }
};
template <>
struct mma<__half, precision_f16> : mma_k16<__half, float> {};
template <>
struct mma<int8_t, precision_int> : mma_k16<signed char, int> {};
template <>
struct mma<uint8_t, precision_int> : mma_k16<unsigned char, int> {};
// f32 rows through their f16 copies (`staged` differs from the row type: run_tile
// stages the copies and the exact fold reads the f32 rows).
template <>
struct mma<float, precision_f16copy> : mma_k16<__half, float> {};

// On the host only under tests/support/simt (the kernel emulator).
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(FRAGLINK_HOST_SIMT)
// TF32 (sm_80+). THREE = 3xTF32: x = hi + lo, acc += lo_a hi_b + hi_a lo_b + hi_a hi_b.
template <typename F, bool THREE>
struct tf32_op;
template <typename F>
struct tf32_op<F, false> {
  F v;
  __device__ FRAGLINK_INLINE void set(const F& x) {
#pragma unroll
    for (int i = 0; i < x.num_elements; ++i) v.x[i] = wmma::__float_to_tf32(x.x[i]);
  }
};
template <typename F>
struct tf32_op<F, true> {
  F hi, lo;
  __device__ FRAGLINK_INLINE void set(const F& x) {
#pragma unroll
    for (int i = 0; i < x.num_elements; ++i) {
      const float h = wmma::__float_to_tf32(x.x[i]);
      hi.x[i] = h;
      lo.x[i] = wmma::__float_to_tf32(sub_rn(x.x[i], h));
    }
  }
};

template <bool THREE>
struct mma_tf32 {
  static constexpr int K = 8;
  typedef float staged;
  typedef float acc_t;
  typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc_frag;
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a_frag;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b_frag;
  typedef tf32_op<a_frag, THREE> a_op;
  typedef tf32_op<b_frag, THREE> b_op;
  static __device__ FRAGLINK_INLINE void load_a(a_op& a, const staged* p, unsigned ld) {
    a_frag f;
    wmma::load_matrix_sync(f, p, ld);
    a.set(f);
  }
  static __device__ FRAGLINK_INLINE void load_b(b_op& b, const staged* p, unsigned ld) {
    b_frag f;
    wmma::load_matrix_sync(f, p, ld);
    b.set(f);
  }
  static __device__ FRAGLINK_INLINE void multiply(acc_frag& acc, const tf32_op<a_frag, false>& a,
                                             const tf32_op<b_frag, false>& b) {
    wmma::mma_sync(acc, a.v, b.v, acc);
  }
  static __device__ FRAGLINK_INLINE void multiply(acc_frag& acc, const tf32_op<a_frag, true>& a,
                                             const tf32_op<b_frag, true>& b) {
    wmma::mma_sync(acc, a.lo, b.hi, acc);
    wmma::mma_sync(acc, a.hi, b.lo, acc);
    wmma::mma_sync(acc, a.hi, b.hi, acc);
  }
};
template <>
struct mma<float, precision_tf32> : mma_tf32<false> {};
template <>
struct mma<float, precision_tf32x3> : mma_tf32<true> {};
#endif

// ----- the linked metric, recognised --------------------------------------------
template <typename T>
__device__ FRAGLINK_INLINE T small_value(int v);
template <>
__device__ FRAGLINK_INLINE float small_value<float>(int v) {
  return static_cast<float>(v);
}
template <>
__device__ FRAGLINK_INLINE __half small_value<__half>(int v) {
  return __int2half_rn(v);
}
template <>
__device__ FRAGLINK_INLINE int8_t small_value<int8_t>(int v) {
  return static_cast<int8_t>(v);
}
template <>
__device__ FRAGLINK_INLINE uint8_t small_value<uint8_t>(int v) {
  return static_cast<uint8_t>(v);
}

// Which metric the program linked, from the linked finalize alone on a state made
// here, {a 2, qq 0, xx 0}: l2 gives 2, inner_product -2, cosine 1 (its rule for a
// zero norm). No arithmetic is involved, so once nvJitLink inlines finalize this
// folds to a constant and the kernel holds one metric's bounds. A probe through
// accumulate does not fold: the metrics' `_rn` arithmetic is opaque to NVVM's
// constant folder, and with such a probe every variant held all three metrics'
// bounds, its pair loop compiled once per metric (about a third of its link time).
// Anything else (a user metric) is metric_unknown and the kernel refuses to run.
template <typename T>
__device__ FRAGLINK_INLINE int linked_metric() {
  typedef scan::metric_abi<T> M;
  typedef decltype(typename M::state{}.a) Acc;
  typename M::state s;
  s.a = Acc(2);
  s.qq = Acc(0);
  s.xx = Acc(0);
  const float v = M::finalize(&s);
  if (v == 2.0f) return metric_l2;
  if (v == -2.0f) return metric_inner_product;
  if (v == 1.0f) return metric_cosine;
  return metric_unknown;
}

// Whether the linked accumulate is the recognised metric's, checked at run time on
// the one-element pair q = (1), x = (3): the state l2 leaves is {4, 0, 0},
// inner_product's {3, 0, 0}, cosine's {3, 1, 9} (the dot product and both squared
// norms). A user metric whose finalize looks like a built-in one on the state above
// is refused here unless it also accumulates as that metric on this pair. One call
// site of init and accumulate beside the kernel's own (more made nvJitLink's
// inliner give up on some variants, which then spilled).
template <typename T>
__device__ FRAGLINK_INLINE bool metric_confirmed(int metric) {
  typedef scan::metric_abi<T> M;
  typedef decltype(typename M::state{}.a) Acc;
  typename M::state s;
  M::init(&s);
  M::accumulate(&s, small_value<T>(1), small_value<T>(3));
  if (metric == metric_l2) return s.a == Acc(4) && s.qq == Acc(0) && s.xx == Acc(0);
  if (metric == metric_inner_product) return s.a == Acc(3) && s.qq == Acc(0) && s.xx == Acc(0);
  if (metric == metric_cosine) return s.a == Acc(3) && s.qq == Acc(1) && s.xx == Acc(9);
  return false;
}

// The reference distance (scan.cuh's in-order fold), NaN -> +inf. ROLLED: the same
// steps through scan::fold_chunk, whose loop NVVM leaves rolled, for compact's exact pass,
// which runs only where a buffer holds more than CAP entries of equal bounds. Unrolled
// there, it held 60 of the 88 global loads in knn_tile_f32_f16copy_q16_r64_k32_a16's
// sm_90 SASS and set the kernel's register count (88 -> 63 when it was rolled; f16 q16
// k128 128 -> 100, i8 q16 k32 87 -> 63; nvJitLink 12.9), for a link about as long.
template <typename T, bool ROLLED = false>
__device__ FRAGLINK_INLINE float exact_distance(const T* q, const T* x, uint32_t dim) {
  float d;
  if (ROLLED) {
    typedef scan::metric_abi<T> M;
    typename M::state st;
    M::init(&st);
    scan::fold_chunk<T, 1>(&st, reinterpret_cast<const unsigned char*>(x), q, dim);
    d = M::finalize(&st);
  } else {
    d = scan::distance<T, 1>(q, x, dim);
  }
  return d != d ? scan::pos_inf() : d;
}

// ----- one query's candidate buffer, compacted by one warp -----------------------
struct buffer {
  float* lo;
  float* hi;
  uint32_t* id;
  uint32_t* count;
  float* thr;
};

// The union bound's inputs for one (query, chunk) (union_of; see the union bound
// below): the query's certificates (null: off), this chunk's index, `sample`
// certificates read, the i-th at (i * spread) >> 8 (spread = n_chunks beyond
// UNION_SAMPLE chunks: spread evenly over them; else 256: every one), j rows per
// certificate, r certificates for k rows.
struct union_args {
  uint32_t* certs;
  uint32_t chunk;
  uint32_t spread;
  uint32_t sample;
  uint32_t j;
  uint32_t r;
};

using scan::from_order_key;
using scan::order_key;

// What a select ranks: a buffer's entries by `hi` alone (its order_key in the top 32
// bits), by (lo, id) (scan::key_less's order once lo holds exact distances), or the
// union bound's sample of certificates (in the top 32 bits; other blocks lower them
// meanwhile, so each round reads them afresh).
enum key_kind { key_hi, key_lo_id, key_cert };

// The 64-bit key i of `kind`.
__device__ FRAGLINK_INLINE uint64_t entry_key(const buffer& b, const union_args& u, uint32_t i, int kind) {
  if (kind == key_cert) {
    return static_cast<uint64_t>(*reinterpret_cast<const volatile uint32_t*>(u.certs + ((i * u.spread) >> 8))) << 32;
  }
  return kind == key_lo_id ? (static_cast<uint64_t>(order_key(b.lo[i])) << 32) | b.id[i]
                           : static_cast<uint64_t>(order_key(b.hi[i])) << 32;
}

// One round of a warp's radix select: the byte (bin of the 256-word `hist`, filled
// with the counts of the keys that share the bytes found so far) that holds the
// `rank`-th of them (1-based), by a prefix sum over the lanes (lane l owns bins
// 8l..8l+7); *skipped = the keys in the bins before it; 256 where fewer than `rank`
// were counted. The same in every lane.
__device__ FRAGLINK_INLINE uint32_t pick_digit(const uint32_t* hist, uint32_t rank, uint32_t lane,
                                               uint32_t* skipped) {
  uint32_t c[8];
  uint32_t sum = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    c[j] = hist[8u * lane + static_cast<uint32_t>(j)];
    sum += c[j];
  }
  // Inclusive prefix sum over the lanes (a butterfly: `group` is the sum of the
  // aligned group of lanes `incl` has seen so far).
  uint32_t incl = sum;
  uint32_t group = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, group, off);
    if ((lane & static_cast<uint32_t>(off)) != 0u) incl += other;
    group += other;
  }
  uint32_t below = incl - sum;
  // Exactly one lane holds the rank-th key's byte; the others contribute zeros.
  uint32_t digit = 0;
  uint32_t before = 0;
  if (below < rank && rank <= incl) {
    bool found = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (!found && below + c[j] >= rank) {
        found = true;
        digit = 8u * lane + static_cast<uint32_t>(j);
      } else if (!found) {
        below += c[j];
      }
    }
    before = below;
  }
  for (int off = 16; off > 0; off >>= 1) {
    digit |= __shfl_xor_sync(0xffffffffu, digit, off);
    before |= __shfl_xor_sync(0xffffffffu, before, off);
  }
  *skipped = before;
  // Fewer keys than `rank` counted (only where they change between rounds: the
  // certificates): no lane found the byte.
  return __shfl_sync(0xffffffffu, incl, 31) < rank ? 256u : digit;
}

// The k-th smallest (1 <= k <= m) of the m keys entry_key(i), i < m, by one warp:
// a radix select on bytes from the top, `bytes` rounds, so the result is exact in
// its top `bytes` bytes (the others are zero). Each round counts, in the warp's
// 256-word `hist`, the next byte of the keys that share the bytes found so far, and
// finds the byte holding the k-th by a prefix sum over the lanes (lane l owns bins
// 8l..8l+7). O(bytes * m / 32) per lane, where ranking every entry against every
// other was O(m^2 / 32): 37 000 steps per lane at m = 1088 (capacity 1024). One
// instance serves both of compact's selects (`bytes` and the key chosen at run
// time): a second inlined instance, with a second filter, made every knn_tile
// link about 3% slower (859 -> 880 ms for q64_r64_k32 tf32x3 on sm_90).
__device__ FRAGLINK_INLINE uint64_t kth_smallest(const buffer& b, const union_args& u, uint32_t m, uint32_t k,
                                                 int kind, int bytes, uint32_t* hist, uint32_t lane) {
  uint64_t prefix = 0;
  uint32_t rank = k;  // among the keys that share `prefix`'s found bytes
#pragma unroll 1
  for (int r = 0; r < bytes; ++r) {
    const int shift = 56 - 8 * r;
    const uint64_t high = r == 0 ? 0ull : ~0ull << (shift + 8);
    for (uint32_t i = lane; i < 256u; i += 32u) hist[i] = 0u;
    __syncwarp();
    for (uint32_t i = lane; i < m; i += 32u) {
      const uint64_t v = entry_key(b, u, i, kind);
      if ((v & high) == prefix) atomicAdd(&hist[static_cast<uint32_t>(v >> shift) & 255u], 1u);
    }
    __syncwarp();
    uint32_t skipped;
    const uint32_t digit = pick_digit(hist, rank, lane, &skipped);
    __syncwarp();
    // Certificates lowered since an earlier round left fewer than the rank-th under
    // the bytes found: no bound this time (buffer keys never change).
    if (digit > 255u) return ~0ull;
    prefix |= static_cast<uint64_t>(digit) << shift;
    rank -= skipped;
  }
  return prefix;
}

// Keeps the entries whose (lo, id) key is at most `bound` (order preserved);
// returns the new count. With bound = (order_key(t) << 32) | 0xffffffff that is
// lo <= t (every entry's lo is a number: NaN never enters a buffer).
__device__ FRAGLINK_INLINE uint32_t keep_at_most(const buffer& b, uint32_t m, uint64_t bound, uint32_t lane) {
  uint32_t out = 0;
  for (uint32_t base = 0; base < m; base += 32) {
    const uint32_t i = base + lane;
    const bool valid = i < m;
    const float lo = valid ? b.lo[i] : 0.0f;
    const float hi = valid ? b.hi[i] : 0.0f;
    const uint32_t id = valid ? b.id[i] : 0u;
    const bool keep = valid && ((static_cast<uint64_t>(order_key(lo)) << 32) | id) <= bound;
    const uint32_t mask = __ballot_sync(0xffffffffu, keep);
    __syncwarp();
    if (keep) {
      const uint32_t pos = out + static_cast<uint32_t>(__popc(mask & ((1u << lane) - 1u)));
      b.lo[pos] = lo;
      b.hi[pos] = hi;
      b.id[pos] = id;
    }
    out += static_cast<uint32_t>(__popc(mask));
    __syncwarp();
  }
  return out;
}

// Compacts one query's buffer (called by a whole warp; `hist` is the warp's 256-word
// scratch): T = min(T, k-th smallest hi) where the buffer holds k entries or more,
// keep lo <= T and lo <= the query's shared bound (`shared_key`, an order key:
// shared_bound); if more than CAP remain, replace them by the exact best k (the k
// smallest (d, id) keys, scan::key_less's order). Ends with *count <= CAP. The shared
// bound only filters: *b.thr stays the chunk's own T (the insertion rule drops
// lo >= T, which the ids justify only for rows of this chunk). Where the union bound
// is on (u.certs), two passes come first: this chunk's certificate (the j-th smallest
// hi, lowered with atomicMin), then the r-th smallest of the sampled certificates,
// which lowers the shared bound here and is returned (all ones: none).
template <typename T, int CAP>
__device__ FRAGLINK_INLINE uint32_t compact(const buffer& b, const union_args& u, uint32_t k, const T* qrow,
                                            const T* dataset, uint32_t dim, uint32_t* hist, uint32_t shared_key) {
  const uint32_t lane = threadIdx.x & 31u;
  uint32_t m = *b.count;
  float t = *b.thr;
  uint32_t joint = 0xffffffffu;
  // Passes -2 and -1 (the union bound's), then 0, which selects by the upper bounds,
  // and 1, only when more than CAP entries are left, by exact distances. One loop, so
  // the select and the filter are inlined once: with a second inlined copy of each,
  // q64 f32 3xTF32 k32 `_a16` + l2 took 367 ms of nvJitLink for sm_90 instead of 324
  // (12.9, back to back, a 2-core VM); a second select for the union bound took
  // knn_tile_f32_f16copy_q16_r64_k32_a16 from 64 to 121 registers (sm_90, 12.9).
#pragma unroll 1
  for (int pass = u.certs != nullptr ? -2 : 0; pass < 2; ++pass) {
    const bool own = pass == -2;
    const bool joined = pass == -1;
    const bool exact = pass == 1;
    if (own && m < u.j) continue;
    // One select for every pass, its inputs chosen here. Fewer than k entries (only
    // at a chunk's end, for a shared bound alone): no k-th. The exact pass runs with
    // more than CAP >= k.
    const uint64_t kth =
        pass < 0 || m >= k
            ? kth_smallest(b, u, joined ? u.sample : m, own ? u.j : (joined ? u.r : k),
                           joined ? key_cert : (exact ? key_lo_id : key_hi), exact ? 8 : (pass < 0 ? 3 : 4), hist,
                           lane)
            : ~0ull;
    if (pass < 0) {
      // Three bytes: the key's bucket of 2^8 keys (2^-15 of the value) and its top,
      // which is at least the rank-th key and so certifies as much, a round sooner.
      const uint32_t key32 = static_cast<uint32_t>(kth >> 32) | 0xffu;
      if (own) {
        if (lane == 0) atomicMin(u.certs + u.chunk, key32);
        __syncwarp();
      } else {
        joint = key32;
        shared_key = joint < shared_key ? joint : shared_key;
      }
      continue;
    }
    if (m >= k) t = fminf(t, from_order_key(static_cast<uint32_t>(kth >> 32)));
    const uint32_t keep_key = order_key(t) < shared_key ? order_key(t) : shared_key;
    m = keep_at_most(b, m, exact ? kth : (static_cast<uint64_t>(keep_key) << 32) | 0xffffffffull, lane);
    if (exact || m <= static_cast<uint32_t>(CAP)) {
      break;
    }
    // Many equal bounds: decide by exact distances. (d, id) keys are distinct, so
    // exactly k entries are at or below the k-th.
    for (uint32_t i = lane; i < m; i += 32) {
      const float d = exact_distance<T, true>(qrow, dataset + static_cast<uint64_t>(b.id[i]) * dim, dim);
      b.lo[i] = d;
      b.hi[i] = d;
    }
    __syncwarp();
  }
  if (lane == 0) {
    *b.thr = t;
    *b.count = m;
  }
  __syncwarp();
  return joint;
}

// ----- the bound the chunks of one query share --------------------------------------
// bound_keys[q] (global memory, all ones before the launch: no bound yet) is the
// least order_key of the T's that query q's chunks have published, one after each
// compaction (atomicMin). Each such T has k rows of its chunk at or below it (hi <= T,
// or exact d <= T), so a row with lo > T, strictly, has k rows with d' <= T < lo <= d
// and is no neighbour, whatever the ids. Every chunk drops such rows at insertion,
// at its compactions and before it writes its candidates. Without it, each of the
// hundreds of chunks a small batch spreads a query over keeps about k (1 + ln(rows
// / k)) entries and writes at least k, all of which the re-rank sorts; with it, a
// chunk that saw no row near the query's best writes few or none. A bound read late
// is only a looser one. Null bound_keys: each chunk on its own, as before.
__device__ FRAGLINK_INLINE uint32_t shared_bound(const uint32_t* keys, uint64_t q, uint32_t n_queries) {
  return keys == nullptr || q >= n_queries ? 0xffffffffu : *reinterpret_cast<const volatile uint32_t*>(keys + q);
}

// ----- the union bound: certificates of many chunks together ---------------------
// One chunk's T names k rows of that chunk alone, so the bound above is the k-th
// smallest distance of the best chunk: at nq 1 over about 900 chunks, still the query's
// three-thousandth or so (benches/scripts/shared_bound_model.py). Rows of different
// chunks are distinct, so chunks can certify jointly. Past bound_keys' n_queries words
// the host leaves n_queries x n_chunks more (all ones): chunk c keeps, at
// bound_keys[n_queries + q * n_chunks + c], its certificate for query q, the least order
// key of the j-th smallest hi its buffer has held (j: union_of; so many rows of the chunk
// have d <= it; atomicMin, so only ever lower, and a row dropped since still exists).
// Any r = ceil(k / j) certificates of distinct chunks name r j >= k distinct rows, so
// the r-th smallest of any set of certificates is at least the query's k-th smallest
// distance: rule (d) holds for it as for T. At each compaction a warp takes the r-th
// smallest of an evenly spread sample of the query's certificates (compact's pass -1, the
// same radix select as its others). Other blocks lower certificates between the
// select's rounds; since they only fall, the keys counted below the bytes found so far
// stay below, and the r keys the select ends with are at or below its result at the
// end, each a valid certificate of a distinct chunk; where lowered keys leave fewer
// than the rank still wanted under the bytes found (pick_digit says so), the pass
// gives no bound. With the chunks' best rows spread over the chunks, the bound is
// near the query's own k-th distance. On where a query spreads over at least
// UNION_MIN_CHUNKS chunks (a small batch), j <= UNION_MAX_ROWS and r fits the sample.
constexpr uint32_t UNION_MIN_CHUNKS = 32;
constexpr uint32_t UNION_MAX_ROWS = 8;
// Certificates one select reads at most, spread evenly over the chunks (a stride
// of n_chunks / UNION_SAMPLE read only the first 256 of up to 511 chunks: rows in
// dataset order, clustered data would leave the bound to half of them). The
// sample's index i < 256 times n_chunks < 2^16 fits 32 bits.
constexpr uint32_t UNION_SAMPLE = 256;
static_assert(UNION_SAMPLE == 256, "union_args::spread shifts by log2(UNION_SAMPLE) = 8");

// The union bound's inputs for query q of chunk `chunk` (u.certs null where it is
// off for this launch): j = ceil(2 k / n_chunks) rows per certificate, so that r =
// ceil(k / j) is about half the chunks.
__device__ FRAGLINK_INLINE union_args union_of(uint32_t* bound_keys, uint32_t n_queries, uint64_t q, uint32_t k,
                                               uint32_t n_chunks, uint32_t chunk) {
  union_args u = {nullptr, chunk, 1, 0, 0, 0};
  if (bound_keys == nullptr || q >= n_queries || n_chunks < UNION_MIN_CHUNKS) return u;
  const uint32_t j = (2u * k + n_chunks - 1u) / n_chunks;
  const uint32_t r = (k + j - 1u) / j;
  const uint32_t sample = n_chunks < UNION_SAMPLE ? n_chunks : UNION_SAMPLE;
  if (j > UNION_MAX_ROWS || r > sample) return u;
  u.certs = bound_keys + n_queries + q * n_chunks;
  u.spread = n_chunks > UNION_SAMPLE ? n_chunks : UNION_SAMPLE;
  u.sample = sample;
  u.j = j;
  u.r = r;
  return u;
}

// ----- global -> shared memory copies: copy_async.cuh (through scan.cuh) ---------

// Where element c of row r of a staged chunk lives: K-element slabs of ROWS rows of
// stride LD (slab c / K, row r at (c / K) * ROWS * LD + r * LD). The copies store
// and the MMAs load through it (a fragment: row 16 f, element s K).
template <int ROWS, int K, int LD>
__device__ FRAGLINK_INLINE int slab_offset(int r, int c) {
  return (c / K) * ROWS * LD + r * LD + (c % K);
}

// `dst` <- rows [row0, row0 + ROWS) x elements [k0, k0 + KC) of the row-major `src`
// (`rows` x `dim`) in copies of BYTES, laid out by slab_offset; zero outside the
// matrix. Needs dim a whole number of copies and `src` aligned to BYTES
// (copy_unit), so a copy is wholly in or out.
template <int ROWS, int KC, int K, int LD, int BYTES, bool L1, typename T>
__device__ FRAGLINK_INLINE void copy_groups(T* dst, const T* __restrict__ src, uint64_t rows, uint64_t row0,
                                            uint32_t dim, uint32_t k0) {
  constexpr int E = BYTES / static_cast<int>(sizeof(T));
  constexpr int PER_ROW = KC / E;
  constexpr int GROUPS = ROWS * PER_ROW;
  static_assert(E >= 1 && KC % E == 0 && K % E == 0 && LD % E == 0, "a copy stays inside one MMA K slab");
#pragma unroll
  for (int i = 0; i < (GROUPS + FRAGLINK_KNN_BLOCK - 1) / FRAGLINK_KNN_BLOCK; ++i) {
    const int t = static_cast<int>(threadIdx.x) + i * FRAGLINK_KNN_BLOCK;
    if (GROUPS % FRAGLINK_KNN_BLOCK == 0 || t < GROUPS) {
      const int r = t / PER_ROW;
      const int c = (t % PER_ROW) * E;
      const uint64_t row = row0 + static_cast<uint64_t>(r);
      const uint32_t col = k0 + static_cast<uint32_t>(c);
      const bool valid = row < rows && col < dim;
      copy_async<BYTES, L1>(dst + slab_offset<ROWS, K, LD>(r, c), valid ? src + row * dim + col : src, valid);
    }
  }
}

// The same with element loads and 16-byte stores, for any dim and alignment
// (synchronous).
template <int ROWS, int KC, int K, int LD, typename T>
__device__ FRAGLINK_INLINE void copy_elements(T* dst, const T* __restrict__ src, uint64_t rows, uint64_t row0,
                                              uint32_t dim, uint32_t k0) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));
  constexpr int PER_ROW = KC / VEC;
  constexpr int GROUPS = ROWS * PER_ROW;
  static_assert(KC % VEC == 0 && K % VEC == 0 && LD % VEC == 0, "a group stays inside one MMA K slab");
  for (int t = static_cast<int>(threadIdx.x); t < GROUPS; t += FRAGLINK_KNN_BLOCK) {
    const int r = t / PER_ROW;
    const int c = (t % PER_ROW) * VEC;
    const uint64_t row = row0 + static_cast<uint64_t>(r);
    const uint32_t col = k0 + static_cast<uint32_t>(c);
    const T* p = src + row * dim + col;
    scan::vec<T, VEC> g;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      g.v[e] = row < rows && col + static_cast<uint32_t>(e) < dim ? p[e] : small_value<T>(0);
    }
    *reinterpret_cast<scan::vec<T, VEC>*>(dst + slab_offset<ROWS, K, LD>(r, c)) = g;
  }
}

// Bytes per copy for `dim` and both matrices (the same for every thread): 16
// when rows are whole 16-byte groups and 16-byte aligned, 4 for 4 bytes, else 0
// (element copies).
template <typename T>
__device__ FRAGLINK_INLINE int copy_unit(uint32_t dim, const T* a, const T* b) {
  const uint32_t row_bytes = dim * static_cast<uint32_t>(sizeof(T));
  if (row_bytes % 16 == 0 && scan::misaligned_bits<16>(a) == 0 && scan::misaligned_bits<16>(b) == 0) return 16;
  if (row_bytes % 4 == 0 && scan::misaligned_bits<4>(a) == 0 && scan::misaligned_bits<4>(b) == 0) return 4;
  return 0;
}

// The copies a knn_tile variant holds (the `staging` matrix key): every kind, the
// unit chosen at run time by copy_unit, or 16-byte copies only (the launch must
// give copy_unit 16: tile_launch_ok).
enum staging_kind { staging_any = 0, staging_a16 = 16 };

// One chunk in copies of `unit` bytes (copy_unit); L1 as for copy_async.
template <int ROWS, int KC, int K, int LD, bool L1, int STAGING, typename T>
__device__ FRAGLINK_INLINE void copy_chunk(T* dst, const T* __restrict__ src, uint64_t rows, uint64_t row0,
                                           uint32_t dim, uint32_t k0, int unit) {
  if (STAGING == staging_a16 || unit == 16) {
    copy_groups<ROWS, KC, K, LD, 16, L1>(dst, src, rows, row0, dim, k0);
  } else if (unit == 4) {
    copy_groups<ROWS, KC, K, LD, 4, L1>(dst, src, rows, row0, dim, k0);
  } else {
    copy_elements<ROWS, KC, K, LD>(dst, src, rows, row0, dim, k0);
  }
}

using scan::dynamic_shared;
using scan::dynamic_shared_bytes;

// ----- the shape of a candidate block ---------------------------------------------
// QT queries x RT rows per row iteration over 4 warps: WQ x WR warps, each FQ x FR
// tiles of 16 x 16 (so a warp loads FQ + FR operand fragments per K step for
// FQ x FR MMAs). The per-query candidate buffers (BUF = CAP + RT (lo, hi, id)
// entries: one iteration adds at most RT) live in dynamic shared memory, so
// variants beyond the 48 KiB of static shared memory exist (the host opts in);
// src/search/knn/plan.rs computes the same byte counts.
template <typename T, int PREC, int QT, int RT, int CAP>
struct tile_shape {
  typedef mma<T, PREC> M;
  typedef typename M::staged S;
  static constexpr int WARPS = FRAGLINK_KNN_BLOCK / 32;
  static constexpr int WQ = QT >= 32 ? 2 : 1;
  static constexpr int WR = WARPS / WQ;
  static constexpr int FQ = QT / (16 * WQ);
  static constexpr int FR = RT / (16 * WR);
  static_assert(QT == 16 * WQ * FQ && RT == 16 * WR * FR && FQ >= 1 && FR >= 1, "tiles: whole 16 x 16 per warp");
  static constexpr int BUF = CAP + RT;
  static constexpr int K = M::K;
  static constexpr int KC = 64 / static_cast<int>(sizeof(S));  // elements per staged chunk
  static_assert(KC % K == 0, "a chunk is whole MMA steps");
  // Slab row stride: 32-byte rows (f32, f16) padded to 48 bytes, so the 8 rows one
  // fragment load phase reads start in 8 distinct bank quads (32 bytes: 2-way bank
  // conflicts); 16-byte rows (bytes) are conflict-free as they are. Multiples of 16
  // bytes keep every fragment 32-byte aligned (16 rows x LD).
  static constexpr int LD = K * static_cast<int>(sizeof(S)) == 32 ? K + 16 / static_cast<int>(sizeof(S)) : K;
  // Bytes of the candidate buffers for `queries` of a tile's QT (fewer where the
  // whole batch is smaller than a tile: src/search/knn/plan.rs
  // `KnnPlan::dynamic_shared_bytes_for`).
  static __device__ FRAGLINK_INLINE uint32_t dynamic_bytes(uint32_t queries) {
    return queries * static_cast<uint32_t>(BUF) * 12u;
  }
  // Copy pipeline depth: chunks in shared memory at once, STAGES - 1 of them in
  // flight while the block computes on one. The 64-query tile keeps two, so two
  // of its blocks (about 100 KiB of shared memory each) still fit an SM, and so does
  // capacity 1024, whose candidate buffers (204 KiB) leave room for two stages only
  // within an H100's 227 KiB per block.
  static constexpr int STAGES = QT >= 64 || CAP >= 1024 ? 2 : 3;
  static constexpr int Q_STAGE = (KC / K) * QT * LD;  // elements of one stage
  static constexpr int X_STAGE = (KC / K) * RT * LD;
};

// The contract the kernel checks by itself (as scan.cuh's launch_ok): block shape,
// 1 <= k <= CAP, a recognised metric, a supported dim, chunks that cover every row
// (chunk_rows * gridDim.y >= n_rows: a row left out would be a silently wrong
// answer), aligned pointers, the dynamic shared memory of the candidate buffers,
// copies the variant holds (`unit`: copy_unit), and the operands (`operands_ok`: rows
// and queries, and an f16copy variant's copies, non-null and aligned to their
// elements). The same for every thread: a violating launch writes nothing.
template <typename T, int CAP, int STAGING>
__device__ FRAGLINK_INLINE bool tile_launch_ok(int metric, uint32_t n_rows, uint32_t dim, uint32_t k,
                                               uint32_t chunk_rows, uint32_t dynamic_bytes, const void* const* ptrs4,
                                               int n4, int unit, bool operands_ok) {
  uint64_t bad = 0;
  for (int i = 0; i < n4; ++i) bad |= scan::misaligned_bits<4>(ptrs4[i]);
  return bad == 0 && metric_confirmed<T>(metric) && dim_supported(dim) && k != 0 && k <= static_cast<uint32_t>(CAP) &&
         static_cast<uint64_t>(chunk_rows) * gridDim.y >= n_rows && blockDim.x == FRAGLINK_KNN_BLOCK &&
         blockDim.y == 1 && blockDim.z == 1 && dynamic_shared_bytes() >= dynamic_bytes &&
         (STAGING != staging_a16 || unit == 16) && operands_ok;
}

// What the MMAs read: the rows (queries) themselves, or where the variant stages
// another type (f16copy) their copies, passed beside them.
template <typename S, typename T>
__device__ FRAGLINK_INLINE const S* staged_source(const T* own, const void* copy) {
  return same<S, T>::value ? reinterpret_cast<const S*>(own) : static_cast<const S*>(copy);
}

// ----- the candidate kernel ------------------------------------------------------
template <typename T, int PREC, int QT, int RT, int CAP, int STAGING>
__device__ FRAGLINK_INLINE void run_tile(const T* __restrict__ dataset, const T* __restrict__ queries,
                                         const void* __restrict__ stage_dataset,
                                         const void* __restrict__ stage_queries,
                                         const uint32_t* __restrict__ filter_bits, const float* __restrict__ row_aux0,
                                         const float* __restrict__ row_aux1, const float* __restrict__ query_aux0,
                                         const float* __restrict__ query_aux1, uint32_t n_rows, uint32_t dim,
                                         uint32_t n_queries, uint32_t k, uint32_t chunk_rows,
                                         uint32_t* __restrict__ out_count, float* __restrict__ out_lo,
                                         float* __restrict__ out_hi, uint32_t* __restrict__ out_ids,
                                         uint32_t* __restrict__ bound_keys, uint32_t prefetch) {
  typedef tile_shape<T, PREC, QT, RT, CAP> Shape;
  typedef typename Shape::M M;
  typedef typename Shape::S S;
  // The MMAs' operands: the rows as they are, or (f16copy) their copies.
  const S* const xs = staged_source<S>(dataset, stage_dataset);
  const S* const qs = staged_source<S>(queries, stage_queries);
  constexpr int K = Shape::K, KC = Shape::KC, LD = Shape::LD, BUF = Shape::BUF;
  constexpr int WARPS = Shape::WARPS, WQ = Shape::WQ, FQ = Shape::FQ, FR = Shape::FR;

  constexpr int STAGES = Shape::STAGES, Q_STAGE = Shape::Q_STAGE, X_STAGE = Shape::X_STAGE;

  __shared__ __align__(128) S s_q[STAGES * Q_STAGE];
  __shared__ __align__(128) S s_x[STAGES * X_STAGE];
  // Each warp's 16 x 16 products on their way to the select, and its 256-bin
  // histogram when it compacts a buffer (after the select's barrier).
  __shared__ __align__(32) typename M::acc_t s_acc[WARPS][256];
  __shared__ uint32_t s_count[QT];
  __shared__ float s_thr[QT];
  __shared__ float s_qa0[QT];
  __shared__ float s_qa1[QT];
  // The queries' shared bounds (shared_bound) as of the iteration before last: thread
  // i < QT fetches query i's one iteration ahead (`bound_next`), so no barrier waits
  // on that load.
  __shared__ uint32_t s_bound[QT];
  // The candidate buffers: [QB][BUF] each of lo, hi, id, QB = QT, or the batch's
  // queries where they are fewer (nq 1 of a 16-query tile: 1.2 instead of 18 KiB
  // at capacity 32, so more blocks share an SM; a query tile's queries past
  // n_queries never touch a buffer).
  const uint32_t qb = n_queries < static_cast<uint32_t>(QT) ? n_queries : static_cast<uint32_t>(QT);
  float(*const s_lo)[BUF] = reinterpret_cast<float(*)[BUF]>(dynamic_shared());
  float(*const s_hi)[BUF] = s_lo + qb;
  uint32_t(*const s_id)[BUF] = reinterpret_cast<uint32_t(*)[BUF]>(s_hi + qb);

  const int metric = linked_metric<T>();
  const void* ptrs4[] = {row_aux0, row_aux1, query_aux0, query_aux1, out_count, out_lo, out_hi, out_ids,
                         filter_bits, bound_keys};

  const uint32_t tid = threadIdx.x;
  const uint32_t warp = tid / 32;
  const uint32_t lane = tid & 31u;
  const uint32_t wq = warp % WQ;
  const uint32_t wr = warp / WQ;
  const uint32_t n_chunks = gridDim.y;
  const uint32_t chunk = blockIdx.y;
  const uint64_t row_begin = static_cast<uint64_t>(chunk) * chunk_rows;
  const uint64_t row_end_u = row_begin + chunk_rows;
  const uint64_t row_end = row_end_u < n_rows ? row_end_u : n_rows;
  const bound_consts bc = make_bound_consts(dim, PREC);
  const int unit = copy_unit<S>(dim, xs, qs);
  constexpr int T_BYTES = static_cast<int>(sizeof(T)), S_BYTES = static_cast<int>(sizeof(S));
  const bool operands_ok = xs != nullptr && qs != nullptr &&
                           (scan::misaligned_bits<T_BYTES>(dataset) | scan::misaligned_bits<T_BYTES>(queries) |
                            scan::misaligned_bits<S_BYTES>(xs) | scan::misaligned_bits<S_BYTES>(qs)) == 0;
  if (!tile_launch_ok<T, CAP, STAGING>(metric, n_rows, dim, k, chunk_rows, Shape::dynamic_bytes(qb), ptrs4, 10, unit,
                                       operands_ok)) {
    return;
  }

  uint32_t bound_next = 0xffffffffu;
  for (uint64_t tile = blockIdx.x; tile * QT < n_queries; tile += gridDim.x) {
    const uint64_t q0 = tile * QT;
    for (uint32_t i = tid; i < QT; i += FRAGLINK_KNN_BLOCK) {
      const uint64_t q = q0 + i;
      s_count[i] = 0;
      s_thr[i] = scan::pos_inf();
      s_qa0[i] = q < n_queries ? query_aux0[q] : 0.0f;
      s_qa1[i] = q < n_queries ? query_aux1[q] : 0.0f;
    }
    static_assert(QT <= FRAGLINK_KNN_BLOCK, "one thread per query fetches its shared bound");
    if (tid < static_cast<uint32_t>(QT)) bound_next = shared_bound(bound_keys, q0 + tid, n_queries);
    __syncthreads();
    // Copies of the next chunk (row iteration next_row, elements next_k..) into
    // stage `in_stage`, one commit group per step (empty past the rows' end, so
    // every wait counts the same).
    uint64_t next_row = row_begin;
    uint32_t next_k = 0;
    int in_stage = 0;
    // The chunk after (row, k0) in the order the pipeline copies them.
    auto step = [&](uint64_t& row, uint32_t& k0) {
      k0 += KC;
      if (k0 >= dim) {
        k0 = 0;
        row += RT;
      }
    };
    // Chunks `prefetch` steps ahead of the copies, asked of L2 (prefetch_l2): each
    // row's segment of the chunk (a 32-byte sector per thread), and at a row iteration's
    // first chunk its rows' norms, which the select reads. The pipeline keeps
    // STAGES - 1 chunks (64 bytes of each of RT rows) in flight, as many as shared
    // memory allows; at small nq that leaves DRAM latency exposed (GPU.md at
    // 6f7ea6a: 36% of DRAM bandwidth at nq 1). A prefetch holds no shared memory
    // and no register, and its lead is in chunks, so in bytes (prefetch x RT x 64)
    // whatever the dim. 0: none.
    uint64_t ahead_row = row_begin;
    uint32_t ahead_k = 0;
    // Every chunk segment starts on a 32-byte sector (rows and chunks whole sectors).
    const bool sector_aligned = scan::misaligned_bits<32>(xs) == 0 && (dim * static_cast<uint32_t>(S_BYTES)) % 32u == 0;
    auto prefetch_next = [&]() {
      if (ahead_row >= row_end) return;
      // Each row's segment of the chunk sector by sector, a sector per thread in
      // turn (64-byte segments of 64 rows 32-byte aligned: one each). A segment
      // that does not start on a sector boundary touches one sector more: the
      // first address is the segment's start, the others sector starts.
      const uint32_t len = dim - ahead_k < static_cast<uint32_t>(KC) ? dim - ahead_k : static_cast<uint32_t>(KC);
      const uint32_t seg = len * static_cast<uint32_t>(S_BYTES);
      const uint32_t sectors = (seg + 31u) / 32u + (sector_aligned ? 0u : 1u);
#pragma unroll 1
      for (uint32_t i = tid; i < static_cast<uint32_t>(RT) * sectors; i += FRAGLINK_KNN_BLOCK) {
        const uint64_t r = ahead_row + i / sectors;
        const uint32_t j = i % sectors;
        const uintptr_t first = reinterpret_cast<uintptr_t>(xs + r * dim + ahead_k);
        const uintptr_t end = first + seg;
        const uintptr_t at = j == 0 ? first : (first & ~static_cast<uintptr_t>(31u)) + 32u * j;
        if (r < row_end && at < end) {
          const uintptr_t next = (at & ~static_cast<uintptr_t>(31u)) + 32u;
          prefetch_l2(reinterpret_cast<const void*>(at), static_cast<uint32_t>((next < end ? next : end) - at));
        }
      }
      if (ahead_k == 0) {
        const uint64_t b = ahead_row + RT < row_end ? ahead_row + RT : row_end;
        prefetch_l2_span(row_aux0, ahead_row * 4u, b * 4u, tid, FRAGLINK_KNN_BLOCK);
        if (PREC != precision_int) prefetch_l2_span(row_aux1, ahead_row * 4u, b * 4u, tid, FRAGLINK_KNN_BLOCK);
      }
      step(ahead_row, ahead_k);
    };
    auto issue = [&]() {
      if (next_row < row_end) {
        copy_chunk<QT, KC, K, LD, true, STAGING>(s_q + in_stage * Q_STAGE, qs, n_queries, q0, dim, next_k, unit);
        copy_chunk<RT, KC, K, LD, false, STAGING>(s_x + in_stage * X_STAGE, xs, row_end, next_row, dim, next_k, unit);
        step(next_row, next_k);
      }
      copy_commit();
      in_stage = in_stage + 1 == STAGES ? 0 : in_stage + 1;
    };
    // The prefetch cursor starts past the chunks the first step has copied or
    // copies (not asked for); that step asks for `prefetch` chunks, every later
    // one for one more, so it stays `prefetch` chunks ahead of the copies. (One
    // call site: each inlined copy of prefetch_next is about 150 SASS
    // instructions, of the link time.)
    uint32_t prefetch_due = prefetch;
#pragma unroll 1
    for (int i = 0; i < STAGES; ++i) step(ahead_row, ahead_k);
#pragma unroll 1
    for (int i = 0; i < STAGES - 1; ++i) issue();
    int stage = 0;
    for (uint64_t r0 = row_begin; r0 < row_end; r0 += RT) {
      // Ordered before the select by the K loop's barriers, after the previous
      // iteration's readers by its last barrier.
      if (tid < static_cast<uint32_t>(QT)) {
        s_bound[tid] = bound_next;
        bound_next = shared_bound(bound_keys, q0 + tid, n_queries);
      }
      typename M::acc_frag acc[FQ][FR];
#pragma unroll
      for (int fq = 0; fq < FQ; ++fq) {
#pragma unroll
        for (int fr = 0; fr < FR; ++fr) wmma::fill_fragment(acc[fq][fr], static_cast<typename M::acc_t>(0));
      }
      for (uint32_t k0 = 0; k0 < dim; k0 += KC) {
        // This chunk's copies are done (own: the wait; everyone's: the barrier),
        // and every warp has left the stage the next issue overwrites (the
        // previous chunk's).
        copy_wait<STAGES - 2>();
        __syncthreads();
        issue();
#pragma unroll 1
        for (; prefetch_due != 0u && ahead_row < row_end; --prefetch_due) prefetch_next();
        prefetch_due = prefetch != 0u ? 1u : 0u;
        const S* const sq = s_q + stage * Q_STAGE;
        const S* const sx = s_x + stage * X_STAGE;
        stage = stage + 1 == STAGES ? 0 : stage + 1;
#pragma unroll
        for (int s = 0; s < KC / K; ++s) {
          typename M::a_op a[FQ];
          typename M::b_op b[FR];
#pragma unroll
          for (int fq = 0; fq < FQ; ++fq) {
            M::load_a(a[fq], sq + slab_offset<QT, K, LD>((wq * FQ + fq) * 16, s * K), LD);
          }
#pragma unroll
          for (int fr = 0; fr < FR; ++fr) {
            M::load_b(b[fr], sx + slab_offset<RT, K, LD>((wr * FR + fr) * 16, s * K), LD);
          }
#pragma unroll
          for (int fq = 0; fq < FQ; ++fq) {
#pragma unroll
            for (int fr = 0; fr < FR; ++fr) M::multiply(acc[fq][fr], a[fq], b[fr]);
          }
        }
      }
      // The fused select, one 16 x 16 tile at a time through the warp's s_acc.
#pragma unroll
      for (int fq = 0; fq < FQ; ++fq) {
#pragma unroll
        for (int fr = 0; fr < FR; ++fr) {
          wmma::store_matrix_sync(s_acc[warp], acc[fq][fr], 16, wmma::mem_row_major);
          __syncwarp();
          // Lane pairs: 16 consecutive lanes take 16 consecutive rows of one query.
          // Unrolled by 2 only: fully unrolled, the q64 variants took 240-255
          // registers for no gain the linker reports.
#pragma unroll 2
          for (int p = 0; p < 8; ++p) {
            const uint32_t e = lane + 32u * static_cast<uint32_t>(p);
            const uint32_t ql = (wq * FQ + fq) * 16 + e / 16;
            const uint64_t q = q0 + ql;
            const uint64_t row = r0 + (wr * FR + fr) * 16 + e % 16;
            if (q >= n_queries || row >= row_end ||
                !scan::idx_abi<uint32_t>::allows(filter_bits, static_cast<uint32_t>(q), static_cast<uint32_t>(row))) {
              continue;
            }
            float lo;
            float hi;
            if (PREC == precision_int) {
              const float d = int_distance(metric, static_cast<int64_t>(s_acc[warp][e]), __float_as_uint(s_qa0[ql]),
                                           __float_as_uint(row_aux0[row]));
              lo = d;
              hi = d;
            } else {
              float_bounds(metric, bc, static_cast<float>(s_acc[warp][e]), s_qa0[ql], s_qa1[ql], row_aux0[row],
                           row_aux1[row], &lo, &hi);
            }
            if (lo < s_thr[ql] && order_key(lo) <= s_bound[ql]) {
              const uint32_t slot = atomicAdd(&s_count[ql], 1u);
              s_lo[ql][slot] = lo;
              s_hi[ql][slot] = hi;
              s_id[ql][slot] = static_cast<uint32_t>(row);
            }
          }
          __syncwarp();
        }
      }
      __syncthreads();
      const bool last = r0 + RT >= row_end;
      for (uint32_t ql = warp; ql < QT; ql += WARPS) {
        const uint32_t limit = last ? k : static_cast<uint32_t>(CAP);
        const uint32_t count = s_count[ql];
        // At the chunk's end the bound as it is now (one lane reads it for the
        // warp), and a buffer of k entries or fewer compacts too where there is a
        // bound: a chunk that saw no row near the query's best writes few or none.
        // (One compact call site: a second keep_at_most, in the output loop, made
        // knn_tile links about 8% longer.)
        const uint32_t shared_key =
            last ? __shfl_sync(0xffffffffu, lane == 0 ? shared_bound(bound_keys, q0 + ql, n_queries) : 0u, 0)
                 : s_bound[ql];
        uint32_t* const hist = reinterpret_cast<uint32_t*>(s_acc[warp]);
        const union_args u = union_of(bound_keys, n_queries, q0 + ql, k, n_chunks, chunk);
        // With the union bound on, a chunk's end compacts whatever its bound: the
        // certificates may give one.
        if (count > limit || (last && count != 0 && (shared_key != 0xffffffffu || u.certs != nullptr))) {
          const buffer b = {s_lo[ql], s_hi[ql], s_id[ql], &s_count[ql], &s_thr[ql]};
          const uint32_t joint = compact<T, CAP>(b, u, k, queries + (q0 + ql) * dim, dataset, dim, hist, shared_key);
          if (bound_keys != nullptr && lane == 0) {
            const uint32_t own_t = order_key(s_thr[ql]);
            atomicMin(bound_keys + q0 + ql, joint < own_t ? joint : own_t);
          }
        }
      }
      __syncthreads();
    }
    // Out: per (query, chunk) its count and up to CAP entries.
    for (uint32_t ql = warp; ql < QT; ql += WARPS) {
      const uint64_t q = q0 + ql;
      if (q >= n_queries) continue;
      const uint64_t slot = q * n_chunks + chunk;
      const uint32_t m = s_count[ql];
      if (lane == 0) out_count[slot] = m;
      for (uint32_t i = lane; i < m; i += 32) {
        out_lo[slot * CAP + i] = s_lo[ql][i];
        out_hi[slot * CAP + i] = s_hi[ql][i];
        out_ids[slot * CAP + i] = s_id[ql][i];
      }
    }
    __syncthreads();
  }
}

// ----- merge and exact re-rank ---------------------------------------------------
// Whether a candidate's bounds pin its distance: lo == hi bit for bit, so the
// reference d (lo <= d <= hi) is that float. Integer candidates (lo = hi = d from
// exact integers), the compaction's exact pass and the merge level's output are such;
// float bounds never are (e exceeds half an ulp of g: l2 e >= 18u s^2 with |g| <~ s^2,
// inner product e >= 6u |q||x|, cosine e >= ~52u with g <= ~2). Zero is excluded as
// insurance, since a bound's zero need not carry d's sign; a search whose best
// distance is zero (a query among the rows) so keeps both passes.
__device__ FRAGLINK_INLINE bool exact_bounds(float lo, float hi) {
  return __float_as_uint(lo) == __float_as_uint(hi) && lo != 0.0f;
}

// The re-rank's packed view of a window of the group's chunks (the next BLOCK, or
// the `remaining` left): start[j] = the number of candidates in the window's chunks
// before j (an exclusive prefix sum of their counts, each at most CAP; chunks past
// the group's count none, so start[j] = the total for j >= remaining), and the
// window's total is returned. All threads of the block call it; it begins with a
// barrier (the previous window's readers of `start` are done) and ends with one
// (every start written). Packed, the re-rank visits only written slots: with the
// shared and union bounds most chunks end with a few candidates or none, and
// visiting every chunk's CAP slots took 4 tiles a group per pass at CAP 32 (16
// chunks a group, merge_groups), 16 at CAP 128.
template <int BLOCK, int CAP>
__device__ FRAGLINK_INLINE uint32_t pack_counts(const uint32_t* __restrict__ counts, uint32_t remaining,
                                                uint32_t* start, uint32_t* warp_sums) {
  const uint32_t tid = threadIdx.x;
  const uint32_t lane = tid & 31u;
  const uint32_t warp = tid >> 5;
  // At most CAP (a count above it, all ones, means an unwritten slot: the block's
  // first query is checked before its loop; later ones read no more than CAP).
  const uint32_t c = tid < remaining ? counts[tid] : 0u;
  const uint32_t n = c < static_cast<uint32_t>(CAP) ? c : static_cast<uint32_t>(CAP);
  uint32_t x = n;  // inclusive prefix within the warp
  // Rolled: unrolled, the five `lane >= d` were loop invariants of the re-rank's
  // loops, hoisted out as predicates, and ptxas spilled one (sm_75, sm_80).
#pragma unroll 1
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_sync(0xffffffffu, x, lane >= d ? lane - d : lane);
    if (lane >= d) x += y;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  uint32_t before = 0, total = 0;
#pragma unroll
  for (uint32_t w = 0; w < BLOCK / 32; ++w) {
    const uint32_t sum = warp_sums[w];
    before += w < warp ? sum : 0u;
    total += sum;
  }
  start[tid] = before + x - n;
  __syncthreads();
  return total;
}

// The chunk of a window (pack_counts) that holds packed candidate s < total: the
// last j with start[j] <= s (a chunk without candidates shares its start with the
// next, which then holds s; start[0] = 0).
template <int BLOCK>
__device__ FRAGLINK_INLINE uint32_t chunk_of(const uint32_t* start, uint32_t s) {
  uint32_t j = 0;
#pragma unroll
  for (uint32_t step = BLOCK / 2; step > 0; step >>= 1) {
    if (start[j + step] <= s) j += step;
  }
  return j;
}

// Block (x, y) re-ranks the candidates of query x (grid-stride) from chunks
// [group_chunks y, group_chunks (y + 1)). With `merged_count` (the merge level, grid.y
// groups) the group's exact best k go to slot (q, y) of the merged arrays in
// knn_tile's output format (lo = hi = the exact distance, count = the real rows
// among them), for a final launch over the groups or the host's merge of them
// (fraglink's host merges them); without it (grid.y = 1) they are
// the result. A row left out of its group's best k has k rows of the group before
// it by exact key, so it is not among the query's best k either.
template <typename T, int CAP>
__device__ FRAGLINK_INLINE void run_rerank(const T* __restrict__ dataset, const T* __restrict__ queries,
                                           const uint32_t* __restrict__ cand_count,
                                           const float* __restrict__ cand_lo, const float* __restrict__ cand_hi,
                                           const uint32_t* __restrict__ cand_ids, uint32_t dim, uint32_t n_queries,
                                           uint32_t n_chunks, uint32_t k, uint32_t group_chunks,
                                           uint32_t* __restrict__ merged_count, float* __restrict__ merged_lo,
                                           float* __restrict__ merged_hi, uint32_t* __restrict__ merged_ids,
                                           uint32_t* __restrict__ out_ids, float* __restrict__ out_dists) {
  constexpr int BLOCK = FRAGLINK_KNN_BLOCK;
  // Scratch for at least four tiles of offers (BlockTopK's phases), not one: a
  // tile with any candidate otherwise sorts all S slots, and on an H200 (nq 1,
  // 1M x 128 f32, k 10, GPU.md at commit 6f7ea6a) the re-rank's merge launch
  // (512 slots a block) took 65 us and its final launch (1056 slots, one block)
  // 86 us, against 302 us for the candidate kernel: barrier-bound bitonic sorts
  // of 256 keys, one per tile. Shared memory: 8 bytes a slot (8 KiB at CAP 32,
  // 16 KiB at 1024).
  constexpr int S = scan::next_pow2(CAP + 4 * BLOCK);
  __shared__ float s_key[S];
  __shared__ uint32_t s_id[S];
  __shared__ uint32_t s_start[BLOCK];
  __shared__ uint32_t s_warp_sums[BLOCK / 32];

  const void* ptrs4[] = {cand_count, cand_lo, cand_hi, cand_ids, merged_count, merged_lo, merged_hi, merged_ids,
                         out_ids, out_dists};
  uint64_t bad = 0;
  for (int i = 0; i < 10; ++i) bad |= scan::misaligned_bits<4>(ptrs4[i]);
  const bool merging = merged_count != nullptr;
  const bool outputs = merging ? merged_lo != nullptr && merged_hi != nullptr && merged_ids != nullptr
                               : out_ids != nullptr && out_dists != nullptr && gridDim.y == 1;
  if (bad != 0 || !outputs || k == 0 || k > static_cast<uint32_t>(CAP) || group_chunks == 0 ||
      static_cast<uint64_t>(group_chunks) * gridDim.y < n_chunks || blockDim.x != BLOCK || blockDim.y != 1 ||
      blockDim.z != 1) {
    return;
  }
  const uint32_t tid = threadIdx.x;
  const float inf = scan::pos_inf();
  const uint32_t invalid = scan::idx_abi<uint32_t>::invalid;
  const uint64_t c0 = static_cast<uint64_t>(blockIdx.y) * group_chunks;
  const uint64_t c_end = c0 + group_chunks < n_chunks ? c0 + group_chunks : n_chunks;
  // The group's chunks (at most group_chunks, a u32).
  const uint32_t span = static_cast<uint32_t>(c_end > c0 ? c_end - c0 : 0);
  // The host sets every count to all ones (0xFFFFFFFF) before the kernel that
  // fills them (knn_tile, or this kernel's merge level) runs. A count above CAP
  // means that kernel refused its launch. The block then writes nothing: its
  // queries' outputs stay unwritten, which the host reports (and a merge level's
  // refusal stops the final launch's blocks too), where reading the slots would
  // follow a former search's ids, out of bounds. The block's first query stands for
  // all: a launch of that kernel writes every count or none (its checks are the same
  // for every block, including chunks that cover the rows; its query tiles are a
  // grid-stride loop). Checked once, before the queries' loop: inside it
  // the check cost most sm_80 variants 8 registers.
  bool unwritten = false;
  if (blockIdx.x < n_queries) {
    const uint32_t* __restrict__ counts = cand_count + static_cast<uint64_t>(blockIdx.x) * n_chunks;
    for (uint64_t c = c0 + tid; c < c_end; c += BLOCK) unwritten |= counts[c] > CAP;
  }
  if (__syncthreads_or(unwritten)) return;

  for (uint64_t q = blockIdx.x; q < n_queries; q += gridDim.x) {
    const T* __restrict__ qrow = queries + q * dim;
    float u = inf;
    // A candidate of this thread whose bounds do not pin its distance (pass 0).
    bool inexact = false;
    // Rolled: one copy of the pass for the linker to compile, not two.
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = static_cast<int>(tid); i < S; i += BLOCK) {
        s_key[i] = inf;
        s_id[i] = invalid;
      }
      __syncthreads();
      scan::BlockTopK<CAP, S, BLOCK, uint32_t> top(s_key, s_id);
      // Windows of BLOCK chunks, their written slots packed (pack_counts). The last
      // window has at least one tile, so the last offer sorts in what is pending.
      for (uint32_t w = 0; w < span; w += BLOCK) {
        const uint32_t total = pack_counts<BLOCK, CAP>(cand_count + q * n_chunks + c0 + w, span - w, s_start, s_warp_sums);
        const uint32_t full = (total + BLOCK - 1) / BLOCK;
        const uint32_t tiles = full == 0 && span - w <= BLOCK ? 1u : full;
        // The index of the last offer, as an integer: a flag live across the loop
        // took ptxas's last predicate register, and it spilled one (sm_75/sm_80).
        const uint32_t last_tile = span - w <= BLOCK ? tiles - 1 : 0xFFFFFFFFu;
#pragma unroll 1
        for (uint32_t t = 0; t < tiles; ++t) {
          const bool last = t == last_tile;
          const uint32_t s = t * BLOCK + tid;
          float key = inf;
          uint32_t id = invalid;
          bool candidate = false;
          if (s < total) {
            const uint32_t j = chunk_of<BLOCK>(s_start, s);
            const uint64_t at = (q * n_chunks + c0 + w + j) * CAP + (s - s_start[j]);
            id = cand_ids[at];
            if (pass == 0) {
              key = cand_hi[at];
              candidate = true;
              inexact = inexact || !exact_bounds(cand_lo[at], key);
            } else if (cand_lo[at] <= u) {
              key = exact_distance<T>(qrow, dataset + static_cast<uint64_t>(id) * dim, dim);
              candidate = true;
            }
            candidate = candidate && scan::key_less(key, id, s_key[k - 1], s_id[k - 1]);
          }
          top.offer(candidate, key, id, last);
        }
      }
      u = s_key[k - 1];
      // Every candidate exact: pass 0's (hi, id) keys were the (d, id) keys.
      if (!__syncthreads_or(inexact)) break;
    }
    if (merging) {
      // Real rows come first (padding sorts last), so they are a prefix.
      const uint64_t slot = q * gridDim.y + blockIdx.y;
      for (uint32_t j = tid; j < k; j += BLOCK) {
        merged_lo[slot * CAP + j] = s_key[j];
        merged_hi[slot * CAP + j] = s_key[j];
        merged_ids[slot * CAP + j] = s_id[j];
        const bool last_real = s_id[j] != invalid && (j + 1 == k || s_id[j + 1] == invalid);
        if (last_real) merged_count[slot] = j + 1;
        if (j == 0 && s_id[0] == invalid) merged_count[slot] = 0;
      }
    } else {
      for (uint32_t j = tid; j < k; j += BLOCK) {
        out_ids[q * k + j] = s_id[j];
        out_dists[q * k + j] = s_key[j];
      }
    }
    __syncthreads();
  }
}

}  // namespace knn
}  // namespace fraglink
