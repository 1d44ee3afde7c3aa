// fraglink tests — the union bound's select (fragments/knn_tile.cuh: compact's pass
// -1, kth_smallest over key_cert) while other warps lower the certificates it reads,
// as other blocks do on a GPU. The emulator runs blocks one after another, so
// tests/knn_emulated.rs never changes a certificate during a select; here warp 0
// selects and warps 1.. lower certificates (atomicMin) between the select's rounds
// (fibers switch at warp collectives).
//
//   union_select SEED N_CHUNKS R LOWER
//
// Prints `calls C unsound U none B inexact I`: U selects whose result (rounded up to
// its 2^8-key bucket, as compact uses it) has fewer than R sampled certificates at or
// below it when the select returns (certificates only fall, so this stays so);
// B selects that found too few keys under the bytes found (no bound); I selects without lowering (LOWER 0) that differ from
// the exact R-th smallest sampled certificate's top three bytes.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace simt_union {

inline uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

inline int union_main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s SEED N_CHUNKS R LOWER\n", argv[0]);
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const uint32_t n = static_cast<uint32_t>(std::strtoul(argv[2], nullptr, 10));
  const uint32_t r = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
  const bool lower = std::atoi(argv[4]) != 0;
  using namespace fraglink::knn;
  const uint32_t sample = n < UNION_SAMPLE ? n : UNION_SAMPLE;
  if (n == 0 || r == 0 || r > sample) {
    std::fprintf(stderr, "need 1 <= R <= min(N_CHUNKS, %u)\n", UNION_SAMPLE);
    return 2;
  }
  // A quarter of the chunks without a certificate yet (all ones); keys in a narrow
  // range, so that many share their top bytes and the select's later rounds count.
  std::vector<uint32_t> certs(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t h = mix(seed * 1000003u + i);
    certs[i] = h % 4 == 0 ? 0xFFFFFFFFu : 0xC0000000u + (h >> 12);
  }
  union_args u = {certs.data(), 0, n > UNION_SAMPLE ? n : UNION_SAMPLE, sample, 1, r};
  const buffer none = {nullptr, nullptr, nullptr, nullptr, nullptr};
  auto sampled = [&](uint32_t i) { return certs[(i * u.spread) >> 8]; };
  uint32_t calls = 0, unsound = 0, no_bound = 0, inexact = 0;
  auto kernel = [&] {
    __shared__ uint32_t hist[256];
    const uint32_t warp = threadIdx.x / 32u;
    const uint32_t lane = threadIdx.x % 32u;
    if (warp == 0) {
      for (int c = 0; c < 24; ++c) {
        // Without lowering: the exact answer, from the certificates as they are.
        std::vector<uint32_t> before;
        if (lane == 0 && !lower) {
          for (uint32_t i = 0; i < sample; ++i) before.push_back(sampled(i));
        }
        const uint64_t got = kth_smallest(none, u, sample, r, key_cert, 3, hist, lane);
        if (lane == 0) {
          ++calls;
          if (got == ~0ull) {
            ++no_bound;
          } else {
            const uint32_t bound = static_cast<uint32_t>(got >> 32) | 0xFFu;
            uint32_t under = 0;
            for (uint32_t i = 0; i < sample; ++i) under += sampled(i) <= bound ? 1u : 0u;
            if (under < r) ++unsound;
          }
          if (!lower) {
            std::sort(before.begin(), before.end());
            const uint64_t want = static_cast<uint64_t>(before[r - 1] & 0xFFFFFF00u) << 32;
            // Fewer than r certificates: the r-th is all ones, which compact's
            // rounding turns into no bound.
            if (got != want) ++inexact;
          }
        }
        __syncwarp();
      }
    } else if (lower) {
      for (uint32_t c = 0; c < 64; ++c) {
        const uint32_t h = mix(seed ^ (uint64_t(threadIdx.x) << 32) ^ (uint64_t(c) << 48));
        const uint32_t i = h % n;
        // Down by up to a quarter of the key range's width: often across buckets.
        const uint32_t cur = certs[i] == 0xFFFFFFFFu ? 0xC0100000u : certs[i];
        atomicMin(&certs[i], cur - (h >> 12) % 0x40000u);
        __syncwarp();
      }
    }
  };
  simt::launch(simt::extent{1, 1, 1}, simt::extent{lower ? 128u : 32u, 1, 1}, kernel, seed);
  std::printf("calls %u unsound %u none %u inexact %u\n", calls, unsound, no_bound, inexact);
  return 0;
}

}  // namespace simt_union
