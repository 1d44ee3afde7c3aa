//! A downstream crate (examples/downstream) compiles its own kernels with
//! the public builder from its build.rs: a templated family, a plain CUDA
//! file with many kernels (standard headers, brace initialisers, a bf16
//! kernel behind an arch guard), a templated kernel named by a C++ name
//! expression, and WMMA. Its binary lists what the build recorded and links
//! every kernel for five targets; the ignored GPU test launches them.

mod support;

use std::path::PathBuf;
use std::process::Command;

/// Builds and runs the example; its stdout.
fn run_example() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--manifest-path"])
        .arg(format!("{root}/examples/downstream/Cargo.toml"))
        .env("CARGO_TARGET_DIR", format!("{root}/target/nested"))
        // The toolkit this crate was built with: no second download.
        .env("FRAGLINK_CUDA_ROOT", env!("FRAGLINK_BAKED_CUDA_ROOT"))
        .env_remove("FRAGLINK_ARCHS")
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "downstream build or run failed:\n{stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn line<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line `{prefix}…` in:\n{stdout}"))
}

#[test]
fn downstream_crate_builds_and_plans_all_its_kernels() {
    let stdout = run_example();
    // Entries recorded per arch: the bf16 kernel is missing from compute_75.
    assert_eq!(
        line(&stdout, "fragment elementwise_b256 ")
            .rsplit(' ')
            .next(),
        Some("compute_75:7,compute_80:8,sm_90:8"),
        "{stdout}"
    );
    assert!(line(&stdout, "fragment axpy_f32 ").ends_with("compute_75:1,compute_80:1,sm_90:1"));
    assert!(line(&stdout, "fragment wmma_t16 ").ends_with("compute_75:1,compute_80:1,sm_90:1"));
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("fragment "))
            .count(),
        7,
        "{stdout}"
    );
    assert_eq!(line(&stdout, "typed "), "typed axpy_f32 elementwise_b256");
    // The templated kernel's mangled name, from nvrtcGetLoweredName.
    let lowered = line(&stdout, "lowered quantize<float> ")
        .rsplit(' ')
        .next()
        .unwrap();
    assert!(
        lowered.starts_with("_Z") && lowered.contains("quantize"),
        "{lowered}"
    );
    // Every fragment linked for every target, all its kernels in one link.
    let links: Vec<&str> = stdout.lines().filter(|l| l.starts_with("link ")).collect();
    assert_eq!(links.len(), 7 * 5, "{stdout}");
    assert!(line(&stdout, "link elementwise_b128 sm_75 ").contains(" 7 kernels "));
    assert!(line(&stdout, "link elementwise_b128 sm_86 ").contains(" 8 kernels "));
    assert!(line(&stdout, "link elementwise_b128 sm_90a ").contains(" 8 kernels "));
    assert!(line(&stdout, "link quantize_double sm_80 ").contains(" 1 kernels "));
    assert_eq!(
        line(&stdout, "linked "),
        format!("linked {} kernels in 35 links", 2 * (7 + 8 * 4) + 5 * 5)
            + &line(&stdout, "linked ")[line(&stdout, "linked ").find(',').unwrap()..]
    );
    // The comparison runs (its times go to the report, never asserted).
    assert!(
        line(&stdout, "multi-entry elementwise_b128 8 kernels: one link ")
            .contains("one link per kernel"),
        "{stdout}"
    );
    // The arch guard is named, with the IR nvJitLink would use.
    let guarded = line(&stdout, "guarded ");
    assert!(
        guarded.contains("compute_75")
            && guarded.contains("__CUDA_ARCH__")
            && guarded.contains("affine_bf16"),
        "{guarded}"
    );
    assert!(
        line(&stdout, "7 fragments, ").contains(" bytes, "),
        "{stdout}"
    );
}

/// The example's binary: beside the CLI in a GPU archive
/// (scripts/gpu-archive.sh puts it there), else the one `cargo run` built.
fn example_bin() -> PathBuf {
    let beside = support::fraglink_bin().with_file_name("fraglink-downstream-example");
    if beside.is_file() {
        return beside;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/nested/debug/fraglink-downstream-example")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn downstream_kernels_run_on_the_gpu() {
    let bin = example_bin();
    assert!(
        bin.is_file(),
        "{} not built (run the non-GPU test or scripts/gpu-archive.sh)",
        bin.display()
    );
    let out = Command::new(&bin)
        .arg("gpu")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for k in [
        "affine_f32",
        "saturate_abs_i32",
        "fill_zero_f32",
        "quantize<float>",
        "wmma_16x16x16_f16",
    ] {
        assert!(stdout.contains(&format!("gpu ok {k}")), "{k}:\n{stdout}");
    }
}
