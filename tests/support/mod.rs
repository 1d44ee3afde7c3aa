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

pub mod emulated;
pub mod host_cxx;
pub mod scan_links;

use std::ffi::OsString;
use std::path::PathBuf;

/// Switches the driver's compute cache off for this process, before its
/// first link. Where a driver is installed, nvJitLink serves a repeated link
/// (one any process on the machine made before, with the same options) from
/// that cache with an empty info log (see `metadata::cubin_resources`), so a
/// test that reads ptxas's figures from the log must not get one from there:
/// seen on an H100 host.
pub fn without_driver_compute_cache() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("CUDA_CACHE_DISABLE", "1"));
}

/// Threads for a test's own parallel work: one per core, `min` at least
/// (CI has two cores; on a GPU machine's sixteen, the emulated kernels and
/// the link checks are the longest tests of the run).
pub fn threads_at_least(min: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(min, |n| n.get())
        .max(min)
}

/// Lowers the calling thread's CPU priority (nice 10), and with it that of
/// the threads and processes it starts from then on. For the long portable
/// tests that spread over every core themselves (the emulated kernels, the
/// link checks): on a GPU machine they run beside the GPU tests
/// (scripts/gpu-run.sh's one nextest run), whose own links and reference
/// searches must not wait behind them. Where nothing else runs (CI, `cargo
/// test`) it changes nothing. A refusal is ignored.
pub fn yield_cpu_to_other_tests() {
    // SAFETY: setpriority reads no memory of ours; who = 0 is this thread
    // on Linux, whose threads each have their own nice value.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

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

/// What a bounded child run of the CLI left behind.
pub struct Bounded {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the CLI with `args` and `env` (after a private `FRAGLINK_CACHE_DIR`
/// and with `RAYON_NUM_THREADS` removed, so `env` decides both), under
/// `RLIMIT_AS = cap` when given, killed after `timeout` (a panic naming the
/// command). Output goes through files, so nothing blocks on a pipe. Tests
/// of hostile input use it so that a hang or an unbounded allocation fails
/// the test instead of taking the machine down.
pub fn run_bounded(
    args: &[&str],
    env: &[(&str, &str)],
    cap: Option<u64>,
    timeout: std::time::Duration,
) -> Bounded {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let (out_p, err_p) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut cmd = std::process::Command::new(fraglink_bin());
    cmd.args(args)
        .env("FRAGLINK_CACHE_DIR", dir.path().join("cache"))
        .env_remove("RAYON_NUM_THREADS")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_p).unwrap())
        .stderr(std::fs::File::create(&err_p).unwrap());
    if let Some(cap) = cap {
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between
        // fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: cap as libc::rlim_t,
                    rlim_max: cap as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{args:?} ({env:?}) still running after {timeout:?}; stderr so far: {}",
                std::fs::read_to_string(&err_p).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Bounded {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_p).unwrap(),
        stderr: std::fs::read_to_string(&err_p).unwrap(),
    }
}

/// A version-1 `.npy` file: `descr`, a `shape` as Python writes it, then
/// `payload` (the header padded to 64 bytes, as numpy does).
pub fn npy_bytes(descr: &str, shape: &str, payload: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(payload);
    b
}
