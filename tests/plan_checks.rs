//! The plan check before nvJitLink (issue 14): duplicate fragments, missing
//! or unknown entries, entries an arch guard removed, duplicate external
//! definitions (demangled); multi-entry links; arch-specific targets; and
//! the linker taking PTX without `-lto`. Real nvJitLink, no GPU.

use fraglink::build::Arch;
use fraglink::fragment::FragmentInfo;
use fraglink::fragments::{FilterFragment, MetricFragment, NoneFilter, ScanFragment, F32, L2, U32};
use fraglink::link::check::check_plan;
use fraglink::link::linker::{LinkInput, LinkOptions, Linker};
use fraglink::link::{LinkError, LinkRuntime, Planner, RuntimeConfig, Source};
use fraglink::sys::{InputType, Nvrtc, Output};

fn runtime() -> LinkRuntime {
    LinkRuntime::new(RuntimeConfig {
        memory_capacity: 64,
        disk: None,
    })
    .expect("nvJitLink loads from the path baked at build time")
}

const SCAN: &str = "scan_f32_u32_v4_k128";

fn scan_plan(entry: &str) -> Planner {
    Planner::new(entry)
        .add::<ScanFragment<F32, U32, 4, 128>>()
        .add::<MetricFragment<L2, F32>>()
        .add::<FilterFragment<NoneFilter, U32>>()
}

/// A fragment description for the check alone (it is never linked).
fn fake(
    name: &'static str,
    entries: &'static [(&'static str, &'static [&'static str])],
    definitions: &'static [&'static str],
) -> &'static FragmentInfo {
    Box::leak(Box::new(FragmentInfo {
        name,
        family: "fake",
        params: &[],
        archs: &["compute_75", "compute_80"],
        fatbin: &[],
        hash: name,
        entries,
        definitions,
        lowered: &[],
        sass: &[],
    }))
}

#[test]
fn a_fragment_given_twice_is_refused_before_nvjitlink() {
    let plan = scan_plan(SCAN).add_named(SCAN).unwrap();
    let e = runtime().link(&plan, Arch::sm(80)).unwrap_err();
    assert!(
        matches!(e.root(), LinkError::DuplicateFragment { name } if name == SCAN),
        "{e}"
    );
    assert!(e.to_string().contains("twice"), "{e}");
}

#[test]
fn missing_empty_and_unknown_entries_are_refused() {
    let rt = runtime();
    let none = Planner::empty().add::<ScanFragment<F32, U32, 4, 128>>();
    assert!(matches!(
        rt.link(&none, Arch::sm(80)).unwrap_err().root(),
        LinkError::NoEntry
    ));
    let empty = scan_plan("");
    assert!(matches!(
        rt.link(&empty, Arch::sm(80)).unwrap_err().root(),
        LinkError::EmptyEntry { .. }
    ));
    let e = rt
        .link(&scan_plan("scan_f32_u32_v4_k12"), Arch::sm(80))
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e.root(), LinkError::UnknownEntry { .. }), "{msg}");
    assert!(msg.contains(SCAN) && msg.contains("sm_80"), "{msg}");
}

#[test]
fn an_entry_removed_by_an_arch_guard_names_the_chosen_ir() {
    let f = fake(
        "elementwise",
        &[
            ("compute_75", &["affine_f32"]),
            ("compute_80", &["affine_f32", "affine_bf16"]),
        ],
        &[],
    );
    let plan = Planner::new("affine_bf16").add_fragment(f);
    let e = check_plan(&plan, Arch::sm(75)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LinkError::EntryGuarded { .. }), "{msg}");
    assert!(
        msg.contains("compute_75 LTO-IR")
            && msg.contains("sm_75")
            && msg.contains("compute_80")
            && msg.contains("#if __CUDA_ARCH__"),
        "{msg}"
    );
    // sm_86 uses the compute_80 IR, which has it.
    check_plan(&plan, Arch::sm(86)).unwrap();
}

#[test]
fn duplicate_external_definitions_are_named_demangled() {
    let a = fake("a", &[("compute_75", &["ka"])], &["_Z6helperi", "ka"]);
    let b = fake("b", &[("compute_75", &["kb"])], &["_Z6helperi", "kb"]);
    let e = check_plan(
        &Planner::new("ka").add_fragment(a).add_fragment(b),
        Arch::sm(80),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("`helper(int)` (`_Z6helperi`)"), "{msg}");
    assert!(msg.contains("`a`") && msg.contains("`b`"), "{msg}");
    // fraglink's own metrics define the same extern "C" functions.
    let e = runtime()
        .link(
            &scan_plan(SCAN)
                .add_named("metric_inner_product_f32")
                .unwrap(),
            Arch::sm(80),
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("`fraglink_metric_accumulate_f32` is defined by both fragment `metric_l2_f32` and fragment `metric_inner_product_f32`"),
        "{msg}"
    );
}

#[test]
fn one_link_serves_several_entries() {
    let rt = runtime();
    let two = Planner::new(SCAN)
        .with_entry("scan_f32_u32_v4_k256")
        .add::<ScanFragment<F32, U32, 4, 128>>()
        .add::<ScanFragment<F32, U32, 4, 256>>()
        .add::<MetricFragment<L2, F32>>()
        .add::<FilterFragment<NoneFilter, U32>>();
    let linked = rt.link(&two, Arch::sm(80)).unwrap();
    let names: Vec<&str> = linked.kernel.entries().collect();
    assert_eq!(names, [SCAN, "scan_f32_u32_v4_k256"]);
    assert!(
        linked
            .kernel
            .kernel("scan_f32_u32_v4_k256")
            .unwrap()
            .registers
            > 0
    );
    assert_eq!(linked.kernel.metadata.entry, SCAN);
    // The entry set is part of the key.
    let one = rt.link(&scan_plan(SCAN), Arch::sm(80)).unwrap();
    assert_ne!(one.key, linked.key);
    assert_eq!(one.kernel.kernels.len(), 1);
    // On disk (format version 3), every entry is checked and described.
    let dir = tempfile::tempdir().unwrap();
    on_disk(dir.path()).link(&two, Arch::sm(80)).unwrap();
    let hit = on_disk(dir.path()).link(&two, Arch::sm(80)).unwrap();
    assert_eq!(hit.source, Source::Disk);
    assert_eq!(
        hit.kernel.kernels,
        linked
            .kernel
            .kernels
            .iter()
            .map(|k| {
                let mut k = k.clone();
                k.link_ms = hit.kernel.kernels[0].link_ms;
                k
            })
            .collect::<Vec<_>>()
    );
}

/// A runtime with a disk cache in `dir` (a "process" of its own).
fn on_disk(dir: &std::path::Path) -> LinkRuntime {
    LinkRuntime::new(RuntimeConfig {
        memory_capacity: 8,
        disk: Some(fraglink::link::disk::DiskCacheConfig::new(dir)),
    })
    .unwrap()
}

#[test]
fn arch_specific_targets_link_under_their_own_key() {
    let rt = runtime();
    let sm90a = Arch::parse("sm_90a", "test").unwrap();
    let a = rt.link(&scan_plan(SCAN), sm90a).unwrap();
    let plain = rt.link(&scan_plan(SCAN), Arch::sm(90)).unwrap();
    assert_eq!(a.kernel.arch, "sm_90a");
    assert_ne!(
        a.key, plain.key,
        "cudf#23506: sm_90a and sm_90 cubins differ"
    );
}

#[test]
fn the_linker_takes_ptx_without_lto() {
    let nvrtc = Nvrtc::open(None).unwrap();
    let ptx = nvrtc
        .compile(
            r#"extern "C" __global__ void k(float* x) { x[0] = 1.0f; }"#,
            "k.cu",
            &["-arch=compute_80".to_string()],
            Output::Ptx,
        )
        .unwrap();
    let linker = Linker::open().unwrap();
    let mut options = LinkOptions::new(Arch::sm(80));
    options.kernels_used = vec!["k".into()];
    let inputs = [LinkInput {
        name: "k.ptx",
        kind: InputType::Ptx,
        bytes: &ptx.bytes,
    }];
    let out = linker.link(&inputs, &options).unwrap();
    fraglink::link::metadata::check_cubin(&out.cubin, "k").unwrap();
    assert!(!fraglink::link::linker::needs_lto([InputType::Ptx]));
}

#[test]
fn name_expressions_resolve_to_recorded_entries() {
    // fraglink's own families have no name expressions: the error lists none.
    let e = Planner::empty()
        .kernel::<ScanFragment<F32, U32, 4, 128>>("scan<float>")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`scan<float>`") && e.contains("Family::name_expression"),
        "{e}"
    );
    static LOWERED: &[(&str, &str)] = &[("quantize<float>", "_Z8quantizeIfEvPKT_Pafj")];
    let q: &'static FragmentInfo = Box::leak(Box::new(FragmentInfo {
        lowered: LOWERED,
        ..*fake(
            "q",
            &[
                ("compute_75", &["_Z8quantizeIfEvPKT_Pafj"]),
                ("compute_80", &["_Z8quantizeIfEvPKT_Pafj"]),
            ],
            &[],
        )
    }));
    let p = Planner::empty().kernel_of(q, "quantize<float>").unwrap();
    assert_eq!(p.entries(), ["_Z8quantizeIfEvPKT_Pafj"]);
    assert_eq!(p.fragment_names(), ["q"]);
    check_plan(&p, Arch::sm(80)).unwrap();
}

#[test]
fn run_time_sources_get_the_standard_header_stand_ins() {
    const SRC: &str = r#"#include <stdint.h>
#include <cmath>
extern "C" __global__ void rt_round(float* x, uint32_t n) { if (n) x[0] = std::round(x[0]) + INFINITY; }
"#;
    let plan = Planner::new("rt_round").add_source("rt_round", SRC);
    let linked = runtime().link(&plan, Arch::sm(80)).unwrap();
    assert_eq!(linked.kernel.kernels[0].entry, "rt_round");
}
