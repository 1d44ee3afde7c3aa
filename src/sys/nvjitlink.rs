//! nvJitLink: links LTO-IR, fatbins, PTX and cubins into one cubin, in-process
//! and without a GPU.
//!
//! Every entry point is resolved by its unversioned name first and then by
//! the versioned exports the header's inline wrappers call
//! (`__nvJitLinkCreate_12_9`, ...; see [`super::loader::VERSION_SUFFIXES`]).
//! The 12.9 wheel exports both forms, and both jump to the same code.
//!
//! With `-verbose` the info log holds ptxas' resource usage per function,
//! e.g. (12.9, `-lto -arch=sm_80 -O3 -verbose`):
//!
//! ```text
//! ptxas info    : 0 bytes gmem
//! ptxas info    : Compiling entry function 'k' for 'sm_80'
//! ptxas info    : Function properties for k
//! ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
//! ptxas info    : Compile time = 8.512 ms
//! ```
//!
//! (For sm_90 the `Used` line has no `cmem` part: `Used 8 registers, used 0
//! barriers`.) Device functions inlined by LTO do not get their own block.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use super::loader::{self, Library};
use super::{cstring, cstrings, log_to_string, SysError};

/// `nvJitLinkResult`.
pub type NvJitLinkResult = c_int;
/// `nvJitLinkHandle` (opaque).
pub type NvJitLinkHandle = *mut c_void;

/// `NVJITLINK_SUCCESS`.
pub const NVJITLINK_SUCCESS: NvJitLinkResult = 0;

/// Enum names of `nvJitLinkResult` by value. 0–9 are the 12.9 header's codes;
/// 10–15 are its `NEW_ERROR_CODES`, which the 13.0 header makes regular and
/// extends with 16–18.
pub const RESULT_NAMES: &[&str] = &[
    "NVJITLINK_SUCCESS",
    "NVJITLINK_ERROR_UNRECOGNIZED_OPTION",
    "NVJITLINK_ERROR_MISSING_ARCH",
    "NVJITLINK_ERROR_INVALID_INPUT",
    "NVJITLINK_ERROR_PTX_COMPILE",
    "NVJITLINK_ERROR_NVVM_COMPILE",
    "NVJITLINK_ERROR_INTERNAL",
    "NVJITLINK_ERROR_THREADPOOL",
    "NVJITLINK_ERROR_UNRECOGNIZED_INPUT",
    "NVJITLINK_ERROR_FINALIZE",
    "NVJITLINK_ERROR_NULL_INPUT",
    "NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS",
    "NVJITLINK_ERROR_INCORRECT_INPUT_TYPE",
    "NVJITLINK_ERROR_ARCH_MISMATCH",
    "NVJITLINK_ERROR_OUTDATED_LIBRARY",
    "NVJITLINK_ERROR_MISSING_FATBIN",
    "NVJITLINK_ERROR_UNRECOGNIZED_ARCH",
    "NVJITLINK_ERROR_UNSUPPORTED_ARCH",
    "NVJITLINK_ERROR_LTO_NOT_ENABLED",
];

/// The enum name of an nvJitLink result code.
pub fn result_name(code: NvJitLinkResult) -> String {
    usize::try_from(code)
        .ok()
        .and_then(|i| RESULT_NAMES.get(i))
        .map(|s| (*s).to_owned())
        .unwrap_or_else(|| format!("NVJITLINK_ERROR_UNKNOWN_{code}"))
}

/// `nvJitLinkInputType` (values from nvJitLink.h, CUDA 12.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum InputType {
    /// `NVJITLINK_INPUT_CUBIN`
    Cubin = 1,
    /// `NVJITLINK_INPUT_PTX`
    Ptx = 2,
    /// `NVJITLINK_INPUT_LTOIR`
    LtoIr = 3,
    /// `NVJITLINK_INPUT_FATBIN`
    Fatbin = 4,
    /// `NVJITLINK_INPUT_OBJECT` (host object with embedded device code)
    Object = 5,
    /// `NVJITLINK_INPUT_LIBRARY` (host static library)
    Library = 6,
    /// `NVJITLINK_INPUT_INDEX`
    Index = 7,
    /// `NVJITLINK_INPUT_ANY`: nvJitLink detects the kind.
    Any = 10,
}

impl InputType {
    /// The raw `nvJitLinkInputType` value.
    pub fn raw(self) -> c_int {
        self as c_int
    }
}

/// Raw nvJitLink entry points (signatures from nvJitLink.h, CUDA 12.9).
#[allow(non_snake_case)]
#[derive(Clone, Copy)]
pub struct NvJitLinkFns {
    pub nvJitLinkVersion:
        unsafe extern "C" fn(major: *mut c_uint, minor: *mut c_uint) -> NvJitLinkResult,
    pub nvJitLinkCreate: unsafe extern "C" fn(
        handle: *mut NvJitLinkHandle,
        num_options: u32,
        options: *const *const c_char,
    ) -> NvJitLinkResult,
    pub nvJitLinkDestroy: unsafe extern "C" fn(handle: *mut NvJitLinkHandle) -> NvJitLinkResult,
    pub nvJitLinkAddData: unsafe extern "C" fn(
        handle: NvJitLinkHandle,
        input_type: c_int,
        data: *const c_void,
        size: usize,
        name: *const c_char,
    ) -> NvJitLinkResult,
    /// Optional.
    pub nvJitLinkAddFile: Option<
        unsafe extern "C" fn(
            handle: NvJitLinkHandle,
            input_type: c_int,
            file_name: *const c_char,
        ) -> NvJitLinkResult,
    >,
    pub nvJitLinkComplete: unsafe extern "C" fn(handle: NvJitLinkHandle) -> NvJitLinkResult,
    pub nvJitLinkGetLinkedCubinSize:
        unsafe extern "C" fn(NvJitLinkHandle, *mut usize) -> NvJitLinkResult,
    pub nvJitLinkGetLinkedCubin:
        unsafe extern "C" fn(NvJitLinkHandle, *mut c_void) -> NvJitLinkResult,
    pub nvJitLinkGetLinkedPtxSize:
        unsafe extern "C" fn(NvJitLinkHandle, *mut usize) -> NvJitLinkResult,
    pub nvJitLinkGetLinkedPtx:
        unsafe extern "C" fn(NvJitLinkHandle, *mut c_char) -> NvJitLinkResult,
    pub nvJitLinkGetErrorLogSize:
        unsafe extern "C" fn(NvJitLinkHandle, *mut usize) -> NvJitLinkResult,
    pub nvJitLinkGetErrorLog: unsafe extern "C" fn(NvJitLinkHandle, *mut c_char) -> NvJitLinkResult,
    pub nvJitLinkGetInfoLogSize:
        unsafe extern "C" fn(NvJitLinkHandle, *mut usize) -> NvJitLinkResult,
    pub nvJitLinkGetInfoLog: unsafe extern "C" fn(NvJitLinkHandle, *mut c_char) -> NvJitLinkResult,
}

impl NvJitLinkFns {
    /// Resolves every entry point in `lib` (opened from `path`), with the
    /// versioned-name fallback.
    ///
    /// # Safety
    /// `lib` must be nvJitLink, and the table must not outlive `lib`.
    pub unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError> {
        macro_rules! req {
            ($name:literal) => {
                unsafe { loader::resolve(lib, Library::NvJitLink, path, $name, true)? }
            };
        }
        Ok(NvJitLinkFns {
            // Resolved first so that a wrong library is reported with the
            // versioned names tried.
            nvJitLinkCreate: req!("nvJitLinkCreate"),
            // The only entry point without a versioned form.
            nvJitLinkVersion: unsafe {
                loader::resolve(lib, Library::NvJitLink, path, "nvJitLinkVersion", false)?
            },
            nvJitLinkDestroy: req!("nvJitLinkDestroy"),
            nvJitLinkAddData: req!("nvJitLinkAddData"),
            nvJitLinkAddFile: unsafe { loader::resolve_optional(lib, "nvJitLinkAddFile", true) },
            nvJitLinkComplete: req!("nvJitLinkComplete"),
            nvJitLinkGetLinkedCubinSize: req!("nvJitLinkGetLinkedCubinSize"),
            nvJitLinkGetLinkedCubin: req!("nvJitLinkGetLinkedCubin"),
            nvJitLinkGetLinkedPtxSize: req!("nvJitLinkGetLinkedPtxSize"),
            nvJitLinkGetLinkedPtx: req!("nvJitLinkGetLinkedPtx"),
            nvJitLinkGetErrorLogSize: req!("nvJitLinkGetErrorLogSize"),
            nvJitLinkGetErrorLog: req!("nvJitLinkGetErrorLog"),
            nvJitLinkGetInfoLogSize: req!("nvJitLinkGetInfoLogSize"),
            nvJitLinkGetInfoLog: req!("nvJitLinkGetInfoLog"),
        })
    }
}

impl loader::FnTable for NvJitLinkFns {
    const LIBRARY: Library = Library::NvJitLink;

    unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { NvJitLinkFns::load(lib, path) }
    }

    fn version(&self) -> Result<(u32, u32), loader::Reject> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let r = unsafe { (self.nvJitLinkVersion)(&mut major, &mut minor) };
        if r != NVJITLINK_SUCCESS {
            // As NVRTC and nvFatbin do: a copy that cannot say its version is
            // passed over, and the search goes on to the next candidate.
            return Err(loader::Reject::Skip(format!(
                "nvJitLinkVersion returned {r}"
            )));
        }
        Ok((major, minor))
    }
}

type Inner = loader::Loaded<NvJitLinkFns>;

/// Architectures (the part after `sm_` / `compute_`) that nvJitLink
/// `version` accepts, or `None` for a version this table does not cover
/// (then `-arch=` is passed through unchecked).
///
/// Why this exists: nvJitLink 12.9 *segfaults* inside `nvJitLinkCreate` when
/// given an architecture it does not know (`-arch=sm_122`, `sm_999`, ...)
/// once any link has completed in the process (in a fresh process it returns
/// `NVJITLINK_ERROR_INTERNAL`). [`NvJitLink::create`] therefore rejects such
/// options itself. The table follows the CUDA release notes: 12.0 supports
/// sm_50–sm_90a, 12.8 adds sm_100/101/120 (+`a`), 12.9 adds sm_103/121 (+`a`)
/// and the family-specific `f` variants of the Blackwell archs. nvJitLink 13
/// rejects unknown architectures itself (`NVJITLINK_ERROR_UNRECOGNIZED_ARCH`,
/// no crash), so 13.x is left unchecked (`None`).
pub fn known_archs(version: (u32, u32)) -> Option<Vec<&'static str>> {
    const BASE: &[&str] = &[
        "50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90", "90a",
    ];
    const V12_8: &[&str] = &["100", "100a", "101", "101a", "120", "120a"];
    const V12_9: &[&str] = &[
        "103", "103a", "121", "121a", "100f", "101f", "103f", "120f", "121f",
    ];
    let (major, minor) = version;
    if major != 12 || minor > 9 {
        return None;
    }
    let mut v = BASE.to_vec();
    if minor >= 8 {
        v.extend_from_slice(V12_8);
    }
    if minor >= 9 {
        v.extend_from_slice(V12_9);
    }
    Some(v)
}

/// Checks every `-arch=sm_XX` / `-arch=compute_XX` option against
/// [`known_archs`]. Values without a numeric architecture (`-arch=sm_abc`)
/// are left to nvJitLink, which rejects them cleanly.
pub fn check_arch_options(version: (u32, u32), options: &[String]) -> Result<(), SysError> {
    let Some(known) = known_archs(version) else {
        return Ok(());
    };
    for opt in options {
        let Some(value) = opt.strip_prefix("-arch=") else {
            continue;
        };
        let Some(arch) = value
            .strip_prefix("sm_")
            .or_else(|| value.strip_prefix("compute_"))
        else {
            continue;
        };
        if !arch.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        if !known.contains(&arch) {
            return Err(SysError::UnsupportedArch {
                library: "nvJitLink",
                version: format!("{}.{}", version.0, version.1),
                arch: value.to_owned(),
                supported: known
                    .iter()
                    .map(|a| format!("sm_{a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(())
}

loader::library_handle! {
    /// A loaded nvJitLink. Cheap to clone; `Send + Sync` (nvJitLink is
    /// thread-safe for distinct handles, and each [`LinkHandle`] owns one).
    NvJitLink, NvJitLinkFns, "nvJitLink", companions: |_| Vec::new()
}

impl NvJitLink {
    /// `nvJitLinkVersion`: (major, minor), read once when the library was opened.
    pub fn version(&self) -> Result<(u32, u32), SysError> {
        Ok(self.inner.version)
    }

    /// `nvJitLinkCreate` with `options` (e.g. `-lto`, `-arch=sm_80`, `-O3`,
    /// `-verbose`). A rejected option returns [`SysError::Api`] carrying
    /// nvJitLink's error log; the handle is destroyed on that path too. An
    /// `-arch=` this nvJitLink does not know returns
    /// [`SysError::UnsupportedArch`] without calling it (see [`known_archs`]).
    pub fn create(&self, options: &[String]) -> Result<LinkHandle, SysError> {
        let (_opts, ptrs) = cstrings("nvJitLink option", options)?;
        check_arch_options(self.inner.version, options)?;
        let num = u32::try_from(ptrs.len())
            .map_err(|_| SysError::InvalidArgument("too many nvJitLink options".into()))?;
        let mut raw: NvJitLinkHandle = ptr::null_mut();
        // SAFETY: valid out-pointer; `ptrs` has `num` live C strings.
        let r = unsafe {
            (self.inner.fns.nvJitLinkCreate)(
                &mut raw,
                num,
                if ptrs.is_empty() {
                    ptr::null()
                } else {
                    ptrs.as_ptr()
                },
            )
        };
        // Own whatever came back so it is destroyed on every path.
        let handle = LinkHandle {
            inner: Arc::clone(&self.inner),
            handle: raw,
        };
        if r != NVJITLINK_SUCCESS {
            let mut log = handle.error_log_lossy();
            if !log.is_empty() && !log.ends_with('\n') {
                log.push('\n');
            }
            log.push_str(&format!("(options: {options:?})"));
            return Err(api_error("nvJitLinkCreate", r, log));
        }
        if handle.handle.is_null() {
            return Err(api_error(
                "nvJitLinkCreate",
                NVJITLINK_ERROR_INTERNAL,
                "returned a null handle".into(),
            ));
        }
        Ok(handle)
    }
}

const NVJITLINK_ERROR_INTERNAL: NvJitLinkResult = 6;

fn api_error(call: &'static str, code: NvJitLinkResult, log: String) -> SysError {
    SysError::Api {
        library: "nvJitLink",
        call,
        code,
        code_name: result_name(code),
        log,
    }
}

/// One link (`nvJitLinkHandle`): add inputs, [`complete`](LinkHandle::complete),
/// then read the cubin and logs. Destroyed on drop. `Send`, not `Sync`.
pub struct LinkHandle {
    inner: Arc<Inner>,
    handle: NvJitLinkHandle,
}

// SAFETY: the handle is owned exclusively by this value and nvJitLink handles
// are not tied to a thread; mutation goes through `&mut self`, and the `&self`
// getters only read results of a completed link.
unsafe impl Send for LinkHandle {}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle")
            .field("handle", &self.handle)
            .finish()
    }
}

impl Drop for LinkHandle {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // SAFETY: handle from nvJitLinkCreate, destroyed exactly once.
            unsafe { (self.inner.fns.nvJitLinkDestroy)(&mut self.handle) };
            self.handle = ptr::null_mut();
        }
    }
}

impl LinkHandle {
    /// The raw handle (owned by `self`; do not destroy it).
    pub fn as_raw(&self) -> NvJitLinkHandle {
        self.handle
    }

    /// `nvJitLinkAddData`: adds `data` of kind `input`, named `name` in
    /// diagnostics. An error carries nvJitLink's error log.
    pub fn add(&mut self, input: InputType, data: &[u8], name: &str) -> Result<(), SysError> {
        let name_c = cstring("nvJitLink input name", name)?;
        // SAFETY: live handle; `data` is `data.len()` readable bytes, which
        // nvJitLink copies or consumes before returning.
        let r = unsafe {
            (self.inner.fns.nvJitLinkAddData)(
                self.handle,
                input.raw(),
                data.as_ptr().cast(),
                data.len(),
                name_c.as_ptr(),
            )
        };
        self.check_with_log("nvJitLinkAddData", r, Some(name))
    }

    /// `nvJitLinkAddFile` (when the library exports it).
    pub fn add_file(&mut self, input: InputType, path: &Path) -> Result<(), SysError> {
        let Some(add_file) = self.inner.fns.nvJitLinkAddFile else {
            return Err(SysError::SymbolMissing {
                library: "nvJitLink",
                path: self.inner.path.clone(),
                symbol: "nvJitLinkAddFile",
                tried: loader::symbol_names("nvJitLinkAddFile", true),
            });
        };
        let shown = path.to_string_lossy();
        let path_c = cstring("nvJitLink input path", &shown)?;
        // SAFETY: live handle and NUL-terminated path.
        let r = unsafe { add_file(self.handle, input.raw(), path_c.as_ptr()) };
        self.check_with_log("nvJitLinkAddFile", r, Some(&shown))
    }

    /// `nvJitLinkComplete`. On failure returns [`SysError::Link`] with the
    /// result code name, the error log and the info log.
    pub fn complete(&mut self) -> Result<(), SysError> {
        // SAFETY: live handle.
        let r = unsafe { (self.inner.fns.nvJitLinkComplete)(self.handle) };
        if r == NVJITLINK_SUCCESS {
            return Ok(());
        }
        Err(SysError::Link {
            code: r,
            code_name: result_name(r),
            error_log: self.error_log_lossy(),
            info_log: self.info_log().unwrap_or_default(),
        })
    }

    /// The linked cubin (after a successful [`complete`](LinkHandle::complete)).
    pub fn cubin(&self) -> Result<Vec<u8>, SysError> {
        let fns = &self.inner.fns;
        let mut size = 0usize;
        // SAFETY: live handle, valid out-pointer.
        let r = unsafe { (fns.nvJitLinkGetLinkedCubinSize)(self.handle, &mut size) };
        self.check_with_log("nvJitLinkGetLinkedCubinSize", r, None)?;
        if size == 0 {
            return Err(SysError::EmptyOutput {
                library: "nvJitLink",
                what: "cubin",
                name: "link".into(),
                hint: "call complete() first; with -ptx nvJitLink emits PTX instead",
            });
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes reported.
        let r = unsafe { (fns.nvJitLinkGetLinkedCubin)(self.handle, buf.as_mut_ptr().cast()) };
        self.check_with_log("nvJitLinkGetLinkedCubin", r, None)?;
        Ok(buf)
    }

    /// The linked PTX (needs `-ptx` at creation), without the trailing NUL.
    pub fn ptx(&self) -> Result<String, SysError> {
        let fns = &self.inner.fns;
        let mut size = 0usize;
        // SAFETY: live handle, valid out-pointer.
        let r = unsafe { (fns.nvJitLinkGetLinkedPtxSize)(self.handle, &mut size) };
        self.check_with_log("nvJitLinkGetLinkedPtxSize", r, None)?;
        if size == 0 {
            return Err(SysError::EmptyOutput {
                library: "nvJitLink",
                what: "PTX",
                name: "link".into(),
                hint: "create the link with -ptx and call complete() first",
            });
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes reported.
        let r = unsafe { (fns.nvJitLinkGetLinkedPtx)(self.handle, buf.as_mut_ptr().cast()) };
        self.check_with_log("nvJitLinkGetLinkedPtx", r, None)?;
        Ok(log_to_string(buf))
    }

    /// The info log (with `-verbose`: ptxas resource usage per function).
    pub fn info_log(&self) -> Result<String, SysError> {
        let fns = &self.inner.fns;
        // SAFETY: live handle; size/get pair of the same log.
        unsafe {
            self.read_log(
                fns.nvJitLinkGetInfoLogSize,
                fns.nvJitLinkGetInfoLog,
                "nvJitLinkGetInfoLog",
            )
        }
    }

    /// The error log.
    pub fn error_log(&self) -> Result<String, SysError> {
        let fns = &self.inner.fns;
        // SAFETY: live handle; size/get pair of the same log.
        unsafe {
            self.read_log(
                fns.nvJitLinkGetErrorLogSize,
                fns.nvJitLinkGetErrorLog,
                "nvJitLinkGetErrorLog",
            )
        }
    }

    fn error_log_lossy(&self) -> String {
        if self.handle.is_null() {
            return String::new();
        }
        self.error_log().unwrap_or_default()
    }

    /// # Safety
    /// `size_fn` and `get_fn` must be the size/get pair of one log.
    unsafe fn read_log(
        &self,
        size_fn: unsafe extern "C" fn(NvJitLinkHandle, *mut usize) -> NvJitLinkResult,
        get_fn: unsafe extern "C" fn(NvJitLinkHandle, *mut c_char) -> NvJitLinkResult,
        call: &'static str,
    ) -> Result<String, SysError> {
        if self.handle.is_null() {
            return Ok(String::new());
        }
        let ok = |r| match r {
            NVJITLINK_SUCCESS => Ok(()),
            r => Err(api_error(call, r, String::new())),
        };
        super::read_log(
            // SAFETY: live handle, valid out-pointer.
            |size| ok(unsafe { size_fn(self.handle, size) }),
            // SAFETY: `read_log` passes a buffer of the size reported.
            |buf| ok(unsafe { get_fn(self.handle, buf) }),
        )
    }

    fn check_with_log(
        &self,
        call: &'static str,
        r: NvJitLinkResult,
        input: Option<&str>,
    ) -> Result<(), SysError> {
        if r == NVJITLINK_SUCCESS {
            return Ok(());
        }
        let mut log = self.error_log_lossy();
        if let Some(input) = input {
            if !log.is_empty() && !log.ends_with('\n') {
                log.push('\n');
            }
            log.push_str(&format!("(input `{input}`)"));
        }
        Err(api_error(call, r, log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn thread_safety_markers() {
        assert_send_sync::<NvJitLink>();
        assert_send::<LinkHandle>();
    }

    #[test]
    fn input_type_values_match_header() {
        assert_eq!(InputType::Cubin.raw(), 1);
        assert_eq!(InputType::Ptx.raw(), 2);
        assert_eq!(InputType::LtoIr.raw(), 3);
        assert_eq!(InputType::Fatbin.raw(), 4);
        assert_eq!(InputType::Object.raw(), 5);
        assert_eq!(InputType::Library.raw(), 6);
        assert_eq!(InputType::Index.raw(), 7);
        assert_eq!(InputType::Any.raw(), 10);
    }

    #[test]
    fn arch_guard() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let v = (12, 9);
        assert!(check_arch_options(v, &o(&["-lto", "-arch=sm_80", "-O3"])).is_ok());
        assert!(check_arch_options(v, &o(&["-arch=sm_121a"])).is_ok());
        assert!(check_arch_options(v, &o(&["-arch=sm_100f"])).is_ok());
        assert!(check_arch_options(v, &o(&["-arch=compute_90", "-ptx"])).is_ok());
        // Left for nvJitLink to reject cleanly.
        assert!(check_arch_options(v, &o(&["-arch=sm_abc"])).is_ok());
        let e = check_arch_options(v, &o(&["-lto", "-arch=sm_999"])).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("sm_999") && s.contains("12.9") && s.contains("sm_90a"),
            "{s}"
        );
        assert!(check_arch_options(v, &o(&["-arch=compute_122"])).is_err());
        assert!(check_arch_options((12, 4), &o(&["-arch=sm_100"])).is_err());
        assert!(check_arch_options((12, 8), &o(&["-arch=sm_100"])).is_ok());
        assert!(check_arch_options((12, 8), &o(&["-arch=sm_121"])).is_err());
        // Unknown versions pass through.
        assert!(check_arch_options((13, 0), &o(&["-arch=sm_110"])).is_ok());
    }

    #[test]
    fn result_names_match_header() {
        assert_eq!(result_name(0), "NVJITLINK_SUCCESS");
        assert_eq!(result_name(2), "NVJITLINK_ERROR_MISSING_ARCH");
        assert_eq!(result_name(9), "NVJITLINK_ERROR_FINALIZE");
        assert_eq!(result_name(-1), "NVJITLINK_ERROR_UNKNOWN_-1");
    }
}
