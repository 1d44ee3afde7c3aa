//! Binary-size benchmark, the ahead-of-time side: every valid full kernel
//! (scan × metric × filter with scan dtype = metric dtype and scan idx =
//! filter idx) compiled as ONE whole-program translation unit — the three
//! rendered fragment sources concatenated — to a cubin per architecture with
//! NVRTC, and packed per kernel with nvFatbin (the same compression options as
//! fraglink's fragments). Prints one JSON line with counts, bytes and times;
//! `benches/run.sh` puts it beside the embedded fragment bytes
//! (`fraglink catalog --json`).
//!
//! Uses the CUDA 12.9 libraries the crate was built with (the compiler of the
//! embedded fragments), so both sides come from the same NVRTC.
//!
//! ```text
//! cargo run --release --example bench_aot -- [--jobs N] [--archs sm_75,sm_90] [--limit N]
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fraglink::build::compile::FATBIN_OPTIONS;
use fraglink::build::matrix::expand_file;
use fraglink::build::render::{render_all, FamilySource, Rendered};
use fraglink::link::metadata::check_cubin;
use fraglink::sys::{Nvfatbin, Nvrtc, Output};
use serde_json::json;

/// (family, name format) as build.rs declares them.
const FAMILIES: &[(&str, &str)] = &[
    ("metric", "metric_{{ metric }}_{{ dtype }}"),
    ("filter", "filter_{{ filter }}_{{ idx }}"),
    (
        "scan",
        "scan_{{ dtype }}_{{ idx }}_v{{ veclen }}_k{{ capacity }}",
    ),
];

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("bench_aot: {msg}");
    std::process::exit(1)
}

fn render(root: &Path) -> Vec<Rendered> {
    let mut loaded = Vec::new();
    for (family, _) in FAMILIES {
        let matrix = root.join(format!("matrices/{family}.json"));
        let template = root.join(format!("templates/{family}.cu.j2"));
        let product = expand_file(&matrix).unwrap_or_else(|e| fail(e));
        let text = std::fs::read_to_string(&template).unwrap_or_else(|e| fail(e));
        loaded.push((matrix, template, text, product.entries));
    }
    let sources: Vec<FamilySource<'_>> = FAMILIES
        .iter()
        .zip(&loaded)
        .map(
            |((family, format), (matrix, template, text, entries))| FamilySource {
                family,
                matrix_path: matrix.clone(),
                entries,
                template_name: template.display().to_string(),
                template: text,
                name_format: format,
                plain: false,
                expressions: &[],
            },
        )
        .collect();
    render_all(&sources).unwrap_or_else(|e| fail(e))
}

fn param<'a>(r: &'a Rendered, key: &str) -> &'a str {
    r.entry
        .get(key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| fail(format!("{}: no string key `{key}`", r.name)))
}

/// One whole kernel: the scan's entry point with its metric and filter.
struct Combo<'a> {
    scan: &'a Rendered,
    metric: &'a Rendered,
    filter: &'a Rendered,
}

impl Combo<'_> {
    fn source(&self) -> String {
        // Definitions first, then the kernel; headers are `#pragma once`.
        format!(
            "{}\n{}\n{}\n",
            self.metric.source, self.filter.source, self.scan.source
        )
    }
    fn name(&self) -> String {
        format!(
            "{}+{}+{}",
            self.scan.name, self.metric.name, self.filter.name
        )
    }
}

#[derive(Default)]
struct Totals {
    cubins: usize,
    cubin_bytes: usize,
    fatbins: usize,
    fatbin_bytes: usize,
    compile: Duration,
    per_arch_bytes: Vec<usize>,
}

fn main() {
    let mut jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut archs: Vec<String> = vec!["sm_75".into(), "sm_90".into()];
    let mut limit = usize::MAX;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| fail(format!("{flag} needs a value")));
        match flag.as_str() {
            "--jobs" => jobs = value.parse().unwrap_or_else(|_| fail("--jobs N")),
            "--archs" => archs = value.split(',').map(str::to_string).collect(),
            "--limit" => limit = value.parse().unwrap_or_else(|_| fail("--limit N")),
            _ => fail(format!("unknown option {flag}")),
        }
    }

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rendered = render(root);
    let by_family =
        |f: &str| -> Vec<&Rendered> { rendered.iter().filter(|r| r.family == f).collect() };
    let (scans, metrics, filters) = (by_family("scan"), by_family("metric"), by_family("filter"));
    let mut combos = Vec::new();
    for s in &scans {
        for m in metrics
            .iter()
            .filter(|m| param(m, "dtype") == param(s, "dtype"))
        {
            for f in filters
                .iter()
                .filter(|f| param(f, "idx") == param(s, "idx"))
            {
                combos.push(Combo {
                    scan: s,
                    metric: m,
                    filter: f,
                });
            }
        }
    }
    let valid_combos = combos.len();
    combos.truncate(limit);

    let nvrtc = Nvrtc::open(None).unwrap_or_else(|e| fail(e));
    let nvfatbin = Nvfatbin::open(None).unwrap_or_else(|e| fail(e));
    let nvrtc_version = nvrtc.version().unwrap_or_else(|e| fail(e));
    let mut include_dirs: Vec<PathBuf> = vec![root.join("fragments")];
    include_dirs.extend(std::env::split_paths(env!("FRAGLINK_BAKED_CUDA_INCLUDES")));
    let options = |arch: &str| -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={arch}"),
            "-std=c++17".to_string(),
            "-default-device".to_string(),
        ];
        o.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
        o
    };
    let fatbin_options: Vec<String> = FATBIN_OPTIONS.iter().map(|s| s.to_string()).collect();

    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let totals = Mutex::new(Totals {
        per_arch_bytes: vec![0; archs.len()],
        ..Default::default()
    });
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = combos.get(i) else { break };
                let src = c.source();
                let mut fatbin = nvfatbin
                    .builder(&fatbin_options)
                    .unwrap_or_else(|e| fail(e));
                let mut sizes = Vec::new();
                let t = Instant::now();
                for arch in &archs {
                    let out = nvrtc
                        .compile(
                            &src,
                            &format!("{}.cu", c.scan.name),
                            &options(arch),
                            Output::Cubin,
                        )
                        .unwrap_or_else(|e| fail(format!("{} for {arch}: {e}", c.name())));
                    // The whole kernel is there: an ELF cubin for the arch
                    // whose entry point is the scan's name.
                    check_cubin(&out.bytes, &c.scan.name)
                        .unwrap_or_else(|e| fail(format!("{} for {arch}: {e}", c.name())));
                    fatbin
                        .add_cubin(&out.bytes, arch, &c.name())
                        .unwrap_or_else(|e| fail(e));
                    sizes.push(out.bytes.len());
                }
                let bytes = fatbin.finish().unwrap_or_else(|e| fail(e));
                let elapsed = t.elapsed();
                let mut tot = totals.lock().unwrap();
                tot.cubins += sizes.len();
                tot.cubin_bytes += sizes.iter().sum::<usize>();
                for (a, n) in tot.per_arch_bytes.iter_mut().zip(&sizes) {
                    *a += n;
                }
                tot.fatbins += 1;
                tot.fatbin_bytes += bytes.len();
                tot.compile += elapsed;
            });
        }
    });
    let wall = started.elapsed();
    let t = totals.into_inner().unwrap();

    let fragments = fraglink::fragments::catalog();
    let out = json!({
        "valid_combinations": valid_combos,
        "compiled_combinations": combos.len(),
        "archs": archs,
        "jobs": jobs,
        "nvrtc_version": format!("{}.{}", nvrtc_version.0, nvrtc_version.1),
        "nvrtc": nvrtc.path(),
        "cubins": t.cubins,
        "cubin_bytes": t.cubin_bytes,
        "cubin_bytes_per_arch": archs.iter().cloned().zip(t.per_arch_bytes.iter().copied()).collect::<std::collections::BTreeMap<_, _>>(),
        "fatbins": t.fatbins,
        "fatbin_bytes": t.fatbin_bytes,
        "fatbin_options": FATBIN_OPTIONS,
        "wall_s": wall.as_secs_f64(),
        "sum_compile_s": t.compile.as_secs_f64(),
        "fragments": {
            "count": fragments.len(),
            "bytes": fragments.iter().map(|f| f.fatbin.len()).sum::<usize>(),
            "archs": fraglink::fragments::BUILD_ARCHS,
            "nvrtc_version": fraglink::fragments::BUILD_NVRTC_VERSION,
        },
    });
    println!("{out}");
}
