//! Exact k-NN on the CPU: the fallback of the GPU path and its reference.
//!
//! Two implementations of one definition (fragments/README.md, "The scan kernel"
//! and "Numerics"):
//!
//! - [`search_reference`]: for every query and every allowed row, the distance by
//!   the README's in-order fold ([`distance`]), NaN → +inf, then a sort by
//!   `(distance, id)`. Simple and slow; the oracle.
//! - [`search_cpu`]: the same results, bit for bit, fast. Dot products of query
//!   blocks × row blocks (tasks in parallel with rayon) come, for f32 and f16,
//!   from a fused AVX-512 or AVX2 kernel chosen at run time ([`CpuKernel`],
//!   `fused` module: the dot products never leave the registers before they
//!   are compared with the thresholds), else from the `gemm` crate; with
//!   precomputed norms they give approximate distances, which pick a few
//!   candidates per query; the candidates are then **re-ranked with the exact
//!   in-order fold**, so every returned distance is the reference's (and the
//!   GPU's) to the bit and ties resolve by the same `(distance, id)` key.
//!
//! # Why no true neighbour is lost (the margin)
//!
//! Write `d` for the reference distance of a (query, row) pair (the fold, f32,
//! one rounding per operation) and `g` for the GEMM-based approximation. For
//! every pair the code computes, in f32, `lo = g - e` and `hi = g + e` with an
//! error bound `e` such that `lo ≤ d ≤ hi` (below). A row is kept as a candidate
//! while `lo < T`, where `T` is the k-th smallest `hi` among the rows seen
//! before it. If `lo ≥ T`, there are k earlier rows (smaller ids) with
//! `d' ≤ hi' ≤ T ≤ lo ≤ d`, so k keys `(d', id')` precede `(d, id)` and the row
//! cannot be in the answer. The candidates of all row shards are merged, pruned
//! to `lo ≤ U` (U = k-th smallest `hi` of the merged set, non-strict because
//! shards interleave nothing but ties may cross shards), their exact `d`
//! computed and sorted by `(d, id)`: the first k are exactly the reference's.
//! To bound memory on inputs with many equal distances (duplicate rows), a
//! query's candidate list that grows past `4k + 64` is pruned and, if that does
//! not halve it, replaced by the exact best k of its members (the same argument
//! with `hi = lo = d`).
//!
//! The bound `e` (u = 2⁻²⁴, γ(m) = m·u / (1 − m·u), n = dim, `|q|`, `|x|` the
//! Euclidean norms; every sum of n products computed in f32 in any order, with
//! or without fma, is within γ(n)·Σ|q_j x_j| ≤ γ(n)·|q||x| of the exact value;
//! this covers GEMM's blocked order, the fused kernels' in-order vector fmas
//! and the reference's in-order fold):
//!
//! - **l2**: reference `|d − D| ≤ γ(n+2)·D` (the differences are rounded once,
//!   squared exactly inside the fma) with `D = |q − x|² ≤ (|q|+|x|)²`;
//!   approximation `g = (|q|² + |x|²) − 2·dot` with the squared norms summed in
//!   f64 and rounded to f32: `|g − D| ≤ 2γ(n)|q||x| + 4.1u(|q|+|x|)²`;
//!   computing `g ± e` costs another `1.01u(|q|+|x|)²`. Used:
//!   `e = (3γ(n+2) + 12u)·(|q|+|x|)² + A`, about twice the sum.
//! - **inner_product**: `|d − g| ≤ 2γ(n)|q||x|`, plus `1.02u|q||x|` for `g ± e`.
//!   Used: `e = (4γ(n) + 4u)·|q||x| + A`.
//! - **cosine**: with `c = dot/(|q||x|)`, the reference's `1 − a/(√qq·√xx)` is
//!   within `2.02γ(n+6) + 2.01u` of `1 − c`; the approximation
//!   `1 − dot·(1/|q|)·(1/|x|)` within `γ(n) + 6.1u`; `g ± e` another `2.1u`.
//!   Used: `e = 7γ(n+6) + 24u + A`.
//! - `A = (n + 8)·2⁻¹²⁶` absorbs underflow (each rounding into the subnormal
//!   range errs by at most 2⁻¹⁵⁰ absolutely instead of relatively).
//!
//! The factor ≈ 2 over the derived sums also covers the relative rounding of
//! the f32 norms and of `e` itself. The bounds need every intermediate finite
//! and normal-ranged, so rows and queries with a non-finite element, a squared
//! norm above 2¹⁰⁰, or (cosine) a squared norm below 2⁻⁶⁰ (zero vectors
//! included) are "special": special rows are evaluated exactly for every query
//! and join the merge; special queries are answered by the reference scan.
//! dim = 0 and dims where γ is not small (n·u ≥ 1/2) use the reference.
//!
//! **Integers and the fused kernels.** With a fused float kernel ([`CpuKernel`]:
//! AVX2, AVX-512, and AVX-512 VNNI where its byte kernel does not serve the
//! dim), i8 and u8 take the float path above: their values are exact in f32, so the
//! approximation `g` is bounded as for any f32 input, and their reference
//! distance is the exact integer result `D` rounded once to f32 (`|d − D| ≤
//! u·|D|`, inside the γ terms the bounds already allow for the float fold's
//! own rounding: l2 `u·D ≤ γ(n+2)·D`; inner product `u·|D| ≤ u·|q||x|`;
//! cosine's accumulators are each within `u` instead of `γ(n)`); the
//! candidates are re-ranked with the integer fold itself, so the results are
//! the reference's bit for bit. Zero vectors are special for cosine as
//! before; no integer vector is otherwise special.
//!
//! With the GEMM kernel, for i8/u8 the GEMM is exact: its inputs are small integers widened to f32,
//! and with the inner dimension split into chunks of at most 1024 (i8,
//! |q·x| ≤ 2¹⁴) or 258 (u8, q·x ≤ 65025) elements every partial sum is an
//! integer of magnitude ≤ 2²⁴, so each chunk's dot product is exact whatever
//! the summation order; chunks add up in f64 (exact: every value is an integer
//! below 2⁵³). From the exact dot product and the
//! exact integer squared norms, `qq + xx − 2·dot`, `−dot` and the cosine formula
//! give the reference's integer accumulators exactly, and converting them to f32
//! as the reference does reproduces its distances bit for bit (e = 0, no
//! re-rank needed).
//!
//! With [`CpuKernel::Avx512Vnni`], i8 and u8 of a dim that is a multiple of 4
//! (up to 33024) take the same exact route with byte dot products in 32-bit
//! integers (`vnni` module: `vpdpbusd`, rows read in place, no widening);
//! other dims take the fused float path of [`CpuKernel::Avx512`].

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use half::f16;
use rayon::prelude::*;

use super::{
    validate, DType, Filter, Matrix, Metric, Neighbors, SearchError, SearchParams, Vectors,
};

mod fused;
mod simd;
mod vnni;

pub use fused::CpuKernel;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for i8 {}
    impl Sealed for u8 {}
}

/// An element type the searches support (f32, f16, i8, u8).
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    const DTYPE: DType;
    /// The distance of one (query, row) pair by the README's fold: elements in
    /// order, f32 fma / exact integer accumulation, finalised once. No NaN
    /// mapping (the searches map NaN to +inf).
    fn distance(metric: Metric, q: &[Self], x: &[Self]) -> f32;
}

/// The reference distance of one pair (see [`Element::distance`]); `q` and `x`
/// must have the same length.
pub fn distance<T: Element>(metric: Metric, q: &[T], x: &[T]) -> f32 {
    assert_eq!(q.len(), x.len(), "distance: vectors of different lengths");
    T::distance(metric, q, x)
}

#[inline(always)]
pub(crate) fn finalize_cosine(a: f32, qq: f32, xx: f32) -> f32 {
    if qq == 0.0 || xx == 0.0 {
        1.0
    } else {
        1.0 - a / (qq.sqrt() * xx.sqrt())
    }
}

#[inline(always)]
fn float_fold<T: Copy>(metric: Metric, q: &[T], x: &[T], w: impl Fn(T) -> f32) -> f32 {
    match metric {
        Metric::L2 => {
            let mut a = 0.0f32;
            for (&qe, &xe) in q.iter().zip(x) {
                let d = w(qe) - w(xe);
                a = d.mul_add(d, a);
            }
            a
        }
        Metric::InnerProduct => {
            let mut a = 0.0f32;
            for (&qe, &xe) in q.iter().zip(x) {
                a = w(qe).mul_add(w(xe), a);
            }
            -a
        }
        Metric::Cosine => {
            let (mut a, mut qq, mut xx) = (0.0f32, 0.0f32, 0.0f32);
            for (&qe, &xe) in q.iter().zip(x) {
                let (qf, xf) = (w(qe), w(xe));
                a = qf.mul_add(xf, a);
                qq = qf.mul_add(qf, qq);
                xx = xf.mul_add(xf, xx);
            }
            finalize_cosine(a, qq, xx)
        }
    }
}

// The same fold compiled with hardware fma (mul_add is a correctly rounded fma
// either way; without the feature it is a libm call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn float_fold_fma_f32(metric: Metric, q: &[f32], x: &[f32]) -> f32 {
    float_fold(metric, q, x, |v| v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,f16c")]
unsafe fn float_fold_fma_f16(metric: Metric, q: &[f16], x: &[f16]) -> f32 {
    float_fold(metric, q, x, |v| v.to_f32())
}

/// `Σ v_j²` folded in order with fma (`a = fma(v_j, v_j, a)`, one rounding
/// each): the squared norm the IVF scans and cosine use, with hardware fma
/// where the CPU has it (the same bits; otherwise each step is a libm call).
pub(crate) fn sq_norm_f32(v: &[f32]) -> f32 {
    fn fold(v: &[f32]) -> f32 {
        v.iter().fold(0.0f32, |a, &x| x.mul_add(x, a))
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        unsafe fn fold_fma(v: &[f32]) -> f32 {
            fold(v)
        }
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports fma (checked above).
            return unsafe { fold_fma(v) };
        }
    }
    fold(v)
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn distance(metric: Metric, q: &[f32], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports fma (checked above).
            return unsafe { float_fold_fma_f32(metric, q, x) };
        }
        float_fold(metric, q, x, |v| v)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn distance(metric: Metric, q: &[f16], x: &[f16]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU supports fma and f16c (checked above).
            return unsafe { float_fold_fma_f16(metric, q, x) };
        }
        float_fold(metric, q, x, |v| v.to_f32())
    }
}

impl Element for i8 {
    const DTYPE: DType = DType::I8;
    fn distance(metric: Metric, q: &[i8], x: &[i8]) -> f32 {
        // int32 accumulators (exact for dim ≤ 33025; wrapping like the device beyond).
        match metric {
            Metric::L2 => {
                let mut a = 0i32;
                for (&qe, &xe) in q.iter().zip(x) {
                    let d = qe as i32 - xe as i32;
                    a = a.wrapping_add(d * d);
                }
                a as f32
            }
            Metric::InnerProduct => {
                let mut a = 0i32;
                for (&qe, &xe) in q.iter().zip(x) {
                    a = a.wrapping_add(qe as i32 * xe as i32);
                }
                -(a as f32)
            }
            Metric::Cosine => {
                let (mut a, mut qq, mut xx) = (0i32, 0i32, 0i32);
                for (&qe, &xe) in q.iter().zip(x) {
                    let (qi, xi) = (qe as i32, xe as i32);
                    a = a.wrapping_add(qi * xi);
                    qq = qq.wrapping_add(qi * qi);
                    xx = xx.wrapping_add(xi * xi);
                }
                finalize_cosine(a as f32, qq as f32, xx as f32)
            }
        }
    }
}

impl Element for u8 {
    const DTYPE: DType = DType::U8;
    fn distance(metric: Metric, q: &[u8], x: &[u8]) -> f32 {
        // uint32 accumulators (exact for dim ≤ 66051).
        match metric {
            Metric::L2 => {
                let mut a = 0u32;
                for (&qe, &xe) in q.iter().zip(x) {
                    let d = qe as i32 - xe as i32;
                    a = a.wrapping_add((d * d) as u32);
                }
                a as f32
            }
            Metric::InnerProduct => {
                let mut a = 0u32;
                for (&qe, &xe) in q.iter().zip(x) {
                    a = a.wrapping_add(qe as u32 * xe as u32);
                }
                -(a as f32)
            }
            Metric::Cosine => {
                let (mut a, mut qq, mut xx) = (0u32, 0u32, 0u32);
                for (&qe, &xe) in q.iter().zip(x) {
                    let (qi, xi) = (qe as u32, xe as u32);
                    a = a.wrapping_add(qi * xi);
                    qq = qq.wrapping_add(qi * qi);
                    xx = xx.wrapping_add(xi * xi);
                }
                finalize_cosine(a as f32, qq as f32, xx as f32)
            }
        }
    }
}

#[inline(always)]
pub(crate) fn nan_to_inf(d: f32) -> f32 {
    if d.is_nan() {
        f32::INFINITY
    } else {
        d
    }
}

/// The result order: by distance (IEEE, so -0 == +0; never NaN here), then id.
#[inline(always)]
pub(crate) fn key_cmp(da: f32, ia: usize, db: f32, ib: usize) -> Ordering {
    match da.partial_cmp(&db) {
        Some(Ordering::Equal) | None => ia.cmp(&ib),
        Some(o) => o,
    }
}

pub(crate) fn padded(nq: usize, k: usize) -> Neighbors {
    Neighbors {
        nq,
        k,
        ids: vec![Neighbors::PAD_ID; nq * k],
        distances: vec![f32::INFINITY; nq * k],
    }
}

fn allowed_rows(n: usize, filter: &Filter) -> Vec<usize> {
    match filter {
        Filter::None => (0..n).collect(),
        Filter::Bitset(b) => (0..n).filter(|&i| b.get(i)).collect(),
    }
}

/// Exact top-k of one query over `rows` by the reference fold, written to the
/// output slots (which are pre-padded).
fn reference_query<T: Element>(
    metric: Metric,
    qrow: &[T],
    base: &Matrix<T>,
    rows: &[usize],
    ids: &mut [i64],
    dists: &mut [f32],
) {
    let k = ids.len();
    let mut all: Vec<(f32, usize)> = rows
        .iter()
        .map(|&r| (nan_to_inf(T::distance(metric, qrow, base.row(r))), r))
        .collect();
    let cmp = |a: &(f32, usize), b: &(f32, usize)| key_cmp(a.0, a.1, b.0, b.1);
    if all.len() > k {
        all.select_nth_unstable_by(k - 1, cmp);
        all.truncate(k);
    }
    all.sort_unstable_by(cmp);
    for (j, (d, r)) in all.into_iter().enumerate() {
        ids[j] = r as i64;
        dists[j] = d;
    }
}

// --------------------------------------------------------------------------------
// Threads
// --------------------------------------------------------------------------------

/// The CPU path runs at most this many threads per available core: the work is
/// compute-bound, so more only adds scheduling (100 000 threads take minutes to
/// start and stop where the default takes 0.15 s), while a few per core still
/// let tests oversubscribe a small machine.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// `RAYON_NUM_THREADS` holds something other than a whole number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("RAYON_NUM_THREADS=`{value}` is not a number of threads (expected a whole number; 0 or unset means one per core)")]
pub struct ThreadsVarError {
    pub value: String,
}

/// The CPU path's thread count and, when `RAYON_NUM_THREADS` asked for more
/// than the clamp allows, a one-line warning naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuThreads {
    pub threads: usize,
    pub warning: Option<String>,
}

/// The thread count for a `RAYON_NUM_THREADS` value (`None` or empty: unset)
/// on `cores` available cores: the value, 0 or unset meaning `cores`, clamped
/// to `MAX_THREADS_PER_CORE × cores`.
pub fn cpu_threads_for(
    value: Option<&std::ffi::OsStr>,
    cores: usize,
) -> Result<CpuThreads, ThreadsVarError> {
    let cores = cores.max(1);
    let max = cores.saturating_mul(MAX_THREADS_PER_CORE);
    let asked = match value.filter(|v| !v.is_empty()) {
        None => 0,
        Some(v) => v
            .to_str()
            .and_then(|s| s.parse::<usize>().ok())
            .ok_or_else(|| ThreadsVarError {
                value: v.to_string_lossy().into_owned(),
            })?,
    };
    Ok(match asked {
        0 => CpuThreads {
            threads: cores,
            warning: None,
        },
        t if t > max => CpuThreads {
            threads: max,
            warning: Some(format!(
                "RAYON_NUM_THREADS={t} is more than {MAX_THREADS_PER_CORE} threads per core \
                 ({cores} cores here): the CPU path uses {max} threads"
            )),
        },
        t => CpuThreads {
            threads: t,
            warning: None,
        },
    })
}

/// Reads `RAYON_NUM_THREADS` ([`cpu_threads_for`] on the available cores) and,
/// the first time, builds rayon's global pool with that many threads (unless
/// something built it already). Called by [`search_cpu`] and
/// [`search_reference`] outside any rayon pool (where an invalid value leaves
/// one thread per core); `fraglink search` calls it first and reports the
/// error or the warning.
pub fn init_cpu_threads() -> Result<CpuThreads, ThreadsVarError> {
    static INIT: std::sync::OnceLock<Result<CpuThreads, ThreadsVarError>> =
        std::sync::OnceLock::new();
    INIT.get_or_init(|| {
        let cores = crate::workers::cores();
        let value = std::env::var_os("RAYON_NUM_THREADS");
        let chosen = cpu_threads_for(value.as_deref(), cores);
        let threads = chosen.as_ref().map_or(cores, |c| c.threads);
        // Err: a global pool exists already; it is used as it is.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
        chosen
    })
    .clone()
}

/// Sizes rayon's global pool before a search uses it (not inside a pool the
/// caller chose).
pub(crate) fn ensure_threads() {
    if rayon::current_thread_index().is_none() {
        let _ = init_cpu_threads();
    }
}

/// The plain scalar search: every allowed row's distance by the README fold
/// ([`distance`]), NaN → +inf, sorted by `(distance, id)`, padded. Parallel over
/// queries only. The oracle [`search_cpu`] is tested against.
pub fn search_reference(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
) -> Result<Neighbors, SearchError> {
    validate(base, queries, params)?;
    ensure_threads();
    Ok(match (base, queries) {
        (Vectors::F32(b), Vectors::F32(q)) => reference_all(b, q, params),
        (Vectors::F16(b), Vectors::F16(q)) => reference_all(b, q, params),
        (Vectors::I8(b), Vectors::I8(q)) => reference_all(b, q, params),
        (Vectors::U8(b), Vectors::U8(q)) => reference_all(b, q, params),
        _ => unreachable!("validate() checked the dtypes"),
    })
}

fn reference_all<T: Element>(b: &Matrix<T>, q: &Matrix<T>, p: &SearchParams) -> Neighbors {
    let mut out = padded(q.rows(), p.k);
    let rows = allowed_rows(b.rows(), &p.filter);
    out.ids
        .par_chunks_mut(p.k)
        .zip(out.distances.par_chunks_mut(p.k))
        .enumerate()
        .for_each(|(qi, (ids, dists))| reference_query(p.metric, q.row(qi), b, &rows, ids, dists));
    out
}

/// Exact k-nearest neighbours with the GPU scan's semantics, fast: candidate
/// selection from dot products with a rigorous error margin, then an exact
/// re-rank with the reference fold, or exact integer distances throughout
/// (i8/u8 with the GEMM or the VNNI kernel; module docs). Results equal
/// [`search_reference`] bit for bit. Uses rayon's current thread pool and the
/// fastest kernel this CPU has for this search's type, dim and number of
/// queries ([`CpuKernel::for_search`]).
pub fn search_cpu(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
) -> Result<Neighbors, SearchError> {
    let kernel = CpuKernel::for_search(base.dtype(), base.dim(), queries.rows());
    search_cpu_with(base, queries, params, kernel)
}

/// The `k` nearest rows of `base` to every query (`nq × k` row indices;
/// `k ≤ base.rows()`), the same set as [`search_cpu`]'s ids, for callers that
/// need no distances and no order (k-means assignment, IVF's probed lists):
/// a query whose candidates prune to exactly `k` rows takes them as they are,
/// in no particular order, without computing their exact distances; the
/// others come sorted as from `search_cpu`.
pub(crate) fn nearest_rows(
    base: &Matrix<f32>,
    queries: &Matrix<f32>,
    metric: Metric,
    k: usize,
) -> Result<Vec<usize>, SearchError> {
    // validate()'s checks, for two f32 matrices and no filter.
    if base.dim() != queries.dim() {
        return Err(SearchError::DimensionMismatch {
            base: base.dim(),
            queries: queries.dim(),
        });
    }
    if k == 0 || k > base.rows() {
        return Err(SearchError::InvalidK { k });
    }
    let p = SearchParams::new(k, metric);
    ensure_threads();
    let kernel = CpuKernel::for_queries(queries.rows()).usable();
    let found = float_search(base, queries, &p, kernel, true);
    Ok(found.ids.iter().map(|&i| i as usize).collect())
}

/// [`search_cpu`] with the float dot products computed by `kernel` (replaced by
/// the fastest one this CPU has if it cannot run it: [`CpuKernel::usable`]).
/// Every kernel gives the same results, bit for bit. Integer types take the
/// exact-GEMM path with [`CpuKernel::Gemm`], the exact byte path with
/// [`CpuKernel::Avx512Vnni`] where the dim allows, and the float path
/// (margin, then exact re-rank) with the other fused kernels (module docs).
pub fn search_cpu_with(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
    kernel: CpuKernel,
) -> Result<Neighbors, SearchError> {
    validate(base, queries, params)?;
    ensure_threads();
    if params.k >= base.rows() {
        // Every allowed row is an answer: each needs its exact distance, so
        // bounds and candidates would only cost time and memory (k = n of
        // 3·10^7 rows held 720 MB of candidates per query, twice).
        return search_reference(base, queries, params);
    }
    let kernel = kernel.usable();
    let held = base.size_bytes() as u64 + queries.size_bytes() as u64;
    let run = queries_per_run(
        queries.rows(),
        base.rows(),
        params.k,
        held,
        crate::search::data::memory_limit,
    )?;
    Ok(search_in_runs(base, queries, params, kernel, run))
}

/// The search in runs of `run` queries each (validated), their results
/// appended.
fn search_in_runs(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
    kernel: CpuKernel,
    run: usize,
) -> Neighbors {
    let nq = queries.rows();
    if run >= nq {
        return search_run(base, queries, params, kernel);
    }
    let mut out = Neighbors {
        nq,
        k: params.k,
        ids: Vec::with_capacity(nq * params.k),
        distances: Vec::with_capacity(nq * params.k),
    };
    for start in (0..nq).step_by(run) {
        let part = queries.slice_rows(start, (start + run).min(nq));
        let found = search_run(base, &part, params, kernel);
        out.ids.extend(found.ids);
        out.distances.extend(found.distances);
    }
    out
}

/// Candidate bytes of all queries below which [`queries_per_run`] does not
/// read the memory limit (the system's figures).
const CANDIDATES_CHECKED_FROM: u64 = 256 << 20;

/// An upper bound of the candidates one query holds while a search runs
/// (its `TaskCands` and running tasks' `TopK`s over every row shard): per
/// shard at most a compaction's capacity (`4k + 64`), in all at most the
/// rows. `4 × threads` shards at most ([`shard_count`]).
fn candidate_bytes_per_query(n_rows: usize, k: usize) -> u64 {
    let shards = 4 * rayon::current_num_threads().max(1) as u64;
    let per_shard = 4 * k.min(n_rows) as u64 + 64;
    shards
        .saturating_mul(per_shard)
        .min(n_rows as u64)
        .saturating_mul(std::mem::size_of::<Cand>() as u64)
}

/// What the float search keeps per base row besides the row itself (its id
/// in the allowed and normal lists, its norm data and classification).
const ROW_BOOKKEEPING_BYTES: u64 = 48;

/// How many queries one run of the search takes so that their candidates,
/// and each thread's copy of one query's while it re-ranks them, stay within
/// half of what the [`memory_limit`](crate::search::data::memory_limit) leaves
/// beside the data (`held`: base and queries), the rows' bookkeeping and the
/// results: all of them unless their bound is large. The runs' results are
/// the one search's, bit for bit (each query's answer depends on the query
/// alone). A `k` near the rows of a large base had every query hold
/// candidates of every row at once, and the search aborted in an allocation.
fn queries_per_run(
    nq: usize,
    n_rows: usize,
    k: usize,
    held: u64,
    memory_limit: impl FnOnce() -> crate::search::data::MemoryLimit,
) -> Result<usize, SearchError> {
    let per = candidate_bytes_per_query(n_rows, k).max(1);
    let threads = rayon::current_num_threads().max(1) as u64;
    if per.saturating_mul(nq as u64 + threads) < CANDIDATES_CHECKED_FROM {
        return Ok(nq.max(1));
    }
    let limit = memory_limit();
    let results = (nq as u64).saturating_mul(k as u64) * crate::search::RESULT_BYTES_PER_SLOT;
    let budget = limit
        .bytes
        .saturating_sub(held)
        .saturating_sub((n_rows as u64).saturating_mul(ROW_BOOKKEEPING_BYTES))
        .saturating_sub(results)
        / 2;
    let queries = (budget / per).saturating_sub(threads);
    if queries == 0 {
        return Err(SearchError::CandidatesTooLarge {
            nq,
            k,
            rows: n_rows,
            bytes: per,
            left: budget,
            limit,
        });
    }
    Ok(usize::try_from(queries)
        .unwrap_or(usize::MAX)
        .min(nq.max(1)))
}

/// One run of [`search_cpu_with`] over `queries` (validated).
fn search_run(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
    kernel: CpuKernel,
) -> Neighbors {
    match (base, queries) {
        (Vectors::F32(b), Vectors::F32(q)) => float_search(b, q, params, kernel, false),
        (Vectors::F16(b), Vectors::F16(q)) => float_search(b, q, params, kernel, false),
        (Vectors::I8(b), Vectors::I8(q)) => match kernel {
            CpuKernel::Gemm => int_search(b, q, params),
            _ => float_search(b, q, params, kernel, false),
        },
        (Vectors::U8(b), Vectors::U8(q)) => match kernel {
            CpuKernel::Gemm => int_search(b, q, params),
            _ => float_search(b, q, params, kernel, false),
        },
        _ => unreachable!("validate() checked the dtypes"),
    }
}

// --------------------------------------------------------------------------------
// Candidate selection
// --------------------------------------------------------------------------------

/// A candidate row: bounds on its reference distance (equal when exact).
#[derive(Debug, Clone, Copy)]
struct Cand {
    lo: f32,
    hi: f32,
    id: usize,
    exact: bool,
}

/// f32 ordered for the max-heap of upper bounds (never NaN).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Hi(f32);
impl Eq for Hi {}
impl PartialOrd for Hi {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Hi {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.partial_cmp(&other.0).unwrap_or(Ordering::Equal)
    }
}

/// Streaming candidate selection for one query over rows in ascending id order.
struct TopK {
    k: usize,
    cap: usize,
    /// The k smallest upper bounds seen (max-heap).
    heap: BinaryHeap<Hi>,
    cands: Vec<Cand>,
}

impl TopK {
    fn new(k: usize) -> Self {
        let mut t = TopK {
            k,
            cap: 0,
            heap: BinaryHeap::with_capacity(k + 1),
            cands: Vec::new(),
        };
        t.reset(k);
        t
    }

    /// Empties it for a new query and `k`, keeping its buffers.
    fn reset(&mut self, k: usize) {
        self.k = k;
        self.cap = 4 * k + 64;
        self.heap.clear();
        self.cands.clear();
    }

    /// The k-th smallest upper bound so far (+inf until k rows were seen).
    #[inline(always)]
    fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::INFINITY
        } else {
            self.heap.peek().map_or(f32::INFINITY, |h| h.0)
        }
    }

    /// Offers a row whose id is larger than every row offered before.
    #[inline]
    fn offer(&mut self, c: Cand, exact: &mut dyn FnMut(usize) -> f32) {
        let t = self.threshold();
        if self.heap.len() < self.k {
            self.heap.push(Hi(c.hi));
        } else if c.lo < t {
            if c.hi < t {
                self.heap.pop();
                self.heap.push(Hi(c.hi));
            }
        } else {
            return;
        }
        self.cands.push(c);
        if self.cands.len() >= self.cap {
            self.compact(exact);
        }
    }

    fn compact(&mut self, exact: &mut dyn FnMut(usize) -> f32) {
        let t = self.threshold();
        self.cands.retain(|c| c.lo <= t);
        if self.cands.len() * 2 <= self.cap {
            return;
        }
        for c in self.cands.iter_mut().filter(|c| !c.exact) {
            let d = nan_to_inf(exact(c.id));
            *c = Cand {
                lo: d,
                hi: d,
                id: c.id,
                exact: true,
            };
        }
        self.cands
            .sort_unstable_by(|a, b| key_cmp(a.lo, a.id, b.lo, b.id));
        self.cands.truncate(self.k);
        self.heap.clear();
        self.heap.extend(self.cands.iter().map(|c| Hi(c.hi)));
    }
}

thread_local! {
    static TOPS: std::cell::RefCell<Vec<TopK>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with `n` empty [`TopK`]s for `k` from this thread's reusable set
/// (fresh ones if it is in use): a task's per-query heaps and candidate lists
/// keep their buffers from task to task instead of being allocated per query.
fn with_tops<R>(n: usize, k: usize, f: impl FnOnce(&mut [TopK]) -> R) -> R {
    let run = |tops: &mut Vec<TopK>| {
        while tops.len() < n {
            tops.push(TopK::new(k));
        }
        tops[..n].iter_mut().for_each(|t| t.reset(k));
        f(&mut tops[..n])
    };
    TOPS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut tops) => run(&mut tops),
        Err(_) => run(&mut Vec::new()),
    })
}

/// The candidates one task kept, query by query, in one buffer.
struct TaskCands {
    cands: Vec<Cand>,
    /// `ends[i]`: one past query `i`'s last candidate.
    ends: Vec<usize>,
}

impl TaskCands {
    /// Copies the candidates out of `tops` (which keep their buffers).
    fn take(tops: &[TopK]) -> Self {
        let mut cands = Vec::with_capacity(tops.iter().map(|t| t.cands.len()).sum());
        let ends = tops
            .iter()
            .map(|t| {
                cands.extend_from_slice(&t.cands);
                cands.len()
            })
            .collect();
        TaskCands { cands, ends }
    }

    /// Query `i`'s candidates.
    fn of(&self, i: usize) -> &[Cand] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.cands[start..self.ends[i]]
    }
}

/// Buffers of [`finish_query`], reused across the queries a thread merges.
#[derive(Default)]
struct FinishScratch {
    /// The query's candidates (the caller fills it).
    pool: Vec<Cand>,
    his: Vec<f32>,
}

/// Merges the candidates of one query (`scratch.pool`: all shards, plus
/// special rows as exact candidates), re-ranks exactly and writes the k best
/// (`ids_only`: see [`float_search`]).
fn finish_query(
    scratch: &mut FinishScratch,
    k: usize,
    ids_only: bool,
    exact: &mut dyn FnMut(usize) -> f32,
    ids: &mut [i64],
    dists: &mut [f32],
) {
    let FinishScratch { pool, his } = scratch;
    if pool.len() > k {
        his.clear();
        his.extend(pool.iter().map(|c| c.hi));
        let (_, u, _) =
            his.select_nth_unstable_by(k - 1, |a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
        let u = *u;
        pool.retain(|c| c.lo <= u);
    }
    if ids_only && pool.len() == k {
        // Exactly the k best (the pruning keeps every row that can be one).
        for (j, c) in pool.iter().enumerate() {
            ids[j] = c.id as i64;
            dists[j] = c.hi;
        }
        return;
    }
    for c in pool.iter_mut().filter(|c| !c.exact) {
        let d = nan_to_inf(exact(c.id));
        c.lo = d;
        c.hi = d;
        c.exact = true;
    }
    let cmp = |a: &Cand, b: &Cand| key_cmp(a.lo, a.id, b.lo, b.id);
    if pool.len() > k {
        pool.select_nth_unstable_by(k - 1, cmp);
        pool.truncate(k);
    }
    pool.sort_unstable_by(cmp);
    for (j, c) in pool.iter().enumerate() {
        ids[j] = c.id as i64;
        dists[j] = c.lo;
    }
}

/// Per (query, row) distance bounds from a dot product; `j` indexes the block's
/// row data. `EXACT`: the bounds are the reference distance itself.
trait Approx {
    type Dot: Copy;
    const EXACT: bool;
    /// (g, e): the approximate distance and its error bound.
    fn bounds(&self, dot: Self::Dot, j: usize) -> (f32, f32);
    /// `out[j] = g_j - e_j` for the whole block (the same operations as
    /// [`bounds`](Self::bounds), written to vectorise).
    fn lows(&self, dots: &[Self::Dot], out: &mut [f32]);
}

/// Offers a block of rows to a query's selection. `ids[j]` is the dataset id of
/// block row j; rows are in ascending id order. `lo` is scratch.
#[inline(always)]
fn scan_block<A: Approx>(
    a: &A,
    dots: &[A::Dot],
    ids: &[usize],
    top: &mut TopK,
    exact: &mut dyn FnMut(usize) -> f32,
    lo: &mut Vec<f32>,
) {
    const CHUNK: usize = 32;
    let m = dots.len();
    debug_assert_eq!(ids.len(), m);
    lo.resize(m, 0.0);
    a.lows(dots, lo);
    let mut t = top.threshold();
    for (ci, chunk) in lo.chunks(CHUNK).enumerate() {
        // Branch-free test of the whole chunk (vectorises).
        if !chunk.iter().fold(false, |any, &l| any | (l < t)) {
            continue;
        }
        let base = ci * CHUNK;
        for (jj, &l) in chunk.iter().enumerate() {
            if l < t {
                let j = base + jj;
                let (d, e) = a.bounds(dots[j], j);
                top.offer(
                    Cand {
                        lo: d - e,
                        hi: d + e,
                        id: ids[j],
                        exact: A::EXACT,
                    },
                    exact,
                );
                t = top.threshold();
            }
        }
    }
}

// ----- float approximations -------------------------------------------------------

struct L2Approx<'a> {
    qq: f32,
    qn: f32,
    xx: &'a [f32],
    xn: &'a [f32],
    c: f32,
    abs: f32,
}
impl Approx for L2Approx<'_> {
    type Dot = f32;
    const EXACT: bool = false;
    #[inline(always)]
    fn bounds(&self, dot: f32, j: usize) -> (f32, f32) {
        let d = (self.qq + self.xx[j]) - 2.0 * dot;
        let s = self.qn + self.xn[j];
        (d, self.c * (s * s) + self.abs)
    }
    fn lows(&self, dots: &[f32], out: &mut [f32]) {
        let n = out.len();
        let (dots, xx, xn) = (&dots[..n], &self.xx[..n], &self.xn[..n]);
        for j in 0..n {
            let d = (self.qq + xx[j]) - 2.0 * dots[j];
            let s = self.qn + xn[j];
            out[j] = d - (self.c * (s * s) + self.abs);
        }
    }
}

struct IpApprox<'a> {
    cq: f32,
    xn: &'a [f32],
    abs: f32,
}
impl Approx for IpApprox<'_> {
    type Dot = f32;
    const EXACT: bool = false;
    #[inline(always)]
    fn bounds(&self, dot: f32, j: usize) -> (f32, f32) {
        (-dot, self.cq * self.xn[j] + self.abs)
    }
    fn lows(&self, dots: &[f32], out: &mut [f32]) {
        let n = out.len();
        let (dots, xn) = (&dots[..n], &self.xn[..n]);
        for j in 0..n {
            out[j] = -dots[j] - (self.cq * xn[j] + self.abs);
        }
    }
}

struct CosApprox<'a> {
    qinv: f32,
    xinv: &'a [f32],
    e: f32,
}
impl Approx for CosApprox<'_> {
    type Dot = f32;
    const EXACT: bool = false;
    #[inline(always)]
    fn bounds(&self, dot: f32, j: usize) -> (f32, f32) {
        (1.0 - (dot * self.qinv) * self.xinv[j], self.e)
    }
    fn lows(&self, dots: &[f32], out: &mut [f32]) {
        let n = out.len();
        let (dots, xinv) = (&dots[..n], &self.xinv[..n]);
        for j in 0..n {
            out[j] = (1.0 - (dots[j] * self.qinv) * xinv[j]) - self.e;
        }
    }
}

// ----- exact integer distances ----------------------------------------------------

// The integer dot products and squared norms are exact integers below 2⁵³
// (module docs), held in f64 so that the per-block arithmetic vectorises; the
// sums below are exact too, and f64 → f32 rounds the exact integer to nearest
// exactly as the reference's i32/u32 → f32 conversion does.

/// An exact integer dot product as the GEMM delivers it: f32 from a single
/// chunk, f64 summed over chunks.
trait IntDot: Copy {
    fn get(self) -> f64;
}
impl IntDot for f32 {
    #[inline(always)]
    fn get(self) -> f64 {
        self as f64
    }
}
impl IntDot for f64 {
    #[inline(always)]
    fn get(self) -> f64 {
        self
    }
}

struct IntL2<'a, D> {
    qq: f64,
    xx: &'a [f64],
    _dot: std::marker::PhantomData<D>,
}
impl<D: IntDot> Approx for IntL2<'_, D> {
    type Dot = D;
    const EXACT: bool = true;
    #[inline(always)]
    fn bounds(&self, dot: D, j: usize) -> (f32, f32) {
        (((self.qq + self.xx[j]) - 2.0 * dot.get()) as f32, 0.0)
    }
    fn lows(&self, dots: &[D], out: &mut [f32]) {
        let n = out.len();
        let (dots, xx) = (&dots[..n], &self.xx[..n]);
        for j in 0..n {
            out[j] = ((self.qq + xx[j]) - 2.0 * dots[j].get()) as f32;
        }
    }
}

struct IntIp<D>(std::marker::PhantomData<D>);
impl<D: IntDot> Approx for IntIp<D> {
    type Dot = D;
    const EXACT: bool = true;
    #[inline(always)]
    fn bounds(&self, dot: D, _j: usize) -> (f32, f32) {
        (-(dot.get() as f32), 0.0)
    }
    fn lows(&self, dots: &[D], out: &mut [f32]) {
        for (o, &d) in out.iter_mut().zip(dots) {
            *o = -(d.get() as f32);
        }
    }
}

struct IntCos<'a, D> {
    qq: f32,
    xx: &'a [f32],
    _dot: std::marker::PhantomData<D>,
}
impl<D: IntDot> Approx for IntCos<'_, D> {
    type Dot = D;
    const EXACT: bool = true;
    #[inline(always)]
    fn bounds(&self, dot: D, j: usize) -> (f32, f32) {
        (finalize_cosine(dot.get() as f32, self.qq, self.xx[j]), 0.0)
    }
    fn lows(&self, dots: &[D], out: &mut [f32]) {
        let n = out.len();
        let (dots, xx) = (&dots[..n], &self.xx[..n]);
        for j in 0..n {
            out[j] = finalize_cosine(dots[j].get() as f32, self.qq, xx[j]);
        }
    }
}

/// Offers one GEMM block of exact integer dot products (`nqb × m`, row-major)
/// to the block's queries (`q0 + i`).
#[allow(clippy::too_many_arguments)]
fn scan_int_block<D: IntDot>(
    metric: Metric,
    dots: &[D],
    m: usize,
    ids: &[usize],
    tops: &mut [TopK],
    q0: usize,
    qq: &[f64],
    xx: &[f64],
    xxf: &[f32],
    lo: &mut Vec<f32>,
) {
    use std::marker::PhantomData;
    let mut never = |_: usize| -> f32 { unreachable!("exact candidates are never recomputed") };
    for (i, top) in tops.iter_mut().enumerate() {
        let qq = qq[q0 + i];
        let drow = &dots[i * m..(i + 1) * m];
        match metric {
            Metric::L2 => {
                let a = IntL2 {
                    qq,
                    xx,
                    _dot: PhantomData,
                };
                scan_block(&a, drow, ids, top, &mut never, lo)
            }
            Metric::InnerProduct => scan_block(&IntIp(PhantomData), drow, ids, top, &mut never, lo),
            Metric::Cosine => {
                let a = IntCos {
                    qq: qq as f32,
                    xx: xxf,
                    _dot: PhantomData,
                };
                scan_block(&a, drow, ids, top, &mut never, lo)
            }
        }
    }
}

// --------------------------------------------------------------------------------
// GEMM and the task grid
// --------------------------------------------------------------------------------

/// `dst[i * n + j] = Σ_l lhs[i * ld + l] · rhs[j * ld + l]` for `l < kk`
/// (row-major `m × kk` times the transpose of row-major `n × kk`, both with row
/// stride `ld`), single-threaded (the callers parallelise over tasks).
fn gemm_nt(m: usize, n: usize, kk: usize, lhs: &[f32], rhs: &[f32], ld: usize, dst: &mut [f32]) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(kk <= ld && lhs.len() >= (m - 1) * ld + kk && rhs.len() >= (n - 1) * ld + kk);
    assert!(dst.len() >= m * n);
    if kk == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    // SAFETY: the asserts above keep every access of the m×kk lhs, the kk×n rhs
    // (column j = row j of `rhs`) and the m×n dst inside the slices; dst does
    // not alias the inputs (distinct borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            kk,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            ld as isize,
            rhs.as_ptr(),
            ld as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Per-thread scratch buffers, reused across tasks and searches so that the
/// large GEMM outputs are not zero-filled for every task.
#[derive(Default)]
struct Scratch {
    dots: Vec<f32>,
    idots: Vec<f64>,
    xbuf: Vec<f32>,
    lo: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch (a fresh one if it is in use).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// `v` with at least `n` elements (grown, never shrunk or cleared).
fn at_least<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Queries per task and rows per GEMM block. Measured with gemm 0.18 (AVX2,
/// one thread, streaming over 100k × 128 rows): 256 queries × 512 rows run at
/// ~62 Gflop/s, 128 × 2048 at ~51 (the packed row block no longer stays in L2).
/// About 256 KiB of rows per block.
fn block_sizes(dim: usize) -> (usize, usize) {
    let qb = 256;
    let rb = (65_536 / dim.max(1)).clamp(64, 2048);
    (qb, rb)
}

/// Contiguous ranges covering `0..n` in `parts` nearly equal pieces.
fn split(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.max(1).min(n.max(1));
    (0..parts)
        .map(|i| (n * i / parts)..(n * (i + 1) / parts))
        .collect()
}

/// Row shards for `n_qblocks` query blocks over `n_rows` rows: enough tasks for
/// every thread, shards of at least one GEMM block.
fn shard_count(n_qblocks: usize, n_rows: usize, rb: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let want = (4 * threads).div_ceil(n_qblocks.max(1));
    want.clamp(1, (n_rows / rb).max(1))
}

// ----- floats ---------------------------------------------------------------------

pub(crate) trait FloatElem: Element {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// i8 and u8 data as bytes, for the VNNI kernel; `None` for floats.
    fn bytes(_src: &[Self]) -> Option<vnni::Bytes<'_>> {
        None
    }
}
impl FloatElem for f32 {
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
}
impl FloatElem for f16 {
    fn widen(src: &[f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
}

// Integers through the float path (with a fused float kernel only; module
// docs, "Integers and the fused kernels"): exact as f32, re-ranked by their
// own fold. Their bytes feed the VNNI kernel instead where it serves.
impl FloatElem for i8 {
    fn widen(src: &[i8], dst: &mut [f32]) {
        <i8 as IntElem>::widen(src, dst)
    }
    fn as_f32(_: &[i8]) -> Option<&[f32]> {
        None
    }
    fn bytes(src: &[i8]) -> Option<vnni::Bytes<'_>> {
        // SAFETY: i8 and u8 have the same size and alignment, and every
        // bit pattern is a valid u8.
        let data = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), src.len()) };
        Some(vnni::Bytes { data, signed: true })
    }
}
impl FloatElem for u8 {
    fn widen(src: &[u8], dst: &mut [f32]) {
        <u8 as IntElem>::widen(src, dst)
    }
    fn as_f32(_: &[u8]) -> Option<&[f32]> {
        None
    }
    fn bytes(src: &[u8]) -> Option<vnni::Bytes<'_>> {
        let data = src;
        Some(vnni::Bytes {
            data,
            signed: false,
        })
    }
}

/// Squared-norm limits of "normal" vectors (module docs).
const MAX_SQ: f64 = 1.2676506002282294e30; // 2^100
pub(crate) const MIN_SQ_COSINE: f64 = 8.673617379884035e-19; // 2^-60

/// Per-vector data of the float path: `None` = special.
pub(crate) fn float_info<T: FloatElem>(v: &[T], metric: Metric, buf: &mut Vec<f32>) -> Option<f64> {
    buf.resize(v.len(), 0.0);
    T::widen(v, buf);
    // Squares of f32 values cannot overflow f64, so the sum is non-finite iff
    // an element is. Eight lanes so that the loop vectorises.
    let mut lanes = [0.0f64; 8];
    let chunks = buf.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] += (c[i] as f64) * (c[i] as f64);
        }
    }
    let mut sq: f64 = lanes.iter().sum();
    for &x in tail {
        sq += (x as f64) * (x as f64);
    }
    if !sq.is_finite() || sq > MAX_SQ || (metric == Metric::Cosine && sq < MIN_SQ_COSINE) {
        return None;
    }
    Some(sq)
}

/// The three error-bound constants (rounded up generously to f32).
fn float_bound_consts(dim: usize) -> (f32, f32, f32, f32) {
    let u = f64::powi(2.0, -24);
    let gamma = |m: usize| (m as f64 * u) / (1.0 - m as f64 * u);
    let up = |v: f64| (v * (1.0 + 1e-6)) as f32;
    let c_l2 = up(3.0 * gamma(dim + 2) + 12.0 * u);
    let c_ip = up(4.0 * gamma(dim) + 4.0 * u);
    let c_cos = up(7.0 * gamma(dim + 6) + 24.0 * u);
    let abs = up((dim as f64 + 8.0) * f64::powi(2.0, -126));
    (c_l2, c_ip, c_cos, abs)
}

/// Two per-row f32 values the approximations use: l2 (|x|², |x|), inner
/// product (|x|, 0), cosine (1/|x|, 0).
fn float_aux(metric: Metric, sq: f64) -> (f32, f32) {
    match metric {
        Metric::L2 => (sq as f32, sq.sqrt() as f32),
        Metric::InnerProduct => (sq.sqrt() as f32, 0.0),
        Metric::Cosine => ((1.0 / sq.sqrt()) as f32, 0.0),
    }
}

/// What every task of one float search shares.
struct FloatTask<'a, T> {
    b: &'a Matrix<T>,
    q: &'a Matrix<T>,
    metric: Metric,
    dim: usize,
    /// Rows per block.
    rb: usize,
    /// The normal rows' ids, and their [`float_aux`] values (empty where
    /// the VNNI kernel runs: it reads `int_rows` instead).
    normal: &'a [usize],
    aux0: &'a [f32],
    aux1: &'a [f32],
    /// Per query: its squared norm, `None` if special.
    q_info: &'a [Option<f64>],
    /// [`float_bound_consts`].
    consts: (f32, f32, f32, f32),
    /// The normal rows' values for the exact VNNI kernel, where it runs
    /// (i8/u8 with [`CpuKernel::Avx512Vnni`] and a dim it serves).
    int_rows: Option<&'a vnni::IntRows>,
}

impl<T: FloatElem> FloatTask<'_, T> {
    /// The f32 rows `ids` (a block of `normal`): the data itself where it is f32
    /// and contiguous, else widened into `xbuf`.
    fn block_data<'x>(&'x self, ids: &[usize], xbuf: &'x mut Vec<f32>) -> &'x [f32] {
        let (m, dim) = (ids.len(), self.dim);
        let contiguous = ids[m - 1] - ids[0] == m - 1;
        match T::as_f32(self.b.data()) {
            Some(all) if contiguous => &all[ids[0] * dim..(ids[0] + m) * dim],
            _ => {
                let xbuf = at_least(xbuf, m * dim);
                for (j, &r) in ids.iter().enumerate() {
                    T::widen(self.b.row(r), &mut xbuf[j * dim..(j + 1) * dim]);
                }
                &xbuf[..m * dim]
            }
        }
    }

    /// Queries `qr` (widened in `qbuf`) over normal rows `sr`: GEMM blocks of dot
    /// products, then a selection pass per query over each block.
    fn gemm_task(
        &self,
        qr: &[usize],
        qbuf: &[f32],
        sr: std::ops::Range<usize>,
        tops: &mut [TopK],
        scratch: &mut Scratch,
    ) {
        let (b, q, metric, dim, rb) = (self.b, self.q, self.metric, self.dim, self.rb);
        let (c_l2, c_ip, c_cos, abs) = self.consts;
        let nqb = qr.len();
        let Scratch { dots, xbuf, lo, .. } = scratch;
        let dots = at_least(dots, nqb * rb.min(sr.len()));
        let mut r0 = sr.start;
        while r0 < sr.end {
            let r1 = (r0 + rb).min(sr.end);
            let m = r1 - r0;
            let ids = &self.normal[r0..r1];
            let xs = self.block_data(ids, xbuf);
            gemm_nt(nqb, m, dim, qbuf, xs, dim, dots);
            let (a0, a1) = (&self.aux0[r0..r1], &self.aux1[r0..r1]);
            for (i, top) in tops.iter_mut().enumerate() {
                let qi = qr[i];
                let qrow = q.row(qi);
                let mut exact = |id: usize| T::distance(metric, qrow, b.row(id));
                let sq = self.q_info[qi].expect("a normal query");
                let (q0, q1) = float_aux(metric, sq);
                let drow = &dots[i * m..(i + 1) * m];
                match metric {
                    Metric::L2 => {
                        let a = L2Approx {
                            qq: q0,
                            qn: q1,
                            xx: a0,
                            xn: a1,
                            c: c_l2,
                            abs,
                        };
                        scan_block(&a, drow, ids, top, &mut exact, lo);
                    }
                    Metric::InnerProduct => {
                        let a = IpApprox {
                            cq: c_ip * q0,
                            xn: a0,
                            abs,
                        };
                        scan_block(&a, drow, ids, top, &mut exact, lo);
                    }
                    Metric::Cosine => {
                        let a = CosApprox {
                            qinv: q0,
                            xinv: a0,
                            e: c_cos + abs,
                        };
                        scan_block(&a, drow, ids, top, &mut exact, lo);
                    }
                }
            }
            r0 = r1;
        }
    }

    /// The same selection as [`gemm_task`](Self::gemm_task) with the fused
    /// kernel (`fused` module): the same per-query and per-row bound values,
    /// laid out in vector lanes.
    fn fused_task(
        &self,
        kernel: CpuKernel,
        qr: &[usize],
        qbuf: &[f32],
        sr: std::ops::Range<usize>,
        tops: &mut [TopK],
        xbuf: &mut Vec<f32>,
    ) {
        let (b, q, metric, dim) = (self.b, self.q, self.metric, self.dim);
        let (c_l2, c_ip, c_cos, abs) = self.consts;
        let (qa, qb): (Vec<f32>, Vec<f32>) = qr
            .iter()
            .map(|&qi| {
                let (q0, q1) = float_aux(metric, self.q_info[qi].expect("a normal query"));
                match metric {
                    Metric::L2 => (q0, q1),
                    Metric::InnerProduct => (c_ip * q0, 0.0),
                    Metric::Cosine => (q0, 0.0),
                }
            })
            .unzip();
        let consts = match metric {
            Metric::L2 => fused::BoundConsts {
                metric,
                c: c_l2,
                e: abs,
            },
            Metric::InnerProduct => fused::BoundConsts {
                metric,
                c: 0.0,
                e: abs,
            },
            Metric::Cosine => fused::BoundConsts {
                metric,
                c: 0.0,
                e: c_cos + abs,
            },
        };
        // `qbuf` is empty where the queries are f32 rows already (the caller's choice).
        let rows: Vec<&[f32]> = match T::as_f32(q.data()) {
            Some(all) if qbuf.is_empty() => {
                qr.iter().map(|&i| &all[i * dim..(i + 1) * dim]).collect()
            }
            _ => qbuf.chunks_exact(dim).collect(),
        };
        let mut packed = fused::PackedQueries::new(kernel, dim, &rows, &qa, &qb);
        let mut exact = |i: usize, id: usize| T::distance(metric, q.row(qr[i]), b.row(id));
        let mut r0 = sr.start;
        while r0 < sr.end {
            let r1 = (r0 + self.rb).min(sr.end);
            let ids = &self.normal[r0..r1];
            // f32 rows are read in place (any ids); f16 rows are widened first.
            let rows: Vec<&[f32]> = match T::as_f32(b.data()) {
                Some(all) => ids.iter().map(|&r| &all[r * dim..(r + 1) * dim]).collect(),
                None => self.block_data(ids, xbuf).chunks_exact(dim).collect(),
            };
            let block = fused::RowBlock {
                rows: &rows,
                ids,
                xa: &self.aux0[r0..r1],
                xb: &self.aux1[r0..r1],
            };
            fused::scan_block(&mut packed, &block, consts, tops, &mut exact);
            r0 = r1;
        }
    }

    /// Queries `qr` over normal rows `sr` with the exact VNNI kernel (`vnni`
    /// module): the rows' bytes read in place, every candidate exact.
    fn vnni_task(
        &self,
        aux: &vnni::IntRows,
        qr: &[usize],
        sr: std::ops::Range<usize>,
        tops: &mut [TopK],
    ) {
        let (b, q, metric, dim) = (self.b, self.q, self.metric, self.dim);
        let (Some(bb), Some(qb)) = (T::bytes(b.data()), T::bytes(q.data())) else {
            unreachable!("float_search runs the VNNI kernel for i8 and u8 only")
        };
        let queries: Vec<&[u8]> = qr
            .iter()
            .map(|&i| &qb.data[i * dim..(i + 1) * dim])
            .collect();
        let mut packed = vnni::IntQueries::new(&queries, qb.signed, dim);
        let mut exact = |i: usize, id: usize| T::distance(metric, q.row(qr[i]), b.row(id));
        let mut r0 = sr.start;
        while r0 < sr.end {
            let r1 = (r0 + self.rb).min(sr.end);
            let ids = &self.normal[r0..r1];
            let rows: Vec<&[u8]> = ids
                .iter()
                .map(|&r| &bb.data[r * dim..(r + 1) * dim])
                .collect();
            let block = vnni::IntBlock {
                rows: &rows,
                ids,
                aux,
                at: r0,
            };
            vnni::scan_block(&mut packed, &block, bb.signed, metric, tops, &mut exact);
            r0 = r1;
        }
    }
}

/// `ids_only`: the caller reads `ids` alone, as a set, so a query whose
/// candidates were pruned to exactly `k` rows takes them in candidate order
/// without computing their exact distances (its `distances` are then the
/// rows' upper bounds, not reference distances). Which rows are returned
/// never changes.
fn float_search<T: FloatElem>(
    b: &Matrix<T>,
    q: &Matrix<T>,
    p: &SearchParams,
    kernel: CpuKernel,
    ids_only: bool,
) -> Neighbors {
    let (nq, dim, k, metric) = (q.rows(), b.dim(), p.k, p.metric);
    if nq == 0 {
        return padded(0, k);
    }
    if dim == 0 || (dim as f64 + 8.0) * f64::powi(2.0, -24) >= 0.5 {
        return reference_all(b, q, p);
    }
    let rows = allowed_rows(b.rows(), &p.filter);

    // Classify rows: normal ones get their norm data, special ones are exact.
    // The exact byte kernel, where it serves (i8/u8: `vnni` module), needs
    // only each row's exact sums, and only cosine's zero rows are special.
    let bytes = T::bytes(b.data()).filter(|_| kernel == CpuKernel::Avx512Vnni && vnni::serves(dim));
    let mut normal = Vec::with_capacity(rows.len());
    let (mut aux0, mut aux1) = (Vec::new(), Vec::new());
    let mut special = Vec::new();
    let int_rows = match bytes {
        Some(bytes) => {
            let sums = vnni::row_sums(bytes, dim, &rows);
            let mut kept = Vec::with_capacity(rows.len());
            for (&r, &(sum, sq)) in rows.iter().zip(&sums) {
                if metric == Metric::Cosine && sq == 0 {
                    special.push(r);
                } else {
                    normal.push(r);
                    kept.push((sum, sq));
                }
            }
            Some(vnni::IntRows::from_sums(bytes.signed, &kept))
        }
        None => {
            let row_info: Vec<Option<f64>> = rows
                .par_iter()
                .map_init(Vec::new, |buf, &r| float_info(b.row(r), metric, buf))
                .collect();
            for (&r, info) in rows.iter().zip(&row_info) {
                match info {
                    Some(sq) => {
                        let (a0, a1) = float_aux(metric, *sq);
                        normal.push(r);
                        aux0.push(a0);
                        aux1.push(a1);
                    }
                    None => special.push(r),
                }
            }
            None
        }
    };
    let q_info: Vec<Option<f64>> = (0..nq)
        .into_par_iter()
        .map_init(Vec::new, |buf, i| float_info(q.row(i), metric, buf))
        .collect();
    let normal_q: Vec<usize> = (0..nq).filter(|&i| q_info[i].is_some()).collect();

    let (c_l2, c_ip, c_cos, abs) = float_bound_consts(dim);
    let (qb, rb) = block_sizes(dim);
    let rb = match kernel {
        CpuKernel::Gemm => rb,
        _ if int_rows.is_some() => vnni::block_rows(dim),
        _ => fused::block_rows(dim),
    };
    let qblocks = split(normal_q.len(), normal_q.len().div_ceil(qb));
    let shards = if normal.is_empty() || normal_q.is_empty() {
        Vec::new()
    } else {
        split(normal.len(), shard_count(qblocks.len(), normal.len(), rb))
    };
    let n_shards = shards.len();
    let tasks: Vec<(usize, usize)> = (0..qblocks.len())
        .flat_map(|qi| (0..n_shards).map(move |s| (qi, s)))
        .collect();
    let ctx = FloatTask {
        b,
        q,
        metric,
        dim,
        rb,
        normal: &normal,
        aux0: &aux0,
        aux1: &aux1,
        q_info: &q_info,
        consts: (c_l2, c_ip, c_cos, abs),
        int_rows: int_rows.as_ref(),
    };

    let results: Vec<TaskCands> = tasks
        .par_iter()
        .map(|&(qbi, si)| {
            let qr = &normal_q[qblocks[qbi].clone()];
            let sr = shards[si].clone();
            let nqb = qr.len();
            // The fused kernels pack f32 queries straight from their rows;
            // the GEMM and the other types read a widened copy.
            let widened = ctx.int_rows.is_none()
                && (kernel == CpuKernel::Gemm || T::as_f32(q.data()).is_none());
            let mut qbuf = vec![0.0f32; if widened { nqb * dim } else { 0 }];
            for (i, &qi) in qr.iter().enumerate().filter(|_| widened) {
                T::widen(q.row(qi), &mut qbuf[i * dim..(i + 1) * dim]);
            }
            // Beyond the rows, k keeps nothing more: every row is kept anyway.
            with_tops(nqb, k.min(normal.len()), |tops| {
                with_scratch(|scratch| match kernel {
                    CpuKernel::Gemm => ctx.gemm_task(qr, &qbuf, sr, tops, scratch),
                    _ => match ctx.int_rows {
                        Some(aux) => ctx.vnni_task(aux, qr, sr, tops),
                        None => ctx.fused_task(kernel, qr, &qbuf, sr, tops, &mut scratch.xbuf),
                    },
                });
                TaskCands::take(tops)
            })
        })
        .collect();

    let place = block_places(&qblocks, &normal_q, nq);
    let mut out = padded(nq, k);
    out.ids
        .par_chunks_mut(k)
        .zip(out.distances.par_chunks_mut(k))
        .enumerate()
        .for_each_init(FinishScratch::default, |scratch, (qi, (ids, dists))| {
            let qrow = q.row(qi);
            if q_info[qi].is_none() {
                reference_query(metric, qrow, b, &rows, ids, dists);
                return;
            }
            let (bi, i) = place[qi];
            let pool = &mut scratch.pool;
            pool.clear();
            for s in 0..n_shards {
                pool.extend_from_slice(results[bi * n_shards + s].of(i));
            }
            for &r in &special {
                let d = nan_to_inf(T::distance(metric, qrow, b.row(r)));
                pool.push(Cand {
                    lo: d,
                    hi: d,
                    id: r,
                    exact: true,
                });
            }
            let mut exact = |id: usize| T::distance(metric, qrow, b.row(id));
            finish_query(scratch, k, ids_only, &mut exact, ids, dists);
        });
    out
}

/// (query block, index inside it) of every normal query, indexed by query
/// (`normal_q[qblocks[b]]` are block `b`'s queries); special queries are
/// never looked up.
fn block_places(
    qblocks: &[std::ops::Range<usize>],
    normal_q: &[usize],
    nq: usize,
) -> Vec<(usize, usize)> {
    let mut place = vec![(usize::MAX, usize::MAX); nq];
    for (bi, r) in qblocks.iter().enumerate() {
        for pos in r.clone() {
            place[normal_q[pos]] = (bi, pos - r.start);
        }
    }
    place
}

// ----- integers -------------------------------------------------------------------

pub(crate) trait IntElem: Element {
    /// Inner-dimension chunk over which an f32 GEMM of these values is exact.
    const CHUNK: usize;
    fn widen(src: &[Self], dst: &mut [f32]);
    fn sq(src: &[Self]) -> i64;
}
impl IntElem for i8 {
    const CHUNK: usize = 1024; // 1024 · 128² = 2²⁴
    fn widen(src: &[i8], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f32;
        }
    }
    fn sq(src: &[i8]) -> i64 {
        src.iter().map(|&v| (v as i64) * (v as i64)).sum()
    }
}
impl IntElem for u8 {
    const CHUNK: usize = 258; // 258 · 255² ≤ 2²⁴
    fn widen(src: &[u8], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f32;
        }
    }
    fn sq(src: &[u8]) -> i64 {
        src.iter().map(|&v| (v as i64) * (v as i64)).sum()
    }
}

fn int_search<T: IntElem>(b: &Matrix<T>, q: &Matrix<T>, p: &SearchParams) -> Neighbors {
    let (nq, dim, k, metric) = (q.rows(), b.dim(), p.k, p.metric);
    if nq == 0 {
        return padded(0, k);
    }
    if dim == 0 {
        return reference_all(b, q, p);
    }
    let rows = allowed_rows(b.rows(), &p.filter);
    let xx: Vec<f64> = rows.par_iter().map(|&r| T::sq(b.row(r)) as f64).collect();
    let xxf: Vec<f32> = xx.iter().map(|&v| v as f32).collect();
    let qq: Vec<f64> = (0..nq)
        .into_par_iter()
        .map(|i| T::sq(q.row(i)) as f64)
        .collect();

    let (qb, rb) = block_sizes(dim);
    let qblocks = split(nq, nq.div_ceil(qb));
    let shards = if rows.is_empty() {
        Vec::new()
    } else {
        split(rows.len(), shard_count(qblocks.len(), rows.len(), rb))
    };
    let n_shards = shards.len();
    let tasks: Vec<(usize, usize)> = (0..qblocks.len())
        .flat_map(|qi| (0..n_shards).map(move |s| (qi, s)))
        .collect();
    let results: Vec<TaskCands> = tasks
        .par_iter()
        .map(|&(qbi, si)| {
            let qr = qblocks[qbi].clone();
            let sr = shards[si].clone();
            let nqb = qr.len();
            let mut qbuf = vec![0.0f32; nqb * dim];
            for (i, qi) in qr.clone().enumerate() {
                T::widen(q.row(qi), &mut qbuf[i * dim..(i + 1) * dim]);
            }
            let blk = rb.min(sr.len());
            with_tops(nqb, k.min(rows.len()), |tops| {
                with_scratch(|scratch| {
                    let Scratch {
                        dots,
                        idots,
                        xbuf,
                        lo,
                    } = scratch;
                    let xbuf = at_least(xbuf, blk * dim);
                    let dots = at_least(dots, nqb * blk);
                    let idots = at_least(idots, if dim > T::CHUNK { nqb * blk } else { 0 });
                    let mut r0 = sr.start;
                    while r0 < sr.end {
                        let r1 = (r0 + rb).min(sr.end);
                        let m = r1 - r0;
                        let ids = &rows[r0..r1];
                        for (j, &r) in ids.iter().enumerate() {
                            T::widen(b.row(r), &mut xbuf[j * dim..(j + 1) * dim]);
                        }
                        let (xs, xsf) = (&xx[r0..r1], &xxf[r0..r1]);
                        if dim <= T::CHUNK {
                            // One exact chunk: the f32 products are the integers.
                            gemm_nt(nqb, m, dim, &qbuf, &xbuf[..m * dim], dim, dots);
                            let d = &dots[..nqb * m];
                            scan_int_block(metric, d, m, ids, tops, qr.start, &qq, xs, xsf, lo);
                        } else {
                            idots[..nqb * m].fill(0.0);
                            let mut c0 = 0;
                            while c0 < dim {
                                let c1 = (c0 + T::CHUNK).min(dim);
                                gemm_nt(
                                    nqb,
                                    m,
                                    c1 - c0,
                                    &qbuf[c0..],
                                    &xbuf[c0..m * dim],
                                    dim,
                                    dots,
                                );
                                for (acc, &v) in idots[..nqb * m].iter_mut().zip(&dots[..nqb * m]) {
                                    *acc += v as f64; // exact integers (module docs)
                                }
                                c0 = c1;
                            }
                            let d = &idots[..nqb * m];
                            scan_int_block(metric, d, m, ids, tops, qr.start, &qq, xs, xsf, lo);
                        }
                        r0 = r1;
                    }
                });
                TaskCands::take(tops)
            })
        })
        .collect();

    let mut out = padded(nq, k);
    out.ids
        .par_chunks_mut(k)
        .zip(out.distances.par_chunks_mut(k))
        .enumerate()
        .for_each_init(FinishScratch::default, |scratch, (qi, (ids, dists))| {
            let bi = qblocks.partition_point(|r| r.end <= qi);
            let i = qi - qblocks[bi].start;
            scratch.pool.clear();
            for s in 0..n_shards {
                scratch
                    .pool
                    .extend_from_slice(results[bi * n_shards + s].of(i));
            }
            let mut never =
                |_: usize| -> f32 { unreachable!("exact candidates are never recomputed") };
            finish_query(scratch, k, false, &mut never, ids, dists);
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::data::synthetic;
    use crate::search::Bitset;

    fn check(base: &Vectors, queries: &Vectors, p: &SearchParams) {
        let a = search_cpu(base, queries, p).unwrap();
        let r = search_reference(base, queries, p).unwrap();
        assert!(
            a.bitwise_eq(&r),
            "{:?} {} k={}: first difference at {:?}",
            base.dtype(),
            p.metric,
            p.k,
            a.first_difference(&r)
        );
    }

    /// A `k` beyond what memory holds is an error, not an abort (k = 2^40
    /// aborted in its allocation); a `k` beyond the rows pads as before.
    #[test]
    fn huge_k_is_an_error_and_k_beyond_the_rows_pads() {
        let (b, q) = synthetic(50, 8, 3, DType::F32, 1);
        let e = search_cpu(&b, &q, &SearchParams::new(1 << 40, Metric::L2)).unwrap_err();
        assert!(
            matches!(e, SearchError::ResultTooLarge { bytes: Some(_), .. }),
            "{e}"
        );
        assert!(e.to_string().contains("bytes"), "{e}");
        assert!(matches!(
            search_cpu(&b, &q, &SearchParams::new(usize::MAX, Metric::L2)),
            Err(SearchError::ResultTooLarge { bytes: None, .. })
        ));
        check(&b, &q, &SearchParams::new(70, Metric::L2));
        check(&b, &q, &SearchParams::new(50, Metric::Cosine));
    }

    /// Large candidate sets split the queries into runs that fit a quarter
    /// of the memory limit; a query whose own candidates do not fit is an
    /// error naming the sizes. The runs' results are the whole search's.
    #[test]
    fn queries_run_in_parts_when_their_candidates_are_large() {
        let limit = |bytes| {
            move || crate::search::data::MemoryLimit {
                bytes,
                source: "test",
            }
        };
        let never = || -> crate::search::data::MemoryLimit { panic!("small searches do not ask") };
        assert_eq!(queries_per_run(1000, 100_000, 10, 0, never).unwrap(), 1000);
        let (n, k) = (1_000_000, 999_999);
        let per = candidate_bytes_per_query(n, k);
        assert_eq!(per, n as u64 * std::mem::size_of::<Cand>() as u64);
        let threads = rayon::current_num_threads() as u64;
        // Beside 1 GB held, the rows' bookkeeping and the results, half of
        // the rest holds the threads' copies and 10 queries.
        let beside = (1 << 30) + n as u64 * ROW_BOOKKEEPING_BYTES + 1000 * k as u64 * 12;
        let fits = |queries: u64| limit(beside + 2 * (threads + queries) * per);
        assert_eq!(queries_per_run(1000, n, k, 1 << 30, fits(10)).unwrap(), 10);
        assert_eq!(
            queries_per_run(1000, n, k, 1 << 30, fits(5000)).unwrap(),
            1000
        );
        let e = queries_per_run(1000, n, k, 1 << 30, fits(0)).unwrap_err();
        assert!(
            matches!(e, SearchError::CandidatesTooLarge { bytes, .. } if bytes == per),
            "{e}"
        );
        for dtype in [DType::F32, DType::I8] {
            let (b, q) = synthetic(400, 16, 11, dtype, 4);
            for kernel in [CpuKernel::Gemm, CpuKernel::Avx2] {
                let p = SearchParams::new(9, Metric::L2);
                let whole = search_in_runs(&b, &q, &p, kernel.usable(), 11);
                let parts = search_in_runs(&b, &q, &p, kernel.usable(), 3);
                assert!(whole.bitwise_eq(&parts), "{dtype} {kernel:?}");
                assert_eq!((parts.nq, parts.ids.len()), (11, 99));
            }
        }
    }

    #[test]
    fn thread_counts_are_clamped_and_checked() {
        use std::ffi::OsStr;
        let t = |v: Option<&str>, cores| cpu_threads_for(v.map(OsStr::new), cores);
        assert_eq!(t(None, 8).unwrap().threads, 8);
        assert_eq!(t(Some(""), 8).unwrap().threads, 8);
        assert_eq!(t(Some("0"), 8).unwrap().threads, 8);
        assert_eq!(
            t(Some("3"), 8).unwrap(),
            CpuThreads {
                threads: 3,
                warning: None
            }
        );
        assert_eq!(t(Some("32"), 8).unwrap().threads, 32);
        let c = t(Some("100000"), 2).unwrap();
        assert_eq!(c.threads, 2 * MAX_THREADS_PER_CORE);
        let w = c.warning.unwrap();
        assert!(
            w.contains("RAYON_NUM_THREADS=100000") && !w.contains('\n'),
            "{w}"
        );
        for bad in ["abc", "-1", "2.5", " 4"] {
            let e = t(Some(bad), 2).unwrap_err();
            assert!(e.to_string().contains("RAYON_NUM_THREADS"), "{e}");
            assert_eq!(e.value, bad);
        }
    }

    #[test]
    fn matches_reference_small() {
        for dt in DType::ALL {
            let (b, q) = synthetic(700, 20, 9, dt, 11);
            for m in Metric::ALL {
                for k in [1, 7, 800] {
                    check(&b, &q, &SearchParams::new(k, m));
                    let f = Filter::Bitset(Bitset::random(700, 0.3, 2));
                    check(&b, &q, &SearchParams::new(k, m).with_filter(f));
                }
            }
        }
    }

    /// Every kernel this CPU can run against the reference, bit for bit, with
    /// shapes that leave partial panels (nq not a multiple of 16 or 64),
    /// partial tiles (rows not a multiple of 6), tiny and odd dims, filters
    /// (rows read at scattered ids) and k beyond the row count.
    #[test]
    fn every_kernel_matches_reference() {
        let kernels: Vec<CpuKernel> = CpuKernel::ALL
            .into_iter()
            .filter(|k| k.available())
            .collect();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            assert!(kernels.contains(&CpuKernel::Avx2));
        }
        for dt in DType::ALL {
            for (n, dim, nq) in [
                (700, 9, 20),
                (1031, 1, 70),
                (613, 33, 65),
                (257, 130, 17),
                (400, 12, 70),
                // One query: the VNNI kernel's single-query path (a dim of
                // whole 64-byte parts, one with a masked last part, one
                // below 64 bytes).
                (900, 128, 1),
                (333, 132, 1),
                (70, 12, 1),
            ] {
                let (b, q) = synthetic(n, dim, nq, dt, n as u64);
                for m in Metric::ALL {
                    for k in [1, 7, 800] {
                        let f = Filter::Bitset(Bitset::random(n, 0.3, 2));
                        for p in [
                            SearchParams::new(k, m),
                            SearchParams::new(k, m).with_filter(f),
                        ] {
                            let r = search_reference(&b, &q, &p).unwrap();
                            for &kern in &kernels {
                                let a = search_cpu_with(&b, &q, &p, kern).unwrap();
                                assert!(
                                    a.bitwise_eq(&r),
                                    "{kern} {dt:?} {m} n={n} dim={dim} nq={nq} k={k}: first difference at {:?}",
                                    a.first_difference(&r)
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn kernel_detection_picks_the_fastest_available() {
        let best = CpuKernel::detect();
        assert!(best.available());
        let faster: Vec<CpuKernel> = CpuKernel::ALL
            .into_iter()
            .skip_while(|&k| k != best)
            .skip(1)
            .collect();
        assert!(
            faster.iter().all(|k| !k.available()),
            "{best} chosen over {faster:?}"
        );
        for k in CpuKernel::ALL {
            assert_eq!(k.usable(), if k.available() { k } else { best });
        }
        assert_eq!(CpuKernel::Gemm.usable(), CpuKernel::Gemm);
        assert_eq!(CpuKernel::for_queries(1), CpuKernel::Gemm);
        assert_eq!(CpuKernel::for_queries(1000), best);
        // The byte kernel for i8/u8 from 1 query, where it runs and serves the dim.
        let vnni = best == CpuKernel::Avx512Vnni;
        for dt in DType::ALL {
            let bytes = matches!(dt, DType::I8 | DType::U8);
            assert_eq!(
                CpuKernel::for_search(dt, 128, 2) == CpuKernel::Avx512Vnni,
                vnni && bytes
            );
            assert_eq!(
                CpuKernel::for_search(dt, 128, 1),
                if vnni && bytes {
                    CpuKernel::Avx512Vnni
                } else {
                    CpuKernel::Gemm
                }
            );
            assert_eq!(
                CpuKernel::for_search(dt, 130, 100),
                CpuKernel::for_queries(100)
            );
        }
        let few = CpuKernel::for_queries(20);
        assert!(few.available());
        if matches!(best, CpuKernel::Avx512 | CpuKernel::Avx512Vnni) && CpuKernel::Avx2.available()
        {
            assert_eq!(few, CpuKernel::Avx2);
        }
    }

    #[test]
    fn duplicates_bound_the_candidates() {
        // 5000 identical rows: every distance ties; ids decide.
        let b = Vectors::f32(vec![0.5; 5000 * 8], 8).unwrap();
        let q = Vectors::f32(vec![0.25; 3 * 8], 8).unwrap();
        for m in Metric::ALL {
            let p = SearchParams::new(5, m);
            check(&b, &q, &p);
            let r = search_cpu(&b, &q, &p).unwrap();
            assert_eq!(r.ids_of(0), &[0, 1, 2, 3, 4]);
        }
    }

    #[test]
    fn nearest_rows_are_search_cpus_first_ids() {
        use crate::search::data::synthetic;
        // Near-duplicate rows (ties and near-ties), a zero row and a NaN row
        // (special for cosine / every metric), zero and huge queries.
        let (base, queries) = synthetic(3000, 24, 300, DType::F32, 11);
        let (Vectors::F32(mut b), Vectors::F32(mut q)) = (base, queries) else {
            unreachable!()
        };
        let dim = b.dim();
        let row7 = b.row(7).to_vec();
        for r in [8, 9, 2999] {
            b.data[r * dim..(r + 1) * dim].copy_from_slice(&row7);
        }
        b.data[10 * dim] = f32::from_bits(row7[0].to_bits() + 1);
        b.data[20 * dim..21 * dim].fill(0.0);
        b.data[30 * dim + 3] = f32::NAN;
        q.data[..dim].fill(0.0);
        q.data[dim..2 * dim].copy_from_slice(&row7);
        q.data[2 * dim] = 1e30;
        for metric in Metric::ALL {
            let want = search_cpu(
                &Vectors::F32(b.clone()),
                &Vectors::F32(q.clone()),
                &SearchParams::new(1, metric),
            )
            .unwrap();
            let got = nearest_rows(&b, &q, metric, 1).unwrap();
            let want: Vec<usize> = want.ids.iter().map(|&i| i as usize).collect();
            assert_eq!(got, want, "{metric}");
            // k > 1: the same set per query.
            let k = 7;
            let want = search_cpu(
                &Vectors::F32(b.clone()),
                &Vectors::F32(q.clone()),
                &SearchParams::new(k, metric),
            )
            .unwrap();
            let got = nearest_rows(&b, &q, metric, k).unwrap();
            for (g, w) in got.chunks(k).zip(want.ids.chunks(k)) {
                let mut g = g.to_vec();
                let mut w: Vec<usize> = w.iter().map(|&i| i as usize).collect();
                g.sort_unstable();
                w.sort_unstable();
                assert_eq!(g, w, "{metric} k {k}");
            }
        }
        assert!(matches!(
            nearest_rows(&b, &q, Metric::L2, 0),
            Err(SearchError::InvalidK { k: 0 })
        ));
        let other = Matrix::new(vec![0.0; 5], 1, 5).unwrap();
        assert!(matches!(
            nearest_rows(&b, &other, Metric::L2, 1),
            Err(SearchError::DimensionMismatch { .. })
        ));
    }

    #[test]
    fn bounds_are_generous_but_small() {
        let (l2, ip, cos, abs) = float_bound_consts(128);
        assert!(l2 > 0.0 && l2 < 1e-4 && ip < 1e-4 && cos < 1e-4 && abs > 0.0);
        assert_eq!(split(10, 3), vec![0..3, 3..6, 6..10]);
        assert_eq!(split(0, 3), vec![0..0]);
    }

    #[test]
    fn pair_distances_follow_the_readme() {
        assert_eq!(distance(Metric::L2, &[1.0f32, 2.0], &[3.0, 5.0]), 13.0);
        assert_eq!(
            distance(Metric::InnerProduct, &[1.0f32, 2.0], &[3.0, 5.0]),
            -13.0
        );
        assert_eq!(distance(Metric::Cosine, &[0.0f32, 0.0], &[3.0, 5.0]), 1.0);
        assert_eq!(distance::<i8>(Metric::L2, &[-128], &[127]), 65025.0);
        assert_eq!(
            distance::<u8>(Metric::InnerProduct, &[255], &[255]),
            -65025.0
        );
        let e: [f32; 0] = [];
        assert_eq!(
            distance(Metric::InnerProduct, &e, &e).to_bits(),
            (-0.0f32).to_bits()
        );
    }
}
