//! IVF-Flat on the GPU: the plan for every dtype links (no GPU needed), and
//! with a GPU (`cargo test -- --ignored`, or the GPU archive) the device
//! results equal the CPU path's bit for bit: the same probed lists, the same
//! rows, the same fold, the same tie rule and NaN handling.

use fraglink::build::Arch;
use fraglink::gpu::GpuContext;
use fraglink::link::LinkRuntime;
use fraglink::search::data::synthetic;
use fraglink::search::gpu::GpuSearcher;
use fraglink::search::ivf::gpu::{ivf_plan, GpuIvfIndex};
use fraglink::search::ivf::{
    build_index, search_ivf, veclen_for, IvfBuildParams, IvfSearchParams, MetricSpec,
};
use fraglink::search::plan::PlanError;
use fraglink::search::{Bitset, DType, Filter, Metric, Vectors};

#[test]
fn every_dtype_metric_and_k_has_a_plan_that_links() {
    let rt = LinkRuntime::memory_only().unwrap();
    for dtype in DType::ALL {
        for metric in Metric::ALL {
            for veclen in [1, veclen_for(dtype, 128)] {
                for k in [1, 10, 33, 100, 256, 257, 1000, 2048] {
                    let p = ivf_plan(dtype, metric, "bitset", veclen, k).unwrap();
                    // The smallest capacity bucket holding k.
                    let want = [32, 64, 128, 256, 512, 1024, 2048]
                        .into_iter()
                        .find(|&c| c >= k)
                        .unwrap();
                    assert_eq!(p.capacity as usize, want, "{dtype} {metric} k {k}");
                    let l = rt.link(&p.planner(), Arch::sm(90)).unwrap();
                    assert_eq!(l.kernel.metadata.spill_stores, 0);
                }
            }
        }
    }
    assert!(matches!(
        ivf_plan(DType::F32, Metric::L2, "none", 4, 2049),
        Err(PlanError::KTooLarge { max: 2048, .. })
    ));
    assert!(ivf_plan(DType::F32, Metric::L2, "none", 2, 10).is_err());
}

fn nan_rows(v: Vectors) -> Vectors {
    match v {
        Vectors::F32(m) => {
            let dim = m.dim();
            let mut d = m.into_data();
            d[5 * dim + 1] = f32::NAN;
            d[77 * dim] = f32::INFINITY;
            Vectors::f32(d, dim).unwrap()
        }
        other => other,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ivf_equals_cpu_ivf_bit_for_bit() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    for dtype in DType::ALL {
        for dim in [32, 20] {
            let (base, queries) = synthetic(6000, dim, 57, dtype, 9);
            let base = nan_rows(base);
            for spec in ["l2", "l2sqrt", "ip", "cosine"] {
                let spec: MetricSpec = spec.parse().unwrap();
                let mut bp = IvfBuildParams::new(40, spec).with_seed(2);
                bp.iterations = 5;
                for veclen in [None, Some(1)] {
                    bp.veclen = veclen;
                    let index = build_index(&base, &bp).unwrap();
                    let dev = GpuIvfIndex::upload(&gpu, &index).unwrap();
                    for (k, nprobe) in
                        [(1, 1), (10, 4), (100, 40), (256, 7), (1000, 20), (2048, 40)]
                    {
                        for f in [Filter::None, Filter::Bitset(Bitset::random(6000, 0.3, 4))] {
                            let p = IvfSearchParams::new(k, nprobe).with_filter(f);
                            let want = search_ivf(&index, &queries, &p).unwrap();
                            let got = dev.search(&queries, &p).unwrap();
                            assert!(
                                got.bitwise_eq(&want),
                                "{dtype} dim {dim} {spec} veclen {veclen:?} k {k} nprobe {nprobe}: \
                                 first difference at {:?}",
                                got.first_difference(&want)
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A similarity (larger is closer) as a run-time metric, through a `_desc`
/// entry: few queries, so the probes are split over blocks and the host
/// merges the splits in descending order. Checked against the same dot
/// product folded on the host over the same probed lists, ties to the
/// smaller id; ids and distances bit for bit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_similarity_through_a_desc_entry_merges_its_probe_splits_largest_first() {
    use fraglink::link::Planner;
    use fraglink::search::ivf::probe_lists;
    const DOT_F32: &str = r#"
#include "abi.cuh"
extern "C" FRAGLINK_HD void fraglink_metric_init_f32(fraglink_metric_state_f32* s) {
  s->a = 0.0f; s->qq = 0.0f; s->xx = 0.0f;
}
extern "C" FRAGLINK_HD void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x) {
  s->a = __fadd_rn(s->a, __fmul_rn(q, x));
}
extern "C" FRAGLINK_HD float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s) { return s->a; }
"#;
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (base, queries) = synthetic(20_000, 32, 3, DType::F32, 5);
    // An l2sqrt index: its sqrt is its own metric's, not the caller's, so
    // the dot products come back as they are (sqrt would make NaN of the
    // negative ones).
    let spec = MetricSpec {
        metric: Metric::L2,
        post: fraglink::search::ivf::PostProcess::Sqrt,
    };
    let mut bp = IvfBuildParams::new(40, spec).with_seed(3);
    bp.veclen = Some(4);
    let index = build_index(&base, &bp).unwrap();
    let dev = GpuIvfIndex::upload(&gpu, &index).unwrap();
    let Vectors::F32(b) = &base else {
        unreachable!()
    };
    let Vectors::F32(q) = &queries else {
        unreachable!()
    };
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).fold(0.0f32, |a, (x, y)| a + x * y);
    for (k, capacity, nprobe) in [(10, 32, 12), (300, 512, 40)] {
        let entry = format!("ivf_scan_f32_v4_k{capacity}_desc");
        let planner = Planner::new(&entry)
            .add_named(&entry)
            .unwrap()
            .add_source("metric_dot_f32", DOT_F32)
            .add_named("filter_none_i64")
            .unwrap();
        let p = IvfSearchParams::new(k, nprobe);
        let found = dev.search_with(&planner, capacity, &queries, &p).unwrap();
        let probes = probe_lists(&index, &queries, nprobe).unwrap();
        for qi in 0..queries.rows() {
            let mut all: Vec<(f32, i64)> = probes[qi * nprobe..(qi + 1) * nprobe]
                .iter()
                .flat_map(|&l| index.lists().ids(l as usize).to_vec())
                .map(|id| (dot(q.row(qi), b.row(id as usize)), id))
                .collect();
            all.sort_by(|x, y| y.0.partial_cmp(&x.0).unwrap().then(x.1.cmp(&y.1)));
            let want_ids: Vec<i64> = all.iter().take(k).map(|x| x.1).collect();
            let want_d: Vec<u32> = all.iter().take(k).map(|x| x.0.to_bits()).collect();
            let got_d: Vec<u32> = found.distances_of(qi).iter().map(|d| d.to_bits()).collect();
            assert_eq!(found.ids_of(qi), &want_ids[..], "k {k} query {qi}");
            assert_eq!(got_d, want_d, "k {k} query {qi}");
        }
    }
}

/// A filter's bits go up when they change, not per search (the index keeps
/// the last device copy): the second search with the same bits sends
/// exactly the filter's words fewer than the first, and results stay the
/// CPU path's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_repeated_filter_is_uploaded_once() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (base, queries) = synthetic(6000, 32, 20, DType::F32, 5);
    let index = build_index(&base, &IvfBuildParams::new(40, "l2".parse().unwrap())).unwrap();
    let dev = GpuIvfIndex::upload(&gpu, &index).unwrap();
    let (a, b) = (Bitset::random(6000, 0.3, 4), Bitset::random(6000, 0.6, 5));
    let words = (a.words.len() * 4) as u64;
    let sent = |f: &Bitset| {
        let p = IvfSearchParams::new(10, 8).with_filter(Filter::Bitset(f.clone()));
        let before = gpu.transfer().stats().bytes_to_device;
        let got = dev.search(&queries, &p).unwrap();
        let sent = gpu.transfer().stats().bytes_to_device - before;
        let want = search_ivf(&index, &queries, &p).unwrap();
        assert!(got.bitwise_eq(&want), "{:?}", got.first_difference(&want));
        sent
    };
    let first = sent(&a);
    let again = sent(&a);
    assert_eq!(first - again, words, "the same bits are not sent again");
    assert_eq!(sent(&b), first, "changed bits are sent");
    assert_eq!(sent(&b), again);
}
