//! Paths the integration tests need, resolved at run time.
//!
//! The tests must also run from a cargo-nextest archive on another machine,
//! where the checkout lives at a different absolute path (nextest is run with
//! `--workspace-remap <checkout>`). There nextest sets `CARGO_MANIFEST_DIR` to
//! the remapped checkout and `NEXTEST_BIN_EXE_fraglink` to the extracted
//! binary at run time, so the build-time values of `env!` would be wrong.
//! Each function below prefers the run-time variable and falls back to the
//! build-time value only when it is not set. An empty variable counts as unset.
//!
//! Used from a test file with `mod support;`.

// Each test file uses only some of these functions.
#![allow(dead_code)]

use std::ffi::OsString;
use std::path::PathBuf;

/// The run-time value of the environment variable `name`, if set and non-empty.
fn env_path(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|value| !value.is_empty())
}

/// The `fraglink` binary under test: `NEXTEST_BIN_EXE_fraglink` (set by nextest,
/// also when running from an archive), else a run-time `CARGO_BIN_EXE_fraglink`,
/// else the path Cargo gave at build time.
pub fn fraglink_bin() -> PathBuf {
    env_path("NEXTEST_BIN_EXE_fraglink")
        .or_else(|| env_path("CARGO_BIN_EXE_fraglink"))
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_fraglink").into())
        .into()
}

/// The crate's root directory: the run-time `CARGO_MANIFEST_DIR` (nextest sets it
/// to the remapped checkout), else the one Cargo gave at build time.
pub fn manifest_dir() -> PathBuf {
    env_path("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
        .into()
}

/// The shared test data directory: `FRAGLINK_TESTDATA` if set, else
/// `<manifest dir>/../shared/testdata`.
///
/// # Panics
///
/// If that directory does not exist, with a message naming the path tried and
/// `FRAGLINK_TESTDATA`.
pub fn testdata_dir() -> PathBuf {
    let (dir, source) = match env_path("FRAGLINK_TESTDATA") {
        Some(dir) => (PathBuf::from(dir), "from FRAGLINK_TESTDATA"),
        None => (
            manifest_dir().join("../shared/testdata"),
            "<CARGO_MANIFEST_DIR>/../shared/testdata; FRAGLINK_TESTDATA is not set",
        ),
    };
    assert!(
        dir.is_dir(),
        "test data directory {} ({source}) does not exist; \
         set FRAGLINK_TESTDATA to an existing shared/testdata directory",
        dir.display()
    );
    dir
}
