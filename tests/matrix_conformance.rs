//! Conformance: the 82 real cuVS matrices expand exactly as cuVS's own
//! `compute_matrix_product.py` expands them.

mod support;

use std::path::{Path, PathBuf};

use fraglink::build::matrix::expand_file;
use serde_json::Value;

/// The cuVS conformance matrices in the shared test data.
fn matrices_dir() -> PathBuf {
    support::testdata_dir().join("cuvs-matrices")
}

fn matrix_files() -> Vec<PathBuf> {
    let dir = matrices_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Describes the first difference between two lists, or `None` if equal.
fn first_difference(what: &str, got: &[Value], expected: &[Value]) -> Option<String> {
    if let Some(i) = (0..got.len().min(expected.len())).find(|&i| got[i] != expected[i]) {
        return Some(format!(
            "{what}[{i}] differs:\n  got      {}\n  expected {}",
            got[i], expected[i]
        ));
    }
    (got.len() != expected.len()).then(|| {
        format!(
            "{what}: got {} items, expected {} (first extra/missing at index {})",
            got.len(),
            expected.len(),
            got.len().min(expected.len())
        )
    })
}

#[test]
fn cuvs_matrices_expand_like_cuvs() {
    let files = matrix_files();
    let mut checked = 0;
    let mut failures = Vec::new();
    let dir = matrices_dir();
    for file in &files {
        let stem = file.file_stem().unwrap().to_string_lossy();
        let expected_path = dir.join("expected").join(format!("{stem}.expected.json"));
        let expected = read_json(&expected_path);
        let product = match expand_file(file) {
            Ok(product) => product,
            Err(e) => {
                failures.push(format!("{}: expansion failed: {e}", file.display()));
                continue;
            }
        };
        let got = serde_json::to_value(&product).expect("product serializes");
        for what in ["entries", "warnings"] {
            let got_list = got[what].as_array().expect("array");
            let expected_list = expected[what]
                .as_array()
                .unwrap_or_else(|| panic!("{}: no {what} array", expected_path.display()));
            if let Some(diff) = first_difference(what, got_list, expected_list) {
                failures.push(format!("{}: {diff}", file.display()));
            }
        }
        checked += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 82, "expected exactly 82 conformance matrices");
}

#[test]
fn conformance_set_is_not_vacuous() {
    // A guard against a vacuous comparison: the set produces entries.
    let total: usize = matrix_files()
        .iter()
        .map(|file| expand_file(file).expect("expands").entries.len())
        .sum();
    assert!(total > 82, "only {total} entries in the conformance set");
}
