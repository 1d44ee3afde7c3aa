//! `fraglink link` and `fraglink cache` as a user runs them.

mod support;

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
