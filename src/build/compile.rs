//! NVRTC → LTO-IR per arch → nvFatbin, in parallel, behind a content-hash
//! cache so an unchanged fragment costs one hash and one file copy.
//!
//! Besides the LTO-IR, each arch is compiled once more to PTX, whose
//! kernels and external definitions are recorded ([`super::ptx`]): LTO-IR
//! is opaque, and the planner needs both lists to check a plan before
//! nvJitLink sees it. A failing fragment does not stop the others: every
//! fragment and arch that fails is reported, each with NVRTC's log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::arch::Arch;
use super::render::{entry_display, Rendered};
use crate::sys::nvfatbin::Nvfatbin;
use crate::sys::nvrtc::{Nvrtc, Output};
use crate::sys::SysError;

/// Bumped when the cache's meaning changes (v3, v4: a sidecar of recorded
/// entries, definitions and lowered names beside each fatbin; v6: the
/// sidecar holds the fatbin's blake3 too, [`Sidecar`]). A bump changes
/// every key, so entries of an older format are never read: they are
/// misses, and builds of either format can share one cache directory.
const CACHE_FORMAT: &str = "fraglink-fatbin-cache-v6";

/// Options nvFatbin gets: smallest output (DESIGN.md decision 1).
pub const FATBIN_OPTIONS: &[&str] = &["-compress-all", "-compress-mode=size"];

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("NVRTC failed on fragment `{fragment}` for {arch} (source {source_path}, matrix entry {entry}):\n{log}")]
    Nvrtc {
        fragment: String,
        arch: String,
        source_path: PathBuf,
        entry: String,
        log: String,
    },
    /// `differs`: "`_Z…` for compute_75 but `_Z…` for sm_90".
    #[error("fragment `{fragment}`: name expression `{expression}` lowers to {differs}")]
    LoweredNameDiffers {
        fragment: String,
        expression: String,
        differs: String,
    },
    #[error("nvFatbin failed on fragment `{fragment}`: {message}")]
    Fatbin { fragment: String, message: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CompileError {
    /// The fragment at fault, if the error is about one.
    pub fn fragment(&self) -> Option<&str> {
        match self {
            CompileError::Nvrtc { fragment, .. }
            | CompileError::LoweredNameDiffers { fragment, .. }
            | CompileError::Fatbin { fragment, .. } => Some(fragment),
            CompileError::Io { .. } => None,
        }
    }
}

/// A family's compile settings.
#[derive(Debug, Clone)]
pub struct FamilyCompile {
    /// Pass `-default-device` (unannotated functions are device functions).
    pub default_device: bool,
    /// Put fraglink's standard-header stand-ins on the include path.
    pub std_headers: bool,
    /// The family's own NVRTC options, already checked.
    pub options: Vec<String>,
    /// Pass [`PRE_OPTIMIZE`]: see [`Family::pre_optimize`](super::Family::pre_optimize).
    pub pre_optimize: bool,
}

impl Default for FamilyCompile {
    fn default() -> Self {
        FamilyCompile {
            default_device: true,
            std_headers: true,
            options: Vec::new(),
            pre_optimize: true,
        }
    }
}

/// Everything a compile depends on besides the source.
pub struct CompileContext<'a> {
    pub nvrtc: &'a Nvrtc,
    pub nvfatbin: &'a Nvfatbin,
    pub archs: &'a [Arch],
    /// `-I` directories, fragment headers first.
    pub include_dirs: &'a [PathBuf],
    /// Extra NVRTC options from the builder, already checked.
    pub extra_options: &'a [String],
    /// Per family (by [`Rendered::family_index`]).
    pub families: &'a [FamilyCompile],
    /// The standard-header stand-ins' directory (last on the include path).
    pub std_dir: Option<&'a Path>,
    /// Digest of the project's headers (they are `#include`d, so they are
    /// part of every fragment's content).
    pub headers_digest: String,
    /// NVRTC and nvFatbin versions, e.g. `nvrtc 12.9 nvfatbin 12.9`.
    pub tool_versions: String,
    /// Where rendered sources are written (`<name>.cu`).
    pub gen_dir: &'a Path,
    /// Where fatbins are written (`<name>.fatbin`).
    pub fatbin_dir: &'a Path,
    /// Content-hash cache of fatbins, shared by builds of every profile.
    pub cache_dir: Option<&'a Path>,
    pub jobs: usize,
}

/// What the build records about a fragment besides its fatbin.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    /// Kernel names per arch (`("compute_80", [...])`), in build order.
    pub entries: Vec<(String, Vec<String>)>,
    /// Strong external definitions, over every arch, sorted.
    pub definitions: Vec<String>,
    /// `(name expression, lowered name)`.
    pub lowered: Vec<(String, String)>,
    /// The real archs (`sm_90`) whose relocatable SASS the fatbin holds
    /// beside their LTO-IR: what a quick link (no LTO) of a first call uses
    /// ([`crate::link::LinkRuntime::link_tiered`]).
    pub sass: Vec<String>,
}

/// The JSON file beside each cached fatbin (`<key>.json`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Sidecar {
    /// blake3 of the fatbin, hex: a fatbin truncated or corrupted (a crash,
    /// a full disk, a bad copy) no longer matches and is compiled again
    /// instead of embedded.
    fatbin_blake3: String,
    recorded: Recorded,
}

/// One fragment's outcome.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub name: String,
    pub fatbin_path: PathBuf,
    pub fatbin_len: usize,
    /// blake3 of the fatbin bytes, hex.
    pub hash: String,
    pub cached: bool,
    pub compile_time: Duration,
    pub recorded: Recorded,
    /// Why the cache entry found for it was not used (damaged: compiled
    /// again and overwritten), for a build warning.
    pub cache_warning: Option<String>,
}

/// NVRTC's option that runs its optimizer over the LTO-IR before writing it
/// (NVRTC otherwise writes the front end's unoptimized IR, and nvJitLink's
/// link-time optimizer does all of that work at every cold link).
pub const PRE_OPTIMIZE: &str = "--gen-opt-lto";

/// The NVRTC options for one arch: fraglink's fixed set (`-default-device`
/// and [`PRE_OPTIMIZE`] when asked), the include path, then `extra` (whose
/// `-std=` replaces the default `-std=c++17`).
pub fn nvrtc_options(
    arch: Arch,
    include_dirs: &[PathBuf],
    extra: &[String],
    default_device: bool,
    pre_optimize: bool,
) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-dlto".to_string(),
        "--relocatable-device-code=true".to_string(),
    ];
    if pre_optimize && !extra.iter().any(|e| is_pre_optimize(e)) {
        o.push(PRE_OPTIMIZE.to_string());
    }
    if !extra
        .iter()
        .any(|e| e.starts_with("-std=") || e.starts_with("--std="))
    {
        o.push("-std=c++17".to_string());
    }
    if default_device {
        o.push("-default-device".to_string());
    }
    o.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
    o.extend(extra.iter().cloned());
    o
}

/// The options of one fragment for one arch: the builder's, the family's
/// and the entry's `-D` defines.
pub fn fragment_options(ctx: &CompileContext<'_>, r: &Rendered, arch: Arch) -> Vec<String> {
    let fam = ctx
        .families
        .get(r.family_index)
        .cloned()
        .unwrap_or_default();
    let mut includes = ctx.include_dirs.to_vec();
    if fam.std_headers {
        includes.extend(ctx.std_dir.map(Path::to_path_buf));
    }
    let mut extra: Vec<String> = ctx.extra_options.to_vec();
    extra.extend(fam.options.iter().cloned());
    extra.extend(r.defines.iter().cloned());
    nvrtc_options(
        arch,
        &includes,
        &extra,
        fam.default_device,
        fam.pre_optimize,
    )
}

/// `--gen-opt-lto` in either spelling.
fn is_pre_optimize(option: &str) -> bool {
    option == PRE_OPTIMIZE || option == "-gen-opt-lto"
}

/// Whether this NVRTC takes [`PRE_OPTIMIZE`] for `arch` (one of the
/// build's): [`takes_option`].
pub fn supports_pre_optimize(nvrtc: &Nvrtc, arch: Arch) -> Result<bool, SysError> {
    takes_option(nvrtc, arch, PRE_OPTIMIZE)
}

/// Whether this NVRTC takes `option` for `arch`: one tiny LTO-IR compile
/// with it. `Ok(false)` only where NVRTC refuses the options
/// (`NVRTC_ERROR_INVALID_OPTION`, what an NVRTC that does not know one
/// answers); any other failure of that compile (the library itself
/// failing) is the error, since every fragment's compile would fail too.
pub fn takes_option(nvrtc: &Nvrtc, arch: Arch, option: &str) -> Result<bool, SysError> {
    let mut options = nvrtc_options(arch, &[], &[], false, false);
    options.push(option.to_owned());
    match nvrtc.compile(
        "extern \"C\" __global__ void fraglink_probe(float* x) { x[threadIdx.x] = 1.0f; }",
        "fraglink_probe.cu",
        &options,
        Output::LtoIr,
    ) {
        Ok(_) => Ok(true),
        Err(SysError::Compile { code_name, .. }) if code_name == "NVRTC_ERROR_INVALID_OPTION" => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The cache key of a fragment: its source, every option, every tool version,
/// the name expressions and the project's headers.
pub fn cache_key(ctx: &CompileContext<'_>, r: &Rendered) -> String {
    let mut h = blake3::Hasher::new();
    let mut field = |b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(CACHE_FORMAT.as_bytes());
    field(r.source.as_bytes());
    field(ctx.tool_versions.as_bytes());
    field(ctx.headers_digest.as_bytes());
    for e in &r.expressions {
        field(e.as_bytes());
    }
    // The stand-ins' directory is in OUT_DIR, which differs per profile:
    // their contents are hashed instead of their path, so the cache stays
    // shared between profiles.
    let std_include = ctx.std_dir.map(|d| format!("-I{}", d.display()));
    if ctx
        .families
        .get(r.family_index)
        .is_none_or(|f| f.std_headers)
    {
        for (name, text) in super::std_headers::STD_HEADERS {
            field(name.as_bytes());
            field(text.as_bytes());
        }
    }
    for arch in fragment_archs(ctx, r) {
        for o in fragment_options(ctx, r, arch) {
            if Some(&o) != std_include.as_ref() {
                field(o.as_bytes());
            }
        }
    }
    for o in FATBIN_OPTIONS {
        field(o.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// Digest of every regular file under `dirs` (names and contents).
pub fn digest_dirs(dirs: &[PathBuf]) -> Result<String, CompileError> {
    let mut files = Vec::new();
    for d in dirs {
        collect_files(d, &mut files)?;
    }
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in files {
        let bytes = std::fs::read(&f).map_err(|source| CompileError::Io {
            action: "reading",
            path: f.clone(),
            source,
        })?;
        h.update(f.to_string_lossy().as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().to_hex().to_string())
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), CompileError> {
    let rd = std::fs::read_dir(dir).map_err(|source| CompileError::Io {
        action: "listing",
        path: dir.to_path_buf(),
        source,
    })?;
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_files(&p, out)?;
        } else if p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CompileError> {
    // Write-then-rename: a concurrent build never sees half a file. The
    // temporary name is unique per process and per call: two threads of
    // one build may write the same path (two fragments of one key).
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(
        ".tmp{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| CompileError::Io {
            action: "writing",
            path: path.to_path_buf(),
            source,
        })
}

/// What the cache holds for one key.
#[derive(Debug)]
enum CacheEntry {
    /// The fatbin, whose blake3 its sidecar records, and what was recorded.
    Hit(Vec<u8>, Recorded),
    /// No fatbin: never built, or a build stopped between its two writes
    /// (the sidecar goes first).
    Absent,
    /// A fatbin its sidecar does not vouch for, and why: a miss (compiled
    /// again, overwritten) with a build warning, never an error.
    Damaged(String),
}

/// The cache's entry at `fatbin` (and its sidecar `<key>.json`).
fn cached(fatbin: &Path) -> CacheEntry {
    let Ok(bytes) = std::fs::read(fatbin) else {
        return CacheEntry::Absent;
    };
    let side = match std::fs::read(fatbin.with_extension("json")) {
        Ok(s) => s,
        Err(e) => return CacheEntry::Damaged(format!("its sidecar cannot be read: {e}")),
    };
    let side: Sidecar = match serde_json::from_slice(&side) {
        Ok(s) => s,
        Err(e) => return CacheEntry::Damaged(format!("its sidecar is not valid: {e}")),
    };
    let hash = blake3::hash(&bytes).to_hex();
    if hash.as_str() != side.fatbin_blake3 {
        return CacheEntry::Damaged(format!(
            "its {} bytes do not have the blake3 its sidecar records (truncated or corrupted)",
            bytes.len()
        ));
    }
    CacheEntry::Hit(bytes, side.recorded)
}

/// One arch's outputs.
struct ArchOutputs {
    lto: Vec<u8>,
    lowered: Vec<String>,
    symbols: super::ptx::PtxSymbols,
    /// A real arch's relocatable SASS, from the PTX compile.
    sass: Option<Vec<u8>>,
}

/// Compiles one arch: LTO-IR (with the name expressions' lowered names) and
/// PTX (for the recorded symbols); for a real arch (`sm_90`) the PTX
/// compile's cubin too: ptxas ran for it anyway, and it is relocatable SASS
/// a first call can link without LTO in a millisecond.
fn compile_arch(
    ctx: &CompileContext<'_>,
    r: &Rendered,
    arch: Arch,
    source_path: &Path,
) -> Result<ArchOutputs, CompileError> {
    let opts = fragment_options(ctx, r, arch);
    // The bare file name: a fatbin must not depend on where OUT_DIR is (the
    // error below names the full path).
    let program = format!("{}.cu", r.name);
    let nvrtc_err = |e: crate::sys::SysError| CompileError::Nvrtc {
        fragment: r.name.clone(),
        arch: arch.to_string(),
        source_path: source_path.to_path_buf(),
        entry: entry_display(&r.entry),
        log: e.to_string(),
    };
    let (lto, lowered) = ctx
        .nvrtc
        .compile_named(
            &r.source,
            &program,
            &[],
            &opts,
            Output::LtoIr,
            &r.expressions,
        )
        .map_err(nvrtc_err)?;
    // PTX for the recorded symbols: no LTO-IR, so neither LTO-IR option.
    let ptx_opts: Vec<String> = opts
        .into_iter()
        .filter(|o| o != "-dlto" && !is_pre_optimize(o))
        .collect();
    // The name expressions again: they instantiate templates only they use.
    let outputs: &[Output] = if arch.virtual_arch {
        &[Output::Ptx]
    } else {
        &[Output::Ptx, Output::Cubin]
    };
    let (mut out, _) = ctx
        .nvrtc
        .compile_outputs(&r.source, &program, &[], &ptx_opts, outputs, &r.expressions)
        .map_err(nvrtc_err)?;
    let sass = (out.len() == 2).then(|| out.pop().expect("two outputs").bytes);
    let text = String::from_utf8_lossy(&out[0].bytes);
    Ok(ArchOutputs {
        lto: lto.bytes,
        lowered,
        symbols: super::ptx::parse(text.trim_end_matches('\0')),
        sass,
    })
}

/// The archs `r` is compiled for: its own list ([`Rendered::archs`]), or
/// every arch of the build when that is empty.
pub fn fragment_archs(ctx: &CompileContext<'_>, r: &Rendered) -> Vec<Arch> {
    if r.archs.is_empty() {
        ctx.archs.to_vec()
    } else {
        r.archs.clone()
    }
}

/// Every arch of one fragment into one fatbin; every failing arch reported.
fn build_fatbin(
    ctx: &CompileContext<'_>,
    r: &Rendered,
    source_path: &Path,
) -> Result<(Vec<u8>, Recorded), Vec<CompileError>> {
    let fatbin_err = |e: crate::sys::SysError| {
        vec![CompileError::Fatbin {
            fragment: r.name.clone(),
            message: e.to_string(),
        }]
    };
    let options: Vec<String> = FATBIN_OPTIONS.iter().map(|s| s.to_string()).collect();
    let mut builder = ctx.nvfatbin.builder(&options).map_err(fatbin_err)?;
    let mut errors = Vec::new();
    let mut recorded = Recorded::default();
    let mut lowered_from: Option<Arch> = None;
    for arch in &fragment_archs(ctx, r) {
        let ArchOutputs {
            lto,
            lowered,
            symbols,
            sass,
        } = match compile_arch(ctx, r, *arch, source_path) {
            Ok(x) => x,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        builder
            .add_ltoir(&lto, &arch.to_string(), &format!("{}_{arch}", r.name), "")
            .map_err(fatbin_err)?;
        if let Some(sass) = sass {
            builder
                .add_cubin(&sass, &arch.to_string(), &format!("{}_{arch}_sass", r.name))
                .map_err(fatbin_err)?;
            recorded.sass.push(arch.to_string());
        }
        match lowered_from {
            None => {
                recorded.lowered = r.expressions.iter().cloned().zip(lowered).collect();
                lowered_from = Some(*arch);
            }
            Some(first_arch) => {
                for ((expression, first), other) in recorded.lowered.iter().zip(lowered) {
                    if *first != other {
                        errors.push(CompileError::LoweredNameDiffers {
                            fragment: r.name.clone(),
                            expression: expression.clone(),
                            differs: format!("`{first}` for {first_arch} but `{other}` for {arch}"),
                        });
                    }
                }
            }
        }
        recorded.definitions.extend(symbols.definitions);
        recorded.entries.push((arch.to_string(), symbols.entries));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    recorded.definitions.sort();
    recorded.definitions.dedup();
    let bytes = builder.finish().map_err(fatbin_err)?;
    Ok((bytes, recorded))
}

fn compile_one(ctx: &CompileContext<'_>, r: &Rendered) -> Result<Compiled, Vec<CompileError>> {
    let started = Instant::now();
    let source_path = ctx.gen_dir.join(format!("{}.cu", r.name));
    write_file(&source_path, r.source.as_bytes()).map_err(|e| vec![e])?;
    let fatbin_path = ctx.fatbin_dir.join(format!("{}.fatbin", r.name));
    let key = cache_key(ctx, r);
    let cached_path = ctx.cache_dir.map(|d| d.join(format!("{key}.fatbin")));

    let entry = cached_path.as_deref().map_or(CacheEntry::Absent, cached);
    let (bytes, recorded, cached, cache_warning) = match entry {
        CacheEntry::Hit(b, rec) => (b, rec, true, None),
        miss => {
            let cache_warning = match miss {
                CacheEntry::Damaged(why) => Some(format!(
                    "fragment `{}`: build cache entry {} not used, {why}; compiled again",
                    r.name,
                    cached_path.as_deref().unwrap_or(Path::new("")).display()
                )),
                _ => None,
            };
            let (bytes, recorded) = build_fatbin(ctx, r, &source_path)?;
            if let Some(p) = &cached_path {
                // A cache that cannot be written only costs time next build.
                // The sidecar goes first: a fatbin without one is a miss.
                let side = Sidecar {
                    fatbin_blake3: blake3::hash(&bytes).to_hex().to_string(),
                    recorded,
                };
                let json = serde_json::to_vec(&side).unwrap_or_default();
                let _ = write_file(&p.with_extension("json"), &json)
                    .and_then(|_| write_file(p, &bytes));
                (bytes, side.recorded, false, cache_warning)
            } else {
                (bytes, recorded, false, cache_warning)
            }
        }
    };
    write_file(&fatbin_path, &bytes).map_err(|e| vec![e])?;
    Ok(Compiled {
        name: r.name.clone(),
        fatbin_path,
        fatbin_len: bytes.len(),
        hash: blake3::hash(&bytes).to_hex().to_string(),
        cached,
        compile_time: started.elapsed(),
        recorded,
        cache_warning,
    })
}

/// One fragment's result: its fatbin, or every error of its archs.
pub type Outcome = Result<Compiled, Vec<CompileError>>;

/// Compiles every fragment on `ctx.jobs` threads; results keep input order.
/// A failing fragment does not stop the others: each result is the
/// fragment's fatbin, or every error of its archs.
pub fn compile_all(
    ctx: &CompileContext<'_>,
    rendered: &[Rendered],
) -> Result<Vec<Outcome>, CompileError> {
    for dir in [ctx.gen_dir, ctx.fatbin_dir]
        .into_iter()
        .chain(ctx.cache_dir)
    {
        std::fs::create_dir_all(dir).map_err(|source| CompileError::Io {
            action: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Outcome>>> =
        Mutex::new((0..rendered.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..ctx.jobs.max(1).min(rendered.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(r) = rendered.get(i) else { break };
                let res = compile_one(ctx, r);
                if let Ok(mut slots) = results.lock() {
                    slots[i] = Some(res);
                }
            });
        }
    });
    let slots = results.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(slots.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_optimize_adds_gen_opt_lto_once_and_never_to_ptx() {
        let arch = Arch::compute(75);
        let count = |o: &[String]| o.iter().filter(|o| is_pre_optimize(o)).count();
        assert_eq!(count(&nvrtc_options(arch, &[], &[], true, true)), 1);
        assert_eq!(count(&nvrtc_options(arch, &[], &[], true, false)), 0);
        // Given by the family already (either spelling): not twice.
        let own = ["-gen-opt-lto".to_string()];
        assert_eq!(count(&nvrtc_options(arch, &[], &own, true, true)), 1);
        // Right after the LTO-IR options, before the family's.
        let o = nvrtc_options(arch, &[], &["-DX=1".to_string()], false, true);
        assert_eq!(
            o[..4],
            [
                "--gpu-architecture=compute_75",
                "-dlto",
                "--relocatable-device-code=true",
                PRE_OPTIMIZE
            ]
        );
    }
}
