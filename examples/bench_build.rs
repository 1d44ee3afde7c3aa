//! Fragment-build benchmark: fraglink's in-process, parallel NVRTC builder on
//! the crate's whole fragment set (the families exactly as build.rs declares
//! them), timed and printed as one JSON line. `benches/run.sh` runs it beside
//! the cuVS way (one `nvcc -fatbin` process per fragment, `xargs -P`), which
//! compiles the very sources this example renders to `<out>/gen/<name>.cu`.
//!
//! ```text
//! cargo run --release --example bench_build -- cold    --out DIR [--cuda-root DIR] [--jobs N]
//! cargo run --release --example bench_build -- rebuild --work DIR [--cuda-root DIR] [--jobs N] [--reps R]
//! ```
//!
//! `cold`: one build into a fresh `DIR` with a fresh (empty) content cache
//! (`DIR/cache`), so every fragment is compiled. It also writes
//! `DIR/out/archs.json`: each fragment's archs (its minimum arch leaves
//! some out), which the nvcc side compiles alike.
//!
//! `rebuild`: copies `matrices/`, `templates/` and `fragments/` to
//! `DIR/src`, builds once with the content cache on (cold), then rebuilds
//! (a) unchanged and (b) after appending a comment line to one family's
//! template — for each family, `R` times with a different comment, so each
//! of those rebuilds recompiles exactly that family.
//!
//! `--cuda-root`: a CUDA root in toolkit layout (`lib/`, `include/`,
//! `include/cccl/`), e.g. the CUDA 13 wheels' `site-packages/nvidia/cu13`.
//! Without it the example uses the CUDA 12.9 libraries the crate was built
//! with. `--jobs` defaults to the number of cores.

use std::path::{Path, PathBuf};
use std::time::Instant;

use fraglink::build::toolkit::{probe_root, Origin};
use fraglink::build::{BuildReport, Builder, Family, Toolkit};
use serde_json::{json, Value};

/// The families exactly as build.rs declares them.
fn families() -> Vec<Family> {
    fraglink::build::families::vector_search()
}

/// The architectures build.rs gets by default (`Arch::defaults`), spelled
/// out so that `FRAGLINK_ARCHS` in the environment is the only override.
const ARCHS: &[&str] = &["compute_75", "compute_80", "sm_90"];

struct Args {
    mode: String,
    out: Option<PathBuf>,
    work: Option<PathBuf>,
    cuda_root: Option<PathBuf>,
    jobs: usize,
    reps: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench_build cold --out DIR [--cuda-root DIR] [--jobs N]\n       \
         bench_build rebuild --work DIR [--cuda-root DIR] [--jobs N] [--reps R]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_else(|| usage());
    let mut a = Args {
        mode,
        out: None,
        work: None,
        cuda_root: None,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        reps: 3,
    };
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--out" => a.out = Some(value.into()),
            "--work" => a.work = Some(value.into()),
            "--cuda-root" => a.cuda_root = Some(value.into()),
            "--jobs" => a.jobs = value.parse().unwrap_or_else(|_| usage()),
            "--reps" => a.reps = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    a
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("bench_build: {msg}");
    std::process::exit(1)
}

/// The toolkit under `root` (toolkit layout, which is what the CUDA 13
/// wheels' `nvidia/cu13` directory looks like), else the one the crate was
/// built with.
fn toolkit(root: Option<&Path>) -> Toolkit {
    match root {
        // NVRTC 13's builtins library is preloaded by `sys::nvrtc` itself.
        Some(r) => probe_root(r, Origin::Root("--cuda-root".into()))
            .unwrap_or_else(|missing| fail(format!("{}: {missing}", r.display()))),
        None => Toolkit {
            root: env!("FRAGLINK_BAKED_CUDA_ROOT").into(),
            nvrtc: env!("FRAGLINK_BAKED_NVRTC_PATH").into(),
            nvjitlink: env!("FRAGLINK_BAKED_NVJITLINK_PATH").into(),
            nvfatbin: env!("FRAGLINK_BAKED_NVFATBIN_PATH").into(),
            include_dirs: std::env::split_paths(env!("FRAGLINK_BAKED_CUDA_INCLUDES")).collect(),
            origin: Origin::Root("FRAGLINK_BAKED_CUDA_ROOT".into()),
        },
    }
}

fn builder(manifest: &Path, out: &Path, cache: &Path, tk: &Toolkit, jobs: usize) -> Builder {
    let mut b = Builder::new()
        .crate_path("crate")
        .manifest_dir(manifest)
        .include_dir("fragments")
        .out_dir(out)
        .cache_dir(cache)
        .toolkit(tk.clone())
        .archs(ARCHS)
        .jobs(jobs)
        .cargo_directives(false)
        // The CUDA 13.0 side compiles with NVRTC 13 whatever CUDA built
        // this crate's own fragments; its output is only measured.
        .ignore_embedded_ir(true);
    for f in families() {
        b = b.family(f);
    }
    b
}

/// One timed build.
fn timed_build(b: Builder) -> (f64, BuildReport) {
    let t = Instant::now();
    let report = b.compile().unwrap_or_else(|e| fail(e));
    (t.elapsed().as_secs_f64(), report)
}

fn summary(wall_s: f64, r: &BuildReport) -> Value {
    let compiled: Vec<&str> = r
        .fragments
        .iter()
        .filter(|f| !f.cached)
        .map(|f| f.name.as_str())
        .collect();
    json!({
        "wall_s": wall_s,
        "builder_elapsed_s": r.elapsed.as_secs_f64(),
        "fragments": r.fragments.len(),
        "compiled": compiled.len(),
        "cached": r.cached(),
        "compiled_families": families_of(&compiled),
        "sum_fragment_s": r.fragments.iter().map(|f| f.compile_time.as_secs_f64()).sum::<f64>(),
        "bytes": r.total_bytes(),
    })
}

/// `{"metric": 12, …}` for a list of fragment names.
fn families_of(names: &[&str]) -> Value {
    let mut m = serde_json::Map::new();
    for n in names {
        let fam = n.split('_').next().unwrap_or("?").to_string();
        let c = m.entry(fam).or_insert(json!(0));
        *c = json!(c.as_u64().unwrap_or(0) + 1);
    }
    Value::Object(m)
}

fn toolkit_json(r: &BuildReport, jobs: usize) -> Value {
    json!({
        "nvrtc_version": format!("{}.{}", r.nvrtc_version.0, r.nvrtc_version.1),
        "nvrtc": r.toolkit.nvrtc,
        "nvfatbin": r.toolkit.nvfatbin,
        "include_dirs": r.toolkit.include_dirs,
        "archs": r.archs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "jobs": jobs,
    })
}

fn fresh_dir(d: &Path) {
    if d.exists() {
        std::fs::remove_dir_all(d).unwrap_or_else(|e| fail(format!("{}: {e}", d.display())));
    }
    std::fs::create_dir_all(d).unwrap_or_else(|e| fail(format!("{}: {e}", d.display())));
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| fail(format!("{}: {e}", to.display())));
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| fail(format!("{}: {e}", from.display())));
    for e in entries.flatten() {
        let p = e.path();
        let dest = to.join(e.file_name());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap_or_else(|e| fail(format!("{}: {e}", p.display())));
        }
    }
}

fn cold(a: &Args) {
    let out = a.out.clone().unwrap_or_else(|| usage());
    fresh_dir(&out);
    let tk = toolkit(a.cuda_root.as_deref());
    let b = builder(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &out.join("out"),
        &out.join("cache"),
        &tk,
        a.jobs,
    );
    let (wall, r) = timed_build(b);
    let mut v = summary(wall, &r);
    v["mode"] = json!("cold");
    v["toolkit"] = toolkit_json(&r, a.jobs);
    v["gen_dir"] = json!(out.join("out/gen"));
    v["fatbin_dir"] = json!(out.join("out/fatbins"));
    // Each fragment's archs (a minimum arch leaves some out), so that the nvcc
    // side (benches/scripts/nvcc_build.py --archs) compiles the same set.
    let archs: serde_json::Map<String, Value> = r
        .fragments
        .iter()
        .map(|f| {
            let archs: Vec<&str> = f.recorded.entries.iter().map(|(a, _)| a.as_str()).collect();
            (f.name.clone(), json!(archs))
        })
        .collect();
    let archs_file = out.join("out/archs.json");
    std::fs::write(&archs_file, Value::Object(archs).to_string())
        .unwrap_or_else(|e| fail(format!("{}: {e}", archs_file.display())));
    v["archs_file"] = json!(archs_file);
    println!("{v}");
}

fn rebuild(a: &Args) {
    let work = a.work.clone().unwrap_or_else(|| usage());
    fresh_dir(&work);
    let src = work.join("src");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for d in ["matrices", "templates", "fragments"] {
        copy_tree(&root.join(d), &src.join(d));
    }
    let tk = toolkit(a.cuda_root.as_deref());
    let (out, cache) = (work.join("out"), work.join("cache"));
    let build = || timed_build(builder(&src, &out, &cache, &tk, a.jobs));

    // Cold, filling the content cache.
    let (wall, r) = build();
    let first = summary(wall, &r);
    let tool = toolkit_json(&r, a.jobs);
    // Nothing changed: every fragment from the cache.
    let unchanged: Vec<Value> = (0..a.reps)
        .map(|_| {
            let (w, r) = build();
            summary(w, &r)
        })
        .collect();
    // One template touched: only its family recompiles.
    let mut touched = serde_json::Map::new();
    for fam in ["metric", "filter", "scan"] {
        let path = src.join(format!("templates/{fam}.cu.j2"));
        let original = std::fs::read_to_string(&path).unwrap_or_else(|e| fail(e));
        let runs: Vec<Value> = (0..a.reps)
            .map(|i| {
                let text = format!("{original}// bench_build: touched ({fam}, {i})\n");
                std::fs::write(&path, text).unwrap_or_else(|e| fail(e));
                let (w, r) = build();
                summary(w, &r)
            })
            .collect();
        std::fs::write(&path, &original).unwrap_or_else(|e| fail(e));
        touched.insert(fam.to_string(), Value::Array(runs));
    }
    let v = json!({
        "mode": "rebuild",
        "toolkit": tool,
        "cold_with_cache": first,
        "unchanged": unchanged,
        "touched_template": touched,
    });
    println!("{v}");
}

fn main() {
    let a = parse_args();
    match a.mode.as_str() {
        "cold" => cold(&a),
        "rebuild" => rebuild(&a),
        _ => usage(),
    }
}
