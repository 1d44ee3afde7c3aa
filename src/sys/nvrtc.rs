//! NVRTC: CUDA C++ → LTO-IR / PTX / cubin, in-process.
//!
//! Options that produce LTO-IR (checked against NVRTC 12.9): `-dlto` with a
//! virtual or a real architecture, e.g.
//! `["-dlto", "-rdc=true", "--gpu-architecture=compute_75"]` or
//! `["-dlto", "-rdc=true", "-arch=sm_90"]`. `-rdc=true` is needed when the
//! program calls `extern` device functions defined in another program.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::ptr;

use super::loader::{self, Library};
use super::{cstring, cstrings, SysError};

/// `nvrtcResult`.
pub type NvrtcResult = c_int;
/// `nvrtcProgram` (opaque).
pub type NvrtcProgram = *mut c_void;

/// `NVRTC_SUCCESS`.
pub const NVRTC_SUCCESS: NvrtcResult = 0;

/// Raw NVRTC entry points (signatures from `nvrtc.h`, CUDA 12.9).
#[allow(non_snake_case)]
#[derive(Clone, Copy)]
pub struct NvrtcFns {
    pub nvrtcVersion: unsafe extern "C" fn(major: *mut c_int, minor: *mut c_int) -> NvrtcResult,
    pub nvrtcGetErrorString: unsafe extern "C" fn(result: NvrtcResult) -> *const c_char,
    pub nvrtcCreateProgram: unsafe extern "C" fn(
        prog: *mut NvrtcProgram,
        src: *const c_char,
        name: *const c_char,
        num_headers: c_int,
        headers: *const *const c_char,
        include_names: *const *const c_char,
    ) -> NvrtcResult,
    pub nvrtcCompileProgram: unsafe extern "C" fn(
        prog: NvrtcProgram,
        num_options: c_int,
        options: *const *const c_char,
    ) -> NvrtcResult,
    pub nvrtcDestroyProgram: unsafe extern "C" fn(prog: *mut NvrtcProgram) -> NvrtcResult,
    pub nvrtcGetProgramLogSize: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub nvrtcGetProgramLog: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub nvrtcGetLTOIRSize: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub nvrtcGetLTOIR: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub nvrtcGetPTXSize: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub nvrtcGetPTX: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub nvrtcGetCUBINSize: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub nvrtcGetCUBIN: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    /// Registers a C++ name expression (`quantize<float>`) whose mangled
    /// name is wanted after the compile; also forces its instantiation.
    pub nvrtcAddNameExpression:
        unsafe extern "C" fn(NvrtcProgram, name_expression: *const c_char) -> NvrtcResult,
    /// The mangled ("lowered") name of a registered expression; the string
    /// lives as long as the program.
    pub nvrtcGetLoweredName: unsafe extern "C" fn(
        NvrtcProgram,
        name_expression: *const c_char,
        lowered_name: *mut *const c_char,
    ) -> NvrtcResult,
    /// Optional (since CUDA 11.2).
    pub nvrtcGetNumSupportedArchs: Option<unsafe extern "C" fn(*mut c_int) -> NvrtcResult>,
    /// Optional (since CUDA 11.2).
    pub nvrtcGetSupportedArchs: Option<unsafe extern "C" fn(*mut c_int) -> NvrtcResult>,
}

impl NvrtcFns {
    /// Resolves every entry point in `lib` (opened from `path`).
    ///
    /// # Safety
    /// `lib` must be NVRTC, and the table must not outlive `lib`.
    pub unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError> {
        macro_rules! req {
            ($name:literal) => {
                unsafe { loader::resolve(lib, Library::Nvrtc, path, $name, false)? }
            };
        }
        Ok(NvrtcFns {
            nvrtcVersion: req!("nvrtcVersion"),
            nvrtcGetErrorString: req!("nvrtcGetErrorString"),
            nvrtcCreateProgram: req!("nvrtcCreateProgram"),
            nvrtcCompileProgram: req!("nvrtcCompileProgram"),
            nvrtcDestroyProgram: req!("nvrtcDestroyProgram"),
            nvrtcGetProgramLogSize: req!("nvrtcGetProgramLogSize"),
            nvrtcGetProgramLog: req!("nvrtcGetProgramLog"),
            nvrtcGetLTOIRSize: req!("nvrtcGetLTOIRSize"),
            nvrtcGetLTOIR: req!("nvrtcGetLTOIR"),
            nvrtcGetPTXSize: req!("nvrtcGetPTXSize"),
            nvrtcGetPTX: req!("nvrtcGetPTX"),
            nvrtcGetCUBINSize: req!("nvrtcGetCUBINSize"),
            nvrtcGetCUBIN: req!("nvrtcGetCUBIN"),
            nvrtcAddNameExpression: req!("nvrtcAddNameExpression"),
            nvrtcGetLoweredName: req!("nvrtcGetLoweredName"),
            nvrtcGetNumSupportedArchs: unsafe {
                loader::resolve_optional(lib, "nvrtcGetNumSupportedArchs", false)
            },
            nvrtcGetSupportedArchs: unsafe {
                loader::resolve_optional(lib, "nvrtcGetSupportedArchs", false)
            },
        })
    }
}

/// What [`Nvrtc::compile`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Output {
    /// LTO-IR (`nvrtcGetLTOIR`); needs `-dlto`.
    LtoIr,
    /// PTX text (`nvrtcGetPTX`); the bytes include NVRTC's trailing NUL.
    Ptx,
    /// A cubin (`nvrtcGetCUBIN`); needs a real architecture (`-arch=sm_XX`)
    /// and no `-dlto`.
    Cubin,
}

impl Output {
    fn what(self) -> &'static str {
        match self {
            Output::LtoIr => "LTO-IR",
            Output::Ptx => "PTX",
            Output::Cubin => "cubin",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Output::LtoIr => "pass -dlto (with --gpu-architecture=compute_XX or sm_XX)",
            Output::Ptx => "do not pass -dlto when asking for PTX",
            Output::Cubin => "pass a real architecture (-arch=sm_XX) and no -dlto",
        }
    }
}

/// The result of a successful compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The requested output, exactly as NVRTC returned it.
    pub bytes: Vec<u8>,
    /// The program log (warnings; usually empty).
    pub log: String,
}

impl loader::FnTable for NvrtcFns {
    const LIBRARY: Library = Library::Nvrtc;

    unsafe fn load(lib: &libloading::Library, path: &Path) -> Result<Self, SysError> {
        // SAFETY: forwarded from the trait's contract.
        unsafe { NvrtcFns::load(lib, path) }
    }

    fn version(&self) -> Result<(u32, u32), loader::Reject> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let r = unsafe { (self.nvrtcVersion)(&mut major, &mut minor) };
        if r != 0 {
            return Err(loader::Reject::Skip(format!("nvrtcVersion returned {r}")));
        }
        Ok((major as u32, minor as u32))
    }
}

/// NVRTC `dlopen`s `libnvrtc-builtins.so.<major>.<minor>` by soname, and the
/// CUDA 13 wheel's libnvrtc has no run path to find it beside itself (the
/// CUDA 12 wheels' does). Loading it first by absolute path makes that
/// soname resolve to the already-loaded library, with no `LD_LIBRARY_PATH`.
fn preload_builtins(nvrtc: &Path) -> Vec<libloading::Library> {
    let Some(dir) = nvrtc.parent() else {
        return Vec::new();
    };
    loader::lib_files(dir, "libnvrtc-builtins.so")
        .into_iter()
        // SAFETY: NVIDIA's builtins library has no initialisers with
        // preconditions. A failure here resurfaces as NVRTC's own error.
        .filter_map(|p| unsafe { loader::open_resident(p.as_os_str()) }.ok())
        .collect()
}

loader::library_handle! {
    /// A loaded NVRTC. Cheap to clone; `Send + Sync` (NVRTC is thread-safe for
    /// distinct programs, and every [`Nvrtc::compile`] uses its own program).
    Nvrtc, NvrtcFns, "NVRTC", companions: preload_builtins
}

/// Destroys the program on every path out of `compile`.
struct ProgramGuard<'a> {
    fns: &'a NvrtcFns,
    prog: NvrtcProgram,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        if !self.prog.is_null() {
            // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed once.
            unsafe { (self.fns.nvrtcDestroyProgram)(&mut self.prog) };
        }
    }
}

impl Nvrtc {
    /// `nvrtcVersion` as read when the library was opened.
    pub fn version_u32(&self) -> (u32, u32) {
        self.inner.version
    }

    /// `nvrtcVersion`: (major, minor), as read when the library was opened.
    pub fn version(&self) -> Result<(i32, i32), SysError> {
        let (major, minor) = self.inner.version;
        Ok((major as i32, minor as i32))
    }

    /// `nvrtcGetSupportedArchs`: the real architectures (e.g. 75, 80, 90)
    /// this NVRTC can target. Empty if the library predates the call.
    pub fn supported_archs(&self) -> Result<Vec<i32>, SysError> {
        let (Some(num), Some(get)) = (
            self.inner.fns.nvrtcGetNumSupportedArchs,
            self.inner.fns.nvrtcGetSupportedArchs,
        ) else {
            return Ok(Vec::new());
        };
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check("nvrtcGetNumSupportedArchs", unsafe { num(&mut n) })?;
        let mut v = vec![0 as c_int; n.max(0) as usize];
        if !v.is_empty() {
            // SAFETY: `v` holds exactly `n` ints.
            self.check("nvrtcGetSupportedArchs", unsafe { get(v.as_mut_ptr()) })?;
        }
        Ok(v)
    }

    /// The enum name of an NVRTC result code (`nvrtcGetErrorString`).
    pub fn code_name(&self, code: NvrtcResult) -> String {
        // SAFETY: returns a pointer to a static string (or null).
        let p = unsafe { (self.inner.fns.nvrtcGetErrorString)(code) };
        if p.is_null() {
            format!("NVRTC_ERROR {code}")
        } else {
            // SAFETY: non-null, NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    fn check(&self, call: &'static str, r: NvrtcResult) -> Result<(), SysError> {
        if r == NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(SysError::Api {
                library: "NVRTC",
                call,
                code: r,
                code_name: self.code_name(r),
                log: String::new(),
            })
        }
    }

    /// Compiles `source` (named `name` in diagnostics) with `options` and
    /// returns `output`. A failed compile returns [`SysError::Compile`] with
    /// the full program log.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
        output: Output,
    ) -> Result<Compiled, SysError> {
        self.compile_with_headers(source, name, &[], options, output)
    }

    /// Like [`Nvrtc::compile`], with in-memory headers: `(include name,
    /// contents)` pairs that `#include "<include name>"` resolves to.
    pub fn compile_with_headers(
        &self,
        source: &str,
        name: &str,
        headers: &[(&str, &str)],
        options: &[String],
        output: Output,
    ) -> Result<Compiled, SysError> {
        self.compile_named(source, name, headers, options, output, &[])
            .map(|(c, _)| c)
    }

    /// Like [`Nvrtc::compile_with_headers`], registering C++ name
    /// expressions (`nvrtcAddNameExpression`, e.g. `quantize<float>`) and
    /// returning their mangled names (`nvrtcGetLoweredName`) in order. A
    /// templated kernel's mangled name cannot be written by hand; this is
    /// how it is known.
    pub fn compile_named(
        &self,
        source: &str,
        name: &str,
        headers: &[(&str, &str)],
        options: &[String],
        output: Output,
        expressions: &[String],
    ) -> Result<(Compiled, Vec<String>), SysError> {
        let (mut out, lowered) =
            self.compile_outputs(source, name, headers, options, &[output], expressions)?;
        Ok((out.remove(0), lowered))
    }

    /// Like [`Nvrtc::compile_named`], returning several outputs of the one
    /// compile, in the order asked: a real architecture without `-dlto`
    /// gives PTX and the cubin ptxas made of it from one front-end run.
    pub fn compile_outputs(
        &self,
        source: &str,
        name: &str,
        headers: &[(&str, &str)],
        options: &[String],
        outputs: &[Output],
        expressions: &[String],
    ) -> Result<(Vec<Compiled>, Vec<String>), SysError> {
        let fns = &self.inner.fns;
        let c_expressions = expressions
            .iter()
            .map(|e| cstring("name expression", e))
            .collect::<Result<Vec<_>, _>>()?;
        let c_source = cstring("CUDA source", source)?;
        let c_name = cstring("program name", name)?;
        let (_opts, opt_ptrs) = cstrings("NVRTC option", options)?;
        let header_bodies = headers
            .iter()
            .map(|(_, body)| cstring("header contents", body))
            .collect::<Result<Vec<_>, _>>()?;
        let header_names = headers
            .iter()
            .map(|(n, _)| cstring("header name", n))
            .collect::<Result<Vec<_>, _>>()?;
        let body_ptrs: Vec<*const c_char> = header_bodies.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
        let num_headers = c_int::try_from(headers.len())
            .map_err(|_| SysError::InvalidArgument("too many headers".into()))?;
        let num_options = c_int::try_from(options.len())
            .map_err(|_| SysError::InvalidArgument("too many NVRTC options".into()))?;

        let mut guard = ProgramGuard {
            fns,
            prog: ptr::null_mut(),
        };
        // SAFETY: all strings are NUL-terminated and outlive the call; the
        // header arrays have `num_headers` entries (or are null when empty).
        let r = unsafe {
            (fns.nvrtcCreateProgram)(
                &mut guard.prog,
                c_source.as_ptr(),
                c_name.as_ptr(),
                num_headers,
                if headers.is_empty() {
                    ptr::null()
                } else {
                    body_ptrs.as_ptr()
                },
                if headers.is_empty() {
                    ptr::null()
                } else {
                    name_ptrs.as_ptr()
                },
            )
        };
        self.check("nvrtcCreateProgram", r)?;
        for e in &c_expressions {
            // SAFETY: valid program; NUL-terminated expression.
            let r = unsafe { (fns.nvrtcAddNameExpression)(guard.prog, e.as_ptr()) };
            self.check("nvrtcAddNameExpression", r)?;
        }

        // SAFETY: valid program; `opt_ptrs` has `num_options` live C strings.
        let r = unsafe {
            (fns.nvrtcCompileProgram)(
                guard.prog,
                num_options,
                if options.is_empty() {
                    ptr::null()
                } else {
                    opt_ptrs.as_ptr()
                },
            )
        };
        let log = self.program_log(guard.prog)?;
        if r != NVRTC_SUCCESS {
            return Err(SysError::Compile {
                program: name.to_owned(),
                code_name: self.code_name(r),
                log,
            });
        }

        let mut lowered = Vec::with_capacity(expressions.len());
        for (e, c) in expressions.iter().zip(&c_expressions) {
            let mut out: *const c_char = ptr::null();
            // SAFETY: valid, compiled program; the expression was added.
            let r = unsafe { (fns.nvrtcGetLoweredName)(guard.prog, c.as_ptr(), &mut out) };
            if r != NVRTC_SUCCESS || out.is_null() {
                return Err(SysError::Compile {
                    program: name.to_owned(),
                    code_name: self.code_name(r),
                    log: format!(
                        "name expression `{e}` has no lowered name: it names no \
                         __global__ or __device__ entity of the program"
                    ),
                });
            }
            // SAFETY: NUL-terminated string owned by the live program.
            lowered.push(
                unsafe { CStr::from_ptr(out) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        let out = outputs
            .iter()
            .map(|&output| self.output(guard.prog, name, output, &log))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((out, lowered))
    }

    /// One output of a compiled program.
    fn output(
        &self,
        prog: NvrtcProgram,
        name: &str,
        output: Output,
        log: &str,
    ) -> Result<Compiled, SysError> {
        let fns = &self.inner.fns;
        let (size_fn, get_fn, size_call, get_call) = match output {
            Output::LtoIr => (
                fns.nvrtcGetLTOIRSize,
                fns.nvrtcGetLTOIR,
                "nvrtcGetLTOIRSize",
                "nvrtcGetLTOIR",
            ),
            Output::Ptx => (
                fns.nvrtcGetPTXSize,
                fns.nvrtcGetPTX,
                "nvrtcGetPTXSize",
                "nvrtcGetPTX",
            ),
            Output::Cubin => (
                fns.nvrtcGetCUBINSize,
                fns.nvrtcGetCUBIN,
                "nvrtcGetCUBINSize",
                "nvrtcGetCUBIN",
            ),
        };
        let empty = || SysError::EmptyOutput {
            library: "NVRTC",
            what: output.what(),
            name: name.to_owned(),
            hint: output.hint(),
        };
        let mut size = 0usize;
        // SAFETY: valid program and out-pointer.
        let r = unsafe { size_fn(prog, &mut size) };
        if r != NVRTC_SUCCESS {
            // NVRTC reports "nothing of this kind was generated" as
            // NVRTC_ERROR_INVALID_PROGRAM / INVALID_INPUT on some versions.
            let mut e = self.check(size_call, r).unwrap_err();
            if let SysError::Api { log: l, .. } = &mut e {
                *l = format!("{} ({})", output.hint(), log.trim_end());
            }
            return Err(e);
        }
        // PTX is NUL-terminated: a lone NUL (what NVRTC reports under -dlto)
        // means no PTX.
        if size == 0 || (output == Output::Ptx && size == 1) {
            return Err(empty());
        }
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` holds the `size` bytes NVRTC reported.
        let r = unsafe { get_fn(prog, bytes.as_mut_ptr().cast()) };
        self.check(get_call, r)?;
        Ok(Compiled {
            bytes,
            log: log.to_owned(),
        })
    }

    fn program_log(&self, prog: NvrtcProgram) -> Result<String, SysError> {
        let fns = &self.inner.fns;
        super::read_log(
            // SAFETY: valid program and out-pointer.
            |size| {
                self.check("nvrtcGetProgramLogSize", unsafe {
                    (fns.nvrtcGetProgramLogSize)(prog, size)
                })
            },
            // SAFETY: `read_log` passes a buffer of the size reported.
            |buf| {
                self.check("nvrtcGetProgramLog", unsafe {
                    (fns.nvrtcGetProgramLog)(prog, buf)
                })
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn nvrtc_is_send_sync() {
        assert_send_sync::<Nvrtc>();
    }

    #[test]
    fn missing_library_names_env_var() {
        let err = Nvrtc::open_path(Path::new("/nonexistent/libnvrtc.so.12")).unwrap_err();
        let s = err.to_string();
        assert!(s.contains("/nonexistent/libnvrtc.so.12"), "{s}");
        assert!(s.contains("FRAGLINK_NVRTC_PATH"), "{s}");
    }

    /// The embedded-IR check refuses an NVRTC of another major than the
    /// IR's, and without IR to check against (what the builder passes under
    /// `ignore_embedded_ir`) the same library opens. The real NVRTC,
    /// against IR posing as major 99. (That a library of another major
    /// really opens through the builder's opt-out needs a second CUDA:
    /// `benches/run.sh` builds with CUDA 13.0 through it.)
    #[test]
    fn the_embedded_ir_check_can_be_skipped() {
        let nvrtc = Nvrtc::open(None).expect("NVRTC (set FRAGLINK_NVRTC_PATH)");
        let path = Some(nvrtc.path());
        let e = Nvrtc::open_against(path, Some((99, 0)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("major must match"), "{e}");
        Nvrtc::open_against(path, None).unwrap();
    }
}
