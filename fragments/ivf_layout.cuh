// fraglink fragments — cuVS's interleaved list layout (shared by the IVF-Flat scan
// kernel and host code).
//
// Header-only, __host__ __device__: the IVF scan (ivf_scan.cuh) addresses its lists
// with these functions, and tests/host_headers.rs compiles them for the host and
// checks, through the metric structs of metric.cuh, that folding a row out of an
// interleaved group gives the Rust reference distance bit for bit (the Rust side of
// the layout is src/search/ivf/layout.rs).
//
// A list is stored in groups of 32 rows; inside a group the dimension is cut into
// chunks of `veclen` elements and chunk c holds, for each of the 32 rows in turn,
// that row's veclen elements. Row `row`, element `j`:
//   (row / 32) * 32 * dim + (j / veclen) * 32 * veclen + (row % 32) * veclen + j % veclen
#pragma once

#include "abi.cuh"

namespace fraglink {
namespace ivf {

constexpr uint32_t kGroup = 32;

FRAGLINK_HD FRAGLINK_INLINE uint64_t interleaved_offset(uint64_t row, uint32_t j, uint32_t dim, uint32_t veclen) {
  return (row / kGroup) * kGroup * dim + static_cast<uint64_t>(j / veclen) * kGroup * veclen +
         (row % kGroup) * veclen + j % veclen;
}

// The distance of query `q` and row `row` of an interleaved list through metric M
// (a metric.cuh struct: init / accumulate / finalize on M::state), elements folded
// in dimension order j = 0 .. dim-1 whatever veclen is.
template <typename M, typename T>
FRAGLINK_HD FRAGLINK_INLINE float interleaved_fold(const T* q, const T* list, uint64_t row, uint32_t dim,
                                                   uint32_t veclen) {
  typename M::state s;
  M::init(s);
  for (uint32_t j = 0; j < dim; ++j) {
    M::accumulate(s, q[j], list[interleaved_offset(row, j, dim, veclen)]);
  }
  return M::finalize(s);
}

}  // namespace ivf
}  // namespace fraglink
