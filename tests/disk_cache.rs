//! Disk cache of linked cubins: format validation, directory security, LRU
//! eviction, and races between threads and between processes.
//!
//! Every test uses its own temporary directory and an explicit
//! [`DiskCacheConfig`]; nothing here touches the user's real cache.
#![cfg(unix)]

mod support;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use fraglink::link::disk::*;

const KEY: &str =
    "entry=scan_f32_u32_v4_k128;arch=sm_90;frags=0123abcd,4567ef01;opts=-lto;nvjitlink=12.9";

fn config(dir: &Path) -> DiskCacheConfig {
    DiskCacheConfig {
        dir: dir.to_path_buf(),
        max_bytes: 64 << 20,
        enabled: true,
    }
}

fn open(dir: &Path) -> DiskCache {
    let c = DiskCache::open(config(dir)).expect("open");
    assert!(c.is_enabled(), "warning: {:?}", c.warning());
    c
}

fn payload(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn set_mtime(path: &Path, t: SystemTime) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

fn set_mode(path: &Path, m: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(m)).unwrap();
}

fn dir_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

// ---------------------------------------------------------------- basics

#[test]
fn roundtrip() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let p = payload(10_000, 1);
    cache.put(KEY, &p).unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Hit(p.clone()));

    // File name is the hex blake3 of the key.
    let path = cache.entry_path(KEY);
    assert_eq!(path.parent().unwrap(), tmp.path());
    let name = path.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        name,
        format!("{}.cubin", blake3::hash(KEY.as_bytes()).to_hex())
    );
    assert_eq!(name, DiskCache::file_name(KEY));
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        encoded_len(KEY, p.len())
    );
    // Entries are private to the user.
    assert_eq!(mode(&path), 0o600);
    // Nothing else (no leftover temp files).
    assert_eq!(dir_files(tmp.path()), vec![name.to_string()]);

    // Overwrite with new contents.
    let q = payload(123, 2);
    cache.put(KEY, &q).unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Hit(q.clone()));

    // Another instance (another process, say) sees the same entry.
    let other = open(tmp.path());
    assert_eq!(other.get(KEY), DiskLookup::Hit(q));

    // Empty payloads and long, path-unsafe keys are fine.
    let weird = format!("../../etc/passwd\0/{}", "x".repeat(10_000));
    cache.put(&weird, &[]).unwrap();
    assert_eq!(cache.get(&weird), DiskLookup::Hit(vec![]));

    let s = cache.stats();
    assert_eq!(s.writes, 3);
    assert_eq!(s.hits, 3);
    assert_eq!(s.misses, 0);
    assert_eq!(s.corrupt, 0);
    assert_eq!(s.entries, 2);
    assert_eq!(s.bytes, encoded_len(KEY, 123) + encoded_len(&weird, 0));
}

#[test]
fn miss() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    assert_eq!(cache.get(KEY), DiskLookup::Miss);
    cache.put("another key", b"x").unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Miss);
    let s = cache.stats();
    assert_eq!((s.misses, s.hits, s.corrupt), (2, 0, 0));
}

/// `reject` removes the entry the caller refused, and only that one: an
/// entry another process wrote meanwhile (other content under the same
/// key) stays and is served.
#[test]
fn reject_removes_only_the_payload_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let (a, b) = (payload(300, 1), payload(300, 2));
    cache.put(KEY, &a).unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Hit(a.clone()));
    // Replaced by another process before the refusal of `a`.
    open(tmp.path()).put(KEY, &b).unwrap();
    cache.reject(KEY, "a stale check", &a);
    assert_eq!(cache.get(KEY), DiskLookup::Hit(b.clone()));
    // The refused payload itself goes.
    cache.reject(KEY, "a failing check", &b);
    assert_eq!(cache.get(KEY), DiskLookup::Miss);
    assert_eq!(cache.stats().rejected, 2);
    // Nothing there: nothing to remove, still counted.
    cache.reject(KEY, "again", &b);
    assert_eq!(cache.stats().rejected, 3);
}

/// `holds` says whether a lookup would find an entry, without counting or
/// touching anything; a disabled cache, a missing entry and one `get`
/// would refuse hold nothing.
#[test]
fn holds_looks_without_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    assert!(!cache.holds(KEY));
    cache.put(KEY, b"payload").unwrap();
    assert!(cache.holds(KEY));
    assert!(!cache.holds("another key"));
    let path = cache.entry_path(KEY);
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    set_mtime(&path, mtime - Duration::from_secs(3600));
    let before = fs::metadata(&path).unwrap().modified().unwrap();
    assert!(cache.holds(KEY));
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), before);
    let s = cache.stats();
    assert_eq!((s.misses, s.hits, s.rejected), (0, 0, 0));
    // An entry writable by others would be refused: not held.
    set_mode(&path, 0o666);
    assert!(!cache.holds(KEY));
    set_mode(&path, 0o600);
    assert!(cache.holds(KEY));
    let off = DiskCache::open(DiskCacheConfig {
        dir: tmp.path().to_path_buf(),
        max_bytes: 1 << 20,
        enabled: false,
    })
    .unwrap();
    assert!(!off.holds(KEY));
}

#[test]
fn disabled_config_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("never-created");
    let cache = DiskCache::open(DiskCacheConfig {
        dir: dir.clone(),
        max_bytes: 1 << 20,
        enabled: false,
    })
    .unwrap();
    assert!(!cache.is_enabled());
    assert!(cache.warning().is_none());
    assert_eq!(cache.get(KEY), DiskLookup::Disabled);
    cache.put(KEY, b"payload").unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Disabled);
    assert_eq!(cache.clear().unwrap(), 0);
    assert!(!dir.exists());
}

#[test]
fn from_vars_is_pure() {
    // The parsing behind from_env, without touching the process environment.
    let c = DiskCacheConfig::from_vars(|name| match name {
        "FRAGLINK_CACHE_DIR" => Some("/somewhere/cache".into()),
        "FRAGLINK_CACHE_MAX_BYTES" => Some("2G".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        c,
        DiskCacheConfig {
            dir: PathBuf::from("/somewhere/cache"),
            max_bytes: 2 << 30,
            enabled: true,
        }
    );
    let c = DiskCacheConfig::from_vars(|name| match name {
        "XDG_CACHE_HOME" => Some("/xdg".into()),
        "HOME" => Some("/home/u".into()),
        _ => None,
    })
    .unwrap();
    if cfg!(target_os = "macos") {
        assert_eq!(c.dir, PathBuf::from("/home/u/Library/Caches/fraglink"));
    } else {
        assert_eq!(c.dir, PathBuf::from("/xdg/fraglink"));
    }
    assert_eq!(c.max_bytes, DEFAULT_MAX_BYTES);
    let c = DiskCacheConfig::from_vars(|name| match name {
        "HOME" => Some("/home/u".into()),
        "FRAGLINK_CACHE_DISABLE" => Some("yes".into()),
        _ => None,
    })
    .unwrap();
    assert!(!c.enabled);
    let e = DiskCacheConfig::from_vars(|name| match name {
        "HOME" => Some("/home/u".into()),
        "FRAGLINK_CACHE_MAX_BYTES" => Some("12 parsecs".into()),
        _ => None,
    })
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            DiskCacheError::InvalidEnv {
                var: "FRAGLINK_CACHE_MAX_BYTES",
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("FRAGLINK_CACHE_MAX_BYTES") && msg.contains("12 parsecs"));
}

// ---------------------------------------------------------------- corruption

/// Stores a good entry, damages its file with `damage`, and checks that the
/// damage is detected with a reason accepted by `expect`, not returned, the
/// file removed, and that a fresh put + get works afterwards.
fn check_corruption(
    what: &str,
    damage: impl FnOnce(&Path, &[u8]),
    expect: impl Fn(&CorruptReason) -> bool,
) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let p = payload(4096, 7);
    cache.put(KEY, &p).unwrap();
    let path = cache.entry_path(KEY);
    let good = fs::read(&path).unwrap();
    damage(&path, &good);
    match cache.get(KEY) {
        DiskLookup::Corrupt { reason } => {
            assert!(expect(&reason), "{what}: unexpected reason {reason:?}");
            // The reason renders as something readable.
            assert!(!reason.to_string().is_empty());
        }
        other => panic!("{what}: expected Corrupt, got {:?}", short(&other)),
    }
    assert!(!path.exists(), "{what}: corrupt entry not removed");
    assert_eq!(cache.get(KEY), DiskLookup::Miss, "{what}");
    cache.put(KEY, &p).unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Hit(p), "{what}");
    let s = cache.stats();
    assert_eq!(s.corrupt, 1, "{what}");
    assert_eq!(s.hits, 1, "{what}");
}

fn short(l: &DiskLookup) -> String {
    match l {
        DiskLookup::Hit(b) => format!("Hit({} bytes)", b.len()),
        other => format!("{other:?}"),
    }
}

fn header_len() -> usize {
    HEADER_FIXED_LEN + KEY.len()
}

#[test]
fn truncated_entries_are_detected_and_removed() {
    let full = header_len() + 4096;
    let lengths = [
        1,
        3,                  // inside the magic
        8,                  // magic only
        10,                 // inside the version
        14,                 // inside the key length
        16,                 // before the key
        16 + KEY.len() / 2, // inside the key
        16 + KEY.len() + 4, // inside the payload length
        header_len() - 1,   // inside the checksum
        header_len(),       // header only
        header_len() + 1,
        full / 2,
        full - 1,
    ];
    for len in lengths {
        check_corruption(
            &format!("truncated to {len}"),
            |path, good| fs::write(path, &good[..len]).unwrap(),
            |r| matches!(r, CorruptReason::Truncated { actual, .. } if *actual == len as u64),
        );
    }
}

#[test]
fn empty_file_is_detected() {
    check_corruption(
        "empty",
        |path, _| fs::write(path, b"").unwrap(),
        |r| *r == CorruptReason::Empty,
    );
}

#[test]
fn garbage_file_is_detected() {
    check_corruption(
        "garbage",
        |path, _| fs::write(path, payload(5000, 99)).unwrap(),
        |r| *r == CorruptReason::BadMagic,
    );
}

#[test]
fn trailing_data_is_detected() {
    check_corruption(
        "trailing",
        |path, good| {
            let mut v = good.to_vec();
            v.extend_from_slice(b"extra");
            fs::write(path, v).unwrap()
        },
        |r| matches!(r, CorruptReason::TrailingData { .. }),
    );
}

fn flip(path: &Path, good: &[u8], byte: usize, bit: u8) {
    let mut v = good.to_vec();
    v[byte] ^= 1 << bit;
    fs::write(path, v).unwrap();
}

#[test]
fn flipped_payload_bit_is_detected() {
    for (byte, bit) in [(0, 0), (1000, 3), (4095, 7)] {
        check_corruption(
            &format!("payload byte {byte} bit {bit}"),
            |path, good| flip(path, good, header_len() + byte, bit),
            |r| *r == CorruptReason::ChecksumMismatch,
        );
    }
}

#[test]
fn flipped_header_bits_are_detected() {
    let k = KEY.len();
    // (offset, what we expect it to be reported as)
    type Expect = Box<dyn Fn(&CorruptReason) -> bool>;
    let cases: Vec<(usize, Expect)> = vec![
        (0, Box::new(|r| *r == CorruptReason::BadMagic)),
        (7, Box::new(|r| *r == CorruptReason::BadMagic)),
        (
            8,
            Box::new(|r| matches!(r, CorruptReason::OtherVersion { .. })),
        ),
        (
            11,
            Box::new(|r| matches!(r, CorruptReason::OtherVersion { .. })),
        ),
        (12, Box::new(|r| *r == CorruptReason::OtherKey)), // key length
        (16, Box::new(|r| *r == CorruptReason::OtherKey)), // key bytes
        (16 + k - 1, Box::new(|r| *r == CorruptReason::OtherKey)),
        (
            16 + k, // payload length, low byte
            Box::new(|r| {
                matches!(
                    r,
                    CorruptReason::Truncated { .. } | CorruptReason::TrailingData { .. }
                )
            }),
        ),
        (
            16 + k + 7, // payload length, high byte
            Box::new(|r| matches!(r, CorruptReason::Truncated { .. })),
        ),
        (
            24 + k, // checksum
            Box::new(|r| *r == CorruptReason::ChecksumMismatch),
        ),
        (
            24 + k + 31,
            Box::new(|r| *r == CorruptReason::ChecksumMismatch),
        ),
    ];
    for (offset, expect) in cases {
        for bit in [0u8, 5] {
            check_corruption(
                &format!("header byte {offset} bit {bit}"),
                |path, good| flip(path, good, offset, bit),
                &expect,
            );
        }
    }
}

#[test]
fn other_format_version_is_detected() {
    for v in [0u32, FORMAT_VERSION + 1, u32::MAX] {
        check_corruption(
            &format!("version {v}"),
            |path, good| {
                let mut b = good.to_vec();
                b[8..12].copy_from_slice(&v.to_le_bytes());
                fs::write(path, b).unwrap();
            },
            |r| *r == CorruptReason::OtherVersion { found: v },
        );
    }
}

#[test]
fn entry_for_another_key_is_detected() {
    // Simulates a file-name hash collision: A's entry under B's file name.
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let key_a = "key A";
    let key_b = "key B";
    cache.put(key_a, b"payload of A").unwrap();
    fs::rename(cache.entry_path(key_a), cache.entry_path(key_b)).unwrap();
    assert_eq!(
        cache.get(key_b),
        DiskLookup::Corrupt {
            reason: CorruptReason::OtherKey
        }
    );
    assert!(!cache.entry_path(key_b).exists());
    assert_eq!(cache.get(key_a), DiskLookup::Miss);
    assert_eq!(cache.get(key_b), DiskLookup::Miss);
    cache.put(key_b, b"payload of B").unwrap();
    assert_eq!(cache.get(key_b), DiskLookup::Hit(b"payload of B".to_vec()));

    // Same with a key of a different length but the same length field
    // semantics: a longer key's entry under a shorter key's name.
    let long = "a much longer key than the other";
    cache.put(long, b"L").unwrap();
    fs::rename(cache.entry_path(long), cache.entry_path(key_a)).unwrap();
    assert_eq!(
        cache.get(key_a),
        DiskLookup::Corrupt {
            reason: CorruptReason::OtherKey
        }
    );
    assert!(!cache.entry_path(key_a).exists());
    assert_eq!(cache.stats().corrupt, 2);
}

// ---------------------------------------------------------------- directory

#[test]
fn directory_is_created_0700() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a").join("b").join("fraglink");
    let cache = open(&dir);
    assert!(dir.is_dir());
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(cache.dir(), dir.as_path());
    assert!(cache.warning().is_none());
    assert!(cache.warning_kind().is_none());
    cache.put(KEY, b"x").unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Hit(b"x".to_vec()));
    // Re-opening an existing 0700 directory is fine and keeps its contents.
    let again = open(&dir);
    assert_eq!(again.get(KEY), DiskLookup::Hit(b"x".to_vec()));
}

#[test]
fn existing_private_directory_is_used() {
    // Readable but not writable by others: not a tampering risk.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o755);
    let cache = open(&dir);
    assert!(cache.warning().is_none());
    assert_eq!(mode(&dir), 0o755, "existing directory left as is");
}

fn assert_bypassed(cache: &DiskCache, dir: &Path) {
    assert!(!cache.is_enabled());
    let w = cache.warning().expect("a warning");
    assert!(w.contains(&dir.display().to_string()), "{w}");
    assert!(cache.warning_kind().is_some());
    assert_eq!(cache.get(KEY), DiskLookup::Disabled);
    cache.put(KEY, b"must not be written").unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Disabled);
    assert_eq!(cache.clear().unwrap(), 0);
    assert_eq!(cache.stats().writes, 0);
}

#[test]
fn world_writable_directory_is_bypassed() {
    let tmp = tempfile::tempdir().unwrap();
    for m in [0o777, 0o720, 0o702, 0o1777] {
        let dir = tmp.path().join(format!("d{m:o}"));
        fs::create_dir(&dir).unwrap();
        // A planted entry must never be read.
        let planted = dir.join(DiskCache::file_name(KEY));
        fs::write(&planted, encode_entry(KEY, b"planted")).unwrap();
        set_mode(&dir, m);
        let cache = DiskCache::open(config(&dir)).unwrap();
        assert_bypassed(&cache, &dir);
        assert_eq!(
            cache.warning_kind(),
            Some(&DiskCacheWarning::InsecurePermissions {
                dir: dir.clone(),
                mode: m
            })
        );
        assert!(cache.warning().unwrap().contains("mode"));
        assert_eq!(dir_files(&dir), vec![DiskCache::file_name(KEY)]);
        assert_eq!(fs::read(&planted).unwrap(), encode_entry(KEY, b"planted"));
        assert_eq!(mode(&dir), m, "permissions must not be changed");
    }
}

#[test]
fn directory_owned_by_another_user_is_bypassed() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("note: not running as root; skipping the foreign-owner case (needs chown)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("foreign");
    fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o700);
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 1, 1) }, 0);
    let cache = DiskCache::open(config(&dir)).unwrap();
    assert_bypassed(&cache, &dir);
    assert_eq!(
        cache.warning_kind(),
        Some(&DiskCacheWarning::NotOwned {
            dir: dir.clone(),
            owner: 1,
            uid: 0
        })
    );
    assert!(cache.warning().unwrap().contains("uid 1"));
    assert!(dir_files(&dir).is_empty());
}

#[test]
fn non_directory_and_uncreatable_paths_are_bypassed() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let cache = DiskCache::open(config(&file)).unwrap();
    assert_bypassed(&cache, &file);
    assert!(matches!(
        cache.warning_kind(),
        Some(DiskCacheWarning::NotADirectory { .. })
    ));
    assert_eq!(fs::read(&file).unwrap(), b"x");

    // A parent that is a file: the directory cannot be created. The cache is
    // an optimisation, so this is a warning, not an error.
    let below = file.join("sub").join("fraglink");
    let cache = DiskCache::open(config(&below)).unwrap();
    assert_bypassed(&cache, &below);
    assert!(matches!(
        cache.warning_kind(),
        Some(DiskCacheWarning::Unavailable { .. })
    ));
}

// ---------------------------------------------------------------- size cap

fn key(i: usize) -> String {
    format!("key-{i}")
}

#[test]
fn size_cap_evicts_least_recently_used() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = encoded_len(&key(0), 1000);
    let cache = DiskCache::open(DiskCacheConfig {
        dir: tmp.path().to_path_buf(),
        max_bytes: 3 * entry + 100,
        enabled: true,
    })
    .unwrap();
    for i in 0..3 {
        cache.put(&key(i), &payload(1000, i as u8)).unwrap();
    }
    assert_eq!(cache.stats().evictions, 0);
    // Deterministic ages: 0 oldest, 2 newest.
    let now = SystemTime::now();
    for i in 0..3 {
        set_mtime(
            &cache.entry_path(&key(i)),
            now - Duration::from_secs(1000 - 100 * i as u64),
        );
    }
    // Reading 0 makes it the most recently used.
    assert_eq!(cache.get(&key(0)), DiskLookup::Hit(payload(1000, 0)));
    cache.put(&key(3), &payload(1000, 3)).unwrap();

    assert_eq!(cache.get(&key(1)), DiskLookup::Miss, "LRU entry evicted");
    for i in [0, 2, 3] {
        assert_eq!(
            cache.get(&key(i)),
            DiskLookup::Hit(payload(1000, i as u8)),
            "entry {i} kept"
        );
    }
    let s = cache.stats();
    assert_eq!(s.evictions, 1);
    assert_eq!(s.entries, 3);
    assert_eq!(s.bytes, 3 * entry);
    assert!(s.bytes <= cache.max_bytes());
}

#[test]
fn size_cap_evicts_several_oldest_first() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = encoded_len(&key(0), 500);
    {
        let big = open(tmp.path());
        for i in 0..6 {
            big.put(&key(i), &payload(500, i as u8)).unwrap();
        }
    }
    // Scrambled ages: oldest first is 4, 1, 5, 0, 3, 2.
    let now = SystemTime::now();
    for (rank, i) in [4, 1, 5, 0, 3, 2].into_iter().enumerate() {
        set_mtime(
            &tmp.path().join(DiskCache::file_name(&key(i))),
            now - Duration::from_secs(600 - 60 * rank as u64),
        );
    }
    // A smaller cap: room for 3 entries. Inserting a 7th keeps it and the two
    // most recently used (3 and 2).
    let small = DiskCache::open(DiskCacheConfig {
        dir: tmp.path().to_path_buf(),
        max_bytes: 3 * entry,
        enabled: true,
    })
    .unwrap();
    small.put(&key(6), &payload(500, 6)).unwrap();
    assert_eq!(small.stats().evictions, 4);
    for i in [4, 1, 5, 0] {
        assert_eq!(small.get(&key(i)), DiskLookup::Miss, "{i} evicted");
    }
    for i in [2, 3, 6] {
        assert!(matches!(small.get(&key(i)), DiskLookup::Hit(_)), "{i} kept");
    }
    assert_eq!(small.stats().bytes, 3 * entry);
}

#[test]
fn entry_larger_than_cap_is_not_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(DiskCacheConfig {
        dir: tmp.path().to_path_buf(),
        max_bytes: 1000,
        enabled: true,
    })
    .unwrap();
    cache.put("small", b"fits").unwrap();
    let e = cache.put(KEY, &payload(2000, 0)).unwrap_err();
    assert!(
        matches!(
            e,
            DiskCacheError::EntryTooLarge {
                max_bytes: 1000,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("1000"));
    assert_eq!(cache.get(KEY), DiskLookup::Miss);
    // The existing entry was not evicted to make room for nothing.
    assert_eq!(cache.get("small"), DiskLookup::Hit(b"fits".to_vec()));
}

// ---------------------------------------------------------------- clear, temps

#[test]
fn clear_removes_entries_only() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let mut total = 0;
    for i in 0..3 {
        cache.put(&key(i), &payload(100 * (i + 1), 0)).unwrap();
        total += encoded_len(&key(i), 100 * (i + 1));
    }
    fs::write(tmp.path().join("README"), b"not an entry").unwrap();
    assert_eq!(cache.stats().bytes, total);
    assert_eq!(cache.clear().unwrap(), total);
    for i in 0..3 {
        assert_eq!(cache.get(&key(i)), DiskLookup::Miss);
    }
    let s = cache.stats();
    assert_eq!((s.entries, s.bytes), (0, 0));
    assert_eq!(dir_files(tmp.path()), vec!["README".to_string()]);
    assert_eq!(cache.clear().unwrap(), 0);
}

#[test]
fn stale_temp_files_are_cleaned_fresh_ones_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let stale = tmp.path().join(".tmp-0123456789abcdef-1-0-000000000");
    let fresh = tmp.path().join(".tmp-0123456789abcdef-2-0-000000000");
    fs::write(&stale, b"partial").unwrap();
    fs::write(&fresh, b"in flight").unwrap();
    set_mtime(&stale, SystemTime::now() - Duration::from_secs(3 * 3600));
    cache.put(KEY, b"x").unwrap();
    assert!(!stale.exists());
    assert!(fresh.exists(), "another writer's temp file must survive");
    // Temp files are not entries.
    assert_eq!(cache.stats().entries, 1);
    cache.clear().unwrap();
    assert!(fresh.exists());
}

// ---------------------------------------------------------------- races

#[test]
fn threads_race_on_one_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    const WRITERS: usize = 6;
    // Each writer has its own (complete, valid) payload for the same key: a
    // reader must see exactly one of them, never a mix.
    let payloads: Vec<Vec<u8>> = (0..WRITERS)
        .map(|i| payload(64 * 1024 + i * 1024, i as u8 * 31))
        .collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for p in &payloads {
            let (cache, done) = (&cache, &done);
            s.spawn(move || {
                for _ in 0..50 {
                    cache.put(KEY, p).unwrap();
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        for _ in 0..3 {
            let (cache, done, payloads) = (&cache, &done, &payloads);
            s.spawn(move || {
                let mut reads = 0;
                while done.load(std::sync::atomic::Ordering::SeqCst) < WRITERS || reads < 10 {
                    match cache.get(KEY) {
                        DiskLookup::Miss => {}
                        DiskLookup::Hit(b) => assert!(payloads.contains(&b), "torn read"),
                        other => panic!("reader saw {:?}", short(&other)),
                    }
                    reads += 1;
                }
            });
        }
    });
    match cache.get(KEY) {
        DiskLookup::Hit(b) => assert!(payloads.contains(&b)),
        other => panic!("final read {:?}", short(&other)),
    }
    let s = cache.stats();
    assert_eq!(s.corrupt, 0);
    assert_eq!(s.errors, 0);
    assert_eq!(s.writes, (WRITERS * 50) as u64);
    assert_eq!(dir_files(tmp.path()), vec![DiskCache::file_name(KEY)]);
}

const CHILD_ENV: &str = "FRAGLINK_DISK_RACE_CHILD_DIR";
const RACE_TEST: &str = "processes_race_on_one_key";
const RACE_PROCS: usize = 5;
const RACE_PUTS: usize = 50;

fn race_payload() -> Vec<u8> {
    payload(256 * 1024, 0x5a)
}

/// Child mode of [`processes_race_on_one_key`]: wait for the parent's go
/// signal, then write the key repeatedly (checking our own reads too).
fn race_child(dir: &Path) {
    let go = dir.with_extension("go");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !go.exists() {
        assert!(Instant::now() < deadline, "no go signal");
        std::thread::sleep(Duration::from_millis(1));
    }
    let cache = open(dir);
    let p = race_payload();
    for _ in 0..RACE_PUTS {
        cache.put(KEY, &p).unwrap();
        match cache.get(KEY) {
            DiskLookup::Hit(b) => assert!(b == p, "child: wrong payload"),
            DiskLookup::Miss => {}
            other => panic!("child saw {:?}", short(&other)),
        }
    }
    assert_eq!(cache.stats().corrupt, 0);
}

/// Several processes write the same key while this one reads it. The test
/// binary re-executes itself (`current_exe() --exact processes_race_on_one_key`)
/// with `FRAGLINK_DISK_RACE_CHILD_DIR` set, which switches this same test
/// into child mode.
#[test]
fn processes_race_on_one_key() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        race_child(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let cache = open(&dir);
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..RACE_PROCS)
        .map(|_| {
            Command::new(&exe)
                .args([RACE_TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, &dir)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn child test process")
        })
        .collect();
    fs::write(dir.with_extension("go"), b"").unwrap();

    let expected = race_payload();
    let (mut hits, mut misses) = (0u64, 0u64);
    let mut statuses = vec![None; RACE_PROCS];
    let deadline = Instant::now() + Duration::from_secs(300);
    while statuses.iter().any(Option::is_none) {
        match cache.get(KEY) {
            DiskLookup::Miss => misses += 1,
            DiskLookup::Hit(b) => {
                assert!(b == expected, "parent read a wrong payload");
                hits += 1;
            }
            other => {
                for c in &mut children {
                    let _ = c.kill();
                }
                panic!("parent saw {:?}", short(&other));
            }
        }
        for (c, st) in children.iter_mut().zip(statuses.iter_mut()) {
            if st.is_none() {
                *st = c.try_wait().unwrap();
            }
        }
        assert!(Instant::now() < deadline, "children did not finish");
    }
    for st in statuses {
        assert!(st.unwrap().success(), "a child failed: {st:?}");
    }
    assert_eq!(cache.get(KEY), DiskLookup::Hit(expected));
    assert_eq!(cache.stats().corrupt, 0);
    // No temp files left behind, one entry.
    assert_eq!(dir_files(&dir), vec![DiskCache::file_name(KEY)]);
    println!("parent reads during the race: {hits} hits, {misses} misses");
}

#[test]
fn disk_cache_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<DiskCache>();
}

// ------------------------------------------- issue 12: entries checked one by one

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// Runs `f` on another thread and fails the test if it does not finish in
/// 30 s (instead of hanging the test binary).
fn within_30s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what}: still blocked after 30 s"))
}

/// After a rejection the cache heals: a fresh put is served.
fn heals(cache: &DiskCache) {
    cache.put(KEY, b"fresh").unwrap();
    assert_eq!(cache.get(KEY), DiskLookup::Hit(b"fresh".to_vec()));
}

#[test]
fn a_fifo_entry_is_rejected_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = std::sync::Arc::new(open(tmp.path()));
    let path = cache.entry_path(KEY);
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath(&path).as_ptr(), 0o600) }, 0);
    let c = cache.clone();
    let lookup = within_30s("get on a FIFO", move || c.get(KEY));
    assert_eq!(
        lookup,
        DiskLookup::Rejected {
            reason: RejectReason::NotARegularFile { kind: "FIFO" }
        }
    );
    assert!(fs::symlink_metadata(&path).is_err(), "the FIFO is removed");
    assert_eq!(cache.stats().rejected, 1);
    assert_eq!(cache.stats().hits, 0);
    heals(&cache);
}

#[test]
fn symlinked_entries_are_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = std::sync::Arc::new(open(&tmp.path().join("cache")));
    let path = cache.entry_path(KEY);
    // To /dev/zero: read until allocation failed before issue 12.
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    let c = cache.clone();
    assert_eq!(
        within_30s("get on a symlink to /dev/zero", move || c.get(KEY)),
        DiskLookup::Rejected {
            reason: RejectReason::Symlink
        }
    );
    assert!(fs::symlink_metadata(&path).is_err(), "the link is removed");
    // To a perfectly valid entry elsewhere: still not followed.
    let elsewhere = tmp.path().join("valid-entry");
    fs::write(&elsewhere, encode_entry(KEY, b"planted")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    assert_eq!(
        cache.get(KEY),
        DiskLookup::Rejected {
            reason: RejectReason::Symlink
        }
    );
    assert_eq!(
        fs::read(&elsewhere).unwrap(),
        encode_entry(KEY, b"planted"),
        "the target is left alone"
    );
    assert_eq!(cache.stats().rejected, 2);
    heals(&cache);
}

#[test]
fn a_device_entry_is_never_opened() {
    if !is_root() {
        println!("note: not root; skipping (creating a device node needs CAP_MKNOD)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = std::sync::Arc::new(open(tmp.path()));
    let path = cache.entry_path(KEY);
    // A character device 1:5, i.e. another /dev/zero.
    // SAFETY: a valid NUL-terminated path.
    let r = unsafe {
        libc::mknod(
            cpath(&path).as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(1, 5),
        )
    };
    if r != 0 {
        println!(
            "note: mknod failed ({}); skipping (no CAP_MKNOD in this container)",
            std::io::Error::last_os_error()
        );
        return;
    }
    let c = cache.clone();
    assert_eq!(
        within_30s("get on a device", move || c.get(KEY)),
        DiskLookup::Rejected {
            reason: RejectReason::NotARegularFile {
                kind: "character device"
            }
        }
    );
    heals(&cache);
}

#[test]
fn an_oversized_entry_is_rejected_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    let path = cache.entry_path(KEY);
    // A valid header, then a sparse tail past the cap: nothing is read.
    let f = File::create(&path).unwrap();
    (&f).write_all(&encode_entry(KEY, b"x")).unwrap();
    f.set_len(MAX_ENTRY_BYTES + 1).unwrap();
    drop(f);
    assert_eq!(
        cache.get(KEY),
        DiskLookup::Rejected {
            reason: RejectReason::TooLarge {
                size: MAX_ENTRY_BYTES + 1,
                max: MAX_ENTRY_BYTES
            }
        }
    );
    assert!(!path.exists());
    // Nothing that large is written either, whatever the cap.
    let big = DiskCache::open(DiskCacheConfig {
        dir: tmp.path().to_path_buf(),
        max_bytes: u64::MAX,
        enabled: true,
    })
    .unwrap();
    let e = big
        .put(KEY, &vec![0u8; MAX_ENTRY_BYTES as usize])
        .unwrap_err();
    assert!(
        matches!(e, DiskCacheError::EntryTooLarge { max_bytes, .. } if max_bytes == MAX_ENTRY_BYTES),
        "{e}"
    );
    heals(&cache);
}

#[test]
fn entries_writable_by_others_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    for m in [0o620, 0o602, 0o666] {
        cache.put(KEY, b"good bytes").unwrap();
        set_mode(&cache.entry_path(KEY), m);
        assert_eq!(
            cache.get(KEY),
            DiskLookup::Rejected {
                reason: RejectReason::WritableByOthers { mode: m }
            },
            "mode {m:o}"
        );
        assert!(!cache.entry_path(KEY).exists());
    }
    assert_eq!(cache.stats().rejected, 3);
    heals(&cache);
}

#[test]
fn entries_of_another_owner_are_rejected() {
    if !is_root() {
        println!("note: not root; skipping (giving a file away needs chown)");
        return;
    }
    // Root's permission bypass does not extend to the ownership check.
    let tmp = tempfile::tempdir().unwrap();
    let cache = open(tmp.path());
    cache.put(KEY, b"good bytes").unwrap();
    let path = cache.entry_path(KEY);
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::chown(cpath(&path).as_ptr(), 1, 1) }, 0);
    assert_eq!(
        cache.get(KEY),
        DiskLookup::Rejected {
            reason: RejectReason::ForeignOwner { owner: 1, uid: 0 }
        }
    );
    heals(&cache);
}

#[test]
fn a_directory_made_unsafe_at_run_time_is_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let cache = open(&dir);
    cache.put(KEY, b"good").unwrap();
    // Opened while 0700; then someone makes it 0777 and forges an entry.
    set_mode(&dir, 0o777);
    fs::write(cache.entry_path(KEY), encode_entry(KEY, b"forged")).unwrap();
    match cache.get(KEY) {
        DiskLookup::Rejected {
            reason:
                RejectReason::UnsafeDirectory(DiskCacheWarning::InsecurePermissions { mode, .. }),
        } => assert_eq!(mode, 0o777),
        other => panic!("expected a rejection, got {:?}", short(&other)),
    }
    // Nothing is written, cleared or counted there either.
    assert!(matches!(
        cache.put("other", b"x"),
        Err(DiskCacheError::UnsafeDirectory(_))
    ));
    assert!(!cache.entry_path("other").exists());
    assert!(matches!(
        cache.clear(),
        Err(DiskCacheError::UnsafeDirectory(_))
    ));
    let e = cache.try_stats().unwrap_err();
    assert!(e.to_string().contains("0777"), "{e}");
    assert_eq!(
        fs::read(cache.entry_path(KEY)).unwrap(),
        encode_entry(KEY, b"forged"),
        "an unsafe directory is not touched"
    );
    // Back to 0700: the owner's own directory is trusted again.
    set_mode(&dir, 0o700);
    assert_eq!(cache.get(KEY), DiskLookup::Hit(b"forged".to_vec()));
    if is_root() {
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::chown(cpath(&dir).as_ptr(), 1, 1) }, 0);
        assert!(matches!(
            cache.get(KEY),
            DiskLookup::Rejected {
                reason: RejectReason::UnsafeDirectory(DiskCacheWarning::NotOwned { owner: 1, .. })
            }
        ));
    } else {
        println!("note: not root; skipping the run-time owner change (needs chown)");
    }
}

#[test]
fn temp_files_count_against_the_cap_and_stale_ones_go() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = encoded_len(&key(0), 1000);
    let cache = DiskCache::open(DiskCacheConfig {
        dir: tmp.path().to_path_buf(),
        max_bytes: 4 * entry,
        enabled: true,
    })
    .unwrap();
    let now = SystemTime::now();
    for i in 0..3 {
        cache.put(&key(i), &payload(1000, i as u8)).unwrap();
        set_mtime(
            &cache.entry_path(&key(i)),
            now - Duration::from_secs(1000 - 100 * i as u64),
        );
    }
    // A writer in flight holds two entries' worth; a crashed one left a
    // large, old temporary file.
    let fresh = tmp.path().join(".tmp-0123456789abcdef-7-0-000000000");
    let stale = tmp.path().join(".tmp-0123456789abcdef-8-0-000000000");
    fs::write(&fresh, vec![0u8; 2 * entry as usize]).unwrap();
    fs::write(&stale, vec![0u8; 10 * entry as usize]).unwrap();
    set_mtime(&stale, now - STALE_TEMP_AGE - Duration::from_secs(60));
    let s = cache.stats();
    assert!(!stale.exists(), "a scan removes stale temporaries");
    assert_eq!((s.temp_files, s.temp_bytes), (1, 2 * entry));
    assert_eq!(s.stale_temps_removed, 1);
    // 4 entries + 2 in flight > 4: the two oldest entries go.
    cache.put(&key(3), &payload(1000, 3)).unwrap();
    assert_eq!(cache.stats().evictions, 2);
    assert_eq!(cache.get(&key(0)), DiskLookup::Miss);
    assert_eq!(cache.get(&key(1)), DiskLookup::Miss);
    assert!(matches!(cache.get(&key(2)), DiskLookup::Hit(_)));
    assert!(matches!(cache.get(&key(3)), DiskLookup::Hit(_)));
    assert!(fresh.exists(), "a writer's temporary file is never removed");
    let s = cache.stats();
    assert!(s.bytes + s.temp_bytes <= cache.max_bytes(), "{s:?}");
}

#[test]
fn stats_report_a_directory_that_cannot_be_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let cache = open(&dir);
    cache.put(KEY, b"x").unwrap();
    assert_eq!(cache.try_stats().unwrap().entries, 1);
    if is_root() {
        println!("note: root reads a mode-0300 directory anyway; testing a removed one only");
    } else {
        // Search permission only: lookups still work, listing does not.
        set_mode(&dir, 0o300);
        let e = cache.try_stats().unwrap_err();
        assert!(e.to_string().contains("read directory"), "{e}");
        assert_eq!(cache.get(KEY), DiskLookup::Hit(b"x".to_vec()));
        set_mode(&dir, 0o700);
    }
    fs::remove_dir_all(&dir).unwrap();
    let e = cache.try_stats().unwrap_err();
    assert!(
        matches!(
            &e,
            DiskCacheError::Io {
                op: "open directory",
                ..
            }
        ),
        "{e}"
    );
    // `stats` keeps the counters for callers that only want those.
    assert_eq!(cache.stats().writes, 1);
    assert_eq!(cache.stats().entries, 0);
}

// ------------------------------------- issue 12: forged entries with valid checksums

mod forged {
    use super::*;
    use fraglink::build::Arch;
    use fraglink::fragments::{
        FilterFragment, MetricFragment, NoneFilter, ScanFragment, F32, L2, U32,
    };
    use fraglink::link::metadata::check_cubin;
    use fraglink::link::{DiskPayload, LinkRuntime, Linked, Planner, RuntimeConfig, Source};

    fn runtime(dir: &Path) -> LinkRuntime {
        // These tests compare figures across fresh links: a link served
        // from the driver's compute cache has figures from the cubin alone
        // (no barrier count).
        super::support::without_driver_compute_cache();
        LinkRuntime::new(RuntimeConfig {
            memory_capacity: 16,
            disk: Some(DiskCacheConfig::new(dir)),
        })
        .expect("nvJitLink loads from the path baked at build time")
    }

    fn plan() -> Planner {
        Planner::new("scan_f32_u32_v4_k128")
            .add::<ScanFragment<F32, U32, 4, 128>>()
            .add::<MetricFragment<L2, F32>>()
            .add::<FilterFragment<NoneFilter, U32>>()
    }

    /// The verified payload stored for `l`.
    fn stored(dir: &Path, l: &Linked) -> Vec<u8> {
        let hex = l.key.hex();
        let bytes = fs::read(dir.join(DiskCache::file_name(&hex))).unwrap();
        decode_entry(&hex, &bytes).unwrap().to_vec()
    }

    /// Writes `payload` as a valid (checksummed) entry for `l`'s key.
    fn forge(dir: &Path, l: &Linked, payload: &[u8]) {
        let hex = l.key.hex();
        fs::write(
            dir.join(DiskCache::file_name(&hex)),
            encode_entry(&hex, payload),
        )
        .unwrap();
    }

    /// A fresh runtime (a new process) must refuse the forged entry, link
    /// afresh, count the refusal, and store a good entry for the next one.
    fn refused(dir: &Path, arch: Arch, real: &Linked) {
        let rt = runtime(dir);
        let l = rt.link(&plan(), arch).unwrap();
        assert_eq!(l.source, Source::Linked, "the forged entry was served");
        assert_eq!(rt.disk().unwrap().stats().rejected, 1);
        assert_eq!(l.kernel.cubin, real.kernel.cubin);
        assert_eq!(l.kernel.metadata.registers, real.kernel.metadata.registers);
        let next = runtime(dir).link(&plan(), arch).unwrap();
        assert_eq!(next.source, Source::Disk);
        // The same figures (only the link time of the fresh link differs).
        let mut expect = real.kernel.metadata.clone();
        expect.link_ms = l.kernel.metadata.link_ms;
        assert_eq!(next.kernel.metadata, expect);
    }

    #[test]
    fn a_cubin_for_another_sm_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = runtime(tmp.path());
        let sm75 = rt.link(&plan(), Arch::sm(75)).unwrap();
        let sm90 = rt.link(&plan(), Arch::sm(90)).unwrap();
        assert_eq!(
            check_cubin(&sm75.kernel.cubin, "scan_f32_u32_v4_k128")
                .unwrap()
                .sm,
            Some(75)
        );
        // sm_75's payload, checksummed under sm_90's key.
        forge(tmp.path(), &sm90, &stored(tmp.path(), &sm75));
        refused(tmp.path(), Arch::sm(90), &sm90);
    }

    #[test]
    fn a_cubin_without_the_entry_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = runtime(tmp.path());
        let real = rt.link(&plan(), Arch::sm(80)).unwrap();
        let other = Planner::new("scan_f32_u32_v4_k32")
            .add_named("scan_f32_u32_v4_k32")
            .unwrap()
            .add_named("metric_l2_f32")
            .unwrap()
            .add_named("filter_none_u32")
            .unwrap();
        let other = rt.link(&other, Arch::sm(80)).unwrap();
        forge(tmp.path(), &real, &stored(tmp.path(), &other));
        refused(tmp.path(), Arch::sm(80), &real);
    }

    fn fake_log(entry: &str, arch: &str, registers: u32, stack: u32, spills: u32) -> String {
        format!(
            "ptxas info    : 0 bytes gmem\n\
             ptxas info    : Compiling entry function '{entry}' for '{arch}'\n\
             ptxas info    : Function properties for {entry}\n\
             ptxas         .     {stack} bytes stack frame, {spills} bytes spill stores, {spills} bytes spill loads\n\
             ptxas info    : Used {registers} registers, used 1 barriers, 380 bytes cmem[0]\n"
        )
    }

    #[test]
    fn resource_figures_are_rederived_not_believed() {
        let tmp = tempfile::tempdir().unwrap();
        let arch = Arch::sm(80);
        let real = runtime(tmp.path()).link(&plan(), arch).unwrap();
        let m = &real.kernel.metadata;
        let entry = "scan_f32_u32_v4_k128";
        let payload = stored(tmp.path(), &real);
        let good = DiskPayload::decode(&payload).unwrap();

        // Registers 9999 and spills 12345: the cubin says otherwise.
        let log = fake_log(entry, "sm_80", 9999, m.stack_bytes, 12345);
        let lie = DiskPayload {
            info_log: &log,
            ..good
        };
        forge(tmp.path(), &real, &lie.encode());
        refused(tmp.path(), arch, &real);

        // The right registers and frame, but spills without a stack frame.
        assert_eq!(m.stack_bytes, 0, "{m:?}");
        let log = fake_log(entry, "sm_80", m.registers, 0, 12345);
        let lie = DiskPayload {
            info_log: &log,
            ..good
        };
        forge(tmp.path(), &real, &lie.encode());
        refused(tmp.path(), arch, &real);

        // A log for another arch.
        let log = fake_log(entry, "sm_90", m.registers, 0, 0);
        let lie = DiskPayload {
            info_log: &log,
            ..good
        };
        forge(tmp.path(), &real, &lie.encode());
        refused(tmp.path(), arch, &real);

        // No log at all: the figures come from the cubin.
        let bare = DiskPayload {
            info_log: "",
            ..good
        };
        forge(tmp.path(), &real, &bare.encode());
        let l = runtime(tmp.path()).link(&plan(), arch).unwrap();
        assert_eq!(l.source, Source::Disk);
        assert_eq!(
            (l.kernel.metadata.registers, l.kernel.metadata.stack_bytes),
            (m.registers, m.stack_bytes)
        );
        assert_eq!(l.kernel.metadata.shared_bytes, m.shared_bytes);
    }
}
