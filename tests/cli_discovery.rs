//! Run-time discovery of the CUDA libraries (README, "Finding the CUDA
//! libraries at run time"), through the real CLI binary:
//! an explicit override that names no file is an error naming it, `doctor
//! --json` reports what it found, and a binary whose build-time paths are
//! gone finds its libraries through `CUDA_HOME`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const PLAN: [&str; 3] = ["scan_f32_u32_v4_k128", "metric_l2_f32", "filter_none_u32"];

fn run(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args).env("FRAGLINK_CACHE_DISABLE", "1");
    for var in [
        "FRAGLINK_NVJITLINK_PATH",
        "FRAGLINK_NVRTC_PATH",
        "FRAGLINK_NVFATBIN_PATH",
        "CUDA_PATH",
        "CUDA_HOME",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

fn doctor(bin: &Path, env: &[(&str, &str)]) -> Value {
    let out = run(bin, &["doctor", "--json"], env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON")
}

#[test]
fn missing_override_exits_2_naming_it() {
    let mut args = vec!["link", "--arch", "sm_90"];
    args.extend(PLAN);
    let out = run(
        &support::fraglink_bin(),
        &args,
        &[("FRAGLINK_NVJITLINK_PATH", "/nonexistent")],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("FRAGLINK_NVJITLINK_PATH=/nonexistent"),
        "{err}"
    );
}

#[test]
fn doctor_json_has_every_section() {
    let d = doctor(&support::fraglink_bin(), &[]);
    let libs = d["libraries"].as_array().expect("libraries");
    let names: Vec<&str> = libs.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(names, ["NVRTC", "nvJitLink", "nvFatbin"]);
    for l in libs {
        for field in ["path", "origin", "version"] {
            assert!(l[field].is_string(), "{field} missing in {l}");
        }
    }
    assert!(d["headers"]["dirs"].is_array(), "{}", d["headers"]);
    assert!(d["headers"]["origin"].is_string());
    let emb = &d["embedded"];
    assert!(emb["nvrtc_version"].as_str().unwrap().contains('.'));
    assert!(!emb["archs"].as_array().unwrap().is_empty());
    // With or without a driver/GPU, both sections say what they found.
    assert!(d["driver"]["cuda_version"].is_string() || d["driver"]["error"].is_string());
    let gpus = &d["gpus"];
    assert!(gpus["available"].is_boolean() && gpus["devices"].is_array());
    if gpus["available"] == Value::Bool(false) {
        assert!(gpus["reason"].is_string());
    }
    for g in gpus["devices"].as_array().unwrap() {
        for field in ["name", "sm", "memory_bytes", "embedded_ir_links"] {
            assert!(!g[field].is_null(), "{field} missing in {g}");
        }
    }
    let disk = &d["caches"]["disk"];
    assert!(
        disk["dir"].is_string() && disk["enabled"].is_boolean(),
        "{disk}"
    );
}

/// A toolkit layout in `root` (`lib64/`, `include/`) made of symlinks to the
/// libraries and headers the binary uses now.
fn fixture_toolkit(root: &Path, d: &Value) {
    let lib64 = root.join("lib64");
    std::fs::create_dir_all(&lib64).unwrap();
    for l in d["libraries"].as_array().unwrap() {
        let path = PathBuf::from(l["path"].as_str().expect("library found"));
        let name = path.file_name().unwrap();
        std::os::unix::fs::symlink(&path, lib64.join(name)).unwrap();
        // NVRTC loads its builtins library from beside itself.
        for e in std::fs::read_dir(path.parent().unwrap()).unwrap().flatten() {
            let n = e.file_name();
            if n.to_string_lossy().starts_with("libnvrtc-builtins.so") {
                let _ = std::os::unix::fs::symlink(e.path(), lib64.join(&n));
            }
        }
    }
    // include/ holds cuda_fp16.h and cuda/std; CUDA 13 keeps CCCL in include/cccl.
    let include = root.join("include");
    std::fs::create_dir_all(&include).unwrap();
    for dir in d["headers"]["dirs"].as_array().unwrap() {
        let dir = PathBuf::from(dir.as_str().unwrap());
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let _ = std::os::unix::fs::symlink(e.path(), include.join(e.file_name()));
        }
    }
}

/// A copy of the binary whose build-time library paths point nowhere: every
/// occurrence of the baked root is overwritten with a path of the same
/// length that does not exist (the shared target directory is untouched).
fn binary_without_baked_paths(dir: &Path) -> PathBuf {
    let baked = env!("FRAGLINK_BAKED_CUDA_ROOT").as_bytes();
    assert!(baked.len() > 8, "baked root too short to rewrite");
    let mut bytes = std::fs::read(support::fraglink_bin()).unwrap();
    let mut gone = baked.to_vec();
    // Same length, certainly absent: "/" then 'x's.
    gone.iter_mut().skip(1).for_each(|b| *b = b'x');
    let mut replaced = 0;
    let mut i = 0;
    while let Some(pos) = bytes[i..].windows(baked.len()).position(|w| w == baked) {
        let at = i + pos;
        bytes[at..at + baked.len()].copy_from_slice(&gone);
        replaced += 1;
        i = at + baked.len();
    }
    assert!(replaced > 0, "the baked root is not in the binary");
    let out = dir.join("fraglink-copy");
    std::fs::write(&out, &bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    out
}

#[test]
fn copied_binary_finds_libraries_through_cuda_home() {
    let tmp = tempfile::tempdir().unwrap();
    let found = doctor(&support::fraglink_bin(), &[]);
    let cuda = tmp.path().join("cuda");
    fixture_toolkit(&cuda, &found);
    let bin = binary_without_baked_paths(tmp.path());
    let cuda_home = cuda.to_str().unwrap();

    let d = doctor(&bin, &[("CUDA_HOME", cuda_home)]);
    for l in d["libraries"].as_array().unwrap() {
        assert_eq!(
            l["origin"].as_str(),
            Some(format!("CUDA_HOME={cuda_home}").as_str()),
            "{l}"
        );
        assert!(l["path"].as_str().unwrap().starts_with(cuda_home), "{l}");
    }
    assert_eq!(d["headers"]["origin"], "beside NVRTC", "{}", d["headers"]);

    // And it links with them.
    let mut args = vec!["link", "--arch", "sm_90", "--json"];
    args.extend(PLAN);
    let out = run(&bin, &args, &[("CUDA_HOME", cuda_home)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
