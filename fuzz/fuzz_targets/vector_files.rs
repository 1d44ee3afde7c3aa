//! `.fvecs` / `.bvecs` / `.ivecs` / `.npy` decoding: the first byte picks
//! the format, the rest is the file. Errors are fine; panics, hangs and
//! unbounded allocation are not.
#![no_main]

use std::path::Path;

use fraglink::search::data::{ivecs_from_bytes, vectors_from_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, file)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => drop(vectors_from_bytes(Path::new("f.fvecs"), file.to_vec())),
        1 => drop(vectors_from_bytes(Path::new("f.bvecs"), file.to_vec())),
        2 => drop(vectors_from_bytes(Path::new("f.npy"), file.to_vec())),
        _ => drop(ivecs_from_bytes(Path::new("f.ivecs"), file)),
    }
});
