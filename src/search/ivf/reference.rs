//! The IVF-Flat definition ([`super`]) in its plainest form: every centroid's
//! distance by the scalar fold, a sort for the probed lists, every probed row
//! de-interleaved and measured by the scalar fold, a sort for the result.
//! The oracle [`search_ivf`](super::search_ivf) is tested against.

use std::cmp::Ordering;

use rayon::prelude::*;

use super::build::{with_lists_and_queries, List};
use super::layout::unpack_row;
use super::scan::{validate_ivf, IvfSearchParams};
use super::{IvfError, IvfIndex};
use crate::search::cpu::{ensure_threads, key_cmp, nan_to_inf, padded};
use crate::search::{distance, Element, Matrix, Neighbors, Vectors};

fn by_key(a: &(f32, usize), b: &(f32, usize)) -> Ordering {
    key_cmp(a.0, a.1, b.0, b.1)
}

/// The probed lists of one query (f32 query against f32 centroids).
pub(crate) fn probed(index: &IvfIndex, qf: &[f32], nprobe: usize) -> Vec<usize> {
    let c = &index.centroids;
    let mut all: Vec<(f32, usize)> = (0..c.rows())
        .map(|l| (nan_to_inf(distance(index.metric.metric, qf, c.row(l))), l))
        .collect();
    all.sort_by(by_key);
    all.into_iter().take(nprobe).map(|(_, l)| l).collect()
}

fn reference_typed<T: Element>(
    index: &IvfIndex,
    lists: &[List<T>],
    queries: &Matrix<T>,
    all: &Vectors,
    p: &IvfSearchParams,
) -> Neighbors {
    let (k, dim, v) = (p.k, index.dim, index.veclen);
    let nprobe = p.nprobe.min(index.nlist());
    let mut res = padded(queries.rows(), k);
    res.ids
        .par_chunks_mut(k)
        .zip(res.distances.par_chunks_mut(k))
        .enumerate()
        .for_each(|(qi, (ids, dists))| {
            let q = queries.row(qi);
            let mut cands: Vec<(f32, usize)> = Vec::new();
            for l in probed(index, &all.row_f32(qi), nprobe) {
                let list = &lists[l];
                for (r, &id) in list.ids.iter().enumerate() {
                    if p.filter.allows(id as usize) {
                        let x = unpack_row(&list.data, r, dim, v);
                        cands.push((
                            nan_to_inf(distance(index.metric.metric, q, &x)),
                            id as usize,
                        ));
                    }
                }
            }
            cands.sort_by(by_key);
            for (j, (d, id)) in cands.into_iter().take(k).enumerate() {
                ids[j] = id as i64;
                dists[j] = index.metric.post.apply(d);
            }
        });
    res
}

/// The IVF-Flat search by its definition, scalar (parallel over queries only).
pub fn search_ivf_reference(
    index: &IvfIndex,
    queries: &Vectors,
    p: &IvfSearchParams,
) -> Result<Neighbors, IvfError> {
    validate_ivf(index, queries, p)?;
    ensure_threads();
    Ok(with_lists_and_queries!(&index.lists, queries, l, q => {
        reference_typed(index, l, q, queries, p)
    }))
}
