//! Parameter-matrix files (cuVS semantics) from arbitrary bytes: the same
//! checks as `fraglink expand` and the build (UTF-8, JSON, 64-bit integers,
//! keyed leaves, product size within the default limits), then the
//! streamed expansion.
#![no_main]

use std::ops::ControlFlow;
use std::path::Path;

use fraglink::build::matrix::{load_bytes_with, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = load_bytes_with(Path::new("fuzz.json"), data.to_vec(), &Limits::default())
    else {
        return;
    };
    let mut n = 0u64;
    let _ = file.for_each_entry(|_| {
        n += 1;
        ControlFlow::Continue(())
    });
    assert!(u128::from(n) <= file.size().entries);
});
