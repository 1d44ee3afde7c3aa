//! Exact k-nearest-neighbour search: the types shared by the GPU path and the
//! CPU path, the CPU implementation ([`cpu`]), the GPU path ([`gpu`]) with its
//! device-resident index ([`index::GpuIndex`]: the base uploaded once),
//! routing between them ([`route`]) and data helpers ([`data`]).
//!
//! Semantics are those of the shipped scan kernel (fragments/README.md, "The
//! scan kernel" and "Numerics"): distances are the metric's (l2 squared,
//! inner product negated, cosine `1 - cos` with 1 for a zero vector), results
//! of a query are the `k` smallest keys `(distance, id)` over the allowed rows in
//! ascending order (ties → smaller id, IEEE comparison so `-0.0 == 0.0`), a NaN
//! distance counts as `+inf`, and when fewer than `k` rows are allowed the tail is
//! padded with id `-1` and distance `+inf`. [`cpu::search_cpu`] reproduces the
//! GPU results bit for bit; [`cpu::search_reference`] is the plain scalar form
//! of the same definition, kept as the oracle.
//!
//! ```
//! use fraglink::search::{cpu::search_cpu, data::synthetic, DType, Metric, SearchParams};
//! let (base, queries) = synthetic(1000, 16, 4, DType::F32, 7);
//! let res = search_cpu(&base, &queries, &SearchParams::new(5, Metric::L2)).unwrap();
//! assert_eq!(res.ids_of(0).len(), 5);
//! ```

pub mod cpu;
pub mod data;
pub mod env;
pub mod gpu;
pub mod index;
pub mod ivf;
pub mod kernels;
pub mod knn;
mod ops;
pub mod plan;
mod resident_bits;
pub mod route;
pub mod splits;
pub mod trace;

use std::fmt;
use std::str::FromStr;

use half::f16;

pub use cpu::{distance, search_cpu, search_reference, Element};
pub use index::{GpuIndex, IndexShape};

/// A distance metric; smaller is closer for every metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Squared Euclidean distance `Σ (q_j - x_j)²` (no square root).
    L2,
    /// Negated dot product `-Σ q_j x_j`.
    InnerProduct,
    /// `1 - Σ q_j x_j / (|q| |x|)`, 1 when either vector is zero; not clamped.
    Cosine,
}

impl Metric {
    /// Every metric, in fragment order.
    pub const ALL: [Metric; 3] = [Metric::L2, Metric::InnerProduct, Metric::Cosine];

    /// The `metric` value of the fragment matrices (`metric_<this>_<dtype>`).
    pub fn fragment_name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::InnerProduct => "inner_product",
            Metric::Cosine => "cosine",
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.fragment_name())
    }
}

impl FromStr for Metric {
    type Err = SearchError;
    /// `l2`, `ip` / `inner_product`, `cosine` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "l2" => Ok(Metric::L2),
            "ip" | "inner_product" => Ok(Metric::InnerProduct),
            "cosine" => Ok(Metric::Cosine),
            _ => Err(SearchError::UnknownMetric {
                name: s.to_string(),
                expected: "l2, ip, inner_product or cosine",
            }),
        }
    }
}

/// Element type of the vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    I8,
    U8,
}

impl DType {
    /// Every data type, in fragment order.
    pub const ALL: [DType; 4] = [DType::F32, DType::F16, DType::I8, DType::U8];

    /// `f32`, `f16`, `i8` or `u8` (the `dtype` value of the fragment matrices).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I8 => "i8",
            DType::U8 => "u8",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// Largest dimension whose integer accumulators stay exact (fragments/README.md,
    /// Numerics): 33025 for i8, 66051 for u8, unlimited for the float types.
    pub fn max_dim(self) -> Option<usize> {
        match self {
            DType::I8 => Some(33025),
            DType::U8 => Some(66051),
            DType::F32 | DType::F16 => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = SearchError;
    /// `f32`, `f16`, `i8`, `u8` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "i8" => Ok(DType::I8),
            "u8" => Ok(DType::U8),
            _ => Err(SearchError::UnknownDType(s.to_string())),
        }
    }
}

/// An owned, row-major `rows × dim` matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix<T> {
    data: Vec<T>,
    rows: usize,
    dim: usize,
}

impl<T> Matrix<T> {
    /// `data.len()` must equal `rows * dim`.
    pub fn new(data: Vec<T>, rows: usize, dim: usize) -> Result<Self, SearchError> {
        if rows.checked_mul(dim) != Some(data.len()) {
            return Err(SearchError::Shape {
                len: data.len(),
                rows,
                dim,
            });
        }
        Ok(Matrix { data, rows, dim })
    }

    /// Rows of `dim` elements; `data.len()` must be a multiple of `dim` (`dim > 0`).
    pub fn from_rows(data: Vec<T>, dim: usize) -> Result<Self, SearchError> {
        if dim == 0 || !data.len().is_multiple_of(dim) {
            return Err(SearchError::Shape {
                len: data.len(),
                rows: data.len().checked_div(dim).unwrap_or(0),
                dim,
            });
        }
        let rows = data.len() / dim;
        Ok(Matrix { data, rows, dim })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// All elements, row-major.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    pub fn into_data(self) -> Vec<T> {
        self.data
    }

    /// Row `i` (panics when `i >= rows`).
    pub fn row(&self, i: usize) -> &[T] {
        assert!(i < self.rows, "row {i} out of range ({} rows)", self.rows);
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// Owned row-major vectors of one of the supported element types.
#[derive(Debug, Clone, PartialEq)]
pub enum Vectors {
    F32(Matrix<f32>),
    F16(Matrix<f16>),
    I8(Matrix<i8>),
    U8(Matrix<u8>),
}

macro_rules! vectors_ctor {
    ($name:ident, $t:ty, $variant:ident) => {
        /// Rows of `dim` elements (`dim > 0`, `data.len()` a multiple of `dim`).
        pub fn $name(data: Vec<$t>, dim: usize) -> Result<Self, SearchError> {
            Ok(Vectors::$variant(Matrix::from_rows(data, dim)?))
        }
    };
}

impl Vectors {
    vectors_ctor!(f32, f32, F32);
    vectors_ctor!(f16, f16, F16);
    vectors_ctor!(i8, i8, I8);
    vectors_ctor!(u8, u8, U8);

    pub fn dtype(&self) -> DType {
        match self {
            Vectors::F32(_) => DType::F32,
            Vectors::F16(_) => DType::F16,
            Vectors::I8(_) => DType::I8,
            Vectors::U8(_) => DType::U8,
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            Vectors::F32(m) => m.rows(),
            Vectors::F16(m) => m.rows(),
            Vectors::I8(m) => m.rows(),
            Vectors::U8(m) => m.rows(),
        }
    }

    pub fn dim(&self) -> usize {
        match self {
            Vectors::F32(m) => m.dim(),
            Vectors::F16(m) => m.dim(),
            Vectors::I8(m) => m.dim(),
            Vectors::U8(m) => m.dim(),
        }
    }

    /// Size of the elements in bytes (what a transfer to the device moves).
    pub fn size_bytes(&self) -> usize {
        self.rows() * self.dim() * self.dtype().size()
    }

    /// The raw bytes of the elements, row-major, little-endian (the layout the
    /// GPU kernels read).
    pub fn as_bytes(&self) -> &[u8] {
        fn bytes<T>(v: &[T]) -> &[u8] {
            // SAFETY: f32, f16, i8 and u8 are plain old data without padding; the
            // slice covers exactly the elements' memory.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        match self {
            Vectors::F32(m) => bytes(m.data()),
            Vectors::F16(m) => bytes(m.data()),
            Vectors::I8(m) => bytes(m.data()),
            Vectors::U8(m) => bytes(m.data()),
        }
    }

    /// Row `i` widened to f32 (exact for every dtype).
    pub fn row_f32(&self, i: usize) -> Vec<f32> {
        match self {
            Vectors::F32(m) => m.row(i).to_vec(),
            Vectors::F16(m) => m.row(i).iter().map(|v| v.to_f32()).collect(),
            Vectors::I8(m) => m.row(i).iter().map(|&v| v as f32).collect(),
            Vectors::U8(m) => m.row(i).iter().map(|&v| v as f32).collect(),
        }
    }
}

/// One bit per dataset row, shared by all queries: row `i` is allowed iff bit
/// `i % 32` (LSB first) of `words[i / 32]` is set. `words.len()` must be
/// `ceil(n_rows / 32)`; bits at positions `>= n_rows` are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitset {
    pub words: Vec<u32>,
    pub n_rows: usize,
}

impl Bitset {
    fn words_for(n_rows: usize) -> usize {
        n_rows.div_ceil(32)
    }

    /// Every row allowed.
    pub fn all(n_rows: usize) -> Self {
        let mut b = Bitset {
            words: vec![u32::MAX; Self::words_for(n_rows)],
            n_rows,
        };
        b.clear_tail();
        b
    }

    /// No row allowed.
    pub fn none(n_rows: usize) -> Self {
        Bitset {
            words: vec![0; Self::words_for(n_rows)],
            n_rows,
        }
    }

    /// Row `i` allowed iff `allowed(i)`.
    pub fn from_fn(n_rows: usize, mut allowed: impl FnMut(usize) -> bool) -> Self {
        let mut b = Self::none(n_rows);
        for i in 0..n_rows {
            if allowed(i) {
                b.set(i, true);
            }
        }
        b
    }

    /// Each row allowed independently with probability `fraction` (clamped to
    /// [0, 1]), reproducibly from `seed`.
    pub fn random(n_rows: usize, fraction: f64, seed: u64) -> Self {
        let mut rng = data::Rng::new(seed);
        let p = fraction.clamp(0.0, 1.0);
        Self::from_fn(n_rows, |_| rng.next_f64() < p)
    }

    fn clear_tail(&mut self) {
        let rem = self.n_rows % 32;
        if rem != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << rem) - 1;
            }
        }
    }

    /// Is row `i` allowed? (`false` past the end.)
    #[inline]
    pub fn get(&self, i: usize) -> bool {
        i < self.n_rows
            && self
                .words
                .get(i >> 5)
                .is_some_and(|w| (w >> (i & 31)) & 1 != 0)
    }

    pub fn set(&mut self, i: usize, allowed: bool) {
        assert!(
            i < self.n_rows,
            "row {i} out of range ({} rows)",
            self.n_rows
        );
        let bit = 1u32 << (i & 31);
        if allowed {
            self.words[i >> 5] |= bit;
        } else {
            self.words[i >> 5] &= !bit;
        }
    }

    /// Number of allowed rows.
    pub fn count(&self) -> usize {
        (0..self.n_rows).filter(|&i| self.get(i)).count()
    }

    /// Checks the length against a dataset of `n_rows` rows.
    pub fn validate(&self, n_rows: usize) -> Result<(), SearchError> {
        if self.n_rows != n_rows || self.words.len() != Self::words_for(self.n_rows) {
            return Err(SearchError::FilterLength {
                dataset_rows: n_rows,
                filter_rows: self.n_rows,
                words: self.words.len(),
                expected_words: Self::words_for(n_rows),
            });
        }
        Ok(())
    }
}

/// Which rows may appear in the results.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Filter {
    /// Every row.
    #[default]
    None,
    /// One bit per row, shared by all queries.
    Bitset(Bitset),
}

impl Filter {
    /// Is row `i` allowed?
    #[inline]
    pub fn allows(&self, i: usize) -> bool {
        match self {
            Filter::None => true,
            Filter::Bitset(b) => b.get(i),
        }
    }

    /// The `filter` value of the fragment matrices (`none` or `bitset`).
    pub fn fragment_name(&self) -> &'static str {
        match self {
            Filter::None => "none",
            Filter::Bitset(_) => "bitset",
        }
    }
}

/// What to search for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchParams {
    /// Neighbours per query, ≥ 1. May exceed the number of (allowed) rows: the
    /// tail is padded like the GPU's (id -1, distance +inf).
    pub k: usize,
    pub metric: Metric,
    pub filter: Filter,
}

impl SearchParams {
    /// `k` neighbours by `metric`, no filter.
    pub fn new(k: usize, metric: Metric) -> Self {
        SearchParams {
            k,
            metric,
            filter: Filter::None,
        }
    }

    pub fn with_filter(mut self, filter: Filter) -> Self {
        self.filter = filter;
        self
    }
}

/// Results: `nq × k` ids and distances, row-major, ascending per query.
/// Padding (fewer than `k` allowed rows) is id [`Neighbors::PAD_ID`] with
/// distance `+inf`.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbors {
    pub nq: usize,
    pub k: usize,
    pub ids: Vec<i64>,
    pub distances: Vec<f32>,
}

impl Neighbors {
    /// The id of a padding slot.
    pub const PAD_ID: i64 = -1;

    /// The `k` ids of query `q`.
    pub fn ids_of(&self, q: usize) -> &[i64] {
        &self.ids[q * self.k..(q + 1) * self.k]
    }

    /// The `k` distances of query `q`.
    pub fn distances_of(&self, q: usize) -> &[f32] {
        &self.distances[q * self.k..(q + 1) * self.k]
    }

    /// Bitwise equality (distances compared by their bits, so `-0.0 != 0.0`
    /// and NaN payloads count); what "identical to the GPU" means.
    pub fn bitwise_eq(&self, other: &Neighbors) -> bool {
        self.nq == other.nq
            && self.k == other.k
            && self.ids == other.ids
            && self.distances.len() == other.distances.len()
            && self
                .distances
                .iter()
                .zip(&other.distances)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }

    /// First position where two results differ, as `(query, slot)`, comparing
    /// ids and distance bits; `None` when [`bitwise_eq`](Self::bitwise_eq).
    pub fn first_difference(&self, other: &Neighbors) -> Option<(usize, usize)> {
        if self.nq != other.nq || self.k != other.k {
            return Some((0, 0));
        }
        (0..self.ids.len())
            .find(|&i| {
                self.ids[i] != other.ids[i]
                    || self.distances[i].to_bits() != other.distances[i].to_bits()
            })
            .map(|i| (i / self.k.max(1), i % self.k.max(1)))
    }
}

/// Why a search could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    #[error("dimension mismatch: base vectors have dim {base}, queries have dim {queries}")]
    DimensionMismatch { base: usize, queries: usize },
    #[error("dtype mismatch: base vectors are {base}, queries are {queries}")]
    DTypeMismatch { base: DType, queries: DType },
    #[error("k must be at least 1 (got {k})")]
    InvalidK { k: usize },
    #[error("the results of {nq} queries x k = {k} {}", match (.bytes, .limit) {
        (Some(b), Some(l)) => format!("need {b} bytes, more than the {l} this process may use"),
        _ => "overflow: their size in bytes does not fit in 64 bits".to_string(),
    })]
    ResultTooLarge {
        nq: usize,
        k: usize,
        /// The bytes they need (`None`: more than 64 bits hold).
        bytes: Option<u64>,
        limit: Option<data::MemoryLimit>,
    },
    #[error("a search of {nq} queries at k = {k} over {rows} rows needs {bytes} bytes for one query's candidates (and as much per thread), more than the {left} bytes left for them of the {limit} this process may use beside the data and the results")]
    CandidatesTooLarge {
        nq: usize,
        k: usize,
        rows: usize,
        bytes: u64,
        /// The bytes the candidates may take.
        left: u64,
        limit: data::MemoryLimit,
    },
    #[error("bitset filter covers {filter_rows} rows in {words} words, but the dataset has {dataset_rows} rows (needs {expected_words} words)")]
    FilterLength {
        dataset_rows: usize,
        filter_rows: usize,
        words: usize,
        expected_words: usize,
    },
    #[error("dim {dim} is too large for {dtype}: its integer accumulators are exact only up to dim {max}")]
    DimTooLarge {
        dtype: DType,
        dim: usize,
        max: usize,
    },
    #[error("{len} elements do not form {rows} rows of dim {dim}")]
    Shape { len: usize, rows: usize, dim: usize },
    #[error("unknown metric `{name}` (expected {expected})")]
    UnknownMetric {
        name: String,
        /// The names the parser takes.
        expected: &'static str,
    },
    #[error("unknown dtype `{0}` (expected f32, f16, i8 or u8)")]
    UnknownDType(String),
}

/// Bytes of one result slot: an i64 id and an f32 distance.
pub const RESULT_BYTES_PER_SLOT: u64 = 12;

/// Results this large are checked against the [`data::memory_limit`] (which
/// reads the system's figures); smaller ones always pass.
const RESULTS_CHECKED_FROM: u64 = 64 << 20;

/// Whether the results of `nq` queries at `k` (`nq × k` slots of
/// [`RESULT_BYTES_PER_SLOT`]) fit in the memory this process may use: a `k`
/// of 2^40 passed a size check against the address space, and the search
/// then aborted in its allocation.
pub fn check_result_size(nq: usize, k: usize) -> Result<(), SearchError> {
    let bytes = (nq as u64)
        .checked_mul(k as u64)
        .and_then(|s| s.checked_mul(RESULT_BYTES_PER_SLOT));
    let too_large = |bytes, limit| SearchError::ResultTooLarge {
        nq,
        k,
        bytes,
        limit,
    };
    match bytes {
        Some(b) if b < RESULTS_CHECKED_FROM => Ok(()),
        Some(b) => {
            let limit = data::memory_limit();
            if b <= limit.bytes && usize::try_from(b).is_ok_and(|b| b <= isize::MAX as usize) {
                Ok(())
            } else {
                Err(too_large(Some(b), Some(limit)))
            }
        }
        None => Err(too_large(None, None)),
    }
}

/// The checks every search path makes (GPU and CPU alike); see
/// [`IndexShape::validate`].
pub fn validate(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
) -> Result<(), SearchError> {
    IndexShape::of(base).validate(queries, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_names() {
        assert_eq!("l2".parse::<Metric>().unwrap(), Metric::L2);
        assert_eq!("ip".parse::<Metric>().unwrap(), Metric::InnerProduct);
        assert_eq!(
            "inner_product".parse::<Metric>().unwrap(),
            Metric::InnerProduct
        );
        assert_eq!("Cosine".parse::<Metric>().unwrap(), Metric::Cosine);
        assert!("l1".parse::<Metric>().is_err());
        assert_eq!(Metric::InnerProduct.fragment_name(), "inner_product");
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert!("f64".parse::<DType>().is_err());
    }

    #[test]
    fn bitset_bits_lsb_first() {
        let mut b = Bitset::none(70);
        assert_eq!(b.words.len(), 3);
        b.set(0, true);
        b.set(33, true);
        b.set(69, true);
        assert_eq!(b.words, vec![1, 2, 1 << 5]);
        assert!(b.get(33) && !b.get(32) && !b.get(70));
        assert_eq!(b.count(), 3);
        assert_eq!(Bitset::all(70).count(), 70);
        let r = Bitset::random(10_000, 0.25, 3);
        let c = r.count();
        assert!((2200..2800).contains(&c), "{c}");
        assert_eq!(r, Bitset::random(10_000, 0.25, 3));
        assert!(b.validate(70).is_ok());
        assert!(b.validate(71).is_err());
    }

    #[test]
    fn validation_errors() {
        let b = Vectors::f32(vec![0.0; 8], 4).unwrap();
        let q = Vectors::f32(vec![0.0; 3], 3).unwrap();
        let p = SearchParams::new(1, Metric::L2);
        assert!(matches!(
            validate(&b, &q, &p),
            Err(SearchError::DimensionMismatch { .. })
        ));
        let q = Vectors::u8(vec![0; 4], 4).unwrap();
        assert!(matches!(
            validate(&b, &q, &p),
            Err(SearchError::DTypeMismatch { .. })
        ));
        let q = Vectors::f32(vec![0.0; 4], 4).unwrap();
        assert!(matches!(
            validate(&b, &q, &SearchParams::new(0, Metric::L2)),
            Err(SearchError::InvalidK { .. })
        ));
        let p = SearchParams::new(1, Metric::L2).with_filter(Filter::Bitset(Bitset::all(3)));
        assert!(matches!(
            validate(&b, &q, &p),
            Err(SearchError::FilterLength { .. })
        ));
        assert!(Vectors::f32(vec![0.0; 5], 4).is_err());
        assert!(Matrix::<f32>::new(vec![], 3, 0).is_ok());
        let big = Vectors::I8(Matrix::new(vec![0; 33026], 1, 33026).unwrap());
        assert!(matches!(
            validate(&big, &big, &SearchParams::new(1, Metric::L2)),
            Err(SearchError::DimTooLarge { .. })
        ));
    }
}
