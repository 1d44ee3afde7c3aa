//! The process-wide link machinery: nvJitLink, NVRTC for run-time sources,
//! the memory cache and the disk cache.
//!
//! # What a disk hit is trusted with
//!
//! The disk cache's own checks (format, key, checksum, and the file and
//! directory checks of its trust model, see [`super::disk`]) say the entry
//! is intact and was written by this user. On top of that, a hit is used
//! only if it is consistent with the request, and nothing it reports is taken
//! on faith ([`DiskPayload`] carries no resource figures at all):
//!
//! * the cubin passes [`metadata::check_cubin`] for the requested entry
//!   symbol and is at most [`MAX_ENTRY_BYTES`] long;
//! * its SM (`e_flags`, [`metadata::sm_from_e_flags`]) is the key's arch: an
//!   sm_75 cubin stored under an sm_90 key is refused;
//! * registers, stack frame and static shared memory are read from the cubin
//!   ([`metadata::cubin_resources`]); the stored nvJitLink info log is parsed
//!   again and used only if its figures for the entry (and its arch) agree
//!   with the cubin's, and it claims no spills without a stack frame; spill
//!   byte counts and barriers, which only the log records, are reported from
//!   it then. Without ptxas output in the log, the figures are the cubin's
//!   (as for a fresh link served from the driver's compute cache);
//! * entry, arch and fragment names come from the request.
//!
//! A refused hit is counted ([`DiskCache::reject`], `rejected` in the disk
//! stats), removed, and replaced by a fresh link.
//!
//! # Bounded memory
//!
//! Linked kernels: [`RuntimeConfig::memory_capacity`] (LRU). Run-time source
//! fragments compiled to LTO-IR: [`DEFAULT_SOURCE_ENTRIES`] (LRU,
//! [`LinkRuntime::set_source_capacity`]); a source is compiled only when a
//! link actually needs its LTO-IR, never for a memory or disk hit.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use once_cell::sync::OnceCell;

use crate::build::arch::Arch;
use crate::sys::{InputType, Nvrtc, Output};

use super::cache::{CacheStats, DigestState, SingleFlightCache, Source, Weighed};
use super::disk::{DiskCache, DiskCacheConfig, DiskCacheError, DiskLookup, MAX_ENTRY_BYTES};
use super::key::LinkKey;
use super::linker::{FastCompile, LinkInput, LinkOptions, Linker};
use super::metadata::{self, KernelMetadata};
use super::planner::Planner;
use super::profile::ProfileWriter;
use super::tiered::Upgrades;
use super::LinkError;

/// fraglink's device headers, embedded so that run-time sources can
/// `#include "metric.cuh"` etc. wherever the binary runs.
const FRAGLINK_HEADERS: &[(&str, &str)] = &[
    ("abi.cuh", include_str!("../../fragments/abi.cuh")),
    ("common.cuh", include_str!("../../fragments/common.cuh")),
    ("filter.cuh", include_str!("../../fragments/filter.cuh")),
    ("metric.cuh", include_str!("../../fragments/metric.cuh")),
    ("scan.cuh", include_str!("../../fragments/scan.cuh")),
];

/// The in-memory headers of a run-time source: fraglink's own and the
/// standard-header stand-ins (`stdint.h`, `cmath`, ...), as in build-time
/// fragments.
fn runtime_headers() -> &'static [(&'static str, &'static str)] {
    static ALL: OnceCell<Vec<(&'static str, &'static str)>> = OnceCell::new();
    ALL.get_or_init(|| {
        FRAGLINK_HEADERS
            .iter()
            .chain(crate::build::std_headers::STD_HEADERS)
            .copied()
            .collect()
    })
}

/// A linked, checked cubin holding one or more entries.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LinkedKernel {
    #[serde(skip)]
    pub key: Option<LinkKey>,
    /// The plan's first entry.
    pub entry: String,
    pub arch: String,
    pub fragments: Vec<String>,
    /// The first entry's resources (`kernels[0]`).
    pub metadata: KernelMetadata,
    /// Every entry's resources, in the plan's order.
    pub kernels: Vec<KernelMetadata>,
    /// nvJitLink's `-verbose` info log of the link that produced the cubin.
    pub info_log: String,
    /// A quick link (no LTO) standing in while the optimised one runs
    /// ([`LinkRuntime::link_tiered`]): kept in memory only.
    #[serde(default)]
    pub quick: bool,
    #[serde(skip)]
    pub cubin: Vec<u8>,
}

impl LinkedKernel {
    /// The resources of entry `name`, if this cubin was linked for it.
    pub fn kernel(&self, name: &str) -> Option<&KernelMetadata> {
        self.kernels.iter().find(|k| k.entry == name)
    }
    /// The entries, in the plan's order.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.kernels.iter().map(|k| k.entry.as_str())
    }
}

impl Weighed for LinkedKernel {
    fn bytes(&self) -> u64 {
        (self.cubin.len() + self.info_log.len()) as u64
    }
}

/// A kernel and where this request got it from.
#[derive(Debug, Clone)]
pub struct Linked {
    pub kernel: Arc<LinkedKernel>,
    pub source: Source,
    pub key: LinkKey,
    /// What producing the kernel cost this request: the whole link, the
    /// disk read, or the wait for another thread's link. Zero for a kernel
    /// already in memory and found through the plan's remembered key: that
    /// lookup takes tens of nanoseconds, and timing it would take two clock
    /// reads, more than the lookup itself (`benches/link.rs`, `memory_hit`).
    pub elapsed: std::time::Duration,
}

/// Environment variable: linked kernels kept in memory.
pub const ENV_MEMORY_ENTRIES: &str = "FRAGLINK_MEMORY_CACHE_ENTRIES";
/// The process-wide runtime's fast-compile level ([`fast_compile_from_env`]).
pub const ENV_FAST_COMPILE: &str = "FRAGLINK_FAST_COMPILE";
/// Linked kernels kept in memory by default.
pub const DEFAULT_MEMORY_ENTRIES: usize = 256;
/// Run-time source fragments kept compiled (LTO-IR) in memory by default.
pub const DEFAULT_SOURCE_ENTRIES: usize = 64;

/// Settings of a [`LinkRuntime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Linked kernels kept in memory (least recently used evicted first).
    pub memory_capacity: usize,
    /// `None` disables the disk cache.
    pub disk: Option<DiskCacheConfig>,
}

impl RuntimeConfig {
    /// Reads every cache variable now: `FRAGLINK_MEMORY_CACHE_ENTRIES`
    /// ([`memory_entries`](Self::memory_entries)) and the disk cache's
    /// (see [`DiskCacheConfig::from_env`]). An invalid value is an error
    /// naming the variable. [`LinkRuntime::global`] does not use this: it
    /// reads each variable only when the cache it configures is first used.
    pub fn from_env() -> Result<Self, LinkError> {
        let memory_capacity =
            Self::memory_entries(std::env::var_os(ENV_MEMORY_ENTRIES).as_deref())?;
        Ok(RuntimeConfig {
            memory_capacity,
            disk: disk_config_from_env()?,
        })
    }

    /// The value of `FRAGLINK_MEMORY_CACHE_ENTRIES`: unset or empty means
    /// [`DEFAULT_MEMORY_ENTRIES`]; otherwise a whole number of at least 1
    /// (surrounding whitespace ignored). Anything else is
    /// [`LinkError::InvalidEnv`], never a silent default.
    pub fn memory_entries(value: Option<&OsStr>) -> Result<usize, LinkError> {
        let Some(v) = value.filter(|v| !v.is_empty()) else {
            return Ok(DEFAULT_MEMORY_ENTRIES);
        };
        let invalid = |reason: &str| LinkError::InvalidEnv {
            var: ENV_MEMORY_ENTRIES,
            value: v.to_string_lossy().into_owned(),
            reason: reason.to_string(),
        };
        let text = v.to_str().ok_or_else(|| invalid("not valid UTF-8"))?;
        match text.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            Ok(_) => Err(invalid("at least 1 entry is needed")),
            Err(_) => Err(invalid("expected a whole number of entries, such as 256")),
        }
    }
}

/// The value of `FRAGLINK_FAST_COMPILE`: unset or empty is `None` (full
/// optimisation); otherwise one of [`FastCompile::VALUES`]. Anything else is
/// [`LinkError::InvalidEnv`].
pub fn fast_compile_from_env(value: Option<&OsStr>) -> Result<Option<FastCompile>, LinkError> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    v.to_str()
        .and_then(FastCompile::parse)
        .map(Some)
        .ok_or_else(|| LinkError::InvalidEnv {
            var: ENV_FAST_COMPILE,
            value: v.to_string_lossy().into_owned(),
            reason: format!(
                "expected nvJitLink's fast-compile level: {}",
                FastCompile::VALUES
            ),
        })
}

/// The disk cache's configuration from the environment; `None` (with a
/// warning) when no cache directory can be determined.
fn disk_config_from_env() -> Result<Option<DiskCacheConfig>, LinkError> {
    match DiskCacheConfig::from_env() {
        Ok(c) => Ok(Some(c)),
        // No home directory: link without a disk cache rather than fail.
        Err(e @ DiskCacheError::NoCacheDir) => {
            eprintln!("fraglink: warning: {e}");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn open_disk(config: Option<DiskCacheConfig>) -> Option<DiskCache> {
    match DiskCache::open(config?) {
        Ok(d) => Some(d),
        // The disk cache only saves time: an unusable directory must not
        // stop linking.
        Err(e) => {
            eprintln!("fraglink: warning: {e}; disk cache disabled");
            None
        }
    }
}

/// One resolved input, borrowed where possible: a cache hit allocates
/// nothing for the embedded fragments and compiles no source.
struct Input<'a> {
    name: &'a str,
    hash: std::borrow::Cow<'a, str>,
    kind: InputType,
    bytes: InputBytes<'a>,
}

enum InputBytes<'a> {
    Embedded(&'a [u8]),
    /// A run-time source, compiled when a link needs its LTO-IR.
    Source {
        text: &'a str,
        options: Vec<String>,
    },
}

/// What [`LinkRuntime::link`] knows about a plan before it looks in the
/// caches or links.
pub(super) enum Prepared<'p> {
    /// Linked by this runtime before and still in memory.
    Remembered(Linked),
    Keyed(LinkRequest<'p>),
}

/// A link request: the real arch, the inputs, the options and their key.
pub(super) struct LinkRequest<'p> {
    pub(super) arch: Arch,
    inputs: Vec<Input<'p>>,
    pub(super) options: LinkOptions,
    pub(super) key: LinkKey,
    pub(super) requested: Instant,
}

/// LTO-IR of a run-time source.
struct CompiledSource(Vec<u8>);

impl Weighed for CompiledSource {
    fn bytes(&self) -> u64 {
        self.0.len() as u64
    }
}

pub struct LinkRuntime {
    /// Unique per runtime in this process: plans remember their link key
    /// per runtime ([`super::memo`]), because the key depends on this
    /// runtime's nvJitLink and NVRTC.
    id: u64,
    linker: Linker,
    memory: SingleFlightCache<LinkKey, LinkedKernel, LinkError, DigestState>,
    /// Set once the memory capacity is settled (explicitly, or from
    /// `FRAGLINK_MEMORY_CACHE_ENTRIES` on the first link).
    memory_settled: OnceCell<()>,
    /// Set once the disk cache is resolved (explicitly, or from the
    /// environment when first needed).
    disk: OnceCell<Option<DiskCache>>,
    nvrtc: OnceCell<Nvrtc>,
    /// CUDA's include directories for run-time NVRTC, found once: every link
    /// of a plan with sources keys on them, and finding them probes the
    /// file system (and perhaps python3).
    cuda_includes: OnceCell<Vec<std::path::PathBuf>>,
    /// Run-time sources compiled to LTO-IR, by content hash; bounded (LRU).
    sources: SingleFlightCache<String, CompiledSource, LinkError>,
    /// Where linked and served plans are recorded: from `FRAGLINK_PROFILE`
    /// on the first link of the global runtime, or [`Self::set_profile`].
    profile: OnceCell<Option<ProfileWriter>>,
    /// The process-wide runtime ([`Self::global`]): the only one that reads
    /// `FRAGLINK_PROFILE` and `FRAGLINK_FAST_COMPILE`.
    global: bool,
    /// The fast-compile level of plans that set none: from
    /// `FRAGLINK_FAST_COMPILE` on the global runtime's first link, or
    /// [`Self::set_fast_compile`]; otherwise `None` (full optimisation).
    fast_compile: OnceCell<Option<FastCompile>>,
    /// Quick first links ([`Self::link_tiered`]): `FRAGLINK_QUICK_LINK`
    /// for the process-wide runtime, or [`Self::set_quick_link`].
    pub(super) quick_link: OnceCell<bool>,
    /// The optimised links [`Self::link_tiered`] started in the background.
    upgrades: Upgrades,
}

static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(0);

static GLOBAL: OnceCell<LinkRuntime> = OnceCell::new();
static MEMORY_ONLY: OnceCell<LinkRuntime> = OnceCell::new();
static DESCRIBING: OnceCell<LinkRuntime> = OnceCell::new();

/// The disk-cache payload of a linked cubin (inside the disk cache's
/// checksummed entry, format version 3: a cubin now serves every entry of
/// its plan, each checked on a hit). All integers little-endian:
///
/// | offset  | size | field                                   |
/// |---------|------|-----------------------------------------|
/// | 0       | 8    | link time in ms, `f64`                  |
/// | 8       | 4    | info log length `u32` (= L)             |
/// | 12      | L    | nvJitLink's `-verbose` info log, UTF-8  |
/// | 12 + L  | rest | the cubin                               |
///
/// Nothing else is stored: entry, arch and fragments come from the request,
/// and the resource figures are re-derived from the cubin (and checked
/// against the log) on every hit; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskPayload<'a> {
    pub link_ms: f64,
    pub info_log: &'a str,
    pub cubin: &'a [u8],
}

impl<'a> DiskPayload<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + self.info_log.len() + self.cubin.len());
        out.extend_from_slice(&self.link_ms.to_le_bytes());
        out.extend_from_slice(&(self.info_log.len() as u32).to_le_bytes());
        out.extend_from_slice(self.info_log.as_bytes());
        out.extend_from_slice(self.cubin);
        out
    }

    /// `None` for a payload that does not have this layout.
    pub fn decode(bytes: &'a [u8]) -> Option<Self> {
        let link_ms = f64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let len = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        let log_end = 12usize.checked_add(len)?;
        let info_log = std::str::from_utf8(bytes.get(12..log_end)?).ok()?;
        Some(DiskPayload {
            link_ms,
            info_log,
            cubin: &bytes[log_end..],
        })
    }
}

/// The metadata of a fresh link: ptxas' figures from the info log, or the
/// cubin's own record when the log has no ptxas output.
fn fresh_metadata(
    entry: &str,
    arch: Arch,
    cubin: &[u8],
    info_log: &str,
    link_ms: f64,
) -> Result<KernelMetadata, LinkError> {
    match metadata::entry_resources(info_log, entry) {
        Ok(res) => Ok(KernelMetadata::new(&res, cubin.len(), link_ms)),
        // No ptxas output in the log: read the cubin instead.
        Err(e) if e.verbose_missing() => {
            let res =
                metadata::cubin_resources(cubin, entry).map_err(|source| LinkError::Cubin {
                    entry: entry.to_string(),
                    source,
                })?;
            Ok(KernelMetadata::from_cubin(
                entry,
                &arch.to_string(),
                &res,
                cubin.len(),
                link_ms,
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// Checks a disk hit against the request and re-derives its metadata (see
/// the module documentation); `Err` says why the hit is refused.
/// Every entry's check ([`metadata::check_cubin`]) and resources
/// ([`fresh_metadata`]) in a freshly linked cubin, in order.
pub(super) fn checked_metadata(
    entries: &[&str],
    arch: Arch,
    cubin: &[u8],
    info_log: &str,
    link_ms: f64,
) -> Result<Vec<KernelMetadata>, LinkError> {
    entries
        .iter()
        .map(|e| {
            metadata::check_cubin(cubin, e).map_err(|source| LinkError::Cubin {
                entry: e.to_string(),
                source,
            })?;
            fresh_metadata(e, arch, cubin, info_log, link_ms)
        })
        .collect()
}

pub fn verify_disk_hit(
    entry: &str,
    arch: Arch,
    payload: &DiskPayload<'_>,
) -> Result<KernelMetadata, String> {
    let cubin = payload.cubin;
    if !(payload.link_ms.is_finite() && payload.link_ms >= 0.0) {
        return Err(format!("implausible link time {} ms", payload.link_ms));
    }
    if cubin.len() as u64 > MAX_ENTRY_BYTES {
        return Err(format!("cubin of {} bytes", cubin.len()));
    }
    let info = metadata::check_cubin(cubin, entry).map_err(|e| format!("cubin check: {e}"))?;
    if info.sm != Some(arch.number) {
        return Err(format!(
            "a cubin for {} under a key for {arch}",
            info.sm
                .map_or_else(|| "an unknown SM".to_string(), |s| format!("sm_{s}"))
        ));
    }
    let res =
        metadata::cubin_resources(cubin, entry).map_err(|e| format!("cubin resources: {e}"))?;
    let log = match metadata::entry_resources(payload.info_log, entry) {
        Ok(log) => log,
        Err(e) if e.verbose_missing() => {
            return Ok(KernelMetadata::from_cubin(
                entry,
                &arch.to_string(),
                &res,
                cubin.len(),
                payload.link_ms,
            ))
        }
        Err(e) => return Err(format!("info log: {e}")),
    };
    let arch_name = arch.to_string();
    let mismatch = |what: &str, log: u32, cubin: u32| {
        Err(format!(
            "the info log claims {log} {what}, the cubin records {cubin}"
        ))
    };
    if log.arch != arch_name {
        return Err(format!(
            "the info log is for {}, the key for {arch_name}",
            log.arch
        ));
    }
    if log.registers != res.registers {
        return mismatch("registers", log.registers, res.registers);
    }
    if log.stack_bytes != res.stack_bytes {
        return mismatch("stack bytes", log.stack_bytes, res.stack_bytes);
    }
    if log.shared_bytes.unwrap_or(0) != res.shared_bytes {
        return mismatch(
            "shared bytes",
            log.shared_bytes.unwrap_or(0),
            res.shared_bytes,
        );
    }
    if log.stack_bytes == 0 && (log.spill_stores != 0 || log.spill_loads != 0) {
        return Err(format!(
            "the info log claims {} / {} bytes of spill stores / loads, but the cubin \
             has no stack frame",
            log.spill_stores, log.spill_loads
        ));
    }
    Ok(KernelMetadata::new(&log, cubin.len(), payload.link_ms))
}

impl LinkRuntime {
    /// A runtime configured by `config` (no environment variable is read).
    pub fn new(config: RuntimeConfig) -> Result<Self, LinkError> {
        Self::with_linker(Linker::open()?, config)
    }

    pub fn with_linker(linker: Linker, config: RuntimeConfig) -> Result<Self, LinkError> {
        Ok(Self::configured(
            linker,
            config.memory_capacity,
            open_disk(config.disk),
        ))
    }

    /// Caches configured here: no environment variable is read later.
    fn configured(linker: Linker, memory_capacity: usize, disk: Option<DiskCache>) -> Self {
        let rt = Self::unconfigured(linker, memory_capacity);
        let _ = rt.memory_settled.set(());
        let _ = rt.disk.set(disk);
        rt
    }

    /// Caches not configured yet: each is configured from the environment
    /// when first used.
    fn unconfigured(linker: Linker, memory_capacity: usize) -> Self {
        LinkRuntime {
            id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            linker,
            memory: SingleFlightCache::new(memory_capacity),
            memory_settled: OnceCell::new(),
            disk: OnceCell::new(),
            nvrtc: OnceCell::new(),
            cuda_includes: OnceCell::new(),
            sources: SingleFlightCache::new(DEFAULT_SOURCE_ENTRIES),
            profile: OnceCell::new(),
            global: false,
            fast_compile: OnceCell::new(),
            quick_link: OnceCell::new(),
            upgrades: Upgrades::default(),
        }
    }

    /// The process-wide runtime. Creating it opens nvJitLink and reads no
    /// environment variable: `FRAGLINK_MEMORY_CACHE_ENTRIES` is read by the
    /// first [`link`](Self::link), the disk cache's variables by the first
    /// link that misses the memory cache (or by [`disk`](Self::disk)). An
    /// invalid value fails those calls, naming the variable, every time
    /// (a failure is not remembered). `FRAGLINK_PROFILE` is read by the
    /// first successful link ([`super::profile`]). A failure to open
    /// nvJitLink is returned, and retried by the next call.
    pub fn global() -> Result<&'static LinkRuntime, LinkError> {
        GLOBAL.get_or_try_init(|| {
            let mut rt = LinkRuntime::unconfigured(Linker::open()?, DEFAULT_MEMORY_ENTRIES);
            rt.global = true;
            Ok(rt)
        })
    }

    /// A process-wide runtime that reads no cache variable at all: a memory
    /// cache of [`DEFAULT_MEMORY_ENTRIES`] kernels and no disk cache. For
    /// callers that link only to describe a plan (the CPU route of
    /// `fraglink search`), whose run must not depend on the cache settings.
    pub fn memory_only() -> Result<&'static LinkRuntime, LinkError> {
        MEMORY_ONLY.get_or_try_init(|| {
            LinkRuntime::with_linker(
                Linker::open()?,
                RuntimeConfig {
                    memory_capacity: DEFAULT_MEMORY_ENTRIES,
                    disk: None,
                },
            )
        })
    }

    /// A process-wide runtime for links that only describe a plan (the CPU
    /// route of `fraglink search` shows the GPU kernel it would run): a
    /// memory cache of [`DEFAULT_MEMORY_ENTRIES`] kernels, the disk cache
    /// where the environment configures a usable one, and no profile. Its
    /// run must not depend on the cache settings, which the CPU route never
    /// uses: an invalid setting or an unusable directory is read, silently,
    /// as no disk cache. With a disk cache, a repeated description costs a
    /// lookup instead of a link (about 1.6 s for knn_tile on 2 cores).
    pub fn describing() -> Result<&'static LinkRuntime, LinkError> {
        DESCRIBING.get_or_try_init(|| {
            let disk = DiskCacheConfig::from_env()
                .ok()
                .and_then(|c| DiskCache::open(c).ok());
            Ok(LinkRuntime::configured(
                Linker::open()?,
                DEFAULT_MEMORY_ENTRIES,
                disk,
            ))
        })
    }

    pub fn linker(&self) -> &Linker {
        &self.linker
    }

    /// The disk cache, resolving it from the environment first if this
    /// runtime was not given one explicitly. `Ok(None)`: no disk cache.
    pub fn try_disk(&self) -> Result<Option<&DiskCache>, LinkError> {
        self.disk
            .get_or_try_init(|| Ok(open_disk(disk_config_from_env()?)))
            .map(Option::as_ref)
    }

    /// [`try_disk`](Self::try_disk), with an invalid environment read as "no
    /// disk cache" (the error itself is returned by `try_disk` and `link`).
    pub fn disk(&self) -> Option<&DiskCache> {
        self.try_disk().ok().flatten()
    }

    pub fn stats(&self) -> CacheStats {
        self.memory.stats()
    }

    /// Statistics of the compiled run-time sources (bounded, LRU).
    pub fn source_stats(&self) -> CacheStats {
        self.sources.stats()
    }

    /// Empties the memory cache (the disk cache has its own `clear`).
    pub fn clear(&self) {
        self.memory.clear();
    }

    /// Sets the memory cache's capacity; `FRAGLINK_MEMORY_CACHE_ENTRIES` is
    /// then never read by this runtime.
    pub fn set_memory_capacity(&self, entries: usize) {
        let _ = self.memory_settled.set(());
        self.memory.set_capacity(entries);
    }

    /// Compiled run-time sources kept in memory (at least 1; default
    /// [`DEFAULT_SOURCE_ENTRIES`]); the least recently used go first.
    pub fn set_source_capacity(&self, entries: usize) {
        self.sources.set_capacity(entries);
    }

    /// The fast-compile level for plans that set none ([`PlanSettings::fast_compile`]);
    /// call it before the first link: `false` when this runtime's level was
    /// already settled, by an earlier call or by its first link (the global
    /// runtime's from `FRAGLINK_FAST_COMPILE`, any other's as `None`).
    ///
    /// [`PlanSettings::fast_compile`]: super::PlanSettings::fast_compile
    pub fn set_fast_compile(&self, level: Option<FastCompile>) -> bool {
        self.fast_compile.set(level).is_ok()
    }

    /// `plan`'s options for `arch`, with this runtime's fast-compile level
    /// where the plan sets none (read from `FRAGLINK_FAST_COMPILE` once,
    /// by the global runtime; an invalid value fails every link, naming it).
    fn options_for(&self, plan: &Planner, arch: Arch) -> Result<LinkOptions, LinkError> {
        let mut options = plan.options(arch);
        if options.fast_compile.is_none() {
            options.fast_compile = *self.fast_compile.get_or_try_init(|| match self.global {
                true => fast_compile_from_env(std::env::var_os(ENV_FAST_COMPILE).as_deref()),
                false => Ok(None),
            })?;
        }
        Ok(options)
    }

    /// Applies `FRAGLINK_MEMORY_CACHE_ENTRIES` once, unless the capacity
    /// was given explicitly.
    fn settle_memory(&self) -> Result<(), LinkError> {
        self.memory_settled
            .get_or_try_init(|| {
                let n =
                    RuntimeConfig::memory_entries(std::env::var_os(ENV_MEMORY_ENTRIES).as_deref())?;
                self.memory.set_capacity(n);
                Ok::<(), LinkError>(())
            })
            .map(|_| ())
    }

    /// Records every plan this runtime links or serves from now on in
    /// `profile` (see [`super::profile`]). Call it before the first link:
    /// `false` when this runtime's profile was already settled by a link
    /// (the global runtime's from `FRAGLINK_PROFILE`; others have none).
    pub fn set_profile(&self, profile: ProfileWriter) -> bool {
        self.profile.set(Some(profile)).is_ok()
    }

    /// Records `plan` under `key` in the profile, if one is written
    /// (`FRAGLINK_PROFILE`): also a plan served by a quick link, whose
    /// optimised link a short process may never finish.
    pub(super) fn record_profile(&self, key: LinkKey, plan: &Planner, arch: Arch) {
        if let Some(profile) = self.profile() {
            profile.record(key, plan, arch);
        }
    }

    fn profile(&self) -> Option<&ProfileWriter> {
        self.profile
            .get_or_init(|| {
                if self.global {
                    ProfileWriter::from_env()
                } else {
                    None
                }
            })
            .as_ref()
    }

    fn nvrtc(&self) -> Result<&Nvrtc, LinkError> {
        self.nvrtc.get_or_try_init(|| Ok(Nvrtc::open(None)?))
    }

    /// The content hash and NVRTC options of a run-time fragment for `arch`
    /// (no compile: that waits until a link needs the LTO-IR).
    fn source_identity(
        &self,
        source: &str,
        arch: Arch,
    ) -> Result<(String, Vec<String>), LinkError> {
        let nvrtc = self.nvrtc()?;
        let (maj, min) = nvrtc.version()?;
        super::linker::check_versions(self.linker.version(), (maj as u32, min as u32))?;
        // The same NVRTC command line as the build's, for the target's
        // virtual arch, with CUDA's headers found beside this NVRTC (or by
        // the library search) and fraglink's own embedded in the binary, so
        // a copied binary needs no source tree.
        let include_dirs = self.cuda_includes.get_or_try_init(|| {
            crate::sys::loader::cuda_include_dirs(Some(nvrtc.path()))
                .map(|(dirs, _)| dirs)
                .map_err(|tried| LinkError::HeadersNotFound {
                    tried: tried.join("; "),
                })
        })?;
        // No --gen-opt-lto: a run-time source is compiled and linked in the
        // same first call, so optimizing it twice would only add time.
        let options = crate::build::compile::nvrtc_options(
            Arch::compute(arch.number),
            include_dirs,
            &[],
            true,
            false,
        );
        let mut h = blake3::Hasher::new();
        h.update(format!("nvrtc {maj}.{min}\0").as_bytes());
        for o in &options {
            h.update(o.as_bytes());
            h.update(b"\0");
        }
        h.update(source.as_bytes());
        for (file, text) in runtime_headers() {
            h.update(file.as_bytes());
            h.update(text.as_bytes());
        }
        Ok((h.finalize().to_hex().to_string(), options))
    }

    /// Compiles a run-time fragment to LTO-IR, once per content while it
    /// stays in the bounded source cache.
    fn compile_source(
        &self,
        name: &str,
        source: &str,
        hash: &str,
        options: &[String],
    ) -> Result<Arc<CompiledSource>, LinkError> {
        let (bytes, _) = self
            .sources
            .get_or_try_insert(&hash.to_string(), || {
                let out = self.nvrtc()?.compile_with_headers(
                    source,
                    name,
                    runtime_headers(),
                    options,
                    Output::LtoIr,
                )?;
                Ok((CompiledSource(out.bytes), Source::Linked))
            })
            .map_err(LinkError::from_shared)?;
        Ok(bytes)
    }

    /// Links `plan` for `arch` (memory cache, then disk cache, then nvJitLink).
    pub fn link(&self, plan: &Planner, arch: Arch) -> Result<Linked, LinkError> {
        let prepared = self.prepare(plan, arch)?;
        self.resolve(plan, prepared)
    }

    /// Links every plan of `plans` for `arch`, each as [`link`](Self::link)
    /// would, and those not yet in memory at the same time, one thread each
    /// up to two per core:
    /// a search's kernel pair (knn_tile + knn_rerank, knn_dist + knn_select)
    /// then costs its first call the slower link, not the sum. A plan whose
    /// kernel is already in memory costs what `link` costs: no thread is
    /// started unless two links are due. Results in the order of `plans`;
    /// the first failure (in that order) is returned.
    pub fn link_all(&self, plans: &[&Planner], arch: Arch) -> Result<Vec<Linked>, LinkError> {
        let prepared = plans
            .iter()
            .map(|p| self.prepare(p, arch))
            .collect::<Result<Vec<_>, _>>()?;
        let due = prepared
            .iter()
            .filter(|p| matches!(p, Prepared::Keyed(r) if self.memory.peek(&r.key).is_none()))
            .count();
        let finish = |(plan, p): (&&Planner, Prepared)| self.resolve(plan, p);
        if due < 2 {
            return plans.iter().zip(prepared).map(finish).collect();
        }
        // At most two threads per core however many plans are due (each
        // link can take hundreds of MB); a thread the system refuses to
        // start leaves its links to those started, the calling thread
        // among them.
        let jobs: Vec<_> = plans.iter().zip(prepared).collect();
        let threads = crate::workers::thread_count(due, jobs.len());
        crate::workers::map_bounded(jobs, threads, &finish)
            .into_iter()
            .collect()
    }

    /// Whether [`link`](Self::link) would find `plan`'s kernel for `arch`
    /// without linking: in memory, or on disk ([`DiskCache::holds`]). Costs
    /// the plan's key (a hash of fragment names and content hashes, none of
    /// their bytes) and a `stat`; links, reads and counts nothing. An
    /// estimate for a caller deciding whether a link is due (a router
    /// adding its cost): a disk entry may still fail its checks when read.
    pub fn is_available(&self, plan: &Planner, arch: Arch) -> Result<bool, LinkError> {
        // A plan linked before: its remembered key, looked at without
        // counting a hit (`prepare` would).
        if let Some(key) = plan.memo().get(self.id, arch.real()) {
            if self.memory.peek(&key).is_some() {
                return Ok(true);
            }
        }
        Ok(match self.prepare(plan, arch)? {
            Prepared::Remembered(_) => true,
            Prepared::Keyed(r) => {
                self.memory.peek(&r.key).is_some()
                    || self.disk().is_some_and(|d| d.holds(&r.key.hex()))
            }
        })
    }

    /// The kernel of a prepared plan: the remembered one, or the request's.
    fn resolve(&self, plan: &Planner, prepared: Prepared<'_>) -> Result<Linked, LinkError> {
        match prepared {
            Prepared::Remembered(linked) => Ok(linked),
            Prepared::Keyed(request) => self.finish(plan, request),
        }
    }

    /// A link request's inputs and key, or, for a plan this runtime linked
    /// before whose kernel is still in memory, the kernel itself.
    /// A ready kernel in memory, without linking (the tiered path's check).
    pub(super) fn memory_peek(&self, key: &LinkKey) -> Option<Arc<LinkedKernel>> {
        self.memory.peek(key)
    }

    /// The memory cache's single-flight lookup (the tiered path's quick
    /// links, which never go to disk).
    pub(super) fn memory_get_or_link(
        &self,
        key: &LinkKey,
        produce: impl FnOnce() -> Result<(LinkedKernel, Source), LinkError>,
    ) -> Result<(Arc<LinkedKernel>, Source), LinkError> {
        self.settle_memory()?;
        self.memory
            .get_or_try_insert(key, produce)
            .map_err(LinkError::from_shared)
    }

    pub(super) fn upgrades(&self) -> &Upgrades {
        &self.upgrades
    }

    /// Whether this is the process-wide runtime (the one environment
    /// variables configure).
    pub(super) fn is_global(&self) -> bool {
        self.global
    }

    pub(super) fn prepare<'p>(
        &self,
        plan: &'p Planner,
        arch: Arch,
    ) -> Result<Prepared<'p>, LinkError> {
        // The real arch, variant kept: sm_90a is its own target and key.
        let arch = arch.real();
        if plan.is_empty() {
            return Err(LinkError::EmptyPlan {
                entry: plan.entry().to_string(),
            });
        }
        // A repeated link of the same plan: its remembered key and one
        // lookup (no hashing of fragments, no allocation).
        // Not timed: see `Linked::elapsed`.
        if let Some(key) = plan.memo().get(self.id, arch) {
            if let Some(kernel) = self.memory.hit(&key) {
                return Ok(Prepared::Remembered(Linked {
                    kernel,
                    source: Source::Memory,
                    key,
                    elapsed: std::time::Duration::ZERO,
                }));
            }
        }
        let requested = Instant::now();
        self.settle_memory()?;
        let mut inputs: Vec<Input> = Vec::new();
        for f in plan.static_fragments() {
            if !f.links_for(arch) {
                return Err(LinkError::ArchNotCovered {
                    fragment: f.name.to_string(),
                    arch: arch.to_string(),
                    built: f.archs.join(", "),
                });
            }
            inputs.push(Input {
                name: f.name,
                hash: f.hash.into(),
                kind: InputType::Fatbin,
                bytes: InputBytes::Embedded(f.fatbin),
            });
        }
        for (name, source) in plan.sources() {
            let (hash, options) = self.source_identity(source, arch)?;
            inputs.push(Input {
                name,
                hash: hash.into(),
                kind: InputType::LtoIr,
                bytes: InputBytes::Source {
                    text: source,
                    options,
                },
            });
        }
        let options = self.options_for(plan, arch)?;
        let args = options.to_args();
        let pairs: Vec<(&str, &str)> = inputs.iter().map(|i| (i.name, i.hash.as_ref())).collect();
        let entries: Vec<&str> = plan.entries().iter().map(String::as_str).collect();
        let key = LinkKey::new(&entries, &pairs, &args, self.linker.version());
        plan.memo().remember(self.id, arch, key);
        Ok(Prepared::Keyed(LinkRequest {
            arch,
            inputs,
            options,
            key,
            requested,
        }))
    }

    /// The kernel of a keyed request: from memory, the disk cache or a
    /// fresh link, stored in both caches and recorded in the profile.
    fn finish(&self, plan: &Planner, request: LinkRequest<'_>) -> Result<Linked, LinkError> {
        let LinkRequest {
            arch,
            inputs,
            options,
            key,
            requested,
        } = request;
        let entry = plan.entry();
        let entries: Vec<&str> = plan.entries().iter().map(String::as_str).collect();
        // A checked kernel of this request, from the disk or a fresh link:
        // entry, arch and fragments always come from the request.
        let assemble =
            |kernels: Vec<KernelMetadata>, info_log: String, cubin: Vec<u8>| LinkedKernel {
                key: Some(key),
                entry: entry.to_string(),
                arch: arch.to_string(),
                fragments: inputs.iter().map(|i| i.name.to_string()).collect(),
                metadata: kernels[0].clone(),
                kernels,
                info_log,
                quick: false,
                cubin,
            };

        let produce = || -> Result<(LinkedKernel, Source), LinkError> {
            // Only on a miss: a hit's key (fragments, entries, arch) passed
            // this check when it was linked.
            super::check::check_plan(plan, arch)?;
            let hex = key.hex();
            let disk = self.try_disk()?;
            if let Some(disk) = disk {
                if let DiskLookup::Hit(bytes) = disk.get(&hex) {
                    let checked = DiskPayload::decode(&bytes)
                        .ok_or_else(|| "the payload does not decode".to_string())
                        .and_then(|p| {
                            entries
                                .iter()
                                .map(|e| verify_disk_hit(e, arch, &p))
                                .collect::<Result<Vec<_>, _>>()
                                .map(|m| (p, m))
                        });
                    match checked {
                        Ok((p, kernels)) => {
                            let kernel =
                                assemble(kernels, p.info_log.to_string(), p.cubin.to_vec());
                            return Ok((kernel, Source::Disk));
                        }
                        // Refused: counted, removed, and replaced by the
                        // fresh link below.
                        Err(why) => disk.reject(&hex, &why, &bytes),
                    }
                }
            }
            let compiled: Vec<Option<Arc<CompiledSource>>> = inputs
                .iter()
                .map(|inp| match &inp.bytes {
                    InputBytes::Embedded(_) => Ok(None),
                    InputBytes::Source { text, options } => self
                        .compile_source(inp.name, text, &inp.hash, options)
                        .map(Some),
                })
                .collect::<Result<_, LinkError>>()?;
            let link_inputs: Vec<LinkInput<'_>> = inputs
                .iter()
                .zip(&compiled)
                .map(|(inp, c)| LinkInput {
                    name: inp.name,
                    kind: inp.kind,
                    bytes: match (&inp.bytes, c) {
                        (InputBytes::Embedded(b), _) => b,
                        (InputBytes::Source { .. }, Some(c)) => &c.0,
                        (InputBytes::Source { .. }, None) => unreachable!("compiled above"),
                    },
                })
                .collect();
            let started = Instant::now();
            let out = self.linker.link(&link_inputs, &options)?;
            let link_ms = started.elapsed().as_secs_f64() * 1e3;
            let kernels = checked_metadata(&entries, arch, &out.cubin, &out.info_log, link_ms)?;
            if let Some(disk) = disk {
                // The disk cache is an optimisation: failing to write it is
                // not a failed link.
                let payload = DiskPayload {
                    link_ms,
                    info_log: &out.info_log,
                    cubin: &out.cubin,
                };
                let _ = disk.put(&hex, &payload.encode());
            }
            Ok((assemble(kernels, out.info_log, out.cubin), Source::Linked))
        };
        let (kernel, source) = self
            .memory
            .get_or_try_insert(&key, produce)
            .map_err(LinkError::from_shared)?;
        if let Some(profile) = self.profile() {
            profile.record(key, plan, arch);
        }
        Ok(Linked {
            kernel,
            source,
            key,
            elapsed: requested.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_roundtrip_and_garbage() {
        let p = DiskPayload {
            link_ms: 1.5,
            info_log: "log \u{e9}",
            cubin: &[1, 2, 3],
        };
        let bytes = p.encode();
        assert_eq!(&bytes[..8], &1.5f64.to_le_bytes());
        assert_eq!(DiskPayload::decode(&bytes), Some(p));
        assert!(DiskPayload::decode(&[]).is_none());
        assert!(DiskPayload::decode(&[0; 11]).is_none());
        // A log length past the end, and a log that is not UTF-8.
        let mut long = vec![0u8; 8];
        long.extend_from_slice(&100u32.to_le_bytes());
        long.extend_from_slice(b"short");
        assert!(DiskPayload::decode(&long).is_none());
        let mut bad = vec![0u8; 8];
        bad.extend_from_slice(&1u32.to_le_bytes());
        bad.push(0xff);
        assert!(DiskPayload::decode(&bad).is_none());
    }

    /// The threads of this process (`/proc/self/status`).
    fn threads_now() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// `link_all` once started one thread per due plan however many there
    /// were (each an nvJitLink link of up to hundreds of MB); now at most
    /// two per core, the calling thread among them. The process's threads
    /// are sampled while 40 more plans than that link (needs nvJitLink,
    /// no GPU); the slack covers a test running beside this one.
    #[test]
    fn link_all_starts_at_most_two_threads_per_core() {
        if threads_now() == 0 {
            return; // no /proc
        }
        let rt = LinkRuntime::new(crate::link::RuntimeConfig {
            memory_capacity: 1024,
            disk: None,
        })
        .expect("nvJitLink loads from the path baked at build time");
        let cap = crate::workers::max_threads();
        let plans: Vec<Planner> = crate::families::find("scan")
            .expect("the scan family")
            .plans()
            .into_iter()
            .take(cap + 40)
            .collect();
        let refs: Vec<&Planner> = plans.iter().collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let before = threads_now();
        let peak = std::thread::scope(|s| {
            let watch = s.spawn(|| {
                let mut peak = 0;
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(threads_now());
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                peak
            });
            let linked = rt.link_all(&refs, Arch::sm(90));
            stop.store(true, Ordering::Relaxed);
            assert_eq!(linked.expect("every scan plan links").len(), refs.len());
            watch.join().unwrap()
        });
        // `before` + the watcher + the pool's threads besides the caller.
        let allowed = before + 1 + (cap - 1) + 16;
        assert!(
            peak <= allowed,
            "{peak} threads while linking (cap {cap}, {before} before)"
        );
    }

    #[test]
    fn fast_compile_policy() {
        assert_eq!(fast_compile_from_env(None).unwrap(), None);
        assert_eq!(fast_compile_from_env(Some(OsStr::new(""))).unwrap(), None);
        assert_eq!(
            fast_compile_from_env(Some(OsStr::new(" min "))).unwrap(),
            Some(FastCompile::Min)
        );
        assert_eq!(
            fast_compile_from_env(Some(OsStr::new("0"))).unwrap(),
            Some(FastCompile::Off)
        );
        for bad in ["1", "fast", "max!"] {
            let e = fast_compile_from_env(Some(OsStr::new(bad))).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(&e, LinkError::InvalidEnv { var, value, .. }
                    if *var == ENV_FAST_COMPILE && value == bad),
                "{msg}"
            );
            assert!(msg.contains("min") && msg.contains(bad), "{msg}");
        }
    }

    #[test]
    fn memory_entries_policy() {
        // Issue 12 finding 8: invalid values are errors naming the variable
        // and the value, never a silent default.
        assert_eq!(RuntimeConfig::memory_entries(None).unwrap(), 256);
        assert_eq!(
            RuntimeConfig::memory_entries(Some(OsStr::new(""))).unwrap(),
            256
        );
        assert_eq!(
            RuntimeConfig::memory_entries(Some(OsStr::new(" 12 "))).unwrap(),
            12
        );
        for bad in ["0", "-3", "lots", "1.5", "99999999999999999999999"] {
            let e = RuntimeConfig::memory_entries(Some(OsStr::new(bad))).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(&e, LinkError::InvalidEnv { var, value, .. }
                    if *var == ENV_MEMORY_ENTRIES && value == bad),
                "{msg}"
            );
            assert!(
                msg.contains(ENV_MEMORY_ENTRIES) && msg.contains(bad),
                "{msg}"
            );
        }
    }

    #[test]
    fn verify_refuses_garbage_cubins() {
        let p = DiskPayload {
            link_ms: 1.0,
            info_log: "",
            cubin: b"not an ELF file at all, but long enough to have a header......",
        };
        let why = verify_disk_hit("e", Arch::sm(90), &p).unwrap_err();
        assert!(why.contains("cubin check"), "{why}");
        let p = DiskPayload {
            link_ms: f64::NAN,
            ..p
        };
        assert!(verify_disk_hit("e", Arch::sm(90), &p)
            .unwrap_err()
            .contains("link time"));
    }

    /// Issue 12 finding 18: compiled run-time sources are bounded (LRU).
    /// Needs NVRTC and nvJitLink (found as for every link test).
    #[test]
    fn compiled_sources_are_bounded() {
        use crate::fragments::{FilterFragment, NoneFilter, ScanFragment, F32, U32};
        const METRIC: &str = r#"
#include "abi.cuh"
extern "C" __device__ void fraglink_metric_init_f32(fraglink_metric_state_f32* s) { s->a = 0.0f; s->qq = 0.0f; s->xx = 0.0f; }
extern "C" __device__ void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x) { s->a += fabsf(q - x); }
extern "C" __device__ float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s) { return s->a; }
"#;
        let rt = LinkRuntime::new(RuntimeConfig {
            memory_capacity: 16,
            disk: None,
        })
        .expect("nvJitLink loads from the path baked at build time");
        rt.set_source_capacity(2);
        let plan = |i: usize| {
            Planner::new("scan_f32_u32_v4_k128")
                .add::<ScanFragment<F32, U32, 4, 128>>()
                .add::<FilterFragment<NoneFilter, U32>>()
                .add_source("metric_l1_f32", format!("{METRIC}// variant {i}\n"))
        };
        for i in 0..3 {
            let l = rt.link(&plan(i), Arch::sm(80)).unwrap();
            assert_eq!(l.source, Source::Linked);
        }
        let st = rt.source_stats();
        assert_eq!((st.entries, st.evictions, st.links), (2, 1, 3), "{st:?}");
        // A memory hit compiles nothing, even for an evicted source.
        assert_eq!(
            rt.link(&plan(0), Arch::sm(80)).unwrap().source,
            Source::Memory
        );
        assert_eq!(rt.source_stats().links, 3);
    }
}
