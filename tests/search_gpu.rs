//! The GPU search path. Without a GPU: every configuration has a plan whose
//! fragments link. With one (`cargo test -- --ignored`): the GPU results
//! equal the CPU path's bit for bit on every metric × dtype × filter.

use fraglink::build::Arch;
use fraglink::gpu::GpuContext;
use fraglink::link::metadata::check_cubin;
use fraglink::search::cpu::search_cpu;
use fraglink::search::data::synthetic;
use fraglink::search::gpu::GpuSearcher;
use fraglink::search::plan::plan;
use fraglink::search::route::{Device, Searcher};
use fraglink::search::{Bitset, DType, Filter, Matrix, Metric, SearchParams, Vectors};

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::I8, DType::U8];
const METRICS: [Metric; 3] = [Metric::L2, Metric::InnerProduct, Metric::Cosine];

#[test]
fn every_configuration_has_a_plan_that_links() {
    for dtype in DTYPES {
        for metric in METRICS {
            for filter in ["none", "bitset"] {
                for (dim, k) in [(128, 10), (33, 1), (96, 256)] {
                    let p = plan(dtype, metric, filter, 5000, dim, k).unwrap();
                    assert!(p.capacity as usize >= k);
                    assert_eq!(dim % p.veclen as usize, 0);
                    if k == 10 {
                        let l = p.planner().link_for(Arch::sm(80)).unwrap();
                        check_cubin(&l.kernel.cubin, p.scan.name).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn every_plan_satisfies_its_launch_contract() {
    // What the GPU path checks before launching (and the kernel checks again):
    // the planner's choice passes for every dtype and dimension, and its
    // vector loads stay aligned for every query row.
    for dtype in DTYPES {
        for dim in (1..=40).chain([127, 128, 768]) {
            for (n_rows, k) in [(5000usize, 10usize), (u32::MAX as usize, 256)] {
                let p = plan(dtype, Metric::L2, "none", n_rows, dim, k).unwrap();
                let c = p.contract();
                let s = c
                    .scalars(n_rows as u64, dim as u64, 1000, k as u64)
                    .unwrap_or_else(|e| panic!("{dtype} dim {dim}: {e}"));
                assert_eq!((s.dim as usize, s.k as usize), (dim, k));
                for row in [0u64, 1, 2, 999] {
                    let offset = row * dim as u64 * dtype.size() as u64;
                    c.check_offset("queries", offset)
                        .unwrap_or_else(|e| panic!("{dtype} dim {dim}: {e}"));
                }
            }
        }
    }
}

#[test]
fn asking_for_the_gpu_without_one_is_a_clear_error() {
    if GpuContext::available().is_ok() {
        return; // a GPU machine: the ignored tests below cover it
    }
    let e = Searcher::new(Device::Gpu)
        .err()
        .expect("no GPU here")
        .to_string();
    assert!(e.contains("--device gpu") && e.contains("no GPU"), "{e}");
    // auto routes to the CPU and says why.
    let s = Searcher::new(Device::Auto).unwrap();
    let (base, queries) = synthetic(500, 16, 3, DType::F32, 1);
    let r = s
        .search(&base, &queries, &SearchParams::new(5, Metric::L2))
        .unwrap();
    assert_eq!(r.target.to_string(), "cpu");
    assert!(r.reason.contains("no GPU"), "{}", r.reason);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_equals_cpu_on_every_metric_dtype_filter() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    for dtype in DTYPES {
        for metric in METRICS {
            for filter in [0.0, 0.5, 0.002] {
                let (base, queries) = synthetic(3000, 64, 17, dtype, 7);
                let f = if filter == 0.0 {
                    Filter::None
                } else {
                    Filter::Bitset(Bitset::random(3000, filter, 3))
                };
                for k in [1, 10, 100] {
                    let params = SearchParams::new(k, metric).with_filter(f.clone());
                    let want = search_cpu(&base, &queries, &params).unwrap();
                    let got = gpu.search(&base, &queries, &params).unwrap().neighbors;
                    assert!(
                        got.bitwise_eq(&want),
                        "{dtype} {metric} filter {filter} k {k}: first difference at {:?}",
                        got.first_difference(&want)
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn routing_uses_the_gpu_when_forced_and_agrees() {
    let s = Searcher::new(Device::Gpu).unwrap();
    let (base, queries) = synthetic(20_000, 128, 64, DType::F32, 9);
    let params = SearchParams::new(10, Metric::InnerProduct);
    let r = s.search(&base, &queries, &params).unwrap();
    assert_eq!(r.target.to_string(), "gpu");
    assert!(r
        .neighbors
        .bitwise_eq(&search_cpu(&base, &queries, &params).unwrap()));
}

/// Deterministic f32 data in [-1, 1) without the f64 staging of
/// `synthetic` (which would need 8 bytes per element of a 4 GiB dataset).
fn lcg_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn datasets_over_4_gib_stay_on_the_gpu() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (free, _) = gpu.context().memory_info().unwrap();
    let (dim, n) = (128usize, 8_800_000usize); // 4.2 GiB of f32 rows
    if free < 6 << 30 {
        eprintln!("skipped: {free} bytes free");
        return;
    }
    let base = Vectors::F32(Matrix::new(lcg_f32(n * dim, 1), n, dim).unwrap());
    let queries = Vectors::F32(Matrix::new(lcg_f32(4 * dim, 2), 4, dim).unwrap());
    let params = SearchParams::new(10, Metric::L2);
    // The old pool refused anything over 4 GiB (AllocationTooLarge: the
    // CPU path); the device-sized pool takes it.
    let got = gpu.search(&base, &queries, &params).unwrap();
    assert_eq!(got.plan.idx, "u32");
    let want = search_cpu(&base, &queries, &params).unwrap();
    assert!(
        got.neighbors.bitwise_eq(&want),
        "first difference at {:?}",
        got.neighbors.first_difference(&want)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn i64_ids_are_reachable_beyond_u32_rows() {
    // 2^32 + 1000 one-byte rows (4 GiB): the plan takes the i64-id scan.
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (free, _) = gpu.context().memory_info().unwrap();
    let n = u32::MAX as usize + 1001;
    if free < 6 << 30 {
        eprintln!("skipped: {free} bytes free");
        return;
    }
    // Values 1..=251, and zeros only at the rows around 2^32 - 1.
    let zeros = u32::MAX as usize - 2..u32::MAX as usize + 3;
    let data: Vec<u8> = (0..n)
        .map(|i| {
            if zeros.contains(&i) {
                0
            } else {
                1 + (i % 251) as u8
            }
        })
        .collect();
    let base = Vectors::U8(Matrix::new(data, n, 1).unwrap());
    let queries = Vectors::U8(Matrix::new(vec![0u8, 251, 255], 3, 1).unwrap());
    let params = SearchParams::new(5, Metric::L2);
    let got = gpu.search(&base, &queries, &params).unwrap();
    assert_eq!(got.plan.idx, "i64");
    assert_eq!(got.plan.scan.name, "scan_u8_i64_v1_k32");
    let ids: Vec<i64> = zeros.clone().map(|i| i as i64).collect();
    assert_eq!(
        got.neighbors.ids_of(0),
        &ids[..],
        "ids beyond u32 must survive"
    );
    assert_eq!(got.neighbors.distances_of(0), &[0.0; 5]);
    let want = search_cpu(&base, &queries, &params).unwrap();
    assert!(
        got.neighbors.bitwise_eq(&want),
        "first difference at {:?}",
        got.neighbors.first_difference(&want)
    );
}
