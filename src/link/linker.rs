//! The safe linker: nvJitLink options as a type, one link as one call, the
//! handle destroyed on every path (by [`crate::sys::LinkHandle`]'s `Drop`).

use std::time::{Duration, Instant};

use crate::build::arch::Arch;
use crate::sys::{InputType, NvJitLink};

use super::LinkError;

/// nvJitLink options. `-verbose` (for resource usage) is always passed,
/// `-lto` when an input needs it ([`LinkOptions::lto`]); the rest map one
/// to one onto nvJitLink's flags.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LinkOptions {
    /// The real architecture to produce a cubin for (`sm_90a` kept as is).
    pub arch: Arch,
    /// `-lto`: `None` decides from the inputs ([`needs_lto`]); fraglink's
    /// own fragments are LTO-IR, so [`LinkRuntime`](super::LinkRuntime)
    /// links always pass it.
    pub lto: Option<bool>,
    /// 0 … 3. nvJitLink itself takes only `-O0` and `-O3` (`-O1` and `-O2`
    /// are "unrecognized option" errors, 12.9 and 13.0 alike), so levels 1
    /// and 2 keep `-O3` for the LTO optimiser and hand the level to ptxas
    /// (`-Xptxas=-O1`): a shorter ptxas pass, the same code from NVVM.
    pub opt_level: u8,
    pub lineinfo: bool,
    pub max_registers: Option<u32>,
    /// `-kernels-used=<entry>` for each: lets LTO drop every other kernel.
    pub kernels_used: Vec<String>,
    /// `-split-compile=<threads>` (0 = as many as the machine has).
    pub split_compile: Option<u32>,
    /// `-Ofc=<level>`: see [`FastCompile`]. `None` and `Some(Off)` pass
    /// nothing.
    pub fast_compile: Option<FastCompile>,
    pub ftz: Option<bool>,
    pub prec_div: Option<bool>,
    pub prec_sqrt: Option<bool>,
    pub fma: Option<bool>,
}

impl LinkOptions {
    pub fn new(arch: Arch) -> Self {
        LinkOptions {
            arch: arch.real(),
            lto: None,
            opt_level: 3,
            lineinfo: false,
            max_registers: None,
            kernels_used: Vec::new(),
            split_compile: None,
            fast_compile: None,
            ftz: None,
            prec_div: None,
            prec_sqrt: None,
            fma: None,
        }
    }

    /// The command line handed to `nvJitLinkCreate`.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if self.lto.unwrap_or(true) {
            a.push("-lto".to_string());
        }
        let opt = self.opt_level.min(3);
        a.push(format!("-arch={}", self.arch.real()));
        let fast = self.fast_compile.and_then(FastCompile::flag);
        let ptxas_level = (opt == 1 || opt == 2) && fast.is_none();
        match fast {
            // nvJitLink hands its -O level on to ptxas, which refuses it
            // beside -Ofc ("Conflicting options -opt-level=<0,2,3> and
            // --Ofast-compile=min", 12.9 and 13.0 alike): the fast-compile
            // level stands for the optimisation level.
            Some(flag) => a.push(flag),
            None => a.push(format!("-O{}", if opt == 0 { 0 } else { 3 })),
        }
        a.push("-verbose".to_string());
        if ptxas_level {
            a.push(format!("-Xptxas=-O{opt}"));
        }
        if self.lineinfo {
            a.push("-lineinfo".into());
        }
        if let Some(r) = self.max_registers {
            a.push(format!("-maxrregcount={r}"));
        }
        for k in &self.kernels_used {
            a.push(format!("-kernels-used={k}"));
        }
        if let Some(n) = self.split_compile {
            a.push(format!("-split-compile={n}"));
        }
        for (flag, v) in [
            ("-ftz", self.ftz),
            ("-prec-div", self.prec_div),
            ("-prec-sqrt", self.prec_sqrt),
            ("-fma", self.fma),
        ] {
            if let Some(v) = v {
                a.push(format!("{flag}={v}"));
            }
        }
        a
    }
}

/// nvJitLink's `-Ofc=<level>` (`--Ofast-compile`, as in nvcc): a shorter
/// link for slower code, in NVVM and ptxas both. Measured with nvJitLink 12.9
/// and 13.0 for sm_90 on a 2-core VM (`benches/scripts/cold_links.sh`):
/// `Min` links the scan in about two thirds of the time and the k-NN re-rank
/// in half, with the same registers or a few more. What it gives up shows in
/// the SASS (nvdisasm, sm_90): loops stay rolled and loads unvectorised, so
/// the exact in-order fold of `knn_rerank_f32_k32` keeps 7 global loads
/// instead of 96 (1320 -> 504 instructions; one row's fold then waits on
/// each element's load in turn), `knn_tile_f16_f16_q16_r64_k32_a16` 16
/// instead of 88 (its MMAs, 4 HMMA, and cp.async copies are the same). The
/// kernels' speed must therefore be measured on the GPU before a plan takes
/// this level (gpu_peers.py's `fraglink/fast-link` side). `Max` gave
/// kernels with stack frames and three times the registers; it is here for
/// completeness, not for search kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FastCompile {
    /// `-Ofc=0`: full optimisation (nothing is passed). A plan that says so
    /// keeps it where the runtime's default is another level.
    #[serde(rename = "0")]
    Off,
    Min,
    Mid,
    Max,
}

impl FastCompile {
    pub const VALUES: &'static str = "0, min, mid or max";

    /// The level from its nvJitLink spelling (`0`, `min`, `mid`, `max`;
    /// case and surrounding whitespace ignored).
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "0" | "off" => Some(FastCompile::Off),
            "min" => Some(FastCompile::Min),
            "mid" => Some(FastCompile::Mid),
            "max" => Some(FastCompile::Max),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FastCompile::Off => "0",
            FastCompile::Min => "min",
            FastCompile::Mid => "mid",
            FastCompile::Max => "max",
        }
    }

    /// The nvJitLink flag, `None` for [`Off`](Self::Off).
    fn flag(self) -> Option<String> {
        (self != FastCompile::Off).then(|| format!("-Ofc={}", self.as_str()))
    }
}

impl std::fmt::Display for FastCompile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a link of inputs of these kinds needs `-lto`: LTO-IR does, and
/// so may a container (fatbin, object, library, or a kind left to
/// nvJitLink); PTX and cubins do not (nvJitLink then links like `nvlink`).
pub fn needs_lto(kinds: impl IntoIterator<Item = InputType>) -> bool {
    kinds
        .into_iter()
        .any(|k| !matches!(k, InputType::Ptx | InputType::Cubin))
}

/// One input of a link: any kind nvJitLink takes (LTO-IR, PTX, cubin,
/// fatbin, host object or library with device code).
#[derive(Debug, Clone, Copy)]
pub struct LinkInput<'a> {
    pub name: &'a str,
    pub kind: InputType,
    pub bytes: &'a [u8],
}

impl LinkInput<'static> {
    /// An embedded fragment's fatbin, under the fragment's name.
    pub fn fragment(f: &'static crate::fragment::FragmentInfo) -> Self {
        LinkInput {
            name: f.name,
            kind: InputType::Fatbin,
            bytes: f.fatbin,
        }
    }
}

/// What nvJitLink produced.
#[derive(Debug, Clone)]
pub struct LinkOutput {
    pub cubin: Vec<u8>,
    pub info_log: String,
    pub link_time: Duration,
}

/// nvJitLink, version-checked against the NVRTC that built the fragments.
#[derive(Clone)]
pub struct Linker {
    nvjitlink: NvJitLink,
    version: (u32, u32),
}

impl std::fmt::Debug for Linker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linker")
            .field("path", &self.nvjitlink.path())
            .field("version", &self.version)
            .finish()
    }
}

/// LTO-IR must be linked by an nvJitLink of the same major version and an
/// equal or newer minor than the NVRTC that produced it (DESIGN.md 10).
pub fn check_versions(nvjitlink: (u32, u32), nvrtc: (u32, u32)) -> Result<(), LinkError> {
    if nvjitlink.0 != nvrtc.0 || nvjitlink.1 < nvrtc.1 {
        return Err(LinkError::VersionMismatch {
            nvjitlink: format!("{}.{}", nvjitlink.0, nvjitlink.1),
            nvrtc: format!("{}.{}", nvrtc.0, nvrtc.1),
        });
    }
    Ok(())
}

pub use crate::sys::loader::parse_version;

impl Linker {
    /// Opens nvJitLink (`FRAGLINK_NVJITLINK_PATH`, else the path found at
    /// build time) and checks it can link the embedded LTO-IR.
    pub fn open() -> Result<Self, LinkError> {
        Self::with_library(NvJitLink::open(None)?)
    }

    pub fn with_library(nvjitlink: NvJitLink) -> Result<Self, LinkError> {
        let version = nvjitlink.version()?;
        if let Some(nvrtc) = parse_version(crate::fragments::BUILD_NVRTC_VERSION) {
            check_versions(version, nvrtc)?;
        }
        Ok(Linker { nvjitlink, version })
    }

    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    pub fn library(&self) -> &NvJitLink {
        &self.nvjitlink
    }

    /// Links `inputs` into a cubin. A failure carries nvJitLink's error log.
    pub fn link(
        &self,
        inputs: &[LinkInput<'_>],
        options: &LinkOptions,
    ) -> Result<LinkOutput, LinkError> {
        let started = Instant::now();
        let mut options = options.clone();
        if options.lto.is_none() {
            options.lto = Some(needs_lto(inputs.iter().map(|i| i.kind)));
        }
        let mut handle = self.nvjitlink.create(&options.to_args())?;
        for input in inputs {
            handle.add(input.kind, input.bytes, input.name)?;
        }
        handle.complete()?;
        let cubin = handle.cubin()?;
        let info_log = handle.info_log().unwrap_or_default();
        Ok(LinkOutput {
            cubin,
            info_log,
            link_time: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_args() {
        let o = LinkOptions::new(Arch::sm(80));
        assert_eq!(o.to_args(), ["-lto", "-arch=sm_80", "-O3", "-verbose"]);
    }

    #[test]
    fn every_option_maps_to_its_flag() {
        let mut o = LinkOptions::new(Arch::compute(90));
        o.opt_level = 1;
        o.lineinfo = true;
        o.max_registers = Some(64);
        o.kernels_used = vec!["scan".into()];
        o.split_compile = Some(0);
        o.ftz = Some(false);
        o.prec_div = Some(true);
        o.prec_sqrt = Some(true);
        o.fma = Some(true);
        assert_eq!(
            o.to_args().join(" "),
            "-lto -arch=sm_90 -O3 -verbose -Xptxas=-O1 -lineinfo -maxrregcount=64 -kernels-used=scan \
             -split-compile=0 -ftz=false -prec-div=true -prec-sqrt=true -fma=true"
        );
    }

    #[test]
    fn fast_compile_replaces_the_optimisation_level() {
        let mut o = LinkOptions::new(Arch::sm(90));
        o.opt_level = 1;
        o.fast_compile = Some(FastCompile::Min);
        assert_eq!(o.to_args(), ["-lto", "-arch=sm_90", "-Ofc=min", "-verbose"]);
        o.fast_compile = Some(FastCompile::Off);
        assert_eq!(
            o.to_args(),
            ["-lto", "-arch=sm_90", "-O3", "-verbose", "-Xptxas=-O1"]
        );
        for level in [
            FastCompile::Off,
            FastCompile::Min,
            FastCompile::Mid,
            FastCompile::Max,
        ] {
            assert_eq!(FastCompile::parse(level.as_str()), Some(level));
            let json = serde_json::to_string(&level).unwrap();
            assert_eq!(json, format!("\"{level}\""));
            assert_eq!(serde_json::from_str::<FastCompile>(&json).unwrap(), level);
        }
        assert_eq!(FastCompile::parse(" MIN "), Some(FastCompile::Min));
        assert_eq!(FastCompile::parse("off"), Some(FastCompile::Off));
        assert_eq!(FastCompile::parse("fast"), None);
    }

    #[test]
    fn lto_only_when_an_input_needs_it() {
        assert!(!needs_lto([InputType::Ptx, InputType::Cubin]));
        assert!(needs_lto([InputType::Ptx, InputType::LtoIr]));
        assert!(needs_lto([InputType::Fatbin]));
        assert!(needs_lto([InputType::Object]));
        let mut o = LinkOptions::new(Arch::parse("sm_90a", "t").unwrap());
        o.lto = Some(false);
        assert_eq!(o.to_args(), ["-arch=sm_90a", "-O3", "-verbose"]);
    }

    #[test]
    fn version_rules() {
        assert!(check_versions((12, 9), (12, 9)).is_ok());
        assert!(check_versions((12, 9), (12, 4)).is_ok());
        let e = check_versions((12, 4), (12, 9)).unwrap_err().to_string();
        assert!(e.contains("12.4") && e.contains("12.9"), "{e}");
        assert!(check_versions((13, 0), (12, 9)).is_err());
        assert_eq!(parse_version("12.9"), Some((12, 9)));
        assert_eq!(parse_version("x"), None);
    }
}
