//! Compiling fragment headers and rendered fragment sources with the host C++
//! compiler (fragments/README.md, "Compiling the headers for the host"), for
//! the tests that check device code on the host: tests/host_headers.rs and the
//! kernel emulator's tests (tests/support/simt).

use std::path::{Path, PathBuf};
use std::process::Command;

/// CUDA's headers, found at run time the way run-time NVRTC finds them (so
/// the tests also run from an archive on another machine).
pub fn cuda_includes() -> Vec<PathBuf> {
    let nvrtc = fraglink::sys::Nvrtc::open(None).ok();
    match fraglink::sys::loader::cuda_include_dirs(nvrtc.as_ref().map(|n| n.path())) {
        Ok((dirs, _)) => dirs,
        Err(tried) => panic!("CUDA headers not found; tried {}", tried.join("; ")),
    }
}

/// The build script's output directory: the run-time `OUT_DIR` (nextest sets
/// it, remapped, when running from an archive), else the build-time one.
pub fn out_dir() -> PathBuf {
    std::env::var_os("OUT_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("OUT_DIR").into())
}

/// The rendered fragment sources of this build. From an archive
/// (scripts/gpu-archive.sh) they travel beside the CLI as `fraglink-gen`,
/// since nextest does not archive this crate's OUT_DIR.
pub fn gen_dir() -> PathBuf {
    [
        out_dir().join("gen"),
        super::fraglink_bin().with_file_name("fraglink-gen"),
    ]
    .into_iter()
    .find(|d| d.is_dir())
    .expect("rendered fragment sources: neither OUT_DIR/gen nor fraglink-gen beside the CLI")
}

/// `$CXX`, else `g++`; panics with an install hint when it does not run.
pub fn cxx() -> String {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    match Command::new(&compiler).arg("--version").output() {
        Ok(o) if o.status.success() => compiler,
        _ => panic!(
            "compiling device code for the host needs a C++17 compiler: `{compiler}` was not \
             found or does not run (install g++, e.g. `apt-get install g++`, or set CXX)"
        ),
    }
}

/// One host compile: `sources` into `exe`, with the README's include order
/// (`first` dirs, then fragments/, CUDA's dirs, fragments/host) and flags,
/// plus `extra` flags. Panics with the command and the compiler's output on
/// failure.
pub fn compile(exe: &Path, first: &[PathBuf], extra: &[&str], sources: &[PathBuf]) {
    let compiler = cxx();
    let mut cmd = Command::new(&compiler);
    cmd.args(["-std=c++17", "-Wall", "-Wextra", "-Werror"]);
    cmd.args(extra);
    for inc in first {
        cmd.arg("-I").arg(inc);
    }
    cmd.arg("-I").arg(super::manifest_dir().join("fragments"));
    for inc in cuda_includes() {
        cmd.arg("-I").arg(inc);
    }
    cmd.arg("-I")
        .arg(super::manifest_dir().join("fragments/host"));
    cmd.arg("-x").arg("c++");
    cmd.args(sources);
    cmd.arg("-o").arg(exe);
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        o.status.success(),
        "compiling device code for the host failed.\ncommand: {cmd:?}\n\
         CUDA include dirs: {:?}\nstderr:\n{}",
        cuda_includes(),
        String::from_utf8_lossy(&o.stderr)
    );
}
