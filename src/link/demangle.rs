//! Itanium C++ demangling for error messages, through the C++ runtime's own
//! `abi::__cxa_demangle` (libstdc++, loaded on first use). Where it cannot
//! be loaded, names stay mangled: a message is still correct, only harder
//! to read.

use std::ffi::{c_char, c_int, CStr, CString};

use once_cell::sync::OnceCell;

type CxaDemangle = unsafe extern "C" fn(
    mangled: *const c_char,
    out: *mut c_char,
    length: *mut usize,
    status: *mut c_int,
) -> *mut c_char;

struct Runtime {
    _lib: libloading::Library,
    demangle: CxaDemangle,
}

fn runtime() -> Option<&'static Runtime> {
    static RT: OnceCell<Option<Runtime>> = OnceCell::new();
    RT.get_or_init(|| {
        ["libstdc++.so.6", "libc++abi.so.1", "libc++.so.1"]
            .iter()
            .find_map(|name| {
                // SAFETY: loading the C++ runtime runs no user code; it is
                // normally loaded already (NVRTC links it).
                let lib = unsafe { libloading::Library::new(name) }.ok()?;
                // SAFETY: the symbol has this signature in every Itanium ABI
                // runtime; the Library is kept alive beside the pointer.
                let f = unsafe { lib.get::<CxaDemangle>(b"__cxa_demangle\0") }.ok()?;
                let demangle = *f;
                Some(Runtime {
                    _lib: lib,
                    demangle,
                })
            })
    })
    .as_ref()
}

/// `_Z6helperi` → `helper(int)`; anything not a mangled C++ name (an
/// `extern "C"` symbol) is returned as is.
pub fn demangle(symbol: &str) -> String {
    if !symbol.starts_with("_Z") {
        return symbol.to_string();
    }
    let (Some(rt), Ok(c)) = (runtime(), CString::new(symbol)) else {
        return symbol.to_string();
    };
    let mut status: c_int = -1;
    // SAFETY: NUL-terminated input; a null buffer asks the runtime to
    // malloc the result, which is freed below.
    let out = unsafe {
        (rt.demangle)(
            c.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut status,
        )
    };
    if out.is_null() || status != 0 {
        return symbol.to_string();
    }
    // SAFETY: a NUL-terminated string malloc'ed by __cxa_demangle.
    let text = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: allocated with malloc by __cxa_demangle, freed once.
    unsafe { libc::free(out.cast()) };
    text
}

/// `helper(int)` (`_Z6helperi`), or the name alone when it is not mangled.
pub fn describe(symbol: &str) -> String {
    let d = demangle(symbol);
    if d == symbol {
        format!("`{symbol}`")
    } else {
        format!("`{d}` (`{symbol}`)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangled_names_are_demangled_and_others_kept() {
        assert_eq!(demangle("_Z6helperi"), "helper(int)");
        assert_eq!(
            demangle("_Z8quantizeIfEvPT_"),
            "void quantize<float>(float*)"
        );
        assert_eq!(demangle("affine_f32"), "affine_f32");
        assert_eq!(demangle("_Znot a name"), "_Znot a name");
        assert_eq!(describe("_Z6helperi"), "`helper(int)` (`_Z6helperi`)");
        assert_eq!(describe("k"), "`k`");
    }
}
