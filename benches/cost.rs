//! Cost of a placement decision: `choose` on a warm model (learned statistics
//! present), with and without a GPU, plus `learn`. The HeliosDB contract asks
//! for < 1 µs per decision.
//!
//! `route/linked_check`: what the router adds for a search the GPU wins
//! (`search::route`): the kernels the search runs
//! (`SearchKernels::decide`) and whether each is linked
//! (`LinkRuntime::is_available`, in memory here: the k-NN pair, linked once
//! for sm_90 before timing).
//!
//! `merge/heads/*` against `merge/full_sort/*`: the host's merge of a split
//! scan's per-split lists (`search::splits::merge_splits`, a merge of the
//! sorted lists' heads) against sorting every entry of a query, as it was
//! done before; cases as an H100/H200's splits give them (264 splits for
//! one query, 3 for 100).
//!
//! ```text
//! cargo bench --bench cost
//! ```

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fraglink::build::Arch;
use fraglink::cost::{AdaptiveCostModel, CostParams, GpuCostModel, GpuParams, OpDesc, Target};
use fraglink::link::{LinkRuntime, RuntimeConfig};
use fraglink::search::kernels::SearchKernels;
use fraglink::search::knn::{plan::SharedMemory, KnnRequest};
use fraglink::search::plan::plan;
use fraglink::search::splits::merge_splits;
use fraglink::search::{DType, Metric};

fn bench(c: &mut Criterion) {
    let gpu = AdaptiveCostModel::new(
        CostParams::default()
            .with_cpu_throughput(200e9)
            .with_gpu(GpuParams::default()),
    );
    let no_gpu = AdaptiveCostModel::new(
        CostParams::default()
            .with_cpu_throughput(200e9)
            .without_gpu("no CUDA driver"),
    );
    // Warm: several operations and sizes with enough samples to be blended.
    let mut ops = Vec::new();
    for dtype in DType::ALL {
        for (n, nq) in [(10_000, 10), (100_000, 100), (1_000_000, 1000)] {
            ops.push(OpDesc::knn(n, 128, nq, 10, dtype, true));
        }
    }
    for op in &ops {
        for i in 0..20 {
            let t = Duration::from_micros(100 + i);
            gpu.learn(op, Target::Gpu, t);
            gpu.learn(op, Target::Cpu, t * 3);
        }
    }
    let op = OpDesc::knn(100_000, 128, 100, 10, DType::F32, true);
    let mut g = c.benchmark_group("cost");
    g.bench_function("choose/gpu/warm", |b| {
        b.iter(|| black_box(gpu.choose(black_box(&op))))
    });
    let unseen = OpDesc::new("never.learned").work(1e9).to_device(1 << 20);
    g.bench_function("choose/gpu/unseen_op", |b| {
        b.iter(|| black_box(gpu.choose(black_box(&unseen))))
    });
    g.bench_function("choose/no_gpu", |b| {
        b.iter(|| black_box(no_gpu.choose(black_box(&op))))
    });
    g.bench_function("learn", |b| {
        b.iter(|| gpu.learn(black_box(&op), Target::Gpu, Duration::from_micros(150)))
    });
    g.bench_function("choose+reason_to_string", |b| {
        b.iter(|| black_box(gpu.choose(black_box(&op)).reason.to_string()))
    });
    g.finish();
    linked_check(c);
    merge(c);
}

/// `nq` queries' `splits` sorted lists of `k` (distance, id), as a split
/// scan writes them: a few ties, padding at the end of some lists.
fn split_lists(nq: usize, splits: usize, k: usize) -> (Vec<i64>, Vec<f32>) {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let (mut ids, mut dists) = (Vec::new(), Vec::new());
    for _ in 0..nq * splits {
        let mut list: Vec<(f32, i64)> = (0..k)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 50 {
                    0 => (f32::INFINITY, -1),
                    r => (
                        (x >> 44) as f32 * (1.0 / 64.0) + r as f32,
                        (x >> 12) as i64 + i as i64,
                    ),
                }
            })
            .collect();
        list.sort_by(full_order);
        for (d, id) in list {
            dists.push(d);
            ids.push(id);
        }
    }
    (ids, dists)
}

/// The kernels' key order, ascending: distance, then id as unsigned.
fn full_order(a: &(f32, i64), b: &(f32, i64)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then((a.1 as u64).cmp(&(b.1 as u64)))
}

/// The peer: each query's entries sorted in full, the first `k` kept.
fn merge_by_sort(ids: &[i64], dists: &[f32], nq: usize, splits: usize, k: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(nq * k);
    let mut keys = Vec::with_capacity(splits * k);
    for q in 0..nq {
        let span = q * splits * k..(q + 1) * splits * k;
        keys.clear();
        keys.extend(
            dists[span.clone()]
                .iter()
                .copied()
                .zip(ids[span].iter().copied()),
        );
        keys.sort_unstable_by(full_order);
        out.extend(keys[..k].iter().map(|e| e.1));
    }
    out
}

fn merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("merge");
    for (nq, splits, k) in [(1, 264, 10), (1, 264, 100), (100, 3, 100)] {
        let (ids, dists) = split_lists(nq, splits, k);
        let case = format!("nq{nq}_splits{splits}_k{k}");
        let heads = merge_splits(&ids, &dists, nq, splits, k, true).0;
        assert_eq!(heads, merge_by_sort(&ids, &dists, nq, splits, k), "{case}");
        // Interleaved: each case's two sides run one after the other.
        g.bench_function(format!("heads/{case}"), |b| {
            b.iter(|| black_box(merge_splits(black_box(&ids), &dists, nq, splits, k, true)))
        });
        g.bench_function(format!("full_sort/{case}"), |b| {
            b.iter(|| black_box(merge_by_sort(black_box(&ids), &dists, nq, splits, k)))
        });
    }
    g.finish();
}

fn linked_check(c: &mut Criterion) {
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 64,
        disk: None,
    })
    .expect("nvJitLink loads");
    let arch = Arch::sm(90);
    let r = KnnRequest {
        device: arch,
        shared: SharedMemory::H100,
        dtype: DType::F32,
        metric: Metric::L2,
        filter: "none",
        n_rows: 1_000_000,
        dim: 128,
        nq: 100,
        k: 10,
    };
    let decide = || {
        let scan = plan(r.dtype, r.metric, r.filter, r.n_rows, r.dim, r.k).map_err(Into::into);
        SearchKernels::decide(&r, scan, None).expect("a plan")
    };
    let kernels = decide();
    for (p, _) in kernels.kernels() {
        rt.link(&p, arch).expect("links");
    }
    let mut g = c.benchmark_group("route");
    g.bench_function("linked_check", |b| {
        b.iter(|| {
            let k = decide();
            black_box(
                k.kernels()
                    .iter()
                    .all(|(p, _)| rt.is_available(p, arch).unwrap_or(false)),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
