//! Cost of a placement decision: `choose` on a warm model (learned statistics
//! present), with and without a GPU, plus `learn`. The HeliosDB contract asks
//! for < 1 µs per decision.
//!
//! ```text
//! cargo bench --bench cost
//! ```

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fraglink::cost::{AdaptiveCostModel, CostParams, GpuCostModel, GpuParams, OpDesc, Target};
use fraglink::search::DType;

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
}

criterion_group!(benches, bench);
criterion_main!(benches);
