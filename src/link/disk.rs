//! Disk cache of linked cubins (DESIGN.md decision 8).
//!
//! # Location and configuration
//!
//! [`DiskCacheConfig::from_env`] reads:
//!
//! * `FRAGLINK_CACHE_DIR` — the cache directory, used as is.
//! * otherwise `$XDG_CACHE_HOME/fraglink` (only if `XDG_CACHE_HOME` is an
//!   absolute path, as the XDG spec requires), otherwise `$HOME/.cache/fraglink`
//!   (`$HOME/Library/Caches/fraglink` on macOS). If none of these can be
//!   determined, [`DiskCacheError::NoCacheDir`].
//! * `FRAGLINK_CACHE_DISABLE` — any non-empty value other than `0` / `false`
//!   (case-insensitive, surrounding whitespace ignored) disables the cache. A
//!   disabled configuration never fails: the other variables are then only
//!   interpreted on a best-effort basis.
//! * `FRAGLINK_CACHE_MAX_BYTES` — the size cap, default [`DEFAULT_MAX_BYTES`]
//!   (1 GiB). A plain byte count or a number with a binary suffix `K`, `M`,
//!   `G`, `T` (optionally `KiB`, `MB`, ...; all are powers of 1024). An invalid
//!   value is a hard, typed error ([`DiskCacheError::InvalidEnv`], naming the
//!   variable and the value) rather than a silent default: a cap the user
//!   asked for but did not get is worse than a clear message. `0` is valid and
//!   means nothing is ever stored.
//!
//! Empty variables are treated as unset.
//!
//! # Security
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
//! | 56 + K        | P         | payload (the cubin)                  |
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
//! with `O_EXCL`, mode `0600`), syncs it, and renames it over the final name.
//! `rename` is atomic, so a reader opens either the old complete file or the
//! new complete file, never a partial one; since a reader keeps the inode it
//! opened, a concurrent replacement does not disturb it. Any number of threads
//! and processes may share one directory.
//!
//! # Eviction
//!
//! The cap applies to the total size of `*.cubin` files (header included).
//! Recency is the file's mtime: set when written, bumped to "now" on every
//! hit. After each insert, while the total exceeds the cap, the entry with the
//! oldest mtime (ties broken by file name) is removed; the entry just written
//! is never evicted by its own insert. An entry larger than the cap on its own
//! is not stored ([`DiskCacheError::EntryTooLarge`]). Temporary files left by
//! crashed writers are removed once they are more than an hour old.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Magic bytes at the start of every entry.
pub const MAGIC: [u8; 8] = *b"FRAGLINK";
/// Version of the entry format written by this build.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the header excluding the key bytes.
pub const HEADER_FIXED_LEN: usize = 8 + 4 + 4 + 8 + 32;
/// Default size cap: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
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
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Errors of the disk cache. None of them is fatal for a caller: the linker
/// can always link afresh.
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
         XDG_CACHE_HOME (absolute) or HOME is set; set {ENV_DIR} or \
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
    /// The entry alone is larger than the cache's size cap; it is not stored.
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
    /// A path variable that is not valid UTF-8 is an
    /// [`InvalidEnv`](DiskCacheError::InvalidEnv) error rather than a
    /// silently mangled path.
    pub fn from_env() -> Result<Self, DiskCacheError> {
        for var in [ENV_DIR, "XDG_CACHE_HOME", "HOME"] {
            if let Some(v) = std::env::var_os(var) {
                if v.to_str().is_none() {
                    return Err(DiskCacheError::InvalidEnv {
                        var,
                        value: v.to_string_lossy().into_owned(),
                        reason: "not valid UTF-8".into(),
                    });
                }
            }
        }
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`from_env`](Self::from_env) with the environment given as a lookup
    /// function (pure, for tests and embedding).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, DiskCacheError> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());

        let disabled = get(ENV_DISABLE).is_some_and(|v| {
            let v = v.trim();
            !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
        });

        let max_bytes = match get(ENV_MAX_BYTES) {
            None => Ok(DEFAULT_MAX_BYTES),
            Some(v) => parse_size(&v).map_err(|reason| DiskCacheError::InvalidEnv {
                var: ENV_MAX_BYTES,
                value: v,
                reason,
            }),
        };

        let dir = if let Some(d) = get(ENV_DIR) {
            Some(PathBuf::from(d))
        } else {
            default_cache_root(&get).map(|root| root.join(CACHE_SUBDIR))
        };

        if disabled {
            return Ok(DiskCacheConfig {
                dir: dir.unwrap_or_default(),
                max_bytes: max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
                enabled: false,
            });
        }
        Ok(DiskCacheConfig {
            dir: dir.ok_or(DiskCacheError::NoCacheDir)?,
            max_bytes: max_bytes?,
            enabled: true,
        })
    }
}

/// The user's cache root (without the `fraglink` component).
fn default_cache_root(get: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
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

/// Why an entry was rejected.
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

/// Result of [`DiskCache::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskLookup {
    /// A verified payload.
    Hit(Vec<u8>),
    /// No entry (or it could not be read).
    Miss,
    /// An entry existed but was bad; it has been removed.
    Corrupt { reason: CorruptReason },
    /// The cache is disabled or bypassed.
    Disabled,
}

/// Counters of this process (`hits` .. `errors`) and on-disk totals
/// (`entries`, `bytes`, measured when [`DiskCache::stats`] is called).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Entry files currently in the directory.
    pub entries: u64,
    /// Their total size in bytes.
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// Bad entries detected (and removed) by `get`.
    pub corrupt: u64,
    /// Entries written by `put`.
    pub writes: u64,
    /// Entries removed to respect the size cap.
    pub evictions: u64,
    /// I/O errors in `get` / `put` (non-fatal).
    pub errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    writes: AtomicU64,
    evictions: AtomicU64,
    errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
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
        let outcome = prepare_dir(&cache.dir).unwrap_or_else(|e| {
            Some(DiskCacheWarning::Unavailable {
                dir: cache.dir.clone(),
                error: match e {
                    DiskCacheError::Io { op, source, .. } => format!("cannot {op}: {source}"),
                    other => other.to_string(),
                },
            })
        });
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

    /// The bypass warning, if the directory was unsafe.
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

    /// Looks `key` up. A bad entry is removed and reported, never returned;
    /// a hit refreshes the entry's recency (mtime).
    pub fn get(&self, key: &str) -> DiskLookup {
        if !self.enabled {
            return DiskLookup::Disabled;
        }
        let path = self.entry_path(key);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    bump(&self.counters.errors);
                }
                bump(&self.counters.misses);
                return DiskLookup::Miss;
            }
        };
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            bump(&self.counters.errors);
            bump(&self.counters.misses);
            return DiskLookup::Miss;
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
                remove_if_same_file(&path, &file);
                DiskLookup::Corrupt { reason }
            }
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
        if size > self.max_bytes {
            return Err(DiskCacheError::EntryTooLarge {
                path,
                size,
                max_bytes: self.max_bytes,
            });
        }
        let result = self.write_atomic(&name, &path, key, payload);
        match &result {
            Ok(()) => bump(&self.counters.writes),
            Err(_) => bump(&self.counters.errors),
        }
        result?;
        self.evict(Some(&name))
    }

    fn write_atomic(
        &self,
        name: &str,
        path: &Path,
        key: &str,
        payload: &[u8],
    ) -> Result<(), DiskCacheError> {
        let (tmp_path, mut file) = self.create_temp(&name[..16])?;
        let written = (|| {
            let header = encode_header(key, payload);
            file.write_all(&header)?;
            file.write_all(payload)?;
            file.sync_data()
        })();
        drop(file);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp_path);
            return Err(DiskCacheError::io("write", &tmp_path, e));
        }
        if let Err(e) = fs::rename(&tmp_path, path) {
            let _ = fs::remove_file(&tmp_path);
            return Err(DiskCacheError::io("rename into place", path, e));
        }
        Ok(())
    }

    fn create_temp(&self, tag: &str) -> Result<(PathBuf, File), DiskCacheError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let mut last_err = None;
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let tmp = self
                .dir
                .join(format!("{TEMP_PREFIX}{tag}-{pid}-{n}-{nanos:09}"));
            let mut opts = OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            match opts.open(&tmp) {
                Ok(f) => return Ok((tmp, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some((tmp, e)),
                Err(e) => return Err(DiskCacheError::io("create temporary file", &tmp, e)),
            }
        }
        let (tmp, e) = last_err.expect("loop ran");
        Err(DiskCacheError::io("create temporary file", &tmp, e))
    }

    /// Lists entry files (name, size, mtime); removes stale temporaries.
    fn scan(&self) -> Result<Vec<(String, u64, SystemTime)>, DiskCacheError> {
        let rd = fs::read_dir(&self.dir)
            .map_err(|e| DiskCacheError::io("read directory", &self.dir, e))?;
        let now = SystemTime::now();
        let mut out = Vec::new();
        for ent in rd {
            let Ok(ent) = ent else { continue };
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            // Entries vanish under concurrent eviction; skip them.
            let Ok(meta) = ent.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
            if name.starts_with(TEMP_PREFIX) {
                if now
                    .duration_since(mtime)
                    .is_ok_and(|age| age > STALE_TEMP_AGE)
                {
                    let _ = fs::remove_file(ent.path());
                }
                continue;
            }
            if is_entry_name(name) {
                out.push((name.to_string(), meta.len(), mtime));
            }
        }
        Ok(out)
    }

    /// Removes the least recently used entries until under the cap, never
    /// `keep`.
    fn evict(&self, keep: Option<&str>) -> Result<(), DiskCacheError> {
        let mut entries = self.scan()?;
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
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
            match fs::remove_file(self.dir.join(&name)) {
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
    /// writers still in flight are left alone.
    pub fn clear(&self) -> Result<u64, DiskCacheError> {
        if !self.enabled {
            return Ok(0);
        }
        let mut removed = 0;
        for (name, size, _) in self.scan()? {
            let path = self.dir.join(&name);
            match fs::remove_file(&path) {
                Ok(()) => removed += size,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(DiskCacheError::io("remove", &path, e)),
            }
        }
        Ok(removed)
    }

    /// Counters of this process plus the current on-disk totals.
    pub fn stats(&self) -> DiskStats {
        let c = &self.counters;
        let mut s = DiskStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            corrupt: c.corrupt.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            ..DiskStats::default()
        };
        if self.enabled {
            if let Ok(entries) = self.scan() {
                s.entries = entries.len() as u64;
                s.bytes = entries.iter().map(|e| e.1).sum();
            }
        }
        s
    }
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

/// Removes `path` only if it still names the file we opened, so a corrupt
/// entry that another process has just replaced with a good one survives.
fn remove_if_same_file(path: &Path, opened: &File) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let (Ok(a), Ok(b)) = (opened.metadata(), fs::symlink_metadata(path)) else {
            return;
        };
        if a.dev() != b.dev() || a.ino() != b.ino() {
            return;
        }
    }
    #[cfg(not(unix))]
    let _ = opened;
    let _ = fs::remove_file(path);
}

/// Creates `dir` (mode 0700) or checks an existing one. `Ok(Some(w))`: do not
/// use the directory.
fn prepare_dir(dir: &Path) -> Result<Option<DiskCacheWarning>, DiskCacheError> {
    match fs::metadata(dir) {
        Ok(meta) => check_existing(dir, &meta),
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
                    check_existing(dir, &meta)
                }
                Err(e) => Err(DiskCacheError::io("create directory", dir, e)),
            }
        }
        Err(e) => Err(DiskCacheError::io("inspect directory", dir, e)),
    }
}

fn check_existing(
    dir: &Path,
    meta: &fs::Metadata,
) -> Result<Option<DiskCacheWarning>, DiskCacheError> {
    if !meta.is_dir() {
        return Ok(Some(DiskCacheWarning::NotADirectory {
            dir: dir.to_path_buf(),
        }));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if meta.uid() != uid {
            return Ok(Some(DiskCacheWarning::NotOwned {
                dir: dir.to_path_buf(),
                owner: meta.uid(),
                uid,
            }));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Ok(Some(DiskCacheWarning::InsecurePermissions {
                dir: dir.to_path_buf(),
                mode,
            }));
        }
    }
    Ok(None)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| m.get(name).cloned()
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
            ("anything", false),
            ("0", true),
            ("false", true),
            ("FALSE", true),
            (" 0 ", true),
            ("", true),
        ] {
            let c = DiskCacheConfig::from_vars(vars(&[(ENV_DIR, "/d"), (ENV_DISABLE, v)])).unwrap();
            assert_eq!(c.enabled, enabled, "FRAGLINK_CACHE_DISABLE={v:?}");
        }
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
