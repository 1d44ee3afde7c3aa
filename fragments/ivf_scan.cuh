// fraglink fragments — the IVF-Flat interleaved scan (algorithm code of the
// `ivf_scan` family).
//
// Device-only. templates/ivf_scan.cu.j2 instantiates fraglink::ivf::run<T, VL, CAP, ASC>
// inside an extern "C" __global__ entry point named after the fragment. Distances and
// filtering come from the metric and filter (i64 ids) fragments linked beside it, the
// same ones the brute-force scan links (abi.cuh): there is one definition of l2,
// inner_product and cosine.
//
// Data: the lists in cuVS's interleaved layout (ivf_layout.cuh, src/search/ivf/layout.rs), all lists
// back to back in `data`; list l starts at row list_offsets[l] (a multiple of 32) and
// holds list_sizes[l] rows; `ids` holds each stored row's dataset id at the same row
// index. Group g of a list is 32 rows; element j of its row r is at
//   group_start + (j / VL) * 32 * VL + r * VL + j % VL  =  group_start + j * 32 + r * VL + j % VL
// so lane r of a warp loads chunk j / VL of its row as one VL-wide vector and the warp
// reads 32 * VL consecutive elements: coalesced.
//
// Algorithm (blocks of FRAGLINK_SCAN_BLOCK = 128 threads, grid-stride over queries
// along x): the brute-force scan's (scan.cuh) — CAP best keys in shared memory, a
// candidate test against the k-th best, bitonic sorts of the candidates (BlockTopK) —
// over the rows of the query's `nprobe` probed lists (probes[q * nprobe + p], chosen
// by the coarse step: the brute-force scan over the centroids with k = nprobe).
// Probe splits: block (x, y) of a grid gridDim.y high scans probes y, y + gridDim.y,
// y + 2 gridDim.y, ... and writes that split's best k to
// out[(q * gridDim.y + y) * k ...]; the host merges the splits of a query by the same
// key order (src/search/ivf/gpu.rs, merge_splits). So a few queries still fill the
// GPU; gridDim.y = 1 is the plain one-block-per-query scan. Thread
// t of a 128-row tile is lane t % 32 of group t / 32 of the tile. Elements fold in
// order j = 0 .. dim-1 through the metric, NaN becomes +inf, ties go to the smaller
// dataset id: the CPU path (src/search/ivf/scan.rs) computes the same keys.
//
// ASC = false ranks larger distances first (for a run-time user metric that is a
// similarity): keys are negated into the ascending sort and back on output, so ties
// still go to the smaller id, NaN still ranks last, and padding is -inf.
#pragma once

#include "ivf_layout.cuh"
#include "scan.cuh"

namespace fraglink {
namespace ivf {

// Distance of the query and row `lane` of an interleaved group through the linked metric.
template <typename T, int VL>
__device__ FRAGLINK_INLINE float group_distance(const T* __restrict__ q, const T* __restrict__ group,
                                                uint32_t lane, uint32_t dim) {
  typedef scan::metric_abi<T> M;
  typename M::state st;
  M::init(&st);
  for (uint32_t j = 0; j < dim; j += VL) {
    const scan::vec<T, VL> qv = scan::load_vec<T, VL>(q + j);
    // j is a multiple of VL: the chunk's first element, a VL-aligned vector.
    const scan::vec<T, VL> xv = scan::load_vec<T, VL>(group + interleaved_offset(lane, j, dim, VL));
#pragma unroll
    for (int e = 0; e < VL; ++e) {
      M::accumulate(&st, qv.v[e], xv.v[e]);
    }
  }
  return M::finalize(&st);
}

// The launch contract the kernel checks by itself (as scan::launch_ok): k in 1..CAP,
// 128 threads, dim % VL == 0, data and queries aligned to the vector loads, the other
// arrays to their element size. A refused launch writes nothing.
template <typename T, int VL, int CAP>
__device__ FRAGLINK_INLINE bool launch_ok(const T* data, const int64_t* ids, const uint64_t* list_offsets,
                                          const uint32_t* list_sizes, const uint32_t* probes, const T* queries,
                                          const uint32_t* filter_bits, uint32_t dim, uint32_t k,
                                          const int64_t* out_ids, const float* out_dists) {
  constexpr int VEC_BYTES = static_cast<int>(sizeof(T)) * VL;
  const uint64_t bad = scan::misaligned_bits<VEC_BYTES>(data) | scan::misaligned_bits<VEC_BYTES>(queries) |
                       scan::misaligned_bits<8>(ids) | scan::misaligned_bits<8>(list_offsets) |
                       scan::misaligned_bits<4>(list_sizes) | scan::misaligned_bits<4>(probes) |
                       scan::misaligned_bits<4>(filter_bits) | scan::misaligned_bits<8>(out_ids) |
                       scan::misaligned_bits<4>(out_dists) | static_cast<uint64_t>(dim & static_cast<uint32_t>(VL - 1));
  return bad == 0 && k != 0 && k <= static_cast<uint32_t>(CAP) && blockDim.x == FRAGLINK_SCAN_BLOCK &&
         blockDim.y == 1 && blockDim.z == 1;
}

template <typename T, int VL, int CAP, bool ASC>
__device__ FRAGLINK_INLINE void run(const T* __restrict__ data, const int64_t* __restrict__ ids,
                                    const uint64_t* __restrict__ list_offsets,
                                    const uint32_t* __restrict__ list_sizes, const uint32_t* __restrict__ probes,
                                    uint32_t nprobe, const T* __restrict__ queries,
                                    const uint32_t* __restrict__ filter_bits, uint32_t dim, uint32_t n_queries,
                                    uint32_t k, int64_t* __restrict__ out_ids, float* __restrict__ out_dists) {
  constexpr int BLOCK = FRAGLINK_SCAN_BLOCK;
  constexpr int S = scan::next_pow2(CAP + BLOCK);
  static_assert(BLOCK % 32 == 0, "a tile is whole groups");
  static_assert(VL >= 1 && (VL & (VL - 1)) == 0, "veclen must be a power of two");
  static_assert(CAP >= 1 && (CAP & (CAP - 1)) == 0, "capacity must be a power of two");

  __shared__ float s_dist[S];
  __shared__ int64_t s_id[S];

  if (!launch_ok<T, VL, CAP>(data, ids, list_offsets, list_sizes, probes, queries, filter_bits, dim, k, out_ids,
                             out_dists)) {
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const uint32_t lane = static_cast<uint32_t>(tid) & 31u;
  const uint64_t split = blockIdx.y;
  const uint64_t splits = gridDim.y;
  const float inf = scan::pos_inf();
  const int64_t invalid = scan::idx_abi<int64_t>::invalid;

  for (uint64_t q = blockIdx.x; q < n_queries; q += gridDim.x) {
    for (int i = tid; i < S; i += BLOCK) {
      s_dist[i] = inf;
      s_id[i] = invalid;
    }
    __syncthreads();
    const T* __restrict__ qrow = queries + q * dim;
    scan::BlockTopK<CAP, S, BLOCK, int64_t> top(s_dist, s_id);
    // One loop over the tiles of every probed list (the same in every thread), and one
    // offer more after the last, of no candidate, marked `last`: BlockTopK's sort has
    // one call site, and which tile is the last is not known ahead here.
    // Split y opens probes y, y + splits, y + 2 splits, ...: no division by the split
    // count, which ptxas expands into a long sequence at every cold link (see
    // scan.cuh's row splits). 64-bit: p + splits never wraps.
    uint64_t p = split;  // the next probe to open
    uint64_t start = 0;
    uint32_t size = 0;
    uint32_t tile = 0;  // the next tile of the open list
    for (;;) {
      while (tile >= size && p < nprobe) {
        const uint32_t list = probes[q * nprobe + p];
        start = list_offsets[list];
        size = list_sizes[list];
        tile = 0;
        p += splits;
      }
      const bool last = tile >= size;
      const uint32_t r = tile + static_cast<uint32_t>(tid);
      float key = inf;
      int64_t id = invalid;
      bool candidate = false;
      if (r < size) {
        id = ids[start + r];
        if (scan::idx_abi<int64_t>::allows(filter_bits, static_cast<uint32_t>(q), id)) {
          const T* group = data + interleaved_offset(start + (r & ~31u), 0, dim, VL);
          const float d = group_distance<T, VL>(qrow, group, lane, dim);
          key = d != d ? inf : (ASC ? d : -d);  // NaN ranks last either way
          candidate = scan::key_less(key, id, s_dist[k - 1], s_id[k - 1]);
        }
      }
      top.offer(candidate, key, id, last);
      if (last) {
        break;
      }
      tile += BLOCK;
    }
    const uint64_t out = (q * splits + split) * k;
    for (uint32_t j = static_cast<uint32_t>(tid); j < k; j += BLOCK) {
      out_ids[out + j] = s_id[j];
      out_dists[out + j] = ASC ? s_dist[j] : -s_dist[j];
    }
    __syncthreads();
  }
}

}  // namespace ivf
}  // namespace fraglink
