//! The f16 copies of f32 vectors that the [`Precision::F16Copy`] candidate
//! kernels read (fragments/knn_bounds.cuh, "f16copy"): each element rounded
//! to the nearest f16 on the host. The bound assumes every element finite
//! with |v| ≤ 65504 (f16's largest finite value); vectors with another
//! element have no copy, and a search that asks for the precision over them
//! is refused with an error naming it.
//!
//! [`Precision::F16Copy`]: super::Precision::F16Copy

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// f16's largest finite value: the largest |v| a copy takes.
pub const F16_COPY_MAX: f32 = 65504.0;

/// Whether every element of `v` has an f16 copy the bound covers.
pub fn fits(v: &[f32]) -> bool {
    // NaN fails the comparison too.
    v.iter().all(|x| x.abs() <= F16_COPY_MAX)
}

/// The f16 bits of `v`, each element rounded to nearest (ties to even), or
/// `None` where some element does not [`fit`](fits).
pub fn to_f16_bits(v: &[f32]) -> Option<Vec<u16>> {
    // The range check, then half's slice conversion (F16C where the CPU has
    // it; the same rounding): queries go through it per search, and an
    // element-wise map collected through `Option` took 30-39 us for 100
    // queries of 128 where this takes about 8 (2-core VM).
    if !fits(v) {
        return None;
    }
    let mut bits = vec![0u16; v.len()];
    bits.reinterpret_cast_mut::<f16>().convert_from_f32_slice(v);
    Some(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_round_to_nearest_and_refuse_what_f16_cannot_hold() {
        let v = [0.0, -1.5, 65504.0, -65504.0, 1e-8, 1.23456, 2049.0];
        let bits = to_f16_bits(&v).unwrap();
        let back: Vec<f32> = bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
        assert_eq!(&back[..4], &[0.0, -1.5, 65504.0, -65504.0]);
        // Subnormal range: within 2^-25 of the value.
        assert!((back[4] - 1e-8).abs() <= f32::powi(2.0, -25));
        // Normal range: within 2^-11 relative.
        assert!((back[5] - 1.23456).abs() <= 1.23456 * f32::powi(2.0, -11));
        // 2049 is a tie between 2048 and 2050: to even.
        assert_eq!(back[6], 2048.0);
        // The slice conversion rounds as the element-wise one, over every
        // exponent, signs and ties included.
        let mut x: u32 = 0x1234_5678;
        let many: Vec<f32> = (0..100_000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let v = f32::from_bits(x);
                if fits(&[v]) {
                    v
                } else {
                    (i % 60_000) as f32 + 0.5
                }
            })
            .collect();
        let want: Vec<u16> = many.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
        assert_eq!(to_f16_bits(&many).unwrap(), want);
        for bad in [65504.5, -70000.0, f32::INFINITY, f32::NAN] {
            assert!(!fits(&[1.0, bad]), "{bad}");
            assert!(to_f16_bits(&[bad]).is_none(), "{bad}");
        }
        assert!(fits(&[]));
    }
}
