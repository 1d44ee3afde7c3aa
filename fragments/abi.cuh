// fraglink fragments — the ABI between fragment families.
//
// A linked program is exactly ONE scan fragment + ONE metric fragment + ONE filter
// fragment. The scan (entry point) calls the metric and the filter only through the
// extern "C" symbols declared here; each symbol is named by the parameters its two
// sides share and nothing else:
//
//   fraglink_metric_{init,accumulate,finalize}_<dtype>
//       dtype ∈ f32 f16 i8 u8; defined by exactly one fragment metric_<metric>_<dtype>
//   fraglink_filter_<idx>
//       idx ∈ u32 i64;         defined by exactly one fragment filter_<filter>_<idx>
//
// In every valid (scan, metric, filter) triple — the three agree on dtype and idx —
// each symbol the scan uses has exactly one definition; a triple that disagrees
// fails to link with an undefined symbol instead of computing the wrong thing.
// nvJitLink -lto inlines these calls, so the boundary costs nothing at run time.
//
// The scan entry point itself (extern "C" __global__, symbol = fragment name) is
// declared by templates/scan.cu.j2 and documented in fragments/README.md.
//
// This header is host-compilable (declarations only, FRAGLINK_HD), so the rendered
// metric and filter fragment sources also compile with a host C++ compiler.
#pragma once

#include "common.cuh"

namespace fraglink {

// Accumulator type per dtype (metric.cuh explains the choice). Part of the ABI:
// it fixes the layout of the metric state that the scan owns and the metric fills.
typedef float acc_f32;
typedef float acc_f16;
typedef int32_t acc_i8;
typedef uint32_t acc_u8;

// The state of one distance computation: `a` is the sum the metric is named after
// (sum of squared differences for l2, dot product for inner_product and cosine);
// `qq` and `xx` are the squared norms of the query and the row (cosine only; the
// other metrics leave them zero). Three accumulators, no padding.
template <typename Acc>
struct metric_state {
  Acc a;
  Acc qq;
  Acc xx;
};

}  // namespace fraglink

typedef fraglink::metric_state<fraglink::acc_f32> fraglink_metric_state_f32;
typedef fraglink::metric_state<fraglink::acc_f16> fraglink_metric_state_f16;
typedef fraglink::metric_state<fraglink::acc_i8> fraglink_metric_state_i8;
typedef fraglink::metric_state<fraglink::acc_u8> fraglink_metric_state_u8;

extern "C" {

// ----- metric: one set per dtype ---------------------------------------------------
// init: zero *s.  accumulate: fold in element j of the query (q) and of the row (x);
// called for j = 0 .. dim-1 in order.  finalize: the distance, smaller = closer.
FRAGLINK_HD void fraglink_metric_init_f32(fraglink_metric_state_f32* s);
FRAGLINK_HD void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x);
FRAGLINK_HD float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s);

FRAGLINK_HD void fraglink_metric_init_f16(fraglink_metric_state_f16* s);
FRAGLINK_HD void fraglink_metric_accumulate_f16(fraglink_metric_state_f16* s, __half q, __half x);
FRAGLINK_HD float fraglink_metric_finalize_f16(const fraglink_metric_state_f16* s);

FRAGLINK_HD void fraglink_metric_init_i8(fraglink_metric_state_i8* s);
FRAGLINK_HD void fraglink_metric_accumulate_i8(fraglink_metric_state_i8* s, int8_t q, int8_t x);
FRAGLINK_HD float fraglink_metric_finalize_i8(const fraglink_metric_state_i8* s);

FRAGLINK_HD void fraglink_metric_init_u8(fraglink_metric_state_u8* s);
FRAGLINK_HD void fraglink_metric_accumulate_u8(fraglink_metric_state_u8* s, uint8_t q, uint8_t x);
FRAGLINK_HD float fraglink_metric_finalize_u8(const fraglink_metric_state_u8* s);

// ----- filter: one per index type --------------------------------------------------
// true = `row` may appear in the results of query `query`. `bits` is the scan's
// filter_bits argument, passed through unchanged (filter_none ignores it).
FRAGLINK_HD bool fraglink_filter_u32(const uint32_t* bits, uint32_t query, uint32_t row);
FRAGLINK_HD bool fraglink_filter_i64(const uint32_t* bits, uint32_t query, int64_t row);

}  // extern "C"
