//! Compiles fraglink's own vector-search fragment set with the public
//! builder (the same one downstream build scripts use) and bakes the CUDA
//! library paths it found into the crate for the run-time loader.

#[allow(dead_code, unused_imports)]
#[path = "src/build/mod.rs"]
mod build;
#[allow(dead_code, unused_imports)]
#[path = "src/sys/mod.rs"]
mod sys;
// The environment is read as the library reads it (`crate::switch`).
#[allow(dead_code)]
#[path = "src/switch.rs"]
mod switch;

use build::Builder;

fn main() {
    let result = Builder::new()
        .crate_path("crate")
        .include_dir("fragments")
        .families(build::families::vector_search())
        .compile();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: fraglink could not build its fragments: {e}");
            std::process::exit(1);
        }
    };
    let t = &report.toolkit;
    for (var, path) in [
        ("FRAGLINK_BAKED_CUDA_ROOT", &t.root),
        ("FRAGLINK_BAKED_NVRTC_PATH", &t.nvrtc),
        ("FRAGLINK_BAKED_NVJITLINK_PATH", &t.nvjitlink),
        ("FRAGLINK_BAKED_NVFATBIN_PATH", &t.nvfatbin),
    ] {
        println!("cargo:rustc-env={var}={}", path.display());
    }
    // One line per directive: the list is joined like PATH.
    let includes = std::env::join_paths(&t.include_dirs).expect("include paths contain no ':'");
    println!(
        "cargo:rustc-env=FRAGLINK_BAKED_CUDA_INCLUDES={}",
        includes.to_string_lossy()
    );
    let (maj, min) = report.nvrtc_version;
    println!("cargo:rustc-env=FRAGLINK_BUILD_NVRTC_VERSION={maj}.{min}");
    let archs: Vec<String> = report.archs.iter().map(|a| a.to_string()).collect();
    println!("cargo:rustc-env=FRAGLINK_BUILD_ARCHS={}", archs.join(","));
    println!(
        "cargo:rustc-env=FRAGLINK_BUILD_SUMMARY={} fragments, {} bytes, {} from cache, {:.2}s",
        report.fragments.len(),
        report.total_bytes(),
        report.cached(),
        report.elapsed.as_secs_f64()
    );
}
