//! The runtime linker on real fragments, real nvJitLink, real cubins.

mod support;

use std::sync::{Arc, Barrier};

use fraglink::build::Arch;
use fraglink::fragments::{FilterFragment, MetricFragment, NoneFilter, ScanFragment, F32, L2, U32};
use fraglink::link::disk::DiskCacheConfig;
use fraglink::link::metadata::check_cubin;
use fraglink::link::{FastCompile, LinkError, LinkRuntime, Planner, RuntimeConfig, Source};
use support::scan_links::{family_plans, link_all_checked};

fn runtime(disk: Option<&std::path::Path>) -> LinkRuntime {
    LinkRuntime::new(RuntimeConfig {
        memory_capacity: 512,
        disk: disk.map(DiskCacheConfig::new),
    })
    .expect("nvJitLink loads from the path baked at build time")
}

/// The scan fragment of every (dtype, idx, veclen, capacity) with a metric
/// and a filter that fit it.
fn scan_plans(metric: &str, filter: &str) -> Vec<Planner> {
    family_plans("scan", metric, filter)
}

#[test]
fn every_scan_variant_links_spill_free_for_sm75_and_sm90() {
    let rt = runtime(None);
    let plans = scan_plans("l2", "bitset");
    assert_eq!(plans.len(), 48);
    for arch in [Arch::sm(75), Arch::sm(90)] {
        link_all_checked(&rt, &plans, arch);
    }
    assert_eq!(rt.stats().links, 96);
}

#[test]
fn every_metric_and_filter_links_for_sm80() {
    let rt = runtime(None);
    let mut plans = Vec::new();
    for metric in ["l2", "inner_product", "cosine"] {
        for filter in ["none", "bitset"] {
            // The widest, largest-capacity scan per dtype and idx.
            plans.extend(
                scan_plans(metric, filter)
                    .into_iter()
                    .filter(|p| p.entry().ends_with("_k256") && !p.entry().contains("_v1_")),
            );
        }
    }
    assert_eq!(plans.len(), 3 * 2 * 8);
    link_all_checked(&rt, &plans, Arch::sm(80));
    for p in plans.iter().take(3) {
        let l = rt.link(p, Arch::sm(80)).unwrap();
        assert_eq!(
            check_cubin(&l.kernel.cubin, p.entry()).unwrap().sm,
            Some(80)
        );
    }
}

fn typed_plan() -> Planner {
    Planner::new("scan_f32_u32_v4_k128")
        .add::<ScanFragment<F32, U32, 4, 128>>()
        .add::<MetricFragment<L2, F32>>()
        .add::<FilterFragment<NoneFilter, U32>>()
}

#[test]
fn thirty_two_threads_one_key_one_link() {
    let rt = runtime(None);
    let barrier = Barrier::new(32);
    let plan = typed_plan();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..32)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    rt.link(&plan, Arch::sm(80)).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let st = rt.stats();
    assert_eq!(st.links, 1, "{st:?}");
    assert_eq!(st.misses, 1);
    assert_eq!(st.hits + st.waits, 31);
    assert!(
        st.waits >= 1,
        "the others waited on the in-flight link: {st:?}"
    );
    assert_eq!(
        results
            .iter()
            .filter(|l| l.source == Source::Linked)
            .count(),
        1
    );
    for l in &results {
        assert!(Arc::ptr_eq(&l.kernel, &results[0].kernel));
    }
}

#[test]
fn link_all_links_the_cold_plans_at_once_in_order() {
    let rt = runtime(None);
    let named = |frags: &[&str]| {
        frags
            .iter()
            .fold(Planner::new(frags[0]), |p, f| p.add_named(f).unwrap())
    };
    let a = typed_plan();
    let b = named(&[
        "scan_f16_u32_v8_k32",
        "metric_inner_product_f16",
        "filter_none_u32",
    ]);
    let c = typed_plan().lineinfo(true);
    let all = rt.link_all(&[&a, &b, &c], Arch::sm(80)).unwrap();
    assert_eq!(
        all.iter()
            .map(|l| l.kernel.entry.as_str())
            .collect::<Vec<_>>(),
        [
            "scan_f32_u32_v4_k128",
            "scan_f16_u32_v8_k32",
            "scan_f32_u32_v4_k128"
        ]
    );
    assert!(all.iter().all(|l| l.source == Source::Linked));
    assert_eq!(rt.stats().links, 3);
    // The same kernels and keys as one link at a time.
    let one_by_one = runtime(None);
    for (p, l) in [&a, &b, &c].into_iter().zip(&all) {
        let single = one_by_one.link(p, Arch::sm(80)).unwrap();
        assert_eq!(single.key, l.key);
        assert_eq!(single.kernel.cubin, l.kernel.cubin);
    }
    // Warm: memory, no link.
    let again = rt.link_all(&[&c, &a], Arch::sm(80)).unwrap();
    assert!(again.iter().all(|l| l.source == Source::Memory));
    assert_eq!((again[0].key, again[1].key), (all[2].key, all[0].key));
    // Each counted once: looking for links due counts nothing.
    let st = rt.stats();
    assert_eq!((st.links, st.misses, st.hits), (3, 3, 2), "{st:?}");
    // A failing plan among cold ones: its error; the others are linked and kept.
    let bad = named(&["scan_f32_u32_v4_k128", "metric_l2_f16", "filter_none_u32"]);
    let d = named(&["scan_u8_u32_v16_k32", "metric_l2_u8", "filter_none_u32"]);
    let e = rt.link_all(&[&d, &bad], Arch::sm(80)).unwrap_err();
    assert!(e.to_string().contains("fraglink_metric_init_f32"), "{e}");
    assert_eq!(rt.link(&d, Arch::sm(80)).unwrap().source, Source::Memory);
    assert!(rt.link_all(&[], Arch::sm(80)).unwrap().is_empty());
}

/// `is_available` answers whether a link is due without making one: false
/// until the plan is linked, true from memory (a fresh planner of the same
/// fragments included), true from another runtime's disk entry, per arch;
/// it counts nothing.
#[test]
fn is_available_says_whether_a_link_is_due() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime(Some(tmp.path()));
    let plan = typed_plan();
    assert!(!rt.is_available(&plan, Arch::sm(80)).unwrap());
    assert_eq!(rt.stats().links, 0);
    rt.link(&plan, Arch::sm(80)).unwrap();
    assert!(rt.is_available(&plan, Arch::sm(80)).unwrap());
    assert!(rt.is_available(&typed_plan(), Arch::sm(80)).unwrap());
    assert!(!rt.is_available(&plan, Arch::sm(90)).unwrap());
    let st = rt.stats();
    assert_eq!((st.links, st.misses, st.hits), (1, 1, 0), "{st:?}");
    // Another process: nothing in its memory, the entry on the disk.
    let other = runtime(Some(tmp.path()));
    assert!(other.is_available(&typed_plan(), Arch::sm(80)).unwrap());
    assert!(!runtime(None)
        .is_available(&typed_plan(), Arch::sm(80))
        .unwrap());
    assert_eq!(
        other.link(&typed_plan(), Arch::sm(80)).unwrap().source,
        Source::Disk
    );
    // An empty plan is the link's error, not an answer.
    assert!(matches!(
        rt.is_available(&Planner::new("nothing"), Arch::sm(80)),
        Err(LinkError::EmptyPlan { .. })
    ));
}

#[test]
fn the_key_separates_archs_and_options() {
    let rt = runtime(None);
    let a = rt.link(&typed_plan(), Arch::sm(80)).unwrap();
    let b = rt.link(&typed_plan(), Arch::sm(90)).unwrap();
    let c = rt.link(&typed_plan().lineinfo(true), Arch::sm(80)).unwrap();
    assert_ne!(a.key, b.key);
    assert_ne!(a.key, c.key);
    assert_eq!(
        check_cubin(&b.kernel.cubin, "scan_f32_u32_v4_k128")
            .unwrap()
            .sm,
        Some(90)
    );
    let again = rt.link(&typed_plan(), Arch::sm(80)).unwrap();
    assert_eq!((again.key, again.source), (a.key, Source::Memory));
    assert_eq!(rt.stats().links, 3);
    rt.clear();
    assert_eq!(
        rt.link(&typed_plan(), Arch::sm(80)).unwrap().source,
        Source::Linked
    );
}

#[test]
fn every_opt_level_links() {
    // nvJitLink refuses `-O1` and `-O2` as options: levels 1 and 2 must
    // reach it as `-O3 -Xptxas=-O<n>`, and each level is its own cubin.
    let rt = runtime(None);
    let mut keys = Vec::new();
    for level in 0..=3 {
        let l = rt
            .link(&typed_plan().opt_level(level), Arch::sm(90))
            .unwrap_or_else(|e| panic!("opt level {level}: {e}"));
        check_cubin(&l.kernel.cubin, "scan_f32_u32_v4_k128").unwrap();
        keys.push(l.key);
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4);
}

#[test]
fn every_fast_compile_level_links_and_the_runtime_default_applies() {
    // nvJitLink takes `-Ofc=<level>` only without an `-O` level (ptxas
    // refuses the pair): each level must link, `Off` is the plain -O3 link,
    // and a runtime's default reaches plans that set no level, not those that do.
    let rt = runtime(None);
    let plain = rt.link(&typed_plan(), Arch::sm(90)).unwrap();
    let mut keys = vec![plain.key];
    for level in [FastCompile::Min, FastCompile::Mid, FastCompile::Max] {
        let l = rt
            .link(&typed_plan().fast_compile(level), Arch::sm(90))
            .unwrap_or_else(|e| panic!("fast compile {level}: {e}"));
        check_cubin(&l.kernel.cubin, "scan_f32_u32_v4_k128").unwrap();
        keys.push(l.key);
    }
    let off = rt
        .link(&typed_plan().fast_compile(FastCompile::Off), Arch::sm(90))
        .unwrap();
    assert_eq!(off.key, plain.key);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4);

    let min = rt
        .link(&typed_plan().fast_compile(FastCompile::Min), Arch::sm(90))
        .unwrap();
    let fast = runtime(None);
    assert!(fast.set_fast_compile(Some(FastCompile::Min)));
    assert!(!fast.set_fast_compile(None), "settled once");
    assert_eq!(fast.link(&typed_plan(), Arch::sm(90)).unwrap().key, min.key);
    let kept = fast
        .link(&typed_plan().fast_compile(FastCompile::Off), Arch::sm(90))
        .unwrap();
    assert_eq!(kept.key, plain.key);
}

#[test]
fn a_failed_link_carries_nvjitlinks_log_and_is_not_cached() {
    let rt = runtime(None);
    // An f16 metric cannot satisfy an f32 scan.
    let plan = Planner::new("scan_f32_u32_v4_k128")
        .add_named("scan_f32_u32_v4_k128")
        .unwrap()
        .add_named("metric_l2_f16")
        .unwrap()
        .add_named("filter_none_u32")
        .unwrap();
    for attempt in 1..=2 {
        let e = rt.link(&plan, Arch::sm(80)).unwrap_err().to_string();
        assert!(
            e.contains("Unresolved extern function 'fraglink_metric_init_f32'"),
            "{e}"
        );
        assert_eq!(rt.stats().failures, attempt);
    }
    assert_eq!(rt.stats().entries, 0);
}

#[test]
fn arch_older_than_the_lto_ir_is_a_clear_error() {
    let rt = runtime(None);
    let e = rt.link(&typed_plan(), Arch::sm(70)).unwrap_err();
    assert!(matches!(e, LinkError::ArchNotCovered { .. }), "{e}");
    assert!(e.to_string().contains("compute_75"), "{e}");
}

/// An L1 metric written by a user and compiled by NVRTC at run time.
const L1_F32: &str = r#"
#include "abi.cuh"
extern "C" __device__ void fraglink_metric_init_f32(fraglink_metric_state_f32* s) { s->a = 0.0f; s->qq = 0.0f; s->xx = 0.0f; }
extern "C" __device__ void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x) { s->a += fabsf(q - x); }
extern "C" __device__ float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s) { return s->a; }
"#;

#[test]
fn run_time_source_fragments_link_and_are_cached() {
    let rt = runtime(None);
    let plan = || {
        Planner::new("scan_f32_u32_v4_k128")
            .add::<ScanFragment<F32, U32, 4, 128>>()
            .add::<FilterFragment<NoneFilter, U32>>()
            .add_source("metric_l1_f32", L1_F32)
    };
    let l = rt.link(&plan(), Arch::sm(86)).unwrap();
    assert_eq!(l.source, Source::Linked);
    assert_eq!(
        l.kernel.fragments,
        ["scan_f32_u32_v4_k128", "filter_none_u32", "metric_l1_f32"]
    );
    check_cubin(&l.kernel.cubin, "scan_f32_u32_v4_k128").unwrap();
    assert_eq!(
        rt.link(&plan(), Arch::sm(86)).unwrap().source,
        Source::Memory
    );
    // Another source is another key.
    let other = Planner::new("scan_f32_u32_v4_k128")
        .add::<ScanFragment<F32, U32, 4, 128>>()
        .add::<FilterFragment<NoneFilter, U32>>()
        .add_source(
            "metric_l1_f32",
            L1_F32.replace("fabsf(q - x)", "(q - x) * (q - x)"),
        );
    assert_eq!(
        rt.link(&other, Arch::sm(86)).unwrap().source,
        Source::Linked
    );
    // A compile error shows NVRTC's log.
    let broken = typed_plan().add_source("broken", "this is not CUDA");
    let e = rt.link(&broken, Arch::sm(86)).unwrap_err().to_string();
    assert!(e.contains("broken"), "{e}");
}

#[test]
fn a_second_process_finds_the_cubin_on_disk_and_corruption_relinks() {
    let dir = tempfile::tempdir().unwrap();
    let first = runtime(Some(dir.path()));
    let a = first.link(&typed_plan(), Arch::sm(80)).unwrap();
    assert_eq!(a.source, Source::Linked);
    // A new runtime stands for a new process.
    let second = runtime(Some(dir.path()));
    let b = second.link(&typed_plan(), Arch::sm(80)).unwrap();
    assert_eq!(b.source, Source::Disk);
    assert_eq!(b.kernel.cubin, a.kernel.cubin);
    assert_eq!(b.kernel.metadata, a.kernel.metadata);
    // Flip one payload byte: detected, not loaded, replaced by a fresh link.
    let path = second.disk().unwrap().entry_path(&a.key.hex());
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let third = runtime(Some(dir.path()));
    let c = third.link(&typed_plan(), Arch::sm(80)).unwrap();
    assert_eq!(c.source, Source::Linked);
    assert_eq!(c.kernel.cubin, a.kernel.cubin);
    assert_eq!(third.disk().unwrap().stats().corrupt, 1);
    let fourth = runtime(Some(dir.path()));
    assert_eq!(
        fourth.link(&typed_plan(), Arch::sm(80)).unwrap().source,
        Source::Disk
    );
}
