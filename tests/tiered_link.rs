//! Tiered links (src/link/tiered.rs): a cold plan's first call gets a quick
//! link of the fragments' SASS (no LTO), the optimised link follows in the
//! background and takes over; every kernel a search can launch has a quick
//! link for sm_90 that fits its launch. Real nvJitLink, no GPU needed.

use fraglink::build::Arch;
use fraglink::link::disk::DiskCacheConfig;
use fraglink::link::metadata::check_cubin;
use fraglink::link::prelink::PlanFamily;
use fraglink::link::tiered::STATIC_SHARED_LIMIT;
use fraglink::link::{LinkRuntime, Planner, RuntimeConfig, Source};
use fraglink::search::ivf::gpu::IVF_SCAN_FAMILY;
use fraglink::search::knn::plan::{
    all_plans, tile_static_bytes, SharedMemory, KNN_BLOCK, KNN_FAMILY,
};
use fraglink::search::knn::select::{SELECT_BLOCK, SELECT_FAMILY};
use fraglink::search::plan::SCAN_FAMILY;

const SM90: Arch = Arch::sm(90);

fn scan_plan() -> Planner {
    Planner::new("scan_f32_u32_v4_k32")
        .add_named("scan_f32_u32_v4_k32")
        .unwrap()
        .add_named("metric_l2_f32")
        .unwrap()
        .add_named("filter_none_u32")
        .unwrap()
}

/// A runtime of its own over a disk cache in `dir`, for the life of the
/// test binary (`link_tiered` starts threads that outlive a call).
fn runtime(dir: &std::path::Path) -> &'static LinkRuntime {
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 64,
        disk: Some(DiskCacheConfig::new(dir)),
    })
    .unwrap();
    Box::leak(Box::new(rt))
}

#[test]
fn a_cold_plan_links_quickly_then_the_optimised_kernel_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path());
    let plan = scan_plan();
    let first = rt.link_tiered(&plan, SM90).unwrap();
    assert!(first.kernel.quick, "{:?}", first.source);
    assert_eq!(first.source, Source::Linked);
    let info = check_cubin(&first.kernel.cubin, plan.entry()).unwrap();
    assert!(info.entry_is_kernel);
    assert_eq!(info.sm, Some(90));
    assert_eq!(rt.wait_for_upgrades(), 0);
    assert!(rt.upgrade_error(&plan, SM90).is_none());
    // The optimised kernel now answers, from memory, under the key a plain
    // link has; it went to disk, the quick one did not.
    let next = rt.link_tiered(&plan, SM90).unwrap();
    assert!(!next.kernel.quick);
    assert_eq!(next.source, Source::Memory);
    let full = rt.link(&plan, SM90).unwrap();
    assert_eq!(next.key, full.key);
    assert_ne!(first.key, full.key);
    let disk = rt.disk().unwrap();
    assert!(disk.holds(&full.key.hex()));
    assert!(!disk.holds(&first.key.hex()));
    // The optimised kernel is the LTO one: the metric and filter inlined.
    assert!(first.kernel.metadata.registers >= full.kernel.metadata.registers);
    assert_eq!(full.kernel.metadata.stack_bytes, 0);

    // A fresh process over the same disk cache takes the optimised kernel
    // from disk at once: a quick link only stands in for a cold link.
    let again = runtime(dir.path());
    let from_disk = again.link_tiered(&plan, SM90).unwrap();
    assert_eq!(from_disk.source, Source::Disk);
    assert!(!from_disk.kernel.quick);
    assert_eq!(again.wait_for_upgrades(), 0);
}

/// Set in the child process of the exit test.
const CHILD_VAR: &str = "FRAGLINK_TIERED_EXIT_CHILD";

/// A process that exits right after its first (quick) link still leaves
/// the optimised kernel on disk for the next one: its exit waits for the
/// link running in the background (and does not tear nvJitLink down under
/// it). The child is this test, re-run in a process of its own.
#[test]
fn a_process_exiting_after_a_quick_link_leaves_the_optimised_kernel_on_disk() {
    if std::env::var_os(CHILD_VAR).is_some() {
        let rt = LinkRuntime::global().unwrap();
        let l = rt.link_tiered(&scan_plan(), SM90).unwrap();
        assert!(l.kernel.quick, "{:?}", l.source);
        // Returning ends the process with the optimised link still running.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_process_exiting_after_a_quick_link_leaves_the_optimised_kernel_on_disk",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env("FRAGLINK_CACHE_DIR", dir.path())
        .env_remove("FRAGLINK_CACHE_DISABLE")
        .env_remove("FRAGLINK_QUICK_LINK")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child: {:?} {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rt = runtime(dir.path());
    let next = rt.link_tiered(&scan_plan(), SM90).unwrap();
    assert_eq!(next.source, Source::Disk);
    assert!(!next.kernel.quick);
}

#[test]
fn no_quick_link_where_it_would_differ_or_is_switched_off() {
    let dir = tempfile::tempdir().unwrap();
    // Registers capped: the SASS was compiled without the cap.
    let rt = runtime(dir.path());
    let capped = scan_plan().max_registers(40);
    assert!(rt.link_quick(&capped, SM90).unwrap().is_none());
    let l = rt.link_tiered(&capped, SM90).unwrap();
    assert!(!l.kernel.quick);
    assert_eq!(l.source, Source::Linked);
    // No SASS for sm_80 in the default archs (compute_80 is LTO-IR only).
    let l = rt.link_tiered(&scan_plan(), Arch::sm(80)).unwrap();
    assert!(!l.kernel.quick);
    // Switched off.
    let off = runtime(dir.path());
    assert!(off.set_quick_link(false));
    let other = Planner::new("scan_f32_u32_v1_k128")
        .add_named("scan_f32_u32_v1_k128")
        .unwrap()
        .add_named("metric_cosine_f32")
        .unwrap()
        .add_named("filter_bitset_u32")
        .unwrap();
    let l = off.link_tiered(&other, SM90).unwrap();
    assert!(!l.kernel.quick);
    assert_eq!(l.source, Source::Linked);
    assert_eq!(rt.wait_for_upgrades() + off.wait_for_upgrades(), 0);
}

#[test]
fn several_plans_link_quickly_together_and_upgrade_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path());
    let plans = KNN_FAMILY.plans();
    let pair = [&plans[0], &plans[1]];
    let first = rt.link_all_tiered(&pair, SM90).unwrap();
    assert!(first.iter().all(|l| l.kernel.quick));
    // Asked again before the upgrade is done: the same quick kernels.
    let again = rt.link_all_tiered(&pair, SM90).unwrap();
    for (a, b) in first.iter().zip(&again) {
        assert!(b.kernel.quick == (a.key == b.key));
    }
    assert_eq!(rt.wait_for_upgrades(), 0);
    let done = rt.link_all_tiered(&pair, SM90).unwrap();
    assert!(done
        .iter()
        .all(|l| !l.kernel.quick && l.source == Source::Memory));
    assert_eq!(rt.stats().links, 4, "two quick and two optimised links");
}

/// The driver's shared memory reservation per block, which a quick link's
/// cubin counts in its static figure (`link::tiered::STATIC_SHARED_LIMIT`).
const RESERVED: u32 = 1024;

fn param(p: &Planner, key: &str) -> u32 {
    p.static_fragments()[0]
        .param(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Every plan `family` makes, quickly linked for sm_90 and checked: a
/// kernel entry, registers that fit `block` threads, static shared memory
/// within 48 KiB and at most `shared_most(plan)`. `no_quick(plan)`: the
/// plans that must get no quick link. Returns (plans, linked in full, most
/// registers, largest stack frame).
fn check_family(
    rt: &LinkRuntime,
    family: &PlanFamily,
    block: impl Fn(&Planner) -> u32,
    shared_most: impl Fn(&Planner) -> u32,
    no_quick: impl Fn(&Planner) -> bool,
) -> (usize, usize, u32, u32) {
    let plans = family.plans();
    assert!(!plans.is_empty(), "{}", family.name);
    let (mut full, mut most_registers, mut most_stack) = (0, 0, 0);
    for p in &plans {
        let l = rt
            .link_quick(p, SM90)
            .unwrap_or_else(|e| panic!("{}: {e}", p.entry()));
        let Some(l) = l else {
            assert!(no_quick(p), "{}: no quick link", p.entry());
            full += 1;
            continue;
        };
        assert!(!no_quick(p), "{}: a quick link", p.entry());
        assert!(l.kernel.quick);
        for e in p.entries() {
            let info = check_cubin(&l.kernel.cubin, e).unwrap();
            assert!(info.entry_is_kernel, "{e}");
        }
        let m = &l.kernel.metadata;
        assert!(m.registers * block(p) <= 65536, "{}: {m:?}", p.entry());
        let shared = m.shared_bytes.unwrap_or(0);
        assert!(shared <= STATIC_SHARED_LIMIT, "{}: {shared} B", p.entry());
        assert!(
            shared <= shared_most(p),
            "{}: {shared} B of static shared memory, at most {} expected",
            p.entry(),
            shared_most(p)
        );
        most_registers = most_registers.max(m.registers);
        most_stack = most_stack.max(m.stack_bytes);
    }
    (plans.len(), full, most_registers, most_stack)
}

#[test]
fn every_kernel_a_search_launches_links_quickly_for_sm90_and_fits_its_launch() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path());
    let any = |_: &Planner| STATIC_SHARED_LIMIT;
    let scan = check_family(rt, &SCAN_FAMILY, |_| 128, any, |_| false);
    // IVF's capacity 2048 declares the whole 48 KiB: no room for the
    // reservation, so it links in full.
    let ivf = check_family(
        rt,
        &IVF_SCAN_FAMILY,
        |_| 128,
        any,
        |p| param(p, "capacity") == 2048,
    );
    assert_eq!(ivf.1, IVF_SCAN_FAMILY.plans().len() / 7, "{ivf:?}");
    // The candidate kernel's launch adds dynamic shared memory to the
    // static figure its plan assumed (knn::plan::tile_static_bytes): the
    // quick kernel takes that and the reservation, no more, and every plan
    // leaves room for the reservation on an H100/H200.
    let knn = check_family(
        rt,
        &KNN_FAMILY,
        |_| KNN_BLOCK,
        |p| {
            if p.static_fragments()[0].family != "knn_tile" {
                return STATIC_SHARED_LIMIT;
            }
            // Only one-byte rows stage differently (knn_tile.cuh).
            let elem = match p.static_fragments()[0].param("dtype") {
                Some("i8" | "u8") => 1,
                _ => 4,
            };
            tile_static_bytes(
                elem,
                param(p, "qtile"),
                param(p, "rtile"),
                param(p, "capacity"),
            ) + RESERVED
        },
        |_| false,
    );
    for plan in all_plans() {
        assert!(
            plan.shared_bytes() + RESERVED <= SharedMemory::H100.per_block,
            "{}: {} B",
            plan.tile.name,
            plan.shared_bytes()
        );
    }
    let select = check_family(
        rt,
        &SELECT_FAMILY,
        |p| param(p, "block").max(SELECT_BLOCK),
        any,
        |_| false,
    );
    println!("quick links for sm_90 (plans, linked in full, most registers, largest stack):");
    println!("  scan {scan:?}, ivf_scan {ivf:?}, knn {knn:?}, select {select:?}");
}
