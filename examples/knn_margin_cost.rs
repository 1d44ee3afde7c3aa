//! What a candidate precision's margin costs: per query, the rows whose
//! interval [lo, hi] (fragments/knn_bounds.cuh) reaches the k-th smallest
//! hi, i.e. the candidates the exact re-rank must fold, for f32 rows at
//! TF32, 3xTF32 and f16copy — on the host, with the exact dot product in
//! place of the tensor core's (whose error the interval covers), so the
//! counts are what the margins alone admit. No GPU needed.
//!
//! ```sh
//! cargo run --release --example knn_margin_cost -- [N] [DIM] [NQ]
//! ```
//! (defaults 200000 128 50: the clustered data of `fraglink search`).

use fraglink::search::data::synthetic;
use fraglink::search::knn::bounds::{bound_consts, float_bounds};
use fraglink::search::knn::norms::Norms;
use fraglink::search::knn::Precision;
use fraglink::search::{DType, Metric, Vectors};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().expect("N, DIM and NQ are numbers"))
        .unwrap_or(default)
}

fn main() {
    let (n, dim, nq) = (arg(1, 200_000), arg(2, 128), arg(3, 50));
    let (base, queries) = synthetic(n, dim, nq, DType::F32, 7);
    let (Vectors::F32(b), Vectors::F32(q)) = (&base, &queries) else {
        unreachable!("f32 data")
    };
    let (b, q) = (b.data(), q.data());
    println!("{n} rows, dim {dim}, {nq} queries (clustered f32): candidates per query, mean / max");
    println!("| metric | k | tf32 | tf32x3 | f16copy |");
    println!("| --- | --- | --- | --- | --- |");
    for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
        let (rows, qs) = (Norms::of(&base), Norms::of(&queries));
        let (ra0, ra1) = rows.aux(metric);
        let (qa0, qa1) = qs.aux(metric);
        for k in [10, 100] {
            let mut cells = Vec::new();
            for p in [Precision::Tf32, Precision::Tf32x3, Precision::F16Copy] {
                let c = bound_consts(dim as u32, p);
                let (mut total, mut most) = (0usize, 0usize);
                for j in 0..nq {
                    let qv = &q[j * dim..(j + 1) * dim];
                    let bounds: Vec<(f32, f32)> = (0..n)
                        .map(|r| {
                            let x = &b[r * dim..(r + 1) * dim];
                            let dot: f64 =
                                qv.iter().zip(x).map(|(&a, &v)| a as f64 * v as f64).sum();
                            float_bounds(metric, &c, dot as f32, (qa0[j], qa1[j]), (ra0[r], ra1[r]))
                        })
                        .collect();
                    let mut his: Vec<f32> = bounds.iter().map(|b| b.1).collect();
                    let (_, u, _) = his.select_nth_unstable_by(k - 1, f32::total_cmp);
                    let u = *u;
                    let m = bounds.iter().filter(|b| b.0 <= u).count();
                    total += m;
                    most = most.max(m);
                }
                cells.push(format!("{:.1} / {most}", total as f64 / nq as f64));
            }
            println!("| {metric} | {k} | {} |", cells.join(" | "));
        }
    }
}
