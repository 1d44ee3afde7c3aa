//! The margin of the tensor-core k-NN path (fragments/knn_bounds.cuh), on
//! the host: emulated candidate arithmetic always satisfies lo ≤ d ≤ hi
//! against the exact reference fold, and the kernels' select (emulated step
//! by step: per-chunk buffers, compaction, exact reduction, merge and exact
//! re-rank) returns exactly the reference's top-k.
//!
//! Emulated tensor-core arithmetic (the assumptions of knn_bounds.cuh):
//! - inputs: f16 and integers as they are; f32 rounded to TF32 to nearest
//!   (cvt.rna) or truncated (raw f32 fed to the MMA), subnormals optionally
//!   flushed; 3xTF32 split as the kernel splits; f16copy: f32 rounded to f16
//!   to nearest (the host's copies), then as f16;
//! - products exact;
//! - accumulation in one of several orders: in order with round to nearest,
//!   in reverse, pairwise, and the MMA's K-step blocks summed exactly and
//!   added to the accumulator with truncation toward zero.

use fraglink::search::knn::bounds::{bound_consts, float_bounds, int_distance};
use fraglink::search::knn::f16copy;
use fraglink::search::knn::norms::Norms;
use fraglink::search::knn::Precision;
use fraglink::search::{data::Rng, distance, search_reference, Metric, SearchParams, Vectors};
use half::f16;

/// How the emulated tensor core adds its products.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Acc {
    InOrder,
    Reverse,
    Pairwise,
    /// K-step blocks summed exactly, each added to the accumulator with
    /// truncation toward zero.
    BlockTruncate,
}

const ACCS: [Acc; 4] = [
    Acc::InOrder,
    Acc::Reverse,
    Acc::Pairwise,
    Acc::BlockTruncate,
];

/// f64 → f32 toward zero.
fn trunc32(v: f64) -> f32 {
    let r = v as f32;
    if (r as f64).abs() > v.abs() {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    }
}

fn accumulate(products: &[f64], acc: Acc, step: usize) -> f32 {
    match acc {
        Acc::InOrder => products.iter().fold(0.0f32, |a, &p| (a as f64 + p) as f32),
        Acc::Reverse => products
            .iter()
            .rev()
            .fold(0.0f32, |a, &p| (a as f64 + p) as f32),
        Acc::Pairwise => {
            fn pw(p: &[f64]) -> f32 {
                match p.len() {
                    0 => 0.0,
                    1 => p[0] as f32,
                    n => (pw(&p[..n / 2]) as f64 + pw(&p[n / 2..]) as f64) as f32,
                }
            }
            pw(products)
        }
        Acc::BlockTruncate => products
            .chunks(step)
            .fold(0.0f32, |a, c| trunc32(a as f64 + c.iter().sum::<f64>())),
    }
}

/// f32 → TF32 (10 fraction bits): to nearest, ties away (cvt.rna), or
/// truncated; `flush` zeroes subnormals.
fn tf32(v: f32, nearest: bool, flush: bool) -> f32 {
    if flush && v != 0.0 && v.abs() < f32::MIN_POSITIVE {
        return 0.0f32.copysign(v);
    }
    if !v.is_finite() {
        return v;
    }
    let b = v.to_bits();
    let b = if nearest { b.wrapping_add(1 << 12) } else { b };
    f32::from_bits(b & !0x1fff)
}

/// The emulated tensor-core dot product of `q` and `x` (widened to f32).
fn tc_dot(q: &[f32], x: &[f32], p: Precision, acc: Acc, nearest: bool, flush: bool) -> f32 {
    match p {
        Precision::F16 => {
            let prods: Vec<f64> = q
                .iter()
                .zip(x)
                .map(|(&a, &b)| a as f64 * b as f64)
                .collect();
            accumulate(&prods, acc, 16)
        }
        Precision::Tf32 => {
            let prods: Vec<f64> = q
                .iter()
                .zip(x)
                .map(|(&a, &b)| tf32(a, nearest, flush) as f64 * tf32(b, nearest, flush) as f64)
                .collect();
            accumulate(&prods, acc, 8)
        }
        Precision::Tf32x3 => {
            // Per K step of 8: lo·hi, hi·lo, hi·hi, as the kernel issues them.
            let split = |v: f32| {
                let h = tf32(v, nearest, flush);
                (h, tf32(v - h, nearest, flush))
            };
            let mut prods = Vec::with_capacity(3 * q.len());
            for (qc, xc) in q.chunks(8).zip(x.chunks(8)) {
                let s: Vec<((f32, f32), (f32, f32))> = qc
                    .iter()
                    .zip(xc)
                    .map(|(&a, &b)| (split(a), split(b)))
                    .collect();
                prods.extend(s.iter().map(|((_, al), (bh, _))| *al as f64 * *bh as f64));
                prods.extend(s.iter().map(|((ah, _), (_, bl))| *ah as f64 * *bl as f64));
                prods.extend(s.iter().map(|((ah, _), (bh, _))| *ah as f64 * *bh as f64));
            }
            accumulate(&prods, acc, 8)
        }
        Precision::F16Copy => {
            // The host's copies: f32 rounded to the nearest f16, then the f16 MMA.
            let h = |v: f32| f16::from_f32(v).to_f32() as f64;
            let prods: Vec<f64> = q.iter().zip(x).map(|(&a, &b)| h(a) * h(b)).collect();
            accumulate(&prods, acc, 16)
        }
        Precision::Int => unreachable!("integers are exact"),
    }
}

/// One float pair through the emulated kernel: (lo, hi), or `None` when a
/// vector is special (the host routes those to the scan).
fn float_pair(
    metric: Metric,
    p: Precision,
    q: &Vectors,
    x: &Vectors,
    qw: &[f32],
    xw: &[f32],
    model: (Acc, bool, bool),
) -> Option<(f32, f32)> {
    let (nq, nx) = (Norms::of(q), Norms::of(x));
    if nq.any_special(metric) || nx.any_special(metric) {
        return None;
    }
    // f16copy serves only vectors with f16 copies (a search naming it over
    // others is refused).
    if p == Precision::F16Copy && !(f16copy::fits(qw) && f16copy::fits(xw)) {
        return None;
    }
    let (qa0, qa1) = nq.aux(metric);
    let (xa0, xa1) = nx.aux(metric);
    let c = bound_consts(qw.len() as u32, p);
    let dot = tc_dot(qw, xw, p, model.0, model.1, model.2);
    Some(float_bounds(
        metric,
        &c,
        dot,
        (qa0[0], qa1[0]),
        (xa0[0], xa1[0]),
    ))
}

fn models() -> Vec<(Acc, bool, bool)> {
    let mut v = Vec::new();
    for a in ACCS {
        for nearest in [true, false] {
            for flush in [false, true] {
                v.push((a, nearest, flush));
            }
        }
    }
    v
}

/// Random and adversarial f32 pairs of `dim` elements.
fn float_cases(rng: &mut Rng, dim: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let gauss = |rng: &mut Rng, s: f64| -> Vec<f32> {
        (0..dim).map(|_| (rng.normal() * s) as f32).collect()
    };
    let mut out = Vec::new();
    for scale in [1.0, 1e-15, 1e-6, 1e6, 1e14] {
        let q = gauss(rng, scale);
        out.push((q.clone(), gauss(rng, scale)));
        // Cancellation: x = q + a tiny perturbation (l2 ≈ 0, ip ≈ |q|²).
        let x: Vec<f32> = q
            .iter()
            .map(|&v| v + (rng.normal() * scale * 1e-6) as f32)
            .collect();
        out.push((q.clone(), x));
        // Opposite, and orthogonal-ish halves.
        out.push((q.clone(), q.iter().map(|v| -v).collect()));
        let mut o = q.clone();
        o.iter_mut().skip(dim / 2).for_each(|v| *v = 0.0);
        out.push((q, o));
    }
    // Mixed magnitudes: a few huge elements among small ones (norm² < 2^100).
    let mut q = gauss(rng, 1e-3);
    q[0] = 3e14;
    let mut x = gauss(rng, 1e-3);
    x[dim - 1] = -2e14;
    out.push((q, x));
    // Just below the midpoints between f16 values: every element's f16 copy
    // (f16copy) errs by almost 2^-11 in the same direction, so the products'
    // errors add up instead of cancelling (x = q: l2 0, the worst
    // cancellation).
    // (f16's spacing in [1, 2) is 2^-10: 1 + i 2^-10 + 0.999 2^-11, for small i
    // so that the error is nearly 2^-11 relative too.)
    let q: Vec<f32> = (0..dim)
        .map(|j| 1.0 + (j % 8) as f32 * f32::powi(2.0, -10) + 0.999 * f32::powi(2.0, -11))
        .collect();
    out.push((q.clone(), q.clone()));
    out.push((q.clone(), q.iter().map(|v| v * 0.75).collect()));
    // Subnormal elements (a flushing tensor core loses them).
    let q: Vec<f32> = (0..dim)
        .map(|j| if j % 2 == 0 { 1e-39 } else { 0.5 })
        .collect();
    let x: Vec<f32> = (0..dim)
        .map(|j| if j % 3 == 0 { -3e-39 } else { 0.25 })
        .collect();
    out.push((q, x));
    out
}

#[test]
fn float_bounds_hold_for_every_emulated_accumulation() {
    let mut rng = Rng::new(10);
    let mut checked = 0usize;
    for dim in [1, 3, 8, 16, 100, 128, 1000] {
        for (qv, xv) in float_cases(&mut rng, dim) {
            for metric in Metric::ALL {
                // f32 data: TF32 and 3xTF32.
                let (q, x) = (
                    Vectors::f32(qv.clone(), dim).unwrap(),
                    Vectors::f32(xv.clone(), dim).unwrap(),
                );
                let d = distance(metric, &qv, &xv);
                for p in [Precision::Tf32, Precision::Tf32x3, Precision::F16Copy] {
                    for m in models() {
                        if let Some((lo, hi)) = float_pair(metric, p, &q, &x, &qv, &xv, m) {
                            assert!(
                                lo <= d && d <= hi,
                                "{metric:?} {p:?} {m:?} dim {dim}: {lo} <= {d} <= {hi} fails (q[0] {}, x[0] {})",
                                qv[0],
                                xv[0]
                            );
                            checked += 1;
                        }
                    }
                }
                // f16 data: the f16 MMA (inputs exact).
                let qh: Vec<f16> = qv.iter().map(|&v| f16::from_f32(v)).collect();
                let xh: Vec<f16> = xv.iter().map(|&v| f16::from_f32(v)).collect();
                let (qw, xw): (Vec<f32>, Vec<f32>) = (
                    qh.iter().map(|v| v.to_f32()).collect(),
                    xh.iter().map(|v| v.to_f32()).collect(),
                );
                let dh = distance(metric, &qh, &xh);
                let (q, x) = (
                    Vectors::f16(qh, dim).unwrap(),
                    Vectors::f16(xh, dim).unwrap(),
                );
                for a in ACCS {
                    if let Some((lo, hi)) =
                        float_pair(metric, Precision::F16, &q, &x, &qw, &xw, (a, true, false))
                    {
                        assert!(
                            lo <= dh && dh <= hi,
                            "{metric:?} f16 {a:?} dim {dim}: {lo} <= {dh} <= {hi}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked} pairs checked");
}

#[test]
fn tf32x3_margins_are_tight_and_tf32_ones_loose() {
    // Unit-scale data, dim 128: 3xTF32's interval (dominated by the
    // accumulation allowance, 3·128·2^-20) is about 10x narrower than TF32's
    // (2^-8 input rounding), and both are small against the distance.
    let mut rng = Rng::new(3);
    let dim = 128;
    let q: Vec<f32> = (0..dim).map(|_| rng.normal() as f32).collect();
    let x: Vec<f32> = (0..dim).map(|_| rng.normal() as f32).collect();
    let (qv, xv) = (
        Vectors::f32(q.clone(), dim).unwrap(),
        Vectors::f32(x.clone(), dim).unwrap(),
    );
    let m = (Acc::InOrder, true, false);
    let w = |p| {
        let (lo, hi) = float_pair(Metric::L2, p, &qv, &xv, &q, &x, m).unwrap();
        hi - lo
    };
    let (t, t3) = (w(Precision::Tf32), w(Precision::Tf32x3));
    assert!(t3 * 5.0 < t, "tf32x3 {t3} vs tf32 {t}");
    // f16copy (2^-10 + 2^-21 for two roundings to f16) sits between them.
    let h = w(Precision::F16Copy);
    assert!(t3 < h && h < t, "tf32x3 {t3}, f16copy {h}, tf32 {t}");
    assert!(t < 0.05 * distance(Metric::L2, &q, &x), "{t}");
}

#[test]
fn integer_candidates_are_exact() {
    let mut rng = Rng::new(8);
    for dim in [1, 7, 16, 64, 300] {
        for round in 0..40 {
            let extreme = round % 4 == 0;
            let qi: Vec<i8> = (0..dim)
                .map(|_| {
                    if extreme {
                        -128
                    } else {
                        rng.below(256) as i64 as i8
                    }
                })
                .collect();
            let xi: Vec<i8> = (0..dim)
                .map(|j| {
                    if extreme && j % 2 == 0 {
                        -128
                    } else {
                        rng.below(256) as i64 as i8
                    }
                })
                .collect();
            let qu: Vec<u8> = qi.iter().map(|&v| v as u8).collect();
            let xu: Vec<u8> = xi.iter().map(|&v| v as u8).collect();
            let sq_i = |v: &[i8]| v.iter().map(|&a| (a as i64 * a as i64) as u32).sum::<u32>();
            let sq_u = |v: &[u8]| v.iter().map(|&a| a as u32 * a as u32).sum::<u32>();
            let dot_i: i64 = qi.iter().zip(&xi).map(|(&a, &b)| a as i64 * b as i64).sum();
            let dot_u: i64 = qu.iter().zip(&xu).map(|(&a, &b)| a as i64 * b as i64).sum();
            for metric in Metric::ALL {
                let di = int_distance(metric, dot_i, sq_i(&qi), sq_i(&xi));
                assert_eq!(
                    di.to_bits(),
                    distance(metric, &qi, &xi).to_bits(),
                    "i8 {metric:?} {dim}"
                );
                let du = int_distance(metric, dot_u, sq_u(&qu), sq_u(&xu));
                assert_eq!(
                    du.to_bits(),
                    distance(metric, &qu, &xu).to_bits(),
                    "u8 {metric:?} {dim}"
                );
            }
            // The norms the host uploads are the same exact integers.
            let n = Norms::of(&Vectors::i8(qi.clone(), dim).unwrap());
            assert_eq!(n.aux(Metric::L2).0[0].to_bits(), sq_i(&qi));
        }
    }
    // Zero vectors: cosine 1, as the reference.
    assert_eq!(
        int_distance(Metric::Cosine, 0, 0, 0),
        distance(Metric::Cosine, &[0i8; 4], &[0i8; 4])
    );
}

// ----- the select, emulated ---------------------------------------------------------

#[derive(Clone, Copy)]
struct Cand {
    lo: f32,
    hi: f32,
    id: u32,
}

fn key_less(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// knn_tile.cuh's `compact`: T = min(T, k-th smallest hi), keep lo ≤ T and
/// lo ≤ the query's shared bound; more than `cap` left: the exact best k.
fn compact(
    buf: &mut Vec<Cand>,
    thr: &mut f32,
    shared: f32,
    k: usize,
    cap: usize,
    exact: &dyn Fn(u32) -> f32,
) {
    let mut his: Vec<f32> = buf.iter().map(|c| c.hi).collect();
    his.sort_by(|a, b| a.total_cmp(b));
    let t = thr.min(his[k - 1]);
    buf.retain(|c| c.lo <= t && c.lo <= shared);
    *thr = t;
    if buf.len() > cap {
        for c in buf.iter_mut() {
            let d = exact(c.id);
            c.lo = d;
            c.hi = d;
        }
        buf.sort_by(|a, b| {
            if key_less((a.lo, a.id), (b.lo, b.id)) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        buf.truncate(k);
        *thr = t.min(buf[k - 1].lo);
    }
}

/// The select's shape: k, the variant's capacity, its row tile, the
/// launch's chunk length, and whether the chunks share a bound
/// (knn_tile.cuh `shared_bound`; a null pointer: each on its own).
#[derive(Clone, Copy)]
struct Shape {
    k: usize,
    cap: usize,
    rt: usize,
    chunk_rows: usize,
    shared: bool,
}

/// The two kernels for one query over `n` rows, with `bounds(row)` the
/// candidate kernel's (lo, hi) and `exact(row)` the metric fold (NaN → +inf).
fn emulate_query(
    n: usize,
    shape: Shape,
    allowed: &dyn Fn(usize) -> bool,
    bounds: &dyn Fn(u32) -> (f32, f32),
    exact: &dyn Fn(u32) -> f32,
) -> Vec<(f32, u32)> {
    let Shape {
        k,
        cap,
        rt,
        chunk_rows,
        shared: share,
    } = shape;
    let mut all = Vec::new();
    // The least T any chunk has published (the chunks run one after
    // another here, so later ones meet the earlier ones' bound).
    let mut shared = f32::INFINITY;
    for start in (0..n).step_by(chunk_rows) {
        let end = (start + chunk_rows).min(n);
        let (mut buf, mut thr) = (Vec::<Cand>::new(), f32::INFINITY);
        for r0 in (start..end).step_by(rt) {
            let (t, s) = (thr, shared); // fixed during an iteration
            for row in r0..(r0 + rt).min(end) {
                if !allowed(row) {
                    continue;
                }
                let (lo, hi) = bounds(row as u32);
                if lo < t && lo <= s {
                    buf.push(Cand {
                        lo,
                        hi,
                        id: row as u32,
                    });
                }
            }
            assert!(
                buf.len() <= cap + rt,
                "the buffer of CAP + RT never overflows"
            );
            let limit = if r0 + rt >= end { k } else { cap };
            if buf.len() > limit {
                compact(&mut buf, &mut thr, s, k, cap, exact);
                if share {
                    shared = shared.min(thr);
                }
            }
        }
        assert!(buf.len() <= cap);
        buf.retain(|c| c.lo <= shared);
        all.extend(buf);
    }
    // knn_rerank: U, lo ≤ U, exact, k smallest keys.
    let mut his: Vec<f32> = all.iter().map(|c| c.hi).collect();
    his.sort_by(|a, b| a.total_cmp(b));
    let u = if his.len() >= k {
        his[k - 1]
    } else {
        f32::INFINITY
    };
    let mut keys: Vec<(f32, u32)> = all
        .iter()
        .filter(|c| c.lo <= u)
        .map(|c| (exact(c.id), c.id))
        .collect();
    keys.sort_by(|a, b| {
        if key_less(*a, *b) {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    });
    keys.truncate(k);
    while keys.len() < k {
        keys.push((f32::INFINITY, u32::MAX));
    }
    keys
}

/// Searches `base` for `queries` through the emulated kernels and compares
/// with the reference, ids and distance bits.
#[allow(clippy::too_many_arguments)]
fn check_select(
    base: &[f32],
    queries: &[f32],
    dim: usize,
    metric: Metric,
    k: usize,
    p: Precision,
    model: (Acc, bool, bool),
    cap: usize,
    rt: usize,
    chunk_rows: usize,
    allowed: &dyn Fn(usize) -> bool,
) {
    let n = base.len() / dim;
    let nq = queries.len() / dim;
    let bv = Vectors::f32(base.to_vec(), dim).unwrap();
    let qv = Vectors::f32(queries.to_vec(), dim).unwrap();
    let (bn, qn) = (Norms::of(&bv), Norms::of(&qv));
    assert!(!bn.any_special(metric) && !qn.any_special(metric));
    let (xa0, xa1) = bn.aux(metric);
    let (qa0, qa1) = qn.aux(metric);
    let c = bound_consts(dim as u32, p);
    let filter = fraglink::search::Bitset::from_fn(n, allowed);
    let params = SearchParams::new(k, metric).with_filter(fraglink::search::Filter::Bitset(filter));
    let want = search_reference(&bv, &qv, &params).unwrap();
    for qi in 0..nq {
        let q = &queries[qi * dim..(qi + 1) * dim];
        let row = |r: u32| &base[r as usize * dim..(r as usize + 1) * dim];
        let bounds = |r: u32| {
            let dot = tc_dot(q, row(r), p, model.0, model.1, model.2);
            float_bounds(
                metric,
                &c,
                dot,
                (qa0[qi], qa1[qi]),
                (xa0[r as usize], xa1[r as usize]),
            )
        };
        let exact = |r: u32| {
            let d = distance(metric, q, row(r));
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        };
        for shared in [false, true] {
            let shape = Shape {
                k,
                cap,
                rt,
                chunk_rows,
                shared,
            };
            let got = emulate_query(n, shape, allowed, &bounds, &exact);
            for (j, (d, id)) in got.iter().enumerate() {
                let (wid, wd) = (want.ids[qi * k + j], want.distances[qi * k + j]);
                let id = if *id == u32::MAX { -1 } else { *id as i64 };
                assert_eq!(
                    (id, d.to_bits()),
                    (wid, wd.to_bits()),
                    "{metric:?} {p:?} {model:?} shared bound {shared}, query {qi} rank {j}: ({id}, {d}) vs ({wid}, {wd})"
                );
            }
        }
    }
}

#[test]
fn the_emulated_kernels_return_the_reference_top_k() {
    let mut rng = Rng::new(77);
    let (n, dim, nq) = (700, 24, 4);
    let base: Vec<f32> = (0..n * dim).map(|_| rng.normal() as f32).collect();
    let queries: Vec<f32> = (0..nq * dim).map(|_| rng.normal() as f32).collect();
    let all = |_: usize| true;
    let some = |r: usize| r % 3 != 1;
    for metric in Metric::ALL {
        for p in [Precision::Tf32, Precision::Tf32x3, Precision::F16Copy] {
            for &(k, cap) in &[(1, 32), (10, 32), (32, 32), (100, 128)] {
                for &(rt, chunk_rows) in &[(64, 64 * 3), (32, 700), (64, 128)] {
                    let model = (Acc::BlockTruncate, p == Precision::Tf32, false);
                    check_select(
                        &base, &queries, dim, metric, k, p, model, cap, rt, chunk_rows, &all,
                    );
                }
            }
            check_select(
                &base,
                &queries,
                dim,
                metric,
                10,
                p,
                (Acc::InOrder, true, false),
                32,
                64,
                256,
                &some,
            );
        }
    }
}

#[test]
fn duplicates_and_ties_go_through_the_exact_reduction() {
    // 600 copies of 3 distinct rows: every bound ties, buffers overflow their
    // capacity and the exact best k (ties by smaller id) must survive.
    let dim = 8;
    let protos: [[f32; 8]; 3] = [
        [1.0; 8],
        [0.5; 8],
        [-1.0, 1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 1.0],
    ];
    let base: Vec<f32> = (0..600).flat_map(|i| protos[i % 3]).collect();
    let queries: Vec<f32> = [[0.9f32; 8], [0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 1.0]].concat();
    let all = |_: usize| true;
    for metric in Metric::ALL {
        for &(k, cap) in &[(10, 32), (32, 32), (100, 128)] {
            for p in [Precision::Tf32, Precision::Tf32x3, Precision::F16Copy] {
                check_select(
                    &base,
                    &queries,
                    dim,
                    metric,
                    k,
                    p,
                    (Acc::Pairwise, true, false),
                    cap,
                    64,
                    300,
                    &all,
                );
            }
        }
    }
}
