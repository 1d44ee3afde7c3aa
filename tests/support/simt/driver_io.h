// fraglink tests — file and argument helpers shared by the emulated kernels' drivers
// (knn_driver.h, scan_driver.h, ivf_driver.h). Exit codes: 1 a kernel broke its
// contract (message on stderr), 2 bad arguments or files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace simt_io {

// A kernel of a program, found by name; `capacity` is its top-k capacity.
template <typename F>
struct entry {
  const char* name;
  F fn;
  uint32_t capacity;
};

[[noreturn]] inline void die(int code, const std::string& what) {
  std::fprintf(stderr, "driver: %s\n", what.c_str());
  std::exit(code);
}

template <typename E>
std::vector<E> read_file(const std::string& path, size_t count, bool optional = false) {
  std::vector<E> v;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (optional) return v;
    die(2, "cannot open " + path);
  }
  v.resize(count);
  const size_t got = count == 0 ? 0 : std::fread(v.data(), sizeof(E), count, f);
  std::fclose(f);
  if (got != count) die(2, path + ": expected " + std::to_string(count) + " elements");
  return v;
}

template <typename E>
void write_file(const std::string& path, const std::vector<E>& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(v.data(), sizeof(E), v.size(), f) != v.size()) die(2, "cannot write " + path);
  std::fclose(f);
}

template <typename F>
const entry<F>& find(const entry<F>* table, size_t n, const char* name) {
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(table[i].name, name) == 0) return table[i];
  }
  die(2, std::string("no kernel named ") + name + " in this program");
}

// Ends the run (exit 1) when a kernel left an output distance unwritten: the
// drivers pre-fill them with NaN, which no written result holds.
inline void require_written(const std::vector<float>& dists) {
  for (size_t i = 0; i < dists.size(); ++i) {
    if (dists[i] != dists[i]) die(1, "output " + std::to_string(i) + " not written (NaN left in place)");
  }
}

// The end of a driver: every output distance written (require_written), then the
// ids and distances into DIR/<ids_name> and DIR/dists.bin. Returns exit code 0.
template <typename Id>
int write_results(const std::string& dir, const char* ids_name, const std::vector<Id>& ids,
                  const std::vector<float>& dists) {
  require_written(dists);
  write_file(dir + "/" + ids_name, ids);
  write_file(dir + "/dists.bin", dists);
  return 0;
}

inline uint32_t arg_u32(const char* s) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(s, &end, 10);
  if (end == s || *end != 0 || v > 0xFFFFFFFFul) die(2, std::string("not a u32: ") + s);
  return static_cast<uint32_t>(v);
}

}  // namespace simt_io
