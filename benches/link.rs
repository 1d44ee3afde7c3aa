//! Link costs, each against its peer in the same run:
//! - a cold link through the planner vs raw nvJitLink on the same inputs
//!   (fraglink's overhead: key, cache bookkeeping, cubin check, log parsing);
//! - a memory-cache hit and a disk-cache hit vs the cold link;
//! - a warm planner lookup (building the plan and hitting the cache).
//!
//! `cargo bench --bench link`

use criterion::{criterion_group, criterion_main, Criterion};
use fraglink::build::Arch;
use fraglink::fragments::{FilterFragment, MetricFragment, NoneFilter, ScanFragment, F32, L2, U32};
use fraglink::link::disk::DiskCacheConfig;
use fraglink::link::{LinkRuntime, Planner, RuntimeConfig, Source};
use fraglink::sys::{InputType, NvJitLink};

const ARCH: Arch = Arch::sm(80);

fn plan() -> Planner {
    Planner::new("scan_f32_u32_v4_k128")
        .add::<ScanFragment<F32, U32, 4, 128>>()
        .add::<MetricFragment<L2, F32>>()
        .add::<FilterFragment<NoneFilter, U32>>()
}

fn runtime(disk: Option<&std::path::Path>) -> LinkRuntime {
    LinkRuntime::new(RuntimeConfig {
        memory_capacity: 64,
        disk: disk.map(DiskCacheConfig::new),
    })
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let p = plan();
    let args = p.options(ARCH).to_args();
    let nvjitlink = NvJitLink::open(None).unwrap();

    let mut cold = c.benchmark_group("link_cold");
    cold.sample_size(10);
    cold.bench_function("raw_nvjitlink", |b| {
        b.iter(|| {
            let mut h = nvjitlink.create(&args).unwrap();
            for f in p.static_fragments() {
                h.add(InputType::Fatbin, f.fatbin, f.name).unwrap();
            }
            h.complete().unwrap();
            let cubin = h.cubin().unwrap();
            let log = h.info_log().unwrap();
            (cubin, log)
        })
    });
    let rt = runtime(None);
    cold.bench_function("planner", |b| {
        b.iter(|| {
            rt.clear();
            let l = rt.link(&p, ARCH).unwrap();
            assert_eq!(l.source, Source::Linked);
            l
        })
    });
    cold.finish();

    let mut warm = c.benchmark_group("link_cached");
    rt.link(&p, ARCH).unwrap();
    warm.bench_function("memory_hit", |b| b.iter(|| rt.link(&p, ARCH).unwrap()));
    warm.bench_function("warm_planner_lookup", |b| {
        b.iter(|| plan().link_with(&rt, ARCH).unwrap())
    });
    let dir = tempfile::tempdir().unwrap();
    let disk_rt = runtime(Some(dir.path()));
    disk_rt.link(&p, ARCH).unwrap();
    warm.bench_function("disk_hit", |b| {
        b.iter(|| {
            disk_rt.clear();
            let l = disk_rt.link(&p, ARCH).unwrap();
            assert_eq!(l.source, Source::Disk);
            l
        })
    });
    warm.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
