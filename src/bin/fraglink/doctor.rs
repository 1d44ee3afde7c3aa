//! `fraglink doctor`: what this binary finds on this machine. Each CUDA
//! library and header directory (where, why there, version), the embedded
//! LTO-IR, the driver, each GPU (and whether the embedded IR links for it),
//! and the caches. Works without a GPU or driver and says so; always exits 0
//! (it reports problems, it is not one).

use std::process::ExitCode;

use fraglink::build::Arch;
use fraglink::fragments;
use fraglink::gpu::context::driver_version;
use fraglink::gpu::GpuContext;
use fraglink::link::disk::{DiskCache, DiskCacheConfig};
use fraglink::link::{LinkRuntime, Planner};
use fraglink::sys::{loader, Library, NvJitLink, Nvfatbin, Nvrtc};
use serde_json::{json, Value};

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// The kernel `doctor` links to prove a GPU can run the embedded IR: the
/// smallest scan configuration (any configuration proves the toolchain).
const PROBE_PLAN: [&str; 3] = ["scan_f32_u32_v4_k128", "metric_l2_f32", "filter_none_u32"];

fn library(lib: Library) -> (Value, Option<std::path::PathBuf>) {
    let found = match lib {
        Library::Nvrtc => Nvrtc::open(None).map(|l| {
            (
                l.path().to_path_buf(),
                l.origin().to_string(),
                l.version_u32(),
            )
        }),
        Library::NvJitLink => NvJitLink::open(None)
            .and_then(|l| Ok((l.path().to_path_buf(), l.origin().to_string(), l.version()?))),
        Library::NvFatbin => Nvfatbin::open(None)
            .and_then(|l| Ok((l.path().to_path_buf(), l.origin().to_string(), l.version()?))),
    };
    match found {
        Ok((path, origin, (maj, min))) => (
            json!({"name": lib.name(), "path": path, "origin": origin, "version": format!("{maj}.{min}")}),
            Some(path),
        ),
        Err(e) => (json!({"name": lib.name(), "error": e.to_string()}), None),
    }
}

fn gpus() -> Value {
    let devices = match GpuContext::devices() {
        Ok(d) => d,
        Err(e) => return json!({"available": false, "reason": e.to_string(), "devices": []}),
    };
    let list: Vec<Value> = devices
        .iter()
        .map(|d| {
            let arch = d.arch();
            let links = link_probe(arch);
            json!({
                "index": d.ordinal,
                "name": d.name,
                "sm": arch.to_string(),
                "compute_capability": format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
                "memory_bytes": d.total_memory,
                "multiprocessors": d.sm_count,
                "embedded_ir_links": links.is_ok(),
                "link_error": links.err(),
            })
        })
        .collect();
    json!({"available": true, "devices": list})
}

/// Links [`PROBE_PLAN`] for `arch`: the real answer to "does the embedded IR
/// link for this GPU" (catalog coverage, nvJitLink version and arch support).
fn link_probe(arch: Arch) -> Result<(), String> {
    let rt = LinkRuntime::global().map_err(|e| e.to_string())?;
    let mut plan = Planner::new(PROBE_PLAN[0]);
    for f in PROBE_PLAN {
        plan = plan.add_named(f).map_err(|e| e.to_string())?;
    }
    rt.link(&plan, arch).map(|_| ()).map_err(|e| e.to_string())
}

fn caches() -> Value {
    let disk = match DiskCacheConfig::from_env().and_then(DiskCache::open) {
        Ok(c) => {
            // The directory may not be UTF-8 (a non-UTF-8 HOME): shown lossily.
            let dir = c.dir().to_string_lossy();
            match c.try_stats() {
                Ok(s) => json!({
                    "dir": dir,
                    "enabled": c.is_enabled(),
                    "warning": c.warning(),
                    "entries": s.entries,
                    "bytes": s.bytes,
                    "max_bytes": c.max_bytes(),
                }),
                Err(e) => json!({"dir": dir, "enabled": c.is_enabled(), "error": e.to_string()}),
            }
        }
        Err(e) => json!({"error": e.to_string()}),
    };
    let memory = std::env::var("FRAGLINK_MEMORY_CACHE_ENTRIES").ok();
    json!({"disk": disk, "memory_entries_setting": memory})
}

pub fn run(args: &DoctorArgs) -> ExitCode {
    let mut libraries = Vec::new();
    let mut nvrtc_path = None;
    for lib in Library::ALL {
        let (v, path) = library(lib);
        if lib == Library::Nvrtc {
            nvrtc_path = path;
        }
        libraries.push(v);
    }
    let headers = match loader::cuda_include_dirs(nvrtc_path.as_deref()) {
        Ok((dirs, origin)) => json!({"dirs": dirs, "origin": origin}),
        Err(tried) => json!({"error": "CUDA headers not found", "tried": tried}),
    };
    let driver = match driver_version() {
        Ok(v) => json!({"cuda_version": format!("{}.{}", v / 1000, (v % 1000) / 10), "raw": v}),
        Err(e) => json!({"error": e}),
    };
    let embedded = json!({
        "nvrtc_version": fragments::BUILD_NVRTC_VERSION,
        "archs": fragments::BUILD_ARCHS.split(',').collect::<Vec<_>>(),
        "fragments": fragments::catalog().len(),
    });
    let report = json!({
        "fraglink": env!("CARGO_PKG_VERSION"),
        "libraries": libraries,
        "headers": headers,
        "embedded": embedded,
        "driver": driver,
        "gpus": gpus(),
        "caches": caches(),
    });
    if args.json {
        println!("{report}");
    } else {
        print_text(&report);
    }
    ExitCode::SUCCESS
}

fn print_text(r: &Value) {
    println!("fraglink {}", r["fraglink"].as_str().unwrap_or("?"));
    for l in r["libraries"].as_array().into_iter().flatten() {
        match l.get("error") {
            Some(e) => println!(
                "{:<10} NOT FOUND: {}",
                l["name"].as_str().unwrap_or("?"),
                e.as_str().unwrap_or("")
            ),
            None => println!(
                "{:<10} {} from {} ({})",
                l["name"].as_str().unwrap_or("?"),
                l["version"].as_str().unwrap_or("?"),
                l["path"].as_str().unwrap_or("?"),
                l["origin"].as_str().unwrap_or("?")
            ),
        }
    }
    let h = &r["headers"];
    match h.get("error") {
        Some(_) => println!("headers    NOT FOUND (tried {})", h["tried"]),
        None => println!(
            "headers    {} ({})",
            h["dirs"],
            h["origin"].as_str().unwrap_or("?")
        ),
    }
    let e = &r["embedded"];
    println!(
        "embedded   {} fragments, LTO-IR from NVRTC {}, archs {}",
        e["fragments"],
        e["nvrtc_version"].as_str().unwrap_or("?"),
        e["archs"]
    );
    let d = &r["driver"];
    match d.get("error") {
        Some(err) => println!("driver     none: {}", err.as_str().unwrap_or("")),
        None => println!(
            "driver     supports CUDA {}",
            d["cuda_version"].as_str().unwrap_or("?")
        ),
    }
    let g = &r["gpus"];
    if g["available"] == json!(false) {
        println!("gpus       none: {}", g["reason"].as_str().unwrap_or(""));
    }
    for dev in g["devices"].as_array().into_iter().flatten() {
        println!(
            "gpu {}      {} ({}, {:.1} GiB): embedded IR {}",
            dev["index"],
            dev["name"].as_str().unwrap_or("?"),
            dev["sm"].as_str().unwrap_or("?"),
            dev["memory_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64,
            if dev["embedded_ir_links"] == json!(true) {
                "links".to_string()
            } else {
                format!(
                    "does NOT link: {}",
                    dev["link_error"].as_str().unwrap_or("?")
                )
            }
        );
    }
    let c = &r["caches"]["disk"];
    match c.get("error") {
        Some(err) => println!("disk cache error: {}", err.as_str().unwrap_or("")),
        None => println!(
            "disk cache {} ({}): {} entries, {} of {} bytes",
            c["dir"].as_str().unwrap_or("?"),
            if c["enabled"] == json!(true) {
                "enabled"
            } else {
                "disabled"
            },
            c["entries"],
            c["bytes"],
            c["max_bytes"]
        ),
    }
}
