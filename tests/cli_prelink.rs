//! `fraglink prelink` and `FRAGLINK_PROFILE` as a user runs them: a profile
//! written by one process, prelinked by a second, makes a third link nothing.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{run_bounded, Bounded};

const LIMIT: Duration = Duration::from_secs(300);

const PLANS: [[&str; 3]; 2] = [
    ["scan_f32_u32_v4_k32", "metric_l2_f32", "filter_none_u32"],
    [
        "scan_i8_u32_v16_k128",
        "metric_cosine_i8",
        "filter_bitset_u32",
    ],
];

fn run(args: &[&str], env: &[(&str, &Path)]) -> Bounded {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    run_bounded(args, &env, None, LIMIT)
}

fn json(out: &Bounded) -> Value {
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn link(plan: &[&str], env: &[(&str, &Path)]) -> Value {
    let mut args = vec!["link", "--arch", "sm_80", "--json"];
    args.extend(plan);
    json(&run(&args, env))
}

#[test]
fn a_prelinked_profile_makes_a_later_process_link_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("profile.jsonl");
    let first_cache = dir.path().join("first");
    let cache = dir.path().join("cache");

    // 1. Two processes record what they link (one plan twice).
    let recording = [
        ("FRAGLINK_PROFILE", profile.as_path()),
        ("FRAGLINK_CACHE_DIR", first_cache.as_path()),
    ];
    for plan in [PLANS[0], PLANS[1], PLANS[0]] {
        link(&plan, &recording);
    }
    let text = std::fs::read_to_string(&profile).unwrap();
    assert_eq!(
        text.lines().count(),
        4,
        "a header and one line per link: {text}"
    );
    assert_eq!(text.lines().next(), Some("{\"fraglink_profile\":1}"));

    // 2. Prelink the profile into another cache: the two distinct plans.
    let into = [("FRAGLINK_CACHE_DIR", cache.as_path())];
    let args = ["prelink", "--from", profile.to_str().unwrap(), "--json"];
    let report = json(&run(&args, &into));
    assert_eq!(report["total"], 2, "{report}");
    assert_eq!(report["linked"], 2, "{report}");
    assert_eq!(report["failed"].as_array().unwrap().len(), 0, "{report}");
    assert_eq!(report["disk_cache"], true);

    // 3. A later process links nothing: every kernel comes from the disk.
    for plan in PLANS {
        let l = link(&plan, &into);
        assert_eq!(l["source"], "disk", "{l}");
    }

    // 4. Prelinking again finds everything on disk.
    let again = json(&run(&args, &into));
    assert_eq!(
        (again["linked"].as_u64(), again["from_disk"].as_u64()),
        (Some(0), Some(2)),
        "{again}"
    );

    // 5. A disabled disk cache is reported as none, with a warning.
    let disabled = [
        ("FRAGLINK_CACHE_DIR", cache.as_path()),
        ("FRAGLINK_CACHE_DISABLE", Path::new("1")),
    ];
    let out = run(&args, &disabled);
    let r = json(&out);
    assert_eq!(r["disk_cache"], false, "{r}");
    assert!(out.stderr.contains("no disk cache"), "{}", out.stderr);
}

#[test]
fn prelink_refuses_bad_requests_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, "not a profile\n").unwrap();
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["prelink", "--arch", "sm_80"], "required"),
        (
            vec!["prelink", "--arch", "sm_80", "--family", "nope"],
            "no such family; known: scan",
        ),
        (
            vec!["prelink", "--from", foreign.to_str().unwrap()],
            "notes.txt: line 1",
        ),
        (vec!["prelink", "--all", "--arch", "sm_9x"], "sm_9x"),
    ];
    for (args, want) in cases {
        let out = run(&args, &[]);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    assert_eq!(
        std::fs::read_to_string(&foreign).unwrap(),
        "not a profile\n"
    );
}

#[test]
fn a_foreign_profile_file_is_left_alone_and_the_link_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, "my notes\n").unwrap();
    let out = run(
        &[
            "link",
            "--arch",
            "sm_80",
            "--json",
            PLANS[0][0],
            PLANS[0][1],
            PLANS[0][2],
        ],
        &[("FRAGLINK_PROFILE", foreign.as_path())],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("not a fraglink profile"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("FRAGLINK_PROFILE ignored"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "my notes\n");
}
