// fraglink fragments — exact k-NN for k beyond the tensor-core capacities: a distance
// pass, then a select pass (families `knn_dist` and `knn_select`).
//
// Device-only. The two-pass select of a large k: the candidate kernels (knn_tile.cuh)
// keep per-query buffers of k entries in shared memory, which caps k at 1024; here
// nothing per query lives in shared memory until the k winners are known.
//
// knn_dist<T> — the exact distance of every (query, row) pair of a batch, written to
//   dists[q * ld + row] (the distance matrix, rows ld >= n_rows apart, ld a multiple
//   of 4 so the select reads whole 16-byte vectors; at most a few hundred MiB: the
//   host sizes the batch). Linked with one metric fragment of its dtype and one
//   filter_*_u32 fragment. Block of FRAGLINK_DIST_BLOCK threads over a tile of DQ
//   queries x DR rows, grid = (row tiles, query tiles); each thread owns 2 queries x
//   4 rows and folds them through the linked metric in order j = 0 .. dim-1 (dim is
//   staged DC elements at a time in shared memory, coalesced), exactly the fold of
//   the scan kernel and of the CPU path: a NaN distance becomes +inf; a row the
//   filter excludes is written as NaN, the one value no allowed row has.
//
// knn_select — per query (one block, grid-stride) the k smallest (distance, id) keys
//   of its matrix row, read with 16-byte loads, several in flight per thread. Keys
//   are 32-bit order keys of the distances (scan::order_key: -0 and +0 one key;
//   excluded rows all ones, after +inf), so (key, id) orders as scan::key_less.
//   The kk = min(k, n_rows) winners come in slices of at most sort_slots ranks (one
//   slice where kk fits the sort), each slice [a, b) in three steps:
//   1. a radix select on the keys, one byte per round from the top (4 passes over
//      the row, a 256-bin histogram per warp), finds T, the key of rank b - 1,
//      `below`, the number of keys < T, and `ties`, the number equal to T;
//   2. one more pass collects the keys after the previous slice's last (key, id) up
//      to the cut: where T is the excluded rows' key, every allowed key (the ranks
//      after them are padding whatever the ids: the query's last slice); every key
//      <= T where the ties beyond the slice fit the sort too (the sort puts the
//      smallest ids of the ties first); else (many equal distances) up to the
//      (b - below)-th tie in id order, which a radix select on the ties' ids finds
//      first (up to 4 more passes: from the top byte of n_rows - 1);
//   3. a bitonic sort in dynamic shared memory (the next power of two >= the
//      collected keys, 8 bytes each, at most sort_slots) orders them by (key, id),
//      and the slice's winners are written, each one's distance read back from the
//      matrix (so -0 stays -0).
//   Excluded rows in the cut and positions beyond n_rows are padded as the scan pads,
//   (+inf, 0xFFFFFFFF). Results equal the scan kernel's and the CPU path's bit for
//   bit.
//
// Limits (the host plans around them, src/search/knn/select.rs): ids are u32
// (n_rows < 2^32 - 1); sort_slots * 8 bytes of dynamic shared memory must fit the
// device (16384 slots on an A100 or H100). A k beyond the sort costs five passes over
// the row per slice (nine with many ties at its cut); the host allows at most
// knn::select::MAX_SLICES slices.
#pragma once

#include "scan.cuh"

// Threads per block (blockDim = (256, 1, 1) exactly) of each kernel.
#define FRAGLINK_DIST_BLOCK 256
#define FRAGLINK_SELECT_BLOCK 256

namespace fraglink {
namespace select {

// ----- the distance pass --------------------------------------------------------
// Queries and rows per block, and dim elements staged per step.
constexpr int DQ = 32;
constexpr int DR = 64;
constexpr int DC = 32;
// Per thread: QPT queries (stride DQ / QPT) x RPT rows (stride DR / RPT).
constexpr int QPT = 2;
constexpr int RPT = 4;
static_assert((DQ / QPT) * (DR / RPT) == FRAGLINK_DIST_BLOCK, "one thread per (query group, row group)");

// The contract the kernel checks by itself (as scan.cuh's launch_ok): block shape,
// element-aligned inputs, 4-byte aligned filter words and outputs, the tile counts
// present. The same for every thread: a violating launch writes nothing.
template <typename T>
__device__ FRAGLINK_INLINE bool dist_launch_ok(const T* dataset, const T* queries, const uint32_t* filter_bits,
                                               uint32_t n_rows, uint32_t ld, const float* dists,
                                               const uint32_t* tiles_done) {
  const uint64_t bad = scan::misaligned_bits<static_cast<int>(sizeof(T))>(dataset) |
                       scan::misaligned_bits<static_cast<int>(sizeof(T))>(queries) |
                       scan::misaligned_bits<4>(filter_bits) | scan::misaligned_bits<4>(dists) |
                       scan::misaligned_bits<4>(tiles_done);
  return bad == 0 && tiles_done != nullptr && ld >= n_rows && blockDim.x == FRAGLINK_DIST_BLOCK && blockDim.y == 1 &&
         blockDim.z == 1;
}

// Row tiles of DR rows a query's matrix row is written in: the count knn_dist leaves
// in tiles_done[query tile] when every block of the query tile wrote its rows.
__device__ FRAGLINK_INLINE uint64_t dist_row_tiles(uint32_t n_rows) {
  return (static_cast<uint64_t>(n_rows) + DR - 1) / DR;
}

template <typename T>
__device__ FRAGLINK_INLINE void run_dist(const T* __restrict__ dataset, const T* __restrict__ queries,
                                         const uint32_t* __restrict__ filter_bits, uint32_t n_rows, uint32_t dim,
                                         uint32_t n_queries, uint32_t ld, float* __restrict__ dists,
                                         uint32_t* __restrict__ tiles_done) {
  typedef scan::metric_abi<T> M;
  constexpr int QS = DQ / QPT;  // query stride between a thread's queries
  constexpr int RS = DR / RPT;  // row stride between a thread's rows
  // Transposed ([element][query or row]) so a warp's reads of one element are
  // consecutive words; one word of padding breaks the stride of the stores.
  __shared__ T s_q[DC][DQ + 1];
  __shared__ T s_x[DC][DR + 1];

  if (!dist_launch_ok<T>(dataset, queries, filter_bits, n_rows, ld, dists, tiles_done)) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int tq = tid / RS;
  const int tr = tid % RS;
  const uint64_t row0 = static_cast<uint64_t>(blockIdx.x) * DR;
  const uint64_t q0 = static_cast<uint64_t>(blockIdx.y) * DQ;

  typename M::state st[QPT][RPT];
#pragma unroll
  for (int a = 0; a < QPT; ++a) {
#pragma unroll
    for (int b = 0; b < RPT; ++b) M::init(&st[a][b]);
  }
  for (uint32_t j0 = 0; j0 < dim; j0 += DC) {
    const uint32_t w = dim - j0 < static_cast<uint32_t>(DC) ? dim - j0 : static_cast<uint32_t>(DC);
    // Only real elements are staged and folded: folding padding would change a
    // float sum (-0 + 0 * 0 is +0). Stale slots are read only for pairs that are
    // never written.
    for (int e = tid; e < DQ * DC; e += FRAGLINK_DIST_BLOCK) {
      const int r = e / DC;
      const int c = e % DC;
      if (q0 + r < n_queries && static_cast<uint32_t>(c) < w) s_q[c][r] = queries[(q0 + r) * dim + j0 + c];
    }
    for (int e = tid; e < DR * DC; e += FRAGLINK_DIST_BLOCK) {
      const int r = e / DC;
      const int c = e % DC;
      if (row0 + r < n_rows && static_cast<uint32_t>(c) < w) s_x[c][r] = dataset[(row0 + r) * dim + j0 + c];
    }
    __syncthreads();
    for (uint32_t c = 0; c < w; ++c) {
      T qv[QPT];
      T xv[RPT];
#pragma unroll
      for (int a = 0; a < QPT; ++a) qv[a] = s_q[c][tq + a * QS];
#pragma unroll
      for (int b = 0; b < RPT; ++b) xv[b] = s_x[c][tr + b * RS];
#pragma unroll
      for (int a = 0; a < QPT; ++a) {
#pragma unroll
        for (int b = 0; b < RPT; ++b) M::accumulate(&st[a][b], qv[a], xv[b]);
      }
    }
    __syncthreads();  // the next step overwrites the staged elements
  }
#pragma unroll
  for (int a = 0; a < QPT; ++a) {
    const uint64_t q = q0 + tq + a * QS;
#pragma unroll
    for (int b = 0; b < RPT; ++b) {
      const uint64_t row = row0 + tr + b * RS;
      if (q >= n_queries || row >= n_rows) continue;
      float d = M::finalize(&st[a][b]);
      if (d != d) d = scan::pos_inf();  // NaN -> +inf, as the scan ranks it
      if (!scan::idx_abi<uint32_t>::allows(filter_bits, static_cast<uint32_t>(q), static_cast<uint32_t>(row))) {
        d = __int_as_float(0x7fc00000);  // excluded: NaN
      }
      dists[q * ld + row] = d;
    }
  }
  // The block's tile is written (the launch ends before the select reads it). Blocks
  // past the rows or the queries count nothing, so a query tile counts exactly its
  // row tiles when the grid covered them once each (dist_row_tiles).
  if (tid == 0 && row0 < n_rows && q0 < n_queries) atomicAdd(&tiles_done[blockIdx.y], 1u);
}

// ----- the select pass ----------------------------------------------------------
// The order key of a matrix entry: excluded rows (NaN) after every allowed one.
__device__ FRAGLINK_INLINE uint32_t entry_key(float d) { return d != d ? 0xFFFFFFFFu : scan::order_key(d); }

// Matrix entries per vector load, and vector loads in flight per thread: a block
// reads its row with 16-byte loads, SELECT_UNROLL of them issued before the first
// is used (one 4-byte load per thread would leave a block of 256 threads
// latency-bound at a few GB/s).
constexpr int SELECT_VEC = 4;
constexpr int SELECT_UNROLL = 4;

// Calls f(i, entry) for every entry i < n_rows of a matrix row (row stride ld, a
// multiple of SELECT_VEC; the row 16-byte aligned), in no particular order.
template <int BLOCK, typename F>
__device__ FRAGLINK_INLINE void visit_row(const float* __restrict__ row, uint32_t n_rows, uint32_t ld, F f) {
  typedef scan::vec<float, SELECT_VEC> V;
  const uint64_t n_vec = ld / SELECT_VEC;
  for (uint64_t base = 0; base < n_vec; base += static_cast<uint64_t>(BLOCK) * SELECT_UNROLL) {
    V v[SELECT_UNROLL];
#pragma unroll
    for (int u = 0; u < SELECT_UNROLL; ++u) {
      const uint64_t j = base + static_cast<uint64_t>(u) * BLOCK + threadIdx.x;
      if (j < n_vec) v[u] = scan::load_vec<float, SELECT_VEC>(row + j * SELECT_VEC);
    }
#pragma unroll
    for (int u = 0; u < SELECT_UNROLL; ++u) {
      const uint64_t j = base + static_cast<uint64_t>(u) * BLOCK + threadIdx.x;
      if (j >= n_vec) continue;
#pragma unroll
      for (int e = 0; e < SELECT_VEC; ++e) {
        const uint64_t i = j * SELECT_VEC + e;
        if (i < n_rows) f(i, v[u].v[e]);
      }
    }
  }
}

// The comparator of 64-bit keys in shared memory (a struct, as scan.cuh's
// PairCompareSwap, so no capture lands in a stack frame).
struct KeyCompareSwap {
  uint64_t* keys;
  __device__ FRAGLINK_INLINE void operator()(uint32_t lo, uint32_t hi, bool ascending) const {
    const uint64_t a = keys[lo];
    const uint64_t b = keys[hi];
    if ((a > b) == ascending) {
      keys[lo] = b;
      keys[hi] = a;
    }
  }
};

// Ascending bitonic sort of `n` (a power of two) 64-bit keys in shared memory by
// BLOCK threads (scan.cuh's network). Must be called by all threads of the block;
// ends with a barrier.
template <int BLOCK>
__device__ FRAGLINK_INLINE void bitonic_sort_u64(uint64_t* keys, uint32_t n) {
  scan::bitonic_network<BLOCK>(n, KeyCompareSwap{keys});
}

// The passes over a row one slice makes, in order: the rounds of a radix select on
// the keys, then (where the ties at the cut overflow the sort) the rounds of one on
// the ties' ids, then the collection of the keys in the cut. One loop runs them all
// through one visit_row, whose row walk (unrolled SELECT_UNROLL x SELECT_VEC times)
// is then compiled once instead of once per kind of pass: with three copies it was
// most of what nvJitLink compiled on a cold link (knn_select_b256, sm_90, nvJitLink
// 12.9: 260 -> 219 ms for a run-time copy of the kernel).
enum select_pass { select_keys, select_tie_ids, select_collect };

// A radix select in progress: the rank-th smallest (from 0) of 32-bit values, one byte
// per round from bit `shift` down (4 rounds from bit 24, a pass over the row each; a
// 256-bin histogram per warp). `prefix` holds the bytes fixed so far (those under
// `mask`), `rank` the rank still wanted among the values that share them, `below` how
// many values are smaller than that prefix and `equal` how many share it.
struct radix_round {
  uint32_t prefix, mask, rank, below, equal;
  int shift;

  __device__ FRAGLINK_INLINE void start(int top, uint32_t r) {
    prefix = 0;
    mask = 0;
    rank = r;
    below = 0;
    equal = 0;
    shift = top;
  }

  // Counts value v in its warp's histogram where it shares the fixed bytes.
  __device__ FRAGLINK_INLINE void count(uint32_t v, uint32_t (*hist)[256], uint32_t warp) const {
    if ((v & mask) == prefix) atomicAdd(&hist[warp][(v >> shift) & 0xFFu], 1u);
  }

  // After a pass has counted every value: fixes this round's byte (the bin holding
  // `rank`) and moves to the next; false once the last byte is fixed. Called by all
  // threads of the block; `pick` is written again only after the next pass's barriers.
  template <int BLOCK>
  __device__ FRAGLINK_INLINE bool advance(uint32_t (*hist)[256], uint32_t* pick) {
    constexpr int WARPS = BLOCK / 32;
    const uint32_t tid = threadIdx.x;
    for (uint32_t h = tid; h < 256; h += BLOCK) {
      uint32_t sum = 0;
      for (int w = 0; w < WARPS; ++w) sum += hist[w][h];
      hist[0][h] = sum;
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t h = 0, acc = 0;
      for (; h < 255 && acc + hist[0][h] <= rank; ++h) acc += hist[0][h];
      pick[0] = h;
      pick[1] = acc;
      pick[2] = hist[0][h];
    }
    __syncthreads();
    prefix |= pick[0] << shift;
    mask |= 0xFFu << shift;
    rank -= pick[1];
    below += pick[1];
    equal = pick[2];
    shift -= 8;
    // Every thread has read the pick before any writes the shared words beside
    // it: ptxas reads the three words with one 16-byte load that also covers
    // s_count, which thread 0 resets next where the collect pass follows
    // (knn_select_b256, sm_90, nvJitLink 13.0: compute-sanitizer's racecheck
    // reported that unused read as a race on an H200).
    __syncthreads();
    return shift >= 0;
  }
};

// The select's contract (as scan.cuh's launch_ok): block shape, 1 <= k, at least one
// row, a row stride ld >= n_rows that is a multiple of SELECT_VEC, a 16-byte aligned
// matrix, knn_dist's tile counts, sort_slots a power of two within the launch's
// dynamic shared memory, 4-byte aligned outputs. The same for every thread.
__device__ FRAGLINK_INLINE bool select_launch_ok(const float* dists, const uint32_t* tiles_done, uint32_t n_rows,
                                                 uint32_t ld, uint32_t k, uint32_t sort_slots,
                                                 const uint32_t* out_ids, const float* out_dists) {
  const uint64_t bad = scan::misaligned_bits<16>(dists) | scan::misaligned_bits<4>(tiles_done) |
                       scan::misaligned_bits<4>(out_ids) | scan::misaligned_bits<4>(out_dists) | (ld % SELECT_VEC);
  return bad == 0 && tiles_done != nullptr && k != 0 && n_rows != 0 && ld >= n_rows && sort_slots != 0 &&
         (sort_slots & (sort_slots - 1)) == 0 && static_cast<uint64_t>(sort_slots) * 8 <= scan::dynamic_shared_bytes() &&
         blockDim.x == FRAGLINK_SELECT_BLOCK && blockDim.y == 1 && blockDim.z == 1;
}

__device__ FRAGLINK_INLINE void run_select(const float* __restrict__ dists, const uint32_t* __restrict__ tiles_done,
                                           uint32_t n_rows, uint32_t ld,
                                           uint32_t n_queries, uint32_t k, uint32_t sort_slots,
                                           uint32_t* __restrict__ out_ids, float* __restrict__ out_dists) {
  constexpr int BLOCK = FRAGLINK_SELECT_BLOCK;
  constexpr int WARPS = BLOCK / 32;
  // One histogram per warp: the keys of a row cluster in few bins (distances of
  // one order of magnitude share their top byte), and warps adding to one shared
  // histogram would serialise on them.
  __shared__ uint32_t s_hist[WARPS][256];
  __shared__ uint32_t s_pick[3];
  __shared__ uint32_t s_count;
  uint64_t* const s_keys = reinterpret_cast<uint64_t*>(scan::dynamic_shared());

  if (!select_launch_ok(dists, tiles_done, n_rows, ld, k, sort_slots, out_ids, out_dists)) return;
  const uint64_t row_tiles = dist_row_tiles(n_rows);
  const uint32_t tid = threadIdx.x;
  const uint32_t warp = tid / 32;
  const uint64_t kk = k < n_rows ? k : n_rows;
  // The ids' top byte: a select over ids starts there (the bytes above are zero).
  int id_top = 24;
  while (id_top > 0 && ((n_rows - 1u) >> id_top) == 0u) id_top -= 8;

  for (uint64_t q = blockIdx.x; q < n_queries; q += gridDim.x) {  // 64-bit: no wrap-around
    // A matrix row knn_dist did not write whole (it refused its launch, or its grid
    // missed or repeated a tile) holds a former owner's bytes: the query is skipped
    // and its outputs stay unwritten, which the host reports. The same word for the
    // whole block.
    if (tiles_done[q / DQ] != row_tiles) continue;
    const float* __restrict__ row = dists + q * ld;
    const uint64_t out = q * k;
    // The kk winners in slices of ranks [a, b), at most sort_slots each (one slice
    // where kk fits the sort). The 64-bit key (order key, id) orders as
    // scan::key_less and is distinct per entry; `prev` is the last key of the slice
    // before, `filled` how many output positions are written.
    uint64_t prev = 0, filled = 0;
    for (uint64_t a = 0; a < kk; a += sort_slots) {
      const uint64_t b = kk - a < sort_slots ? kk : a + sort_slots;
      // T, the key of rank b - 1 (a radix select on the keys): `below` keys are
      // smaller, `ties` equal it, and the first need = b - below ties in id order make
      // the cut. Then the keys after `prev` up to the cut are collected:
      // - T the excluded rows' key: every allowed key (`below` - a of them after
      //   `prev`); the ranks after them are padding whatever the excluded rows' ids,
      //   so this is the last slice;
      // - every key <= T where the ties beyond the slice fit the sort too (the sort
      //   puts the smallest ids first);
      // - else (many equal distances) up to the need-th tie in id order, found by a
      //   radix select on the ids of the ties.
      select_pass pass = select_keys;
      radix_round r;
      r.start(24, static_cast<uint32_t>(b - 1));
      uint32_t t_key = 0;
      uint64_t cut = 0;
      bool rest_excluded = false;
#pragma unroll 1
      for (;;) {
        if (pass == select_collect) {
          if (tid == 0) s_count = 0;
        } else {
          for (uint32_t h = tid; h < static_cast<uint32_t>(WARPS) * 256; h += BLOCK) s_hist[h / 256][h % 256] = 0;
        }
        __syncthreads();
        visit_row<BLOCK>(row, n_rows, ld, [&](uint64_t i, float d) {
          // Two cases, not three: a branch per kind of pass made NVVM compile the
          // walk once per kind again (and take longer than before).
          const uint32_t key = entry_key(d);
          if (pass == select_collect) {
            const uint64_t k64 = (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(i);
            if (k64 <= cut && (a == 0 || k64 > prev)) {
              const uint32_t at = atomicAdd(&s_count, 1u);
              if (at < sort_slots) s_keys[at] = k64;  // always: the count is at most sort_slots
            }
          } else if (pass == select_keys || key == t_key) {
            r.count(pass == select_keys ? key : static_cast<uint32_t>(i), s_hist, warp);
          }
        });
        __syncthreads();
        if (pass == select_collect) break;
        if (r.advance<BLOCK>(s_hist, s_pick)) continue;
        if (pass == select_keys) {
          t_key = r.prefix;
          const uint32_t ties = r.equal;
          const uint32_t need = static_cast<uint32_t>(b - r.below);
          rest_excluded = t_key == 0xFFFFFFFFu;
          cut = rest_excluded ? (0xFFFFFFFFull << 32) - 1u : (static_cast<uint64_t>(t_key) << 32) | 0xFFFFFFFFu;
          if (!rest_excluded && (b - a) + (ties - need) > sort_slots) {
            pass = select_tie_ids;
            r.start(id_top, need - 1);
            continue;
          }
        } else {
          cut = (static_cast<uint64_t>(t_key) << 32) | r.prefix;  // the need-th tie's id
        }
        pass = select_collect;
      }
      // The slice sorted by (key, id); the slots beyond the kept keys sort last.
      const uint32_t kept = s_count < sort_slots ? s_count : sort_slots;
      const uint32_t n_sort = static_cast<uint32_t>(scan::next_pow2(static_cast<int>(kept)));
      for (uint32_t j = kept + tid; j < n_sort; j += BLOCK) s_keys[j] = ~0ull;
      __syncthreads();
      bitonic_sort_u64<BLOCK>(s_keys, n_sort);

      const uint64_t n_out = rest_excluded ? kept : b - a;
      for (uint64_t j = tid; j < n_out; j += BLOCK) {
        const uint32_t id = static_cast<uint32_t>(s_keys[j]);
        out_ids[out + a + j] = id;
        out_dists[out + a + j] = row[id];
      }
      filled = a + n_out;
      if (!rest_excluded) prev = s_keys[b - a - 1];
      __syncthreads();  // the next slice rewrites the keys and s_count
      if (rest_excluded) break;
    }
    // Excluded rows and positions beyond the rows: padding as the scan pads.
    for (uint64_t j = filled + tid; j < k; j += BLOCK) {
      out_ids[out + j] = 0xFFFFFFFFu;
      out_dists[out + j] = scan::pos_inf();
    }
  }
}

}  // namespace select
}  // namespace fraglink
