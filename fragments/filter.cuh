// fraglink fragments — row filters (algorithm code of the `filter` family).
//
// Header-only, __host__ __device__ (host tests include it directly). A filter is a
// struct with one static function
//   allows(bits, query, row) -> bool   true = the row may appear in the results
// `query` is the query's index within its launch (0-based, < the launch's n_queries);
// no shipped filter uses it, it is in the ABI so that per-query filters (bitmaps) fit
// without changing it. A search's queries may take several launches (query chunks,
// batches, and on the tensor-core path the queries its bounds cover apart from the
// others), so such a filter needs bits laid out per launch by its host side.
#pragma once

#include "common.cuh"

namespace fraglink {
namespace filter {

// Every row is allowed; `bits` is ignored (may be null).
template <typename Idx>
struct none {
  static FRAGLINK_HD FRAGLINK_INLINE bool allows(const uint32_t* /*bits*/, uint32_t /*query*/, Idx /*row*/) {
    return true;
  }
};

// One bit per dataset row, shared by all queries: row i is allowed iff bit
// (i % 32) of 32-bit word i / 32 is set (LSB first; the array holds
// ceil(n_rows / 32) words). A null `bits` allows every row.
template <typename Idx>
struct bitset {
  static FRAGLINK_HD FRAGLINK_INLINE bool allows(const uint32_t* bits, uint32_t /*query*/, Idx row) {
    if (bits == nullptr) {
      return true;
    }
    const uint64_t r = static_cast<uint64_t>(row);
    return ((bits[r >> 5] >> static_cast<uint32_t>(r & 31u)) & 1u) != 0u;
  }
};

}  // namespace filter
}  // namespace fraglink
