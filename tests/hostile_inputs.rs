//! The README's error contract under hostile input, through the real CLI:
//! for every class below, several generated variants each get exit code 2,
//! an `error:` line naming the file, option or variable at fault, and no
//! panic. Every child runs under a memory cap (`RLIMIT_AS`) and a timeout,
//! so a regression that hangs or allocates without bound fails the test
//! instead of taking the machine down.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Address-space cap of each child: far above what a correct run needs here.
const MEMORY_CAP: u64 = 2 << 30;
/// A child still running after this is a hang.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the CLI with `args` and `env` (the disk cache off unless `env`
/// turns it on), capped in memory and time.
fn run(args: &[&str], env: &[(&str, &str)]) -> support::Bounded {
    let mut all = vec![("FRAGLINK_CACHE_DISABLE", "1")];
    all.extend_from_slice(env);
    support::run_bounded(args, &all, Some(MEMORY_CAP), TIMEOUT)
}

/// Exit 2, one `error:` line naming `needle`, no panic.
fn assert_refused(args: &[&str], env: &[(&str, &str)], needle: &str) {
    let o = run(args, env);
    assert!(
        !o.stderr.contains("panicked"),
        "{args:?} panicked:\n{}",
        o.stderr
    );
    assert_eq!(o.code, Some(2), "{args:?} {env:?}:\n{}", o.stderr);
    let errors: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{args:?}: one error line:\n{}", o.stderr);
    assert!(
        errors[0].contains(needle),
        "{args:?}: the error should name {needle:?}:\n{}",
        o.stderr
    );
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_owned()
}

fn vecs_header(dim: i32, payload: &[u8]) -> Vec<u8> {
    let mut b = dim.to_le_bytes().to_vec();
    b.extend_from_slice(payload);
    b
}

#[test]
fn hostile_matrices() {
    let dir = tempfile::tempdir().unwrap();
    let long = "k".repeat(70_000);
    let cases: Vec<(String, Vec<u8>)> = vec![
        (
            "long_key.json".into(),
            format!("{{\"{long}\": [1, 2]}}").into_bytes(),
        ),
        (
            "long_value.json".into(),
            format!("{{\"k\": [\"{long}\"]}}").into_bytes(),
        ),
        ("bom.json".into(), b"\xef\xbb\xbf{\"k\": [1]}".to_vec()),
        ("not_json.json".into(), b"{\"k\": [1,".to_vec()),
        ("empty.json".into(), Vec::new()),
        ("binary.json".into(), vec![0xff, 0xfe, 0x00, 0x01]),
        (
            // 10^12 entries: refused from its size, never materialised.
            "product.json".into(),
            format!(
                "{{{}}}",
                (0..12)
                    .map(|i| format!("\"k{i}\": [0,1,2,3,4,5,6,7,8,9]"))
                    .collect::<Vec<_>>()
                    .join(",")
            )
            .into_bytes(),
        ),
    ];
    for (name, bytes) in cases {
        let path = write(dir.path(), &name, &bytes);
        for json in [false, true] {
            let mut args = vec!["expand", path.as_str()];
            if json {
                args.push("--json");
            }
            let o = run(&args, &[]);
            // A long key or value is valid input: it expands (exit 0).
            if name.starts_with("long_") {
                assert_eq!(o.code, Some(0), "{name}: {}", o.stderr);
                assert!(!o.stderr.contains("panicked"), "{name}: {}", o.stderr);
                continue;
            }
            assert_refused(&args, &[], &name);
        }
    }
}

#[test]
fn hostile_vector_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let queries = write(d, "q.fvecs", &vecs_header(4, &[0u8; 16]));
    let bases: Vec<(String, &str)> = vec![
        // A 12-byte file claiming dim 2^31-1.
        (
            write(d, "huge_dim.fvecs", &vecs_header(i32::MAX, &[0u8; 8])),
            "huge_dim.fvecs",
        ),
        (
            write(d, "neg_dim.fvecs", &vecs_header(-5, &[0u8; 8])),
            "neg_dim.fvecs",
        ),
        (
            write(d, "zero_dim.fvecs", &vecs_header(0, &[])),
            "zero_dim.fvecs",
        ),
        (
            write(d, "truncated.fvecs", &vecs_header(4, &[0u8; 9])),
            "truncated.fvecs",
        ),
        (
            write(
                d,
                "ragged.bvecs",
                &[vecs_header(2, &[1, 2]), vecs_header(3, &[1, 2, 3])].concat(),
            ),
            "ragged.bvecs",
        ),
        (write(d, "empty.fvecs", &[]), "empty.fvecs"),
        (
            write(
                d,
                "overflow.npy",
                &support::npy_bytes("<f4", "(4611686018427387904, 8)", &[]),
            ),
            "overflow.npy",
        ),
        (
            write(
                d,
                "lying.npy",
                &support::npy_bytes("<f4", "(1000000, 128)", &[0u8; 64]),
            ),
            "lying.npy",
        ),
        (
            write(
                d,
                "dtype.npy",
                &support::npy_bytes("<c16", "(1, 1)", &[0u8; 16]),
            ),
            "dtype.npy",
        ),
        (
            write(d, "bad_magic.npy", b"\x93NUMPX\x01\x00\x00\x00"),
            "bad_magic.npy",
        ),
        (write(d, "unknown.txt", b"1 2 3"), "unknown.txt"),
    ];
    for (base, needle) in &bases {
        assert_refused(
            &[
                "search",
                "--device",
                "cpu",
                "--base",
                base,
                "--queries",
                &queries,
                "--k",
                "1",
            ],
            &[],
            needle,
        );
    }
}

#[test]
fn hostile_ground_truth() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rows = |n: usize, dim: i32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| vecs_header(dim, &vec![(i % 7) as u8; dim as usize * 4]))
            .collect()
    };
    let base = write(d, "b.fvecs", &rows(50, 4));
    let queries = write(d, "q.fvecs", &rows(3, 4));
    let ids = |rows: &[Vec<i32>]| -> Vec<u8> {
        rows.iter()
            .flat_map(|r| {
                let mut b = (r.len() as i32).to_le_bytes().to_vec();
                r.iter().for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
                b
            })
            .collect()
    };
    let cases = [
        (
            "more_rows.ivecs",
            ids(&[vec![0, 1], vec![0, 1], vec![0, 1], vec![0, 1]]),
        ),
        ("fewer_rows.ivecs", ids(&[vec![0, 1]])),
        ("narrow.ivecs", ids(&[vec![0], vec![0], vec![0]])),
        (
            "out_of_range.ivecs",
            ids(&[vec![0, 1], vec![0, 50], vec![0, 1]]),
        ),
        (
            "minus_one.ivecs",
            ids(&[vec![0, 1], vec![-1, 1], vec![0, 1]]),
        ),
    ];
    for (name, bytes) in cases {
        let gt = write(d, name, &bytes);
        assert_refused(
            &[
                "search",
                "--device",
                "cpu",
                "--base",
                &base,
                "--queries",
                &queries,
                "--groundtruth",
                &gt,
                "--k",
                "2",
            ],
            &[],
            name,
        );
    }
}

#[test]
fn hostile_sizes() {
    for (args, needle) in [
        (vec!["--k", "1000000000000", "--n", "100"], "--k"),
        (vec!["--n", "1000000000000"], "--n"),
        (vec!["--n", "4611686018427387904", "--dim", "8"], "--n"),
        (vec!["--n", "100", "--dim", "0"], "--dim"),
        (vec!["--n", "100", "--nq", "0"], "--nq"),
        (vec!["--n", "100", "--k", "101"], "--k"),
    ] {
        let mut all = vec![
            "search", "--device", "cpu", "--metric", "l2", "--dtype", "f32",
        ];
        all.extend(&args);
        if !args.contains(&"--k") {
            all.extend(["--k", "10"]);
        }
        assert_refused(&all, &[], needle);
    }
}

#[test]
fn hostile_environment() {
    // Invalid values are errors naming the variable where they are used.
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    let link = [
        "link",
        "--arch",
        "sm_90",
        "scan_f32_u32_v4_k128",
        "metric_l2_f32",
        "filter_none_u32",
    ];
    for (var, value) in [
        ("FRAGLINK_CACHE_MAX_BYTES", "lots"),
        ("FRAGLINK_CACHE_MAX_BYTES", "-1"),
        ("FRAGLINK_MEMORY_CACHE_ENTRIES", "many"),
    ] {
        assert_refused(
            &link,
            &[
                ("FRAGLINK_CACHE_DISABLE", "0"),
                ("FRAGLINK_CACHE_DIR", dir),
                (var, value),
            ],
            var,
        );
    }
    assert_refused(
        &["search", "--device", "cpu", "--n", "100", "--k", "1"],
        &[("RAYON_NUM_THREADS", "abc")],
        "RAYON_NUM_THREADS",
    );
    // ...and a CPU search, which links only to describe its GPU plan, is
    // not failed by them: it describes the plan without a disk cache.
    let o = run(
        &["search", "--device", "cpu", "--n", "200", "--k", "1"],
        &[("FRAGLINK_CACHE_MAX_BYTES", "lots")],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn hostile_cache_entries() {
    // An entry replaced by a FIFO, a link to /dev/zero, garbage, or another
    // arch's valid entry: never a hang, never served; the link is redone.
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap().to_owned();
    let env = [
        ("FRAGLINK_CACHE_DISABLE", "0"),
        ("FRAGLINK_CACHE_DIR", dir.as_str()),
    ];
    let link = |arch: &str| -> (Option<i32>, String) {
        let out = Command::new(support::fraglink_bin())
            .args(["link", "--json", "--arch", arch])
            .args(["scan_f32_u32_v4_k128", "metric_l2_f32", "filter_none_u32"])
            .envs(env)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, json) = link("sm_90");
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let key = v["key"].as_str().unwrap().to_owned();
    let entry = cache
        .path()
        .join(fraglink::link::disk::DiskCache::file_name(&key));
    assert!(entry.is_file(), "the link wrote its entry");
    // Another arch's entry, to plant under this key.
    let (code, _) = link("sm_75");
    assert_eq!(code, Some(0));
    let other = std::fs::read_dir(cache.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| *p != entry && p.extension() == entry.extension())
        .expect("the sm_75 entry");
    type Plant<'a> = Box<dyn Fn(&Path) + 'a>;
    let plant: Vec<(&str, Plant)> = vec![
        (
            "fifo",
            Box::new(|p: &Path| {
                let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
                // SAFETY: a valid C string; mkfifo has no other precondition.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
        ),
        (
            "dev_zero",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ),
        (
            "garbage",
            Box::new(|p: &Path| std::fs::write(p, vec![0x5a; 4096]).unwrap()),
        ),
        (
            "other_arch",
            Box::new(|p: &Path| {
                std::fs::copy(&other, p).unwrap();
            }),
        ),
    ];
    for (name, make) in plant {
        let _ = std::fs::remove_file(&entry);
        make(&entry);
        let o = run(
            &[
                "link",
                "--json",
                "--arch",
                "sm_90",
                "scan_f32_u32_v4_k128",
                "metric_l2_f32",
                "filter_none_u32",
            ],
            &env,
        );
        assert!(!o.stderr.contains("panicked"), "{name}: {}", o.stderr);
        assert_eq!(o.code, Some(0), "{name}: {}", o.stderr);
    }
}
