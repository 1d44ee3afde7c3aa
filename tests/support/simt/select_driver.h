// fraglink tests — runs the two-pass select (fragments/knn_select.cuh: knn_dist, then
// knn_select) of one program under the SIMT emulator (simt.h) on inputs written by
// tests/select_emulated.rs.
//
// A program is generated per (dtype, metric): it includes simt.h, the rendered
// metric, filter_bitset_u32, knn_dist and knn_select sources of the build, then this
// file, and instantiates `select_main` with its two kernels.
//
// Usage: PROGRAM N_ROWS DIM NQ K SORT_SLOTS SELECT_GRID_X SEED DIR
// (SORT_SLOTS: knn::select::sort_slots; SELECT_GRID_X < NQ exercises the grid-stride
// loop.) DIR holds dataset.bin and queries.bin (raw elements, row-major) and
// filter.bin (u32 words; absent: no filter). Writes DIR/ids.bin (u32) and
// DIR/dists.bin (f32), NQ x K each. Exit 0 on success; 1 with a message on stderr
// when a matrix entry or an output was not written; 2 on bad arguments.
// FRAGLINK_SIMT_DIST_GRID_X=N launches knn_dist over N row tiles instead of
// ceil(N_ROWS / 64). More: the extra blocks count nothing and results are as usual.
// Fewer: every matrix row misses tiles, so the select must skip every query; the
// driver checks that it wrote no output, writes no results and exits 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "driver_io.h"

namespace simt_select {

using namespace simt_io;

template <typename T>
using dist_fn = void (*)(const T*, const T*, const uint32_t*, uint32_t, uint32_t, uint32_t, uint32_t, float*,
                         uint32_t*);
using select_fn = void (*)(const float*, const uint32_t*, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t*,
                           float*);

template <typename T>
int select_main(int argc, char** argv, dist_fn<T> dist, select_fn select) {
  if (argc != 9) die(2, "usage: N_ROWS DIM NQ K SORT_SLOTS SELECT_GRID_X SEED DIR");
  const uint32_t n_rows = arg_u32(argv[1]), dim = arg_u32(argv[2]), nq = arg_u32(argv[3]), k = arg_u32(argv[4]);
  const uint32_t sort_slots = arg_u32(argv[5]), select_grid = arg_u32(argv[6]), seed = arg_u32(argv[7]);
  const std::string dir = argv[8];
  const std::vector<T> dataset = read_file<T>(dir + "/dataset.bin", size_t(n_rows) * dim);
  const std::vector<T> queries = read_file<T>(dir + "/queries.bin", size_t(nq) * dim);
  const std::vector<uint32_t> bits = read_file<uint32_t>(dir + "/filter.bin", (n_rows + 31) / 32, true);

  // Rows of the matrix ld apart (knn::select::row_stride: whole 16-byte vectors).
  const uint32_t ld = (n_rows + 3) / 4 * 4;
  // Every entry must be written: the sentinel is a value no distance takes here.
  const float unwritten = -12345.0f;
  std::vector<float> matrix(size_t(nq) * ld, unwritten);
  // Blocks that wrote their tile, per query tile (the host zeroes them).
  std::vector<uint32_t> tiles_done((nq + 31) / 32, 0);
  auto run_dist = [&] {
    dist(dataset.data(), queries.data(), bits.empty() ? nullptr : bits.data(), n_rows, dim, nq, ld, matrix.data(),
         tiles_done.data());
  };
  // knn::select::DIST_TILE: 64 rows x 32 queries per block.
  const uint32_t row_tiles = (n_rows + 63) / 64;
  const char* grid_env = std::getenv("FRAGLINK_SIMT_DIST_GRID_X");
  const uint32_t grid_x = grid_env == nullptr ? row_tiles : arg_u32(grid_env);
  if (grid_x == 0) die(2, "FRAGLINK_SIMT_DIST_GRID_X must be at least 1");
  simt::launch(simt::extent{grid_x, (nq + 31) / 32, 1}, simt::extent{256, 1, 1}, run_dist, seed);
  for (size_t i = 0; i < matrix.size(); ++i) {
    if (i % ld < std::min(n_rows, grid_x * 64) && matrix[i] == unwritten) {
      die(1, "matrix entry " + std::to_string(i) + " not written");
    }
  }

  std::vector<uint32_t> ids(size_t(nq) * k, 0xDEADBEEFu);
  std::vector<float> dists(size_t(nq) * k, NAN);
  auto run_select = [&] {
    select(matrix.data(), tiles_done.data(), n_rows, ld, nq, k, sort_slots, ids.data(), dists.data());
  };
  simt::launch(simt::extent{select_grid, 1, 1}, simt::extent{256, 1, 1}, run_select, seed + 1, sort_slots * 8);
  if (grid_x < row_tiles) {
    for (size_t i = 0; i < dists.size(); ++i) {
      if (dists[i] == dists[i]) die(1, "output " + std::to_string(i) + " written from an incomplete matrix");
    }
    return 0;
  }
  return write_results(dir, "ids.bin", ids, dists);
}

}  // namespace simt_select
