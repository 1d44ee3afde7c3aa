//! Finding and opening the CUDA compiler libraries, and resolving their symbols.
//!
//! Libraries are always opened by absolute path once found, so the library
//! that is used is the one that was reported. The search order (README,
//! "Finding the CUDA libraries"), first compatible candidate wins:
//!
//! 1. an explicit path: the argument of [`open_first`], or the run-time
//!    environment variable ([`Library::env_var`]). It is the only candidate:
//!    if it does not exist or does not load, that is the error (a broken
//!    override is reported, never silently replaced);
//! 2. the path baked in by `build.rs` ([`Library::baked_path`]);
//! 3. `CUDA_PATH`, `CUDA_HOME`, `/usr/local/cuda`, `/usr/local/cuda-13*`,
//!    `/usr/local/cuda-12*` (toolkit or wheel layout, see [`root_lib_dirs`]);
//! 4. NVIDIA's wheels in `python3`'s site-packages (`nvidia/cu13/lib`,
//!    `nvidia/<component>/lib`), asked only when 1–3 found nothing;
//! 5. the system loader, by soname (`libnvJitLink.so.13`, …).
//!
//! "Compatible" is decided by the caller (the wrappers check the version
//! against the embedded LTO-IR, see [`compatibility`]); a candidate that
//! clashes is skipped with its reason, and if nothing fits
//! [`SysError::NoCompatibleLibrary`] lists every place tried.
//!
//! The accepted library stays loaded for the life of the process
//! ([`open_resident`] says why); skipped candidates are unloaded.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::SysError;

/// One of the CUDA compiler libraries fraglink loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// NVRTC (`libnvrtc.so.{12,13}`).
    Nvrtc,
    /// nvJitLink (`libnvJitLink.so.{12,13}`).
    NvJitLink,
    /// nvFatbin (`libnvfatbin.so.{12,13}`).
    NvFatbin,
}

/// CUDA majors whose libraries fraglink can drive (same C ABI for all three
/// libraries in both), newest first.
pub const SUPPORTED_MAJORS: [u32; 2] = [13, 12];

impl Library {
    /// All libraries, in a fixed order.
    pub const ALL: [Library; 3] = [Library::Nvrtc, Library::NvJitLink, Library::NvFatbin];

    /// Human-readable name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Library::Nvrtc => "NVRTC",
            Library::NvJitLink => "nvJitLink",
            Library::NvFatbin => "nvFatbin",
        }
    }

    /// The unversioned file name (`libnvrtc.so`); installs carry `.so.N`.
    pub fn stem(self) -> &'static str {
        match self {
            Library::Nvrtc => "libnvrtc.so",
            Library::NvJitLink => "libnvJitLink.so",
            Library::NvFatbin => "libnvfatbin.so",
        }
    }

    /// The soname of major `major`, e.g. `libnvJitLink.so.13`.
    pub fn soname(self, major: u32) -> String {
        format!("{}.{major}", self.stem())
    }

    /// The directory of NVIDIA's per-component CUDA 12 wheel (`nvidia/<it>/lib`).
    fn wheel_component(self) -> &'static str {
        match self {
            Library::Nvrtc => "cuda_nvrtc",
            Library::NvJitLink => "nvjitlink",
            Library::NvFatbin => "nvfatbin",
        }
    }

    /// The environment variable that overrides the library path at run time.
    pub fn env_var(self) -> &'static str {
        match self {
            Library::Nvrtc => "FRAGLINK_NVRTC_PATH",
            Library::NvJitLink => "FRAGLINK_NVJITLINK_PATH",
            Library::NvFatbin => "FRAGLINK_NVFATBIN_PATH",
        }
    }

    /// The absolute path `build.rs` found at build time (through
    /// `cargo:rustc-env=FRAGLINK_BAKED_*_PATH`), if any.
    pub fn baked_path(self) -> Option<&'static str> {
        let p = match self {
            Library::Nvrtc => option_env!("FRAGLINK_BAKED_NVRTC_PATH"),
            Library::NvJitLink => option_env!("FRAGLINK_BAKED_NVJITLINK_PATH"),
            Library::NvFatbin => option_env!("FRAGLINK_BAKED_NVFATBIN_PATH"),
        };
        p.filter(|s| !s.is_empty())
    }

    /// The explicit override from [`Library::env_var`], if set and non-empty.
    pub fn env_override(self) -> Option<PathBuf> {
        std::env::var_os(self.env_var())
            .filter(|v| !v.is_empty())
            .map(|v| absolute(Path::new(&v)))
    }

    /// Every file-system candidate of steps 2–4 of the search order, in
    /// order, with where it came from (the soname step is not a path). The
    /// environment override is not included: when set, it is the only one.
    pub fn candidates(self) -> Vec<Candidate> {
        let mut out = self.local_candidates();
        out.extend(self.site_packages_candidates());
        dedup(out)
    }

    /// Steps 2 and 3: the baked path and the CUDA roots (no process spawned).
    fn local_candidates(self) -> Vec<Candidate> {
        let mut out = Vec::new();
        if let Some(p) = self.baked_path() {
            out.push(Candidate {
                path: absolute(Path::new(p)),
                origin: "baked in at build time".into(),
            });
        }
        for (origin, root) in cuda_roots() {
            for dir in root_lib_dirs(&root, self) {
                for path in lib_files(&dir, self.stem()) {
                    out.push(Candidate {
                        path,
                        origin: origin.clone(),
                    });
                }
            }
        }
        out
    }

    /// Step 4: NVIDIA's wheels in `python3`'s site-packages.
    fn site_packages_candidates(self) -> Vec<Candidate> {
        let mut out = Vec::new();
        for site in python_site_packages() {
            for dir in wheel_lib_dirs(&site.join("nvidia"), self) {
                for path in lib_files(&dir, self.stem()) {
                    out.push(Candidate {
                        path,
                        origin: format!("python3 site-packages {}", site.display()),
                    });
                }
            }
        }
        out
    }
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A place a library may be loaded from, and why it is tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Absolute path, or a bare soname for the system loader.
    pub path: PathBuf,
    /// Why this place: `FRAGLINK_NVJITLINK_PATH`, `baked in at build time`,
    /// `CUDA_HOME=/opt/cuda`, `python3 site-packages …`, `system loader`.
    pub origin: String,
}

/// The library a search settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub path: PathBuf,
    pub origin: String,
}

/// Why a loaded candidate was not used.
#[derive(Debug)]
pub enum Reject {
    /// Not usable here (wrong version): try the next one.
    Skip(String),
    /// Not usable (e.g. a symbol is missing: the wrong library): the next
    /// one is tried, but an explicit path reports this error as it is.
    Unusable(SysError),
    /// Stop the search with this error.
    Fail(SysError),
}

impl From<SysError> for Reject {
    fn from(e: SysError) -> Self {
        Reject::Unusable(e)
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        // `std::path::absolute` never searches; it joins with the current dir.
        std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
    }
}

fn dedup(candidates: Vec<Candidate>) -> Vec<Candidate> {
    let mut seen = std::collections::HashSet::new();
    candidates
        .into_iter()
        .filter(|c| seen.insert(std::fs::canonicalize(&c.path).unwrap_or_else(|_| c.path.clone())))
        .collect()
}

/// Step 3's roots, with their origin: `CUDA_PATH`, `CUDA_HOME`,
/// `/usr/local/cuda`, then `/usr/local/cuda-13*` and `/usr/local/cuda-12*`,
/// newest first.
pub fn cuda_roots() -> Vec<(String, PathBuf)> {
    let mut roots = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(&v);
            roots.push((format!("{var}={}", p.display()), p));
        }
    }
    roots.push(("/usr/local/cuda".into(), PathBuf::from("/usr/local/cuda")));
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/local")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix("cuda-")?;
            let nums: Vec<u32> = ver
                .split('.')
                .map(|s| s.parse().ok())
                .collect::<Option<_>>()?;
            SUPPORTED_MAJORS
                .contains(nums.first()?)
                .then_some((nums, e.path()))
        })
        .collect();
    versioned.sort_by(|a, b| b.0.cmp(&a.0));
    for (_, p) in versioned {
        roots.push((p.display().to_string(), p));
    }
    roots
}

/// Library directories of one root, in either layout: a toolkit
/// (`lib64/`, `lib/`, `targets/<triple>/lib/`) or a directory holding
/// NVIDIA's wheels (`nvidia/…`, see [`wheel_lib_dirs`]).
pub fn root_lib_dirs(root: &Path, lib: Library) -> Vec<PathBuf> {
    let mut dirs = vec![
        root.join("lib64"),
        root.join("lib"),
        root.join(format!("targets/{}-linux/lib", std::env::consts::ARCH)),
    ];
    dirs.extend(wheel_lib_dirs(&root.join("nvidia"), lib));
    dirs.retain(|d| d.is_dir());
    dirs
}

/// NVIDIA's wheel layouts under `nvidia/`: CUDA 13 puts every component in
/// `cu13/lib`, CUDA 12 has one directory per component.
pub fn wheel_lib_dirs(nvidia: &Path, lib: Library) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = SUPPORTED_MAJORS
        .iter()
        .map(|m| nvidia.join(format!("cu{m}/lib")))
        .collect();
    dirs.push(nvidia.join(lib.wheel_component()).join("lib"));
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The versioned library files `stem.N[.M…]` in `dir`, highest version first,
/// then the unversioned `stem` (NVIDIA's `.alt.` variants are skipped).
pub fn lib_files(dir: &Path, stem: &str) -> Vec<PathBuf> {
    let prefix = format!("{stem}.");
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix(&prefix)?;
            let nums: Vec<u32> = ver
                .split('.')
                .map(|s| s.parse().ok())
                .collect::<Option<_>>()?;
            Some((nums, e.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    let mut out: Vec<PathBuf> = found.into_iter().map(|(_, p)| p).collect();
    let plain = dir.join(stem);
    if plain.is_file() {
        out.push(plain);
    }
    out
}

/// `site-packages` directories of `python3` that exist (run once per
/// process, and only when the earlier steps found nothing usable).
pub fn python_site_packages() -> Vec<PathBuf> {
    static SITES: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    SITES
        .get_or_init(|| {
            site_packages_of("python3")
                .into_iter()
                .filter(|p| p.is_dir())
                .collect()
        })
        .clone()
}

/// The `site-packages` directories `python` reports (system and user), as
/// printed; empty when it does not run. The build's toolkit discovery uses
/// it with `FRAGLINK_PYTHON`.
pub fn site_packages_of(python: &str) -> Vec<PathBuf> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// The `-I` directories run-time NVRTC needs (`cuda_fp16.h` and CCCL's
/// `cuda/std/...`), found like the libraries: beside the NVRTC in use
/// (`nvrtc_lib`, so headers and compiler are one release), then the
/// directories baked in at build time, then the CUDA roots, then the wheels
/// in `python3`'s site-packages. `Ok` holds the directories and where they
/// came from; `Err` lists every place tried.
pub fn cuda_include_dirs(nvrtc_lib: Option<&Path>) -> Result<(Vec<PathBuf>, String), Vec<String>> {
    let mut tried = Vec::new();
    let mut check = |dirs: Vec<PathBuf>, origin: String| -> Option<(Vec<PathBuf>, String)> {
        let ok = include_set_complete(&dirs);
        if !ok {
            tried.push(format!(
                "{} ({origin})",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            ));
        }
        ok.then_some((dirs, origin))
    };
    if let Some(lib_dir) = nvrtc_lib.and_then(Path::parent) {
        if let Some(parent) = lib_dir.parent() {
            if let Some(r) = check(include_set(parent), "beside NVRTC".into()) {
                return Ok(r);
            }
        }
    }
    if let Some(baked) = option_env!("FRAGLINK_BAKED_CUDA_INCLUDES").filter(|s| !s.is_empty()) {
        let dirs: Vec<PathBuf> = std::env::split_paths(baked).collect();
        if let Some(r) = check(dirs, "baked in at build time".into()) {
            return Ok(r);
        }
    }
    for (origin, root) in cuda_roots() {
        for dir in [
            root.clone(),
            root.join(format!("targets/{}-linux", std::env::consts::ARCH)),
        ] {
            if let Some(r) = check(include_set(&dir), origin.clone()) {
                return Ok(r);
            }
        }
        for m in SUPPORTED_MAJORS {
            if let Some(r) = check(
                include_set(&root.join(format!("nvidia/cu{m}"))),
                origin.clone(),
            ) {
                return Ok(r);
            }
        }
    }
    for site in python_site_packages() {
        let origin = format!("python3 site-packages {}", site.display());
        for m in SUPPORTED_MAJORS {
            if let Some(r) = check(
                include_set(&site.join(format!("nvidia/cu{m}"))),
                origin.clone(),
            ) {
                return Ok(r);
            }
        }
        if let Some(r) = check(include_set(&site.join("nvidia/cuda_nvrtc")), origin.clone()) {
            return Ok(r);
        }
    }
    Err(tried)
}

/// The include directories of the release rooted at `base`: a toolkit or a
/// CUDA 13 wheel (`include/`, plus `include/cccl` from CUDA 13), or a CUDA 12
/// per-component wheel directory (`nvidia/<x>`: its siblings
/// `cuda_runtime/include` and `cuda_cccl/include`).
fn include_set(base: &Path) -> Vec<PathBuf> {
    let inc = base.join("include");
    if inc.join("cuda_fp16.h").is_file() {
        let mut dirs = vec![inc.clone()];
        if inc.join("cccl/cuda/std/cstdint").is_file() {
            dirs.push(inc.join("cccl"));
        }
        return dirs;
    }
    match base.parent() {
        Some(nv) if nv.file_name().is_some_and(|n| n == "nvidia") => vec![
            nv.join("cuda_runtime/include"),
            nv.join("cuda_cccl/include"),
        ],
        _ => vec![inc],
    }
}

fn include_set_complete(dirs: &[PathBuf]) -> bool {
    let has = |rel: &str| dirs.iter().any(|d| d.join(rel).is_file());
    !dirs.is_empty() && has("cuda_fp16.h") && has("cuda/std/cstdint")
}

/// `(major, minor)` of the NVRTC that produced the embedded LTO-IR, when this
/// module is compiled into the fraglink crate (`None` inside build.rs).
pub fn embedded_ir_version() -> Option<(u32, u32)> {
    parse_version(option_env!("FRAGLINK_BUILD_NVRTC_VERSION")?)
}

/// `"12.9"` → `(12, 9)`.
pub fn parse_version(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Whether `lib` at `found` can work with LTO-IR from NVRTC `ir`: nvJitLink
/// needs the same major and a minor ≥ the IR's (it rejects newer IR); NVRTC
/// (run-time sources linked with the same nvJitLink) and nvFatbin need the
/// same major. `Err` is the reason, for the list of skipped candidates.
pub fn compatibility(
    lib: Library,
    found: (u32, u32),
    ir: Option<(u32, u32)>,
) -> Result<(), String> {
    let Some(ir) = ir else { return Ok(()) };
    if found.0 != ir.0 {
        return Err(format!(
            "version {}.{}, but the embedded LTO-IR is from NVRTC {}.{} (major must match)",
            found.0, found.1, ir.0, ir.1
        ));
    }
    if lib == Library::NvJitLink && found.1 < ir.1 {
        return Err(format!(
            "version {}.{} is older than the NVRTC {}.{} that produced the embedded LTO-IR",
            found.0, found.1, ir.0, ir.1
        ));
    }
    Ok(())
}

/// A library's table of entry points: how to resolve it from a loaded
/// library and how to ask the library its version. One implementation per
/// library; [`open_table`] does the rest for all three.
pub trait FnTable: Sized {
    const LIBRARY: Library;

    /// Resolves every entry point.
    ///
    /// # Safety
    /// `lib` must be this library, and the table must not outlive it.
    unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError>;

    /// The library's (major, minor) as it reports it, or why this candidate
    /// is refused.
    fn version(&self) -> Result<(u32, u32), Reject>;
}

/// An opened library: its entry points, where it came from and its version.
/// The library and its `companions` (libraries it needs loaded first) are
/// [resident](open_resident): they stay mapped after this is dropped.
pub struct Loaded<F> {
    pub fns: F,
    pub path: PathBuf,
    /// Why it was taken from there (module docs).
    pub origin: String,
    pub version: (u32, u32),
    _companions: Vec<libloading::Library>,
    _lib: libloading::Library,
}

/// The safe handle of one library: a cheap-to-clone `Arc` of its
/// [`Loaded`] table, with `open` (the search, [`open_table`]), `open_path`,
/// `path`, `origin`, `fns` and a `Debug` that shows the path. Each library
/// module adds its own calls to the `impl`.
macro_rules! library_handle {
    (
        $(#[$doc:meta])*
        $handle:ident, $fns:ty, $name:literal, companions: $companions:expr
    ) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $handle {
            inner: ::std::sync::Arc<$crate::sys::loader::Loaded<$fns>>,
        }

        impl ::std::fmt::Debug for $handle {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($handle))
                    .field("path", &self.inner.path)
                    .finish()
            }
        }

        impl $handle {
            #[doc = concat!("Opens ", $name, " from `explicit`, else from [`Library::candidates`](crate::sys::Library::candidates).")]
            pub fn open(explicit: Option<&::std::path::Path>) -> Result<Self, $crate::sys::SysError> {
                Self::open_against(explicit, $crate::sys::loader::embedded_ir_version())
            }

            #[doc = concat!("Opens ", $name, " from exactly `path`.")]
            pub fn open_path(path: &::std::path::Path) -> Result<Self, $crate::sys::SysError> {
                Self::open(Some(path))
            }

            #[doc = concat!("As [`Self::open`], checked against LTO-IR of NVRTC `ir` instead of the crate's embedded one ([`compatibility`](crate::sys::loader::compatibility)); `None`: no check, for work that never links the embedded fragments, such as a fragment build whose output is used on its own ([`Builder::ignore_embedded_ir`](crate::build::Builder::ignore_embedded_ir)).")]
            pub fn open_against(
                explicit: Option<&::std::path::Path>,
                ir: Option<(u32, u32)>,
            ) -> Result<Self, $crate::sys::SysError> {
                Ok($handle {
                    inner: ::std::sync::Arc::new($crate::sys::loader::open_table(
                        explicit,
                        $companions,
                        ir,
                    )?),
                })
            }

            /// The absolute path the library was loaded from.
            pub fn path(&self) -> &::std::path::Path {
                &self.inner.path
            }

            /// Why the library was taken from there (loader module docs).
            pub fn origin(&self) -> &str {
                &self.inner.origin
            }

            /// The raw function table.
            pub fn fns(&self) -> &$fns {
                &self.inner.fns
            }
        }
    };
}
pub(crate) use library_handle;

/// `dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE)`: the library stays
/// mapped until the process exits, whatever handles are dropped
/// ([`keep_resident`] marks one that is loaded already).
///
/// Why: NVRTC and nvJitLink register `pthread_key_create` destructors in
/// their own code, which every thread that used them runs as it exits, and
/// nothing else keeps the library mapped for those. A scoped thread can
/// still be exiting after `std::thread::scope` has returned, so dropping
/// the last handle there unmapped the code under it: the rare SIGSEGV of
/// `tests/builder.rs` on a loaded 2-core CI machine. A process that linked
/// these libraries would never unload them either, and reopening a resident
/// library is only a reference count.
///
/// # Safety
/// Loading a library runs its initialisers (see `open_path`).
pub unsafe fn open_resident(name: &OsStr) -> Result<libloading::Library, libloading::Error> {
    // SAFETY: forwarded from this function's contract.
    unsafe { dlopen_resident(name, 0) }
}

/// Marks the already-loaded library `name` (the string it was opened by)
/// resident, as [`open_resident`]; `RTLD_NOLOAD`, so it can never load a
/// second copy, only fail.
pub fn keep_resident(name: &OsStr) -> Result<libloading::Library, libloading::Error> {
    // SAFETY: with RTLD_NOLOAD nothing is loaded, so no initialiser runs.
    unsafe { dlopen_resident(name, libc::RTLD_NOLOAD) }
}

unsafe fn dlopen_resident(
    name: &OsStr,
    extra: std::os::raw::c_int,
) -> Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LAZY, RTLD_LOCAL};
    let flags = RTLD_LAZY | RTLD_LOCAL | libc::RTLD_NODELETE | extra;
    // SAFETY: forwarded from the callers' contracts.
    unsafe { UnixLibrary::open(Some(name), flags) }.map(Into::into)
}

/// Opens the first compatible `F::LIBRARY` ([`open_first`]): loads its
/// table, reads its version, checks it against LTO-IR of NVRTC `ir` (the
/// embedded one, [`embedded_ir_version`], for the handles' `open`; `None`:
/// no check) ([`compatibility`]), then loads `companions(path)` beside it.
pub fn open_table<F: FnTable>(
    explicit: Option<&Path>,
    companions: impl Fn(&Path) -> Vec<libloading::Library>,
    ir: Option<(u32, u32)>,
) -> Result<Loaded<F>, SysError> {
    let ((fns, lib, version, extra), at) = open_first(F::LIBRARY, explicit, |lib, path| {
        // SAFETY: `open_first` loaded F::LIBRARY; the accepted library is
        // made resident below, so the table never outlives its code.
        let fns = unsafe { F::load(&lib, path)? };
        let version = fns.version()?;
        compatibility(F::LIBRARY, version, ir).map_err(Reject::Skip)?;
        // Only the accepted candidate is made resident; skipped ones unload.
        // `path` is the string `lib` was opened by (a bare soname at step 5).
        let resident = keep_resident(path.as_os_str()).map_err(|e| {
            Reject::Unusable(SysError::LibraryLoad {
                library: F::LIBRARY.name(),
                path: path.to_path_buf(),
                env_var: F::LIBRARY.env_var(),
                reason: format!("keeping it loaded: {e}"),
            })
        })?;
        drop(lib);
        Ok((fns, resident, version, companions(path)))
    })?;
    Ok(Loaded {
        fns,
        path: at.path,
        origin: at.origin,
        version,
        _companions: extra,
        _lib: lib,
    })
}

/// Opens `lib` following the search order (module docs), handing each loaded
/// candidate to `accept`, which resolves symbols and checks the version. The
/// first accepted one wins.
///
/// An explicit path (`explicit`, else [`Library::env_var`]) is the only
/// candidate, and any failure on it is the error. Otherwise candidates that
/// are missing, fail to load or are rejected are skipped with the reason,
/// and [`SysError::NoCompatibleLibrary`] lists them all if none fits.
pub fn open_first<T>(
    lib: Library,
    explicit: Option<&Path>,
    mut accept: impl FnMut(libloading::Library, &Path) -> Result<T, Reject>,
) -> Result<(T, Located), SysError> {
    let forced = match explicit {
        Some(p) => Some((absolute(p), "explicit path".to_string())),
        None => lib.env_override().map(|p| (p, lib.env_var().to_string())),
    };
    if let Some((path, origin)) = forced {
        if !path.exists() {
            if explicit.is_none() {
                return Err(SysError::OverrideNotFound {
                    library: lib.name(),
                    env_var: lib.env_var(),
                    path,
                });
            }
            return Err(SysError::LibraryNotFound {
                library: lib.name(),
                tried: vec![path],
                env_var: lib.env_var(),
            });
        }
        let loaded = open_path(lib, &path)?;
        return match accept(loaded, &path) {
            Ok(t) => Ok((t, Located { path, origin })),
            Err(Reject::Fail(e) | Reject::Unusable(e)) => Err(e),
            Err(Reject::Skip(reason)) => Err(SysError::LibraryLoad {
                library: lib.name(),
                path,
                env_var: lib.env_var(),
                reason,
            }),
        };
    }
    let mut tried: Vec<(String, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut try_one = |c: Candidate,
                       tried: &mut Vec<(String, String)>|
     -> Option<Result<(T, Located), SysError>> {
        let key = std::fs::canonicalize(&c.path).unwrap_or_else(|_| c.path.clone());
        if !seen.insert(key) {
            return None;
        }
        let place = format!("{} ({})", c.path.display(), c.origin);
        let loaded = if c.path.is_absolute() {
            if !c.path.exists() {
                tried.push((place, "does not exist".into()));
                return None;
            }
            open_path(lib, &c.path)
        } else {
            open_soname(lib, &c.path)
        };
        match loaded {
            Err(e) => {
                tried.push((place, e.to_string()));
                None
            }
            Ok(l) => match accept(l, &c.path) {
                Ok(t) => Some(Ok((
                    t,
                    Located {
                        path: c.path,
                        origin: c.origin,
                    },
                ))),
                Err(Reject::Fail(e)) => Some(Err(e)),
                Err(Reject::Skip(reason)) => {
                    tried.push((place, reason));
                    None
                }
                Err(Reject::Unusable(e)) => {
                    tried.push((place, e.to_string()));
                    None
                }
            },
        }
    };
    // Each step is computed only when the earlier ones found nothing: the
    // site-packages step spawns python3.
    let steps: [&dyn Fn() -> Vec<Candidate>; 3] = [
        &|| lib.local_candidates(),
        &|| lib.site_packages_candidates(),
        &|| {
            SUPPORTED_MAJORS
                .iter()
                .map(|m| Candidate {
                    path: PathBuf::from(lib.soname(*m)),
                    origin: "system loader".into(),
                })
                .collect()
        },
    ];
    for step in steps {
        for c in step() {
            if let Some(r) = try_one(c, &mut tried) {
                return r;
            }
        }
    }
    Err(SysError::NoCompatibleLibrary {
        library: lib.name(),
        env_var: lib.env_var(),
        tried,
    })
}

fn open_path(lib: Library, path: &Path) -> Result<libloading::Library, SysError> {
    debug_assert!(path.is_absolute());
    // SAFETY: loading a shared library runs its initialisers. These are
    // NVIDIA's compiler libraries, whose initialisers have no preconditions.
    // An absolute path (it contains '/') makes dlopen skip its search.
    let os: OsString = path.as_os_str().to_owned();
    unsafe { libloading::Library::new(os) }.map_err(|e| SysError::LibraryLoad {
        library: lib.name(),
        path: path.to_path_buf(),
        env_var: lib.env_var(),
        reason: e.to_string(),
    })
}

/// Step 5: the system loader's own search for a bare soname.
fn open_soname(lib: Library, soname: &Path) -> Result<libloading::Library, SysError> {
    // SAFETY: as in `open_path`; the loader resolves the name itself.
    unsafe { libloading::Library::new(soname.as_os_str()) }.map_err(|e| SysError::LibraryLoad {
        library: lib.name(),
        path: soname.to_path_buf(),
        env_var: lib.env_var(),
        reason: e.to_string(),
    })
}

/// Versioned export suffixes tried after the unversioned name, in order.
///
/// nvJitLink's header maps every `nvJitLinkX` to an inline wrapper around an
/// exported `__nvJitLinkX_<major>_<minor>`; some installs export only the
/// versioned names. The function signatures in this module follow the 12.9
/// header (unchanged since 12.0 and in 13.0), so: the 12.9 name first, then
/// older 12.x minors down to 12.0 (an older 12.x library), then 13.0–13.2
/// ascending (a newer library keeping our ABI, closest first). libnvJitLink
/// 12.9 from the wheels exports both forms; all of them jump to the same code.
pub const VERSION_SUFFIXES: &[&str] = &[
    "12_9", "12_8", "12_7", "12_6", "12_5", "12_4", "12_3", "12_2", "12_1", "12_0", "13_0", "13_1",
    "13_2",
];

/// The names tried for `symbol`: itself, then `__{symbol}_{suffix}` for each
/// of [`VERSION_SUFFIXES`] when `versioned` is set.
pub fn symbol_names(symbol: &str, versioned: bool) -> Vec<String> {
    let mut names = vec![symbol.to_owned()];
    if versioned {
        names.extend(VERSION_SUFFIXES.iter().map(|s| format!("__{symbol}_{s}")));
    }
    names
}

/// Resolves `symbol` in `library` as a value of type `T` (a function pointer
/// type), trying the unversioned name first and then, if `versioned`, the
/// names of [`symbol_names`]. Returns the typed error naming every name tried.
///
/// # Safety
/// `T` must be the correct (`unsafe extern "C" fn`) type of the symbol, and the
/// returned value must not outlive `library`.
pub unsafe fn resolve<T: Copy>(
    library: &libloading::Library,
    which: Library,
    path: &Path,
    symbol: &'static str,
    versioned: bool,
) -> Result<T, SysError> {
    match unsafe { try_resolve(library, symbol, versioned) } {
        Ok(f) => Ok(f),
        Err(tried) => Err(SysError::SymbolMissing {
            library: which.name(),
            path: path.to_path_buf(),
            symbol,
            tried,
        }),
    }
}

/// Like [`resolve`] but for optional entry points: `None` when absent.
///
/// # Safety
/// As for [`resolve`].
pub unsafe fn resolve_optional<T: Copy>(
    library: &libloading::Library,
    symbol: &'static str,
    versioned: bool,
) -> Option<T> {
    unsafe { try_resolve(library, symbol, versioned) }.ok()
}

unsafe fn try_resolve<T: Copy>(
    library: &libloading::Library,
    symbol: &str,
    versioned: bool,
) -> Result<T, Vec<String>> {
    let names = symbol_names(symbol, versioned);
    for name in &names {
        let mut bytes = Vec::with_capacity(name.len() + 1);
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        // SAFETY: the caller guarantees `T` is the symbol's type.
        if let Ok(sym) = unsafe { library.get::<T>(&bytes) } {
            return Ok(*sym);
        }
    }
    Err(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_vars_and_names() {
        assert_eq!(Library::Nvrtc.env_var(), "FRAGLINK_NVRTC_PATH");
        assert_eq!(Library::NvJitLink.env_var(), "FRAGLINK_NVJITLINK_PATH");
        assert_eq!(Library::NvFatbin.env_var(), "FRAGLINK_NVFATBIN_PATH");
        assert_eq!(Library::NvJitLink.to_string(), "nvJitLink");
    }

    #[test]
    fn symbol_name_list() {
        assert_eq!(symbol_names("nvrtcVersion", false), vec!["nvrtcVersion"]);
        let v = symbol_names("nvJitLinkCreate", true);
        assert_eq!(v[0], "nvJitLinkCreate");
        assert_eq!(v[1], "__nvJitLinkCreate_12_9");
        assert!(v.contains(&"__nvJitLinkCreate_12_0".to_string()));
        assert!(v.contains(&"__nvJitLinkCreate_13_0".to_string()));
        assert_eq!(v.len(), 1 + VERSION_SUFFIXES.len());
    }

    #[test]
    fn explicit_missing_path_is_library_not_found() {
        let p = Path::new("/nonexistent/fraglink/libnvJitLink.so.12");
        match open_first(Library::NvJitLink, Some(p), |l, _| Ok(l)).map(|(l, _)| l) {
            Err(SysError::LibraryNotFound {
                library,
                tried,
                env_var,
            }) => {
                assert_eq!(library, "nvJitLink");
                assert_eq!(tried, vec![p.to_path_buf()]);
                assert_eq!(env_var, "FRAGLINK_NVJITLINK_PATH");
            }
            other => panic!("unexpected: {other:?}"),
        }
    }

    #[test]
    fn existing_non_library_is_load_error() {
        // A file that exists but is not a shared object.
        let p = std::env::temp_dir().join(format!("fraglink-not-a-lib-{}.so", std::process::id()));
        std::fs::write(&p, b"not an ELF file").unwrap();
        let r = open_first(Library::NvFatbin, Some(&p), |l, _| Ok(l)).map(|(l, _)| l);
        let _ = std::fs::remove_file(&p);
        match r {
            Err(e @ SysError::LibraryLoad { .. }) => {
                let s = e.to_string();
                assert!(s.contains("FRAGLINK_NVFATBIN_PATH"), "{s}");
                assert!(s.contains(&*p.to_string_lossy()), "{s}");
            }
            other => panic!("unexpected: {other:?}"),
        }
    }

    #[test]
    fn compatibility_rules() {
        let nvj = Library::NvJitLink;
        assert!(compatibility(nvj, (13, 0), Some((13, 0))).is_ok());
        assert!(compatibility(nvj, (13, 2), Some((13, 0))).is_ok());
        assert!(compatibility(nvj, (12, 9), None).is_ok());
        let e = compatibility(nvj, (12, 9), Some((13, 0))).unwrap_err();
        assert!(e.contains("12.9") && e.contains("13.0"), "{e}");
        assert!(compatibility(nvj, (13, 0), Some((13, 1))).is_err());
        // NVRTC and nvFatbin only need the major.
        assert!(compatibility(Library::Nvrtc, (13, 0), Some((13, 1))).is_ok());
        assert!(compatibility(Library::NvFatbin, (12, 4), Some((13, 0))).is_err());
    }

    #[test]
    fn library_files_newest_first_without_alt() {
        let tmp = std::env::temp_dir().join(format!("fraglink-libfiles-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        for f in [
            "libnvrtc.so.12",
            "libnvrtc.so.13",
            "libnvrtc.alt.so.13",
            "libnvrtc-builtins.so.13.0",
            "libnvrtc.so",
        ] {
            std::fs::write(tmp.join(f), b"").unwrap();
        }
        let files = lib_files(&tmp, "libnvrtc.so");
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(names, ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]);
    }

    #[test]
    fn wheel_layouts_of_both_majors() {
        let tmp = std::env::temp_dir().join(format!("fraglink-wheels-{}", std::process::id()));
        for d in ["nvidia/cu13/lib", "nvidia/nvjitlink/lib", "lib64"] {
            std::fs::create_dir_all(tmp.join(d)).unwrap();
        }
        let dirs = root_lib_dirs(&tmp, Library::NvJitLink);
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(
            dirs,
            [
                tmp.join("lib64"),
                tmp.join("nvidia/cu13/lib"),
                tmp.join("nvidia/nvjitlink/lib")
            ]
        );
    }

    #[test]
    fn relative_paths_become_absolute() {
        assert!(absolute(Path::new("libnvrtc.so.12")).is_absolute());
    }
}
