//! Linking whole scan families and checking every cubin (the brute-force
//! `scan` family and IVF-Flat's `ivf_scan` share the launch contract: 128
//! threads per block, a shared-memory top-k of `capacity + 128` slots rounded
//! up to a power of two, each a distance and an id; the tensor-core k-NN
//! families use [`link_each_checked`] with their own shared memory).

use fraglink::build::Arch;
use fraglink::fragments;
use fraglink::link::metadata::check_cubin;
use fraglink::link::{LinkRuntime, Planner};

/// The id type of a scan fragment: its `idx` parameter (IVF scans have none:
/// their ids are i64).
fn idx_of(scan: &fraglink::fragment::FragmentInfo) -> &'static str {
    scan.param("idx").unwrap_or("i64")
}

/// One plan per fragment of `family`, with `metric_<metric>_<dtype>` and
/// `filter_<filter>_<idx>` fitting it.
pub fn family_plans(family: &str, metric: &str, filter: &str) -> Vec<Planner> {
    fragments::catalog()
        .iter()
        .filter(|f| f.family == family)
        .map(|s| {
            let dtype = s.param("dtype").unwrap();
            Planner::new(s.name)
                .add_named(s.name)
                .unwrap()
                .add_named(&format!("metric_{metric}_{dtype}"))
                .unwrap()
                .add_named(&format!("filter_{filter}_{}", idx_of(s)))
                .unwrap()
        })
        .collect()
}

/// Links `plans` for `arch` on a thread per core (4 at least, at a lower CPU
/// priority: [`super::yield_cpu_to_other_tests`]) and checks each cubin: a CUDA ELF
/// with the entry as a kernel, no spills and no stack, 1 to `max_registers`
/// registers (at most 512 for the 128 threads per block every fraglink
/// kernel launches with), and the static shared memory `shared_of(plan)`.
/// Returns `(entry, registers)` per plan, in order.
pub fn link_each_checked(
    rt: &LinkRuntime,
    plans: &[Planner],
    arch: Arch,
    max_registers: u32,
    shared_of: impl Fn(&Planner) -> std::ops::RangeInclusive<u32> + Sync,
) -> Vec<(String, u32)> {
    let shared_of = &shared_of;
    super::yield_cpu_to_other_tests();
    std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .chunks(plans.len().div_ceil(super::threads_at_least(4)).max(1))
            .map(|chunk| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for p in chunk {
                        let l = rt
                            .link(p, arch)
                            .unwrap_or_else(|e| panic!("{} for {arch}: {e}", p.entry()));
                        let info = check_cubin(&l.kernel.cubin, p.entry()).unwrap();
                        assert_eq!(info.machine, 190);
                        assert!(info.entry_is_kernel, "{}", p.entry());
                        let m = &l.kernel.metadata;
                        assert_eq!(
                            (m.spill_stores, m.spill_loads, m.stack_bytes),
                            (0, 0, 0),
                            "{} {arch}: {m:?}",
                            p.entry()
                        );
                        // The launchers use 128 threads per block.
                        assert!(m.registers >= 1 && m.registers * 128 <= 65536, "{m:?}");
                        assert!(
                            m.registers <= max_registers,
                            "{} {arch}: {} registers",
                            p.entry(),
                            m.registers
                        );
                        let shared = m.shared_bytes.unwrap_or(0);
                        let want = shared_of(p);
                        assert!(
                            want.contains(&shared),
                            "{} {arch}: {shared} bytes of static shared memory, not in {want:?}",
                            p.entry()
                        );
                        out.push((p.entry().to_string(), m.registers));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// [`link_each_checked`] for the scan families: the shared memory the
/// capacity implies, and at most 64 registers up to capacity 256, 80 above
/// (IVF's 512 … 2048, whose larger sorts take up to 73 on sm_75 and 65 on
/// sm_90: 80 × 128 threads still leave 6 blocks an SM, more than sm_75's
/// 64 KiB of shared memory holds of their 12 to 48 KiB blocks; on sm_90 a
/// 12 KiB block at 40 registers is bound by registers at 12 an SM).
pub fn link_all_checked(rt: &LinkRuntime, plans: &[Planner], arch: Arch) {
    let capacity = |p: &Planner| -> u32 {
        let scan = p.static_fragments()[0];
        scan.param("capacity").unwrap().parse().unwrap()
    };
    let shared = |p: &Planner| {
        let scan = p.static_fragments()[0];
        let idx_bytes = if idx_of(scan) == "i64" { 8 } else { 4 };
        let slots = (capacity(p) + 128).next_power_of_two();
        let bytes = slots * (4 + idx_bytes) + row_stage_bytes(scan, arch);
        bytes..=bytes
    };
    let (small, large): (Vec<Planner>, Vec<Planner>) =
        plans.iter().cloned().partition(|p| capacity(p) <= 256);
    link_each_checked(rt, &small, arch, 64, shared);
    link_each_checked(rt, &large, arch, 80, shared);
}

/// The brute-force scan's two stages of 128 row chunks of 128 bytes plus the
/// copy size (scan.cuh's `RowStage`): from sm_80, for variants whose copies
/// (element size × veclen) are 4 or 16 bytes; 0 elsewhere (and for the IVF
/// scan).
pub fn row_stage_bytes(scan: &fraglink::fragment::FragmentInfo, arch: Arch) -> u32 {
    let elem = match scan.param("dtype") {
        Some("f32") => 4,
        Some("f16") => 2,
        _ => 1,
    };
    let copy = elem
        * scan
            .param("veclen")
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
    if scan.family == "scan" && arch.number >= 80 && (copy == 4 || copy == 16) {
        2 * 128 * (128 + copy)
    } else {
        0
    }
}
