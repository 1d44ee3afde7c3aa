//! Raw FFI to the CUDA compilers fraglink drives in-process — NVRTC, nvJitLink
//! and nvFatbin — loaded with `libloading` from absolute paths, plus thin
//! checked wrappers (the cudarc layering: function table → checked call →
//! safe owning type).
//!
//! This module is compiled twice: as `fraglink::sys`, and inside `build.rs`
//! through `#[path = "src/sys/mod.rs"] mod sys;`. It may therefore only use
//! `std`, `libloading` and `thiserror`, refer to its own items through
//! `super::`, and read baked paths with `option_env!` (never `env!`).
//!
//! * [`loader`]: which library, where to find it ([`Library::candidates`]),
//!   opening by absolute path, and symbol resolution with the versioned-name
//!   fallback nvJitLink needs on some installs.
//! * [`nvrtc`]: [`Nvrtc`] compiles CUDA C++ to LTO-IR, PTX or cubin.
//! * [`nvfatbin`]: [`Nvfatbin`] packs per-arch LTO-IR into one fatbin.
//! * [`nvjitlink`]: [`NvJitLink`] links LTO-IR / fatbins / cubins into a cubin.
//!
//! No GPU and no driver are needed for any of this.

use std::fmt;
use std::path::PathBuf;

pub mod loader;
pub mod nvfatbin;
pub mod nvjitlink;
pub mod nvrtc;

// `allow`: inside build.rs not every re-export is used.
#[allow(unused_imports)]
pub use loader::Library;
#[allow(unused_imports)]
pub use nvfatbin::{FatbinBuilder, Nvfatbin};
#[allow(unused_imports)]
pub use nvjitlink::{InputType, LinkHandle, NvJitLink};
#[allow(unused_imports)]
pub use nvrtc::{Compiled, Nvrtc, Output};

/// Everything that can go wrong while loading or calling the CUDA compilers.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// None of the candidate paths for a library exists (or there was no
    /// candidate at all).
    #[error(
        "{library} library not found: {}; set {env_var} to the absolute path of the library file",
        TriedList(.tried)
    )]
    LibraryNotFound {
        /// Human name of the library ("NVRTC", "nvJitLink", "nvFatbin").
        library: &'static str,
        /// Every path that was tried, in order (empty when nothing was configured).
        tried: Vec<PathBuf>,
        /// The environment variable that overrides the path.
        env_var: &'static str,
    },

    /// The run-time override names a file that does not exist.
    #[error("{env_var}={} names no file; point it at the {library} library file or unset it", .path.display())]
    OverrideNotFound {
        library: &'static str,
        env_var: &'static str,
        path: PathBuf,
    },

    /// A library file exists but the dynamic loader refused it (wrong
    /// architecture, missing dependency, not a shared object, ...).
    #[error(
        "{library} library at {} could not be loaded: {reason}; set {env_var} to the absolute path of a working library file",
        .path.display()
    )]
    LibraryLoad {
        library: &'static str,
        path: PathBuf,
        env_var: &'static str,
        reason: String,
    },

    /// The search (loader module docs) found no usable library: every place
    /// tried, with what was found there or why it was skipped.
    #[error(
        "no usable {library} library; set {env_var} to the absolute path of one, or CUDA_HOME to a CUDA toolkit. Tried: {}",
        SkippedList(.tried)
    )]
    NoCompatibleLibrary {
        library: &'static str,
        env_var: &'static str,
        /// `(place and origin, reason it was not used)`, in search order.
        tried: Vec<(String, String)>,
    },

    /// A required entry point is missing from a loaded library.
    #[error(
        "{library} library at {} has no symbol {symbol} (tried: {})",
        .path.display(),
        .tried.join(", ")
    )]
    SymbolMissing {
        library: &'static str,
        path: PathBuf,
        /// The unversioned C name, e.g. `nvJitLinkCreate`.
        symbol: &'static str,
        /// Every exported name that was looked up, in order.
        tried: Vec<String>,
    },

    /// A library call returned an error code.
    #[error("{library} {call} failed: {code_name} ({code}){}", LogSuffix(.log))]
    Api {
        library: &'static str,
        /// The C function that failed, e.g. `nvFatbinAddLTOIR`.
        call: &'static str,
        /// The raw result code.
        code: i32,
        /// The result code's enum name, e.g. `NVJITLINK_ERROR_INVALID_INPUT`.
        code_name: String,
        /// The library's log or message for this failure (may be empty).
        log: String,
    },

    /// NVRTC failed to compile a program; `log` is the complete program log.
    #[error("NVRTC failed to compile `{program}`: {code_name}{}", LogSuffix(.log))]
    Compile {
        /// The program name passed to NVRTC (appears in the log's diagnostics).
        program: String,
        code_name: String,
        log: String,
    },

    /// `nvJitLinkComplete` failed; `error_log` is nvJitLink's error log.
    #[error("nvJitLink link failed: {code_name} ({code}){}", LogSuffix(.error_log))]
    Link {
        code: i32,
        code_name: String,
        error_log: String,
        /// The info log at the time of failure (may hold ptxas diagnostics).
        info_log: String,
    },

    /// A call succeeded but produced nothing of the requested kind (e.g.
    /// LTO-IR requested from a compile without `-dlto`).
    #[error("{library} produced no {what} for `{name}`: {hint}")]
    EmptyOutput {
        library: &'static str,
        what: &'static str,
        name: String,
        hint: &'static str,
    },

    /// An architecture option the library version does not support (checked
    /// before the call: nvJitLink 12.9 can crash on unknown architectures).
    #[error("{library} {version} does not support -arch={arch}; supported: {supported}")]
    UnsupportedArch {
        library: &'static str,
        /// "major.minor" of the loaded library.
        version: String,
        /// The rejected value, e.g. `sm_999`.
        arch: String,
        /// The supported real architectures, comma-separated.
        supported: String,
    },

    /// A string handed to a library contains an interior NUL byte.
    #[error("{what} contains an interior NUL byte: {value:?}")]
    InvalidString {
        /// What the string was ("NVRTC option", "program name", ...).
        what: &'static str,
        value: String,
    },

    /// An argument was rejected before reaching the library.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl SysError {
    /// A failed call's error with `context` appended to the library's log
    /// (the options, entry or arch the call was given); other errors as
    /// they are.
    pub fn with_context(self, context: impl fmt::Display) -> SysError {
        match self {
            SysError::Api {
                library,
                call,
                code,
                code_name,
                log,
            } => SysError::Api {
                library,
                call,
                code,
                code_name,
                log: format!("{log} ({context})"),
            },
            e => e,
        }
    }
}

/// Convenience alias.
pub type Result<T, E = SysError> = std::result::Result<T, E>;

struct TriedList<'a>(&'a [PathBuf]);

impl fmt::Display for TriedList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no candidate path (the environment variable is unset and no path was baked in at build time)");
        }
        f.write_str("tried ")?;
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", p.display())?;
        }
        Ok(())
    }
}

struct SkippedList<'a>(&'a [(String, String)]);

impl fmt::Display for SkippedList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("nothing (no candidate anywhere)");
        }
        for (i, (place, why)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{place}: {why}")?;
        }
        Ok(())
    }
}

struct LogSuffix<'a>(&'a str);

impl fmt::Display for LogSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.0.trim_end();
        if log.is_empty() {
            Ok(())
        } else if log.contains('\n') {
            write!(f, "\n{log}")
        } else {
            write!(f, ": {log}")
        }
    }
}

/// Converts a Rust string to a C string, naming `what` on interior NUL.
pub(crate) fn cstring(what: &'static str, value: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(value).map_err(|_| SysError::InvalidString {
        what,
        value: value.to_owned(),
    })
}

/// Converts a list of options to C strings plus a pointer array that borrows
/// them (keep the first element alive while the pointers are used).
pub(crate) fn cstrings(
    what: &'static str,
    values: &[String],
) -> Result<(Vec<std::ffi::CString>, Vec<*const std::ffi::c_char>)> {
    let owned = values
        .iter()
        .map(|v| cstring(what, v))
        .collect::<Result<Vec<_>>>()?;
    let ptrs = owned.iter().map(|c| c.as_ptr()).collect();
    Ok((owned, ptrs))
}

/// Reads a log through a C API's size-then-fill pair, as NVRTC and
/// nvJitLink both shape them: `size` reports the byte count (trailing NUL
/// included), `fill` writes that many bytes. 0 or 1 bytes is an empty log.
pub(crate) fn read_log(
    size: impl FnOnce(&mut usize) -> Result<()>,
    fill: impl FnOnce(*mut std::ffi::c_char) -> Result<()>,
) -> Result<String> {
    let mut n = 0usize;
    size(&mut n)?;
    if n <= 1 {
        return Ok(String::new());
    }
    let mut buf = vec![0u8; n];
    fill(buf.as_mut_ptr().cast())?;
    Ok(log_to_string(buf))
}

/// Turns a log buffer (NUL-terminated, possibly with trailing NULs) into a String.
pub(crate) fn log_to_string(mut buf: Vec<u8>) -> String {
    while buf.last() == Some(&0) {
        buf.pop();
    }
    match String::from_utf8(buf) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_not_found_names_paths_and_variable() {
        let e = SysError::LibraryNotFound {
            library: "NVRTC",
            tried: vec![PathBuf::from("/a/libnvrtc.so.12"), PathBuf::from("/b/x.so")],
            env_var: "FRAGLINK_NVRTC_PATH",
        };
        let s = e.to_string();
        assert!(s.contains("/a/libnvrtc.so.12"), "{s}");
        assert!(s.contains("/b/x.so"), "{s}");
        assert!(s.contains("FRAGLINK_NVRTC_PATH"), "{s}");
        let e = SysError::LibraryNotFound {
            library: "NVRTC",
            tried: vec![],
            env_var: "FRAGLINK_NVRTC_PATH",
        };
        assert!(e.to_string().contains("no candidate path"));
    }

    #[test]
    fn log_suffix_formats() {
        let e = SysError::Api {
            library: "nvJitLink",
            call: "nvJitLinkCreate",
            code: 1,
            code_name: "NVJITLINK_ERROR_UNRECOGNIZED_OPTION".into(),
            log: "bad option\nsecond line\n".into(),
        };
        let s = e.to_string();
        assert!(s.starts_with(
            "nvJitLink nvJitLinkCreate failed: NVJITLINK_ERROR_UNRECOGNIZED_OPTION (1)\nbad option"
        ));
        let e = SysError::Api {
            library: "nvJitLink",
            call: "nvJitLinkCreate",
            code: 1,
            code_name: "X".into(),
            log: String::new(),
        };
        assert_eq!(e.to_string(), "nvJitLink nvJitLinkCreate failed: X (1)");
    }

    #[test]
    fn interior_nul_is_rejected() {
        let err = cstrings("NVRTC option", &["-O3".into(), "a\0b".into()]).unwrap_err();
        assert!(matches!(
            err,
            SysError::InvalidString {
                what: "NVRTC option",
                ..
            }
        ));
    }

    #[test]
    fn log_strips_trailing_nuls() {
        assert_eq!(log_to_string(b"abc\0\0".to_vec()), "abc");
        assert_eq!(log_to_string(Vec::new()), "");
    }
}
