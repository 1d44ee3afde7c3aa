// fraglink tests — a SIMT emulator that runs fraglink's CUDA kernels on the host.
//
// Why: a GPU is lent to few sessions and for minutes, so a kernel's LOGIC (indexing,
// staging, barriers, warp collectives, the fused select, buffer bounds) is checked here
// first, on every CI run, against the exact CPU path. What it cannot show: speed, the
// hardware's memory model beyond barriers, and the tensor cores' own rounding (the
// emulated MMA rounds to nearest in k order; the margin's other cases are
// tests/knn_margin.rs's job). A kernel that passes here still has to pass on a GPU
// (the `#[ignore]`d GPU tests).
//
// How: every CUDA thread of a block is a fiber (ucontext) on one OS thread; blocks
// run one after another. A fiber runs until it reaches a barrier (__syncthreads, a
// warp collective) or returns. A barrier all of whose live participants have
// arrived is released; when no fiber can run and none can be, the kernel is deadlocked
// (a divergent barrier) and the emulator stops with a description. The next fiber
// to run is drawn at random (seeded) and a barrier is released as soon as its last
// participant arrives, so a missing barrier (a thread reading shared memory another
// thread writes in the same phase) shows up as a wrong or varying result. `__shared__` variables become function statics: one copy per
// block, as all fibers of a block share them (blocks never overlap in time).
//
// Compile a fragment's rendered source for the host with, in this order:
//   -include tests/support/simt/simt.h -I tests/support/simt (its mma.h shadows
//   CUDA's) -I fragments -I <CUDA runtime and CCCL include dirs> -I fragments/host
// (tests/support/host_cxx.rs does).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#error "tests/support/simt/simt.h emulates CUDA on the host; it is not for CUDA compilers"
#endif

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

// __half, and through it crt/host_defines.h: the execution-space annotations expand
// to nothing. Then __shared__ becomes a static (see above).
#include <cuda_fp16.h>
#undef __shared__
#define __shared__ static
// CUDA 13's own crt/host_defines.h (found before fragments/host) leaves this
// undefined for host compilers.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// Fragments may enable host-only paths with this (e.g. code that is sm_80+ on a GPU).
#define FRAGLINK_HOST_SIMT 1

namespace simt {

struct extent {
  unsigned x, y, z;
};

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "simt: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(70);
}

enum class state { runnable, at_block_barrier, at_warp_barrier, done };

// A cp.async of `bytes` from `src` (null: zero-fill) into `dst`.
struct pending_copy {
  void* dst;
  const void* src;
  unsigned bytes;
};

struct fiber {
  ucontext_t ctx;
  unsigned tid = 0;  // linear thread index in the block
  state st = state::runnable;
  // cp.async: issued since the last commit, and committed groups not yet waited for.
  std::vector<pending_copy> open_copies;
  std::deque<std::vector<pending_copy>> copy_groups;
};

// Per-warp exchange slots, double-buffered by barrier generation: a lane reads
// generation g's slots after g's release, and no lane can write them again before
// every lane has passed generation g + 1.
struct warp_slots {
  unsigned gen = 0;
  uint64_t value[2][32];
  int pred[2][32];
  const void* ptr[2][32][3];
};

struct machine {
  extent grid{1, 1, 1};
  extent block{1, 1, 1};
  extent block_idx{0, 0, 0};
  std::vector<fiber> fibers;
  std::vector<warp_slots> warps;
  std::vector<char> stacks;
  ucontext_t scheduler;
  fiber* current = nullptr;
  unsigned block_gen = 0;
  int or_acc[2] = {0, 0};
  int or_result[2] = {0, 0};
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  uint64_t rng = 1;
  // The launch's dynamic shared memory (`extern __shared__`), in 128-byte units
  // so it is aligned as on a GPU; shared by the blocks like the statics.
  struct alignas(128) unit {
    unsigned char b[128];
  };
  std::vector<unit> dynamic_shared;
  uint32_t dynamic_shared_bytes = 0;
};

inline machine& m() {
  static machine instance;
  return instance;
}

constexpr size_t kStackBytes = 256 * 1024;

inline uint64_t next_random() {
  uint64_t& s = m().rng;  // xorshift64*
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 0x2545F4914F6CDD1DULL;
}

inline fiber& self() {
  if (m().current == nullptr) fail("a device function was called outside a kernel launch");
  return *m().current;
}
inline unsigned lane_of(const fiber& f) { return f.tid % 32u; }
inline warp_slots& warp_of(const fiber& f) { return m().warps[f.tid / 32u]; }

inline void yield_as(state st) {
  fiber& f = self();
  f.st = st;
  if (swapcontext(&f.ctx, &m().scheduler) != 0) fail("swapcontext failed");
}

inline void entry() {
  m().body(m().body_arg);
  fiber& f = self();
  f.st = state::done;
  // uc_link returns to the scheduler.
}

inline std::string describe_states() {
  std::string s;
  const char* names[] = {"runnable", "at __syncthreads", "at a warp collective", "done"};
  for (const fiber& f : m().fibers) {
    s += "\n  thread " + std::to_string(f.tid) + ": " + names[static_cast<int>(f.st)];
  }
  return s;
}

// Releases one complete barrier; false when none is complete.
inline bool release_one() {
  machine& mm = m();
  size_t alive = 0;
  size_t at_block = 0;
  for (const fiber& f : mm.fibers) {
    if (f.st != state::done) ++alive;
    if (f.st == state::at_block_barrier) ++at_block;
  }
  if (at_block > 0 && at_block == alive) {
    const unsigned g = mm.block_gen & 1u;
    mm.or_result[g] = mm.or_acc[g];
    mm.or_acc[g] = 0;
    ++mm.block_gen;
    for (fiber& f : mm.fibers) {
      if (f.st == state::at_block_barrier) f.st = state::runnable;
    }
    return true;
  }
  for (size_t w = 0; w < mm.warps.size(); ++w) {
    size_t live = 0;
    size_t waiting = 0;
    for (size_t l = 0; l < 32; ++l) {
      const fiber& f = mm.fibers[w * 32 + l];
      if (f.st != state::done) ++live;
      if (f.st == state::at_warp_barrier) ++waiting;
    }
    if (waiting > 0 && waiting == live) {
      ++mm.warps[w].gen;
      for (size_t l = 0; l < 32; ++l) {
        fiber& f = mm.fibers[w * 32 + l];
        if (f.st == state::at_warp_barrier) f.st = state::runnable;
      }
      return true;
    }
  }
  return false;
}

inline void run_block(size_t threads) {
  machine& mm = m();
  mm.fibers.assign(threads, fiber{});
  mm.warps.assign(threads / 32, warp_slots{});
  mm.block_gen = 0;
  mm.or_acc[0] = mm.or_acc[1] = 0;
  for (size_t t = 0; t < threads; ++t) {
    fiber& f = mm.fibers[t];
    f.tid = static_cast<unsigned>(t);
    if (getcontext(&f.ctx) != 0) fail("getcontext failed");
    f.ctx.uc_stack.ss_sp = mm.stacks.data() + t * kStackBytes;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &mm.scheduler;
    makecontext(&f.ctx, entry, 0);
  }
  std::vector<size_t> runnable;
  runnable.reserve(threads);
  for (;;) {
    // One step: a random runnable fiber runs until it blocks or ends, then every
    // barrier it completed is released at once. So a warp whose lanes have all
    // arrived goes on while other warps may not have reached their stores yet, and
    // a read that lacks its __syncthreads sees stale shared memory.
    runnable.clear();
    for (size_t i = 0; i < threads; ++i) {
      if (mm.fibers[i].st == state::runnable) runnable.push_back(i);
    }
    if (!runnable.empty()) {
      fiber& f = mm.fibers[runnable[static_cast<size_t>(next_random() % runnable.size())]];
      mm.current = &f;
      if (swapcontext(&mm.scheduler, &f.ctx) != 0) fail("swapcontext failed");
      mm.current = nullptr;
      while (release_one()) {
      }
      continue;
    }
    bool all_done = true;
    for (const fiber& f : mm.fibers) all_done = all_done && f.st == state::done;
    if (all_done) return;
    if (!release_one()) fail("deadlock: no barrier can complete (divergent barrier?)" + describe_states());
  }
}

// Runs `body(arg)` as a kernel over `grid` x `block` (block: a multiple of 32
// threads, at most 1024), blocks in order, fibers in a `seed`ed random order, with
// `dynamic_shared_bytes` of dynamic shared memory (filled with a pattern: a read
// before a write sees garbage, as on a GPU).
inline void launch(extent grid, extent block, void (*body)(void*), void* arg, uint64_t seed,
                   uint32_t dynamic_shared_bytes = 0) {
  machine& mm = m();
  mm.dynamic_shared.assign((dynamic_shared_bytes + 127) / 128, machine::unit{});
  for (machine::unit& u : mm.dynamic_shared) std::memset(u.b, 0xA5, sizeof u.b);
  mm.dynamic_shared_bytes = dynamic_shared_bytes;
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads % 32 != 0 || threads > 1024) {
    fail("block of " + std::to_string(threads) + " threads: the emulator takes whole warps, at most 1024");
  }
  if (mm.stacks.size() < threads * kStackBytes) mm.stacks.resize(threads * kStackBytes);
  mm.grid = grid;
  mm.block = block;
  mm.body = body;
  mm.body_arg = arg;
  mm.rng = seed * 2 + 1;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        mm.block_idx = extent{x, y, z};
        run_block(threads);
      }
    }
  }
}

template <typename F>
void launch(extent grid, extent block, F& kernel, uint64_t seed, uint32_t dynamic_shared_bytes = 0) {
  launch(grid, block, [](void* p) { (*static_cast<F*>(p))(); }, &kernel, seed, dynamic_shared_bytes);
}

// cp.async for fragments built with FRAGLINK_HOST_SIMT. A copy lands at a point
// drawn from the seed: at once (at issue), or only when a wait completes its group
// (copy_wait(n): every group but the newest n). So shared memory read before its
// wait, another thread's copies read before the barrier that follows their wait,
// and a copy into a stage another warp still reads all give stale or clobbered
// data, as on a GPU. Misaligned operands fail.
inline void perform(const pending_copy& c) {
  if (c.src != nullptr) {
    std::memcpy(c.dst, c.src, c.bytes);
  } else {
    std::memset(c.dst, 0, c.bytes);
  }
}
inline void copy_async(void* dst, const void* src, unsigned bytes, bool valid) {
  fiber& f = self();
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    fail("cp.async of " + std::to_string(bytes) + " bytes with a misaligned source or destination");
  }
  const pending_copy c{dst, valid ? src : nullptr, bytes};
  if (next_random() % 2 == 0) {
    perform(c);
  } else {
    f.open_copies.push_back(c);
  }
}
inline void copy_commit() {
  fiber& f = self();
  f.copy_groups.push_back(std::move(f.open_copies));
  f.open_copies.clear();
}
inline void copy_wait(unsigned pending) {
  fiber& f = self();
  while (f.copy_groups.size() > pending) {
    for (const pending_copy& c : f.copy_groups.front()) perform(c);
    f.copy_groups.pop_front();
  }
}

// prefetch.L2 for fragments built with FRAGLINK_HOST_SIMT: a hint, so nothing is
// read, but every byte named must be one the driver's `prefetchable` predicate
// allows for the running block (the rows that block stages, their norms): a
// prefetch elsewhere fails, as would the row arithmetic that made it. No
// predicate: every prefetch fails. `prefetched` counts the bytes named, so a
// driver can check that prefetching happened at all.
inline std::function<bool(extent block, uintptr_t at, uint64_t bytes)>& prefetchable() {
  static std::function<bool(extent, uintptr_t, uint64_t)> allows;
  return allows;
}
inline uint64_t& prefetched() {
  static uint64_t bytes = 0;
  return bytes;
}
// Whether [at, at + bytes) lies in the `len` bytes from `begin`.
inline bool within(uintptr_t at, uint64_t bytes, const void* begin, uint64_t len) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(begin);
  return begin != nullptr && at >= b && bytes <= len && at - b <= len - bytes;
}
inline void prefetch(const void* p, uint64_t bytes) {
  self();  // only inside a launch
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (bytes == 0 || !prefetchable() || !prefetchable()(m().block_idx, at, bytes)) {
    fail("prefetch of " + std::to_string(bytes) + " bytes outside the rows of block (" +
         std::to_string(m().block_idx.x) + ", " + std::to_string(m().block_idx.y) + ")");
  }
  prefetched() += bytes;
}

// `extern __shared__` and %dynamic_smem_size, for fragments built with FRAGLINK_HOST_SIMT.
inline unsigned char* dynamic_shared() {
  self();  // only inside a launch
  return m().dynamic_shared.empty() ? nullptr : m().dynamic_shared.front().b;
}
inline uint32_t dynamic_shared_bytes() {
  self();
  return m().dynamic_shared_bytes;
}

inline extent thread_idx() {
  const machine& mm = m();
  const unsigned t = self().tid;
  return extent{t % mm.block.x, (t / mm.block.x) % mm.block.y, t / (mm.block.x * mm.block.y)};
}

inline void require_full(unsigned mask, const char* what) {
  if (mask != 0xffffffffu) fail(std::string(what) + " with a partial mask is not emulated");
}

template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "at most 8 bytes per lane");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

// A warp collective: deposit, wait for the whole (live) warp, then read slot
// generation `g` (returned).
inline unsigned warp_exchange(uint64_t value, int pred, const void* p0 = nullptr, const void* p1 = nullptr,
                              const void* p2 = nullptr) {
  fiber& f = self();
  warp_slots& w = warp_of(f);
  const unsigned g = w.gen & 1u;
  const unsigned lane = lane_of(f);
  w.value[g][lane] = value;
  w.pred[g][lane] = pred;
  w.ptr[g][lane][0] = p0;
  w.ptr[g][lane][1] = p1;
  w.ptr[g][lane][2] = p2;
  yield_as(state::at_warp_barrier);
  return g;
}

inline bool lane_done(unsigned lane) {
  const fiber& f = self();
  return m().fibers[(f.tid / 32u) * 32u + lane].st == state::done;
}

}  // namespace simt

// ----- CUDA's built-in variables and intrinsics, as the fragments use them ---------
#define threadIdx (::simt::thread_idx())
#define blockIdx (::simt::m().block_idx)
#define blockDim (::simt::m().block)
#define gridDim (::simt::m().grid)

inline void __syncthreads() { simt::yield_as(simt::state::at_block_barrier); }

inline int __syncthreads_or(int pred) {
  simt::machine& mm = simt::m();
  const unsigned g = mm.block_gen & 1u;
  if (pred) mm.or_acc[g] = 1;
  simt::yield_as(simt::state::at_block_barrier);
  return mm.or_result[g];
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  simt::require_full(mask, "__syncwarp");
  simt::warp_exchange(0, 0);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  simt::require_full(mask, "__shfl_xor_sync");
  if (width != 32) simt::fail("__shfl_xor_sync with a width below 32 is not emulated");
  const unsigned g = simt::warp_exchange(simt::to_bits(v), 0);
  const unsigned src = (simt::lane_of(simt::self()) ^ static_cast<unsigned>(lane_mask)) & 31u;
  if (simt::lane_done(src)) simt::fail("__shfl_xor_sync reads an exited lane");
  return simt::from_bits<T>(simt::warp_of(simt::self()).value[g][src]);
}

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  simt::require_full(mask, "__shfl_sync");
  if (width != 32) simt::fail("__shfl_sync with a width below 32 is not emulated");
  const unsigned g = simt::warp_exchange(simt::to_bits(v), 0);
  const unsigned src = static_cast<unsigned>(src_lane) & 31u;
  if (simt::lane_done(src)) simt::fail("__shfl_sync reads an exited lane");
  return simt::from_bits<T>(simt::warp_of(simt::self()).value[g][src]);
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  simt::require_full(mask, "__ballot_sync");
  const unsigned g = simt::warp_exchange(0, pred != 0);
  const simt::warp_slots& w = simt::warp_of(simt::self());
  unsigned out = 0;
  for (unsigned l = 0; l < 32; ++l) {
    if (!simt::lane_done(l) && w.pred[g][l]) out |= 1u << l;
  }
  return out;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }

// Fibers switch only at barriers, so a plain read-modify-write is atomic here.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}

inline unsigned atomicMin(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = v < old ? v : old;
  return old;
}

inline float __int_as_float(int v) { return simt::from_bits<float>(static_cast<uint32_t>(v)); }
inline float __uint_as_float(unsigned v) { return simt::from_bits<float>(v); }
inline unsigned __float_as_uint(float v) { return static_cast<unsigned>(simt::to_bits(v)); }
inline int __float_as_int(float v) { return static_cast<int>(static_cast<uint32_t>(simt::to_bits(v))); }
