//! `fraglink expand`: JSON output and one-line errors with exit code 2.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// The cuVS conformance matrices in the shared test data.
fn matrices_dir() -> PathBuf {
    support::testdata_dir().join("cuvs-matrices")
}

fn fraglink_expand(args: &[&std::ffi::OsStr]) -> Output {
    let bin = support::fraglink_bin();
    Command::new(&bin)
        .arg("expand")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
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
