//! The coarse step: each query's `nprobe` nearest centroids by the exact
//! definition ([`super`], step 1) — the f32 in-order fold of the index metric,
//! NaN → `+inf`, ties to the smaller list; the same set of lists as
//! [`search_cpu`](crate::search::search_cpu) over the centroids. Only the set
//! is defined: the scan's top-k does not depend on the order lists are
//! visited in, so the GEMM way skips ordering them by exact distance.
//!
//! Two ways to the same answer, chosen by `nprobe`:
//! - up to [`GEMM_MAX_NPROBE`]: `search_cpu`'s candidate selection
//!   (`nearest_rows`: GEMM-selected candidates; an exact re-rank only where
//!   more than `nprobe` can win);
//! - above: with `k = nprobe` in the tens and only `nlist` (~1000) rows,
//!   `search_cpu` keeps many candidates whose exact re-rank (a scalar fold
//!   each) costs more than folding every centroid exactly, so the centroids
//!   are laid out like a veclen-1 list (groups of 32, dimension-major) once
//!   per search and every query folds all of them with the scan's 32-lane
//!   kernel (`scan::float_group`).
//!
//! Measured here (2000 queries, 1024 × 128 centroids, one thread, medians of
//! 7): nprobe 1: GEMM 7.9 ms, lanes 14.0 ms; 4: 10.6 / 14.5; 16: 24.6 / 21.9;
//! 64: 63.1 / 45.7. Below [`GEMM_MIN_QUERIES`] queries the lanes take every
//! `nprobe`: `search_cpu`'s fixed costs per call (classifying and packing all
//! centroids, its tasks) are about 0.1 ms, a one-query fold of 1024 × 128
//! centroids a few µs (the lanes are laid out once per index and kept).

use std::borrow::Cow;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::kmeans::gather_f32;

use super::layout::{to_dim_major, GROUP};
use super::scan::{float_group, GroupArgs};
use super::topk::TopK;
use super::{IvfError, IvfIndex};
use crate::search::cpu::{ensure_threads, nan_to_inf, nearest_rows, sq_norm_f32};
use crate::search::Vectors;

/// Centroids as dimension-major groups of 32 (zero-padded) and their squared
/// norms by the fold (cosine's `xx`).
#[derive(Debug, Clone)]
struct Lanes {
    groups: Vec<f32>,
    norms: Vec<f32>,
}

/// An index's [`Lanes`], laid out on first use and kept (a copy of the
/// centroids: laying them out per search cost more than a one-query search's
/// folds). Derived from the centroids, so it never makes two indexes differ.
#[derive(Debug, Clone, Default)]
pub(crate) struct CoarseLanes(OnceLock<Lanes>);

impl PartialEq for CoarseLanes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

fn lanes(index: &IvfIndex) -> Lanes {
    let c = &index.centroids;
    let (nlist, dim) = (c.rows(), c.dim());
    let n_groups = nlist.div_ceil(GROUP);
    let mut padded = c.data().to_vec();
    padded.resize(n_groups * GROUP * dim, 0.0);
    let mut groups = vec![0.0f32; padded.len()];
    for (src, dst) in padded
        .chunks_exact(GROUP * dim)
        .zip(groups.chunks_exact_mut(GROUP * dim))
    {
        // Row-major 32 × dim is the interleaved layout with veclen = dim.
        to_dim_major(src, dim, dim, |x| x, dst);
    }
    let norms = padded.chunks_exact(dim).map(sq_norm_f32).collect();
    Lanes { groups, norms }
}

fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Largest `nprobe` the coarse step leaves to `search_cpu` (module docs).
pub const GEMM_MAX_NPROBE: usize = 8;

/// Fewest queries the coarse step leaves to `search_cpu`: below, its fixed
/// costs per search (classifying every centroid, packing, tasks) outweigh
/// folding every centroid exactly (module docs).
pub const GEMM_MIN_QUERIES: usize = 32;

/// The probed lists of every query (`nq × nprobe`, row-major, each query's
/// lists in no particular order; `nprobe` clamped to `1..=nlist`),
/// multithreaded.
pub fn probe_lists(
    index: &IvfIndex,
    queries: &Vectors,
    nprobe: usize,
) -> Result<Vec<i64>, IvfError> {
    if nprobe.clamp(1, index.nlist()) <= GEMM_MAX_NPROBE && queries.rows() >= GEMM_MIN_QUERIES {
        gemm_probes(index, queries, nprobe)
    } else {
        lane_probes(index, queries, nprobe)
    }
}

/// [`probe_lists`] by `search_cpu` over the centroids.
fn gemm_probes(index: &IvfIndex, queries: &Vectors, nprobe: usize) -> Result<Vec<i64>, IvfError> {
    let nprobe = nprobe.clamp(1, index.nlist());
    let qf: Cow<'_, Vectors> = match queries {
        Vectors::F32(_) => Cow::Borrowed(queries),
        _ => Cow::Owned(Vectors::F32(gather_f32(
            queries,
            &(0..queries.rows()).collect::<Vec<_>>(),
        ))),
    };
    let Vectors::F32(qm) = qf.as_ref() else {
        unreachable!("queries widened to f32 above")
    };
    Ok(
        nearest_rows(&index.centroids, qm, index.metric.metric, nprobe)?
            .into_iter()
            .map(|l| l as i64)
            .collect(),
    )
}

/// [`probe_lists`] by the 32-lane folds.
fn lane_probes(index: &IvfIndex, queries: &Vectors, nprobe: usize) -> Result<Vec<i64>, IvfError> {
    let (nlist, dim, metric) = (index.nlist(), index.dim, index.metric.metric);
    if queries.dim() != dim {
        return Err(crate::search::SearchError::DimensionMismatch {
            base: dim,
            queries: queries.dim(),
        }
        .into());
    }
    let nprobe = nprobe.clamp(1, nlist);
    ensure_threads();
    let l = index.coarse.0.get_or_init(|| lanes(index));
    let simd = simd();
    let mut out = vec![-1i64; queries.rows() * nprobe];
    out.par_chunks_mut(nprobe)
        .enumerate()
        .for_each(|(qi, probes)| {
            let q = queries.row_f32(qi);
            let qq = sq_norm_f32(&q);
            let mut top = TopK::new(nprobe);
            let mut d = [0.0f32; GROUP];
            for (g, gx) in l.groups.chunks_exact(GROUP * dim).enumerate() {
                let xx: &[f32; GROUP] = l.norms[g * GROUP..(g + 1) * GROUP]
                    .try_into()
                    .expect("32 norms per group");
                let args = GroupArgs {
                    metric,
                    q: &q,
                    qq,
                    gx,
                    xx,
                };
                float_group(&args, &mut d, simd);
                let valid = (nlist - g * GROUP).min(GROUP);
                let bound = top.bound();
                for (r, &dist) in d[..valid].iter().enumerate() {
                    let dist = nan_to_inf(dist);
                    if dist <= bound {
                        top.offer(dist, (g * GROUP + r) as i64);
                    }
                }
            }
            let mut dists = vec![0.0f32; nprobe];
            top.write(probes, &mut dists);
        });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::data::synthetic;
    use crate::search::ivf::{build_index, IvfBuildParams, MetricSpec};
    use crate::search::{search_cpu, DType, Metric, SearchParams};

    #[test]
    fn equals_search_cpu_over_the_centroids() {
        for metric in Metric::ALL {
            for dtype in [DType::F32, DType::U8] {
                let (base, queries) = synthetic(3000, 20, 50, dtype, 3);
                let mut p = IvfBuildParams::new(70, MetricSpec::plain(metric));
                p.iterations = 3;
                let index = build_index(&base, &p).unwrap();
                let qf = Vectors::F32(super::super::kmeans::gather_f32(
                    &queries,
                    &(0..50).collect::<Vec<_>>(),
                ));
                let cents = Vectors::F32(index.centroids().clone());
                // Each query's set of lists (the order is not defined).
                let sets = |ids: &[i64], nprobe: usize| -> Vec<Vec<i64>> {
                    ids.chunks(nprobe)
                        .map(|c| {
                            let mut c = c.to_vec();
                            c.sort_unstable();
                            c
                        })
                        .collect()
                };
                for nprobe in [1, 7, 8, 9, 70] {
                    let want = search_cpu(&cents, &qf, &SearchParams::new(nprobe, metric)).unwrap();
                    let lanes = lane_probes(&index, &queries, nprobe).unwrap();
                    assert_eq!(lanes, want.ids, "{metric} {dtype} {nprobe}");
                    assert_eq!(
                        sets(&probe_lists(&index, &queries, nprobe).unwrap(), nprobe),
                        sets(&want.ids, nprobe),
                        "{metric} {dtype} {nprobe}"
                    );
                    // Fewer than GEMM_MIN_QUERIES queries: the lanes at every nprobe.
                    let few = queries.slice_rows(0, 5);
                    assert_eq!(
                        probe_lists(&index, &few, nprobe).unwrap(),
                        want.ids[..5 * nprobe],
                        "{metric} {dtype} {nprobe} (5 queries)"
                    );
                }
            }
        }
    }
}
