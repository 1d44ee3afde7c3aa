// fraglink tests — runs the knn_tile + knn_rerank kernels of one program under the
// SIMT emulator (simt.h) on inputs written by tests/knn_emulated.rs.
//
// A program is generated per (dtype, metric): it includes simt.h, the rendered
// metric, filter, knn_tile and knn_rerank sources of the build, then this file, and
// lists its kernels in tables for `knn_main`.
//
// Usage: PROGRAM TILE RERANK N_ROWS DIM NQ K CHUNK_ROWS N_CHUNKS GROUPS GROUP_CHUNKS
//                TILE_GRID_X RERANK_GRID_X TILE_SHARED SEED DIR
// (GROUPS, GROUP_CHUNKS: knn::plan::merge_groups; GROUPS > 1 adds the merge level;
// TILE_SHARED: the candidate kernel's dynamic shared memory, KnnPlan::dynamic_shared_bytes_for(nq).)
// DIR holds dataset.bin, queries.bin (raw elements, row-major), row_aux0.bin,
// row_aux1.bin, query_aux0.bin, query_aux1.bin (f32), and filter.bin (u32 words;
// absent: no filter), and for an f16copy variant stage_dataset.bin and
// stage_queries.bin (the f16 copies' bits; absent: null pointers). Writes
// DIR/ids.bin (u32) and DIR/dists.bin (f32), NQ x K each.
// Exit 0 on success; 1 with a message on stderr when an output was not written or a
// candidate buffer breaks the kernels' contract; 2 on bad arguments.
// FRAGLINK_SIMT_QUERY_OFFSET=N starts the queries N elements into their buffer (a
// misaligned pointer, for the launch-refusal tests); so do the queries' f16 copies.
// The candidate kernel gets the queries' shared bounds and the chunks' certificates
// behind them (all ones, as the host sets them), or with FRAGLINK_SIMT_NO_BOUND=1 a
// null pointer (every chunk on its own).
// DIR/candidates.bin receives the number of candidates the tile kernel wrote, all
// slots together (one little-endian u64).
// FRAGLINK_SIMT_PREFETCH=N is the tile kernel's `prefetch` (chunks asked of L2
// ahead of its copies; default 4, the host's DEFAULT_PREFETCH): every byte a block
// names must lie in its chunk's rows as staged or their norms (simt::prefetch), and
// DIR/prefetched.bin receives how many bytes it named (one u64).
// FRAGLINK_SIMT_UNWRITE_SLOT=S sets candidate slot S's count back to all ones after
// the tile kernel (as a refused tile launch leaves every count): the re-rank blocks
// whose first query is that slot's must write nothing, so with the query alone in
// its blocks, its outputs stay unwritten (checked here; NaN in dists.bin) and every
// other query's are written.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "driver_io.h"

namespace simt_knn {

using namespace simt_io;

template <typename T>
using tile_fn = void (*)(const T*, const T*, const void*, const void*, const uint32_t*, const float*, const float*,
                         const float*, const float*, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t*,
                         float*, float*, uint32_t*, uint32_t*, uint32_t);
template <typename T>
using rerank_fn = void (*)(const T*, const T*, const uint32_t*, const float*, const float*, const uint32_t*,
                           uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t*, float*, float*, uint32_t*,
                           uint32_t*, float*);

// One (query, chunk or group) candidate list per slot, in knn_tile's output format.
struct candidates {
  std::vector<uint32_t> count;
  std::vector<float> lo, hi;
  std::vector<uint32_t> ids;
  static constexpr uint32_t unwritten = 0xDEADBEEFu;
  // What the host sets the counts to (Transfer::fill_ones): the re-rank skips a
  // query any of whose counts is still so.
  static constexpr uint32_t count_unwritten = 0xFFFFFFFFu;
  candidates(size_t slots, uint32_t cap) : count(slots, count_unwritten), lo(slots * cap, NAN),
                                           hi(slots * cap, NAN), ids(slots * cap, unwritten) {}

  // Every slot written (but those of query `skip`, slots_per_query apart), at most
  // `cap` entries with lo <= hi and a real row, each in the rows `row_ok` accepts
  // for its slot.
  template <typename RowOk>
  void check(const char* what, uint32_t cap, uint32_t n_rows, RowOk row_ok, size_t slots_per_query = 1,
             size_t skip = SIZE_MAX) const {
    for (size_t s = 0; s < count.size(); ++s) {
      const std::string at_slot = std::string(what) + " slot " + std::to_string(s);
      if (s / slots_per_query == skip) continue;
      if (count[s] == count_unwritten) die(1, at_slot + ": count not written");
      if (count[s] > cap) die(1, at_slot + " holds " + std::to_string(count[s]) + " > capacity");
      for (uint32_t j = 0; j < count[s]; ++j) {
        const size_t at = s * cap + j;
        if (!(lo[at] <= hi[at]) || ids[at] >= n_rows || !row_ok(s, ids[at])) {
          die(1, at_slot + " entry " + std::to_string(j) + ": lo " + std::to_string(lo[at]) + " hi " +
                     std::to_string(hi[at]) + " id " + std::to_string(ids[at]));
        }
      }
    }
  }
};

template <typename T>
int knn_main(int argc, char** argv, const entry<tile_fn<T>>* tiles, size_t n_tiles,
             const entry<rerank_fn<T>>* reranks, size_t n_reranks) {
  if (argc != 16) {
    die(2, "usage: TILE RERANK N_ROWS DIM NQ K CHUNK_ROWS N_CHUNKS GROUPS GROUP_CHUNKS TILE_GRID_X RERANK_GRID_X "
           "TILE_SHARED SEED DIR");
  }
  const entry<tile_fn<T>>& tile = find(tiles, n_tiles, argv[1]);
  const entry<rerank_fn<T>>& rerank = find(reranks, n_reranks, argv[2]);
  const uint32_t n_rows = arg_u32(argv[3]), dim = arg_u32(argv[4]), nq = arg_u32(argv[5]), k = arg_u32(argv[6]);
  const uint32_t chunk_rows = arg_u32(argv[7]), n_chunks = arg_u32(argv[8]);
  const uint32_t groups = arg_u32(argv[9]), group_chunks = arg_u32(argv[10]);
  const uint32_t tile_grid = arg_u32(argv[11]), rerank_grid = arg_u32(argv[12]);
  const uint32_t tile_shared = arg_u32(argv[13]), seed = arg_u32(argv[14]);
  const std::string dir = argv[15];
  if (tile.capacity != rerank.capacity) die(2, "tile and re-rank capacities differ");
  const uint32_t cap = tile.capacity;

  const std::vector<T> dataset = read_file<T>(dir + "/dataset.bin", size_t(n_rows) * dim);
  const std::vector<T> query_rows = read_file<T>(dir + "/queries.bin", size_t(nq) * dim);
  const char* offset_env = std::getenv("FRAGLINK_SIMT_QUERY_OFFSET");
  const size_t query_offset = offset_env == nullptr ? 0 : std::strtoul(offset_env, nullptr, 10);
  std::vector<T> query_buffer(query_offset + query_rows.size());
  std::copy(query_rows.begin(), query_rows.end(), query_buffer.begin() + query_offset);
  const T* const queries = query_buffer.data() + query_offset;
  const std::vector<uint16_t> stage_rows = read_file<uint16_t>(dir + "/stage_dataset.bin", size_t(n_rows) * dim, true);
  const std::vector<uint16_t> stage_query_rows =
      read_file<uint16_t>(dir + "/stage_queries.bin", size_t(nq) * dim, true);
  std::vector<uint16_t> stage_query_buffer(query_offset + stage_query_rows.size());
  std::copy(stage_query_rows.begin(), stage_query_rows.end(), stage_query_buffer.begin() + query_offset);
  const void* const stage_dataset = stage_rows.empty() ? nullptr : stage_rows.data();
  const void* const stage_queries = stage_query_rows.empty() ? nullptr : stage_query_buffer.data() + query_offset;
  const std::vector<uint32_t> bits = read_file<uint32_t>(dir + "/filter.bin", (n_rows + 31) / 32, true);
  const std::vector<float> ra0 = read_file<float>(dir + "/row_aux0.bin", n_rows);
  const std::vector<float> ra1 = read_file<float>(dir + "/row_aux1.bin", n_rows);
  const std::vector<float> qa0 = read_file<float>(dir + "/query_aux0.bin", nq);
  const std::vector<float> qa1 = read_file<float>(dir + "/query_aux1.bin", nq);

  // Sentinels: every slot the tile kernel owns must be overwritten.
  candidates c(size_t(nq) * n_chunks, cap);
  const uint32_t* filter = bits.empty() ? nullptr : bits.data();
  const char* no_bound_env = std::getenv("FRAGLINK_SIMT_NO_BOUND");
  // The shared bounds, then the chunks' certificates (knn_tile.cuh union_of).
  std::vector<uint32_t> bounds(size_t(nq) + size_t(nq) * n_chunks, 0xFFFFFFFFu);
  uint32_t* const bound_keys = no_bound_env != nullptr && std::string(no_bound_env) == "1" ? nullptr : bounds.data();
  const char* prefetch_env = std::getenv("FRAGLINK_SIMT_PREFETCH");
  const uint32_t prefetch = prefetch_env == nullptr ? 4u : arg_u32(prefetch_env);
  // Block (x, y) may name the rows of chunk y only: of what it stages (the f16
  // copies for f16copy) and of their norms.
  const void* const staged = stage_dataset != nullptr ? stage_dataset : static_cast<const void*>(dataset.data());
  const uint64_t staged_bytes = stage_dataset != nullptr ? sizeof(uint16_t) : sizeof(T);
  simt::prefetchable() = [&](simt::extent b, uintptr_t at, uint64_t bytes) {
    const uint64_t r0 = uint64_t(b.y) * chunk_rows;
    const uint64_t r1 = std::min<uint64_t>(r0 + chunk_rows, n_rows);
    if (r1 <= r0) return false;
    const uint64_t rows = r1 - r0;
    return simt::within(at, bytes, static_cast<const char*>(staged) + r0 * dim * staged_bytes,
                        rows * dim * staged_bytes) ||
           simt::within(at, bytes, ra0.data() + r0, rows * sizeof(float)) ||
           simt::within(at, bytes, ra1.data() + r0, rows * sizeof(float));
  };
  auto run_tile = [&] {
    tile.fn(dataset.data(), queries, stage_dataset, stage_queries, filter, ra0.data(), ra1.data(), qa0.data(), qa1.data(), n_rows, dim, nq, k,
            chunk_rows, c.count.data(), c.lo.data(), c.hi.data(), c.ids.data(), bound_keys, prefetch);
  };
  simt::launch(simt::extent{tile_grid, n_chunks, 1}, simt::extent{128, 1, 1}, run_tile, seed, tile_shared);
  write_file(dir + "/prefetched.bin", std::vector<uint64_t>{simt::prefetched()});
  c.check("tile", cap, n_rows, [&](size_t s, uint32_t id) { return id / chunk_rows == s % n_chunks; });
  {
    uint64_t written = 0;
    for (uint32_t n : c.count) written += n == candidates::count_unwritten ? 0 : n;
    write_file(dir + "/candidates.bin", std::vector<uint64_t>{written});
  }
  const char* unwrite_env = std::getenv("FRAGLINK_SIMT_UNWRITE_SLOT");
  size_t skipped = SIZE_MAX;  // the query whose outputs must stay unwritten
  if (unwrite_env != nullptr) {
    const size_t slot = std::strtoul(unwrite_env, nullptr, 10);
    if (slot >= c.count.size()) die(2, "FRAGLINK_SIMT_UNWRITE_SLOT beyond the candidate slots");
    c.count[slot] = candidates::count_unwritten;
    skipped = slot / n_chunks;
  }

  // The re-rank as src/search/knn/gpu.rs launches it: a merge level over groups of
  // chunks first when there are several groups, then the final launch over its
  // lists (which gpu.rs replaces by a host merge of short lists).
  const candidates* final_in = &c;
  uint32_t final_chunks = n_chunks;
  candidates merged(groups > 1 ? size_t(nq) * groups : 0, cap);
  if (groups > 1) {
    auto run_merge = [&] {
      rerank.fn(dataset.data(), queries, c.count.data(), c.lo.data(), c.hi.data(), c.ids.data(), dim, nq,
                n_chunks, k, group_chunks, merged.count.data(), merged.lo.data(), merged.hi.data(),
                merged.ids.data(), nullptr, nullptr);
    };
    simt::launch(simt::extent{rerank_grid, groups, 1}, simt::extent{128, 1, 1}, run_merge, seed + 2);
    merged.check(
        "merged", cap, n_rows,
        [&](size_t s, uint32_t id) {
          const uint64_t g = s % groups;
          return id / chunk_rows >= g * group_chunks && id / chunk_rows < (g + 1) * group_chunks;
        },
        groups, skipped);
    // What src/search/knn/gpu.rs merges on the host instead of the final launch
    // for short lists (merge_on_host): the test merges these and compares.
    write_file(dir + "/merged_lo.bin", merged.lo);
    write_file(dir + "/merged_ids.bin", merged.ids);
    final_in = &merged;
    final_chunks = groups;
  }
  std::vector<uint32_t> out_ids(size_t(nq) * k, candidates::unwritten);
  std::vector<float> out_dists(size_t(nq) * k, NAN);
  auto run_rerank = [&] {
    rerank.fn(dataset.data(), queries, final_in->count.data(), final_in->lo.data(), final_in->hi.data(),
              final_in->ids.data(), dim, nq, final_chunks, k, final_chunks, nullptr, nullptr, nullptr, nullptr,
              out_ids.data(), out_dists.data());
  };
  simt::launch(simt::extent{rerank_grid, 1, 1}, simt::extent{128, 1, 1}, run_rerank, seed + 1);
  if (skipped != SIZE_MAX) {
    // The skipped query's outputs all unwritten, every other one written.
    std::vector<float> others = out_dists;
    for (size_t j = 0; j < k; ++j) {
      if (out_dists[skipped * k + j] == out_dists[skipped * k + j]) {
        die(1, "query " + std::to_string(skipped) + " output " + std::to_string(j) +
                   " written from an unwritten candidate count");
      }
      others[skipped * k + j] = 0.0f;
    }
    require_written(others);
    write_file(dir + "/ids.bin", out_ids);
    write_file(dir + "/dists.bin", out_dists);
    return 0;
  }
  return write_results(dir, "ids.bin", out_ids, out_dists);
}

}  // namespace simt_knn
