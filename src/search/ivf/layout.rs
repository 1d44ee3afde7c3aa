//! cuVS's interleaved list layout.
//!
//! A list of `len` rows is stored in `ceil(len / 32)` groups of [`GROUP`] = 32
//! rows (the last padded with zero rows). Inside a group the dimension is cut
//! into chunks of `veclen` elements; chunk `c` holds, for each of the 32 rows in
//! turn, that row's `veclen` elements:
//!
//! ```text
//! offset(row, j) = (row / 32) · 32 · dim  +  (j / veclen) · 32 · veclen
//!                + (row % 32) · veclen    +  j % veclen
//! ```
//!
//! A warp whose lane `r` owns row `r` of a group loads chunk `c` as one
//! contiguous, coalesced `32 · veclen`-element transaction, each lane a
//! `veclen`-wide vector (16 bytes for the default [`veclen_for`]). With
//! `veclen = 1` a group is dimension-major, which is also what the CPU's SIMD
//! fold across rows wants ([`to_dim_major`] converts the other cases).

use super::IvfError;
use crate::search::DType;

/// Rows per interleaved group (a warp).
pub const GROUP: usize = 32;

/// cuVS's `calculate_veclen`: 16 bytes of elements per lane when the dimension
/// is a multiple of that, else 1.
pub fn veclen_for(dtype: DType, dim: usize) -> usize {
    let v = (16 / dtype.size()).max(1);
    if dim.is_multiple_of(v) {
        v
    } else {
        1
    }
}

/// The veclen an index gets when none is asked for: 1 for f32, cuVS's rule
/// ([`veclen_for`]) for the other types. An f32 group with veclen 1 is
/// already the dimension-major block the CPU scan folds, so the scan reads
/// it in place instead of transposing it for every pass (an interleaved A/B
/// here, one thread, 200k × 128, nlist 1024: 1.3× the QPS at nprobe 1, 1.15×
/// at nprobe 4, equal at 16); on the GPU a warp still reads each dimension of a group
/// as one coalesced 128-byte transaction, with 4-byte instead of 16-byte
/// loads. The narrower types are widened on the CPU anyway, so they keep
/// cuVS's 16-byte lanes.
pub fn default_veclen(dtype: DType, dim: usize) -> usize {
    match dtype {
        DType::F32 => 1,
        _ => veclen_for(dtype, dim),
    }
}

/// Whether `veclen` is one the layout takes at all: a power of two up to 16.
pub fn veclen_allowed(veclen: usize) -> bool {
    veclen.is_power_of_two() && veclen <= 16
}

/// Checks a veclen against the dimension (a power of two up to 16 dividing it).
pub fn check_veclen(veclen: usize, dim: usize) -> Result<(), IvfError> {
    if !veclen_allowed(veclen) || !dim.is_multiple_of(veclen) {
        return Err(IvfError::BadVeclen { veclen, dim });
    }
    Ok(())
}

/// Rows a list of `len` rows occupies (a whole number of groups).
pub fn padded_rows(len: usize) -> usize {
    len.div_ceil(GROUP) * GROUP
}

/// Where element `j` of row `row` lives in a list's data.
#[inline]
pub fn offset(row: usize, j: usize, dim: usize, veclen: usize) -> usize {
    (row / GROUP) * GROUP * dim
        + (j / veclen) * GROUP * veclen
        + (row % GROUP) * veclen
        + j % veclen
}

/// Interleaves `rows` (each `dim` elements) into a list's data, padded to whole
/// groups with `T::default()` (zero).
pub fn pack<'a, T: Copy + Default + 'a>(
    rows: impl ExactSizeIterator<Item = &'a [T]>,
    dim: usize,
    veclen: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); padded_rows(rows.len()) * dim];
    for (i, row) in rows.enumerate() {
        debug_assert_eq!(row.len(), dim);
        for (j, &v) in row.iter().enumerate() {
            out[offset(i, j, dim, veclen)] = v;
        }
    }
    out
}

/// Row `row` of a list's data, de-interleaved.
pub fn unpack_row<T: Copy>(data: &[T], row: usize, dim: usize, veclen: usize) -> Vec<T> {
    (0..dim)
        .map(|j| data[offset(row, j, dim, veclen)])
        .collect()
}

/// One group (`32 · dim` elements of a list's data) as dimension-major
/// `out[j · 32 + r]`, each element widened by `widen`.
#[inline]
pub fn to_dim_major<T: Copy, W>(
    group: &[T],
    dim: usize,
    veclen: usize,
    widen: impl Fn(T) -> W,
    out: &mut [W],
) {
    debug_assert_eq!(group.len(), GROUP * dim);
    debug_assert_eq!(out.len(), GROUP * dim);
    // Output order (contiguous stores); the reads stride by veclen inside one
    // 32·veclen chunk, which is in L1.
    for (j, col) in out.chunks_exact_mut(GROUP).enumerate() {
        let chunk = &group[(j / veclen) * GROUP * veclen..][..GROUP * veclen];
        let v = j % veclen;
        for (r, o) in col.iter_mut().enumerate() {
            *o = widen(chunk[r * veclen + v]);
        }
    }
}

/// [`to_dim_major`] for f32 groups with veclen 4 (the default layout of f32
/// data): 4×8 register transposes where AVX2 is available (`simd`, a
/// constant after inlining; the caller must have detected avx2).
#[inline(always)]
pub fn f32x4_to_dim_major(group: &[f32], dim: usize, out: &mut [f32], simd: bool) {
    assert!(group.len() == GROUP * dim && out.len() == GROUP * dim && dim.is_multiple_of(4));
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: avx2 was detected by the caller; the assert above keeps
        // every load and store inside the two slices.
        unsafe { transpose_avx2(group, dim, out) };
        return;
    }
    let _ = simd;
    to_dim_major(group, dim, 4, |x| x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(group: &[f32], dim: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    // After the unpacks and shuffles lanes hold rows 0 2 4 6 1 3 5 7; this
    // permutation restores 0..8.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (src, dst) = (group.as_ptr(), out.as_mut_ptr());
    for c in 0..dim / 4 {
        let chunk = src.add(c * GROUP * 4);
        for b in 0..GROUP / 8 {
            // Rows 8b .. 8b+8 of this chunk: two rows (4 elements each) per register.
            let p = chunk.add(b * 32);
            let (y0, y1) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            let (y2, y3) = (_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
            let (t0, t1) = (_mm256_unpacklo_ps(y0, y1), _mm256_unpackhi_ps(y0, y1));
            let (t2, t3) = (_mm256_unpacklo_ps(y2, y3), _mm256_unpackhi_ps(y2, y3));
            let z = [
                _mm256_shuffle_ps::<0x44>(t0, t2),
                _mm256_shuffle_ps::<0xEE>(t0, t2),
                _mm256_shuffle_ps::<0x44>(t1, t3),
                _mm256_shuffle_ps::<0xEE>(t1, t3),
            ];
            for (v, zv) in z.iter().enumerate() {
                let o = _mm256_permutevar8x32_ps(*zv, order);
                _mm256_storeu_ps(dst.add((c * 4 + v) * GROUP + b * 8), o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veclen_is_cuvs_rule() {
        assert_eq!(veclen_for(DType::F32, 128), 4);
        assert_eq!(veclen_for(DType::F32, 130), 1);
        assert_eq!(veclen_for(DType::F16, 128), 8);
        assert_eq!(veclen_for(DType::I8, 96), 16);
        assert_eq!(veclen_for(DType::U8, 100), 1);
        assert!(check_veclen(4, 128).is_ok());
        assert!(check_veclen(3, 12).is_err());
        assert!(check_veclen(8, 12).is_err());
        assert!(check_veclen(0, 12).is_err());
    }

    #[test]
    fn pack_unpack_and_dim_major_agree() {
        let dim = 8;
        let rows: Vec<Vec<u32>> = (0..45)
            .map(|i| (0..dim as u32).map(|j| i * 100 + j + 1).collect())
            .collect();
        for veclen in [1, 2, 4, 8] {
            let data = pack(rows.iter().map(|r| r.as_slice()), dim, veclen);
            assert_eq!(data.len(), 64 * dim);
            for (i, r) in rows.iter().enumerate() {
                assert_eq!(&unpack_row(&data, i, dim, veclen), r);
            }
            // Padding rows are zero.
            assert!(unpack_row(&data, 50, dim, veclen).iter().all(|&v| v == 0));
            // The layout cuVS documents: chunk c of a group is 32 rows × veclen.
            assert_eq!(data[veclen], rows[1][0]);
            if veclen == 4 {
                let f: Vec<f32> = data.iter().map(|&v| v as f32).collect();
                let (mut a, mut b) = (vec![0.0; GROUP * dim], vec![0.0; GROUP * dim]);
                #[cfg(target_arch = "x86_64")]
                let simd = is_x86_feature_detected!("avx2");
                #[cfg(not(target_arch = "x86_64"))]
                let simd = false;
                f32x4_to_dim_major(&f[GROUP * dim..], dim, &mut a, simd);
                to_dim_major(&f[GROUP * dim..], dim, 4, |x| x, &mut b);
                assert_eq!(a, b);
            }
            let mut dm = vec![0u64; GROUP * dim];
            to_dim_major(&data[GROUP * dim..], dim, veclen, u64::from, &mut dm);
            for r in 0..13 {
                for j in 0..dim {
                    assert_eq!(dm[j * GROUP + r], u64::from(rows[32 + r][j]));
                }
            }
        }
    }
}
