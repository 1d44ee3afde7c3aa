//! `fraglink search` end to end on the CPU: recall 1.0 against the exact
//! reference for every metric × dtype × filter, file inputs, clear errors.

mod support;

use std::process::Command;

use fraglink::search::data::{synthetic, write_vecs_file};
use fraglink::search::DType;
use serde_json::Value;

fn fraglink(cache: &std::path::Path, args: &[&str]) -> std::process::Output {
    let bin = support::fraglink_bin();
    Command::new(&bin)
        .args(args)
        .env("FRAGLINK_CACHE_DIR", cache)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

fn search_json(cache: &std::path::Path, args: &[&str]) -> Value {
    let mut all = vec!["search", "--json"];
    all.extend_from_slice(args);
    let out = fraglink(cache, &all);
    assert!(
        out.status.success(),
        "{all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn recall_is_exact_for_every_metric_dtype_filter() {
    let cache = tempfile::tempdir().unwrap();
    for dtype in ["f32", "f16", "i8", "u8"] {
        for metric in ["l2", "ip", "cosine"] {
            for filter in ["none", "bitset:0.5", "bitset:0.001"] {
                let v = search_json(
                    cache.path(),
                    &[
                        "--n", "3000", "--dim", "48", "--nq", "25", "--k", "10", "--metric",
                        metric, "--dtype", dtype, "--filter", filter, "--device", "cpu",
                    ],
                );
                let what = format!("{dtype} {metric} {filter}");
                assert_eq!(v["recall"], 1.0, "{what}: {v}");
                assert_eq!(v["route"], "cpu", "{what}");
                assert_eq!(v["dtype"], dtype);
                assert_eq!(
                    (
                        v["n"].as_u64(),
                        v["nq"].as_u64(),
                        v["dim"].as_u64(),
                        v["k"].as_u64()
                    ),
                    (Some(3000), Some(25), Some(48), Some(10))
                );
                let frags: Vec<&str> = v["fragments"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f.as_str().unwrap())
                    .collect();
                assert_eq!(frags.len(), 3, "{what}");
                assert!(
                    frags[0].starts_with(&format!("scan_{dtype}_u32_")),
                    "{what}: {frags:?}"
                );
                let link = &v["link"];
                assert_eq!(link["entry"], frags[0]);
                assert_eq!(link["arch"], "sm_90");
                assert_eq!(
                    (link["spill_stores"].as_u64(), link["spill_loads"].as_u64()),
                    (Some(0), Some(0))
                );
                assert!(link["registers"].as_u64().unwrap() > 0);
                assert!(v["qps"].as_f64().unwrap() > 0.0);
                // The CPU path uploads nothing.
                assert!(
                    v["upload_ms"].is_null() && v["upload_bytes"].is_null(),
                    "{what}: {v}"
                );
            }
        }
    }
}

#[test]
fn reads_vector_files_and_links_for_the_given_arch() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (base, queries) = synthetic(2000, 32, 10, DType::U8, 5);
    let (b, q) = (dir.path().join("base.bvecs"), dir.path().join("q.bvecs"));
    write_vecs_file(&b, &base).unwrap();
    write_vecs_file(&q, &queries).unwrap();
    let v = search_json(
        cache.path(),
        &[
            "--base",
            b.to_str().unwrap(),
            "--queries",
            q.to_str().unwrap(),
            "--k",
            "5",
            "--metric",
            "l2",
            "--arch",
            "sm_75",
            // --arch applies when no GPU is used (on a GPU host the plan is
            // linked for the device instead), so pin the CPU path.
            "--device",
            "cpu",
        ],
    );
    assert_eq!(v["recall"], 1.0);
    assert_eq!(v["dtype"], "u8");
    assert_eq!(v["link"]["arch"], "sm_75");
    assert_eq!((v["n"].as_u64(), v["nq"].as_u64()), (Some(2000), Some(10)));
}

#[test]
fn bad_inputs_exit_2_with_one_line() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.fvecs");
    std::fs::write(&bad, [7u8, 0, 0]).unwrap();
    for args in [
        vec![
            "search",
            "--base",
            bad.to_str().unwrap(),
            "--queries",
            bad.to_str().unwrap(),
        ],
        vec!["search", "--filter", "bitset:2"],
        vec!["search", "--k", "0"],
        vec!["search", "--arch", "sm_5x", "--n", "100"],
    ] {
        let out = fraglink(cache.path(), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
    if fraglink::gpu::GpuContext::available().is_err() {
        let out = fraglink(cache.path(), &["search", "--device", "gpu", "--n", "100"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--device gpu"));
    }
}

#[test]
fn the_json_and_text_reports_carry_the_upload_apart_from_the_search() {
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "--n", "2000", "--dim", "32", "--nq", "10", "--k", "5", "--device", "cpu",
    ];
    let v = search_json(cache.path(), &args);
    for field in [
        "route",
        "reason",
        "fell_back",
        "fragments",
        "link",
        "plan_error",
        "qps",
        "search_ms",
        "upload_ms",
        "upload_bytes",
        "recall",
        "k",
        "n",
        "nq",
        "dim",
        "metric",
        "dtype",
        "filter",
    ] {
        assert!(v.get(field).is_some(), "`{field}` missing: {v}");
    }
    assert_eq!(v["route"], "cpu");
    assert!(v["upload_ms"].is_null(), "{v}");
    assert!(v["search_ms"].as_f64().unwrap() > 0.0);
    let mut all = vec!["search"];
    all.extend_from_slice(&args);
    let out = fraglink(cache.path(), &all);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let upload = text
        .lines()
        .find(|l| l.starts_with("upload "))
        .unwrap_or_else(|| panic!("no upload line:\n{text}"));
    assert!(upload.contains("none"), "{upload}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("search ") && l.contains("QPS")),
        "{text}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_gpu_route_uploads_the_base_once_and_reports_it_apart() {
    let cache = tempfile::tempdir().unwrap();
    for (dtype, size) in [("f32", 4u64), ("f16", 2), ("u8", 1)] {
        let v = search_json(
            cache.path(),
            &[
                "--n",
                "50000",
                "--dim",
                "128",
                "--nq",
                "300",
                "--k",
                "10",
                "--dtype",
                dtype,
                "--metric",
                "cosine",
                "--filter",
                "bitset:0.5",
                "--device",
                "gpu",
            ],
        );
        assert_eq!(v["route"], "gpu", "{v}");
        assert_eq!(v["fell_back"], false, "{v}");
        assert_eq!(v["recall"], 1.0, "{v}");
        assert_eq!(v["upload_bytes"].as_u64(), Some(50_000 * 128 * size), "{v}");
        let (upload, search) = (
            v["upload_ms"].as_f64().unwrap(),
            v["search_ms"].as_f64().unwrap(),
        );
        assert!(upload > 0.0 && search > 0.0, "{v}");
        // QPS is the queries over the search time alone.
        let qps = v["qps"].as_f64().unwrap();
        assert!((qps * search / 1e3 - 300.0).abs() < 1e-6 * 300.0, "{v}");
    }
    let out = fraglink(
        cache.path(),
        &["search", "--n", "20000", "--nq", "50", "--device", "gpu"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("upload ") && l.contains("10.2 MB of base vectors")),
        "{text}"
    );
}
