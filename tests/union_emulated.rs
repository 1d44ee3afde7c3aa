//! The union bound's select (fragments/knn_tile.cuh, compact's pass -1: the
//! r-th smallest of a sample of a query's certificates) under the SIMT
//! emulator while other warps lower the certificates it reads, as other
//! blocks do on a GPU between the select's rounds.
//!
//! tests/knn_emulated.rs runs whole searches, but its blocks run one after
//! another, so a certificate never changes during a select there: the
//! select's handling of that (certificates only fall; a round that counts
//! fewer keys than the rank still wanted gives no bound, `pick_digit`) is
//! checked here. Each select's result, rounded up to its 2⁸-key bucket as
//! `compact` uses it, must have at least r sampled certificates at or below
//! it when it returns; without lowering it must be the exact r-th smallest's
//! top three bytes. The sample is spread over the chunks: 40, 300 and 1000
//! chunks (all read; 256 of 300; 256 of 1000).

mod support;

use std::process::Command;

use support::emulated;

fn counts(out: &str) -> [u32; 4] {
    let v: Vec<u32> = out
        .split_whitespace()
        .skip(1)
        .step_by(2)
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(v.len(), 4, "{out}");
    [v[0], v[1], v[2], v[3]]
}

#[test]
fn the_union_select_stays_sound_while_certificates_fall() {
    let dir = tempfile::tempdir().unwrap();
    let exe = emulated::build(
        dir.path(),
        "union_select",
        &[],
        "knn_tile.cuh",
        "#include \"union_driver.h\"\nint main(int argc, char** argv) { return simt_union::union_main(argc, argv); }\n",
    );
    let mut lowered_none = 0;
    for (n, r) in [(40u32, 5u32), (40, 40), (300, 20), (300, 256), (1000, 100)] {
        for lower in [0, 1] {
            for seed in 1..=6u64 {
                let args = [seed, n as u64, r as u64, lower].map(|a| a.to_string());
                let out = Command::new(&exe).args(&args).output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                let what = format!(
                    "n {n} r {r} lower {lower} seed {seed}: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(out.status.success(), "{what}");
                let [calls, unsound, none, inexact] = counts(&text);
                assert_eq!(calls, 24, "{what}");
                assert_eq!(unsound, 0, "{what}");
                if lower == 0 {
                    assert_eq!(inexact, 0, "{what}");
                } else {
                    lowered_none += none;
                }
            }
        }
    }
    // The lowering does reach a select between its rounds: some selects
    // found too few keys under the bytes they had found and gave no bound.
    eprintln!("selects without a bound under lowering: {lowered_none}");
}
