//! `fraglink link` and `fraglink cache` as a user runs them.

mod support;

use std::ffi::OsStr;
use std::process::{Command, Output};

use serde_json::Value;

fn fraglink(cache: &std::path::Path, args: &[&str]) -> Output {
    let bin = support::fraglink_bin();
    Command::new(&bin)
        .args(args)
        .env("FRAGLINK_CACHE_DIR", cache)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

const TRIPLE: [&str; 3] = [
    "scan_f16_i64_v8_k256",
    "metric_cosine_f16",
    "filter_bitset_i64",
];

#[test]
fn link_json_then_disk_hit_in_a_second_process() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cubin = dir.path().join("scan.cubin");
    let mut args = vec![
        "link",
        "--arch",
        "sm_86",
        "--json",
        "--out",
        cubin.to_str().unwrap(),
    ];
    args.extend(TRIPLE);
    let out = fraglink(&cache, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in [
        "entry",
        "arch",
        "cubin_bytes",
        "registers",
        "spill_stores",
        "spill_loads",
        "stack_bytes",
        "link_ms",
        "source",
        "key",
    ] {
        assert!(v.get(field).is_some(), "missing {field}: {v}");
    }
    assert_eq!(v["entry"], TRIPLE[0]);
    assert_eq!(v["arch"], "sm_86");
    assert_eq!(v["source"], "linked");
    let bytes = std::fs::read(&cubin).unwrap();
    assert_eq!(bytes.len() as u64, v["cubin_bytes"].as_u64().unwrap());
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 190);

    let again: Value = serde_json::from_slice(&fraglink(&cache, &args).stdout).unwrap();
    assert_eq!(again["source"], "disk");
    assert_eq!(again["key"], v["key"]);

    let stats: Value =
        serde_json::from_slice(&fraglink(&cache, &["cache", "stats", "--json"]).stdout).unwrap();
    assert_eq!(stats["entries"], 1);
    assert_eq!(stats["enabled"], true);
    assert!(fraglink(&cache, &["cache", "clear"]).status.success());
    let stats: Value =
        serde_json::from_slice(&fraglink(&cache, &["cache", "stats", "--json"]).stdout).unwrap();
    assert_eq!(stats["entries"], 0);
}

fn fails_with(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = fraglink(dir.path(), args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
}

#[test]
fn errors_exit_2_with_the_cause() {
    fails_with(
        &["link", "--arch", "sm_80", "metric_l2_f3"],
        "nearest: metric_l2_f32",
    );
    // An f32 metric cannot serve an f16 scan: nvJitLink's own message.
    fails_with(
        &[
            "link",
            "--arch",
            "sm_80",
            "scan_f16_u32_v8_k32",
            "metric_l2_f32",
            "filter_none_u32",
        ],
        "Unresolved extern function 'fraglink_metric_init_f16'",
    );
    fails_with(
        &["link", "--arch", "sm_999", "scan_f16_u32_v8_k32"],
        "sm_999",
    );
    fails_with(
        &["link", "--arch", "gfx90a", "scan_f16_u32_v8_k32"],
        "gfx90a",
    );
}

// ---------------------------------------------------------------- issue 12

/// Every variable the cache configuration may read.
const CACHE_VARS: [&str; 6] = [
    "FRAGLINK_CACHE_DIR",
    "FRAGLINK_CACHE_DISABLE",
    "FRAGLINK_CACHE_MAX_BYTES",
    "FRAGLINK_MEMORY_CACHE_ENTRIES",
    "XDG_CACHE_HOME",
    "HOME",
];

/// Runs fraglink with none of [`CACHE_VARS`] but `env`, and fails the test
/// instead of hanging if it runs for more than two minutes.
fn fraglink_env(env: &[(&str, &OsStr)], args: &[&str]) -> Output {
    let mut cmd = Command::new(support::fraglink_bin());
    cmd.args(args);
    for v in CACHE_VARS {
        cmd.env_remove(v);
    }
    cmd.envs(env.iter().copied());
    finish(cmd, args)
}

fn finish(mut cmd: Command, args: &[&str]) -> Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fraglink");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fraglink {args:?} still running after 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn ok(out: &Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn exit_2(out: &Output, what: &str, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    assert!(stderr.starts_with("error: "), "{what}: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{what}: no {n:?} in {stderr}");
    }
}

fn link_args() -> Vec<&'static str> {
    let mut args = vec!["link", "--arch", "sm_86", "--json"];
    args.extend(TRIPLE);
    args
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Finding 7: a HOME that is not UTF-8 is a path like any other, and is not
/// read at all when the cache is disabled or has an explicit directory.
#[test]
fn a_non_utf8_home_is_just_a_path() {
    use std::os::unix::ffi::OsStringExt;
    let tmp = tempfile::tempdir().unwrap();
    let mut raw = tmp.path().as_os_str().as_encoded_bytes().to_vec();
    raw.extend_from_slice(b"/h\xffme");
    let home = std::ffi::OsString::from_vec(raw);
    std::fs::create_dir(&home).unwrap();
    let home = home.as_os_str();
    let args = link_args();

    let v = ok(&fraglink_env(&[("HOME", home)], &args), "HOME only");
    assert_eq!(v["source"], "linked");
    let cache = std::path::Path::new(home).join(".cache").join("fraglink");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1, "one entry");
    let v = ok(&fraglink_env(&[("HOME", home)], &args), "HOME only, again");
    assert_eq!(v["source"], "disk");
    let stats = ok(
        &fraglink_env(&[("HOME", home)], &["cache", "stats", "--json"]),
        "cache stats",
    );
    assert_eq!(stats["entries"], 1);

    let disabled = [("HOME", home), ("FRAGLINK_CACHE_DISABLE", os("1"))];
    let v = ok(&fraglink_env(&disabled, &args), "disabled");
    assert_eq!(v["source"], "linked");
    let dir = tmp.path().join("explicit");
    let explicit = [("HOME", home), ("FRAGLINK_CACHE_DIR", dir.as_os_str())];
    ok(&fraglink_env(&explicit, &args), "explicit directory");
    assert!(dir.is_dir());
}

/// Finding 8: an invalid value is an error naming the variable and the
/// value when the variable is consulted, and harmless when it is not.
#[test]
fn cache_variables_fail_only_when_consulted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let dir = dir.as_os_str();
    let args = link_args();
    let (max, disable, memory) = (
        "FRAGLINK_CACHE_MAX_BYTES",
        "FRAGLINK_CACHE_DISABLE",
        "FRAGLINK_MEMORY_CACHE_ENTRIES",
    );

    // A cap nobody reads: the cache is disabled.
    ok(
        &fraglink_env(&[(disable, os("1")), (max, os("lots"))], &args),
        "disabled cache, bad cap",
    );
    // Read, and invalid.
    let bad_cap = [("FRAGLINK_CACHE_DIR", dir), (max, os("lots"))];
    exit_2(&fraglink_env(&bad_cap, &args), "bad cap", &[max, "lots"]);
    exit_2(
        &fraglink_env(&bad_cap, &["cache", "stats"]),
        "stats, bad cap",
        &[max, "lots"],
    );
    // `cache clear` never writes, so it does not read the cap.
    ok(
        &fraglink_env(&bad_cap, &["cache", "clear"]),
        "clear, bad cap",
    );
    // FRAGLINK_CACHE_DISABLE takes a switch value, not anything at all.
    exit_2(
        &fraglink_env(
            &[("FRAGLINK_CACHE_DIR", dir), (disable, os("maybe"))],
            &args,
        ),
        "bad switch",
        &[disable, "maybe"],
    );
    // The memory cache's size is an error too, not silently 256 ...
    let bad_memory = [("FRAGLINK_CACHE_DIR", dir), (memory, os("many"))];
    exit_2(
        &fraglink_env(&bad_memory, &args),
        "bad memory size",
        &[memory, "many"],
    );
    exit_2(
        &fraglink_env(&[(disable, os("1")), (memory, os("0"))], &args),
        "memory size 0",
        &[memory, "\"0\""],
    );
    // ... but the disk cache's commands do not read it.
    ok(
        &fraglink_env(&bad_memory, &["cache", "stats", "--json"]),
        "stats, bad memory size",
    );
    // Commands that do not link read none of them.
    let all_bad = [
        (disable, os("maybe")),
        (max, os("lots")),
        (memory, os("many")),
    ];
    let out = fraglink_env(&all_bad, &["catalog"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Valid values still work.
    let good = [
        ("FRAGLINK_CACHE_DIR", dir),
        (disable, os(" Off ")),
        (max, os("64M")),
        (memory, os("8")),
    ];
    ok(&fraglink_env(&good, &args), "good values");
    let stats = ok(&fraglink_env(&good, &["cache", "stats", "--json"]), "stats");
    assert_eq!(stats["max_bytes"], 64 << 20);
    assert_eq!(stats["entries"], 1);
}

/// The entry file `link` uses for a link key.
fn entry_file(cache: &std::path::Path, key: &str) -> std::path::PathBuf {
    cache.join(format!("{}.cubin", blake3::hash(key.as_bytes()).to_hex()))
}

/// Finding 9: a FIFO or a symlink to /dev/zero in place of an entry neither
/// hangs `link` nor exhausts it; the entry is replaced by a fresh link.
#[test]
fn a_fifo_or_dev_zero_entry_does_not_hang_link() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let env = [("FRAGLINK_CACHE_DIR", cache.as_os_str())];
    let args = link_args();
    let first = ok(&fraglink_env(&env, &args), "first link");
    let entry = entry_file(&cache, first["key"].as_str().unwrap());
    assert!(entry.is_file());

    std::fs::remove_file(&entry).unwrap();
    let c = std::ffi::CString::new(entry.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let v = ok(&fraglink_env(&env, &args), "FIFO entry");
    assert_eq!(v["source"], "linked");
    assert!(entry.is_file(), "the FIFO was replaced by a real entry");
    let v = ok(&fraglink_env(&env, &args), "after the FIFO");
    assert_eq!(v["source"], "disk");

    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &entry).unwrap();
    let v = ok(&fraglink_env(&env, &args), "symlink to /dev/zero");
    assert_eq!(v["source"], "linked");
    assert!(!entry.is_symlink());
}

/// Finding 12: `cache stats` on a directory it cannot read is an error
/// (exit 2), not "enabled, 0 entries". As root, whom a mode-0300 directory
/// does not stop, the command runs as uid/gid 65534 on a directory owned
/// by that user.
#[test]
fn cache_stats_reports_an_unreadable_directory() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o300)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for json in [false, true] {
        let mut args = vec!["cache", "stats"];
        if json {
            args.push("--json");
        }
        let mut cmd = Command::new(support::fraglink_bin());
        cmd.args(&args);
        for v in CACHE_VARS {
            cmd.env_remove(v);
        }
        cmd.env("FRAGLINK_CACHE_DIR", &cache);
        if root {
            let c = std::ffi::CString::new(cache.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
            cmd.uid(65534).gid(65534);
        }
        let out = finish(cmd, &args);
        exit_2(&out, "unreadable directory", &["read directory"]);
        assert!(out.stdout.is_empty(), "no stats printed");
    }
}

#[test]
fn plan_errors_exit_2_before_nvjitlink() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "link", "--arch", "sm_80", TRIPLE[0], TRIPLE[1], TRIPLE[2], TRIPLE[0],
            ],
            "is in the plan twice",
        ),
        (
            &[
                "link", "--arch", "sm_80", "--entry", "", TRIPLE[0], TRIPLE[1], TRIPLE[2],
            ],
            "is not a symbol name",
        ),
        (
            &[
                "link",
                "--arch",
                "sm_80",
                "--entry",
                "scan_f16_i64_v8_k25",
                TRIPLE[0],
                TRIPLE[1],
                TRIPLE[2],
            ],
            "nearest kernels: `scan_f16_i64_v8_k256`",
        ),
    ];
    for (args, want) in cases {
        let out = fraglink(&cache, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(want),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn several_entries_in_one_link() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let out = fraglink(
        &cache,
        &[
            "link",
            "--arch",
            "sm_90a",
            "--json",
            "--entry",
            "scan_f16_i64_v8_k256",
            "--entry",
            "scan_f16_i64_v8_k128",
            "scan_f16_i64_v8_k256",
            "scan_f16_i64_v8_k128",
            TRIPLE[1],
            TRIPLE[2],
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arch"], "sm_90a");
    let kernels = v["kernels"].as_array().unwrap();
    let names: Vec<&str> = kernels
        .iter()
        .map(|k| k["entry"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["scan_f16_i64_v8_k256", "scan_f16_i64_v8_k128"]);
    assert!(
        kernels.iter().all(|k| k["registers"].as_u64().unwrap() > 0),
        "{v}"
    );
}

#[test]
fn catalog_json_lists_each_fragments_kernels_per_arch() {
    let dir = tempfile::tempdir().unwrap();
    let out = fraglink(dir.path(), &["catalog", "--json", "--family", "scan"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for f in v["fragments"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        for arch in f["archs"].as_array().unwrap() {
            let entries = &f["entries"][arch.as_str().unwrap()];
            assert_eq!(entries, &serde_json::json!([name]), "{f}");
        }
        assert_eq!(f["definitions"], serde_json::json!([name]), "{f}");
    }
}

/// `fraglink catalog --json | head`: a reader that goes away ends the CLI
/// quietly (SIGPIPE, as for other tools), never with a panic.
#[test]
fn a_closed_stdout_ends_the_cli_without_a_panic() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(support::fraglink_bin())
        .args(["catalog", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's read end is closed here; the catalog is far larger than a pipe buffer.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}

/// `FRAGLINK_FAST_COMPILE`: a level links its own cache entry (another key
/// than the default link's), `0` is the default link, and a value that is no
/// level is exit 2 naming the variable.
#[test]
fn fast_compile_is_its_own_entry_and_a_bad_level_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_env = ("FRAGLINK_CACHE_DIR", cache.as_os_str());
    let args = link_args();
    let plain = ok(&fraglink_env(&[cache_env], &args), "default link");
    let min = ok(
        &fraglink_env(&[cache_env, ("FRAGLINK_FAST_COMPILE", os("min"))], &args),
        "FRAGLINK_FAST_COMPILE=min",
    );
    assert_eq!(min["source"], "linked");
    assert_ne!(min["key"], plain["key"]);
    let off = ok(
        &fraglink_env(&[cache_env, ("FRAGLINK_FAST_COMPILE", os("0"))], &args),
        "FRAGLINK_FAST_COMPILE=0",
    );
    assert_eq!(
        (&off["key"], &off["source"]),
        (&plain["key"], &Value::from("disk"))
    );
    exit_2(
        &fraglink_env(&[cache_env, ("FRAGLINK_FAST_COMPILE", os("fast"))], &args),
        "FRAGLINK_FAST_COMPILE=fast",
        &["FRAGLINK_FAST_COMPILE", "\"fast\"", "min"],
    );
}

/// `cache stats` and `cache clear` look without making anything: the
/// directory (and its missing parents) stays absent.
#[test]
fn cache_stats_and_clear_create_no_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("no/such/cache");
    let env = [("FRAGLINK_CACHE_DIR", cache.as_os_str())];
    let v = ok(&fraglink_env(&env, &["cache", "stats", "--json"]), "stats");
    assert_eq!(
        (v["exists"].as_bool(), v["entries"].as_u64()),
        (Some(false), Some(0))
    );
    ok(&fraglink_env(&env, &["cache", "stats"]), "stats");
    let cleared = fraglink_env(&env, &["cache", "clear"]);
    ok(&cleared, "clear");
    let text = String::from_utf8_lossy(&cleared.stdout);
    assert!(text.contains("does not exist"), "{text}");
    assert!(!tmp.path().join("no").exists(), "a look made the directory");
}
