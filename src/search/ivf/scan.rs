//! The multithreaded CPU search of an [`IvfIndex`] (definition: [`super`]).
//!
//! 1. Probed lists: [`search_cpu`](crate::search::search_cpu) with the
//!    centroids as the base and `k = nprobe` — the exact top-`nprobe` by the
//!    fold, GEMM-selected.
//! 2. Queries are cut into blocks (rayon tasks). Inside a block the
//!    (list, query) pairs are sorted by list, so each 32-row group of a list is
//!    brought into dimension-major form once ([`to_dim_major`]) and then
//!    scanned by every query of the block that probes the list: the group stays
//!    in L1 while the queries stream past it.
//! 3. The scan computes 32 rows' distances at once, one SIMD lane per row, each
//!    lane folding its row in dimension order with exactly the operations of
//!    [`distance`](crate::search::distance) (f32 `mul_add` / wrapping i32), so
//!    every distance is the reference's bit for bit; the per-query `topk::TopK`
//!    keeps the `k` smallest `(distance, id)` keys. The queries of a list are
//!    folded two at a time (`lanes::fold_f32_pair` for the floats): twice the
//!    independent fma chains and one load of each group column for both, which
//!    matters most at small `nprobe`, where a list has only a few queries.

use half::f16;
use rayon::prelude::*;

use super::build::{with_lists_and_queries, List};
use super::coarse::probe_lists;
use super::lanes::{fold_f32, fold_f32_pair, fold_i32, Fold};
use super::layout::{f32x4_to_dim_major, to_dim_major, GROUP};
use super::topk::TopK;
use super::{IvfError, IvfIndex};
use crate::search::cpu::{
    ensure_threads, finalize_cosine, nan_to_inf, padded, sq_norm_f32, Element,
};
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
    /// [`ScanElem::group`] for two queries against the same group (the
    /// floats fold both at once: [`fold_f32_pair`]).
    #[inline(always)]
    fn group_pair(g: [&GroupArgs<'_, Self::W>; 2], out: [&mut [f32; GROUP]; 2], simd: bool) {
        let [o0, o1] = out;
        Self::group(g[0], o0, simd);
        Self::group(g[1], o1, simd);
    }
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
    finish_float(g, out);
}

/// [`float_group`] for two queries against the same group
/// ([`fold_f32_pair`]): the same bits as two calls.
#[inline(always)]
pub(crate) fn float_group_pair(
    g: [&GroupArgs<'_, f32>; 2],
    out: [&mut [f32; GROUP]; 2],
    simd: bool,
) {
    let fold = if g[0].metric == Metric::L2 {
        Fold::L2
    } else {
        Fold::Dot
    };
    let [o0, o1] = out;
    fold_f32_pair(fold, [g[0].q, g[1].q], g[0].gx, [&mut *o0, &mut *o1], simd);
    finish_float(g[0], o0);
    finish_float(g[1], o1);
}

/// The metric's finalisation of folded f32 lanes.
#[inline(always)]
fn finish_float(g: &GroupArgs<'_, f32>, out: &mut [f32; GROUP]) {
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
                sq_norm_f32(v)
            }
            #[inline(always)]
            fn group(g: &GroupArgs<'_, f32>, out: &mut [f32; GROUP], simd: bool) {
                float_group(g, out, simd)
            }
            #[inline(always)]
            fn group_pair(g: [&GroupArgs<'_, f32>; 2], out: [&mut [f32; GROUP]; 2], simd: bool) {
                float_group_pair(g, out, simd)
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
    /// Widened queries of the pass (`nb × dim`) and their norms.
    q: &'a [E::W],
    qq: &'a [E::W],
    /// (list, query in pass), sorted: this task's share.
    pairs: &'a [(u32, u32)],
}

#[inline(always)]
fn scan_block<E: ScanElem, const SIMD: bool>(b: &Block<'_, E>, tops: &mut [TopK]) {
    let dim = b.dim;
    let mut buf = vec![E::W::default(); GROUP * dim];
    let mut xx = [E::W::default(); GROUP];
    let (mut out, mut out2) = ([0.0f32; GROUP], [0.0f32; GROUP]);
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
            let args = |qi: u32| {
                let qi = qi as usize;
                GroupArgs {
                    metric: b.metric,
                    q: &b.q[qi * dim..(qi + 1) * dim],
                    qq: b.qq[qi],
                    gx,
                    xx: &xx,
                }
            };
            // Queries two at a time (the pair fold), an odd one alone.
            let mut two = b.pairs[start..end].chunks_exact(2);
            for p in &mut two {
                let (qa, qb) = (p[0].1, p[1].1);
                E::group_pair([&args(qa), &args(qb)], [&mut out, &mut out2], SIMD);
                offer_group(&mut tops[qa as usize], &out, ids, b.filter);
                offer_group(&mut tops[qb as usize], &out2, ids, b.filter);
            }
            for &(_, qi) in two.remainder() {
                E::group(&args(qi), &mut out, SIMD);
                offer_group(&mut tops[qi as usize], &out, ids, b.filter);
            }
        }
        start = end;
    }
}

/// Offers one query the valid rows of a scanned group.
#[inline(always)]
fn offer_group(top: &mut TopK, out: &[f32; GROUP], ids: &[i64], filter: &Filter) {
    let bound = top.bound();
    for (&d, &id) in out.iter().zip(ids) {
        let d = nan_to_inf(d);
        if d <= bound && filter.allows(id as usize) {
            top.offer(d, id);
        }
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

/// Queries per pass: each task keeps a top-k per query of the pass, so a
/// pass bounds that memory (tasks × 16384 × k keys).
const PASS_QUERIES: usize = 16_384;

/// Cuts the sorted pairs into about `parts` ranges of similar work (rows to
/// scan), each boundary moved to the next list boundary so that every list's
/// groups are prepared by one task only.
fn split_by_work(
    pairs: &[(u32, u32)],
    work: impl Fn(u32) -> usize,
    parts: usize,
) -> Vec<std::ops::Range<usize>> {
    let total: usize = pairs.iter().map(|p| work(p.0)).sum();
    let (mut out, mut start, mut acc, mut i) = (Vec::new(), 0, 0usize, 0);
    for t in 1..=parts.max(1) {
        let target = total / parts.max(1) * t + total % parts.max(1) * t / parts.max(1);
        while i < pairs.len() && acc < target {
            acc += work(pairs[i].0);
            i += 1;
        }
        while i > 0 && i < pairs.len() && pairs[i].0 == pairs[i - 1].0 {
            acc += work(pairs[i].0);
            i += 1;
        }
        if i > start {
            out.push(start..i);
            start = i;
        }
    }
    if start < pairs.len() {
        out.push(start..pairs.len());
    }
    out
}

/// The scan, parallel over lists: the (list, query) pairs of a pass are sorted
/// by list and cut into tasks of similar work, so every 32-row group is
/// prepared once per pass and shared by all the queries probing its list
/// (`nq · nprobe / nlist` on average, however many threads run); each task
/// keeps partial top-k's that are merged per query at the end (exact: the keys
/// are totally ordered, so the merge is order-independent).
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
    let tasks = 4 * rayon::current_num_threads().max(1);
    for q0 in (0..nq).step_by(PASS_QUERIES) {
        let nb = (nq - q0).min(PASS_QUERIES);
        let mut q = vec![E::W::default(); nb * dim];
        q.par_chunks_mut(dim).enumerate().for_each(|(i, row)| {
            for (o, &e) in row.iter_mut().zip(queries.row(q0 + i)) {
                *o = e.widen();
            }
        });
        let qq: Vec<E::W> = q.par_chunks(dim).map(E::norm).collect();
        let mut pairs: Vec<(u32, u32)> = (0..nb)
            .flat_map(|i| {
                probes[(q0 + i) * nprobe..(q0 + i + 1) * nprobe]
                    .iter()
                    .filter(|&&l| l >= 0)
                    .map(move |&l| (l as u32, i as u32))
            })
            .collect();
        pairs.par_sort_unstable();
        let ranges = split_by_work(&pairs, |l| lists[l as usize].ids.len() + 1, tasks);
        let partial: Vec<Vec<TopK>> = ranges
            .into_par_iter()
            .map(|r| {
                let block = Block {
                    metric: index.metric.metric,
                    dim,
                    veclen: index.veclen,
                    lists,
                    filter: &p.filter,
                    q: &q,
                    qq: &qq,
                    pairs: &pairs[r],
                };
                let mut tops: Vec<TopK> = (0..nb).map(|_| TopK::new(k)).collect();
                run_block(&block, &mut tops);
                tops
            })
            .collect();
        res.ids[q0 * k..(q0 + nb) * k]
            .par_chunks_mut(k)
            .zip(res.distances[q0 * k..(q0 + nb) * k].par_chunks_mut(k))
            .enumerate()
            .for_each(|(i, (ids, dists))| {
                let mut top = TopK::new(k);
                for part in &partial {
                    for &(d, id) in part[i].keys() {
                        top.offer(d, id);
                    }
                }
                top.write(ids, dists);
            });
    }
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
    crate::search::check_result_size(queries.rows(), p.k)?;
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
    let search = || {
        let nprobe = p.nprobe.min(index.nlist());
        let probes = probe_lists(index, queries, nprobe)?;
        let mut res = with_lists_and_queries!(&index.lists, queries, l, q => {
            search_typed(index, l, q, &probes, nprobe, p)
        });
        let post = index.metric.post;
        res.distances.iter_mut().for_each(|d| *d = post.apply(*d));
        Ok(res)
    };
    if rayon::current_thread_index().is_some() {
        return search();
    }
    // From outside the pool, every parallel step of the search would be
    // handed to the pool and waited for (about ten hand-offs, each a thread
    // wake-up): move the whole search into the pool once instead. A small
    // search's time was mostly these hand-offs.
    rayon::join(search, || ()).0
}

#[cfg(test)]
mod tests {
    use super::split_by_work;

    #[test]
    fn work_ranges_cover_the_pairs_and_never_split_a_list() {
        let pairs: Vec<(u32, u32)> = [0, 0, 1, 2, 2, 2, 2, 5, 6, 6, 9]
            .iter()
            .enumerate()
            .map(|(q, &l)| (l, q as u32))
            .collect();
        for parts in [1, 2, 3, 4, 20] {
            let r = split_by_work(&pairs, |l| l as usize + 1, parts);
            assert_eq!(r.first().unwrap().start, 0);
            assert_eq!(r.last().unwrap().end, pairs.len());
            for w in r.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_ne!(pairs[w[0].end - 1].0, pairs[w[1].start].0, "{parts}: {r:?}");
            }
            assert!(r.len() <= parts);
        }
        assert!(split_by_work(&[], |_| 1, 4).is_empty());
    }
}
