//! The per-vector values of the candidate kernel (knn_bounds.cuh): squared
//! norms computed once on the host (f64 for floats, exact integers for
//! i8/u8), turned into the kernel's `aux0`/`aux1` arrays per metric, and the
//! "special" vectors the bounds do not cover (src/search/cpu.rs's rules:
//! a non-finite element, a squared norm above 2¹⁰⁰, for cosine one below
//! 2⁻⁶⁰). Integer vectors are never special: their candidate distances are
//! exact, zero vectors included.

use rayon::prelude::*;

use crate::search::cpu::{float_info, FloatElem, IntElem, MIN_SQ_COSINE};
use crate::search::{Matrix, Metric, Vectors};

use super::bounds::float_aux;

/// Squared norms of every vector of a matrix.
#[derive(Debug, Clone)]
pub enum Norms {
    /// f32/f16: the f64 squared norm, `None` where the vector is special
    /// for every metric (non-finite, above 2¹⁰⁰).
    Float(Vec<Option<f64>>),
    /// i8/u8: the exact squared norm (below 2³¹ for the dims the kernel
    /// admits).
    Int(Vec<u32>),
}

/// Below this many elements a matrix's norms are computed on the calling
/// thread: a search's queries, where handing the rows to rayon's workers
/// and joining them cost more than the work (13-22 us against 1.3-6 us for
/// 10-100 queries of 128, 2-core VM).
const PARALLEL_ELEMENTS: usize = 1 << 16;

fn parallel<T>(m: &Matrix<T>) -> bool {
    m.data().len() >= PARALLEL_ELEMENTS
}

fn float_norms<T: FloatElem>(m: &Matrix<T>) -> Vec<Option<f64>> {
    let one = |buf: &mut Vec<f32>, i: usize| float_info(m.row(i), Metric::L2, buf);
    if parallel(m) {
        (0..m.rows())
            .into_par_iter()
            .map_init(Vec::new, one)
            .collect()
    } else {
        let mut buf = Vec::new();
        (0..m.rows()).map(|i| one(&mut buf, i)).collect()
    }
}

fn int_norms<T: IntElem>(m: &Matrix<T>) -> Vec<u32> {
    let one = |i: usize| u32::try_from(T::sq(m.row(i))).unwrap_or(u32::MAX);
    if parallel(m) {
        (0..m.rows()).into_par_iter().map(one).collect()
    } else {
        (0..m.rows()).map(one).collect()
    }
}

impl Norms {
    pub fn of(v: &Vectors) -> Norms {
        match v {
            Vectors::F32(m) => Norms::Float(float_norms(m)),
            Vectors::F16(m) => Norms::Float(float_norms(m)),
            Vectors::I8(m) => Norms::Int(int_norms(m)),
            Vectors::U8(m) => Norms::Int(int_norms(m)),
        }
    }

    /// Whether some vector is special for `metric` (the kernel cannot take
    /// the search).
    pub fn any_special(&self, metric: Metric) -> bool {
        (0..self.len()).any(|i| self.is_special(i, metric))
    }

    /// Whether vector `i` is special for `metric`.
    pub fn is_special(&self, i: usize, metric: Metric) -> bool {
        match self {
            Norms::Int(_) => false,
            Norms::Float(sq) => match sq[i] {
                None => true,
                Some(s) => metric == Metric::Cosine && s < MIN_SQ_COSINE,
            },
        }
    }

    /// Vectors `rows`' norms, in that order.
    pub(crate) fn gather(&self, rows: &[usize]) -> Norms {
        match self {
            Norms::Int(v) => Norms::Int(rows.iter().map(|&r| v[r]).collect()),
            Norms::Float(v) => Norms::Float(rows.iter().map(|&r| v[r]).collect()),
        }
    }

    /// How many vectors.
    pub fn len(&self) -> usize {
        match self {
            Norms::Int(v) => v.len(),
            Norms::Float(v) => v.len(),
        }
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kernel's `(aux0, aux1)` arrays for `metric` (knn_bounds.cuh;
    /// integers: the squared norm's u32 bits in aux0, aux1 unused). A
    /// special vector's entries are placeholders (those of a zero vector):
    /// the candidate kernel never reads them, special rows being skipped by
    /// its filter and special queries searched apart (`knn::special`).
    pub fn aux(&self, metric: Metric) -> (Vec<f32>, Vec<f32>) {
        match self {
            Norms::Int(sq) => (
                sq.iter().map(|&s| f32::from_bits(s)).collect(),
                vec![0.0; sq.len()],
            ),
            Norms::Float(sq) => sq
                .iter()
                .map(|s| float_aux(metric, s.unwrap_or(0.0)))
                .unzip(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_vectors_follow_the_cpu_rules() {
        let v = Vectors::f32(vec![3.0, 4.0, 0.0, 0.0, f32::NAN, 1.0, 1e30, 0.0], 2).unwrap();
        let Norms::Float(sq) = Norms::of(&v) else {
            panic!("f32 norms are float")
        };
        assert_eq!(sq[0], Some(25.0));
        assert_eq!(sq[1], Some(0.0));
        assert_eq!(sq[2], None, "NaN");
        assert_eq!(sq[3], None, "above 2^100");
        let ok = Norms::of(&Vectors::f32(vec![3.0, 4.0, 0.0, 0.0], 2).unwrap());
        assert!(!ok.any_special(Metric::L2));
        assert!(ok.any_special(Metric::Cosine), "a zero vector");
        let (a0, a1) = ok.aux(Metric::L2);
        assert_eq!((a0[0], a1[0]), (25.0, 5.0));
        let (c0, _) = ok.aux(Metric::InnerProduct);
        assert_eq!(c0[0], 5.0);
    }

    #[test]
    fn integer_norms_are_exact_and_never_special() {
        let v = Vectors::i8(vec![-128, -128, 0, 0], 2).unwrap();
        let n = Norms::of(&v);
        assert!(!n.any_special(Metric::Cosine));
        let (a0, _) = n.aux(Metric::L2);
        assert_eq!(a0[0].to_bits(), 32768);
        assert_eq!(a0[1].to_bits(), 0);
    }
}
