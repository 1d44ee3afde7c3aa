//! Finding (or provisioning) the CUDA libraries the build and the linker need.
//!
//! Order (DESIGN.md decision 2): `FRAGLINK_CUDA_ROOT`, `CUDA_PATH`, `CUDA_HOME`,
//! `/usr/local/cuda`, then the `python3` site-packages holding NVIDIA's wheels,
//! then — unless offline — the pinned CUDA 12.9 wheels installed into the
//! target directory. Every root is accepted in either the toolkit layout
//! (`lib64/`, `include/`) or the wheel layout (`nvidia/<component>/{lib,include}`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every environment variable the discovery reads; build.rs emits
/// `cargo:rerun-if-env-changed` for each one.
pub const ENV_VARS: &[&str] = &[
    "FRAGLINK_CUDA_ROOT",
    "CUDA_PATH",
    "CUDA_HOME",
    "FRAGLINK_OFFLINE",
    "CARGO_NET_OFFLINE",
    "FRAGLINK_PYTHON",
];

/// The wheels provisioned when nothing is installed: (distribution, version,
/// sha256 of the manylinux x86_64 wheel). Hashes pin the exact bytes on
/// x86_64; on other platforms only the version is pinned.
pub const PINNED_WHEELS: &[(&str, &str, &str)] = &[
    (
        "nvidia-cuda-nvrtc-cu12",
        "12.9.86",
        "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
    ),
    (
        "nvidia-nvjitlink-cu12",
        "12.9.86",
        "e3f1171dbdc83c5932a45f0f4c99180a70de9bd2718c1ab77d14104f6d7147f9",
    ),
    (
        "nvidia-nvfatbin-cu12",
        "12.9.82",
        "16cbfbd12287508212f22f42dff6ff51cf9b528b906f57f615b080da16dea1ea",
    ),
    (
        "nvidia-cuda-cccl-cu12",
        "12.9.27",
        "37869e17ce2e1ecec6eddf1927cca0f8c34e64fd848d40453df559091e2d7117",
    ),
    (
        "nvidia-cuda-runtime-cu12",
        "12.9.79",
        "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3",
    ),
];

/// Where a toolkit was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// From an environment variable (named) or a well-known path.
    Root(String),
    /// From the site-packages of the named Python interpreter.
    SitePackages(String),
    /// Installed by fraglink into the given directory.
    Provisioned(PathBuf),
}

/// Absolute paths of everything the build and run time need.
#[derive(Debug, Clone)]
pub struct Toolkit {
    /// The root that was probed (a toolkit or a directory holding `nvidia/`);
    /// `FRAGLINK_CUDA_ROOT` set to it finds the same libraries again.
    pub root: PathBuf,
    pub nvrtc: PathBuf,
    pub nvjitlink: PathBuf,
    pub nvfatbin: PathBuf,
    /// `-I` directories for NVRTC: cuda_fp16.h and CCCL (`cuda/std/...`).
    pub include_dirs: Vec<PathBuf>,
    pub origin: Origin,
}

#[derive(Debug, thiserror::Error)]
pub enum ToolkitError {
    #[error(
        "CUDA libraries not found and provisioning is off ({reason}). Searched: {searched}. \
         Set FRAGLINK_CUDA_ROOT to a CUDA 12 toolkit or to a directory holding NVIDIA's \
         wheels (nvidia/cuda_nvrtc, nvidia/nvjitlink, nvidia/nvfatbin, nvidia/cuda_cccl, \
         nvidia/cuda_runtime), or unset FRAGLINK_OFFLINE/CARGO_NET_OFFLINE to let the build \
         install the pinned CUDA 12.9 wheels"
    )]
    Offline { reason: String, searched: String },
    #[error("{var}={root} is not a usable CUDA root: {missing}")]
    BadRoot {
        var: String,
        root: PathBuf,
        missing: String,
    },
    #[error(
        "installing the pinned CUDA 12.9 wheels into {dir} failed: {message}. Set \
         FRAGLINK_CUDA_ROOT to an existing CUDA 12 installation, or FRAGLINK_PYTHON to a \
         python3 with pip"
    )]
    Provision { dir: PathBuf, message: String },
}

/// Inputs of the discovery, separated from the process environment so that
/// the search order is testable.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// `(variable, value)` pairs of the explicit roots, in priority order.
    pub explicit_roots: Vec<(String, PathBuf)>,
    /// Well-known roots tried after the explicit ones.
    pub default_roots: Vec<PathBuf>,
    /// Python interpreter whose site-packages may hold the wheels.
    pub python: Option<String>,
    /// `Some(reason)` when the network must not be used.
    pub offline: Option<String>,
    /// Where to provision the wheels.
    pub provision_dir: Option<PathBuf>,
}

impl Discovery {
    /// Reads the process environment (see [`ENV_VARS`]).
    pub fn from_env(provision_dir: Option<PathBuf>) -> Self {
        let explicit_roots = ["FRAGLINK_CUDA_ROOT", "CUDA_PATH", "CUDA_HOME"]
            .iter()
            .filter_map(|v| {
                std::env::var_os(v)
                    .filter(|s| !s.is_empty())
                    .map(|s| (v.to_string(), PathBuf::from(s)))
            })
            .collect();
        let offline = ["FRAGLINK_OFFLINE", "CARGO_NET_OFFLINE"]
            .iter()
            .find(|v| {
                std::env::var(v)
                    .map(|s| !s.is_empty() && s != "0" && s != "false")
                    .unwrap_or(false)
            })
            .map(|v| format!("{v} is set"));
        Discovery {
            explicit_roots,
            default_roots: vec![PathBuf::from("/usr/local/cuda")],
            python: Some(std::env::var("FRAGLINK_PYTHON").unwrap_or_else(|_| "python3".into())),
            offline,
            provision_dir,
        }
    }

    pub fn find(&self) -> Result<Toolkit, ToolkitError> {
        let mut searched = Vec::new();
        // An explicit root that is unusable is an error, not a reason to look
        // elsewhere: the user asked for it.
        if let Some((var, root)) = self.explicit_roots.first() {
            return probe_root(root, Origin::Root(var.clone())).map_err(|missing| {
                ToolkitError::BadRoot {
                    var: var.clone(),
                    root: root.clone(),
                    missing,
                }
            });
        }
        for root in &self.default_roots {
            searched.push(root.display().to_string());
            if let Ok(t) = probe_root(root, Origin::Root(root.display().to_string())) {
                return Ok(t);
            }
        }
        if let Some(dir) = &self.provision_dir {
            searched.push(dir.display().to_string());
            if let Ok(t) = probe_root(dir, Origin::Provisioned(dir.clone())) {
                return Ok(t);
            }
        }
        if let Some(py) = &self.python {
            for site in python_site_packages(py) {
                searched.push(site.display().to_string());
                if let Ok(t) = probe_root(&site, Origin::SitePackages(py.clone())) {
                    return Ok(t);
                }
            }
        }
        let searched = searched.join(", ");
        if let Some(reason) = &self.offline {
            return Err(ToolkitError::Offline {
                reason: reason.clone(),
                searched,
            });
        }
        let Some(dir) = &self.provision_dir else {
            return Err(ToolkitError::Offline {
                reason: "no provisioning directory".into(),
                searched,
            });
        };
        provision(self.python.as_deref().unwrap_or("python3"), dir)?;
        probe_root(dir, Origin::Provisioned(dir.clone())).map_err(|missing| {
            ToolkitError::Provision {
                dir: dir.clone(),
                message: format!("installed, but incomplete: {missing}"),
            }
        })
    }
}

/// The pip command line that provisions the pinned wheels (also shown in
/// errors and tested without running pip).
pub fn provision_command(python: &str, dir: &Path, requirements: &Path) -> Vec<String> {
    vec![
        python.to_string(),
        "-m".into(),
        "pip".into(),
        "install".into(),
        "--disable-pip-version-check".into(),
        "--no-deps".into(),
        "--only-binary=:all:".into(),
        "--target".into(),
        dir.display().to_string(),
        "-r".into(),
        requirements.display().to_string(),
    ]
}

/// The requirements file: versions pinned; on x86_64 Linux, hashes too.
pub fn requirements_text(pin_hashes: bool) -> String {
    PINNED_WHEELS
        .iter()
        .map(|(name, version, sha)| {
            if pin_hashes {
                format!("{name}=={version} --hash=sha256:{sha}\n")
            } else {
                format!("{name}=={version}\n")
            }
        })
        .collect()
}

fn provision(python: &str, dir: &Path) -> Result<(), ToolkitError> {
    let err = |message: String| ToolkitError::Provision {
        dir: dir.to_path_buf(),
        message,
    };
    std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create the directory: {e}")))?;
    let requirements = dir.join("fraglink-requirements.txt");
    let pin = cfg!(all(target_os = "linux", target_arch = "x86_64"));
    std::fs::write(&requirements, requirements_text(pin))
        .map_err(|e| err(format!("cannot write {}: {e}", requirements.display())))?;
    let cmd = provision_command(python, dir, &requirements);
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| err(format!("cannot run `{}`: {e}", cmd.join(" "))))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(err(format!(
            "`{}` exited with {}: {}",
            cmd.join(" "),
            out.status,
            tail.join(" | ")
        )));
    }
    Ok(())
}

fn python_site_packages(python: &str) -> Vec<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// Checks one root in both layouts; `Err` says what is missing.
pub fn probe_root(root: &Path, origin: Origin) -> Result<Toolkit, String> {
    let wheel = root.join("nvidia");
    let mut t = if wheel.is_dir() {
        probe_wheels(&wheel, origin)?
    } else {
        probe_toolkit(root, origin)?
    };
    t.root = root.to_path_buf();
    Ok(t)
}

fn probe_wheels(nv: &Path, origin: Origin) -> Result<Toolkit, String> {
    let mut missing = Vec::new();
    let nvrtc = find_lib(&nv.join("cuda_nvrtc/lib"), "libnvrtc.so", &mut missing);
    let nvjitlink = find_lib(&nv.join("nvjitlink/lib"), "libnvJitLink.so", &mut missing);
    let nvfatbin = find_lib(&nv.join("nvfatbin/lib"), "libnvfatbin.so", &mut missing);
    let runtime_inc = nv.join("cuda_runtime/include");
    let cccl_inc = nv.join("cuda_cccl/include");
    require(&runtime_inc.join("cuda_fp16.h"), &mut missing);
    require(&cccl_inc.join("cuda/std/cstdint"), &mut missing);
    if !missing.is_empty() {
        return Err(missing.join(", "));
    }
    Ok(Toolkit {
        root: PathBuf::new(),
        nvrtc: nvrtc.unwrap(),
        nvjitlink: nvjitlink.unwrap(),
        nvfatbin: nvfatbin.unwrap(),
        include_dirs: vec![runtime_inc, cccl_inc],
        origin,
    })
}

fn probe_toolkit(root: &Path, origin: Origin) -> Result<Toolkit, String> {
    let mut missing = Vec::new();
    let lib = if root.join("lib64").is_dir() {
        root.join("lib64")
    } else {
        root.join("lib")
    };
    let nvrtc = find_lib(&lib, "libnvrtc.so", &mut missing);
    let nvjitlink = find_lib(&lib, "libnvJitLink.so", &mut missing);
    let nvfatbin = find_lib(&lib, "libnvfatbin.so", &mut missing);
    let inc = root.join("include");
    require(&inc.join("cuda_fp16.h"), &mut missing);
    // CUDA 13 moved CCCL under include/cccl.
    let mut include_dirs = vec![inc.clone()];
    if inc.join("cccl/cuda/std/cstdint").is_file() {
        include_dirs.push(inc.join("cccl"));
    } else {
        require(&inc.join("cuda/std/cstdint"), &mut missing);
    }
    if !missing.is_empty() {
        return Err(missing.join(", "));
    }
    Ok(Toolkit {
        root: PathBuf::new(),
        nvrtc: nvrtc.unwrap(),
        nvjitlink: nvjitlink.unwrap(),
        nvfatbin: nvfatbin.unwrap(),
        include_dirs,
        origin,
    })
}

fn require(path: &Path, missing: &mut Vec<String>) {
    if !path.exists() {
        missing.push(format!("{} is missing", path.display()));
    }
}

/// The library file: the unversioned name, else the highest `.so.N` present.
fn find_lib(dir: &Path, stem: &str, missing: &mut Vec<String>) -> Option<PathBuf> {
    let plain = dir.join(stem);
    if plain.is_file() {
        return Some(plain);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}.")) && !n.contains(".alt."))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some(p) => Some(p),
        None => {
            missing.push(format!("{}/{stem}* is missing", dir.display()));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_wheels(dir: &Path) {
        for (sub, file) in [
            ("nvidia/cuda_nvrtc/lib", "libnvrtc.so.12"),
            ("nvidia/nvjitlink/lib", "libnvJitLink.so.12"),
            ("nvidia/nvfatbin/lib", "libnvfatbin.so.12"),
            ("nvidia/cuda_runtime/include", "cuda_fp16.h"),
            ("nvidia/cuda_cccl/include/cuda/std", "cstdint"),
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            std::fs::write(dir.join(sub).join(file), b"").unwrap();
        }
    }

    #[test]
    fn explicit_root_wins_and_wheel_layout_is_recognised() {
        let tmp = tempfile::tempdir().unwrap();
        fake_wheels(tmp.path());
        let d = Discovery {
            explicit_roots: vec![("FRAGLINK_CUDA_ROOT".into(), tmp.path().into())],
            default_roots: vec!["/nonexistent".into()],
            offline: Some("test".into()),
            ..Default::default()
        };
        let t = d.find().unwrap();
        assert!(t.nvrtc.ends_with("nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
        assert_eq!(t.origin, Origin::Root("FRAGLINK_CUDA_ROOT".into()));
        assert_eq!(t.include_dirs.len(), 2);
    }

    #[test]
    fn unusable_explicit_root_names_variable_and_missing_files() {
        let tmp = tempfile::tempdir().unwrap();
        let d = Discovery {
            explicit_roots: vec![("CUDA_HOME".into(), tmp.path().into())],
            ..Default::default()
        };
        let msg = d.find().unwrap_err().to_string();
        assert!(msg.contains("CUDA_HOME="), "{msg}");
        assert!(msg.contains("libnvrtc.so"), "{msg}");
    }

    #[test]
    fn offline_error_names_what_to_set() {
        let d = Discovery {
            default_roots: vec!["/nonexistent-cuda".into()],
            offline: Some("FRAGLINK_OFFLINE is set".into()),
            provision_dir: Some("/nonexistent-provision".into()),
            ..Default::default()
        };
        let msg = d.find().unwrap_err().to_string();
        assert!(msg.contains("FRAGLINK_OFFLINE is set"), "{msg}");
        assert!(msg.contains("FRAGLINK_CUDA_ROOT"), "{msg}");
        assert!(msg.contains("/nonexistent-cuda"), "{msg}");
    }

    #[test]
    fn provision_command_pins_every_wheel() {
        let cmd = provision_command("python3", Path::new("/t/cuda"), Path::new("/t/r.txt"));
        assert_eq!(
            cmd.join(" "),
            "python3 -m pip install --disable-pip-version-check --no-deps \
             --only-binary=:all: --target /t/cuda -r /t/r.txt"
        );
        let req = requirements_text(true);
        assert_eq!(req.lines().count(), 5);
        assert!(req.contains("nvidia-nvjitlink-cu12==12.9.86 --hash=sha256:e3f1"));
    }
}
