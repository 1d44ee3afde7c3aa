//! Finding (or provisioning) the CUDA libraries the build and the linker need.
//!
//! Order (DESIGN.md decision 2): `FRAGLINK_CUDA_ROOT`, `CUDA_PATH`, `CUDA_HOME`,
//! `/usr/local/cuda`, then the `python3` site-packages holding NVIDIA's wheels,
//! then — unless offline — the pinned wheels installed into the target
//! directory. Every root is accepted in the toolkit layout (`lib64/`,
//! `include/`, CCCL in `include/` or, from CUDA 13, `include/cccl`) and in
//! both wheel layouts (CUDA 12: `nvidia/<component>/{lib,include}`; CUDA 13:
//! everything in `nvidia/cu13/{lib,include}`).
//!
//! `FRAGLINK_CUDA_VERSION=12|13` (or `12.9`/`13.0`) picks the major: roots of another major are
//! passed over, and that major's pinned set is provisioned. Unset, any major
//! found is used and CUDA 12.9 is provisioned: its cubins load on every
//! driver from 525 on (CUDA 12's minor-version compatibility), where CUDA
//! 13's need driver 580; and 12.9 is the newest 12.x, whose nvJitLink links
//! LTO-IR from every 12.x NVRTC.

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
    "FRAGLINK_CUDA_VERSION",
];

/// A CUDA release fraglink can provision: its pinned wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedSet {
    /// `(major, minor)` of the release.
    pub version: (u32, u32),
    /// (distribution, version, sha256 of the manylinux x86_64 wheel). Hashes
    /// pin the exact bytes on x86_64; on other platforms only the version is.
    pub wheels: &'static [(&'static str, &'static str, &'static str)],
    /// The wheel holding the `crt/` headers (`crt/mma.h`, which `<mma.h>`
    /// includes for WMMA): nvcc's wheel in CUDA 12, `nvidia-cuda-crt` in 13.
    /// Installed on its own beside the set when a toolkit lacks them
    /// ([`Discovery::supply_crt`]).
    pub crt: (&'static str, &'static str, &'static str),
}

impl PinnedSet {
    /// The set for `major` (12 or 13).
    pub fn for_major(major: u32) -> Option<PinnedSet> {
        match major {
            12 => Some(PinnedSet {
                version: (12, 9),
                wheels: PINNED_WHEELS,
                crt: CRT_WHEEL_12,
            }),
            13 => Some(PinnedSet {
                version: (13, 0),
                wheels: PINNED_WHEELS_13,
                crt: PINNED_WHEELS_13[5],
            }),
            _ => None,
        }
    }

    /// The provisioning directory name under the target dir, e.g. `fraglink-cuda-13.0`.
    pub fn dir_name(&self) -> String {
        format!("fraglink-cuda-{}.{}", self.version.0, self.version.1)
    }

    /// Where [`PinnedSet::crt`] is installed when a toolkit lacks `crt/`.
    pub fn crt_dir_name(&self) -> String {
        format!("{}-crt", self.dir_name())
    }

    /// The include directory the crt wheel installs (`crt/` is under it).
    pub fn crt_include(&self, dir: &Path) -> PathBuf {
        if self.version.0 >= 13 {
            dir.join("nvidia/cu13/include")
        } else {
            dir.join("nvidia/cuda_nvcc/include")
        }
    }
}

/// CUDA 12's `crt/` headers ship only in nvcc's wheel (40 MB, of which
/// fraglink uses the headers).
pub const CRT_WHEEL_12: (&str, &str, &str) = (
    "nvidia-cuda-nvcc-cu12",
    "12.9.86",
    "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0",
);

/// Whether `dirs` provide `crt/mma.h` (which `<mma.h>` includes).
pub fn has_crt(dirs: &[PathBuf]) -> bool {
    dirs.iter().any(|d| d.join("crt/mma.h").is_file())
}

/// The major `FRAGLINK_CUDA_VERSION` asks for ([`parse_cuda_version`]);
/// `None` when unset or empty.
pub fn requested_major() -> Result<Option<u32>, ToolkitError> {
    // Not Unicode: lossily converted, so the parser refuses it naming the
    // variable (it was taken for unset).
    match crate::switch::env_value("FRAGLINK_CUDA_VERSION") {
        Some(v) => parse_cuda_version(&v),
        None => Ok(None),
    }
}

/// A `FRAGLINK_CUDA_VERSION` value: a major with a pinned set (`12`,
/// `13`), or that set's release spelled out (`12.9`, `13.0`), surrounding
/// blanks ignored; empty: `None`. Anything else is
/// [`ToolkitError::BadVersion`]: another minor (`12.4`) would not be what
/// the build provisions, and `12.junk` was once taken for 12.
pub fn parse_cuda_version(value: &str) -> Result<Option<u32>, ToolkitError> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let major = v.split('.').next().and_then(|m| m.parse::<u32>().ok());
    let pinned = major.and_then(|m| Some((m, PinnedSet::for_major(m)?)));
    match pinned {
        Some((m, p)) if v == m.to_string() || v == format!("{}.{}", p.version.0, p.version.1) => {
            Ok(Some(m))
        }
        _ => Err(ToolkitError::BadVersion {
            value: v.to_string(),
        }),
    }
}

/// CUDA 13.0: the newest NVRTC an installed nvJitLink accepts is its own
/// minor, and GPU machines with driver 580 ship CUDA 13.0. `nvidia-cuda-crt`
/// carries `crt/` headers (e.g. `crt/mma.h`) the runtime wheel lacks in 13.
pub const PINNED_WHEELS_13: &[(&str, &str, &str)] = &[
    (
        "nvidia-cuda-nvrtc",
        "13.0.88",
        "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
    ),
    (
        "nvidia-nvjitlink",
        "13.0.88",
        "13a74f429e23b921c1109976abefacc69835f2f433ebd323d3946e11d804e47b",
    ),
    (
        "nvidia-nvfatbin",
        "13.0.85",
        "5e05287b34c02cb6a7c6d9bbb0bbe6da34665fad49878f30e3a722b4747eb676",
    ),
    (
        "nvidia-cuda-cccl",
        "13.0.85",
        "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
    ),
    (
        "nvidia-cuda-runtime",
        "13.0.96",
        "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    ),
    (
        "nvidia-cuda-crt",
        "13.0.88",
        "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
    ),
];

/// The CUDA 12.9 set (the default; see the module docs for why).
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
        "FRAGLINK_CUDA_VERSION={value} is not supported: use 12 or 13 (12.9 and 13.0, the \
         releases provisioned, are accepted too)"
    )]
    BadVersion { value: String },
    /// A variable whose value is any text (a program's name) holds
    /// something that is not Unicode.
    #[error("{variable}=`{value}` is not Unicode")]
    NotUnicode {
        variable: &'static str,
        value: String,
    },
    #[error(
        "CUDA libraries not found and provisioning is off ({reason}). Searched: {searched}. \
         Set FRAGLINK_CUDA_ROOT to a CUDA 12 or 13 toolkit or to a directory holding NVIDIA's \
         wheels (CUDA 13: nvidia/cu13; CUDA 12: nvidia/cuda_nvrtc, nvidia/nvjitlink, \
         nvidia/nvfatbin, nvidia/cuda_cccl, nvidia/cuda_runtime), or unset \
         FRAGLINK_OFFLINE/CARGO_NET_OFFLINE to let the build install the pinned wheels"
    )]
    Offline { reason: String, searched: String },
    #[error("{var}={root} is not a usable CUDA root: {missing}")]
    BadRoot {
        var: String,
        root: PathBuf,
        missing: String,
    },
    #[error(
        "installing the pinned CUDA wheels into {dir} failed: {message}. Set \
         FRAGLINK_CUDA_ROOT to an existing CUDA 12 or 13 installation, or FRAGLINK_PYTHON to a \
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
    /// Only roots of this CUDA major are used (`FRAGLINK_CUDA_VERSION`).
    pub major: Option<u32>,
    /// The set provisioned into `provision_dir` (default: CUDA 12.9).
    pub pinned: Option<PinnedSet>,
}

impl Discovery {
    /// Reads the process environment (see [`ENV_VARS`]); the pinned set is
    /// provisioned under `target_dir`.
    pub fn from_env(target_dir: Option<&Path>) -> Result<Self, ToolkitError> {
        let major = requested_major()?;
        let pinned = PinnedSet::for_major(major.unwrap_or(12));
        let provision_dir = match (target_dir, pinned) {
            (Some(t), Some(p)) => Some(t.join(p.dir_name())),
            _ => None,
        };
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
        Ok(Discovery {
            explicit_roots,
            default_roots: vec![PathBuf::from("/usr/local/cuda")],
            // Unset or empty: python3; not Unicode: an error naming it (it
            // was taken for unset).
            python: Some(
                crate::switch::env_text("FRAGLINK_PYTHON")
                    .map_err(|value| ToolkitError::NotUnicode {
                        variable: "FRAGLINK_PYTHON",
                        value,
                    })?
                    .filter(|p| !p.trim().is_empty())
                    .unwrap_or_else(|| "python3".into()),
            ),
            offline,
            provision_dir,
            major,
            pinned,
        })
    }

    fn probe(&self, root: &Path, origin: Origin) -> Result<Toolkit, String> {
        let t = probe_root(root, origin)?;
        match (self.major, t.major()) {
            (Some(want), Some(found)) if want != found => Err(format!(
                "CUDA {found} found, FRAGLINK_CUDA_VERSION asks for {want}"
            )),
            _ => Ok(t),
        }
    }

    pub fn find(&self) -> Result<Toolkit, ToolkitError> {
        let mut searched = Vec::new();
        // An explicit root that is unusable is an error, not a reason to look
        // elsewhere: the user asked for it.
        if let Some((var, root)) = self.explicit_roots.first() {
            return self
                .probe(root, Origin::Root(var.clone()))
                .map_err(|missing| ToolkitError::BadRoot {
                    var: var.clone(),
                    root: root.clone(),
                    missing,
                });
        }
        for root in &self.default_roots {
            searched.push(root.display().to_string());
            if let Ok(t) = self.probe(root, Origin::Root(root.display().to_string())) {
                return Ok(t);
            }
        }
        if let Some(dir) = &self.provision_dir {
            searched.push(dir.display().to_string());
            if let Ok(t) = self.probe(dir, Origin::Provisioned(dir.clone())) {
                return Ok(t);
            }
        }
        if let Some(py) = &self.python {
            for site in crate::sys::loader::site_packages_of(py) {
                searched.push(site.display().to_string());
                if let Ok(t) = self.probe(&site, Origin::SitePackages(py.clone())) {
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
        let pinned = self
            .pinned
            .or_else(|| PinnedSet::for_major(12))
            .ok_or_else(|| ToolkitError::Offline {
                reason: "no pinned set".into(),
                searched: String::new(),
            })?;
        provision(
            self.python.as_deref().unwrap_or("python3"),
            dir,
            requirements_text_of(pinned.wheels, pin_hashes()),
        )?;
        self.probe(dir, Origin::Provisioned(dir.clone()))
            .map_err(|missing| ToolkitError::Provision {
                dir: dir.clone(),
                message: format!("installed, but incomplete: {missing}"),
            })
    }
}

/// Adds the `crt/` headers to `t` when its include directories lack them
/// (a CUDA 12 wheel set, or CUDA 13 without `nvidia-cuda-crt`): from the
/// crt directory beside the provisioned set, installing that one wheel
/// there first unless offline. `Err` says why they are still missing (the
/// build goes on: only sources including `<mma.h>` need them).
impl Discovery {
    pub fn supply_crt(&self, t: &mut Toolkit) -> Result<(), String> {
        if has_crt(&t.include_dirs) {
            return Ok(());
        }
        // A toolkit layout keeps crt/ in include/; wheels add nvcc's.
        let nvcc_inc = t.root.join("nvidia/cuda_nvcc/include");
        if has_crt(std::slice::from_ref(&nvcc_inc)) {
            t.include_dirs.push(nvcc_inc);
            return Ok(());
        }
        let set = PinnedSet::for_major(t.major().unwrap_or(12))
            .ok_or_else(|| "no pinned crt wheel for this CUDA major".to_string())?;
        let Some(target) = self.provision_dir.as_deref().and_then(Path::parent) else {
            return Err("no target directory to install the crt headers into".into());
        };
        let dir = target.join(set.crt_dir_name());
        let inc = set.crt_include(&dir);
        if !has_crt(std::slice::from_ref(&inc)) {
            if let Some(reason) = &self.offline {
                return Err(format!(
                    "crt/mma.h not found and {reason}; `<mma.h>` (WMMA) will not compile. \
                     Install {}=={} into {} or unset the variable",
                    set.crt.0,
                    set.crt.1,
                    dir.display()
                ));
            }
            let (name, version, sha) = set.crt;
            let req = requirements_text_of(&[(name, version, sha)], pin_hashes());
            provision(self.python.as_deref().unwrap_or("python3"), &dir, req)
                .map_err(|e| e.to_string())?;
            if !has_crt(std::slice::from_ref(&inc)) {
                return Err(format!(
                    "{name}=={version} installed into {} holds no crt/mma.h",
                    dir.display()
                ));
            }
        }
        t.include_dirs.push(inc);
        Ok(())
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
pub fn requirements_text(set: PinnedSet, pin_hashes: bool) -> String {
    requirements_text_of(set.wheels, pin_hashes)
}

/// Hashes pin the x86_64 Linux wheels only (see [`PinnedSet::wheels`]).
fn pin_hashes() -> bool {
    cfg!(all(target_os = "linux", target_arch = "x86_64"))
}

fn requirements_text_of(wheels: &[(&str, &str, &str)], pin_hashes: bool) -> String {
    wheels
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

fn provision(python: &str, dir: &Path, requirements_text: String) -> Result<(), ToolkitError> {
    let err = |message: String| ToolkitError::Provision {
        dir: dir.to_path_buf(),
        message,
    };
    std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create the directory: {e}")))?;
    let requirements = dir.join("fraglink-requirements.txt");
    std::fs::write(&requirements, requirements_text)
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

/// Checks one root in both layouts; `Err` says what is missing.
pub fn probe_root(root: &Path, origin: Origin) -> Result<Toolkit, String> {
    let wheel = root.join("nvidia");
    let mut t = if wheel.join("cu13").is_dir() {
        probe_toolkit(&wheel.join("cu13"), origin)?
    } else if wheel.is_dir() {
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
    let mut include_dirs = vec![runtime_inc, cccl_inc];
    // nvcc's wheel carries CUDA 12's crt/ headers (crt/mma.h).
    let nvcc_inc = nv.join("cuda_nvcc/include");
    if nvcc_inc.join("crt/mma.h").is_file() {
        include_dirs.push(nvcc_inc);
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

fn probe_toolkit(root: &Path, origin: Origin) -> Result<Toolkit, String> {
    let mut missing = Vec::new();
    let lib = [root.join("lib64"), root.join("lib")]
        .into_iter()
        .find(|d| d.join("libnvrtc.so").exists() || has_versioned(d, "libnvrtc.so"))
        .unwrap_or_else(|| root.join("lib64"));
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

fn has_versioned(dir: &Path, stem: &str) -> bool {
    find_lib(dir, stem, &mut Vec::new()).is_some()
}

impl Toolkit {
    /// The CUDA major of the NVRTC found (from its file name, `libnvrtc.so.13`).
    pub fn major(&self) -> Option<u32> {
        let name = self.nvrtc.file_name()?.to_str()?;
        name.strip_prefix("libnvrtc.so.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    }
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
    // The highest `.so.N[.M]` (by number, `.alt.` variants skipped).
    let found = crate::sys::loader::lib_files(dir, stem).into_iter().next();
    if found.is_none() {
        missing.push(format!("{}/{stem}* is missing", dir.display()));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_version_takes_a_major_or_its_pinned_release() {
        for (v, major) in [("12", 12), ("12.9", 12), (" 13 ", 13), ("13.0", 13)] {
            assert_eq!(parse_cuda_version(v).unwrap(), Some(major), "{v}");
        }
        assert_eq!(parse_cuda_version(" ").unwrap(), None);
        for bad in [
            "12.junk",
            "12.4",
            "13.1",
            "11",
            "012",
            "12.9.0",
            "12\u{fffd}",
        ] {
            let e = parse_cuda_version(bad).unwrap_err().to_string();
            assert!(e.contains("FRAGLINK_CUDA_VERSION"), "{bad}: {e}");
        }
    }

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
        let req = requirements_text(PinnedSet::for_major(12).unwrap(), true);
        assert_eq!(req.lines().count(), 5);
        assert!(req.contains("nvidia-nvjitlink-cu12==12.9.86 --hash=sha256:e3f1"));
        let set13 = PinnedSet::for_major(13).unwrap();
        assert_eq!(set13.dir_name(), "fraglink-cuda-13.0");
        let req = requirements_text(set13, false);
        assert!(req.contains("nvidia-nvjitlink==13.0.88\n"), "{req}");
        assert!(PinnedSet::for_major(11).is_none());
        // crt/ for both majors: nvcc's wheel in 12, nvidia-cuda-crt in 13.
        let set12 = PinnedSet::for_major(12).unwrap();
        assert_eq!(set12.crt.0, "nvidia-cuda-nvcc-cu12");
        assert_eq!(set12.crt_dir_name(), "fraglink-cuda-12.9-crt");
        assert!(set12
            .crt_include(Path::new("/t"))
            .ends_with("nvidia/cuda_nvcc/include"));
        assert_eq!(set13.crt.0, "nvidia-cuda-crt");
        assert!(set13
            .crt_include(Path::new("/t"))
            .ends_with("nvidia/cu13/include"));
    }

    #[test]
    fn crt_headers_are_found_beside_the_set_or_reported_offline() {
        let tmp = tempfile::tempdir().unwrap();
        let cuda = tmp.path().join("fraglink-cuda-12.9");
        fake_wheels(&cuda);
        let mut t = probe_root(&cuda, Origin::Root("x".into())).unwrap();
        let d = Discovery {
            offline: Some("FRAGLINK_OFFLINE is set".into()),
            provision_dir: Some(cuda.clone()),
            ..Default::default()
        };
        let msg = d.supply_crt(&mut t).unwrap_err();
        assert!(
            msg.contains("FRAGLINK_OFFLINE") && msg.contains("nvidia-cuda-nvcc-cu12"),
            "{msg}"
        );
        // The crt directory beside the set, as provisioning leaves it.
        let crt = tmp
            .path()
            .join("fraglink-cuda-12.9-crt/nvidia/cuda_nvcc/include/crt");
        std::fs::create_dir_all(&crt).unwrap();
        std::fs::write(crt.join("mma.h"), b"").unwrap();
        d.supply_crt(&mut t).unwrap();
        assert!(has_crt(&t.include_dirs), "{:?}", t.include_dirs);
    }

    #[test]
    fn cuda13_wheel_layout_and_major_filter() {
        let tmp = tempfile::tempdir().unwrap();
        for (sub, file) in [
            ("nvidia/cu13/lib", "libnvrtc.so.13"),
            ("nvidia/cu13/lib", "libnvrtc-builtins.so.13.0"),
            ("nvidia/cu13/lib", "libnvJitLink.so.13"),
            ("nvidia/cu13/lib", "libnvfatbin.so.13"),
            ("nvidia/cu13/include", "cuda_fp16.h"),
            ("nvidia/cu13/include/cccl/cuda/std", "cstdint"),
        ] {
            std::fs::create_dir_all(tmp.path().join(sub)).unwrap();
            std::fs::write(tmp.path().join(sub).join(file), b"").unwrap();
        }
        let t = probe_root(tmp.path(), Origin::Root("x".into())).unwrap();
        assert!(t.nvrtc.ends_with("nvidia/cu13/lib/libnvrtc.so.13"), "{t:?}");
        assert_eq!(t.major(), Some(13));
        assert_eq!(t.include_dirs.len(), 2);
        assert!(t.include_dirs[1].ends_with("include/cccl"));
        let want12 = Discovery {
            explicit_roots: vec![("FRAGLINK_CUDA_ROOT".into(), tmp.path().into())],
            major: Some(12),
            ..Default::default()
        };
        let msg = want12.find().unwrap_err().to_string();
        assert!(msg.contains("FRAGLINK_CUDA_VERSION asks for 12"), "{msg}");
    }
}
