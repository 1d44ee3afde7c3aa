//! Seeded k-means for the coarse quantizer.
//!
//! - **Training set**: at most `max_points_per_list · nlist` rows, a seeded
//!   uniform sample without replacement (faiss samples the same way, with 256
//!   per centroid by default, which is also fraglink's default; fewer points
//!   per list buy build time and cost recall, see
//!   [`IvfBuildParams::max_points_per_list`](super::IvfBuildParams)).
//! - **Seeding**: k-means++ (D² sampling, squared l2) on a seeded sub-sample of
//!   at most [`PP_POINTS_PER_LIST`] `· nlist` training rows: full k-means++ is
//!   `nlist` sequential passes over the data, which would cost more than all
//!   Lloyd iterations together; on a sub-sample it is a small fraction.
//! - **Lloyd iterations**: the assignment step is an exact nearest-centroid
//!   search with the index metric, [`search_cpu`](crate::search::search_cpu) with `k = 1` (GEMM-selected
//!   candidates, exact re-rank: the same machinery as brute force, multithreaded);
//!   the update step is the mean of each cluster's members summed in f64 (rows
//!   streamed in order by a fixed number of parts, the parts' sums added in
//!   part order: `update`). An empty cluster takes half of the largest one
//!   (its centroid split by a ±2⁻¹⁰ relative perturbation, as faiss does). It
//!   stops early when no assignment changes.
//!
//! Everything is a function of the data and the seed only: the same seed gives
//! the same centroids bit for bit at any thread count.

use std::borrow::Cow;

use rayon::prelude::*;

use super::IvfError;
use crate::search::cpu::nearest_rows;
use crate::search::data::Rng;
use crate::search::{Matrix, Metric, Vectors};

/// Training rows per list used by k-means++ seeding (a sub-sample of the
/// training set).
pub const PP_POINTS_PER_LIST: usize = 8;

/// How k-means runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KMeansParams {
    pub nlist: usize,
    pub metric: Metric,
    pub seed: u64,
    /// Lloyd iterations at most.
    pub iterations: usize,
    /// Training rows per list at most (the rest of the base is only assigned).
    pub max_points_per_list: usize,
}

/// `count` distinct indices of `0..n`, ascending, seeded (a partial
/// Fisher–Yates shuffle).
pub fn sample_indices(n: usize, count: usize, rng: &mut Rng) -> Vec<usize> {
    let count = count.min(n);
    let mut idx: Vec<usize> = (0..n).collect();
    for i in 0..count {
        let j = i + rng.below((n - i) as u64) as usize;
        idx.swap(i, j);
    }
    idx.truncate(count);
    idx.sort_unstable();
    idx
}

/// Rows `idx` of `v`, widened to f32.
pub fn gather_f32(v: &Vectors, idx: &[usize]) -> Matrix<f32> {
    let dim = v.dim();
    let mut out = Vec::with_capacity(idx.len() * dim);
    for &i in idx {
        match v {
            Vectors::F32(m) => out.extend_from_slice(m.row(i)),
            _ => out.extend(v.row_f32(i)),
        }
    }
    Matrix::new(out, idx.len(), dim).expect("idx.len() rows of dim elements")
}

/// Squared l2 in eight lanes (vectorises; fixed order, so deterministic on
/// every x86_64 and aarch64 build). Only seeding uses it.
fn l2_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            let d = x[i] - y[i];
            lanes[i] += d * d;
        }
    }
    for (x, y) in ta.iter().zip(tb) {
        lanes[0] += (x - y) * (x - y);
    }
    lanes.iter().sum()
}

/// k-means++ seeding: `nlist` rows of `x` (`x.rows() ≥ nlist`).
fn kmeans_pp(x: &Matrix<f32>, nlist: usize, rng: &mut Rng) -> Matrix<f32> {
    let (n, dim) = (x.rows(), x.dim());
    let mut centers = Vec::with_capacity(nlist * dim);
    let first = rng.below(n as u64) as usize;
    centers.extend_from_slice(x.row(first));
    let mut mind: Vec<f32> = (0..n)
        .into_par_iter()
        .map(|i| l2_lanes(x.row(i), x.row(first)))
        .collect();
    for _ in 1..nlist {
        let total: f64 = mind.iter().map(|&d| d as f64).sum();
        let pick = if total > 0.0 && total.is_finite() {
            let target = rng.next_f64() * total;
            let mut acc = 0.0f64;
            let mut pick = n - 1;
            for (i, &d) in mind.iter().enumerate() {
                acc += d as f64;
                if acc > target {
                    pick = i;
                    break;
                }
            }
            pick
        } else {
            // Every row sits on a chosen centre (duplicates): any row will do.
            rng.below(n as u64) as usize
        };
        let c = x.row(pick).to_vec();
        mind.par_iter_mut().enumerate().for_each(|(i, m)| {
            let d = l2_lanes(x.row(i), &c);
            if d < *m {
                *m = d;
            }
        });
        centers.extend_from_slice(&c);
    }
    Matrix::new(centers, nlist, dim).expect("nlist centres")
}

/// Nearest centroid of every row of `x` (exact, by `metric`: the row
/// [`search_cpu`](crate::search::search_cpu) with `k = 1` returns, without the distances no one reads:
/// `search::cpu::nearest_rows`).
pub fn assign(
    centroids: &Matrix<f32>,
    x: &Matrix<f32>,
    metric: Metric,
) -> Result<Vec<u32>, IvfError> {
    Ok(nearest_rows(centroids, x, metric, 1)?
        .into_iter()
        .map(|i| i as u32)
        .collect())
}

/// Means of the clusters; the counts come back beside them. Empty clusters
/// keep their old centroid.
///
/// The rows are cut into [`update_parts`] consecutive parts (a number fixed
/// by `nlist` and `dim`, never by the thread count). Each part streams its
/// rows in order into f64 sums for every cluster, and the parts' sums are then
/// added in part order: the same bits at any thread count. (Gathering each
/// cluster's members instead reads the training set in random order, which
/// cost more than all the adds.)
fn update(x: &Matrix<f32>, assign: &[u32], centroids: &mut Matrix<f32>) -> Vec<usize> {
    let (nlist, dim, n) = (centroids.rows(), x.dim(), x.rows());
    let mut counts = vec![0usize; nlist];
    for &a in assign {
        counts[a as usize] += 1;
    }
    let parts = update_parts(nlist, dim);
    let partial: Vec<Vec<f64>> = (0..parts)
        .into_par_iter()
        .map(|p| {
            let rows = n * p / parts..n * (p + 1) / parts;
            let mut sums = vec![0.0f64; nlist * dim];
            for i in rows {
                let c = assign[i] as usize;
                for (s, &v) in sums[c * dim..(c + 1) * dim].iter_mut().zip(x.row(i)) {
                    *s += v as f64;
                }
            }
            sums
        })
        .collect();
    centroids
        .data
        .par_chunks_mut(dim)
        .enumerate()
        .filter(|(c, _)| counts[*c] != 0)
        .for_each(|(c, cent)| {
            let inv = 1.0 / counts[c] as f64;
            for (j, o) in cent.iter_mut().enumerate() {
                let s = partial.iter().fold(0.0f64, |s, p| s + p[c * dim + j]);
                *o = (s * inv) as f32;
            }
        });
    counts
}

/// Parts of [`update`]: 8, fewer where 8 sets of `nlist × dim` f64 sums would
/// pass 64 MiB.
fn update_parts(nlist: usize, dim: usize) -> usize {
    const BUDGET: usize = 64 << 20;
    (BUDGET / (nlist * dim * 8).max(1)).clamp(1, 8)
}

fn split_empty(centroids: &mut Matrix<f32>, counts: &mut [usize]) {
    const EPS: f32 = 1.0 / 1024.0;
    let dim = centroids.dim();
    for ci in 0..counts.len() {
        if counts[ci] != 0 {
            continue;
        }
        // Largest cluster, ties to the smaller index.
        let cj = (0..counts.len())
            .max_by(|&a, &b| counts[a].cmp(&counts[b]).then(b.cmp(&a)))
            .expect("nlist ≥ 1");
        if counts[cj] < 2 {
            return;
        }
        let src = centroids.row(cj).to_vec();
        let data = &mut centroids.data;
        for j in 0..dim {
            let s = if j % 2 == 0 { 1.0 + EPS } else { 1.0 - EPS };
            let t = if j % 2 == 0 { 1.0 - EPS } else { 1.0 + EPS };
            data[ci * dim + j] = src[j] * s;
            data[cj * dim + j] = src[j] * t;
        }
        counts[ci] = counts[cj] / 2;
        counts[cj] -= counts[ci];
    }
}

/// Trains `p.nlist` centroids on `base` (module docs). `base` must have at
/// least `nlist` rows.
pub fn train(base: &Vectors, p: &KMeansParams) -> Result<Matrix<f32>, IvfError> {
    let (n, dim) = (base.rows(), base.dim());
    if p.nlist == 0 {
        return Err(IvfError::NlistZero { nlist: 0 });
    }
    if n == 0 || dim == 0 {
        return Err(IvfError::EmptyBase { rows: n, dim });
    }
    if p.nlist > n {
        return Err(IvfError::NlistTooLarge { nlist: p.nlist, n });
    }
    let mut rng = Rng::new(p.seed);
    let cap = p.max_points_per_list.max(1).saturating_mul(p.nlist);
    // The training set: the base itself when it is f32 and small enough.
    let train: Cow<'_, Vectors> = match base {
        Vectors::F32(_) if n <= cap => Cow::Borrowed(base),
        _ => {
            let idx = sample_indices(n, cap, &mut rng);
            Cow::Owned(Vectors::F32(gather_f32(base, &idx)))
        }
    };
    let Vectors::F32(tm) = train.as_ref() else {
        unreachable!("the training set is f32")
    };
    let pp_idx = sample_indices(tm.rows(), PP_POINTS_PER_LIST * p.nlist, &mut rng);
    let pp = gather_f32(&train, &pp_idx);
    let mut centroids = kmeans_pp(&pp, p.nlist, &mut rng);
    let mut prev: Option<Vec<u32>> = None;
    for _ in 0..p.iterations {
        let a = assign(&centroids, tm, p.metric)?;
        if prev.as_ref() == Some(&a) {
            break;
        }
        let mut counts = update(tm, &a, &mut centroids);
        split_empty(&mut centroids, &mut counts);
        prev = Some(a);
    }
    Ok(centroids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::data::synthetic;
    use crate::search::DType;

    #[test]
    fn update_is_the_mean_of_part_sums_in_row_order() {
        let (n, dim, nlist) = (3001, 37, 9);
        let mut rng = Rng::new(5);
        let x: Vec<f32> = (0..n * dim).map(|_| rng.normal() as f32 * 3.0).collect();
        let x = Matrix::new(x, n, dim).unwrap();
        // Cluster 4 stays empty.
        let assign: Vec<u32> = (0..n)
            .map(|_| match rng.below(nlist as u64 - 1) as u32 {
                c if c >= 4 => c + 1,
                c => c,
            })
            .collect();
        let old = Matrix::new(vec![0.5f32; nlist * dim], nlist, dim).unwrap();
        let parts = update_parts(nlist, dim);
        assert_eq!(parts, 8);
        let mut by_threads = Vec::new();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut got = old.clone();
            let counts = pool.install(|| update(&x, &assign, &mut got));
            for (c, &count) in counts.iter().enumerate() {
                let members: Vec<usize> = (0..n).filter(|&i| assign[i] == c as u32).collect();
                assert_eq!(count, members.len());
                for j in 0..dim {
                    let want = if members.is_empty() {
                        old.row(c)[j]
                    } else {
                        let s = (0..parts).fold(0.0f64, |s, p| {
                            let part = members
                                .iter()
                                .filter(|&&i| i >= n * p / parts && i < n * (p + 1) / parts);
                            s + part.fold(0.0f64, |s, &i| s + x.row(i)[j] as f64)
                        });
                        (s * (1.0 / members.len() as f64)) as f32
                    };
                    assert_eq!(
                        got.row(c)[j].to_bits(),
                        want.to_bits(),
                        "cluster {c} dim {j}"
                    );
                }
            }
            by_threads.push(got);
        }
        assert_eq!(by_threads[0], by_threads[1]);
        assert_eq!(update_parts(65536, 128), 1);
    }

    #[test]
    fn sample_is_distinct_sorted_and_seeded() {
        let s = sample_indices(100, 30, &mut Rng::new(1));
        assert_eq!(s.len(), 30);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s, sample_indices(100, 30, &mut Rng::new(1)));
        assert_eq!(sample_indices(5, 30, &mut Rng::new(1)), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn train_is_deterministic_and_finds_separated_blobs() {
        // Four far-apart points, each repeated: k-means must put one centre on each.
        let pts = [[0.0f32, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]];
        let data: Vec<f32> = (0..40).flat_map(|i| pts[i % 4]).collect();
        let base = Vectors::f32(data, 2).unwrap();
        let p = KMeansParams {
            nlist: 4,
            metric: Metric::L2,
            seed: 3,
            iterations: 10,
            max_points_per_list: 256,
        };
        let c = train(&base, &p).unwrap();
        let mut got: Vec<(i32, i32)> = (0..4)
            .map(|i| (c.row(i)[0].round() as i32, c.row(i)[1].round() as i32))
            .collect();
        got.sort();
        assert_eq!(got, vec![(0, 0), (0, 10), (10, 0), (10, 10)]);
        let (b, _) = synthetic(3000, 16, 1, DType::F16, 5);
        let p = KMeansParams {
            nlist: 20,
            max_points_per_list: 64,
            ..p
        };
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| train(&b, &p).unwrap());
        assert_eq!(one, train(&b, &p).unwrap());
        assert!(matches!(
            train(&b, &KMeansParams { nlist: 3001, ..p }),
            Err(IvfError::NlistTooLarge { .. })
        ));
    }
}
