//! A downstream crate (examples/downstream) compiles its own family with the
//! public builder from its build.rs and uses the generated tag types.

use std::process::Command;

#[test]
fn downstream_crate_builds_its_own_fragments() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--manifest-path"])
        .arg(format!("{root}/examples/downstream/Cargo.toml"))
        .env("CARGO_TARGET_DIR", format!("{root}/target/nested"))
        // The toolkit this crate was built with: no second download.
        .env("FRAGLINK_CUDA_ROOT", env!("FRAGLINK_BAKED_CUDA_ROOT"))
        .env("FRAGLINK_OFFLINE", "1")
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "downstream build failed:\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("axpy_f32 axpy compute_75 "),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("axpy_f64 axpy compute_75 "),
        "{stdout}"
    );
    let bytes: usize = lines[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes > 100, "fatbin too small: {stdout}");
    assert_eq!(lines[2], "catalog 2");
    assert!(lines[3].starts_with("2 fragments, "), "{stdout}");
}
