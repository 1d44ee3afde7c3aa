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
use fraglink::search::{Bitset, DType, Filter, Metric, SearchParams};

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
