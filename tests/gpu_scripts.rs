//! The GPU machine's Python side, checked here without a GPU, torch or
//! numpy: benches/scripts/gpu_peers.py (the exact k-NN comparison with torch
//! and CuPy that scripts/gpu-run.sh runs), benches/scripts/ivf_gpu_bench.py
//! (IVF-Flat's probe splits against one block per query) and
//! scripts/gpu_report.py (which puts their results into GPU.md) compile, the
//! comparison's `--dry-run` writes every case of the issue's grid with its
//! floor and goal, and the report renders those documents.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn python(args: &[&str], cwd: &Path) -> String {
    let o = Command::new("python3")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed for this test: {e}"));
    assert!(
        o.status.success(),
        "python3 {args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `gpu_report.py collect` of a GPU run's `logs` (the commit read from
/// `archive`) into `out`: the gpu-results.json it writes.
fn collect(report_py: &Path, logs: &Path, archive: &Path, out: &Path, root: &Path) -> PathBuf {
    python(
        &[
            report_py.to_str().unwrap(),
            "collect",
            "--logs",
            logs.to_str().unwrap(),
            "--archive",
            archive.to_str().unwrap(),
            "--gpu",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
        root,
    );
    out.join("gpu-results.json")
}

/// `gpu_report.py md RESULTS...`: the GPU.md it writes (into `dir`).
fn render_md(report_py: &Path, results: &[&Path], dir: &Path, root: &Path) -> String {
    let md = dir.join("GPU.md");
    let mut args = vec![report_py.to_str().unwrap(), "md"];
    args.extend(results.iter().map(|r| r.to_str().unwrap()));
    args.extend(["--out", md.to_str().unwrap()]);
    python(&args, root);
    std::fs::read_to_string(&md).unwrap()
}

#[test]
fn the_knn_comparison_dry_runs_and_renders_into_gpu_md() {
    let root = support::manifest_dir();
    let dir = tempfile::tempdir().unwrap();
    let peers_py = root.join("benches/scripts/gpu_peers.py");
    let report_py = root.join("scripts/gpu_report.py");
    // Byte-compiled into the temp dir, so the checkout stays clean.
    for (src, name) in [(&peers_py, "a.pyc"), (&report_py, "b.pyc")] {
        let code = "import py_compile,sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)";
        let out = dir.path().join(name);
        python(
            &["-c", code, src.to_str().unwrap(), out.to_str().unwrap()],
            &root,
        );
    }
    let peers = dir.path().join("peers.json");
    python(
        &[
            peers_py.to_str().unwrap(),
            "--dry-run",
            "--out",
            peers.to_str().unwrap(),
        ],
        &root,
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&peers).unwrap()).unwrap();
    assert_eq!(
        (
            doc["n"].as_u64(),
            doc["dim"].as_u64(),
            doc["batch"].as_u64()
        ),
        (Some(1_000_000), Some(128), Some(1000))
    );
    let cases = doc["cases"].as_array().unwrap();
    // f32, f16 × nq 1, 100, 10 000 × k 10, 100; f32 × nq 1, 100 × k 2000
    // (the two-pass select, no goal).
    assert_eq!(cases.len(), 14);
    for c in cases {
        let (nq, k) = (c["nq"].as_u64().unwrap(), c["k"].as_u64().unwrap());
        let goal = c["goal"].as_f64();
        let want = match (nq, k) {
            (_, 2000) => None,
            (10_000.., _) => Some(1.0),
            _ => Some(1.5),
        };
        assert_eq!(goal, want, "{c}");
        assert!(c["floor_qps"].as_f64().unwrap() > 0.0, "{c}");
        let bound = c["floor_bound"].as_str().unwrap();
        assert!(bound == "memory" || bound.ends_with("FLOPs"), "{c}");
        assert!(
            c["goal_met"].is_null(),
            "nothing measured, nothing met: {c}"
        );
    }
    // More queries per batch pass over the rows: a higher QPS floor.
    let floor = |nq: u64| {
        cases
            .iter()
            .find(|c| c["dtype"] == "f32" && c["nq"] == nq)
            .unwrap()["floor_qps"]
            .as_f64()
            .unwrap()
    };
    assert!(floor(1) < floor(100) && floor(100) <= floor(10_000));

    // A measured case with one candidate kernel timed by name, as
    // gpu_peers.py writes it.
    let mut doc = doc;
    doc["cases"][0]["sides"] = serde_json::json!({
        "fraglink": {"qps": 100.0, "recall": 1.0, "gpu_kernel": "knn_tile_f32_tf32x3_q16_r64_k32"},
        "fraglink[knn_tile_f32_tf32_q64_r64_k32]": {"qps": 150.0, "recall": 1.0},
        "fraglink[knn_tile_f32_tf32x3_q64_r64_k32]": {"error": "FRAGLINK_KNN_VARIANT = ..."},
        "fraglink/scan": {"qps": 80.0, "recall": 1.0},
        "fraglink/scan-1block": {"qps": 2.0, "recall": 1.0},
        "fraglink/scan-2sm": {"qps": 64.0, "recall": 1.0},
        "fraglink/no-bound": {"qps": 80.0, "recall": 1.0},
        "fraglink/no-prefetch": {"qps": 50.0, "recall": 1.0}
    });
    doc["cases"][0]["best_variant"] = "knn_tile_f32_tf32_q64_r64_k32".into();
    doc["cases"][0]["scan_splits_gain"] = 40.0.into();
    doc["cases"][0]["scan_wave_gain"] = 1.25.into();
    doc["cases"][0]["shared_bound_gain"] = 1.25.into();
    doc["cases"][0]["prefetch_gain"] = 2.0.into();
    // A traced search (FRAGLINK_SEARCH_TRACE), as run_fraglink keeps it.
    doc["cases"][0]["traces"] = serde_json::json!({
        "fraglink": {"qps": 90.0, "trace": {"wall_us": 400.0, "gpu_span_us": 300.0, "steps": [
            {"step": "plan", "count": 1, "host_us": 20.0, "gpu_us": null},
            {"step": "candidates", "count": 1, "host_us": 9.0, "gpu_us": 210.0},
            {"step": "buffers", "count": 2, "host_us": 6.0, "gpu_us": 4.0}
        ]}},
        "fraglink/scan": {"error": "no answer within 1 s"}
    });
    let results = dir.path().join("results.json");
    // One line of the search matrix, as gpu-run.sh collects it.
    let search = serde_json::json!([{
        "metric": "l2", "dtype": "f16", "filter": "none", "exit": 0, "route": "gpu",
        "gpu_kernel": "knn_tile_f16_f16_q32_k32", "recall": 1.0, "qps": 1000.0
    }]);
    std::fs::write(
        &results,
        serde_json::json!({ "peers": doc, "searches": search }).to_string(),
    )
    .unwrap();
    let md = render_md(&report_py, &[&results], dir.path(), &root);
    assert!(md.contains("Exact k-NN against torch and CuPy"), "{md}");
    // The search matrix names the kernel that served each search.
    assert!(
        md.contains("| route | kernel |") && md.contains("knn_tile_f16_f16_q32_k32"),
        "{md}"
    );
    assert!(
        md.contains("fraglink kernel")
            && md.contains("tensor cores / scan")
            && md.contains("scan row splits / 1 block")
            && md.contains("shared bound / none")
            && md.contains("L2 prefetch / none")
            && md.contains("scan wave splits / 2 per SM")
            && md.contains("| 1.25 | 2 | 40 | 1.25 |")
            && md.contains("| fraglink/scan-1block |")
            && md.contains("| 2 (1) |")
            && md.contains("| 40 |"),
        "{md}"
    );
    assert!(
        md.contains("Where a search's time goes")
            && md.contains(
                "| fraglink | 400 | 300 | 100 | plan 20; candidates 9 / 210; buffers 6 / 4 (x2) |"
            )
            && md.contains("| fraglink/scan | error: no answer within 1 s |"),
        "{md}"
    );
    // The variants get their own table, not columns of the main one.
    assert!(
        md.contains("Candidate kernels by name")
            && md.contains("| knn_tile_f32_tf32_q64_r64_k32 **best** | 150 (1) | 1.5 |")
            && md.contains("| knn_tile_f32_tf32x3_q64_r64_k32 | error: "),
        "{md}"
    );
    assert!(!md.contains("| fraglink[knn_tile"), "{md}");
    let rows = md
        .lines()
        .filter(|l| l.starts_with("| f32 |") || l.starts_with("| f16 |"))
        .count();
    // 14 cases, the two variants, the two traces.
    assert_eq!(rows, 14 + 2 + 2, "{md}");
}

/// gpu-run.sh's Nsight Compute step: `collect` reads each `ncu-<case>.csv`
/// (`ncu --import R --csv --page details`) into `profiles`, and GPU.md shows
/// each profiled kernel's headline metrics.
#[test]
fn kernel_profiles_are_collected_and_rendered() {
    let root = support::manifest_dir();
    let report_py = root.join("scripts/gpu_report.py");
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let header =
        "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\
                  \"Stream\",\"Block Size\",\"Grid Size\",\"Device\",\"CC\",\"Section Name\",\
                  \"Metric Name\",\"Metric Unit\",\"Metric Value\"";
    let row = |id: u32, kernel: &str, metric: &str, unit: &str, value: &str| {
        format!(
            "\"{id}\",\"99\",\"fraglink\",\"127.0.0.1\",\"{kernel}\",\"1\",\"7\",\"(128, 1, 1)\",\
             \"(1, 528, 1)\",\"0\",\"9.0\",\"GPU Speed Of Light Throughput\",\"{metric}\",\"{unit}\",\"{value}\""
        )
    };
    let csv = [
        "==PROF== Connected to process 99".to_string(),
        header.to_string(),
        row(
            0,
            "knn_tile_f32_tf32x3_q16_k32",
            "Duration",
            "usecond",
            "412.35",
        ),
        row(
            0,
            "knn_tile_f32_tf32x3_q16_k32",
            "DRAM Throughput",
            "%",
            "71.20",
        ),
        row(
            0,
            "knn_tile_f32_tf32x3_q16_k32",
            "L1/TEX Hit Rate",
            "%",
            "3.1",
        ),
        row(1, "knn_rerank_f32_k32", "Duration", "usecond", "21.50"),
        row(
            0,
            "knn_tile_f32_tf32x3_q16_k32",
            "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
            "",
            "5.13",
        ),
        row(
            0,
            "knn_tile_f32_tf32x3_q16_k32",
            "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
            "",
            "7.50",
        ),
        row(
            0,
            "knn_tile_f32_tf32x3_q16_k32",
            "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
            "",
            "n/a",
        ),
    ]
    .join("\n");
    std::fs::write(logs.join("ncu-knn-nq1.csv"), csv).unwrap();
    let results = collect(
        &report_py,
        &logs,
        dir.path(),
        &dir.path().join("out"),
        &root,
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    let profiles = doc["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1, "{doc}");
    assert_eq!(profiles[0]["case"], "knn-nq1");
    let kernels = profiles[0]["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 2, "{doc}");
    assert_eq!(kernels[0]["kernel"], "knn_tile_f32_tf32x3_q16_k32");
    assert_eq!(kernels[0]["metrics"]["DRAM Throughput"], "71.20 %");
    assert!(
        kernels[0]["metrics"].get("L1/TEX Hit Rate").is_none(),
        "only the listed metrics: {doc}"
    );
    // Warp stalls by reason, as numbers; a value that is none is left out.
    assert_eq!(
        kernels[0]["stalls"],
        serde_json::json!({"barrier": 5.13, "long_scoreboard": 7.5})
    );
    let md = render_md(&report_py, &[&results], dir.path(), &root);
    assert!(
        md.contains("## Kernel profiles")
            && md.contains("| knn-nq1 | knn_tile_f32_tf32x3_q16_k32 | (1, 528, 1) | (128, 1, 1) | 412.35 usecond | 71.20 % |")
            && md.contains("| long_scoreboard 7.50, barrier 5.13 |")
            && md.contains("| knn_rerank_f32_k32 |"),
        "{md}"
    );
}

/// gpu-run.sh's steps: `collect` reads each step's outcome (steps.jsonl), a
/// test step's JUnit, or, for a step stopped before nextest wrote it, the
/// tests nextest's output names; `md` merges the results of several calls
/// of one commit (a later call's tests replace an earlier one's), shows
/// which steps did not run to the end, and refuses results of two commits.
#[test]
fn the_steps_of_several_calls_merge_into_one_report() {
    let root = support::manifest_dir();
    let report_py = root.join("scripts/gpu_report.py");
    let dir = tempfile::tempdir().unwrap();
    let collect_call = |name: &str, files: &[(&str, &str)]| {
        let logs = dir.path().join(format!("logs-{name}"));
        std::fs::create_dir(&logs).unwrap();
        for (file, text) in files {
            std::fs::write(logs.join(file), text).unwrap();
        }
        let archive = dir.path().join(format!("archive-{name}"));
        std::fs::create_dir(&archive).unwrap();
        std::fs::write(archive.join("commit"), "abc123\n").unwrap();
        let out = dir.path().join(format!("out-{name}"));
        collect(&report_py, &logs, &archive, &out, &root)
    };
    // Call 1: the GPU tests were stopped at the budget (no JUnit), the
    // search matrix ran, the portable tests did not start.
    let nextest_output = "\
────────────
 Nextest run ID 0 with nextest profile: gpu
    Starting 4 tests across 2 binaries (900 tests skipped)
        PASS [   1.250s] (1/4) fraglink::knn_gpu the_select_equals_the_cpu_path
        FAIL [  12.000s] fraglink::search_gpu k_beyond_the_scan
     SIGSEGV [   0.500s] fraglink::ivf_gpu ivf_probes
        SLOW [> 60.000s] fraglink::knn_gpu every_dtype_and_metric
  Cancelling due to interrupt: 1 test still running
      SIGINT [  67.467s] (4/4) fraglink::knn_gpu every_dtype_and_metric
";
    let steps1 = [
        r#"{"step":"gpu-tests","status":"stopped","seconds":520,"exit":124,"note":""}"#,
        r#"{"step":"search","status":"done","seconds":10,"exit":0,"note":""}"#,
        r#"{"step":"tests","status":"not started","seconds":0,"exit":0,"note":"5 s left"}"#,
    ]
    .join("\n");
    let search = r#"{"metric":"l2","dtype":"f32","filter":"none","exit":0,"route":"gpu","recall":1.0,"qps":9.0}"#;
    // Two sanitized searches (search_line's lines): one clean, one with a race.
    let sanitize = [
        r#"{"case":"tile-f32","tool":"memcheck","exit":0,"route":"gpu","gpu_kernel":"knn_tile_f32_a","errors":0,"warnings":null,"first_report":"","env":"FRAGLINK_GPU_KNN=1","args":"--n 6000"}"#,
        r#"{"case":"select","tool":"racecheck","exit":9,"route":"gpu","gpu_kernel":"knn_dist_f32","errors":2,"warnings":1,"first_report":"Error: Race reported | at knn_select_b256+0x10","env":"FRAGLINK_GPU_KNN=1","args":"--k 3000"}"#,
    ]
    .join("\n");
    // The comparison split over the calls (GPU_PEERS_ARGS='--dtypes ...').
    // Call 1's reached its deadline (`--seconds`) before f16's case and
    // before its own case's scan; call 2 measures the f16 case.
    let peers = |dtype: &str| {
        let mut doc = serde_json::json!({"n": 1_000_000, "dim": 128, "batch": 1000, "cases": [{
            "dtype": dtype, "nq": 100, "k": 10, "goal": 1.5, "floor_qps": 1e6,
            "floor_bound": "memory",
            "sides": {"torch.mm+topk": {"qps": 100.0, "recall": 1.0},
                      "fraglink": {"qps": 200.0, "recall": 1.0}}}]});
        if dtype == "f32" {
            let reason = "left out at the deadline (--seconds 300): 12 s left, about 40 s needed";
            doc["cases_left_out"] =
                serde_json::json!([{"dtype": "f16", "nq": 100, "k": 10, "reason": reason}]);
            doc["cases"][0]["sides_left_out"] = serde_json::json!(["fraglink/scan"]);
            doc["cases"][0]["left_out_reason"] = reason.into();
        }
        doc.to_string()
    };
    let first = collect_call(
        "1",
        &[
            ("steps.jsonl", &steps1),
            ("tests-gpu-tests.txt", nextest_output),
            ("search.jsonl", search),
            ("sanitize.jsonl", &sanitize),
            ("peers.json", &peers("f32")),
        ],
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
    let tests = doc["tests"].as_array().unwrap();
    let outcome = |t: &serde_json::Value| {
        format!(
            "{} {} {}",
            t["binary"].as_str().unwrap(),
            t["test"].as_str().unwrap(),
            t["outcome"].as_str().unwrap()
        )
    };
    assert_eq!(
        tests.iter().map(outcome).collect::<Vec<_>>(),
        [
            "fraglink::knn_gpu the_select_equals_the_cpu_path passed",
            "fraglink::search_gpu k_beyond_the_scan failed",
            "fraglink::ivf_gpu ivf_probes failed",
            "fraglink::knn_gpu every_dtype_and_metric stopped",
        ],
        "{doc}"
    );
    assert_eq!(doc["steps"][0]["tests_started"], 4, "{doc}");
    assert_eq!(doc["steps"][0]["tests_reported"], 4, "{doc}");

    // Call 2: the GPU tests again (the failing one fixed) and every test in
    // one run (`all-tests`), both to the end (JUnit).
    let junit = |cases: &str| {
        format!(
            "<?xml version=\"1.0\"?><testsuites>\
             <testsuite name=\"fraglink::search_gpu\">{cases}</testsuite></testsuites>"
        )
    };
    let steps2 = [
        r#"{"step":"gpu-tests","status":"done","seconds":300,"exit":0,"note":""}"#,
        r#"{"step":"tests","status":"done","seconds":200,"exit":0,"note":""}"#,
        r#"{"step":"all-tests","status":"done","seconds":250,"exit":0,"note":""}"#,
    ]
    .join("\n");
    let second = collect_call(
        "2",
        &[
            ("steps.jsonl", &steps2),
            (
                "junit-gpu-tests.xml",
                &junit(r#"<testcase name="k_beyond_the_scan" time="3.5"/>"#),
            ),
            (
                "junit-tests.xml",
                &junit(r#"<testcase name="a_portable_test" time="0.1"/>"#),
            ),
            (
                "junit-all-tests.xml",
                &junit(
                    r#"<testcase name="a_portable_test" time="0.1"/><testcase name="k_beyond_the_scan" time="3.5"/>"#,
                ),
            ),
            ("peers.json", &peers("f16")),
        ],
    );
    let md = render_md(&report_py, &[&first, &second], dir.path(), &root);
    assert!(
        md.contains("- tests: 3 passed, 1 failed, 0 skipped, 1 stopped at a call's budget"),
        "the fixed test passes, the crash stays failed: {md}"
    );
    assert!(md.contains("| search | done |"), "{md}");
    assert!(md.contains("| gpu-tests | done | 300 |"), "{md}");
    assert!(!md.contains("**Incomplete**"), "every step ran: {md}");
    assert!(md.contains("| l2 | f32 | none | 0 | gpu |"), "{md}");
    assert!(
        md.contains("| tile-f32 | memcheck | 0 | knn_tile_f32_a | 0 |  |  | FRAGLINK_GPU_KNN=1 --n 6000 |")
            && md.contains(
                "| select | racecheck | 9 | knn_dist_f32 | 2 | 1 | Error: Race reported \\| at knn_select_b256+0x10 |"
            ),
        "the sanitizer's table, a report's `|` escaped: {md}"
    );
    assert!(
        md.contains("| f32 | 100 | 10 | 200 (1) | 100 (1) |")
            && md.contains("| f16 | 100 | 10 | 200 (1) | 100 (1) |"),
        "both calls' comparison cases: {md}"
    );
    assert!(md.contains("| all-tests | done | 250 |"), "{md}");
    assert!(
        !md.contains("Cases not measured"),
        "call 2 measured the case call 1 left out: {md}"
    );
    assert!(
        md.contains("**Diagnostic sides not measured** (the run's deadline): f32 nq 100 k 10: fraglink/scan."),
        "{md}"
    );
    // Call 1 alone: incomplete.
    let md = render_md(&report_py, &[&first], dir.path(), &root);
    assert!(
        md.contains("**Incomplete**: gpu-tests, tests did not run to the end"),
        "{md}"
    );
    assert!(
        md.contains(
            "**Cases not measured** (left out at the deadline (--seconds 300): 12 s left, about 40 s needed): f16 nq 100 k 10."
        ),
        "{md}"
    );

    // Results of another commit do not merge.
    let mut other: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&second).unwrap()).unwrap();
    other["commit"] = "def456".into();
    let other_path = dir.path().join("other.json");
    std::fs::write(&other_path, other.to_string()).unwrap();
    let o = Command::new("python3")
        .args([
            report_py.to_str().unwrap(),
            "md",
            first.to_str().unwrap(),
            other_path.to_str().unwrap(),
            "--out",
            dir.path().join("x.md").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("different commits"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// gpu-run.sh's `ivf` step: benches/scripts/ivf_gpu_bench.py's `--dry-run`
/// plans the cases (the splits as src/search/splits.rs takes them),
/// `collect` picks up its ivf.json, and GPU.md shows each case's two sides
/// and their ratio, or its error.
#[test]
fn the_ivf_split_bench_dry_runs_collects_and_renders() {
    let root = support::manifest_dir();
    let dir = tempfile::tempdir().unwrap();
    let bench_py = root.join("benches/scripts/ivf_gpu_bench.py");
    let report_py = root.join("scripts/gpu_report.py");
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let ivf = logs.join("ivf.json");
    python(
        &[
            bench_py.to_str().unwrap(),
            "--dry-run",
            "--sm-count",
            "132",
            "--out",
            ivf.to_str().unwrap(),
        ],
        &root,
    );
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&ivf).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    // nq 1, 10, 100, 1000 × k 10, 100, 1000 × nprobe 16, 64.
    assert_eq!(cases.len(), 24);
    for c in cases {
        let [nq, k, nprobe] = ["nq", "k", "nprobe"].map(|f| c[f].as_u64().unwrap() as usize);
        use fraglink::search::splits::{splits, two_per_sm};
        let want = splits(nq, nprobe, k, two_per_sm(132));
        assert_eq!(c["splits"].as_u64(), Some(want as u64), "{c}");
        assert!(c.get("split_ms").is_none(), "nothing measured: {c}");
    }
    // One case measured and one failed, as the bench writes them.
    doc["cases"][0]["split_ms"] = 0.25.into();
    doc["cases"][0]["one_block_ms"] = 1.0.into();
    doc["cases"][0]["ratio"] = 4.0.into();
    doc["cases"][0]["recall"] = 0.93.into();
    doc["cases"][0]["same_recall"] = true.into();
    doc["cases"][1]["error"] = "fraglink search exited 2: boom".into();
    std::fs::write(&ivf, doc.to_string()).unwrap();
    let archive = dir.path().join("archive");
    std::fs::create_dir(&archive).unwrap();
    let results = collect(&report_py, &logs, &archive, &dir.path().join("out"), &root);
    let md = render_md(&report_py, &[&results], dir.path(), &root);
    assert!(
        md.contains("## IVF-Flat: probe splits against one block per query"),
        "{md}"
    );
    assert!(
        md.contains("| 1 | 10 | 16 | 16 | 0.25 | 1 | 4 | 0.93 |"),
        "{md}"
    );
    assert!(
        md.contains("| 10 | 10 | 16 | 16 | error: fraglink search exited 2: boom |"),
        "{md}"
    );
}
