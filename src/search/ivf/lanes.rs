//! The 32-lane folds of the CPU scan: one lane per row of a dimension-major
//! group (`gx[j · 32 + r]`), each lane folding its row in dimension order.
//!
//! Per lane and element these are exactly the reference fold's operations
//! ([`distance`](crate::search::distance)): l2 `d = q − x; a = fma(d, d, a)`,
//! dot `a = fma(q, x, a)` in f32 (one rounding each, as `f32::mul_add`), and
//! wrapping i32 `a += (q − x)²` / `a += q·x` for the integer types. The x86_64
//! AVX2 forms are written with intrinsics (the compiler does not vectorise
//! `mul_add` across the lanes by itself); the portable forms are the same
//! operations one lane at a time.

use super::layout::GROUP;

/// Which sum a fold accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fold {
    /// `Σ (q_j − x_j)²`
    L2,
    /// `Σ q_j x_j`
    Dot,
}

/// f32 lanes; `simd` (a constant after inlining) selects the AVX2 form, which
/// the caller must only ask for on a CPU with avx2 and fma.
#[inline(always)]
pub(crate) fn fold_f32(fold: Fold, q: &[f32], gx: &[f32], acc: &mut [f32; GROUP], simd: bool) {
    debug_assert!(gx.len() >= q.len() * GROUP);
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: the caller runs this only where avx2 and fma were detected;
        // gx holds q.len() columns of 32 lanes (asserted in debug builds, and
        // guaranteed by the scan's buffers).
        unsafe { avx2::fold_f32(fold, q, gx, acc) };
        return;
    }
    let _ = simd;
    *acc = [0.0; GROUP];
    for (&qj, col) in q.iter().zip(gx.chunks_exact(GROUP)) {
        for (a, &x) in acc.iter_mut().zip(col) {
            *a = match fold {
                Fold::L2 => {
                    let d = qj - x;
                    d.mul_add(d, *a)
                }
                Fold::Dot => qj.mul_add(x, *a),
            };
        }
    }
}

/// Two queries against one group at once: each lane's fold is exactly
/// [`fold_f32`]'s, but the AVX2 form keeps eight independent accumulator
/// chains (four per query) and loads each group column once for both, where
/// one query alone is bound by the fma latency of its four chains. Lists
/// probed by only a few queries (small `nprobe`) see each group folded by
/// pairs of queries rather than one at a time.
#[inline(always)]
pub(crate) fn fold_f32_pair(
    fold: Fold,
    q: [&[f32]; 2],
    gx: &[f32],
    acc: [&mut [f32; GROUP]; 2],
    simd: bool,
) {
    debug_assert!(q[0].len() == q[1].len() && gx.len() >= q[0].len() * GROUP);
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: as in fold_f32 (both queries have the group's dimension).
        unsafe { avx2::fold_f32_pair(fold, q, gx, acc) };
        return;
    }
    let [a0, a1] = acc;
    fold_f32(fold, q[0], gx, a0, simd);
    fold_f32(fold, q[1], gx, a1, simd);
}

/// Wrapping i32 lanes (see [`fold_f32`] for `simd`).
#[inline(always)]
pub(crate) fn fold_i32(fold: Fold, q: &[i32], gx: &[i32], acc: &mut [i32; GROUP], simd: bool) {
    debug_assert!(gx.len() >= q.len() * GROUP);
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: as in fold_f32.
        unsafe { avx2::fold_i32(fold, q, gx, acc) };
        return;
    }
    let _ = simd;
    *acc = [0; GROUP];
    for (&qj, col) in q.iter().zip(gx.chunks_exact(GROUP)) {
        for (a, &x) in acc.iter_mut().zip(col) {
            *a = match fold {
                Fold::L2 => {
                    let d = qj.wrapping_sub(x);
                    a.wrapping_add(d.wrapping_mul(d))
                }
                Fold::Dot => a.wrapping_add(qj.wrapping_mul(x)),
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Fold, GROUP};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fold_f32(fold: Fold, q: &[f32], gx: &[f32], acc: &mut [f32; GROUP]) {
        let mut a = [_mm256_setzero_ps(); 4];
        let p = gx.as_ptr();
        for (j, &qj) in q.iter().enumerate() {
            let qv = _mm256_set1_ps(qj);
            let col = p.add(j * GROUP);
            for (l, al) in a.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(col.add(8 * l));
                *al = match fold {
                    Fold::L2 => {
                        let d = _mm256_sub_ps(qv, x);
                        _mm256_fmadd_ps(d, d, *al)
                    }
                    Fold::Dot => _mm256_fmadd_ps(qv, x, *al),
                };
            }
        }
        for (l, al) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(8 * l), *al);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fold_f32_pair(
        fold: Fold,
        q: [&[f32]; 2],
        gx: &[f32],
        acc: [&mut [f32; GROUP]; 2],
    ) {
        let mut a = [[_mm256_setzero_ps(); 4]; 2];
        let p = gx.as_ptr();
        for (j, (&q0, &q1)) in q[0].iter().zip(q[1]).enumerate() {
            let qv = [_mm256_set1_ps(q0), _mm256_set1_ps(q1)];
            let col = p.add(j * GROUP);
            for l in 0..4 {
                let x = _mm256_loadu_ps(col.add(8 * l));
                for (aq, &qv) in a.iter_mut().zip(&qv) {
                    aq[l] = match fold {
                        Fold::L2 => {
                            let d = _mm256_sub_ps(qv, x);
                            _mm256_fmadd_ps(d, d, aq[l])
                        }
                        Fold::Dot => _mm256_fmadd_ps(qv, x, aq[l]),
                    };
                }
            }
        }
        for (aq, out) in a.iter().zip(acc) {
            for (l, al) in aq.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * l), *al);
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn fold_i32(fold: Fold, q: &[i32], gx: &[i32], acc: &mut [i32; GROUP]) {
        let mut a = [_mm256_setzero_si256(); 4];
        let p = gx.as_ptr();
        for (j, &qj) in q.iter().enumerate() {
            let qv = _mm256_set1_epi32(qj);
            let col = p.add(j * GROUP);
            for (l, al) in a.iter_mut().enumerate() {
                let x = _mm256_loadu_si256(col.add(8 * l).cast());
                let t = match fold {
                    Fold::L2 => {
                        let d = _mm256_sub_epi32(qv, x);
                        _mm256_mullo_epi32(d, d)
                    }
                    Fold::Dot => _mm256_mullo_epi32(qv, x),
                };
                *al = _mm256_add_epi32(*al, t);
            }
        }
        for (l, al) in a.iter().enumerate() {
            _mm256_storeu_si256(acc.as_mut_ptr().add(8 * l).cast(), *al);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_portable_lanes_agree_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        let simd = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        let dim = 37;
        let mut rng = crate::search::data::Rng::new(4);
        let q: Vec<f32> = (0..dim).map(|_| rng.normal() as f32).collect();
        let gx: Vec<f32> = (0..dim * GROUP)
            .map(|_| rng.normal() as f32 * 3.0)
            .collect();
        let qi: Vec<i32> = q.iter().map(|v| (v * 40.0) as i32).collect();
        let gi: Vec<i32> = gx.iter().map(|v| (v * 40.0) as i32).collect();
        for fold in [Fold::L2, Fold::Dot] {
            let (mut a, mut b) = ([0.0; GROUP], [0.0; GROUP]);
            fold_f32(fold, &q, &gx, &mut a, simd);
            fold_f32(fold, &q, &gx, &mut b, false);
            assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
            // The pair form: each query's lanes as folded alone.
            let q2: Vec<f32> = q.iter().map(|v| v * -0.7 + 0.3).collect();
            let mut c = [0.0; GROUP];
            fold_f32(fold, &q2, &gx, &mut c, false);
            for s in [simd, false] {
                let (mut p0, mut p1) = ([0.0; GROUP], [0.0; GROUP]);
                fold_f32_pair(fold, [&q, &q2], &gx, [&mut p0, &mut p1], s);
                assert_eq!(p0.map(f32::to_bits), b.map(f32::to_bits));
                assert_eq!(p1.map(f32::to_bits), c.map(f32::to_bits));
            }
            // Lane r is row r's in-order fold.
            let row: Vec<f32> = (0..dim).map(|j| gx[j * GROUP + 5]).collect();
            let want = match fold {
                Fold::L2 => crate::search::distance(crate::search::Metric::L2, &q, &row),
                Fold::Dot => {
                    -crate::search::distance(crate::search::Metric::InnerProduct, &q, &row)
                }
            };
            assert_eq!(a[5].to_bits(), want.to_bits());
            let (mut a, mut b) = ([0; GROUP], [0; GROUP]);
            fold_i32(fold, &qi, &gi, &mut a, simd);
            fold_i32(fold, &qi, &gi, &mut b, false);
            assert_eq!(a, b);
        }
    }
}
