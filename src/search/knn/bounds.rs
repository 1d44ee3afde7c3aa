//! The Rust twin of fragments/knn_bounds.cuh: the same operations in the
//! same order, so that tests/host_headers.rs can check the header (compiled
//! for the host) against it bit for bit, and the margin tests
//! (tests/knn_margin.rs) can check the bounds on emulated tensor-core
//! arithmetic. The derivation and its assumptions are in the header.

use super::plan::Precision;
use crate::search::Metric;

/// knn_bounds.cuh's `bound_consts`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoundConsts {
    pub c_l2: f32,
    pub c_ip: f32,
    pub c_cos: f32,
    pub abs: f32,
    /// f16copy's input rounding (0 otherwise): cosine's per-pair term.
    pub abs_in: f32,
}

/// knn_bounds.cuh's `dim_supported`.
pub fn dim_supported(dim: u32) -> bool {
    (1..=1 << 17).contains(&dim)
}

/// knn_bounds.cuh's `make_bound_consts` (the same f64 expressions).
pub fn bound_consts(dim: u32, precision: Precision) -> BoundConsts {
    let u = f64::powi(2.0, -24);
    let u_tc = f64::powi(2.0, -20);
    let tiny = f64::powi(2.0, -126);
    let tiny_cos = f64::powi(2.0, -64);
    let n = dim as f64;
    let m = if precision == Precision::Tf32x3 {
        3.0 * n
    } else {
        n
    };
    let eps_in = match precision {
        Precision::Tf32 => f64::powi(2.0, -8),
        Precision::Tf32x3 => f64::powi(2.0, -17),
        Precision::F16Copy => f64::powi(2.0, -10) + f64::powi(2.0, -21),
        Precision::F16 | Precision::Int => 0.0,
    };
    let gamma_tc = m * u_tc / (1.0 - m * u_tc);
    let delta = eps_in + gamma_tc;
    let g_n = n * u / (1.0 - n * u);
    let g_n2 = (n + 2.0) * u / (1.0 - (n + 2.0) * u);
    let g_n6 = (n + 6.0) * u / (1.0 - (n + 6.0) * u);
    let abs_terms = 2.0 * m + n + 8.0;
    let up = 1.0 + 1e-6;
    let abs_in = if precision == Precision::F16Copy {
        // The least power of two ≥ √n, without a square root.
        let mut r = 1.0;
        while r * r < n {
            r *= 2.0;
        }
        4.0 * ((f64::powi(2.0, -25) + f64::powi(2.0, -36)) * r + n * f64::powi(2.0, -50))
    } else {
        0.0
    };
    BoundConsts {
        c_l2: ((2.0 * g_n2 + delta + 12.0 * u) * up) as f32,
        c_ip: ((2.0 * g_n + 2.0 * delta + 4.0 * u) * up) as f32,
        c_cos: ((4.0 * g_n6 + 2.0 * delta + 24.0 * u + abs_terms * tiny_cos) * up) as f32,
        abs: ((abs_terms * tiny + abs_in) * up) as f32,
        abs_in: (abs_in * up) as f32,
    }
}

/// knn_bounds.cuh's `float_bounds`: `(lo, hi)` of a pair from an
/// approximate dot product and the per-vector values of [`float_aux`].
pub fn float_bounds(
    metric: Metric,
    c: &BoundConsts,
    dot: f32,
    q: (f32, f32),
    x: (f32, f32),
) -> (f32, f32) {
    let (g, e) = match metric {
        Metric::L2 => {
            let g = (q.0 + x.0) - 2.0 * dot;
            let s = q.1 + x.1;
            (g, c.c_l2 * (s * s) + c.abs * (1.0 + s))
        }
        Metric::InnerProduct => (-dot, c.c_ip * (q.0 * x.0) + c.abs * (1.0 + (q.0 + x.0))),
        Metric::Cosine => {
            let mut e = c.c_cos;
            if c.abs_in > 0.0 {
                e += c.abs_in * ((q.0 + x.0) + q.0 * x.0);
            }
            (1.0 - (dot * q.0) * x.0, e)
        }
    };
    (g - e, g + e)
}

/// knn_bounds.cuh's `int_distance`: the reference distance of an integer
/// pair from its exact dot product and squared norms.
pub fn int_distance(metric: Metric, dot: i64, qq: u32, xx: u32) -> f32 {
    match metric {
        Metric::L2 => (qq as i64 + xx as i64 - 2 * dot) as f32,
        Metric::InnerProduct => -(dot as f32),
        Metric::Cosine => crate::search::cpu::finalize_cosine(dot as f32, qq as f32, xx as f32),
    }
}

/// The two per-vector values the kernel takes for a float vector with
/// squared norm `sq` (as cpu.rs: l2 (|x|², |x|), inner product (|x|, |x|),
/// cosine (1/|x|, 1/|x|)); the second is unused outside l2.
pub fn float_aux(metric: Metric, sq: f64) -> (f32, f32) {
    match metric {
        Metric::L2 => (sq as f32, sq.sqrt() as f32),
        Metric::InnerProduct => (sq.sqrt() as f32, sq.sqrt() as f32),
        Metric::Cosine => ((1.0 / sq.sqrt()) as f32, (1.0 / sq.sqrt()) as f32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_grow_with_dim_and_shrink_with_precision() {
        let t = bound_consts(128, Precision::Tf32);
        let t3 = bound_consts(128, Precision::Tf32x3);
        let h = bound_consts(128, Precision::F16);
        assert!(t.c_ip > t3.c_ip && t3.c_ip > h.c_ip, "{t:?} {t3:?} {h:?}");
        assert!(bound_consts(1024, Precision::F16).c_l2 > h.c_l2);
        // TF32's margin is about 2^-8 relative, 3xTF32's about 2^-17.
        assert!((0.005..0.02).contains(&t.c_ip), "{}", t.c_ip);
        assert!(t3.c_ip < 1e-3, "{}", t3.c_ip);
        assert!(dim_supported(1) && dim_supported(1 << 17));
        assert!(!dim_supported(0) && !dim_supported((1 << 17) + 1));
    }

    #[test]
    fn integer_distances_are_the_reference_finalisation() {
        // q = (3, 4), x = (0, 5): l2 = 9 + 1 = 10, dot = 20, qq = 25, xx = 25.
        assert_eq!(int_distance(Metric::L2, 20, 25, 25), 10.0);
        assert_eq!(int_distance(Metric::InnerProduct, 20, 25, 25), -20.0);
        assert_eq!(
            int_distance(Metric::Cosine, 20, 25, 25),
            1.0 - 20.0 / (5.0 * 5.0)
        );
        assert_eq!(int_distance(Metric::Cosine, 0, 0, 25), 1.0);
    }
}
