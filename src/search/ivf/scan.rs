//! The multithreaded CPU search of an [`IvfIndex`] (definition: [`super`]).
//!
//! 1. Probed lists: [`search_cpu`] with the centroids as the base and
//!    `k = nprobe` — the exact top-`nprobe` by the fold, GEMM-selected.
//! 2. Queries are cut into blocks (rayon tasks). Inside a block the
//!    (list, query) pairs are sorted by list, so each 32-row group of a list is
//!    brought into dimension-major form once ([`to_dim_major`]) and then
//!    scanned by every query of the block that probes the list: the group stays
//!    in L1 while the queries stream past it.
//! 3. The scan computes 32 rows' distances at once, one SIMD lane per row, each
//!    lane folding its row in dimension order with exactly the operations of
//!    [`distance`](crate::search::distance) (f32 `mul_add` / wrapping i32), so
//!    every distance is the reference's bit for bit; the per-query [`TopK`]
//!    keeps the `k` smallest `(distance, id)` keys.

use half::f16;
use rayon::prelude::*;

use super::build::{with_lists_and_queries, List};
use super::coarse::probe_lists;
use super::lanes::{fold_f32, fold_i32, Fold};
use super::layout::{f32x4_to_dim_major, to_dim_major, GROUP};
use super::topk::TopK;
use super::{IvfError, IvfIndex};
use crate::search::cpu::{ensure_threads, finalize_cosine, nan_to_inf, padded, Element};
use crate::search::{DType, Filter, Matrix, Metric, Neighbors, SearchError, Vectors};

/// What to search for in an IVF index (the metric is the index's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IvfSearchParams {
    /// Neighbours per query, ≥ 1 (padded like brute force when fewer rows are scanned).
    pub k: usize,
    /// Lists probed per query, ≥ 1; more than `nlist` means all of them.
    pub nprobe: usize,
    /// Which dataset ids may appear in the results.
    pub filter: Filter,
}

impl IvfSearchParams {
    pub fn new(k: usize, nprobe: usize) -> Self {
        IvfSearchParams {
            k,
            nprobe,
            filter: Filter::None,
        }
    }

    pub fn with_filter(mut self, filter: Filter) -> Self {
        self.filter = filter;
        self
    }
}

/// An element type's lane arithmetic: f32 for the floats, wrapping i32 for
/// the integers (whose accumulators the reference keeps in i32 / u32: the same
/// bits under wrapping addition).
pub(crate) trait ScanElem: Element {
    type W: Copy + Default + Send + Sync;
    fn widen(self) -> Self::W;
    /// `Σ v_j²` by the fold (in order).
    fn norm(v: &[Self::W]) -> Self::W;
    /// The 32 distances of one query against one dimension-major group
    /// (`simd`: the AVX2 lanes, only where avx2 and fma were detected).
    fn group(g: &GroupArgs<'_, Self::W>, out: &mut [f32; GROUP], simd: bool);
    /// The group itself when it is already dimension-major lanes (f32, veclen 1).
    fn as_lanes(group: &[Self], veclen: usize) -> Option<&[Self::W]>;
    /// Writes the group dimension-major into `out`.
    #[inline(always)]
    fn lanes_into(group: &[Self], dim: usize, veclen: usize, out: &mut [Self::W], simd: bool) {
        let _ = simd;
        to_dim_major(group, dim, veclen, Self::widen, out)
    }
}

/// One query against one group.
pub(crate) struct GroupArgs<'a, W> {
    pub(crate) metric: Metric,
    pub(crate) q: &'a [W],
    pub(crate) qq: W,
    pub(crate) gx: &'a [W],
    pub(crate) xx: &'a [W; GROUP],
}

#[inline(always)]
pub(crate) fn float_group(g: &GroupArgs<'_, f32>, out: &mut [f32; GROUP], simd: bool) {
    let fold = if g.metric == Metric::L2 {
        Fold::L2
    } else {
        Fold::Dot
    };
    fold_f32(fold, g.q, g.gx, out, simd);
    match g.metric {
        Metric::L2 => {}
        Metric::InnerProduct => out.iter_mut().for_each(|a| *a = -*a),
        Metric::Cosine => {
            for (a, &x) in out.iter_mut().zip(g.xx) {
                *a = finalize_cosine(*a, g.qq, x);
            }
        }
    }
}

#[inline(always)]
fn int_group(
    g: &GroupArgs<'_, i32>,
    conv: impl Fn(i32) -> f32,
    out: &mut [f32; GROUP],
    simd: bool,
) {
    let fold = if g.metric == Metric::L2 {
        Fold::L2
    } else {
        Fold::Dot
    };
    let mut acc = [0i32; GROUP];
    fold_i32(fold, g.q, g.gx, &mut acc, simd);
    for ((o, &a), &x) in out.iter_mut().zip(&acc).zip(g.xx) {
        *o = match g.metric {
            Metric::L2 => conv(a),
            Metric::InnerProduct => -conv(a),
            Metric::Cosine => finalize_cosine(conv(a), conv(g.qq), conv(x)),
        };
    }
}

macro_rules! float_elem {
    ($t:ty, $widen:expr, $lanes:ident, $into:ident) => {
        impl ScanElem for $t {
            type W = f32;
            #[inline(always)]
            fn widen(self) -> f32 {
                $widen(self)
            }
            #[inline(always)]
            fn norm(v: &[f32]) -> f32 {
                v.iter().fold(0.0f32, |a, &x| x.mul_add(x, a))
            }
            #[inline(always)]
            fn group(g: &GroupArgs<'_, f32>, out: &mut [f32; GROUP], simd: bool) {
                float_group(g, out, simd)
            }
            #[inline(always)]
            fn as_lanes(group: &[$t], veclen: usize) -> Option<&[f32]> {
                $lanes(group, veclen)
            }
            #[inline(always)]
            fn lanes_into(group: &[$t], dim: usize, veclen: usize, out: &mut [f32], simd: bool) {
                $into(group, dim, veclen, out, simd)
            }
        }
    };
}
fn f32_lanes(g: &[f32], veclen: usize) -> Option<&[f32]> {
    (veclen == 1).then_some(g)
}
fn f16_lanes(_: &[f16], _: usize) -> Option<&[f32]> {
    None
}
#[inline(always)]
fn f32_into(g: &[f32], dim: usize, veclen: usize, out: &mut [f32], simd: bool) {
    if veclen == 4 {
        f32x4_to_dim_major(g, dim, out, simd)
    } else {
        to_dim_major(g, dim, veclen, |x| x, out)
    }
}
#[inline(always)]
fn f16_into(g: &[f16], dim: usize, veclen: usize, out: &mut [f32], _: bool) {
    to_dim_major(g, dim, veclen, f16::to_f32, out)
}
float_elem!(f32, |v: f32| v, f32_lanes, f32_into);
float_elem!(f16, |v: f16| v.to_f32(), f16_lanes, f16_into);

macro_rules! int_elem {
    ($t:ty, $conv:expr) => {
        impl ScanElem for $t {
            type W = i32;
            #[inline(always)]
            fn widen(self) -> i32 {
                self as i32
            }
            #[inline(always)]
            fn norm(v: &[i32]) -> i32 {
                v.iter()
                    .fold(0i32, |a, &x| a.wrapping_add(x.wrapping_mul(x)))
            }
            #[inline(always)]
            fn group(g: &GroupArgs<'_, i32>, out: &mut [f32; GROUP], simd: bool) {
                int_group(g, $conv, out, simd)
            }
            #[inline(always)]
            fn as_lanes(_: &[$t], _: usize) -> Option<&[i32]> {
                None
            }
        }
    };
}
// i8 accumulates in i32, u8 in u32 (the same bits under wrapping addition).
int_elem!(i8, |a: i32| a as f32);
int_elem!(u8, |a: i32| (a as u32) as f32);

/// One query block's work.
struct Block<'a, E: ScanElem> {
    metric: Metric,
    dim: usize,
    veclen: usize,
    lists: &'a [List<E>],
    filter: &'a Filter,
    /// Widened queries of the block (`nb × dim`) and their norms.
    q: Vec<E::W>,
    qq: Vec<E::W>,
    /// (list, query in block), sorted.
    pairs: Vec<(u32, u32)>,
}

#[inline(always)]
fn scan_block<E: ScanElem, const SIMD: bool>(b: &Block<'_, E>, tops: &mut [TopK]) {
    let dim = b.dim;
    let mut buf = vec![E::W::default(); GROUP * dim];
    let mut xx = [E::W::default(); GROUP];
    let mut out = [0.0f32; GROUP];
    let mut col = vec![E::W::default(); dim];
    let mut start = 0;
    while start < b.pairs.len() {
        let l = b.pairs[start].0;
        let end = start + b.pairs[start..].iter().take_while(|p| p.0 == l).count();
        let list = &b.lists[l as usize];
        let len = list.ids.len();
        for (g, group) in list.data.chunks_exact(GROUP * dim).enumerate() {
            let gx: &[E::W] = match E::as_lanes(group, b.veclen) {
                Some(lanes) => lanes,
                None => {
                    E::lanes_into(group, dim, b.veclen, &mut buf, SIMD);
                    &buf
                }
            };
            if b.metric == Metric::Cosine {
                for (r, x) in xx.iter_mut().enumerate() {
                    for (j, c) in col.iter_mut().enumerate() {
                        *c = gx[j * GROUP + r];
                    }
                    *x = E::norm(&col);
                }
            }
            let valid = (len - g * GROUP).min(GROUP);
            let ids = &list.ids[g * GROUP..g * GROUP + valid];
            for &(_, qi) in &b.pairs[start..end] {
                let qi = qi as usize;
                let args = GroupArgs {
                    metric: b.metric,
                    q: &b.q[qi * dim..(qi + 1) * dim],
                    qq: b.qq[qi],
                    gx,
                    xx: &xx,
                };
                E::group(&args, &mut out, SIMD);
                let top = &mut tops[qi];
                let bound = top.bound();
                for (&d, &id) in out.iter().zip(ids) {
                    let d = nan_to_inf(d);
                    if d <= bound && b.filter.allows(id as usize) {
                        top.offer(d, id);
                    }
                }
            }
        }
        start = end;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scan_block_avx2<E: ScanElem>(b: &Block<'_, E>, tops: &mut [TopK]) {
    scan_block::<E, true>(b, tops)
}

fn run_block<E: ScanElem>(b: &Block<'_, E>, tops: &mut [TopK]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked above).
        return unsafe { scan_block_avx2(b, tops) };
    }
    scan_block::<E, false>(b, tops)
}

/// Queries per block: two blocks per thread (balance), at most 1024 queries.
/// Larger blocks let more queries share each prepared group (a block with
/// `qb · nprobe / nlist` queries per list); 1024 keeps a block's widened
/// queries and tops within a few MiB.
fn block_size(nq: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    nq.div_ceil(2 * threads).clamp(1, 1024)
}

fn search_typed<E: ScanElem>(
    index: &IvfIndex,
    lists: &[List<E>],
    queries: &Matrix<E>,
    probes: &[i64],
    nprobe: usize,
    p: &IvfSearchParams,
) -> Neighbors {
    let (nq, k, dim) = (queries.rows(), p.k, index.dim);
    let mut res = padded(nq, k);
    let qb = block_size(nq);
    res.ids
        .par_chunks_mut(qb * k)
        .zip(res.distances.par_chunks_mut(qb * k))
        .enumerate()
        .for_each(|(bi, (ids, dists))| {
            let q0 = bi * qb;
            let nb = ids.len() / k;
            let mut q = Vec::with_capacity(nb * dim);
            let mut qq = Vec::with_capacity(nb);
            for i in 0..nb {
                let start = q.len();
                q.extend(queries.row(q0 + i).iter().map(|&e| e.widen()));
                qq.push(E::norm(&q[start..]));
            }
            let mut pairs: Vec<(u32, u32)> = (0..nb)
                .flat_map(|i| {
                    probes[(q0 + i) * nprobe..(q0 + i + 1) * nprobe]
                        .iter()
                        .filter(|&&l| l >= 0)
                        .map(move |&l| (l as u32, i as u32))
                })
                .collect();
            pairs.sort_unstable();
            let block = Block {
                metric: index.metric.metric,
                dim,
                veclen: index.veclen,
                lists,
                filter: &p.filter,
                q,
                qq,
                pairs,
            };
            let mut tops: Vec<TopK> = (0..nb).map(|_| TopK::new(k)).collect();
            run_block(&block, &mut tops);
            for (i, top) in tops.into_iter().enumerate() {
                top.write(&mut ids[i * k..(i + 1) * k], &mut dists[i * k..(i + 1) * k]);
            }
        });
    res
}

/// Checks the queries and parameters against the index.
pub fn validate_ivf(
    index: &IvfIndex,
    queries: &Vectors,
    p: &IvfSearchParams,
) -> Result<(), IvfError> {
    check_queries(index.dtype(), index.dim, index.n, queries, p)
}

/// The checks of [`validate_ivf`] against an index of `n` rows of `dim`
/// `dtype` elements (shared by the CPU and GPU paths).
pub(crate) fn check_queries(
    dtype: DType,
    dim: usize,
    n: usize,
    queries: &Vectors,
    p: &IvfSearchParams,
) -> Result<(), IvfError> {
    if queries.dtype() != dtype {
        return Err(IvfError::DTypeMismatch {
            index: dtype,
            queries: queries.dtype(),
        });
    }
    if queries.dim() != dim {
        return Err(SearchError::DimensionMismatch {
            base: dim,
            queries: queries.dim(),
        }
        .into());
    }
    if p.k == 0 {
        return Err(SearchError::InvalidK { k: 0 }.into());
    }
    if p.nprobe == 0 {
        return Err(IvfError::NprobeZero { nprobe: 0 });
    }
    if queries
        .rows()
        .checked_mul(p.k)
        .is_none_or(|s| s > isize::MAX as usize / 8)
    {
        return Err(SearchError::ResultTooLarge {
            nq: queries.rows(),
            k: p.k,
        }
        .into());
    }
    if let Filter::Bitset(b) = &p.filter {
        b.validate(n)?;
    }
    Ok(())
}

/// Approximate k-NN by the IVF-Flat definition ([`super`]), multithreaded on
/// rayon's current pool. Equal bit for bit to
/// [`search_ivf_reference`](super::search_ivf_reference).
pub fn search_ivf(
    index: &IvfIndex,
    queries: &Vectors,
    p: &IvfSearchParams,
) -> Result<Neighbors, IvfError> {
    validate_ivf(index, queries, p)?;
    ensure_threads();
    let nprobe = p.nprobe.min(index.nlist());
    let probes = probe_lists(index, queries, nprobe)?;
    let mut res = with_lists_and_queries!(&index.lists, queries, l, q => {
        search_typed(index, l, q, &probes, nprobe, p)
    });
    let post = index.metric.post;
    res.distances.iter_mut().for_each(|d| *d = post.apply(*d));
    Ok(res)
}
