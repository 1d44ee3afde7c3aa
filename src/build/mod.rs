//! The build side: JSON matrices → rendered CUDA fragments → LTO-IR fatbins →
//! a generated Rust registry. Used by fraglink's own `build.rs` and public so
//! a downstream crate's `build.rs` compiles its own families the same way:
//!
//! ```no_run
//! // build.rs of a downstream crate
//! use fraglink::build::{Builder, Family};
//! Builder::new()
//!     .family(
//!         Family::new("saxpy", "SaxpyFragment")
//!             .matrix("matrices/saxpy.json")
//!             .template("templates/saxpy.cu.j2")
//!             .name_format("saxpy_{{ dtype }}")
//!             .tag("dtype", "DataType"),
//!     )
//!     .compile()
//!     .unwrap();
//! // src/lib.rs: mod registry { include!(concat!(env!("OUT_DIR"), "/fraglink_registry.rs")); }
//! ```
//!
//! For CUDA written for nvcc: standard-header stand-ins ([`std_headers`]),
//! `crt/` headers provisioned for `<mma.h>` ([`toolkit::Discovery::supply_crt`]),
//! plain-source families ([`Family::source`]), name expressions for
//! templated kernels ([`Family::name_expression`]), `-default-device` per
//! family with a host-code warning ([`lint`]), options checked up front
//! ([`options`]), keep-going builds with a report ([`Builder::keep_going`],
//! [`report`]), and each fragment's kernels recorded per arch ([`ptx`]).
//!
//! Every environment variable the build reads is listed in
//! [`toolkit::ENV_VARS`] and [`ENV_VARS`] ([`Builder::env_vars`]).

pub mod arch;
pub mod codegen;
pub mod compile;
pub mod families;
pub mod lint;
pub mod matrix;
pub mod min_arch;
pub mod options;
pub mod ptx;
pub mod render;
pub mod report;
pub mod std_headers;
pub mod toolkit;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use arch::Arch;
pub use codegen::{Param, ParamKind};
pub use toolkit::Toolkit;

/// The variables the build side reads besides toolkit discovery's
/// ([`toolkit::ENV_VARS`], one list there) and those cargo sets; the build
/// script reruns when any of either list changes ([`Builder::env_vars`]).
pub const ENV_VARS: &[&str] = &[
    "FRAGLINK_ARCHS",
    "FRAGLINK_BUILD_CACHE_DIR",
    "FRAGLINK_BUILD_JOBS",
    // The matrix product limit: `Builder::compile` refuses a family whose
    // matrix is over it with `BuildError::Matrix(MatrixFileError::TooLarge)`,
    // naming the file and the product's size.
    matrix::MAX_ENTRIES_VAR,
];

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Toolkit(#[from] toolkit::ToolkitError),
    #[error(transparent)]
    Matrix(#[from] matrix::MatrixFileError),
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Codegen(#[from] codegen::CodegenError),
    #[error(transparent)]
    Compile(#[from] compile::CompileError),
    #[error(transparent)]
    Option(#[from] options::OptionError),
    /// Some fragments failed (every one and every arch listed, each with
    /// NVRTC's log). Without `keep_going`, no registry was written.
    #[error("{} of {total} fragments failed to build{}:\n{}", report::failed_fragments(failures), match report { Some(r) => format!(" (report: {})", r.display()), None => String::new() }, failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"))]
    Fragments {
        failures: Vec<compile::CompileError>,
        total: usize,
        report: Option<PathBuf>,
    },
    #[error(transparent)]
    Arch(#[from] arch::ArchError),
    #[error(transparent)]
    MinArch(#[from] min_arch::MinArchError),
    #[error("loading the CUDA libraries found at {origin}: {source}")]
    Load {
        origin: String,
        source: crate::sys::SysError,
    },
    /// NVRTC failed the one-line compile that asks whether it takes
    /// `option` ([`compile::takes_option`]) for a reason other than refusing
    /// the option: the library does not work, and no fragment would build.
    #[error("NVRTC ({origin}) failed the compile that probes for `{option}`: {source}")]
    Probe {
        origin: String,
        option: &'static str,
        // Boxed: the variant would otherwise make every builder Result larger.
        source: Box<crate::sys::SysError>,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("builder option `{option}`: {message}")]
    Config {
        option: &'static str,
        message: String,
    },
}

/// One fragment family: a matrix, a template and how entries become names
/// and Rust types.
#[derive(Debug, Clone)]
pub struct Family {
    name: String,
    type_name: String,
    matrix: Option<PathBuf>,
    template: Option<PathBuf>,
    name_format: Option<String>,
    params: Vec<Param>,
    /// `template` is plain CUDA (see [`Family::source`]).
    plain: bool,
    expressions: Vec<String>,
    settings: compile::FamilyCompile,
    /// [`min_arch`](Self::min_arch) and [`min_arch_key`](Self::min_arch_key).
    min_arch: Option<u32>,
    min_arch_key: Option<String>,
}

impl Family {
    /// `name` is the family (`"metric"`), `type_name` the generated fragment
    /// type (`"MetricFragment"`).
    pub fn new(name: impl Into<String>, type_name: impl Into<String>) -> Self {
        Family {
            name: name.into(),
            type_name: type_name.into(),
            matrix: None,
            template: None,
            name_format: None,
            params: Vec::new(),
            plain: false,
            expressions: Vec::new(),
            settings: compile::FamilyCompile::default(),
            min_arch: None,
            min_arch_key: None,
        }
    }
    /// Every fragment of the family needs compute capability `number` (×10:
    /// 80 for sm_80) or newer: it is built only for the build's archs from
    /// `number` on ([`min_arch`] module).
    pub fn min_arch(mut self, number: u32) -> Self {
        self.min_arch = Some(number);
        self
    }
    /// Matrix key `key` gives each entry's minimum compute capability (×10,
    /// `"80"`); entries without the key have none beyond the family's.
    pub fn min_arch_key(mut self, key: impl Into<String>) -> Self {
        self.min_arch_key = Some(key.into());
        self
    }
    /// A plain CUDA source compiled as is, instead of a template: no
    /// template engine reads it (so `float z[1] = {{0.0f}};` is C++), and
    /// each matrix entry's values arrive as `-D` defines, keys upper-cased
    /// (`{"dtype": "float"}` → `-DDTYPE=float`), and in name expressions.
    /// Replaces a [`template`](Self::template) given before.
    pub fn source(mut self, path: impl Into<PathBuf>) -> Self {
        self.template = Some(path.into());
        self.plain = true;
        self
    }
    /// A C++ name expression naming a kernel of each fragment, a minijinja
    /// template over the entry (`quantize<{{ dtype }}>`). The build resolves
    /// it with NVRTC (`nvrtcAddNameExpression`, which also instantiates a
    /// template no device code uses) and records the mangled name in
    /// [`FragmentInfo::lowered`](crate::fragment::FragmentInfo), which
    /// [`Planner::kernel`](crate::link::Planner) uses.
    pub fn name_expression(mut self, expression: impl Into<String>) -> Self {
        self.expressions.push(expression.into());
        self
    }
    /// Pass NVRTC's `-default-device` (default: on), which makes
    /// unannotated functions device functions. Off, a host function is an
    /// NVRTC error instead of a device function launching from the GPU.
    pub fn default_device(mut self, on: bool) -> Self {
        self.settings.default_device = on;
        self
    }
    /// Put fraglink's standard-header stand-ins (`stdint.h`, `cmath`,
    /// `type_traits`, ..., mapped to libcu++; [`std_headers`]) on the
    /// include path (default: on).
    pub fn std_headers(mut self, on: bool) -> Self {
        self.settings.std_headers = on;
        self
    }
    /// Pass NVRTC's `--gen-opt-lto` (default: on, where the NVRTC takes
    /// it): NVRTC runs its optimizer over each fragment's LTO-IR at build
    /// time, so nvJitLink's optimizer starts from optimized IR at every
    /// cold link instead of the front end's raw output. The linked code is
    /// the same or close to it; the cold link is shorter (nvJitLink 12.9,
    /// sm_90, a 2-core VM, nvJitLink's `-time`: the optimizer's part of the
    /// brute-force scan's link 46 → 31 ms, of
    /// `knn_tile_f32_tf32x3_q64_r64_k32_a16`'s 206 → 133 ms); the build
    /// takes longer. Off where a family's linked code must stay what
    /// it was without it.
    pub fn pre_optimize(mut self, on: bool) -> Self {
        self.settings.pre_optimize = on;
        self
    }
    /// An NVRTC option for this family's fragments (checked like
    /// [`Builder::nvrtc_option`]).
    pub fn nvrtc_option(mut self, option: impl Into<String>) -> Self {
        self.settings.options.push(option.into());
        self
    }
    /// The JSON parameter matrix (relative paths: to the manifest dir).
    pub fn matrix(mut self, path: impl Into<PathBuf>) -> Self {
        self.matrix = Some(path.into());
        self
    }
    /// The minijinja template rendered once per entry (replaces a
    /// [`source`](Self::source) given before).
    pub fn template(mut self, path: impl Into<PathBuf>) -> Self {
        self.template = Some(path.into());
        self.plain = false;
        self
    }
    /// A minijinja expression rendering the fragment's name from the entry;
    /// the name is also the fragment's identity at link time.
    pub fn name_format(mut self, format: impl Into<String>) -> Self {
        self.name_format = Some(format.into());
        self
    }
    /// Matrix key `key` becomes a generic type parameter bounded by the tag
    /// trait `trait_name`.
    pub fn tag(mut self, key: impl Into<String>, trait_name: impl Into<String>) -> Self {
        self.params.push(Param {
            key: key.into(),
            kind: ParamKind::Tag {
                trait_name: trait_name.into(),
            },
        });
        self
    }
    /// Matrix key `key` becomes a const generic of integer type `ty`.
    pub fn constant(mut self, key: impl Into<String>, ty: impl Into<String>) -> Self {
        self.params.push(Param {
            key: key.into(),
            kind: ParamKind::Const { ty: ty.into() },
        });
        self
    }
}

/// Builds fragments; see the module documentation.
#[derive(Debug, Clone)]
pub struct Builder {
    families: Vec<Family>,
    archs: Option<Vec<String>>,
    include_dirs: Vec<PathBuf>,
    nvrtc_options: Vec<String>,
    out_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    manifest_dir: Option<PathBuf>,
    krate: String,
    registry_file: String,
    toolkit: Option<Toolkit>,
    jobs: Option<usize>,
    cargo: bool,
    keep_going: bool,
    ignore_embedded_ir: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

/// What a build did.
#[derive(Debug)]
pub struct BuildReport {
    pub toolkit: Toolkit,
    pub archs: Vec<Arch>,
    pub fragments: Vec<compile::Compiled>,
    pub warnings: Vec<String>,
    pub registry: PathBuf,
    pub elapsed: Duration,
    pub nvrtc_version: (i32, i32),
    /// What failed under [`Builder::keep_going`] (empty otherwise: a failure
    /// is then an error).
    pub failures: Vec<compile::CompileError>,
    /// `fraglink_build_report.txt` in the output directory: one line per
    /// fragment (built or failed), then every failure with its log.
    pub report_file: PathBuf,
}

impl BuildReport {
    pub fn total_bytes(&self) -> usize {
        self.fragments.iter().map(|f| f.fatbin_len).sum()
    }
    pub fn cached(&self) -> usize {
        self.fragments.iter().filter(|f| f.cached).count()
    }
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            families: Vec::new(),
            archs: None,
            include_dirs: Vec::new(),
            nvrtc_options: Vec::new(),
            out_dir: None,
            cache_dir: None,
            manifest_dir: None,
            krate: "::fraglink".into(),
            registry_file: "fraglink_registry.rs".into(),
            toolkit: None,
            jobs: None,
            cargo: std::env::var_os("OUT_DIR").is_some(),
            keep_going: false,
            ignore_embedded_ir: false,
        }
    }
    /// On: fragments that fail are left out, the registry holds the ones
    /// that built, and the failures are in [`BuildReport::failures`], the
    /// report file and cargo warnings. Off (default): any failure is
    /// [`BuildError::Fragments`] listing them all.
    pub fn keep_going(mut self, on: bool) -> Self {
        self.keep_going = on;
        self
    }
    pub fn family(mut self, family: Family) -> Self {
        self.families.push(family);
        self
    }
    pub fn families(mut self, families: impl IntoIterator<Item = Family>) -> Self {
        self.families.extend(families);
        self
    }
    /// Architectures to build LTO-IR for (`compute_75`, `sm_90`, …).
    /// `FRAGLINK_ARCHS` overrides; the default is [`Arch::defaults`].
    pub fn archs<S: AsRef<str>>(mut self, archs: &[S]) -> Self {
        self.archs = Some(archs.iter().map(|a| a.as_ref().to_string()).collect());
        self
    }
    /// A directory of headers the templates include (`-I`).
    pub fn include_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.include_dirs.push(dir.into());
        self
    }
    /// An extra NVRTC option for every fragment (e.g. `-DNDEBUG`). Options
    /// are checked before anything compiles: nvcc spellings NVRTC lacks are
    /// translated (`-O3` → `-dopt=on`) or refused naming the equivalent
    /// ([`options`]).
    pub fn nvrtc_option(mut self, option: impl Into<String>) -> Self {
        self.nvrtc_options.push(option.into());
        self
    }
    /// Where sources, fatbins and the registry go (default `$OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }
    /// Content-hash cache directory (default: `FRAGLINK_BUILD_CACHE_DIR`, else
    /// `fraglink-build-cache` in cargo's target directory).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }
    /// Base of relative paths (default `$CARGO_MANIFEST_DIR`).
    pub fn manifest_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.manifest_dir = Some(dir.into());
        self
    }
    /// Path of the fraglink crate in generated code (default `::fraglink`).
    pub fn crate_path(mut self, path: impl Into<String>) -> Self {
        self.krate = path.into();
        self
    }
    pub fn registry_file(mut self, name: impl Into<String>) -> Self {
        self.registry_file = name.into();
        self
    }
    /// Use these libraries instead of discovering them.
    pub fn toolkit(mut self, toolkit: Toolkit) -> Self {
        self.toolkit = Some(toolkit);
        self
    }
    /// Parallel compiles (default: `FRAGLINK_BUILD_JOBS`, cargo's `NUM_JOBS`,
    /// else the number of cores).
    pub fn jobs(mut self, jobs: usize) -> Self {
        self.jobs = Some(jobs);
        self
    }
    /// On: NVRTC and nvFatbin of any CUDA major are taken, whatever NVRTC
    /// built the fraglink crate's own embedded fragments. Off (default):
    /// they must share that major (`sys::loader::compatibility`), since
    /// fragments built here are linked at run time by the nvJitLink that
    /// links the embedded ones, which takes LTO-IR of its own major only.
    /// Turn it on only where the output is used on its own: a benchmark of
    /// the builder under another CUDA (examples/bench_build.rs), a fatbin
    /// set linked by a separate nvJitLink. The check applies wherever the
    /// fraglink library is used, downstream build scripts included (their
    /// fraglink build-dependency carries the embedded fragments' NVRTC
    /// version); only fraglink's own build.rs, which compiles this module
    /// before any fragment exists, has nothing to check against.
    pub fn ignore_embedded_ir(mut self, on: bool) -> Self {
        self.ignore_embedded_ir = on;
        self
    }
    /// Print `cargo:` directives (default: when `OUT_DIR` is set).
    pub fn cargo_directives(mut self, on: bool) -> Self {
        self.cargo = on;
        self
    }

    fn resolve(&self, p: &Path) -> PathBuf {
        match &self.manifest_dir {
            Some(m) if p.is_relative() => m.join(p),
            _ => p.to_path_buf(),
        }
    }

    fn directive(&self, line: &str) {
        if self.cargo {
            println!("cargo:{line}");
        }
    }

    /// Every variable a build reads: toolkit discovery's, the build's own,
    /// and cargo's `NUM_JOBS` (each gets `cargo:rerun-if-env-changed`).
    pub fn env_vars() -> impl Iterator<Item = &'static str> {
        toolkit::ENV_VARS
            .iter()
            .chain(ENV_VARS)
            .chain(&["NUM_JOBS"])
            .copied()
    }

    /// Runs the whole pipeline.
    pub fn compile(mut self) -> Result<BuildReport, BuildError> {
        let started = Instant::now();
        if self.manifest_dir.is_none() {
            self.manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
        }
        for v in Self::env_vars() {
            self.directive(&format!("rerun-if-env-changed={v}"));
        }
        let out_dir = match self
            .out_dir
            .clone()
            .or_else(|| std::env::var_os("OUT_DIR").map(PathBuf::from))
        {
            Some(d) => d,
            None => {
                return Err(BuildError::Config {
                    option: "out_dir",
                    message: "not set and OUT_DIR is not in the environment (not run by cargo?)"
                        .into(),
                })
            }
        };
        let target_dir = cargo_target_dir(&out_dir);
        // Every option is checked before anything compiles.
        let mut warnings = Vec::new();
        let (extra_options, notes) =
            options::check_all(&self.nvrtc_options, "Builder::nvrtc_option")?;
        warnings.extend(notes);
        let mut family_settings = Vec::with_capacity(self.families.len());
        for fam in &self.families {
            let origin = format!("family `{}`", fam.name);
            let (checked, notes) = options::check_all(&fam.settings.options, &origin)?;
            warnings.extend(notes);
            family_settings.push(compile::FamilyCompile {
                options: checked,
                ..fam.settings.clone()
            });
        }
        // A value that is not Unicode reaches the parser, which names the
        // variable (it was taken for unset).
        let archs = match crate::switch::env_value("FRAGLINK_ARCHS") {
            Some(s) if !s.trim().is_empty() => Arch::parse_list(&s, "FRAGLINK_ARCHS")?,
            _ => match &self.archs {
                Some(list) => Arch::parse_list(&list.join(","), "Builder::archs")?,
                None => Arch::defaults(),
            },
        };
        let jobs = self
            .jobs
            .or_else(|| env_usize("FRAGLINK_BUILD_JOBS"))
            .or_else(|| env_usize("NUM_JOBS"))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let cache_dir = self
            .cache_dir
            .clone()
            // Empty is unset, as for every other variable: `PathBuf::from("")`
            // would put the cache in the build script's working directory.
            .or_else(|| {
                std::env::var_os("FRAGLINK_BUILD_CACHE_DIR")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(|| target_dir.as_ref().map(|t| t.join("fraglink-build-cache")));

        let toolkit = match self.toolkit.clone() {
            Some(t) => t,
            None => {
                let discovery = toolkit::Discovery::from_env(target_dir.as_deref())?;
                let mut t = discovery.find()?;
                // crt/ (for <mma.h>) is installed beside the set when the
                // toolkit lacks it; without it only WMMA sources fail.
                if let Err(why) = discovery.supply_crt(&mut t) {
                    let msg = format!("CUDA crt/ headers: {why}");
                    self.directive(&format!("warning={msg}"));
                    warnings.push(msg);
                }
                t
            }
        };
        let origin = format!("{:?}", toolkit.origin);
        let load = |source| BuildError::Load {
            origin: origin.clone(),
            source,
        };
        // The LTO-IR the libraries must suit (none to check when ignored).
        let ir = if self.ignore_embedded_ir {
            None
        } else {
            crate::sys::loader::embedded_ir_version()
        };
        let nvrtc =
            crate::sys::nvrtc::Nvrtc::open_against(Some(&toolkit.nvrtc), ir).map_err(load)?;
        let nvfatbin = crate::sys::nvfatbin::Nvfatbin::open_against(Some(&toolkit.nvfatbin), ir)
            .map_err(load)?;
        let nvrtc_version = nvrtc.version().map_err(load)?;
        // Probed for one of the build's own archs (the list is never empty).
        let probe_arch = archs.first().copied().unwrap_or(Arch::compute(75));
        if family_settings.iter().any(|f| f.pre_optimize)
            && !compile::supports_pre_optimize(&nvrtc, probe_arch).map_err(|source| {
                BuildError::Probe {
                    origin: origin.clone(),
                    option: compile::PRE_OPTIMIZE,
                    source: Box::new(source),
                }
            })?
        {
            let msg = format!(
                "NVRTC {}.{} does not take {}: fragments are built without it (cold links take longer)",
                nvrtc_version.0,
                nvrtc_version.1,
                compile::PRE_OPTIMIZE
            );
            self.directive(&format!("warning={msg}"));
            warnings.push(msg);
            for f in &mut family_settings {
                f.pre_optimize = false;
            }
        }
        let nvfatbin_version = nvfatbin.version().map_err(load)?;
        let tool_versions = format!(
            "nvrtc {}.{} nvfatbin {}.{}",
            nvrtc_version.0, nvrtc_version.1, nvfatbin_version.0, nvfatbin_version.1
        );

        // Read every family's inputs.
        struct Loaded {
            matrix: PathBuf,
            template: PathBuf,
            template_text: String,
            entries: Vec<matrix::Entry>,
        }
        let mut loaded = Vec::new();
        for fam in &self.families {
            let need = |v: &Option<PathBuf>, what: &'static str| {
                v.as_ref()
                    .map(|p| self.resolve(p))
                    .ok_or_else(|| BuildError::Config {
                        option: what,
                        message: format!("family `{}` has no {what}", fam.name),
                    })
            };
            let matrix_path = need(&fam.matrix, "matrix")?;
            let template_path = need(&fam.template, "template")?;
            if fam.name_format.is_none() {
                return Err(BuildError::Config {
                    option: "name_format",
                    message: format!("family `{}` has no name format", fam.name),
                });
            }
            self.directive(&format!("rerun-if-changed={}", matrix_path.display()));
            self.directive(&format!("rerun-if-changed={}", template_path.display()));
            let product = matrix::expand_file(&matrix_path)?;
            for w in &product.warnings {
                let msg = format!("{}: {w}", matrix_path.display());
                self.directive(&format!("warning={msg}"));
                warnings.push(msg);
            }
            let template_text =
                std::fs::read_to_string(&template_path).map_err(|source| BuildError::Read {
                    path: template_path.clone(),
                    source,
                })?;
            loaded.push(Loaded {
                matrix: matrix_path,
                template: template_path,
                template_text,
                entries: product.entries,
            });
        }
        let sources: Vec<render::FamilySource<'_>> = self
            .families
            .iter()
            .zip(&loaded)
            .map(|(fam, l)| render::FamilySource {
                family: &fam.name,
                matrix_path: l.matrix.clone(),
                entries: &l.entries,
                template_name: l.template.display().to_string(),
                template: &l.template_text,
                name_format: fam.name_format.as_deref().unwrap_or_default(),
                plain: fam.plain,
                expressions: &fam.expressions,
            })
            .collect();
        let mut rendered = render::render_all(&sources)?;
        // Each fragment's archs: the build's, from its minimum on.
        for r in &mut rendered {
            let fam = &self.families[r.family_index];
            let min = min_arch::fragment_min(
                &r.name,
                &fam.name,
                fam.min_arch,
                fam.min_arch_key.as_deref(),
                &r.entry,
            )?;
            r.archs = min_arch::check(&r.name, &fam.name, &archs, min)?;
        }

        let own_includes: Vec<PathBuf> =
            self.include_dirs.iter().map(|d| self.resolve(d)).collect();
        for d in &own_includes {
            self.directive(&format!("rerun-if-changed={}", d.display()));
        }
        let headers_digest = compile::digest_dirs(&own_includes)?;
        let mut include_dirs = own_includes.clone();
        include_dirs.extend(toolkit.include_dirs.iter().cloned());
        let gen_dir = out_dir.join("gen");
        let fatbin_dir = out_dir.join("fatbins");
        let std_dir = if family_settings.iter().any(|f| f.std_headers) {
            let dir = out_dir.join("fraglink-std");
            Some(
                std_headers::write_to(&dir)
                    .map_err(|source| BuildError::Write { path: dir, source })?,
            )
        } else {
            None
        };
        let ctx = compile::CompileContext {
            nvrtc: &nvrtc,
            nvfatbin: &nvfatbin,
            archs: &archs,
            include_dirs: &include_dirs,
            extra_options: &extra_options,
            families: &family_settings,
            std_dir: std_dir.as_deref(),
            headers_digest,
            tool_versions,
            gen_dir: &gen_dir,
            fatbin_dir: &fatbin_dir,
            cache_dir: cache_dir.as_deref(),
            jobs,
        };
        for r in &rendered {
            if !family_settings[r.family_index].default_device {
                continue;
            }
            let path = gen_dir.join(format!("{}.cu", r.name));
            let findings = lint::host_code(&r.source);
            if let Some(w) =
                lint::host_code_warning(&r.name, &path.display().to_string(), &findings)
            {
                self.directive(&format!("warning={w}"));
                warnings.push(w);
            }
        }
        let results = compile::compile_all(&ctx, &rendered)?;
        let mut built: Vec<(&render::Rendered, compile::Compiled)> = Vec::new();
        let mut failures = Vec::new();
        for (r, res) in rendered.iter().zip(results) {
            match res {
                Ok(c) => {
                    if let Some(w) = &c.cache_warning {
                        self.directive(&format!("warning={w}"));
                        warnings.push(w.clone());
                    }
                    built.push((r, c))
                }
                Err(errs) => failures.extend(errs),
            }
        }
        let report_file = out_dir.join("fraglink_build_report.txt");
        report::write(&report_file, &rendered, &built, &failures).map_err(|source| {
            BuildError::Write {
                path: report_file.clone(),
                source,
            }
        })?;
        if !failures.is_empty() {
            if !self.keep_going {
                return Err(BuildError::Fragments {
                    failures,
                    total: rendered.len(),
                    report: Some(report_file),
                });
            }
            for f in &failures {
                // One line per failure in cargo's output; the logs are in
                // the report.
                let first = f.to_string().lines().next().unwrap_or_default().to_string();
                self.directive(&format!(
                    "warning={first} (left out of the registry; see {})",
                    report_file.display()
                ));
            }
        }

        let decls: Vec<codegen::FamilyDecl> = self
            .families
            .iter()
            .map(|f| codegen::FamilyDecl {
                family: f.name.clone(),
                type_name: f.type_name.clone(),
                params: f.params.clone(),
            })
            .collect();
        let frags: Vec<codegen::FragmentDecl> = built
            .iter()
            .map(|(r, c)| codegen::FragmentDecl {
                family: r.family.clone(),
                name: r.name.clone(),
                entry: r.entry.clone(),
                archs: r.archs.iter().map(|a| a.to_string()).collect(),
                fatbin_file: format!("fatbins/{}.fatbin", r.name),
                fatbin_len: c.fatbin_len,
                hash: c.hash.clone(),
                recorded: c.recorded.clone(),
            })
            .collect();
        let code = codegen::generate(&self.krate, &decls, &frags)?;
        let registry = out_dir.join(&self.registry_file);
        std::fs::write(&registry, code).map_err(|source| BuildError::Write {
            path: registry.clone(),
            source,
        })?;
        Ok(BuildReport {
            nvrtc_version,
            toolkit,
            archs,
            fragments: built.into_iter().map(|(_, c)| c).collect(),
            warnings,
            registry,
            elapsed: started.elapsed(),
            failures,
            report_file,
        })
    }
}

fn env_usize(var: &str) -> Option<usize> {
    std::env::var(var)
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 0)
}

/// cargo's target directory from `OUT_DIR` (`…/<profile>/build/<crate>-<hash>/out`):
/// the outermost ancestor holding cargo's `CACHEDIR.TAG`, so nested target
/// directories (trybuild's `target/tests/trybuild`, an example built with
/// `CARGO_TARGET_DIR=target/x`) share one provisioned toolkit and one cache.
fn cargo_target_dir(out_dir: &Path) -> Option<PathBuf> {
    let tagged = out_dir
        .ancestors()
        .filter(|a| a.join("CACHEDIR.TAG").is_file())
        .last()
        .map(Path::to_path_buf);
    tagged.or_else(|| {
        let build = out_dir.parent()?.parent()?;
        (build.file_name()? == "build").then(|| build.parent()?.parent().map(Path::to_path_buf))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build reruns on every variable it reads: a missing one once made
    /// `FRAGLINK_CUDA_VERSION=13 cargo test` silently reuse a CUDA 12 build.
    #[test]
    fn every_variable_read_triggers_a_rerun() {
        let vars: Vec<&str> = Builder::env_vars().collect();
        for v in toolkit::ENV_VARS.iter().chain(ENV_VARS) {
            assert!(vars.contains(v), "{v}");
        }
        for v in [
            "FRAGLINK_CUDA_VERSION",
            "FRAGLINK_CUDA_ROOT",
            "FRAGLINK_ARCHS",
            matrix::MAX_ENTRIES_VAR,
            "NUM_JOBS",
        ] {
            assert!(vars.contains(&v), "{v}");
        }
        let mut sorted = vars.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), vars.len(), "listed twice: {vars:?}");
    }
}
