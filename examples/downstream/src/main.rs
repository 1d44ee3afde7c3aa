//! A downstream crate's kernels through fraglink: lists what the build
//! recorded, then plans and links every kernel of every fragment for several
//! GPU generations, one multi-entry link per fragment and arch.
//!
//! `fraglink-downstream-example`        catalog, links, times (no GPU needed)
//! `fraglink-downstream-example gpu`    launches the kernels and checks them
mod gpu;
mod registry {
    include!(concat!(env!("OUT_DIR"), "/fraglink_registry.rs"));
}

use std::time::Instant;

use fraglink::build::Arch;
use fraglink::fragment::StaticFragment;
use fraglink::link::{LinkRuntime, Planner, RuntimeConfig};
use registry::{AxpyFragment, ElementwiseFragment, Float, QuantizeFragment, F32};

/// The targets every fragment is linked for (no GPU needed to link).
const TARGETS: &[&str] = &["sm_75", "sm_80", "sm_86", "sm_90", "sm_90a"];

fn main() {
    if std::env::args().nth(1).as_deref() == Some("gpu") {
        std::process::exit(gpu::run());
    }
    for info in registry::CATALOG {
        let per_arch: Vec<String> = info
            .entries
            .iter()
            .map(|(arch, names)| format!("{arch}:{}", names.len()))
            .collect();
        println!(
            "fragment {} {} {} bytes kernels {}",
            info.name,
            info.family,
            info.fatbin.len(),
            per_arch.join(",")
        );
    }
    // Typed access: the tag types exist only for built combinations.
    let axpy = <AxpyFragment<F32>>::info();
    println!(
        "typed {} {}",
        axpy.name,
        <ElementwiseFragment<256>>::info().name
    );
    let q = <QuantizeFragment<Float>>::info();
    println!(
        "lowered quantize<float> {}",
        q.lowered_name("quantize<float>").unwrap_or("?")
    );

    // Links go to a memory-only runtime: every link below is a real one.
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 1024,
        disk: None,
    })
    .unwrap_or_else(|e| fail(e));
    let mut links = 0usize;
    let mut kernels = 0usize;
    let started = Instant::now();
    for target in TARGETS {
        let arch = Arch::parse(target, "TARGETS").unwrap_or_else(|e| fail(e));
        for info in registry::CATALOG {
            let built: Vec<Arch> = info
                .archs
                .iter()
                .filter_map(|a| Arch::parse(a, "catalog").ok())
                .collect();
            let Some(chosen) = Arch::chosen_for(&built, arch) else {
                continue;
            };
            let names = info.entries_for(&chosen.to_string()).unwrap_or(&[]);
            let mut plan = Planner::empty().add_fragment(info);
            for n in names {
                plan = plan.with_entry(*n);
            }
            let linked = plan.link_with(&rt, arch).unwrap_or_else(|e| fail(e));
            links += 1;
            kernels += linked.kernel.kernels.len();
            println!(
                "link {} {target} {} kernels {} bytes {:.1} ms",
                info.name,
                linked.kernel.kernels.len(),
                linked.kernel.cubin.len(),
                linked.kernel.metadata.link_ms
            );
        }
    }
    println!(
        "linked {kernels} kernels in {links} links, {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    compare_one_link_with_one_per_kernel();
    // The guarded bf16 kernel: not in the compute_75 IR used for sm_75.
    let guarded = Planner::new("affine_bf16")
        .add::<ElementwiseFragment<256>>()
        .link_with(&rt, Arch::sm(75));
    match guarded {
        Err(e) => println!("guarded {e}"),
        Ok(_) => fail("affine_bf16 linked for sm_75, where its arch guard removes it"),
    }
    println!("{}", env!("DOWNSTREAM_BUILD"));
}

/// One link for all 8 kernels of a file against 8 single-kernel links (the
/// only way before multi-entry plans), each side on a fresh runtime so every
/// link is real; sides alternate, 3 rounds.
fn compare_one_link_with_one_per_kernel() {
    let info = <ElementwiseFragment<128>>::info();
    let arch = Arch::sm(86);
    let names = info.entries_for("compute_80").unwrap_or(&[]);
    let fresh = || {
        LinkRuntime::new(RuntimeConfig {
            memory_capacity: 64,
            disk: None,
        })
        .unwrap_or_else(|e| fail(e))
    };
    let (mut one, mut each) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        let rt = fresh();
        let t = Instant::now();
        let mut plan = Planner::empty().add_fragment(info);
        for n in names {
            plan = plan.with_entry(*n);
        }
        plan.link_with(&rt, arch).unwrap_or_else(|e| fail(e));
        one += t.elapsed().as_secs_f64();
        let rt = fresh();
        let t = Instant::now();
        for n in names {
            Planner::new(*n)
                .add_fragment(info)
                .link_with(&rt, arch)
                .unwrap_or_else(|e| fail(e));
        }
        each += t.elapsed().as_secs_f64();
    }
    println!(
        "multi-entry {} {} kernels: one link {:.0} ms, one link per kernel {:.0} ms (mean of 3)",
        info.name,
        names.len(),
        one / 3.0 * 1e3,
        each / 3.0 * 1e3
    );
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(2)
}
