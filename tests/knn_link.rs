//! Every tensor-core k-NN variant (fragments/knn_tile.cuh) links through its
//! planner for each arch it declares (`min_arch`: f16 MMA (f16 rows and
//! f16copy) and integer MMA from sm_75, TF32 from sm_80; sm_90 for all), with zero spills, no stack, a
//! register count that fits the 128-thread launch and the static shared
//! memory the layout in knn_tile.cuh implies. Real nvJitLink, no GPU needed.
//! The two-pass select's kernels (fragments/knn_select.cuh) link the same
//! way for sm_75, sm_80 and sm_90. Prints registers per variant per arch
//! (`--nocapture`).

mod support;

use fraglink::build::Arch;
use fraglink::link::{LinkRuntime, Planner, RuntimeConfig};
use fraglink::search::knn::plan::{all_plans, tile_static_bytes};
use support::scan_links::link_each_checked;

fn runtime() -> LinkRuntime {
    LinkRuntime::new(RuntimeConfig {
        memory_capacity: 1024,
        disk: None,
    })
    .unwrap()
}

fn param(p: &Planner, key: &str) -> u32 {
    p.static_fragments()[0].param(key).unwrap().parse().unwrap()
}

fn elem_bytes(p: &Planner) -> u32 {
    match p.static_fragments()[0].param("dtype").unwrap() {
        "f32" => 4,
        "f16" => 2,
        _ => 1,
    }
}

/// knn_tile's static shared memory: the plan's figure
/// (`knn::plan::tile_static_bytes`), less the second query norm integers do
/// not use (the compiler drops it), and possibly one more per-query array
/// (4 bytes a query) the linked metric does not read: with fragments built
/// pre-optimized (`Family::pre_optimize`) the optimizer drops it for some
/// cosine and inner-product variants (f16 q16 cosine: 27392 of 27456 bytes),
/// so the plan's figure is an upper bound there. The candidate buffers are
/// dynamic.
fn tile_shared(p: &Planner) -> std::ops::RangeInclusive<u32> {
    let (qt, rt, cap) = (param(p, "qtile"), param(p, "rtile"), param(p, "capacity"));
    let unused = if elem_bytes(p) == 1 { 4 * qt } else { 0 };
    let most = tile_static_bytes(elem_bytes(p), qt, rt, cap) - unused;
    most - 4 * qt..=most
}

/// knn_rerank's: scan.cuh's block top-k over next_pow2(CAP + 4 × 128) (f32,
/// u32) keys, the capacity and four tiles of offers, and the packed window's
/// 128 chunk starts and 4 warp sums (u32; knn_tile.cuh's run_rerank and
/// pack_counts).
fn rerank_shared(p: &Planner) -> std::ops::RangeInclusive<u32> {
    let bytes = (param(p, "capacity") + 4 * 128).next_power_of_two() * 8 + (128 + 4) * 4;
    bytes..=bytes
}

/// The tile plans (every metric and filter) whose variant needs at most `arch`.
fn tile_plans(arch: Arch) -> Vec<Planner> {
    all_plans()
        .into_iter()
        .filter(|p| p.tile.param("min_arch").unwrap().parse::<u32>().unwrap() <= arch.number)
        .map(|p| p.tile_planner())
        .collect()
}

fn rerank_plans() -> Vec<Planner> {
    let mut v: Vec<Planner> = all_plans().iter().map(|p| p.rerank_planner()).collect();
    v.sort_by_key(|a| a.fragment_names());
    v.dedup_by(|a, b| a.fragment_names() == b.fragment_names());
    v
}

#[test]
fn every_knn_tile_variant_links_spill_free_for_its_archs() {
    let rt = runtime();
    // 96 variants (48 shapes × 2 stagings) × 3 metrics × 2 filters; the
    // TF32 ones (32) need sm_80 (f16copy's 16 run from sm_75).
    assert_eq!(tile_plans(Arch::sm(90)).len(), 96 * 6);
    assert_eq!(tile_plans(Arch::sm(75)).len(), 64 * 6);
    for arch in [Arch::sm(75), Arch::sm(80), Arch::sm(90)] {
        let plans = tile_plans(arch);
        let regs = link_each_checked(&rt, &plans, arch, 255, tile_shared);
        let mut seen = std::collections::BTreeMap::new();
        for (entry, r) in regs {
            let e = seen.entry(entry).or_insert((r, r));
            e.0 = e.0.min(r);
            e.1 = e.1.max(r);
        }
        for (entry, (lo, hi)) in seen {
            println!("{arch} {entry}: {lo}-{hi} registers, 0 spills");
        }
    }
}

#[test]
fn tf32_variants_do_not_exist_before_sm80() {
    let rt = runtime();
    let p = all_plans()
        .into_iter()
        .find(|p| p.tile.name == "knn_tile_f32_tf32x3_q16_r64_k32")
        .unwrap();
    assert_eq!(p.tile.archs, ["compute_80", "sm_90"]);
    let e = rt.link(&p.tile_planner(), Arch::sm(75)).unwrap_err();
    assert!(
        e.to_string().contains("knn_tile_f32_tf32x3_q16_r64_k32"),
        "{e}"
    );
}

#[test]
fn every_knn_rerank_variant_links_spill_free() {
    let rt = runtime();
    let plans = rerank_plans();
    // 4 dtypes × 5 capacities × 3 metrics.
    assert_eq!(plans.len(), 60);
    for arch in [Arch::sm(75), Arch::sm(80), Arch::sm(90)] {
        // Up to 96 registers: the 1024-capacity re-rank's block sort of 2048
        // keys takes 79-82 on sm_75 (74-76 before the packed windows of
        // pack_counts); 6 of its 128-thread blocks still fit an SM by
        // registers (the others stay at 72 or below).
        for (entry, r) in link_each_checked(&rt, &plans, arch, 96, rerank_shared) {
            println!("{arch} {entry}: {r} registers, 0 spills");
        }
    }
}

/// knn_dist's static shared memory: the staged query and row elements,
/// `[32][33]` and `[32][65]` of the dtype (knn_select.cuh).
fn dist_shared(p: &Planner) -> std::ops::RangeInclusive<u32> {
    let bytes = (32 * 33 + 32 * 65) * elem_bytes(p);
    bytes..=bytes
}

#[test]
fn the_two_pass_select_links_spill_free() {
    use fraglink::search::knn::select::{SELECT_FAMILY, SELECT_STATIC_BYTES};
    let rt = runtime();
    let plans = SELECT_FAMILY.plans();
    // 4 dtypes × 3 metrics × 2 filters distance kernels, one select kernel.
    assert_eq!(plans.len(), 25);
    let (select, dist): (Vec<Planner>, Vec<Planner>) = plans
        .into_iter()
        .partition(|p| p.entry().starts_with("knn_select"));
    for arch in [Arch::sm(75), Arch::sm(80), Arch::sm(90)] {
        // At most 128 registers: two 256-thread blocks per SM by registers.
        for (entry, r) in link_each_checked(&rt, &dist, arch, 128, dist_shared) {
            println!("{arch} {entry}: {r} registers, 0 spills");
        }
        // A histogram per warp, the picked bin (three words) and the count
        // of kept keys, rounded up to the 16-byte alignment of the dynamic
        // part (the sorted keys) that follows.
        let static_bytes = (8 * 256 * 4 + 12 + 4_u32).next_multiple_of(16);
        let (entry, r) =
            &link_each_checked(&rt, &select, arch, 128, |_| static_bytes..=static_bytes)[0];
        println!("{arch} {entry}: {r} registers, 0 spills");
        assert!(static_bytes <= SELECT_STATIC_BYTES);
    }
}
