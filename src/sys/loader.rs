//! Finding and opening the CUDA compiler libraries, and resolving their symbols.
//!
//! Libraries are opened by absolute path only; the dynamic loader's search
//! (`LD_LIBRARY_PATH`, `ldconfig`) is never consulted, so the library that is
//! used is always the one that was configured. The candidates, in order:
//!
//! 1. the run-time environment variable ([`Library::env_var`]), if set;
//! 2. the path baked in by `build.rs` ([`Library::baked_path`]), if any.
//!
//! A caller may instead pass an explicit path to [`open`], which is then the
//! only candidate.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::SysError;

/// One of the CUDA compiler libraries fraglink loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// NVRTC (`libnvrtc.so.12`).
    Nvrtc,
    /// nvJitLink (`libnvJitLink.so.12`).
    NvJitLink,
    /// nvFatbin (`libnvfatbin.so.12`).
    NvFatbin,
}

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

    /// The file name of the library in a CUDA 12 Linux install (for messages
    /// and for locating it inside a toolkit; never used for a search).
    pub fn file_name(self) -> &'static str {
        match self {
            Library::Nvrtc => "libnvrtc.so.12",
            Library::NvJitLink => "libnvJitLink.so.12",
            Library::NvFatbin => "libnvfatbin.so.12",
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

    /// The paths [`open`] tries when no explicit path is given, in order: the
    /// run-time environment variable if set (and non-empty), then the baked
    /// path if any. Relative paths are made absolute against the current
    /// directory.
    pub fn candidates(self) -> Vec<PathBuf> {
        let mut out = Vec::with_capacity(2);
        if let Some(v) = std::env::var_os(self.env_var()).filter(|v| !v.is_empty()) {
            out.push(absolute(Path::new(&v)));
        }
        if let Some(p) = self.baked_path() {
            let p = absolute(Path::new(p));
            if !out.contains(&p) {
                out.push(p);
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

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        // `std::path::absolute` never searches; it joins with the current dir.
        std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
    }
}

/// Opens `lib` from `explicit` if given, else from the first existing entry of
/// [`Library::candidates`]. See [`open_located`] for the path it came from.
pub fn open(lib: Library, explicit: Option<&Path>) -> Result<libloading::Library, SysError> {
    open_located(lib, explicit).map(|(l, _)| l)
}

/// Like [`open`], also returning the absolute path the library was opened from.
///
/// A candidate that does not exist is skipped; one that exists but fails to
/// load stops the search with [`SysError::LibraryLoad`] (a broken override is
/// reported rather than silently replaced by the next candidate).
pub fn open_located(
    lib: Library,
    explicit: Option<&Path>,
) -> Result<(libloading::Library, PathBuf), SysError> {
    let candidates = match explicit {
        Some(p) => vec![absolute(p)],
        None => lib.candidates(),
    };
    for path in &candidates {
        if !path.exists() {
            continue;
        }
        return open_path(lib, path).map(|l| (l, path.clone()));
    }
    Err(SysError::LibraryNotFound {
        library: lib.name(),
        tried: candidates,
        env_var: lib.env_var(),
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
        match open(Library::NvJitLink, Some(p)) {
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
        let r = open(Library::NvFatbin, Some(&p));
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
    fn relative_paths_become_absolute() {
        assert!(absolute(Path::new("libnvrtc.so.12")).is_absolute());
    }
}
