//! Disk cache of linked cubins (DESIGN.md decision 8).
//!
//! # Environment variables
//!
//! One policy for every fraglink cache variable (these three and
//! `FRAGLINK_MEMORY_CACHE_ENTRIES`, see [`crate::link::RuntimeConfig`]): an
//! empty variable is unset; an invalid value is an error naming the variable
//! and the value ([`DiskCacheError::InvalidEnv`]) at the moment the variable
//! is consulted; a variable that is not consulted is never read, so its value
//! cannot fail anything. Nothing reads them before the disk cache is first
//! needed: [`LinkRuntime::global`](crate::link::LinkRuntime::global) consults
//! them on its first link that misses the memory cache.
//!
//! [`DiskCacheConfig::from_env`] consults, in this order, only what it still
//! needs:
//!
//! 1. `FRAGLINK_CACHE_DISABLE` — `1`, `true`, `yes`, `on` disable the cache;
//!    `0`, `false`, `no`, `off` leave it on (case-insensitive, surrounding
//!    whitespace ignored). Any other value is invalid. A disabled cache reads
//!    nothing else: no directory variable, no `HOME`, no cap.
//! 2. `FRAGLINK_CACHE_DIR` — the cache directory, used as is; any bytes (it
//!    need not be UTF-8). Only when it is unset: `$XDG_CACHE_HOME/fraglink`
//!    (only if `XDG_CACHE_HOME` is an absolute path, as the XDG spec
//!    requires), otherwise `$HOME/.cache/fraglink`
//!    (`$HOME/Library/Caches/fraglink` on macOS; only if `HOME` is absolute).
//!    These are paths, not text: a `HOME` that is not UTF-8 is used as it is.
//!    If none of them gives a directory, [`DiskCacheError::NoCacheDir`] (the
//!    link runtime then links without a disk cache and says so once).
//! 3. `FRAGLINK_CACHE_MAX_BYTES` — the size cap, default
//!    [`DEFAULT_MAX_BYTES`] (1 GiB). A plain byte count or a number with a
//!    binary suffix `K`, `M`, `G`, `T` (optionally `KiB`, `MB`, ...; all are
//!    powers of 1024). `0` is valid and means nothing is ever stored.
//!    [`DiskCacheConfig::location_from_env`] does not read it: it serves
//!    operations that never write (`fraglink cache clear`).
//!
//! # Trust model
//!
//! **Processes running under the same effective uid are trusted; everyone
//! else is kept out.** A same-uid process can write the cache directory, and
//! could as well change this process's environment or binary, so nothing here
//! pretends to stop it from forging an entry with a valid checksum; the
//! checks below catch accidents (truncation, bit rot, other format versions,
//! an entry under the wrong key, a mistyped `FRAGLINK_CACHE_DIR`) and keep
//! what a hit reports consistent with the cubin it returns (see
//! [`LinkRuntime`](crate::link::LinkRuntime): the SM, the entry symbol and
//! the resource figures are re-derived from the cubin on every disk hit).
//! Everyone else is kept out:
//!
//! * the directory must be owned by the effective uid and not writable by
//!   group or others. This is checked when the cache is opened and again on
//!   every `get`, `put`, `clear` and `stats`, through a directory file
//!   descriptor that every later operation is relative to (`openat`,
//!   `fstatat`, `renameat`, `unlinkat`), so a directory made `0777` at run
//!   time stops being used at once ([`RejectReason::UnsafeDirectory`]);
//! * every entry is examined with `fstatat(AT_SYMLINK_NOFOLLOW)` before it is
//!   opened (a device or FIFO is never even opened), then opened with
//!   `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY` and checked again with
//!   `fstat` on the open descriptor: it must be a regular file owned by the
//!   effective uid, not writable by group or others, and at most
//!   [`MAX_ENTRY_BYTES`] long. At most that many bytes (plus one, to detect
//!   growth) are ever read. A symlink, FIFO, socket, device or directory, a
//!   file of another owner, a group/other-writable or oversized file is
//!   never read: it is a [`DiskLookup::Rejected`] (a miss for the caller,
//!   counted in [`DiskStats::rejected`]) and removed if it is still the same
//!   directory entry;
//! * `root` gets no exception: root's permission bypass does not extend to
//!   these checks, so a root process uses only a root-owned directory and
//!   root-owned entries.
//!
//! The disk cache needs POSIX file descriptors; on other platforms it is
//! always bypassed with a [`DiskCacheWarning::Unavailable`].
//!
//! # Security of the directory
//!
//! [`DiskCache::open`] creates the directory (and missing parents) with mode
//! `0700`. An existing directory that is not owned by the effective user, is
//! writable by group or others, or is not a directory at all, is *bypassed*:
//! the cache is returned disabled, with a typed [`DiskCacheWarning`]
//! ([`DiskCache::warning_kind`], [`DiskCache::warning`]) which is also printed
//! once per process to stderr as `fraglink: warning: ...`. Such a directory
//! is never read from or written to. A directory that cannot be created (for
//! example a read-only home) is bypassed the same way.
//!
//! # Entry format
//!
//! One file per key, named `hex(blake3(key)) + ".cubin"`, containing
//! (all integers little-endian):
//!
//! | offset        | size      | field                                |
//! |---------------|-----------|--------------------------------------|
//! | 0             | 8         | magic `b"FRAGLINK"`                  |
//! | 8             | 4         | format version `u32` ([`FORMAT_VERSION`]) |
//! | 12            | 4         | key length `u32` (= K)               |
//! | 16            | K         | the full link key, UTF-8             |
//! | 16 + K        | 8         | payload length `u64` (= P)           |
//! | 24 + K        | 32        | blake3 hash of the payload           |
//! | 56 + K        | P         | payload                              |
//!
//! The payload is opaque here; the link runtime's is described at
//! [`crate::link::runtime::DiskPayload`] (version 2 changed it: it no longer
//! carries resource figures, which are re-derived on every hit).
//!
//! Every header byte is validated on read (magic, version, key length and
//! bytes compared with the requested key, payload length compared with the
//! actual file length, checksum recomputed), so any truncation or bit flip
//! anywhere in the file is detected. A bad entry is never returned: it is
//! removed and reported as [`DiskLookup::Corrupt`], so the caller's fresh
//! link replaces it.
//!
//! # Atomicity and concurrency
//!
//! [`DiskCache::put`] writes the entry to a uniquely named temporary file in
//! the same directory (`.tmp-<hash prefix>-<pid>-<counter>-<nanos>`, created
//! with `O_EXCL | O_NOFOLLOW`, mode `0600`), syncs it, and renames it over the
//! final name. `rename` is atomic, so a reader opens either the old complete
//! file or the new complete file, never a partial one; since a reader keeps
//! the inode it opened, a concurrent replacement does not disturb it. Any
//! number of threads and processes may share one directory.
//!
//! # Eviction
//!
//! The cap applies to the total size of the regular `*.cubin` entry files
//! (header included) **plus** the temporary files of writers still in flight.
//! Recency is the file's mtime: set when written, bumped to "now" on every
//! hit. After each insert, while the total exceeds the cap, the entry with the
//! oldest mtime (ties broken by file name) is removed; the entry just written
//! is never evicted by its own insert, and temporary files in flight are never
//! removed. Temporary files more than [`STALE_TEMP_AGE`] (one hour) old are
//! left by crashed writers: every scan of the directory (each insert, `clear`,
//! `stats`) removes them ([`DiskStats::stale_temps_removed`]). An entry larger
//! than the cap (or than [`MAX_ENTRY_BYTES`]) on its own is not stored
//! ([`DiskCacheError::EntryTooLarge`]).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Magic bytes at the start of every entry.
pub const MAGIC: [u8; 8] = *b"FRAGLINK";
/// Version of the entry format written by this build. 2: the link runtime's
/// payload keeps only the cubin, nvJitLink's info log and the link time.
/// 3: a cubin serves every entry of a multi-entry plan (issue 14), keyed by
/// the entry set; a version-2 entry is refused as a format mismatch.
pub const FORMAT_VERSION: u32 = 3;
/// Size of the header excluding the key bytes.
pub const HEADER_FIXED_LEN: usize = 8 + 4 + 4 + 8 + 32;
/// Default size cap: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// The largest entry file that is ever read or written: 64 MiB (header
/// included). Linked cubins of fraglink's kernels are tens of KiB; a larger
/// file is not an entry this crate wrote, and is rejected without reading it.
pub const MAX_ENTRY_BYTES: u64 = 64 << 20;
/// Temporary files older than this are left by crashed writers and removed.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);
/// Extension of entry files.
pub const ENTRY_EXTENSION: &str = "cubin";
/// Name of the sub-directory of the user's cache directory.
pub const CACHE_SUBDIR: &str = "fraglink";

/// Environment variable naming the cache directory.
pub const ENV_DIR: &str = "FRAGLINK_CACHE_DIR";
/// Environment variable disabling the cache.
pub const ENV_DISABLE: &str = "FRAGLINK_CACHE_DISABLE";
/// Environment variable setting the size cap.
pub const ENV_MAX_BYTES: &str = "FRAGLINK_CACHE_MAX_BYTES";

const TEMP_PREFIX: &str = ".tmp-";

/// Errors of the disk cache. Only [`InvalidEnv`](Self::InvalidEnv) stops a
/// link (the user asked for something that cannot be done); the others are
/// non-fatal: the linker can always link afresh.
#[derive(Debug, thiserror::Error)]
pub enum DiskCacheError {
    /// An environment variable has a value that cannot be used.
    #[error("invalid value {value:?} for {var}: {reason}")]
    InvalidEnv {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// No cache directory could be determined.
    #[error(
        "cannot determine the fraglink cache directory: none of {ENV_DIR}, \
         XDG_CACHE_HOME (absolute) or HOME (absolute) is set; set {ENV_DIR} or \
         {ENV_DISABLE}=1"
    )]
    NoCacheDir,
    /// A filesystem operation failed.
    #[error("fraglink disk cache: cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The entry alone is larger than the cache's size cap (or
    /// [`MAX_ENTRY_BYTES`]); it is not stored.
    #[error(
        "fraglink disk cache: entry {} of {size} bytes exceeds the cache cap of \
         {max_bytes} bytes; not stored",
        path.display()
    )]
    EntryTooLarge {
        path: PathBuf,
        size: u64,
        max_bytes: u64,
    },
    /// The key is longer than the format can record (`u32::MAX` bytes).
    #[error("fraglink disk cache: link key of {len} bytes is too long")]
    KeyTooLong { len: usize },
    /// The directory was safe when the cache was opened but is not any more
    /// (re-checked on every operation); nothing was read or written.
    #[error("fraglink {0}")]
    UnsafeDirectory(DiskCacheWarning),
}

impl DiskCacheError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        DiskCacheError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Why an existing cache directory was bypassed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskCacheWarning {
    /// The directory belongs to another user.
    NotOwned { dir: PathBuf, owner: u32, uid: u32 },
    /// The directory is writable by group or others.
    InsecurePermissions { dir: PathBuf, mode: u32 },
    /// The path exists but is not a directory.
    NotADirectory { dir: PathBuf },
    /// The directory could not be created or inspected.
    Unavailable { dir: PathBuf, error: String },
}

impl std::fmt::Display for DiskCacheWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskCacheWarning::NotOwned { dir, owner, uid } => write!(
                f,
                "disk cache directory {} is owned by uid {owner}, not by the current \
                 user (uid {uid}); disk cache disabled",
                dir.display()
            ),
            DiskCacheWarning::InsecurePermissions { dir, mode } => write!(
                f,
                "disk cache directory {} has mode {mode:04o} (writable by group or \
                 others); disk cache disabled (chmod 700 it to use it)",
                dir.display()
            ),
            DiskCacheWarning::NotADirectory { dir } => write!(
                f,
                "disk cache path {} exists and is not a directory; disk cache disabled",
                dir.display()
            ),
            DiskCacheWarning::Unavailable { dir, error } => write!(
                f,
                "disk cache directory {} is unavailable ({error}); disk cache disabled",
                dir.display()
            ),
        }
    }
}

/// Where and how to cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// The directory; empty for a disabled configuration read from the
    /// environment (which does not look for one).
    pub dir: PathBuf,
    pub max_bytes: u64,
    pub enabled: bool,
}

impl DiskCacheConfig {
    /// An enabled configuration for `dir` with the default cap.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DiskCacheConfig {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            enabled: true,
        }
    }

    /// Reads the process environment; see the module documentation.
    pub fn from_env() -> Result<Self, DiskCacheError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// Like [`from_env`](Self::from_env), without consulting
    /// `FRAGLINK_CACHE_MAX_BYTES` (the cap is [`DEFAULT_MAX_BYTES`]): for
    /// operations that never write, such as `fraglink cache clear`.
    pub fn location_from_env() -> Result<Self, DiskCacheError> {
        resolve(&|name| std::env::var_os(name), false)
    }

    /// [`from_env`](Self::from_env) with the environment given as a lookup
    /// function (pure, for tests and embedding). The function is called only
    /// for the variables that are consulted.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Self, DiskCacheError> {
        resolve(&var, true)
    }
}

fn invalid(var: &'static str, value: &OsStr, reason: impl Into<String>) -> DiskCacheError {
    DiskCacheError::InvalidEnv {
        var,
        value: value.to_string_lossy().into_owned(),
        reason: reason.into(),
    }
}

fn resolve(
    var: &dyn Fn(&str) -> Option<OsString>,
    with_cap: bool,
) -> Result<DiskCacheConfig, DiskCacheError> {
    let get = |name: &str| var(name).filter(|v| !v.is_empty());

    if let Some(v) = get(ENV_DISABLE) {
        if parse_switch(&v).ok_or_else(|| {
            invalid(
                ENV_DISABLE,
                &v,
                "expected 1, true, yes or on to disable the disk cache, or 0, false, no \
                 or off to keep it",
            )
        })? {
            return Ok(DiskCacheConfig {
                dir: PathBuf::new(),
                max_bytes: DEFAULT_MAX_BYTES,
                enabled: false,
            });
        }
    }

    let dir = match get(ENV_DIR) {
        Some(d) => PathBuf::from(d),
        None => default_cache_root(&get)
            .ok_or(DiskCacheError::NoCacheDir)?
            .join(CACHE_SUBDIR),
    };

    let max_bytes = match get(ENV_MAX_BYTES).filter(|_| with_cap) {
        None => DEFAULT_MAX_BYTES,
        Some(v) => {
            let text = v
                .to_str()
                .ok_or_else(|| invalid(ENV_MAX_BYTES, &v, "not valid UTF-8"))?;
            parse_size(text).map_err(|reason| invalid(ENV_MAX_BYTES, &v, reason))?
        }
    };
    Ok(DiskCacheConfig {
        dir,
        max_bytes,
        enabled: true,
    })
}

/// `Some(true)`: disable. `None`: not a recognised value.
fn parse_switch(v: &OsStr) -> Option<bool> {
    crate::switch::parse_switch(v.to_str()?, false)
}

/// The user's cache root (without the `fraglink` component). `HOME` is read
/// only when `XDG_CACHE_HOME` does not give an absolute path.
fn default_cache_root(get: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if !cfg!(target_os = "macos") {
        if let Some(x) = get("XDG_CACHE_HOME") {
            let p = PathBuf::from(x);
            if p.is_absolute() {
                return Some(p);
            }
        }
    }
    let home = PathBuf::from(get("HOME")?);
    if !home.is_absolute() {
        return None;
    }
    if cfg!(target_os = "macos") {
        Some(home.join("Library").join("Caches"))
    } else {
        Some(home.join(".cache"))
    }
}

/// Parses `123`, `64K`, `512MiB`, `1g`, ... (binary multiples).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err("expected a byte count such as 1073741824, 512M or 2G".into());
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| "number out of range".to_string())?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use a byte count or K, M, G, T)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| "number out of range".to_string())
}

/// Why an entry was rejected as damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorruptReason {
    /// The file is empty.
    Empty,
    /// The file does not start with [`MAGIC`].
    BadMagic,
    /// The file is shorter than its header says.
    Truncated { expected: u64, actual: u64 },
    /// Written by another format version.
    OtherVersion { found: u32 },
    /// The entry belongs to another key (file-name hash collision, or a
    /// damaged key field).
    OtherKey,
    /// The file is longer than its header says.
    TrailingData { expected: u64, actual: u64 },
    /// The payload does not match its checksum.
    ChecksumMismatch,
}

impl std::fmt::Display for CorruptReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorruptReason::Empty => write!(f, "empty file"),
            CorruptReason::BadMagic => write!(f, "bad magic bytes"),
            CorruptReason::Truncated { expected, actual } => {
                write!(f, "truncated: {actual} bytes, expected {expected}")
            }
            CorruptReason::OtherVersion { found } => write!(
                f,
                "format version {found}, this build reads version {FORMAT_VERSION}"
            ),
            CorruptReason::OtherKey => write!(f, "entry for another link key"),
            CorruptReason::TrailingData { expected, actual } => {
                write!(f, "{actual} bytes, expected {expected}")
            }
            CorruptReason::ChecksumMismatch => write!(f, "payload checksum mismatch"),
        }
    }
}

/// Why an entry was not read at all (or, for [`Refused`](Self::Refused),
/// not believed): see the trust model in the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// The directory is no longer safe (owner or mode changed since open).
    UnsafeDirectory(DiskCacheWarning),
    /// The entry is a symbolic link.
    Symlink,
    /// The entry is a FIFO, socket, device or directory.
    NotARegularFile { kind: &'static str },
    /// The entry belongs to another user.
    ForeignOwner { owner: u32, uid: u32 },
    /// The entry is writable by group or others.
    WritableByOthers { mode: u32 },
    /// The entry is larger than [`MAX_ENTRY_BYTES`].
    TooLarge { size: u64, max: u64 },
    /// The caller found the verified payload inconsistent
    /// ([`DiskCache::reject`]).
    Refused(String),
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectReason::UnsafeDirectory(w) => write!(f, "{w}"),
            RejectReason::Symlink => write!(f, "entry is a symbolic link"),
            RejectReason::NotARegularFile { kind } => {
                write!(f, "entry is a {kind}, not a regular file")
            }
            RejectReason::ForeignOwner { owner, uid } => {
                write!(f, "entry is owned by uid {owner}, not by uid {uid}")
            }
            RejectReason::WritableByOthers { mode } => {
                write!(f, "entry has mode {mode:04o} (writable by group or others)")
            }
            RejectReason::TooLarge { size, max } => {
                write!(f, "entry of {size} bytes exceeds the {max}-byte limit")
            }
            RejectReason::Refused(why) => write!(f, "entry refused: {why}"),
        }
    }
}

/// Result of [`DiskCache::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskLookup {
    /// A verified payload.
    Hit(Vec<u8>),
    /// No entry (or it could not be read).
    Miss,
    /// An entry existed but was damaged; it has been removed.
    Corrupt { reason: CorruptReason },
    /// An entry (or the directory) failed the trust checks and was not read;
    /// the entry has been removed when the directory is still safe. A miss
    /// for the caller.
    Rejected { reason: RejectReason },
    /// The cache is disabled or bypassed.
    Disabled,
}

/// Counters of this process (`hits` .. `errors`) and on-disk totals
/// (`entries` .. `temp_bytes`, measured when [`DiskCache::stats`] is called).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Regular entry files currently in the directory.
    pub entries: u64,
    /// Their total size in bytes.
    pub bytes: u64,
    /// Temporary files of writers in flight (younger than
    /// [`STALE_TEMP_AGE`]); they count against the cap.
    pub temp_files: u64,
    /// Their total size in bytes.
    pub temp_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// Damaged entries detected (and removed) by `get`.
    pub corrupt: u64,
    /// Entries that failed the trust checks ([`DiskLookup::Rejected`]) or
    /// that the caller refused ([`DiskCache::reject`]).
    pub rejected: u64,
    /// Entries written by `put`.
    pub writes: u64,
    /// Entries removed to respect the size cap.
    pub evictions: u64,
    /// Stale temporary files removed.
    pub stale_temps_removed: u64,
    /// I/O errors in `get` / `put` (non-fatal).
    pub errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    rejected: AtomicU64,
    writes: AtomicU64,
    evictions: AtomicU64,
    stale_temps: AtomicU64,
    errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What a scan of the directory found.
#[derive(Default)]
struct Scan {
    /// Regular entry files: name, size, mtime.
    entries: Vec<(String, u64, SystemTime)>,
    temp_files: u64,
    temp_bytes: u64,
}

/// Why the directory cannot be used right now.
enum DirProblem {
    Unsafe(DiskCacheWarning),
    Io(io::Error),
}

/// A per-user, size-capped, crash- and race-safe directory of linked cubins.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    enabled: bool,
    warning: Option<(DiskCacheWarning, String)>,
    counters: Counters,
}

impl DiskCache {
    /// Opens (creating with mode 0700 if needed) the cache directory. A
    /// directory that is not safe to use, or that cannot be created or
    /// inspected, gives a disabled cache carrying a [`warning`](Self::warning)
    /// (the cache is an optimisation; linking must not fail because of it).
    /// A disabled configuration gives a disabled cache without touching the
    /// filesystem. The `Result` is kept for future failure modes; today this
    /// always returns `Ok`.
    pub fn open(config: DiskCacheConfig) -> Result<Self, DiskCacheError> {
        let mut cache = DiskCache {
            dir: config.dir,
            max_bytes: config.max_bytes,
            enabled: false,
            warning: None,
            counters: Counters::default(),
        };
        if !config.enabled {
            return Ok(cache);
        }
        let outcome = if cfg!(unix) {
            prepare_dir(&cache.dir).unwrap_or_else(|e| {
                Some(DiskCacheWarning::Unavailable {
                    dir: cache.dir.clone(),
                    error: match e {
                        DiskCacheError::Io { op, source, .. } => format!("cannot {op}: {source}"),
                        other => other.to_string(),
                    },
                })
            })
        } else {
            Some(DiskCacheWarning::Unavailable {
                dir: cache.dir.clone(),
                error: "the disk cache needs a Unix platform".into(),
            })
        };
        match outcome {
            None => cache.enabled = true,
            Some(w) => {
                let msg = w.to_string();
                warn_once(&msg);
                cache.warning = Some((w, msg));
            }
        }
        Ok(cache)
    }

    /// A cache that stores nothing.
    pub fn disabled() -> Self {
        DiskCache {
            dir: PathBuf::new(),
            max_bytes: 0,
            enabled: false,
            warning: None,
            counters: Counters::default(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The bypass warning, if the directory was unsafe when opened.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_ref().map(|(_, m)| m.as_str())
    }

    /// The bypass warning as a typed value.
    pub fn warning_kind(&self) -> Option<&DiskCacheWarning> {
        self.warning.as_ref().map(|(w, _)| w)
    }

    /// The file name used for `key`: `hex(blake3(key)).cubin`.
    pub fn file_name(key: &str) -> String {
        format!(
            "{}.{ENTRY_EXTENSION}",
            blake3::hash(key.as_bytes()).to_hex()
        )
    }

    /// The path of `key`'s entry in this cache's directory.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join(Self::file_name(key))
    }

    /// Opens the directory and checks, on the descriptor, that it is still a
    /// directory owned by the effective uid and not group/other-writable.
    fn checked_dir(&self) -> Result<fsx::Dir, DirProblem> {
        let dir = fsx::Dir::open(&self.dir).map_err(DirProblem::Io)?;
        let st = dir.stat().map_err(DirProblem::Io)?;
        match dir_problem(&self.dir, st.kind == fsx::Kind::Dir, st.uid, st.mode) {
            Some(w) => {
                warn_once(&w.to_string());
                Err(DirProblem::Unsafe(w))
            }
            None => Ok(dir),
        }
    }

    fn checked_dir_or_err(&self) -> Result<fsx::Dir, DiskCacheError> {
        self.checked_dir().map_err(|p| match p {
            DirProblem::Unsafe(w) => DiskCacheError::UnsafeDirectory(w),
            DirProblem::Io(e) => DiskCacheError::io("open directory", &self.dir, e),
        })
    }

    fn miss(&self, io_error: bool) -> DiskLookup {
        if io_error {
            bump(&self.counters.errors);
        }
        bump(&self.counters.misses);
        DiskLookup::Miss
    }

    /// Counts a rejected entry and removes it if `name` still is `st`.
    fn rejected(
        &self,
        dir: &fsx::Dir,
        name: &str,
        st: &fsx::Stat,
        reason: RejectReason,
    ) -> DiskLookup {
        bump(&self.counters.rejected);
        remove_if_same(dir, name, st);
        DiskLookup::Rejected { reason }
    }

    /// Looks `key` up. A bad entry is never returned: a damaged one is
    /// removed and reported as [`DiskLookup::Corrupt`], one that fails the
    /// trust checks (module documentation) as [`DiskLookup::Rejected`]. A
    /// hit refreshes the entry's recency (mtime). Never blocks on a FIFO or
    /// device and never reads more than [`MAX_ENTRY_BYTES`] + 1 bytes.
    pub fn get(&self, key: &str) -> DiskLookup {
        if !self.enabled {
            return DiskLookup::Disabled;
        }
        let name = Self::file_name(key);
        let dir = match self.checked_dir() {
            Ok(d) => d,
            Err(DirProblem::Unsafe(w)) => {
                bump(&self.counters.rejected);
                return DiskLookup::Rejected {
                    reason: RejectReason::UnsafeDirectory(w),
                };
            }
            Err(DirProblem::Io(_)) => return self.miss(true),
        };
        // Look before opening: a device or FIFO is never opened at all.
        let before = match dir.stat_at(&name) {
            Ok(st) => st,
            Err(e) => return self.miss(e.kind() != io::ErrorKind::NotFound),
        };
        if let Some(reason) = entry_problem(&before) {
            return self.rejected(&dir, &name, &before, reason);
        }
        let (file, st) = match dir.open_entry(&name) {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return self.miss(false),
            // Replaced by a symlink between the two looks.
            Err(e) if fsx::is_symlink_error(&e) => {
                bump(&self.counters.rejected);
                return DiskLookup::Rejected {
                    reason: RejectReason::Symlink,
                };
            }
            Err(_) => return self.miss(true),
        };
        // What was opened is what counts.
        if let Some(reason) = entry_problem(&st) {
            return self.rejected(&dir, &name, &st, reason);
        }
        let mut bytes = Vec::with_capacity(st.size as usize);
        // One byte more than fstat said detects a file that grew meanwhile.
        if (&file).take(st.size + 1).read_to_end(&mut bytes).is_err() {
            return self.miss(true);
        }
        match decode_entry(key, &bytes) {
            Ok(payload) => {
                let len = payload.len();
                // Recency for LRU eviction; failure only affects eviction order.
                let _ = file.set_modified(SystemTime::now());
                bump(&self.counters.hits);
                // Reuse the buffer: drop the header in place.
                let start = bytes.len() - len;
                bytes.drain(..start);
                DiskLookup::Hit(bytes)
            }
            Err(reason) => {
                bump(&self.counters.corrupt);
                remove_if_same(&dir, &name, &st);
                DiskLookup::Corrupt { reason }
            }
        }
    }

    /// Whether `key` has an entry [`get`](Self::get) would read (a regular
    /// file, owned and not writable by others, of a size an entry can have),
    /// without reading, counting or touching it: an estimate for a caller
    /// deciding whether a link is due, not a promise (the entry may still
    /// fail its checksum, or go, before it is read).
    pub fn holds(&self, key: &str) -> bool {
        if !self.enabled {
            return false;
        }
        let Ok(dir) = self.checked_dir() else {
            return false;
        };
        dir.stat_at(&Self::file_name(key))
            .is_ok_and(|st| entry_problem(&st).is_none())
    }

    /// Records that the caller refused `refused`, the payload
    /// [`get`](Self::get) returned for `key` (it passed the checksum but not
    /// the caller's own checks), counts it in [`DiskStats::rejected`] and
    /// removes the entry if it still holds that payload: another process may
    /// have replaced it meanwhile (a fresh link of the same key), and that
    /// entry is left alone.
    pub fn reject(&self, key: &str, why: &str, refused: &[u8]) {
        if !self.enabled {
            return;
        }
        bump(&self.counters.rejected);
        let name = Self::file_name(key);
        warn_once(&format!(
            "disk cache entry {} refused ({why}); linking afresh",
            self.dir.join(&name).display()
        ));
        let Ok(dir) = self.checked_dir() else {
            return;
        };
        // Read as `get` reads: look before opening (a device or FIFO is
        // never opened), and leave an entry it would refuse unread to it.
        if !dir
            .stat_at(&name)
            .is_ok_and(|st| entry_problem(&st).is_none())
        {
            return;
        }
        let Ok((file, st)) = dir.open_entry(&name) else {
            return;
        };
        if entry_problem(&st).is_some() {
            return;
        }
        let mut bytes = Vec::with_capacity(st.size as usize);
        if (&file).take(st.size + 1).read_to_end(&mut bytes).is_err() {
            return;
        }
        if decode_entry(key, &bytes).is_ok_and(|payload| payload == refused) {
            remove_if_same(&dir, &name, &st);
        }
    }

    /// Stores `payload` under `key` atomically, then evicts least recently
    /// used entries until the cache is under its cap. A no-op when disabled.
    pub fn put(&self, key: &str, payload: &[u8]) -> Result<(), DiskCacheError> {
        if !self.enabled {
            return Ok(());
        }
        let name = Self::file_name(key);
        let path = self.dir.join(&name);
        if key.len() > u32::MAX as usize {
            return Err(DiskCacheError::KeyTooLong { len: key.len() });
        }
        let size = encoded_len(key, payload.len());
        let limit = self.max_bytes.min(MAX_ENTRY_BYTES);
        if size > limit {
            return Err(DiskCacheError::EntryTooLarge {
                path,
                size,
                max_bytes: limit,
            });
        }
        let result = self
            .checked_dir_or_err()
            .and_then(|dir| self.write_atomic(&dir, &name, key, payload).map(|()| dir));
        let dir = match result {
            Ok(dir) => {
                bump(&self.counters.writes);
                dir
            }
            Err(e) => {
                bump(&self.counters.errors);
                return Err(e);
            }
        };
        self.evict(&dir, Some(&name))
    }

    fn write_atomic(
        &self,
        dir: &fsx::Dir,
        name: &str,
        key: &str,
        payload: &[u8],
    ) -> Result<(), DiskCacheError> {
        let (tmp, mut file) = self.create_temp(dir, &name[..16])?;
        let written = (|| {
            let header = encode_header(key, payload);
            file.write_all(&header)?;
            file.write_all(payload)?;
            file.sync_data()
        })();
        drop(file);
        if let Err(e) = written {
            let _ = dir.remove(&tmp);
            return Err(DiskCacheError::io("write", &self.dir.join(&tmp), e));
        }
        if let Err(e) = dir.rename(&tmp, name) {
            let _ = dir.remove(&tmp);
            return Err(DiskCacheError::io(
                "rename into place",
                &self.dir.join(name),
                e,
            ));
        }
        Ok(())
    }

    fn create_temp(&self, dir: &fsx::Dir, tag: &str) -> Result<(String, File), DiskCacheError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let mut last_err = None;
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let tmp = format!("{TEMP_PREFIX}{tag}-{pid}-{n}-{nanos:09}");
            match dir.create_new(&tmp) {
                Ok(f) => return Ok((tmp, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some((tmp, e)),
                Err(e) => {
                    return Err(DiskCacheError::io(
                        "create temporary file",
                        &self.dir.join(&tmp),
                        e,
                    ))
                }
            }
        }
        let (tmp, e) = last_err.expect("loop ran");
        Err(DiskCacheError::io(
            "create temporary file",
            &self.dir.join(tmp),
            e,
        ))
    }

    /// Lists regular entry files and live temporary files; removes stale
    /// temporaries.
    fn scan(&self, dir: &fsx::Dir) -> Result<Scan, DiskCacheError> {
        let rd = fs::read_dir(&self.dir)
            .map_err(|e| DiskCacheError::io("read directory", &self.dir, e))?;
        let now = SystemTime::now();
        let mut out = Scan::default();
        for ent in rd {
            let ent = ent.map_err(|e| DiskCacheError::io("read directory", &self.dir, e))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            let temp = name.starts_with(TEMP_PREFIX);
            if !temp && !is_entry_name(name) {
                continue;
            }
            // Relative to the checked descriptor, without following links.
            // Entries vanish under concurrent eviction; skip them.
            let Ok(st) = dir.stat_at(name) else { continue };
            if st.kind != fsx::Kind::File {
                continue;
            }
            if temp {
                let stale = now
                    .duration_since(st.mtime)
                    .is_ok_and(|age| age > STALE_TEMP_AGE);
                if stale {
                    if dir.remove(name).is_ok() {
                        bump(&self.counters.stale_temps);
                    }
                } else {
                    out.temp_files += 1;
                    out.temp_bytes += st.size;
                }
                continue;
            }
            out.entries.push((name.to_string(), st.size, st.mtime));
        }
        Ok(out)
    }

    /// Removes the least recently used entries until entries plus live
    /// temporary files fit the cap, never `keep`.
    fn evict(&self, dir: &fsx::Dir, keep: Option<&str>) -> Result<(), DiskCacheError> {
        let Scan {
            mut entries,
            temp_bytes,
            ..
        } = self.scan(dir)?;
        let mut total: u64 = entries.iter().map(|e| e.1).sum::<u64>() + temp_bytes;
        if total <= self.max_bytes {
            return Ok(());
        }
        entries.sort_by(|a, b| a.2.cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
        for (name, size, _) in entries {
            if total <= self.max_bytes {
                break;
            }
            if keep == Some(name.as_str()) {
                continue;
            }
            match dir.remove(&name) {
                Ok(()) => {
                    bump(&self.counters.evictions);
                    total = total.saturating_sub(size);
                }
                // Another process evicted or replaced it first.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    total = total.saturating_sub(size);
                }
                Err(e) => return Err(DiskCacheError::io("evict", &self.dir.join(&name), e)),
            }
        }
        Ok(())
    }

    /// Removes every entry; returns the bytes removed. Temporary files of
    /// writers still in flight are left alone (stale ones are removed).
    pub fn clear(&self) -> Result<u64, DiskCacheError> {
        if !self.enabled {
            return Ok(0);
        }
        let dir = self.checked_dir_or_err()?;
        let mut removed = 0;
        for (name, size, _) in self.scan(&dir)?.entries {
            match dir.remove(&name) {
                Ok(()) => removed += size,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(DiskCacheError::io("remove", &self.dir.join(&name), e)),
            }
        }
        Ok(removed)
    }

    fn counters(&self) -> DiskStats {
        let c = &self.counters;
        DiskStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            corrupt: c.corrupt.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            stale_temps_removed: c.stale_temps.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            ..DiskStats::default()
        }
    }

    /// Counters of this process plus the current on-disk totals; an error
    /// when the directory cannot be read or is no longer safe. A disabled
    /// cache has counters only.
    pub fn try_stats(&self) -> Result<DiskStats, DiskCacheError> {
        if !self.enabled {
            return Ok(self.counters());
        }
        let dir = self.checked_dir_or_err()?;
        let scan = self.scan(&dir)?;
        let mut s = self.counters();
        s.entries = scan.entries.len() as u64;
        s.bytes = scan.entries.iter().map(|e| e.1).sum();
        s.temp_files = scan.temp_files;
        s.temp_bytes = scan.temp_bytes;
        Ok(s)
    }

    /// [`try_stats`](Self::try_stats) for callers that want the counters
    /// regardless: on an error the on-disk totals are left at 0. Use
    /// `try_stats` where the totals are reported to a user.
    pub fn stats(&self) -> DiskStats {
        self.try_stats().unwrap_or_else(|_| self.counters())
    }
}

/// Why an entry must not be read, if it must not.
fn entry_problem(st: &fsx::Stat) -> Option<RejectReason> {
    match st.kind {
        fsx::Kind::File => {}
        fsx::Kind::Symlink => return Some(RejectReason::Symlink),
        kind => {
            return Some(RejectReason::NotARegularFile {
                kind: kind.describe(),
            })
        }
    }
    let uid = fsx::euid();
    if st.uid != uid {
        return Some(RejectReason::ForeignOwner { owner: st.uid, uid });
    }
    if st.mode & 0o022 != 0 {
        return Some(RejectReason::WritableByOthers { mode: st.mode });
    }
    if st.size > MAX_ENTRY_BYTES {
        return Some(RejectReason::TooLarge {
            size: st.size,
            max: MAX_ENTRY_BYTES,
        });
    }
    None
}

fn is_entry_name(name: &str) -> bool {
    name.strip_suffix(ENTRY_EXTENSION)
        .and_then(|s| s.strip_suffix('.'))
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Total file size of an entry.
pub fn encoded_len(key: &str, payload_len: usize) -> u64 {
    (HEADER_FIXED_LEN + key.len()) as u64 + payload_len as u64
}

fn encode_header(key: &str, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_FIXED_LEN + key.len());
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&(key.len() as u32).to_le_bytes());
    h.extend_from_slice(key.as_bytes());
    h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    h.extend_from_slice(blake3::hash(payload).as_bytes());
    h
}

/// The complete bytes of an entry file for `key` (header + payload).
pub fn encode_entry(key: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = encode_header(key, payload);
    v.extend_from_slice(payload);
    v
}

/// Validates an entry file for `key` and returns its payload.
pub fn decode_entry<'a>(key: &str, bytes: &'a [u8]) -> Result<&'a [u8], CorruptReason> {
    let actual = bytes.len() as u64;
    let truncated = |expected: u64| CorruptReason::Truncated { expected, actual };
    if bytes.is_empty() {
        return Err(CorruptReason::Empty);
    }
    let m = bytes.len().min(MAGIC.len());
    if bytes[..m] != MAGIC[..m] {
        return Err(CorruptReason::BadMagic);
    }
    if bytes.len() < 16 {
        // Report against the smallest possible header.
        return Err(truncated(HEADER_FIXED_LEN as u64));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if version != FORMAT_VERSION {
        return Err(CorruptReason::OtherVersion { found: version });
    }
    let key_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    if key_len != key.len() {
        return Err(CorruptReason::OtherKey);
    }
    let header_len = HEADER_FIXED_LEN + key_len;
    if bytes.len() < header_len {
        return Err(truncated(header_len as u64));
    }
    if &bytes[16..16 + key_len] != key.as_bytes() {
        return Err(CorruptReason::OtherKey);
    }
    let p = 16 + key_len;
    let payload_len = u64::from_le_bytes(bytes[p..p + 8].try_into().unwrap());
    let expected = (header_len as u64).saturating_add(payload_len);
    if actual < expected {
        return Err(truncated(expected));
    }
    if actual > expected {
        return Err(CorruptReason::TrailingData { expected, actual });
    }
    let sum: [u8; 32] = bytes[p + 8..p + 40].try_into().unwrap();
    let payload = &bytes[header_len..];
    if blake3::hash(payload) != blake3::Hash::from_bytes(sum) {
        return Err(CorruptReason::ChecksumMismatch);
    }
    Ok(payload)
}

/// Removes `name` only if it still is the file `st` describes, so a bad
/// entry that another process has just replaced with a good one survives.
fn remove_if_same(dir: &fsx::Dir, name: &str, st: &fsx::Stat) {
    match dir.stat_at(name) {
        Ok(now) if now.dev == st.dev && now.ino == st.ino && now.kind != fsx::Kind::Dir => {
            let _ = dir.remove(name);
        }
        _ => {}
    }
}

/// Creates `dir` (mode 0700) or checks an existing one. `Ok(Some(w))`: do not
/// use the directory.
fn prepare_dir(dir: &Path) -> Result<Option<DiskCacheWarning>, DiskCacheError> {
    match fs::metadata(dir) {
        Ok(meta) => Ok(check_existing(dir, &meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent)
                    .map_err(|e| DiskCacheError::io("create directory", parent, e))?;
            }
            let mut b = fs::DirBuilder::new();
            #[cfg(unix)]
            {
                use std::os::unix::fs::DirBuilderExt;
                b.mode(0o700);
            }
            match b.create(dir) {
                Ok(()) => {
                    // Exactly 0700 regardless of the umask.
                    #[cfg(unix)]
                    {
                        use std::os::unix::fs::PermissionsExt;
                        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                            .map_err(|e| DiskCacheError::io("chmod 700", dir, e))?;
                    }
                    Ok(None)
                }
                // Another process created it meanwhile: check it like any other.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let meta = fs::metadata(dir)
                        .map_err(|e| DiskCacheError::io("inspect directory", dir, e))?;
                    Ok(check_existing(dir, &meta))
                }
                Err(e) => Err(DiskCacheError::io("create directory", dir, e)),
            }
        }
        Err(e) => Err(DiskCacheError::io("inspect directory", dir, e)),
    }
}

fn check_existing(dir: &Path, meta: &fs::Metadata) -> Option<DiskCacheWarning> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        dir_problem(dir, meta.is_dir(), meta.uid(), meta.mode() & 0o7777)
    }
    #[cfg(not(unix))]
    {
        dir_problem(dir, meta.is_dir(), fsx::euid(), 0o700)
    }
}

/// The one rule for the directory: a directory, owned by the effective uid,
/// not writable by group or others.
fn dir_problem(dir: &Path, is_dir: bool, owner: u32, mode: u32) -> Option<DiskCacheWarning> {
    if !is_dir {
        return Some(DiskCacheWarning::NotADirectory {
            dir: dir.to_path_buf(),
        });
    }
    let uid = fsx::euid();
    if owner != uid {
        return Some(DiskCacheWarning::NotOwned {
            dir: dir.to_path_buf(),
            owner,
            uid,
        });
    }
    if mode & 0o022 != 0 {
        return Some(DiskCacheWarning::InsecurePermissions {
            dir: dir.to_path_buf(),
            mode,
        });
    }
    None
}

/// Prints each distinct warning once per process.
fn warn_once(msg: &str) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    let first = seen
        .lock()
        .map(|mut s| s.insert(msg.to_string()))
        .unwrap_or(true);
    if first {
        eprintln!("fraglink: warning: {msg}");
    }
}

/// Descriptor-relative file operations (POSIX `*at` calls).
#[cfg(unix)]
mod fsx {
    use std::ffi::CString;
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    /// An open directory; every operation below is relative to it.
    pub struct Dir(OwnedFd);

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        File,
        Dir,
        Symlink,
        Fifo,
        Socket,
        CharDevice,
        BlockDevice,
        Other,
    }

    impl Kind {
        pub fn describe(self) -> &'static str {
            match self {
                Kind::File => "regular file",
                Kind::Dir => "directory",
                Kind::Symlink => "symbolic link",
                Kind::Fifo => "FIFO",
                Kind::Socket => "socket",
                Kind::CharDevice => "character device",
                Kind::BlockDevice => "block device",
                Kind::Other => "special file",
            }
        }
    }

    #[derive(Debug, Clone, Copy)]
    pub struct Stat {
        pub kind: Kind,
        pub uid: u32,
        /// Permission bits (`& 0o7777`).
        pub mode: u32,
        pub size: u64,
        pub mtime: SystemTime,
        pub dev: u64,
        pub ino: u64,
    }

    fn cstring(bytes: &[u8]) -> io::Result<CString> {
        CString::new(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))
    }

    fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    fn convert(st: &libc::stat) -> Stat {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => Kind::Other,
        };
        let secs = st.st_mtime as i64;
        let nanos = (st.st_mtime_nsec as i64).clamp(0, 999_999_999) as u32;
        let mtime = if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nanos)
        } else {
            UNIX_EPOCH
        };
        Stat {
            kind,
            uid: st.st_uid as u32,
            mode: (st.st_mode as u32) & 0o7777,
            size: (st.st_size as i64).max(0) as u64,
            mtime,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }

    fn fstat(fd: libc::c_int) -> io::Result<Stat> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fd is open; st is a valid out-pointer.
        cvt(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
        // SAFETY: fstat succeeded and filled st.
        Ok(convert(unsafe { &st.assume_init() }))
    }

    pub fn euid() -> u32 {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }

    /// `open(2)` with `O_NOFOLLOW` refuses a final symlink with `ELOOP`
    /// (`EMLINK` on FreeBSD and NetBSD).
    pub fn is_symlink_error(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EMLINK))
    }

    impl Dir {
        /// Opens `path` as a directory descriptor (`O_PATH` on Linux, which
        /// needs only search permission).
        pub fn open(path: &Path) -> io::Result<Dir> {
            let c = cstring(path.as_os_str().as_bytes())?;
            #[cfg(any(target_os = "linux", target_os = "android"))]
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
            // SAFETY: c is NUL-terminated; the result is checked.
            let fd = cvt(unsafe { libc::open(c.as_ptr(), flags) })?;
            // SAFETY: fd was just opened and is owned by nobody else.
            Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
        }

        pub fn stat(&self) -> io::Result<Stat> {
            fstat(self.0.as_raw_fd())
        }

        /// `fstatat(AT_SYMLINK_NOFOLLOW)`: a symlink is reported, not followed.
        pub fn stat_at(&self, name: &str) -> io::Result<Stat> {
            let c = cstring(name.as_bytes())?;
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: the descriptor is open, c is NUL-terminated, st is a
            // valid out-pointer.
            cvt(unsafe {
                libc::fstatat(
                    self.0.as_raw_fd(),
                    c.as_ptr(),
                    st.as_mut_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            // SAFETY: fstatat succeeded and filled st.
            Ok(convert(unsafe { &st.assume_init() }))
        }

        /// Opens an entry for reading without following a symlink, without
        /// blocking on a FIFO, and returns it with its `fstat`.
        pub fn open_entry(&self, name: &str) -> io::Result<(File, Stat)> {
            let c = cstring(name.as_bytes())?;
            let flags = libc::O_RDONLY
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_CLOEXEC
                | libc::O_NOCTTY;
            // SAFETY: as in `stat_at`; the result is checked.
            let fd = cvt(unsafe { libc::openat(self.0.as_raw_fd(), c.as_ptr(), flags) })?;
            // SAFETY: fd was just opened and is owned by nobody else.
            let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            let st = fstat(file.as_raw_fd())?;
            Ok((file, st))
        }

        /// Creates `name` exclusively, mode 0600, never through a symlink.
        pub fn create_new(&self, name: &str) -> io::Result<File> {
            let c = cstring(name.as_bytes())?;
            let flags =
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            // SAFETY: as in `stat_at`; the mode is passed as the variadic
            // argument O_CREAT requires.
            let fd = cvt(unsafe {
                libc::openat(self.0.as_raw_fd(), c.as_ptr(), flags, 0o600 as libc::c_uint)
            })?;
            // SAFETY: fd was just opened and is owned by nobody else.
            Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
        }

        pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
            let (a, b) = (cstring(from.as_bytes())?, cstring(to.as_bytes())?);
            let fd = self.0.as_raw_fd();
            // SAFETY: both names are NUL-terminated, the descriptor is open.
            cvt(unsafe { libc::renameat(fd, a.as_ptr(), fd, b.as_ptr()) }).map(drop)
        }

        /// `unlinkat` (never removes a directory).
        pub fn remove(&self, name: &str) -> io::Result<()> {
            let c = cstring(name.as_bytes())?;
            // SAFETY: as in `stat_at`.
            cvt(unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
        }
    }
}

/// Elsewhere the disk cache is always bypassed (see [`DiskCache::open`]);
/// these only have to compile.
#[cfg(not(unix))]
mod fsx {
    use std::fs::File;
    use std::io;
    use std::path::Path;
    use std::time::SystemTime;

    pub struct Dir;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        File,
        Dir,
        Symlink,
    }

    impl Kind {
        pub fn describe(self) -> &'static str {
            "special file"
        }
    }

    #[derive(Debug, Clone, Copy)]
    pub struct Stat {
        pub kind: Kind,
        pub uid: u32,
        pub mode: u32,
        pub size: u64,
        pub mtime: SystemTime,
        pub dev: u64,
        pub ino: u64,
    }

    fn unsupported<T>() -> io::Result<T> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the disk cache needs a Unix platform",
        ))
    }

    pub fn euid() -> u32 {
        0
    }

    pub fn is_symlink_error(_: &io::Error) -> bool {
        false
    }

    impl Dir {
        pub fn open(_: &Path) -> io::Result<Dir> {
            unsupported()
        }
        pub fn stat(&self) -> io::Result<Stat> {
            unsupported()
        }
        pub fn stat_at(&self, _: &str) -> io::Result<Stat> {
            unsupported()
        }
        pub fn open_entry(&self, _: &str) -> io::Result<(File, Stat)> {
            unsupported()
        }
        pub fn create_new(&self, _: &str) -> io::Result<File> {
            unsupported()
        }
        pub fn rename(&self, _: &str, _: &str) -> io::Result<()> {
            unsupported()
        }
        pub fn remove(&self, _: &str) -> io::Result<()> {
            unsupported()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| m.get(name).cloned()
    }

    type Seen = std::rc::Rc<std::cell::RefCell<Vec<String>>>;

    /// Like `vars`, and records every variable that was consulted.
    fn recording(pairs: &[(&str, &str)]) -> (impl Fn(&str) -> Option<OsString>, Seen) {
        let seen = Seen::default();
        let get = vars(pairs);
        let log = seen.clone();
        (
            move |name: &str| {
                log.borrow_mut().push(name.to_string());
                get(name)
            },
            seen,
        )
    }

    #[test]
    fn parse_sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("12345"), Ok(12345));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size(" 2g "), Ok(2 << 30));
        assert_eq!(parse_size("1 GB"), Ok(1 << 30));
        assert_eq!(parse_size("3T"), Ok(3 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("-5").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("10X").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn config_dir_precedence() {
        let c = DiskCacheConfig::from_vars(vars(&[
            (ENV_DIR, "/x/explicit"),
            ("XDG_CACHE_HOME", "/x/xdg"),
            ("HOME", "/x/home"),
        ]))
        .unwrap();
        assert_eq!(c.dir, PathBuf::from("/x/explicit"));
        assert!(c.enabled);
        assert_eq!(c.max_bytes, DEFAULT_MAX_BYTES);

        if !cfg!(target_os = "macos") {
            let c = DiskCacheConfig::from_vars(vars(&[
                ("XDG_CACHE_HOME", "/x/xdg"),
                ("HOME", "/x/home"),
            ]))
            .unwrap();
            assert_eq!(c.dir, PathBuf::from("/x/xdg/fraglink"));
            // Relative XDG_CACHE_HOME is ignored, per the XDG spec.
            let c =
                DiskCacheConfig::from_vars(vars(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/x/home")]))
                    .unwrap();
            assert_eq!(c.dir, PathBuf::from("/x/home/.cache/fraglink"));
            // Empty is unset.
            let c = DiskCacheConfig::from_vars(vars(&[
                (ENV_DIR, ""),
                ("XDG_CACHE_HOME", ""),
                ("HOME", "/x/home"),
            ]))
            .unwrap();
            assert_eq!(c.dir, PathBuf::from("/x/home/.cache/fraglink"));
        }
    }

    #[test]
    fn config_no_dir() {
        let e = DiskCacheConfig::from_vars(vars(&[])).unwrap_err();
        assert!(matches!(e, DiskCacheError::NoCacheDir), "{e}");
        assert!(e.to_string().contains(ENV_DIR));
        // A relative HOME gives no directory either.
        let e = DiskCacheConfig::from_vars(vars(&[("HOME", "home")])).unwrap_err();
        assert!(matches!(e, DiskCacheError::NoCacheDir), "{e}");
        // Disabled never fails.
        let c = DiskCacheConfig::from_vars(vars(&[(ENV_DISABLE, "1")])).unwrap();
        assert!(!c.enabled);
    }

    #[test]
    fn config_disable_values() {
        for (v, enabled) in [
            ("1", false),
            ("yes", false),
            ("true", false),
            (" On ", false),
            ("0", true),
            ("false", true),
            ("FALSE", true),
            (" 0 ", true),
            ("no", true),
            ("off", true),
            ("", true),
        ] {
            let c = DiskCacheConfig::from_vars(vars(&[(ENV_DIR, "/d"), (ENV_DISABLE, v)])).unwrap();
            assert_eq!(c.enabled, enabled, "FRAGLINK_CACHE_DISABLE={v:?}");
        }
        // Issue 12 finding 8: an unrecognised value is an error naming the
        // variable and the value, not a silent "disabled".
        for v in ["anything", "2", "disable please"] {
            let e =
                DiskCacheConfig::from_vars(vars(&[(ENV_DIR, "/d"), (ENV_DISABLE, v)])).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(
                    e,
                    DiskCacheError::InvalidEnv {
                        var: ENV_DISABLE,
                        ..
                    }
                ),
                "{msg}"
            );
            assert!(msg.contains(ENV_DISABLE) && msg.contains(v), "{msg}");
        }
    }

    #[test]
    fn only_consulted_variables_are_read() {
        // Disabled: nothing else is read, so nothing else can fail.
        let (get, seen) = recording(&[
            (ENV_DISABLE, "1"),
            (ENV_MAX_BYTES, "lots"),
            (ENV_DIR, "/d"),
            ("HOME", "relative"),
        ]);
        let c = DiskCacheConfig::from_vars(get).unwrap();
        assert!(!c.enabled);
        assert_eq!(*seen.borrow(), [ENV_DISABLE]);
        // An explicit directory: HOME and XDG_CACHE_HOME are not read.
        let (get, seen) = recording(&[(ENV_DIR, "/d")]);
        DiskCacheConfig::from_vars(get).unwrap();
        assert_eq!(*seen.borrow(), [ENV_DISABLE, ENV_DIR, ENV_MAX_BYTES]);
        // No directory at all: the cap is never looked at.
        let (get, seen) = recording(&[(ENV_MAX_BYTES, "lots")]);
        let e = DiskCacheConfig::from_vars(get).unwrap_err();
        assert!(matches!(e, DiskCacheError::NoCacheDir), "{e}");
        assert!(!seen.borrow().iter().any(|v| v == ENV_MAX_BYTES));
    }

    #[cfg(unix)]
    #[test]
    fn paths_need_not_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        // Issue 12 finding 7: a HOME (or FRAGLINK_CACHE_DIR) that is not
        // UTF-8 is a path like any other.
        let home = OsString::from_vec(b"/home/\xff\xfeuser".to_vec());
        let dir = OsString::from_vec(b"/cache/\xff".to_vec());
        let (h, d) = (home.clone(), dir.clone());
        let c = DiskCacheConfig::from_vars(move |name| match name {
            "HOME" => Some(h.clone()),
            _ => None,
        })
        .unwrap();
        if !cfg!(target_os = "macos") {
            assert_eq!(c.dir, PathBuf::from(&home).join(".cache").join("fraglink"));
        }
        let c = DiskCacheConfig::from_vars(move |name| match name {
            ENV_DIR => Some(d.clone()),
            "HOME" => Some(home.clone()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.dir, PathBuf::from(dir));
        // A cap that is not UTF-8 is invalid, and says so.
        let e = DiskCacheConfig::from_vars(|name| match name {
            ENV_DIR => Some("/d".into()),
            ENV_MAX_BYTES => Some(OsString::from_vec(b"1\xffG".to_vec())),
            _ => None,
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                DiskCacheError::InvalidEnv {
                    var: ENV_MAX_BYTES,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn config_max_bytes() {
        let c =
            DiskCacheConfig::from_vars(vars(&[(ENV_DIR, "/d"), (ENV_MAX_BYTES, "256M")])).unwrap();
        assert_eq!(c.max_bytes, 256 << 20);
        let e = DiskCacheConfig::from_vars(vars(&[(ENV_DIR, "/d"), (ENV_MAX_BYTES, "lots")]))
            .unwrap_err();
        match &e {
            DiskCacheError::InvalidEnv { var, value, .. } => {
                assert_eq!(*var, ENV_MAX_BYTES);
                assert_eq!(value, "lots");
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(ENV_MAX_BYTES) && msg.contains("lots"), "{msg}");
        // Ignored when disabled.
        let c = DiskCacheConfig::from_vars(vars(&[
            (ENV_DIR, "/d"),
            (ENV_MAX_BYTES, "lots"),
            (ENV_DISABLE, "1"),
        ]))
        .unwrap();
        assert!(!c.enabled);
    }

    #[test]
    fn entry_roundtrip_and_layout() {
        let key = "k\u{e9}y";
        let payload = b"cubin bytes";
        let e = encode_entry(key, payload);
        assert_eq!(e.len() as u64, encoded_len(key, payload.len()));
        assert_eq!(&e[..8], b"FRAGLINK");
        assert_eq!(&e[8..12], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(&e[12..16], &(key.len() as u32).to_le_bytes());
        assert_eq!(&e[16..16 + key.len()], key.as_bytes());
        assert_eq!(decode_entry(key, &e), Ok(&payload[..]));
        assert_eq!(decode_entry("other", &e), Err(CorruptReason::OtherKey));
        assert_eq!(decode_entry("kéZ", &e), Err(CorruptReason::OtherKey));
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let key = "arch=sm_90;frags=abc";
        let payload: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let e = encode_entry(key, &payload);
        for len in 0..e.len() {
            assert!(decode_entry(key, &e[..len]).is_err(), "truncated to {len}");
        }
        let mut long = e.clone();
        long.push(0);
        assert!(matches!(
            decode_entry(key, &long),
            Err(CorruptReason::TrailingData { .. })
        ));
        for byte in 0..e.len() {
            for bit in 0..8 {
                let mut f = e.clone();
                f[byte] ^= 1 << bit;
                assert!(decode_entry(key, &f).is_err(), "flip byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn entry_names() {
        let n = DiskCache::file_name("some key");
        assert!(is_entry_name(&n));
        assert!(n.ends_with(".cubin"));
        assert_eq!(n.len(), 64 + 6);
        assert!(!is_entry_name(".tmp-0123-1-2-3"));
        assert!(!is_entry_name("notes.cubin"));
    }

    #[test]
    fn disabled_cache() {
        let c = DiskCache::disabled();
        assert!(!c.is_enabled());
        assert_eq!(c.get("k"), DiskLookup::Disabled);
        c.put("k", b"x").unwrap();
        assert_eq!(c.clear().unwrap(), 0);
        assert_eq!(c.stats(), DiskStats::default());
    }

    #[test]
    fn send_sync() {
        fn check<T: Send + Sync>() {}
        check::<DiskCache>();
        check::<DiskCacheError>();
    }
}
