//! NVRTC options, checked once before anything compiles.
//!
//! Libraries arrive with nvcc command lines. NVRTC rejects most nvcc-only
//! spellings with "unrecognized option" and no advice, and some options
//! fraglink must own (the architecture, `-dlto`, `-rdc`). Here every option
//! is either kept, translated to NVRTC's spelling, or refused with the
//! NVRTC (or fraglink) equivalent named.

/// What happened to one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Passed to NVRTC as given.
    Kept(String),
    /// nvcc's spelling, replaced by NVRTC's (`from` → `to`).
    Translated { from: String, to: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NVRTC option `{option}` ({origin}) is refused: {advice}")]
pub struct OptionError {
    pub option: String,
    /// Where it was given (`Builder::nvrtc_option`, `family `x``).
    pub origin: String,
    pub advice: String,
}

/// nvcc spellings with a direct NVRTC equivalent.
const TRANSLATIONS: &[(&str, &str)] = &[
    ("-O3", "-dopt=on"),
    ("-O2", "-dopt=on"),
    ("-O1", "-dopt=on"),
    ("--generate-line-info", "-lineinfo"),
    ("--device-debug", "-G"),
    ("-use_fast_math", "--use_fast_math"),
    ("--ftz", "-ftz"),
];

/// Option prefixes refused, with the advice given.
const REFUSED: &[(&str, &str)] = &[
    ("-arch", "fraglink sets the architecture: use Builder::archs or FRAGLINK_ARCHS (e.g. compute_80,sm_90a)"),
    ("--gpu-architecture", "fraglink sets the architecture: use Builder::archs or FRAGLINK_ARCHS"),
    ("-gencode", "fraglink sets the architecture: use Builder::archs or FRAGLINK_ARCHS"),
    ("--generate-code", "fraglink sets the architecture: use Builder::archs or FRAGLINK_ARCHS"),
    ("-code", "fraglink sets the architecture: use Builder::archs or FRAGLINK_ARCHS"),
    ("-dlto", "fraglink always builds LTO-IR (-dlto)"),
    ("--dlink-time-opt", "fraglink always builds LTO-IR (-dlto)"),
    ("-rdc", "fraglink always passes --relocatable-device-code=true"),
    ("--relocatable-device-code", "fraglink always passes --relocatable-device-code=true"),
    ("-dc", "fraglink always passes --relocatable-device-code=true"),
    ("-default-device", "use Family::default_device(true|false) instead"),
    ("--device-as-default-execution-space", "use Family::default_device(true|false) instead"),
    ("--expt-relaxed-constexpr", "NVRTC has no such flag and compiles no host code: mark the constexpr function __host__ __device__, or keep Family::default_device(true) so unannotated functions are device functions"),
    ("-expt-relaxed-constexpr", "NVRTC has no such flag and compiles no host code: mark the constexpr function __host__ __device__, or keep Family::default_device(true) so unannotated functions are device functions"),
    ("--expt-extended-lambda", "NVRTC does not support extended (__device__-annotated) lambdas: use a plain lambda inside device code or a __device__ functor"),
    ("-expt-extended-lambda", "NVRTC does not support extended (__device__-annotated) lambdas: use a plain lambda inside device code or a __device__ functor"),
    ("--extended-lambda", "NVRTC does not support extended (__device__-annotated) lambdas: use a plain lambda inside device code or a __device__ functor"),
    ("-Xcompiler", "a host compiler option: NVRTC compiles device code only; drop it"),
    ("--compiler-options", "a host compiler option: NVRTC compiles device code only; drop it"),
    ("-ccbin", "a host compiler option: NVRTC compiles device code only; drop it"),
    ("--compiler-bindir", "a host compiler option: NVRTC compiles device code only; drop it"),
    ("--default-stream", "a host runtime option: NVRTC compiles device code only; drop it"),
    ("-Xlinker", "a host linker option: drop it"),
    ("-Xptxas", "ptxas runs in nvJitLink at link time for LTO-IR: use the Planner's options (max_registers, opt_level, ...)"),
    ("--ptxas-options", "ptxas runs in nvJitLink at link time for LTO-IR: use the Planner's options (max_registers, opt_level, ...)"),
    ("-maxrregcount", "a ptxas option, applied at link time for LTO-IR: use Planner::max_registers"),
    ("--maxrregcount", "a ptxas option, applied at link time for LTO-IR: use Planner::max_registers"),
    ("-lto", "an nvJitLink option: fraglink's linker passes it when an input needs it"),
    ("-g", "host debug information: NVRTC compiles device code only; use -G for device debug information"),
    ("-O0", "NVRTC has no -O0: use -G (device debug) to disable device optimisation"),
    ("-Wno-deprecated-gpu-targets", "NVRTC has no such warning: drop it"),
];

/// Whether `option` is `prefix` itself or `prefix` followed by `=`/a value.
fn matches(option: &str, prefix: &str) -> bool {
    option == prefix
        || option.strip_prefix(prefix).is_some_and(|rest| {
            rest.starts_with('=') || (prefix.len() > 3 && rest.starts_with(' '))
        })
}

/// Checks one option. `origin` names where it came from, for the error.
pub fn check(option: &str, origin: &str) -> Result<Checked, OptionError> {
    let refuse = |advice: &str| OptionError {
        option: option.to_string(),
        origin: origin.to_string(),
        advice: advice.to_string(),
    };
    let o = option.trim();
    if !o.starts_with('-') {
        return Err(refuse(
            "not an option (it does not start with `-`); pass one option per call",
        ));
    }
    if let Some((_, to)) = TRANSLATIONS.iter().find(|(from, _)| *from == o) {
        return Ok(Checked::Translated {
            from: o.to_string(),
            to: to.to_string(),
        });
    }
    if let Some((_, advice)) = REFUSED.iter().find(|(p, _)| matches(o, p)) {
        return Err(refuse(advice));
    }
    Ok(Checked::Kept(o.to_string()))
}

/// Checks every option; the NVRTC spellings in order, and a note for each
/// translation (the build prints them as warnings).
pub fn check_all(
    options: &[String],
    origin: &str,
) -> Result<(Vec<String>, Vec<String>), OptionError> {
    let mut out = Vec::with_capacity(options.len());
    let mut notes = Vec::new();
    for o in options {
        match check(o, origin)? {
            Checked::Kept(k) => out.push(k),
            Checked::Translated { from, to } => {
                notes.push(format!(
                    "NVRTC option `{from}` ({origin}) is nvcc's spelling; passing `{to}`"
                ));
                out.push(to);
            }
        }
    }
    Ok((out, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_options_are_kept() {
        for o in [
            "-DNDEBUG=1",
            "--use_fast_math",
            "-lineinfo",
            "-std=c++20",
            "-ftz=true",
        ] {
            assert_eq!(check(o, "t").unwrap(), Checked::Kept(o.into()), "{o}");
        }
    }

    #[test]
    fn nvcc_spellings_are_translated() {
        let (out, notes) = check_all(
            &["-O3".into(), "--generate-line-info".into()],
            "Builder::nvrtc_option",
        )
        .unwrap();
        assert_eq!(out, ["-dopt=on", "-lineinfo"]);
        assert!(
            notes[0].contains("`-O3`") && notes[0].contains("`-dopt=on`"),
            "{notes:?}"
        );
    }

    #[test]
    fn refused_options_name_the_equivalent() {
        let e = check("--expt-relaxed-constexpr", "family `q`").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("family `q`") && msg.contains("__host__ __device__"),
            "{msg}"
        );
        let e = check("-arch=sm_80", "t").unwrap_err().to_string();
        assert!(e.contains("Builder::archs"), "{e}");
        let e = check("-Xcompiler=-fPIC", "t").unwrap_err().to_string();
        assert!(e.contains("host compiler"), "{e}");
        let e = check("-maxrregcount=32", "t").unwrap_err().to_string();
        assert!(e.contains("Planner::max_registers"), "{e}");
        assert!(check("fast", "t").is_err());
        // A longer option that merely starts like a refused one is not refused.
        assert_eq!(
            check("-gpu-foo", "t").unwrap(),
            Checked::Kept("-gpu-foo".into())
        );
        assert_eq!(check("-G", "t").unwrap(), Checked::Kept("-G".into()));
    }
}
