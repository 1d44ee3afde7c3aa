//! `fraglink catalog`: every embedded fragment and totals.

use std::collections::BTreeMap;
use std::process::ExitCode;

use fraglink::fragments;
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct CatalogArgs {
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
    /// Only fragments of this family.
    #[arg(long)]
    pub family: Option<String>,
}

pub fn run(args: &CatalogArgs) -> ExitCode {
    let frags: Vec<_> = fragments::catalog()
        .iter()
        .filter(|f| args.family.as_deref().is_none_or(|fam| f.family == fam))
        .collect();
    if let Some(fam) = &args.family {
        if frags.is_empty() {
            let families: std::collections::BTreeSet<_> =
                fragments::catalog().iter().map(|f| f.family).collect();
            eprintln!(
                "error: no family `{fam}`; families: {}",
                families.into_iter().collect::<Vec<_>>().join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let mut by_family: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for f in &frags {
        let e = by_family.entry(f.family).or_default();
        e.0 += 1;
        e.1 += f.fatbin.len();
    }
    let total_bytes: usize = frags.iter().map(|f| f.fatbin.len()).sum();
    if args.json {
        let list: Vec<_> = frags
            .iter()
            .map(|f| {
                json!({
                    "name": f.name,
                    "family": f.family,
                    "params": f.params.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                    "archs": f.archs,
                    "bytes": f.fatbin.len(),
                    "hash": f.hash,
                    // What the build recorded: kernels per arch, external
                    // definitions, name expressions' mangled names.
                    "entries": f.entries.iter().map(|(a, names)| (a.to_string(), json!(names))).collect::<serde_json::Map<_, _>>(),
                    "definitions": f.definitions,
                    "lowered": f.lowered.iter().map(|(e, l)| (e.to_string(), json!(l))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        let families: serde_json::Map<_, _> = by_family
            .iter()
            .map(|(k, (n, b))| (k.to_string(), json!({"fragments": n, "bytes": b})))
            .collect();
        let out = json!({
            "fragments": list,
            "totals": {"fragments": frags.len(), "bytes": total_bytes, "families": families},
            "nvrtc_version": fragments::BUILD_NVRTC_VERSION,
            "build": fragments::BUILD_SUMMARY,
        });
        println!("{out}");
        return ExitCode::SUCCESS;
    }
    let name_w = frags.iter().map(|f| f.name.len()).max().unwrap_or(4).max(4);
    let fam_w = frags
        .iter()
        .map(|f| f.family.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:name_w$}  {:fam_w$}  {:>8}  {:16}  PARAMS",
        "NAME", "FAMILY", "BYTES", "ARCHS"
    );
    for f in &frags {
        let params: Vec<String> = f.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:name_w$}  {:fam_w$}  {:>8}  {:16}  {}",
            f.name,
            f.family,
            f.fatbin.len(),
            f.archs.join(","),
            params.join(" ")
        );
    }
    println!();
    for (fam, (n, b)) in &by_family {
        println!("{fam}: {n} fragments, {b} bytes");
    }
    println!(
        "total: {} fragments, {} bytes (NVRTC {})",
        frags.len(),
        total_bytes,
        fragments::BUILD_NVRTC_VERSION
    );
    println!("build: {}", fragments::BUILD_SUMMARY);
    ExitCode::SUCCESS
}
