//! A fragment the matrices did not produce is a compile error, not a link
//! error at run time.
//!
//! Each file in tests/compile_fail/ becomes the `main.rs` of a throwaway
//! crate depending on fraglink, built with cargo (sharing one target
//! directory with tests/downstream.rs). `existing_ok.rs` must build; every
//! `missing_*.rs` must fail with fraglink's own diagnostic. Only the
//! diagnostic's wording is checked, not rustc's full output (which changes
//! between compiler versions).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn build_case(case: &str) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir: PathBuf = root.join("target/nested-crates").join(case);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{case}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             [workspace]\n\n[dependencies]\nfraglink = {{ path = {:?} }}\n",
            root.display().to_string()
        ),
    )
    .unwrap();
    std::fs::copy(
        root.join("tests/compile_fail").join(format!("{case}.rs")),
        dir.join("src/main.rs"),
    )
    .unwrap();
    Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", root.join("target/nested"))
        .env("FRAGLINK_CUDA_ROOT", env!("FRAGLINK_BAKED_CUDA_ROOT"))
        .env("FRAGLINK_OFFLINE", "1")
        .output()
        .expect("cargo runs")
}

#[test]
fn existing_combinations_compile() {
    let out = build_case("existing_ok");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_missing_combination_is_a_compile_error_naming_it() {
    let out = build_case("missing_scan_veclen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("error[E0277]"), "{stderr}");
    assert!(
        stderr.contains("was built: its matrix does not produce this combination")
            && stderr.contains("ScanFragment<")
            && stderr.contains("8, 128>"),
        "{stderr}"
    );
    assert!(
        stderr.contains("`fraglink catalog` lists the fragments that exist"),
        "{stderr}"
    );
}

#[test]
fn a_tag_of_the_wrong_kind_is_a_compile_error() {
    let out = build_case("missing_wrong_kind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("IndexType` is not implemented for `") && stderr.contains("F32`"),
        "{stderr}"
    );
}
