//! `fraglink index build` and `fraglink search --index / --ivf-flat`: files
//! written and read back, recall against the exact answer, and exit 2 with a
//! clear error for truncated, corrupted and foreign index files and for flags
//! that conflict with the index.

mod support;

use std::path::Path;
use std::time::Duration;

use fraglink::search::data::{synthetic, write_vecs_file};
use fraglink::search::DType;
use serde_json::Value;
use support::{run_bounded, Bounded};

/// Memory cap of every run: far above what these data need, far below a
/// machine's worth, so an unbounded allocation fails instead of swapping.
const CAP: u64 = 4 << 30;

fn run(args: &[&str]) -> Bounded {
    run_bounded(
        args,
        &[("RAYON_NUM_THREADS", "2")],
        Some(CAP),
        Duration::from_secs(120),
    )
}

fn ok_json(args: &[&str]) -> Value {
    let out = run(args);
    assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", out.stdout))
}

fn fails(args: &[&str], needle: &str) {
    let out = run(args);
    assert_eq!(
        out.code,
        Some(2),
        "{args:?} should exit 2: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(out.stderr.contains("error"), "{args:?}: {}", out.stderr);
    assert!(
        out.stderr.contains(needle),
        "{args:?}: expected `{needle}` in {}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{args:?}: {}", out.stderr);
}

fn data(dir: &Path, dtype: DType) -> (String, String) {
    let (b, q) = synthetic(4000, 24, 50, dtype, 17);
    let ext = if matches!(dtype, DType::U8) {
        "bvecs"
    } else {
        "fvecs"
    };
    let (bp, qp) = (
        dir.join(format!("base.{ext}")),
        dir.join(format!("q.{ext}")),
    );
    write_vecs_file(&bp, &b).unwrap();
    write_vecs_file(&qp, &q).unwrap();
    (bp.display().to_string(), qp.display().to_string())
}

#[test]
fn build_then_search_reports_recall_and_full_probe_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    for (dtype, metric) in [
        (DType::F32, "l2"),
        (DType::F32, "cosine"),
        (DType::U8, "l2sqrt"),
        (DType::F32, "ip"),
    ] {
        let (b, q) = data(dir.path(), dtype);
        let idx = dir
            .path()
            .join(format!("{dtype}-{metric}.ivf"))
            .display()
            .to_string();
        let built = ok_json(&[
            "index",
            "build",
            "--kind",
            "ivf-flat",
            "--nlist",
            "20",
            "--base",
            &b,
            "--metric",
            metric,
            "--dtype",
            dtype.name(),
            "--seed",
            "3",
            "--out",
            &idx,
            "--json",
        ]);
        assert_eq!(built["nlist"], 20);
        assert_eq!(built["n"], 4000);
        assert_eq!(built["metric"], metric);
        assert!(built["build_seconds"].as_f64().unwrap() > 0.0);
        let full = ok_json(&[
            "search",
            "--index",
            &idx,
            "--queries",
            &q,
            "--nprobe",
            "20",
            "--k",
            "10",
            "--json",
        ]);
        assert_eq!(
            full["recall"], 1.0,
            "{dtype} {metric}: nprobe = nlist is brute force: {full}"
        );
        assert_eq!(full["index"], idx);
        assert_eq!(full["nprobe"], 20);
        assert_eq!(full["metric"], metric);
        let few = ok_json(&[
            "search",
            "--index",
            &idx,
            "--queries",
            &q,
            "--nprobe",
            "2",
            "--k",
            "10",
            "--json",
        ]);
        let r = few["recall"].as_f64().unwrap();
        assert!(r > 0.3 && r <= 1.0, "{dtype} {metric}: {few}");
        assert!(few["qps"].as_f64().unwrap() > 0.0);
        // The default nprobe (16 of 20 lists here) is documented in --help.
        let dflt = ok_json(&["search", "--index", &idx, "--queries", &q, "--json"]);
        assert_eq!(dflt["nprobe"], 16);
    }
}

#[test]
fn in_memory_ivf_search_on_files_and_synthetic_data() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = data(dir.path(), DType::F32);
    let v = ok_json(&[
        "search",
        "--ivf-flat",
        "--nlist",
        "16",
        "--nprobe",
        "16",
        "--base",
        &b,
        "--queries",
        &q,
        "--json",
    ]);
    assert_eq!(v["recall"], 1.0, "{v}");
    assert_eq!(v["index"], "memory");
    assert!(v["build_seconds"].as_f64().unwrap() > 0.0);
    let v = ok_json(&[
        "search",
        "--ivf-flat",
        "--nlist",
        "32",
        "--nprobe",
        "4",
        "--n",
        "5000",
        "--dim",
        "16",
        "--nq",
        "40",
        "--metric",
        "l2sqrt",
        "--filter",
        "bitset:0.5",
        "--json",
    ]);
    assert_eq!(v["nlist"], 32);
    assert_eq!(v["metric"], "l2sqrt");
    assert!(v["recall"].as_f64().unwrap() > 0.3, "{v}");
    // Unstructured data: IVF recall at a small nprobe drops below the clustered data's.
    let args = |data: &'static str| {
        [
            "search",
            "--ivf-flat",
            "--nlist",
            "32",
            "--nprobe",
            "2",
            "--n",
            "4000",
            "--dim",
            "16",
            "--nq",
            "60",
            "--data",
            data,
            "--json",
        ]
    };
    let clustered = ok_json(&args("clustered"))["recall"].as_f64().unwrap();
    let gaussian = ok_json(&args("gaussian"))["recall"].as_f64().unwrap();
    assert!(
        gaussian < clustered,
        "gaussian {gaussian} vs clustered {clustered}"
    );
    fails(
        &[
            "search",
            "--base",
            &b,
            "--queries",
            &q,
            "--data",
            "gaussian",
        ],
        "--data",
    );
    fails(&["search", "--data", "uniform"], "uniform");
    // l2sqrt for brute force too.
    let v = ok_json(&[
        "search", "--metric", "l2sqrt", "--n", "2000", "--dim", "8", "--nq", "5", "--device",
        "cpu", "--json",
    ]);
    assert_eq!(v["recall"], 1.0);
    assert_eq!(v["metric"], "l2sqrt");
}

#[test]
fn bad_index_files_and_conflicting_flags_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = data(dir.path(), DType::F32);
    let idx = dir.path().join("good.ivf");
    let idx_s = idx.display().to_string();
    ok_json(&[
        "index", "build", "--kind", "ivf-flat", "--nlist", "8", "--base", &b, "--out", &idx_s,
        "--json",
    ]);
    let bytes = std::fs::read(&idx).unwrap();
    let bad = dir.path().join("bad.ivf");
    let bad_s = bad.display().to_string();
    let search_bad = |content: &[u8], needle: &str| {
        std::fs::write(&bad, content).unwrap();
        fails(&["search", "--index", &bad_s, "--queries", &q], needle);
    };
    search_bad(&bytes[..bytes.len() / 2], "truncated");
    search_bad(&bytes[..30], "truncated");
    search_bad(b"", "not a fraglink index");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 3] ^= 1;
    search_bad(&flipped, "checksum");
    search_bad(&std::fs::read(&q).unwrap(), "not a fraglink index");
    let mut huge = bytes.clone();
    huge[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    huge[40..48].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    search_bad(&huge, "bad.ivf");
    fails(
        &[
            "search",
            "--index",
            &dir.path().join("absent.ivf").display().to_string(),
            "--queries",
            &q,
        ],
        "absent.ivf",
    );
    // Flags that conflict with the index, or make no sense without one.
    fails(
        &[
            "search",
            "--index",
            &idx_s,
            "--queries",
            &q,
            "--metric",
            "ip",
        ],
        "conflicts",
    );
    fails(
        &[
            "search",
            "--index",
            &idx_s,
            "--queries",
            &q,
            "--dtype",
            "u8",
        ],
        "conflicts",
    );
    fails(
        &[
            "search",
            "--index",
            &idx_s,
            "--queries",
            &q,
            "--nprobe",
            "0",
        ],
        "--nprobe 0",
    );
    fails(
        &["search", "--index", &idx_s, "--queries", &q, "--k", "4001"],
        "--k 4001",
    );
    fails(
        &["search", "--index", &idx_s, "--base", &b, "--queries", &q],
        "--base",
    );
    fails(&["search", "--index", &idx_s], "--queries");
    fails(&["search", "--nprobe", "4", "--n", "100"], "--nprobe");
    fails(&["search", "--nlist", "4"], "--ivf-flat");
    fails(
        &["search", "--ivf-flat", "--nlist", "0", "--n", "100"],
        "--nlist 0",
    );
    // Without a GPU, asking for one is an error naming the flag; with one,
    // the IVF-Flat search runs there (tests/ivf_gpu.rs).
    if fraglink::gpu::GpuContext::available().is_err() {
        fails(
            &[
                "search",
                "--ivf-flat",
                "--nlist",
                "8",
                "--device",
                "gpu",
                "--n",
                "100",
            ],
            "--device gpu",
        );
    }
    let (_, q16) = {
        let sub = dir.path().join("f16");
        std::fs::create_dir(&sub).unwrap();
        let (bb, _) = synthetic(10, 24, 3, DType::F16, 1);
        let p = sub.join("q.npy");
        fraglink::search::data::write_npy(&p, &bb).unwrap();
        ((), p.display().to_string())
    };
    fails(&["search", "--index", &idx_s, "--queries", &q16], "f16");
    fails(
        &[
            "index", "build", "--kind", "ivf-flat", "--nlist", "4001", "--base", &b, "--out",
            &bad_s,
        ],
        "--nlist 4001",
    );
    fails(
        &[
            "index", "build", "--kind", "ivf-flat", "--nlist", "4", "--base", &b, "--dtype", "i8",
            "--out", &bad_s,
        ],
        "conflicts",
    );
    fails(
        &[
            "index", "build", "--kind", "ivf-flat", "--nlist", "4", "--base", &b, "--metric", "l1",
            "--out", &bad_s,
        ],
        "l1",
    );
}

#[test]
fn repeat_reports_the_median_of_identical_searches() {
    for extra in [
        &["--ivf-flat", "--nlist", "16", "--nprobe", "2"][..],
        &[][..],
    ] {
        let mut args = vec![
            "search", "--n", "3000", "--dim", "8", "--nq", "20", "--repeat", "3", "--json",
        ];
        args.extend_from_slice(extra);
        let v = ok_json(&args);
        assert_eq!(v["repeat"], 3, "{v}");
        let runs: Vec<f64> = v["search_ms_runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(runs.len(), 3);
        assert_eq!(v["search_ms_first"].as_f64().unwrap(), runs[0]);
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(v["search_ms"].as_f64().unwrap(), sorted[1], "{v}");
        assert_eq!(v["search_ms_min"].as_f64().unwrap(), sorted[0]);
    }
    fails(
        &["search", "--repeat", "0"],
        "--repeat 0: expected 1 to 1000",
    );
}
