//! The few vector operations the fused scan ([`super::fused`]) needs, for
//! AVX-512 (16 lanes) and AVX2 + FMA (8 lanes), so that one generic kernel
//! serves both.
//!
//! Every method is `#[inline(always)]` and `unsafe`: it may only run on a CPU
//! with the type's features, and only inside a function compiled with them
//! (`#[target_feature(enable = ...)]`), where the intrinsics inline into it.
//! The callers check the features at run time first ([`super::fused::Kernel`]).
//! Every arithmetic operation is one IEEE single-precision operation, rounded
//! once, exactly as the scalar `f32` operation of the same name: the vector
//! bounds equal the scalar ones bit for bit.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One SIMD instruction set.
pub(super) trait Simd: Copy {
    /// f32 lanes per vector.
    const LANES: usize;
    type V: Copy;
    unsafe fn zero() -> Self::V;
    /// Loads `LANES` values from `p` (no alignment needed).
    unsafe fn load(p: *const f32) -> Self::V;
    /// Every lane `*p`.
    unsafe fn splat_load(p: *const f32) -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    /// `a · b + c`, rounded once.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Bit `i` set where `a[i] < b[i]` (false when either is NaN).
    unsafe fn lt_mask(a: Self::V, b: Self::V) -> u32;
    /// Stores the lanes to `out[..LANES]`.
    unsafe fn store(v: Self::V, out: *mut f32);
}

/// AVX-512F (16 lanes; 32 vector registers).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Simd for Avx512 {
    const LANES: usize = 16;
    type V = __m512;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn splat_load(p: *const f32) -> __m512 {
        _mm512_set1_ps(*p)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn lt_mask(a: __m512, b: __m512) -> u32 {
        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) as u32
    }
    #[inline(always)]
    unsafe fn store(v: __m512, out: *mut f32) {
        _mm512_storeu_ps(out, v)
    }
}

/// AVX2 with FMA (8 lanes; 16 vector registers).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Simd for Avx2 {
    const LANES: usize = 8;
    type V = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn splat_load(p: *const f32) -> __m256 {
        _mm256_broadcast_ss(&*p)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn lt_mask(a: __m256, b: __m256) -> u32 {
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) as u32
    }
    #[inline(always)]
    unsafe fn store(v: __m256, out: *mut f32) {
        _mm256_storeu_ps(out, v)
    }
}
