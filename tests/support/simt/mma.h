// fraglink tests — nvcuda::wmma for the SIMT emulator (simt.h). It shadows CUDA's
// <mma.h> when tests/support/simt comes first on the include path.
//
// A fragment holds num_elements = rows * cols / 32 elements per lane: lane l holds
// elements l * num_elements .. + num_elements - 1 of the row-major (rows x cols)
// matrix. Real hardware distributes them differently (and replicates some), but the
// fragments only ever touch `x[i]` element-wise, which does not depend on the
// distribution. load/store/mma are warp collectives, as on a GPU.
//
// Arithmetic of mma_sync, per element of D = A B + C, k in order, each step rounded
// to nearest in the accumulator type:
//   __half x __half -> float: products are exact in float;
//   tf32 (float storage) -> float: the inputs' low 13 mantissa bits are ignored, as
//     the tensor cores do (a value not passed through __float_to_tf32 is truncated),
//     and products of two 11-bit significands are exact;
//   signed / unsigned char -> int: exact.
#pragma once

#include "simt.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}  // namespace precision

template <typename T>
struct storage {
  typedef T type;
};
template <>
struct storage<precision::tf32> {
  typedef float type;
};

template <typename Use, int M, int N, int K>
struct shape;
template <int M, int N, int K>
struct shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  typedef typename storage<T>::type element_type;
  typedef shape<Use, M, N, K> dims;
  static constexpr int num_elements = dims::rows * dims::cols / 32;
  static_assert(dims::rows * dims::cols % 32 == 0, "whole elements per lane");
  element_type x[num_elements];
};

inline float __float_to_tf32(float v) {
  uint32_t b = __float_as_uint(v);
  if ((b & 0x7f800000u) != 0x7f800000u) {
    b = (b + 0x1000u) & 0xffffe000u;  // nearest, ties away from zero (cvt.rna)
  }
  return __uint_as_float(b);
}

namespace detail {

// Matrix element (r, c) of a fragment's canonical row-major order: which lane, which x.
template <typename F>
inline int owner(int r, int c) {
  return (r * F::dims::cols + c) / F::num_elements;
}
template <typename F>
inline int slot(int r, int c) {
  return (r * F::dims::cols + c) % F::num_elements;
}
inline unsigned lane() { return simt::lane_of(simt::self()); }

// Memory offset of element (r, c) for a layout tag / enum.
inline size_t offset(row_major, int r, int c, unsigned ldm) { return static_cast<size_t>(r) * ldm + c; }
inline size_t offset(col_major, int r, int c, unsigned ldm) { return static_cast<size_t>(c) * ldm + r; }
inline size_t offset(layout_t l, int r, int c, unsigned ldm) {
  return l == mem_row_major ? offset(row_major{}, r, c, ldm) : offset(col_major{}, r, c, ldm);
}

inline float product(__half a, __half b) { return __half2float(a) * __half2float(b); }
inline float product(float a, float b) {
  return __uint_as_float(__float_as_uint(a) & 0xffffe000u) * __uint_as_float(__float_as_uint(b) & 0xffffe000u);
}
inline int product(signed char a, signed char b) { return static_cast<int>(a) * static_cast<int>(b); }
inline int product(unsigned char a, unsigned char b) { return static_cast<int>(a) * static_cast<int>(b); }

// wmma's rules for memory operands: a 256-bit aligned pointer, and a leading
// dimension of whole 16-byte units.
template <typename P>
inline void check_operand(const P* p, unsigned ldm, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(P)) % 16 != 0) {
    simt::fail(std::string(what) + ": pointer not 32-byte aligned or ldm " + std::to_string(ldm) +
               " not a multiple of 16 bytes");
  }
}

template <typename F, typename L, typename P>
inline void load(F& f, const P* p, unsigned ldm, L layout) {
  check_operand(p, ldm, "wmma::load_matrix_sync");
  simt::warp_exchange(0, 0);  // converged, as wmma requires
  const unsigned l = lane();
  for (int i = 0; i < F::num_elements; ++i) {
    const int e = static_cast<int>(l) * F::num_elements + i;
    const int r = e / F::dims::cols;
    const int c = e % F::dims::cols;
    f.x[i] = static_cast<typename F::element_type>(p[offset(layout, r, c, ldm)]);
  }
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const P* p, unsigned ldm) {
  detail::load(f, p, ldm, Layout{});
}

template <int M, int N, int K, typename T, typename P>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const P* p, unsigned ldm, layout_t layout) {
  detail::load(f, p, ldm, layout);
}

template <int M, int N, int K, typename T, typename P>
inline void store_matrix_sync(P* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  typedef fragment<accumulator, M, N, K, T> F;
  detail::check_operand(p, ldm, "wmma::store_matrix_sync");
  simt::warp_exchange(0, 0);
  const unsigned l = detail::lane();
  for (int i = 0; i < F::num_elements; ++i) {
    const int e = static_cast<int>(l) * F::num_elements + i;
    p[detail::offset(layout, e / F::dims::cols, e % F::dims::cols, ldm)] = f.x[i];
  }
}

template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& v) {
  for (int i = 0; i < fragment<Use, M, N, K, T, Layout>::num_elements; ++i) {
    f.x[i] = static_cast<typename fragment<Use, M, N, K, T, Layout>::element_type>(v);
  }
}

// D = A B + C. Every lane publishes its fragments, computes its own elements of D
// from everyone's, and writes them only after the whole warp has read (D may be C).
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  typedef fragment<matrix_a, M, N, K, TA, LA> FA;
  typedef fragment<matrix_b, M, N, K, TB, LB> FB;
  typedef fragment<accumulator, M, N, K, TC> FC;
  const unsigned g = simt::warp_exchange(0, 0, &a, &b, &c);
  const simt::warp_slots& w = simt::warp_of(simt::self());
  const unsigned l = detail::lane();
  auto lane_frag = [&](int lane, int which) { return w.ptr[g][lane][which]; };
  TC out[FC::num_elements];
  for (int i = 0; i < FC::num_elements; ++i) {
    const int e = static_cast<int>(l) * FC::num_elements + i;
    const int r = e / N;
    const int col = e % N;
    TC acc = static_cast<const FC*>(lane_frag(detail::owner<FC>(r, col), 2))->x[detail::slot<FC>(r, col)];
    for (int kk = 0; kk < K; ++kk) {
      const auto av = static_cast<const FA*>(lane_frag(detail::owner<FA>(r, kk), 0))->x[detail::slot<FA>(r, kk)];
      const auto bv = static_cast<const FB*>(lane_frag(detail::owner<FB>(kk, col), 1))->x[detail::slot<FB>(kk, col)];
      acc = acc + detail::product(av, bv);
    }
    out[i] = acc;
  }
  simt::warp_exchange(0, 0);  // everyone has read A, B and C
  for (int i = 0; i < FC::num_elements; ++i) d.x[i] = out[i];
}

}  // namespace wmma
}  // namespace nvcuda
