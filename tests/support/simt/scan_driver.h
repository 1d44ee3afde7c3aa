// fraglink tests — runs one brute-force scan kernel (fragments/scan.cuh) of a program
// under the SIMT emulator (simt.h) on inputs written by tests/kernels_emulated.rs.
//
// Usage: PROGRAM KERNEL N_ROWS DIM NQ K GRID_X SPLITS SEED DIR
// DIR holds dataset.bin and queries.bin (raw elements, row-major) and filter.bin (u32
// words; absent: no filter). The grid is GRID_X x SPLITS (row splits). Writes
// DIR/ids.bin (Idx) and DIR/dists.bin (f32), NQ x SPLITS x K.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "driver_io.h"

namespace simt_scan {

using namespace simt_io;

template <typename T, typename Idx>
using scan_fn = void (*)(const T*, const T*, const uint32_t*, uint64_t, uint32_t, uint32_t, uint32_t, Idx*, float*);

template <typename T, typename Idx>
int scan_main(int argc, char** argv, const entry<scan_fn<T, Idx>>* kernels, size_t n_kernels) {
  if (argc != 10) die(2, "usage: KERNEL N_ROWS DIM NQ K GRID_X SPLITS SEED DIR");
  const entry<scan_fn<T, Idx>>& kernel = find(kernels, n_kernels, argv[1]);
  const uint32_t n_rows = arg_u32(argv[2]), dim = arg_u32(argv[3]), nq = arg_u32(argv[4]), k = arg_u32(argv[5]);
  const uint32_t grid = arg_u32(argv[6]), splits = arg_u32(argv[7]), seed = arg_u32(argv[8]);
  const std::string dir = argv[9];
  const std::vector<T> dataset = read_file<T>(dir + "/dataset.bin", size_t(n_rows) * dim);
  const std::vector<T> queries = read_file<T>(dir + "/queries.bin", size_t(nq) * dim);
  const std::vector<uint32_t> bits = read_file<uint32_t>(dir + "/filter.bin", (n_rows + 31) / 32, true);
  std::vector<Idx> ids(size_t(nq) * splits * k, Idx(0));
  std::vector<float> dists(size_t(nq) * splits * k, NAN);
  auto run = [&] {
    kernel.fn(dataset.data(), queries.data(), bits.empty() ? nullptr : bits.data(), n_rows, dim, nq, k, ids.data(),
              dists.data());
  };
  simt::launch(simt::extent{grid, splits, 1}, simt::extent{128, 1, 1}, run, seed);
  return write_results(dir, "ids.bin", ids, dists);
}

}  // namespace simt_scan
