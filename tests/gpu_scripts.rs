//! The GPU machine's Python side, checked here without a GPU, torch or
//! numpy: benches/scripts/gpu_peers.py (the exact k-NN comparison with torch
//! and CuPy that scripts/gpu-run.sh runs) and scripts/gpu_report.py (which
//! puts its results into GPU.md) compile, the comparison's `--dry-run`
//! writes every case of the grid with its floor and goal, and the
//! report renders that document.

mod support;

use std::path::Path;
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

/// `gpu_report.py md RESULTS`: the GPU.md it writes (into `dir`).
fn render_md(report_py: &Path, results: &Path, dir: &Path, root: &Path) -> String {
    let md = dir.join("GPU.md");
    python(
        &[
            report_py.to_str().unwrap(),
            "md",
            results.to_str().unwrap(),
            "--out",
            md.to_str().unwrap(),
        ],
        root,
    );
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
        "fraglink[knn_tile_f32_tf32x3_q64_r64_k32]": {"error": "FRAGLINK_KNN_VARIANT = ..."}
    });
    doc["cases"][0]["best_variant"] = "knn_tile_f32_tf32_q64_r64_k32".into();
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
    let md = render_md(&report_py, &results, dir.path(), &root);
    assert!(md.contains("Exact k-NN against torch and CuPy"), "{md}");
    // The search matrix names the kernel that served each search.
    assert!(
        md.contains("| route | kernel |") && md.contains("knn_tile_f16_f16_q32_k32"),
        "{md}"
    );
    assert!(
        md.contains("fraglink kernel") && md.contains("tensor cores / scan"),
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
    assert_eq!(rows, 14 + 2, "{md}");
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
    ]
    .join("\n");
    std::fs::write(logs.join("ncu-knn-nq1.csv"), csv).unwrap();
    let out = dir.path().join("out");
    python(
        &[
            report_py.to_str().unwrap(),
            "collect",
            "--logs",
            logs.to_str().unwrap(),
            "--archive",
            dir.path().to_str().unwrap(),
            "--gpu",
            "1",
            "--tests-exit",
            "0",
            "--out",
            out.to_str().unwrap(),
        ],
        &root,
    );
    let results = out.join("gpu-results.json");
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
    let md = render_md(&report_py, &results, dir.path(), &root);
    assert!(
        md.contains("## Kernel profiles")
            && md.contains("| knn-nq1 | knn_tile_f32_tf32x3_q16_k32 | (1, 528, 1) | (128, 1, 1) | 412.35 usecond | 71.20 % |"),
        "{md}"
    );
}
