//! Every IVF-Flat scan variant links through the planner with its metric and
//! filter fragments (the same ones the brute-force scan links) for sm_75,
//! sm_80 and sm_90, with zero spills, a kernel entry and the shared memory its
//! capacity implies. Real nvJitLink, no GPU needed.

mod support;

use fraglink::build::Arch;
use fraglink::link::metadata::check_cubin;
use fraglink::link::{LinkRuntime, Planner, RuntimeConfig};
use support::scan_links::{family_plans, link_all_checked};

fn plans(metric: &str, filter: &str) -> Vec<Planner> {
    family_plans("ivf_scan", metric, filter)
}

#[test]
fn every_ivf_scan_variant_links_spill_free_for_sm75_and_sm90() {
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 512,
        disk: None,
    })
    .unwrap();
    let all = plans("l2", "bitset");
    // 4 dtypes × 2 veclens × 7 capacities × 2 orders.
    assert_eq!(all.len(), 112);
    for arch in [Arch::sm(75), Arch::sm(90)] {
        link_all_checked(&rt, &all, arch);
    }
}

#[test]
fn every_metric_and_filter_links_with_the_ivf_scan_for_sm80() {
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 512,
        disk: None,
    })
    .unwrap();
    let mut all = Vec::new();
    for metric in ["l2", "inner_product", "cosine"] {
        for filter in ["none", "bitset"] {
            all.extend(
                plans(metric, filter)
                    .into_iter()
                    .filter(|p| p.entry().contains("_k256_") && !p.entry().contains("_v1_")),
            );
        }
    }
    assert_eq!(all.len(), 3 * 2 * 4 * 2);
    link_all_checked(&rt, &all, Arch::sm(80));
}

/// A run-time user metric (examples/ivf_user_metric.rs) links in place of the
/// metric fragment, both sort orders, spill-free on every arch.
#[test]
fn a_run_time_user_metric_links_with_the_ivf_scan() {
    const L1_F32: &str = r#"
#include "abi.cuh"
extern "C" FRAGLINK_HD void fraglink_metric_init_f32(fraglink_metric_state_f32* s) { s->a = 0.0f; }
extern "C" FRAGLINK_HD void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x) {
  s->a = __fadd_rn(s->a, fabsf(__fsub_rn(q, x)));
}
extern "C" FRAGLINK_HD float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s) { return s->a; }
"#;
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 16,
        disk: None,
    })
    .unwrap();
    for entry in ["ivf_scan_f32_v4_k64_asc", "ivf_scan_f32_v1_k256_desc"] {
        let p = Planner::new(entry)
            .add_named(entry)
            .unwrap()
            .add_source("metric_l1_f32", L1_F32)
            .add_named("filter_bitset_i64")
            .unwrap();
        for sm in [75, 80, 90] {
            let l = rt
                .link(&p, Arch::sm(sm))
                .unwrap_or_else(|e| panic!("{entry} sm_{sm}: {e}"));
            let m = &l.kernel.metadata;
            assert_eq!((m.spill_stores, m.spill_loads), (0, 0), "{entry} sm_{sm}");
            assert!(check_cubin(&l.kernel.cubin, entry).unwrap().entry_is_kernel);
        }
    }
}
