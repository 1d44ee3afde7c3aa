// fraglink tests — runs one IVF-Flat list scan kernel (fragments/ivf_scan.cuh) of a
// program under the SIMT emulator (simt.h) on inputs written by
// tests/kernels_emulated.rs.
//
// Usage: PROGRAM KERNEL STORED_ROWS N_ROWS DIM NLIST NPROBE NQ K GRID_X GRID_Y SEED DIR
// DIR holds data.bin (the interleaved lists back to back, STORED_ROWS x DIM
// elements), ids.bin (i64 per stored row), offsets.bin (u64 per list), sizes.bin
// (u32 per list), probes.bin (u32, NQ x NPROBE), queries.bin, and filter.bin (u32
// words over the N_ROWS dataset ids; absent: no filter). Writes DIR/ids_out.bin (i64)
// and DIR/dists.bin (f32), NQ x GRID_Y x K (GRID_Y: the probe splits).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "driver_io.h"

namespace simt_ivf {

using namespace simt_io;

template <typename T>
using ivf_fn = void (*)(const T*, const int64_t*, const uint64_t*, const uint32_t*, const uint32_t*, uint32_t,
                        const T*, const uint32_t*, uint32_t, uint32_t, uint32_t, int64_t*, float*);

template <typename T>
int ivf_main(int argc, char** argv, const entry<ivf_fn<T>>* kernels, size_t n_kernels) {
  if (argc != 13) die(2, "usage: KERNEL STORED_ROWS N_ROWS DIM NLIST NPROBE NQ K GRID_X GRID_Y SEED DIR");
  const entry<ivf_fn<T>>& kernel = find(kernels, n_kernels, argv[1]);
  const uint32_t stored = arg_u32(argv[2]), n_rows = arg_u32(argv[3]), dim = arg_u32(argv[4]);
  const uint32_t nlist = arg_u32(argv[5]), nprobe = arg_u32(argv[6]), nq = arg_u32(argv[7]), k = arg_u32(argv[8]);
  const uint32_t grid = arg_u32(argv[9]), splits = arg_u32(argv[10]), seed = arg_u32(argv[11]);
  const std::string dir = argv[12];
  const std::vector<T> data = read_file<T>(dir + "/data.bin", size_t(stored) * dim);
  const std::vector<int64_t> ids = read_file<int64_t>(dir + "/ids.bin", stored);
  const std::vector<uint64_t> offsets = read_file<uint64_t>(dir + "/offsets.bin", nlist);
  const std::vector<uint32_t> sizes = read_file<uint32_t>(dir + "/sizes.bin", nlist);
  const std::vector<uint32_t> probes = read_file<uint32_t>(dir + "/probes.bin", size_t(nq) * nprobe);
  const std::vector<T> queries = read_file<T>(dir + "/queries.bin", size_t(nq) * dim);
  const std::vector<uint32_t> bits = read_file<uint32_t>(dir + "/filter.bin", (n_rows + 31) / 32, true);
  std::vector<int64_t> out_ids(size_t(nq) * splits * k, 0);
  std::vector<float> dists(size_t(nq) * splits * k, NAN);
  auto run = [&] {
    kernel.fn(data.data(), ids.data(), offsets.data(), sizes.data(), probes.data(), nprobe, queries.data(),
              bits.empty() ? nullptr : bits.data(), dim, nq, k, out_ids.data(), dists.data());
  };
  simt::launch(simt::extent{grid, splits, 1}, simt::extent{128, 1, 1}, run, seed);
  return write_results(dir, "ids_out.bin", out_ids, dists);
}

}  // namespace simt_ivf
