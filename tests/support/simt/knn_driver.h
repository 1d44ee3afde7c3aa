// fraglink tests — runs the knn_tile + knn_rerank kernels of one program under the
// SIMT emulator (simt.h) on inputs written by tests/knn_emulated.rs.
//
// A program is generated per (dtype, metric): it includes simt.h, the rendered
// metric, filter, knn_tile and knn_rerank sources of the build, then this file, and
// lists its kernels in tables for `knn_main`.
//
// Usage: PROGRAM TILE RERANK N_ROWS DIM NQ K CHUNK_ROWS N_CHUNKS TILE_GRID_X RERANK_GRID_X
//                SEED DIR
// DIR holds dataset.bin, queries.bin (raw elements, row-major), row_aux0.bin,
// row_aux1.bin, query_aux0.bin, query_aux1.bin (f32), and filter.bin (u32 words;
// absent: no filter). Writes DIR/ids.bin (u32) and DIR/dists.bin (f32), NQ x K each.
// Exit 0 on success; 1 with a message on stderr when an output was not written or a
// candidate buffer breaks the kernels' contract; 2 on bad arguments.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "driver_io.h"

namespace simt_knn {

using namespace simt_io;

template <typename T>
using tile_fn = void (*)(const T*, const T*, const uint32_t*, const float*, const float*, const float*,
                         const float*, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t*, float*, float*,
                         uint32_t*);
template <typename T>
using rerank_fn = void (*)(const T*, const T*, const uint32_t*, const float*, const float*, const uint32_t*,
                           uint32_t, uint32_t, uint32_t, uint32_t, uint32_t*, float*);

template <typename T>
int knn_main(int argc, char** argv, const entry<tile_fn<T>>* tiles, size_t n_tiles,
             const entry<rerank_fn<T>>* reranks, size_t n_reranks) {
  if (argc != 13) die(2, "usage: TILE RERANK N_ROWS DIM NQ K CHUNK_ROWS N_CHUNKS TILE_GRID_X RERANK_GRID_X SEED DIR");
  const entry<tile_fn<T>>& tile = find(tiles, n_tiles, argv[1]);
  const entry<rerank_fn<T>>& rerank = find(reranks, n_reranks, argv[2]);
  const uint32_t n_rows = arg_u32(argv[3]), dim = arg_u32(argv[4]), nq = arg_u32(argv[5]), k = arg_u32(argv[6]);
  const uint32_t chunk_rows = arg_u32(argv[7]), n_chunks = arg_u32(argv[8]);
  const uint32_t tile_grid = arg_u32(argv[9]), rerank_grid = arg_u32(argv[10]), seed = arg_u32(argv[11]);
  const std::string dir = argv[12];
  if (tile.capacity != rerank.capacity) die(2, "tile and re-rank capacities differ");
  const uint32_t cap = tile.capacity;

  const std::vector<T> dataset = read_file<T>(dir + "/dataset.bin", size_t(n_rows) * dim);
  const std::vector<T> queries = read_file<T>(dir + "/queries.bin", size_t(nq) * dim);
  const std::vector<uint32_t> bits = read_file<uint32_t>(dir + "/filter.bin", (n_rows + 31) / 32, true);
  const std::vector<float> ra0 = read_file<float>(dir + "/row_aux0.bin", n_rows);
  const std::vector<float> ra1 = read_file<float>(dir + "/row_aux1.bin", n_rows);
  const std::vector<float> qa0 = read_file<float>(dir + "/query_aux0.bin", nq);
  const std::vector<float> qa1 = read_file<float>(dir + "/query_aux1.bin", nq);

  // Sentinels: every slot the tile kernel owns must be overwritten.
  const size_t slots = size_t(nq) * n_chunks;
  const uint32_t unwritten = 0xDEADBEEFu;
  std::vector<uint32_t> count(slots, unwritten);
  std::vector<float> lo(slots * cap, NAN), hi(slots * cap, NAN);
  std::vector<uint32_t> ids(slots * cap, unwritten);
  const uint32_t* filter = bits.empty() ? nullptr : bits.data();
  auto run_tile = [&] {
    tile.fn(dataset.data(), queries.data(), filter, ra0.data(), ra1.data(), qa0.data(), qa1.data(), n_rows, dim, nq, k,
            chunk_rows, count.data(), lo.data(), hi.data(), ids.data());
  };
  simt::launch(simt::extent{tile_grid, n_chunks, 1}, simt::extent{128, 1, 1}, run_tile, seed);
  const uint64_t tile_switches = simt::m().switches;

  for (size_t s = 0; s < slots; ++s) {
    if (count[s] == unwritten) die(1, "candidate count of (query, chunk) slot " + std::to_string(s) + " not written");
    if (count[s] > cap) die(1, "slot " + std::to_string(s) + " holds " + std::to_string(count[s]) + " > capacity");
    for (uint32_t j = 0; j < count[s]; ++j) {
      const size_t at = s * cap + j;
      if (!(lo[at] <= hi[at]) || ids[at] >= n_rows) {
        die(1, "slot " + std::to_string(s) + " entry " + std::to_string(j) + ": lo " + std::to_string(lo[at]) +
                   " hi " + std::to_string(hi[at]) + " id " + std::to_string(ids[at]));
      }
      const uint32_t chunk = static_cast<uint32_t>(s % n_chunks);
      if (ids[at] / chunk_rows != chunk) die(1, "slot " + std::to_string(s) + " holds a row of another chunk");
    }
  }

  std::vector<uint32_t> out_ids(size_t(nq) * k, unwritten);
  std::vector<float> out_dists(size_t(nq) * k, NAN);
  auto run_rerank = [&] {
    rerank.fn(dataset.data(), queries.data(), count.data(), lo.data(), hi.data(), ids.data(), dim, nq, n_chunks, k,
              out_ids.data(), out_dists.data());
  };
  simt::launch(simt::extent{rerank_grid, 1, 1}, simt::extent{128, 1, 1}, run_rerank, seed + 1);
  require_written(out_dists);
  write_file(dir + "/ids.bin", out_ids);
  write_file(dir + "/dists.bin", out_dists);
  std::printf("switches %llu %llu\n", static_cast<unsigned long long>(tile_switches),
              static_cast<unsigned long long>(simt::m().switches - tile_switches));
  return 0;
}

}  // namespace simt_knn
