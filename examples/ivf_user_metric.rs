//! A run-time user metric in the IVF-Flat scan, through `Planner::add_source`.
//!
//! cuVS lets a user compile a metric with NVRTC at run time in place of its
//! metric fragment; fraglink does the same through the planner: the source
//! below defines the f32 metric ABI (`fraglink_metric_{init,accumulate,finalize}_f32`,
//! fragments/abi.cuh) as the L1 (Manhattan) distance, and the planner links it
//! with the shipped `ivf_scan_f32_v4_k32_asc` entry and `filter_none_i64`
//! instead of a shipped `metric_*_f32`. NVRTC compiles it to LTO-IR once per
//! content, arch and NVRTC version; nvJitLink inlines it into the scan.
//!
//! Without a GPU the example links the plan for sm_75, sm_80 and sm_90 and
//! prints the kernel's resources. With one it also builds an index, searches
//! it on the device with the L1 scan (`GpuIvfIndex::search_with`) and checks
//! every result against a host L1 over the same probed lists.
//!
//!     cargo run --release --example ivf_user_metric
//!
//! A similarity (larger is closer) links with the `_desc` variant of the entry.

use fraglink::build::Arch;
use fraglink::gpu::GpuContext;
use fraglink::link::{LinkRuntime, Planner};
use fraglink::search::data::synthetic;
use fraglink::search::gpu::GpuSearcher;
use fraglink::search::ivf::gpu::GpuIvfIndex;
use fraglink::search::ivf::{
    build_index, probe_lists, IvfBuildParams, IvfSearchParams, MetricSpec,
};
use fraglink::search::{DType, Metric, Vectors};

/// The user's metric: Σ |q_j − x_j|, folded in order, one rounding per step.
const L1_F32: &str = r#"
#include "abi.cuh"
extern "C" FRAGLINK_HD void fraglink_metric_init_f32(fraglink_metric_state_f32* s) {
  s->a = 0.0f; s->qq = 0.0f; s->xx = 0.0f;
}
extern "C" FRAGLINK_HD void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x) {
  s->a = __fadd_rn(s->a, fabsf(__fsub_rn(q, x)));
}
extern "C" FRAGLINK_HD float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s) { return s->a; }
"#;

const ENTRY: &str = "ivf_scan_f32_v4_k32_asc";

fn l1_planner() -> Result<Planner, Box<dyn std::error::Error>> {
    Ok(Planner::new(ENTRY)
        .add_named(ENTRY)?
        .add_source("metric_l1_f32", L1_F32)
        .add_named("filter_none_i64")?)
}

/// The same L1 on the host, in the same order (q − x rounded, |·|, added).
fn l1(q: &[f32], x: &[f32]) -> f32 {
    q.iter().zip(x).fold(0.0f32, |a, (q, x)| a + (q - x).abs())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = LinkRuntime::memory_only()?;
    for sm in [75, 80, 90] {
        let l = rt.link(&l1_planner()?, Arch::sm(sm))?;
        let m = &l.kernel.metadata;
        println!(
            "{ENTRY} + metric_l1_f32 (run-time source) + filter_none_i64 for sm_{sm}: \
             {} registers, {} spill stores, {} B shared",
            m.registers,
            m.spill_stores,
            m.shared_bytes.unwrap_or(0)
        );
    }
    let Ok(ctx) = GpuContext::default() else {
        println!("no GPU: linked only");
        return Ok(());
    };
    let gpu = GpuSearcher::new(ctx)?;
    let (base, queries) = synthetic(20_000, 64, 100, DType::F32, 1);
    // The entry reads veclen-4 lists; f32 indexes store veclen 1 unless asked.
    let mut bp = IvfBuildParams::new(64, MetricSpec::plain(Metric::L2));
    bp.veclen = Some(4);
    let index = build_index(&base, &bp)?;
    let dev = GpuIvfIndex::upload(&gpu, &index)?;
    let (k, nprobe) = (10, 8);
    let p = IvfSearchParams::new(k, nprobe);
    let found = dev.search_with(&l1_planner()?, 32, &queries, &p)?;
    // Host check: L1 over the rows of the same probed lists, ties to the smaller id.
    let probes = probe_lists(&index, &queries, nprobe)?;
    let Vectors::F32(b) = &base else {
        unreachable!()
    };
    let Vectors::F32(q) = &queries else {
        unreachable!()
    };
    for qi in 0..queries.rows() {
        let mut all: Vec<(f32, i64)> = probes[qi * nprobe..(qi + 1) * nprobe]
            .iter()
            .flat_map(|&l| index.lists().ids(l as usize).to_vec())
            .map(|id| (l1(q.row(qi), b.row(id as usize)), id))
            .collect();
        all.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        let want: Vec<i64> = all.iter().take(k).map(|x| x.1).collect();
        assert_eq!(found.ids_of(qi), &want[..], "query {qi}");
    }
    println!(
        "GPU L1 IVF search of {} queries matches the host L1",
        queries.rows()
    );
    Ok(())
}
