//! `fraglink expand`: JSON output and one-line errors with exit code 2.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// The cuVS conformance matrices in the shared test data.
fn matrices_dir() -> PathBuf {
    support::testdata_dir().join("cuvs-matrices")
}

/// The product limit's variable; unset for the tests unless they set it.
const MAX_ENTRIES_VAR: &str = "FRAGLINK_MATRIX_MAX_ENTRIES";

fn expand_command(args: &[&std::ffi::OsStr]) -> Command {
    let mut command = Command::new(support::fraglink_bin());
    command.arg("expand").args(args).env_remove(MAX_ENTRIES_VAR);
    command
}

fn run(mut command: Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn fraglink_expand(args: &[&std::ffi::OsStr]) -> Output {
    run(expand_command(args))
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn json_output_equals_the_expected_product() {
    let stem = "neighbors__detail__cagra__jit_lto_kernels__search_single_cta_matrix";
    let dir = matrices_dir();
    let matrix = dir.join(format!("{stem}.json"));
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("expected/{stem}.expected.json"))).unwrap(),
    )
    .unwrap();

    let output = fraglink_expand(&["--json".as_ref(), matrix.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one compact line");
    let got: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(got, expected);
    assert!(expected["entries"].as_array().unwrap().len() > 1);
}

#[test]
fn table_output_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    std::fs::write(
        &path,
        r#"{"_t": [{"t": "float"}, {"t": "half"}], "g": {"v": ["1", "4"]}}"#,
    )
    .unwrap();
    let output = fraglink_expand(&[path.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    assert_eq!(
        stdout,
        "t      v\nfloat  1\nfloat  4\nhalf   1\nhalf   4\n4 entries\n"
    );
    assert_eq!(
        stderr_lines(&output),
        [
            "warning: Key \"g\" at root is never used in a matrix product entry and is used only \
          for grouping. Consider renaming it to \"_g\" to indicate this."
        ]
    );
}

#[test]
fn keyless_leaf_names_file_and_json_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nokey.json");
    // The keyless "x" comes after a branch that yields an entry.
    std::fs::write(&path, r#"[{"a": "1"}, [{"b": "2"}, "x"]]"#).unwrap();
    for json in [false, true] {
        let mut args = vec![path.as_os_str()];
        if json {
            args.insert(0, "--json".as_ref());
        }
        let output = fraglink_expand(&args);
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        assert!(output.stdout.is_empty());
        assert_eq!(
            stderr_lines(&output),
            [format!(
                "error: {}: leaf value at root[1][1] has no object key above it",
                path.display()
            )]
        );
    }
}

#[test]
fn invalid_json_names_file_and_line_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, "{\n  \"a\": [\"1\",, \"2\"]\n}\n").unwrap();
    let output = fraglink_expand(&["--json".as_ref(), path.as_os_str()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty());
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("error: {}:2:13: invalid JSON: ", path.display())),
        "{lines:?}"
    );
}

#[test]
fn unreadable_file_is_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.json");
    let output = fraglink_expand(&[path.as_os_str()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!(
            "error: {}: cannot read matrix file: ",
            path.display()
        )),
        "{lines:?}"
    );
}

/// Bad input: exit 2, nothing on stdout, one `error:` line on stderr (and no
/// panic). Returns that line.
fn assert_bad_input(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let lines = stderr_lines(output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("error: "), "{lines:?}");
    lines.into_iter().next().unwrap()
}

fn write_matrix(dir: &tempfile::TempDir, name: &str, text: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `{"k00": [0..values], ...}`: `values ^ keys` entries.
fn dims(keys: usize, values: usize) -> String {
    let dims: serde_json::Map<String, Value> = (0..keys)
        .map(|k| (format!("k{k:02}"), (0..values).map(Value::from).collect()))
        .collect();
    Value::Object(dims).to_string()
}

#[test]
fn values_and_keys_longer_than_a_format_width() {
    // Format widths stop at 65,535 characters; `expand` panicked beyond.
    let dir = tempfile::tempdir().unwrap();
    let long = "v".repeat(70_000);
    let key = "k".repeat(66_000);
    let matrix = serde_json::json!({ "a": [long, "short"], &key: "1" });
    let path = write_matrix(&dir, "long.json", matrix.to_string());

    let output = fraglink_expand(&[path.as_os_str()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("a{}  {key}", " ".repeat(69_999)),
            format!("{long}  1"),
            format!("short{}  1", " ".repeat(69_995)),
            "2 entries".to_owned(),
        ]
    );

    let output = fraglink_expand(&["--json".as_ref(), path.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(got["entries"][0]["a"].as_str().unwrap().len(), 70_000);
}

#[test]
fn products_over_the_limit_are_refused_with_their_size() {
    let dir = tempfile::tempdir().unwrap();
    // 12 keys x 10 values: 10^12 entries, which grew until out of memory.
    let path = write_matrix(&dir, "huge.json", dims(12, 10));
    for json in [false, true] {
        let mut args = vec![path.as_os_str()];
        if json {
            args.insert(0, "--json".as_ref());
        }
        let line = assert_bad_input(&fraglink_expand(&args));
        assert_eq!(
            line,
            format!(
                "error: {}: the matrix product has 1000000000000 entries, more than the limit \
                 of 100000 (set FRAGLINK_MATRIX_MAX_ENTRIES to raise it)",
                path.display()
            )
        );
    }

    // The limit is the variable's: 3 x 2 = 6 entries pass at 6, not at 5.
    let small = write_matrix(
        &dir,
        "small.json",
        dims(2, 3).replace("k01\":[0,1,2]", "k01\":[0,1]"),
    );
    let mut at_limit = expand_command(&["--json".as_ref(), small.as_os_str()]);
    at_limit.env(MAX_ENTRIES_VAR, "6");
    let output = run(at_limit);
    assert!(output.status.success(), "{output:?}");
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(got["entries"].as_array().unwrap().len(), 6);
    let mut over = expand_command(&[small.as_os_str()]);
    over.env(MAX_ENTRIES_VAR, "5");
    let line = assert_bad_input(&run(over));
    assert!(
        line.ends_with(
            "has 6 entries, more than the limit of 5 (set FRAGLINK_MATRIX_MAX_ENTRIES to raise it)"
        ),
        "{line}"
    );

    // A bad value names the variable.
    let mut bad = expand_command(&[small.as_os_str()]);
    bad.env(MAX_ENTRIES_VAR, "lots");
    let line = assert_bad_input(&run(bad));
    assert_eq!(
        line,
        "error: FRAGLINK_MATRIX_MAX_ENTRIES=\"lots\": expected a whole number of matrix entries"
    );
}

#[test]
fn empty_products_that_take_too_long_are_refused() {
    // No entry, but 10^9 branches to walk before the empty array.
    let dir = tempfile::tempdir().unwrap();
    let thousand: Vec<u32> = (0..1000).collect();
    let matrix = serde_json::json!({"a": thousand, "b": thousand, "c": thousand, "z": []});
    let path = write_matrix(&dir, "slow.json", matrix.to_string());
    let line = assert_bad_input(&fraglink_expand(&[path.as_os_str()]));
    assert_eq!(
        line,
        format!(
            "error: {}: expanding the matrix takes 2002002002 steps for its 0 entries \
             (0 values in all), more than the limit of 6400000 (64 per allowed entry, \
             FRAGLINK_MATRIX_MAX_ENTRIES=100000; set it to raise the limit)",
            path.display()
        )
    );
}

#[test]
fn oversized_and_endless_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.json");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len((16 << 20) + 1).unwrap(); // sparse
    drop(file);
    let line = assert_bad_input(&fraglink_expand(&[path.as_os_str()]));
    assert_eq!(
        line,
        format!(
            "error: {}: the matrix file is larger than 16777216 bytes (16 MiB), the most \
             fraglink reads (it has 16777217)",
            path.display()
        )
    );
    if std::path::Path::new("/dev/zero").exists() {
        let line = assert_bad_input(&fraglink_expand(&["/dev/zero".as_ref()]));
        assert!(
            line.starts_with("error: /dev/zero: the matrix file is larger than"),
            "{line}"
        );
    }
}

#[test]
fn json_output_is_streamed() {
    // 10^7 entries (a few GB if collected first). Streaming, the first bytes
    // come at once and the process then waits on the full pipe with little
    // memory; it is killed after the check.
    let dir = tempfile::tempdir().unwrap();
    let path = write_matrix(&dir, "ten_million.json", dims(7, 10));
    let mut command = expand_command(&["--json".as_ref(), path.as_os_str()]);
    command
        .env(MAX_ENTRIES_VAR, "10000000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = vec![0u8; 4096];
    std::io::Read::read_exact(&mut stdout, &mut head).unwrap();
    assert!(
        head.starts_with(br#"{"entries":[{"k00":0,"k01":0,"k02":0,"#),
        "{}",
        String::from_utf8_lossy(&head[..100])
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
    child.kill().unwrap();
    child.wait().unwrap();
    if let Ok(status) = status {
        let rss_kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        assert!(rss_kb < 200 * 1024, "{rss_kb} kB resident while streaming");
    }
}

#[test]
fn streamed_table_and_json_are_complete() {
    // 5^6 = 15,625 entries, both passes of the table included.
    let dir = tempfile::tempdir().unwrap();
    let path = write_matrix(&dir, "m.json", dims(6, 5));
    let output = fraglink_expand(&[path.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 15_627);
    assert_eq!(lines[0], "k00  k01  k02  k03  k04  k05");
    assert_eq!(lines[1], "0    0    0    0    0    0");
    assert_eq!(lines[15_625], "4    4    4    4    4    4");
    assert_eq!(lines[15_626], "15625 entries");
    let output = fraglink_expand(&["--json".as_ref(), path.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();
    let expected =
        serde_json::to_value(fraglink::build::matrix::expand_file(&path).unwrap()).unwrap();
    assert_eq!(got, expected);
}

#[test]
fn table_with_100000_keys_is_fast() {
    // Quadratic column bookkeeping took 23 s (release) for this; --json 0.12 s.
    let dir = tempfile::tempdir().unwrap();
    let keys: serde_json::Map<String, Value> = (0..100_000)
        .map(|i| (format!("k{i:06}"), Value::from("v")))
        .collect();
    let path = write_matrix(&dir, "keys.json", Value::Object(keys).to_string());
    let started = std::time::Instant::now();
    let output = fraglink_expand(&[path.as_os_str()]);
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{output:?}");
    assert!(elapsed.as_secs() < 20, "{elapsed:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("k000000  k000001  ") && lines[0].ends_with("  k099999"));
    assert_eq!(lines[1], vec!["v"; 100_000].join("        "));
    assert_eq!(lines[2], "1 entry");
}

#[test]
fn byte_order_mark_is_named() {
    // As in cuVS, whose Python json.load rejects a BOM ("Unexpected UTF-8 BOM").
    let dir = tempfile::tempdir().unwrap();
    let path = write_matrix(&dir, "bom.json", b"\xef\xbb\xbf{\"a\": \"1\"}");
    let line = assert_bad_input(&fraglink_expand(&[path.as_os_str()]));
    assert_eq!(
        line,
        format!(
            "error: {}:1:1: invalid JSON: unexpected UTF-8 byte-order mark (U+FEFF) at the \
             start of the file; save it as UTF-8 without a BOM (cuVS's Python json.load \
             rejects it too)",
            path.display()
        )
    );
    let path = write_matrix(&dir, "latin1.json", b"{\"a\": \"caf\xe9\"}");
    let line = assert_bad_input(&fraglink_expand(&[path.as_os_str()]));
    assert_eq!(
        line,
        format!(
            "error: {}:1:11: invalid JSON: invalid UTF-8 (byte 0xe9); matrix files are UTF-8",
            path.display()
        )
    );
}

#[test]
fn numbers_print_as_cuvs_python_prints_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_matrix(
        &dir,
        "numbers.json",
        r#"{"v": [-0, -0.0, 12345678901234567890, -9223372036854775808, 1.0, 1e15, 1e16, 1.5e-7, 0.0001, 0.00001, 0.1, 5e-324, 1.7976931348623157e308]}"#,
    );
    // Python: json.dumps(json.loads(...)) gives these values.
    let python = [
        "0",
        "-0.0",
        "12345678901234567890",
        "-9223372036854775808",
        "1.0",
        "1000000000000000.0",
        "1e+16",
        "1.5e-07",
        "0.0001",
        "1e-05",
        "0.1",
        "5e-324",
        "1.7976931348623157e+308",
    ];
    let output = fraglink_expand(&["--json".as_ref(), path.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let entries: Vec<String> = python.iter().map(|v| format!("{{\"v\":{v}}}")).collect();
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("{{\"entries\":[{}],\"warnings\":[]}}\n", entries.join(","))
    );
    let output = fraglink_expand(&[path.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("v\n{}\n13 entries\n", python.join("\n"))
    );

    // What cannot match Python is refused, not altered.
    let path = write_matrix(
        &dir,
        "wide_int.json",
        r#"{"v": [1, 123456789012345678901234567890]}"#,
    );
    let line = assert_bad_input(&fraglink_expand(&[path.as_os_str()]));
    assert_eq!(
        line,
        format!(
            "error: {}:1:11: integer 123456789012345678901234567890 does not fit in 64 bits; \
             cuVS's Python keeps it exact but fraglink cannot (write it as a string)",
            path.display()
        )
    );
    let path = write_matrix(&dir, "inf.json", r#"{"v": 1e400}"#);
    let line = assert_bad_input(&fraglink_expand(&[path.as_os_str()]));
    assert!(
        line.ends_with(
            "invalid JSON: number out of range (beyond ±1.8e308; Python would read it as \
             Infinity, which fraglink cannot represent)"
        ),
        "{line}"
    );
}
