//! Throughput of the exact CPU search (queries per second).
//!
//! Default input: 100 000 × 128 f32 base vectors (synthetic clustered data),
//! 1 000 queries, k = 10, L2 and inner product (one search of all queries per
//! iteration; throughput is reported in queries). Override with
//! `FRAGLINK_BENCH_N`, `FRAGLINK_BENCH_DIM`, `FRAGLINK_BENCH_NQ` and
//! `FRAGLINK_BENCH_K`; `FRAGLINK_BENCH_DTYPES=f32,f16,i8,u8` adds other types;
//! `FRAGLINK_BENCH_KERNELS=gemm,avx2,avx512,avx512vnni` times each kernel this CPU
//! has (default: the one `search_cpu` picks).
//!
//! ```text
//! cargo bench --bench search_cpu
//! FRAGLINK_BENCH_N=20000 FRAGLINK_BENCH_NQ=100 cargo bench --bench search_cpu
//! RAYON_NUM_THREADS=1 FRAGLINK_BENCH_KERNELS=gemm,avx2,avx512,avx512vnni cargo bench --bench search_cpu
//! ```

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fraglink::search::cpu::{search_cpu_with, CpuKernel};
use fraglink::search::data::synthetic;
use fraglink::search::{DType, Metric, SearchParams};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bench(c: &mut Criterion) {
    let n = env("FRAGLINK_BENCH_N", 100_000);
    let dim = env("FRAGLINK_BENCH_DIM", 128);
    let nq = env("FRAGLINK_BENCH_NQ", 1000);
    let k = env("FRAGLINK_BENCH_K", 10);
    let dtypes: Vec<DType> = std::env::var("FRAGLINK_BENCH_DTYPES")
        .unwrap_or_else(|_| "f32".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let kernels: Vec<CpuKernel> = match std::env::var("FRAGLINK_BENCH_KERNELS") {
        Ok(v) => CpuKernel::ALL
            .into_iter()
            .filter(|k| v.split(',').any(|s| s.trim() == k.name()) && k.available())
            .collect(),
        Err(_) => vec![CpuKernel::detect()],
    };
    let mut g = c.benchmark_group(format!("search_cpu/{n}x{dim}/nq{nq}/k{k}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(nq as u64));
    for dtype in dtypes {
        let (base, queries) = synthetic(n, dim, nq, dtype, 1);
        for metric in [Metric::L2, Metric::InnerProduct] {
            let params = SearchParams::new(k, metric);
            for &kernel in &kernels {
                g.bench_with_input(
                    BenchmarkId::new(format!("{}/{kernel}", dtype.name()), metric.fragment_name()),
                    &params,
                    |b, p| {
                        b.iter(|| black_box(search_cpu_with(&base, &queries, p, kernel).unwrap()))
                    },
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
