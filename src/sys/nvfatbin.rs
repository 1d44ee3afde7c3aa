//! nvFatbin: packs LTO-IR (and PTX / cubins) for several architectures into
//! one fatbin, which nvJitLink accepts as `NVJITLINK_INPUT_FATBIN` and from
//! which it picks the best entry for the target architecture.
//!
//! Options accepted by `nvFatbinCreate` in 12.9 (see the header and the tests
//! in `tests/sys_roundtrip.rs`, which try them for real): `-32`, `-64`, `-c`,
//! `-compress=<true|false>` (default true), `-compress-all` (also compress
//! small entries), `-compress-mode=<default|size|speed|balance|none>`, `-cuda`,
//! `-g`, `-host=<linux|windows|mac>`, `-opencl`. An unknown option fails with
//! `NVFATBIN_ERROR_UNRECOGNIZED_OPTION`. fraglink uses
//! [`COMPRESS_OPTIONS`] = `-compress-all -compress-mode=size`.
//!
//! nvFatbin has no log API (12.4–12.9 export no `nvFatbinGetInfoLog`); errors
//! carry `nvFatbinGetErrorString`'s message and the entry's identifier/arch.
//!
//! The `arch` of every `nvFatbinAdd*` call is the bare number ("75", "90a");
//! [`FatbinBuilder`] also accepts and strips `sm_`, `compute_` and `lto_`.

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use super::loader::{self, Library};
use super::{cstring, cstrings, SysError};

/// `nvFatbinResult`.
pub type NvFatbinResult = std::ffi::c_int;
/// `nvFatbinHandle` (opaque).
pub type NvFatbinHandle = *mut c_void;

/// `NVFATBIN_SUCCESS`.
pub const NVFATBIN_SUCCESS: NvFatbinResult = 0;

/// The creation options fraglink uses: compress every entry, favour size.
pub const COMPRESS_OPTIONS: [&str; 2] = ["-compress-all", "-compress-mode=size"];

/// Enum names of `nvFatbinResult`, indexed by value (nvFatbin.h, CUDA 12.9).
pub const RESULT_NAMES: &[&str] = &[
    "NVFATBIN_SUCCESS",
    "NVFATBIN_ERROR_INTERNAL",
    "NVFATBIN_ERROR_ELF_ARCH_MISMATCH",
    "NVFATBIN_ERROR_ELF_SIZE_MISMATCH",
    "NVFATBIN_ERROR_MISSING_PTX_VERSION",
    "NVFATBIN_ERROR_NULL_POINTER",
    "NVFATBIN_ERROR_COMPRESSION_FAILED",
    "NVFATBIN_ERROR_COMPRESSED_SIZE_EXCEEDED",
    "NVFATBIN_ERROR_UNRECOGNIZED_OPTION",
    "NVFATBIN_ERROR_INVALID_ARCH",
    "NVFATBIN_ERROR_INVALID_NVVM",
    "NVFATBIN_ERROR_EMPTY_INPUT",
    "NVFATBIN_ERROR_MISSING_PTX_ARCH",
    "NVFATBIN_ERROR_PTX_ARCH_MISMATCH",
    "NVFATBIN_ERROR_MISSING_FATBIN",
    "NVFATBIN_ERROR_INVALID_INDEX",
    "NVFATBIN_ERROR_IDENTIFIER_REUSE",
    "NVFATBIN_ERROR_INTERNAL_PTX_OPTION",
];

/// The enum name of an nvFatbin result code.
pub fn result_name(code: NvFatbinResult) -> String {
    usize::try_from(code)
        .ok()
        .and_then(|i| RESULT_NAMES.get(i))
        .map(|s| (*s).to_owned())
        .unwrap_or_else(|| format!("NVFATBIN_ERROR_UNKNOWN_{code}"))
}

/// Raw nvFatbin entry points (signatures from `nvFatbin.h`, CUDA 12.9).
#[allow(non_snake_case)]
#[derive(Clone, Copy)]
pub struct NvFatbinFns {
    pub nvFatbinVersion:
        unsafe extern "C" fn(major: *mut c_uint, minor: *mut c_uint) -> NvFatbinResult,
    /// Returns a message (null for success).
    pub nvFatbinGetErrorString: unsafe extern "C" fn(result: NvFatbinResult) -> *const c_char,
    pub nvFatbinCreate: unsafe extern "C" fn(
        handle: *mut NvFatbinHandle,
        options: *const *const c_char,
        options_count: usize,
    ) -> NvFatbinResult,
    pub nvFatbinDestroy: unsafe extern "C" fn(handle: *mut NvFatbinHandle) -> NvFatbinResult,
    pub nvFatbinAddLTOIR: unsafe extern "C" fn(
        handle: NvFatbinHandle,
        code: *const c_void,
        size: usize,
        arch: *const c_char,
        identifier: *const c_char,
        options_cmd_line: *const c_char,
    ) -> NvFatbinResult,
    pub nvFatbinAddPTX: unsafe extern "C" fn(
        handle: NvFatbinHandle,
        code: *const c_char,
        size: usize,
        arch: *const c_char,
        identifier: *const c_char,
        options_cmd_line: *const c_char,
    ) -> NvFatbinResult,
    pub nvFatbinAddCubin: unsafe extern "C" fn(
        handle: NvFatbinHandle,
        code: *const c_void,
        size: usize,
        arch: *const c_char,
        identifier: *const c_char,
    ) -> NvFatbinResult,
    pub nvFatbinSize:
        unsafe extern "C" fn(handle: NvFatbinHandle, size: *mut usize) -> NvFatbinResult,
    pub nvFatbinGet:
        unsafe extern "C" fn(handle: NvFatbinHandle, buffer: *mut c_void) -> NvFatbinResult,
}

impl NvFatbinFns {
    /// Resolves every entry point in `lib` (opened from `path`).
    ///
    /// # Safety
    /// `lib` must be nvFatbin, and the table must not outlive `lib`.
    pub unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError> {
        macro_rules! req {
            ($name:literal) => {
                unsafe { loader::resolve(lib, Library::NvFatbin, path, $name, false)? }
            };
        }
        Ok(NvFatbinFns {
            nvFatbinVersion: req!("nvFatbinVersion"),
            nvFatbinGetErrorString: req!("nvFatbinGetErrorString"),
            nvFatbinCreate: req!("nvFatbinCreate"),
            nvFatbinDestroy: req!("nvFatbinDestroy"),
            nvFatbinAddLTOIR: req!("nvFatbinAddLTOIR"),
            nvFatbinAddPTX: req!("nvFatbinAddPTX"),
            nvFatbinAddCubin: req!("nvFatbinAddCubin"),
            nvFatbinSize: req!("nvFatbinSize"),
            nvFatbinGet: req!("nvFatbinGet"),
        })
    }
}

impl loader::FnTable for NvFatbinFns {
    const LIBRARY: Library = Library::NvFatbin;

    unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { NvFatbinFns::load(lib, path) }
    }

    fn version(&self) -> Result<(u32, u32), loader::Reject> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let r = unsafe { (self.nvFatbinVersion)(&mut major, &mut minor) };
        if r != 0 {
            return Err(loader::Reject::Skip(format!(
                "nvFatbinVersion returned {r}"
            )));
        }
        Ok((major, minor))
    }
}

type Inner = loader::Loaded<NvFatbinFns>;

loader::library_handle! {
    /// A loaded nvFatbin. Cheap to clone; `Send + Sync` (each [`FatbinBuilder`]
    /// owns its own handle).
    Nvfatbin, NvFatbinFns, "nvFatbin", companions: |_| Vec::new()
}

impl Nvfatbin {
    /// `nvFatbinVersion`: (major, minor), as read when the library was opened.
    pub fn version(&self) -> Result<(u32, u32), SysError> {
        Ok(self.inner.version)
    }

    /// `nvFatbinCreate` with `options` (e.g. [`COMPRESS_OPTIONS`]).
    pub fn builder(&self, options: &[String]) -> Result<FatbinBuilder, SysError> {
        let fns = &self.inner.fns;
        let (_opts, ptrs) = cstrings("nvFatbin option", options)?;
        let mut handle: NvFatbinHandle = ptr::null_mut();
        // SAFETY: valid out-pointer; `ptrs` has `options.len()` live C strings.
        let r = unsafe {
            (fns.nvFatbinCreate)(
                &mut handle,
                if ptrs.is_empty() {
                    ptr::null()
                } else {
                    ptrs.as_ptr()
                },
                ptrs.len(),
            )
        };
        // Own whatever handle came back so that it is destroyed on error too.
        let builder = FatbinBuilder {
            inner: Arc::clone(&self.inner),
            handle,
        };
        check(fns, "nvFatbinCreate", r)
            .map_err(|e| e.with_context(format_args!("options: {options:?}")))?;
        Ok(builder)
    }
}

fn check(fns: &NvFatbinFns, call: &'static str, r: NvFatbinResult) -> Result<(), SysError> {
    if r == NVFATBIN_SUCCESS {
        return Ok(());
    }
    // SAFETY: returns a static string or null.
    let p = unsafe { (fns.nvFatbinGetErrorString)(r) };
    let log = if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    Err(SysError::Api {
        library: "nvFatbin",
        call,
        code: r,
        code_name: result_name(r),
        log,
    })
}

/// Strips `sm_`, `compute_` or `lto_` from an architecture name: nvFatbin
/// wants the bare number ("75", "90a") and rejects the prefixed forms with
/// `NVFATBIN_ERROR_INVALID_ARCH`.
pub fn bare_arch(arch: &str) -> &str {
    for prefix in ["sm_", "compute_", "lto_"] {
        if let Some(rest) = arch.strip_prefix(prefix) {
            return rest;
        }
    }
    arch
}

/// [`bare_arch`], then checks the shape `<digits>[a|f]`: nvFatbin 12.9
/// silently accepts an empty arch, which yields an unusable entry.
pub fn fatbin_arch(arch: &str) -> Result<&str, SysError> {
    let bare = bare_arch(arch);
    let digits = bare.trim_end_matches(['a', 'f']);
    let suffix_ok = bare.len() - digits.len() <= 1;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || !suffix_ok {
        return Err(SysError::InvalidArgument(format!(
            "nvFatbin architecture `{arch}`: expected a number such as 75, 90a, sm_80 or compute_90"
        )));
    }
    Ok(bare)
}

/// One fatbin under construction (`nvFatbinHandle`). Destroyed on drop,
/// whether or not [`FatbinBuilder::finish`] ran. `Send`, not `Sync`.
pub struct FatbinBuilder {
    inner: Arc<Inner>,
    handle: NvFatbinHandle,
}

// SAFETY: the handle is owned exclusively by this value; nvFatbin handles
// are not tied to the thread that created them. `&mut self` methods serialise
// all uses.
unsafe impl Send for FatbinBuilder {}

impl std::fmt::Debug for FatbinBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FatbinBuilder")
            .field("handle", &self.handle)
            .finish()
    }
}

impl Drop for FatbinBuilder {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // SAFETY: handle from nvFatbinCreate, destroyed exactly once.
            unsafe { (self.inner.fns.nvFatbinDestroy)(&mut self.handle) };
            self.handle = ptr::null_mut();
        }
    }
}

impl FatbinBuilder {
    /// The raw handle (owned by `self`; do not destroy it).
    pub fn as_raw(&self) -> NvFatbinHandle {
        self.handle
    }

    /// `nvFatbinAddLTOIR`. `arch` is "75", "sm_75", "compute_75" or "lto_75";
    /// `identifier` names the entry (shown by cuobjdump); `options` is the
    /// JIT command line recorded with the entry ("" for none; valid:
    /// `-O0|-O3 -g -lineinfo -ftz=<n> -prec-div=<n> -prec-sqrt=<n> -fma=<n>`).
    pub fn add_ltoir(
        &mut self,
        code: &[u8],
        arch: &str,
        identifier: &str,
        options: &str,
    ) -> Result<(), SysError> {
        let arch_c = cstring("nvFatbin arch", fatbin_arch(arch)?)?;
        let id_c = cstring("nvFatbin identifier", identifier)?;
        let opt_c = cstring("nvFatbin LTO-IR options", options)?;
        // SAFETY: live handle; `code` is `code.len()` readable bytes.
        let r = unsafe {
            (self.inner.fns.nvFatbinAddLTOIR)(
                self.handle,
                code.as_ptr().cast(),
                code.len(),
                arch_c.as_ptr(),
                id_c.as_ptr(),
                opt_c.as_ptr(),
            )
        };
        self.check_add("nvFatbinAddLTOIR", r, arch, identifier)
    }

    /// `nvFatbinAddPTX`. `ptx` should end with a NUL (one is added otherwise).
    pub fn add_ptx(
        &mut self,
        ptx: &[u8],
        arch: &str,
        identifier: &str,
        options: &str,
    ) -> Result<(), SysError> {
        let arch_c = cstring("nvFatbin arch", fatbin_arch(arch)?)?;
        let id_c = cstring("nvFatbin identifier", identifier)?;
        let opt_c = cstring("nvFatbin PTX options", options)?;
        let mut owned;
        let ptx = if ptx.last() == Some(&0) {
            ptx
        } else {
            owned = ptx.to_vec();
            owned.push(0);
            &owned[..]
        };
        // SAFETY: live handle; `ptx` is NUL-terminated and `ptx.len()` long.
        let r = unsafe {
            (self.inner.fns.nvFatbinAddPTX)(
                self.handle,
                ptx.as_ptr().cast(),
                ptx.len(),
                arch_c.as_ptr(),
                id_c.as_ptr(),
                opt_c.as_ptr(),
            )
        };
        self.check_add("nvFatbinAddPTX", r, arch, identifier)
    }

    /// `nvFatbinAddCubin`.
    pub fn add_cubin(
        &mut self,
        cubin: &[u8],
        arch: &str,
        identifier: &str,
    ) -> Result<(), SysError> {
        let arch_c = cstring("nvFatbin arch", fatbin_arch(arch)?)?;
        let id_c = cstring("nvFatbin identifier", identifier)?;
        // SAFETY: live handle; `cubin` is `cubin.len()` readable bytes.
        let r = unsafe {
            (self.inner.fns.nvFatbinAddCubin)(
                self.handle,
                cubin.as_ptr().cast(),
                cubin.len(),
                arch_c.as_ptr(),
                id_c.as_ptr(),
            )
        };
        self.check_add("nvFatbinAddCubin", r, arch, identifier)
    }

    fn check_add(
        &self,
        call: &'static str,
        r: NvFatbinResult,
        arch: &str,
        identifier: &str,
    ) -> Result<(), SysError> {
        check(&self.inner.fns, call, r)
            .map_err(|e| e.with_context(format_args!("entry `{identifier}`, arch `{arch}`")))
    }

    /// `nvFatbinSize` + `nvFatbinGet`: the finished fatbin. The handle is
    /// destroyed afterwards (and on error).
    pub fn finish(self) -> Result<Vec<u8>, SysError> {
        let fns = &self.inner.fns;
        let mut size = 0usize;
        // SAFETY: live handle, valid out-pointer.
        check(fns, "nvFatbinSize", unsafe {
            (fns.nvFatbinSize)(self.handle, &mut size)
        })?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes nvFatbinSize reported.
        check(fns, "nvFatbinGet", unsafe {
            (fns.nvFatbinGet)(self.handle, buf.as_mut_ptr().cast())
        })?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn thread_safety_markers() {
        assert_send_sync::<Nvfatbin>();
        assert_send::<FatbinBuilder>();
    }

    #[test]
    fn arch_prefixes() {
        assert_eq!(bare_arch("75"), "75");
        assert_eq!(bare_arch("sm_90a"), "90a");
        assert_eq!(bare_arch("compute_80"), "80");
        assert_eq!(bare_arch("lto_86"), "86");
        assert_eq!(fatbin_arch("sm_100f").unwrap(), "100f");
        assert_eq!(fatbin_arch("90a").unwrap(), "90a");
        assert!(fatbin_arch("").is_err());
        assert!(fatbin_arch("sm_").is_err());
        assert!(fatbin_arch("abc").is_err());
        assert!(fatbin_arch("90aa").is_err());
    }

    #[test]
    fn result_names() {
        assert_eq!(result_name(0), "NVFATBIN_SUCCESS");
        assert_eq!(result_name(8), "NVFATBIN_ERROR_UNRECOGNIZED_OPTION");
        assert_eq!(result_name(17), "NVFATBIN_ERROR_INTERNAL_PTX_OPTION");
        assert_eq!(result_name(99), "NVFATBIN_ERROR_UNKNOWN_99");
    }
}
