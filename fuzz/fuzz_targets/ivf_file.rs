//! IVF-Flat index files (`fraglink index build`'s output): the first byte
//! picks whether the input is the file as it is, or the file with its
//! trailing blake3 recomputed, so that mutations reach past the checksum
//! into the lists and the id check. Errors are fine; panics, hangs and
//! unbounded allocation are not.
#![no_main]

use std::path::Path;

use fraglink::search::ivf::index_from_bytes;
use libfuzzer_sys::fuzz_target;

/// The index file's trailing checksum (src/search/ivf/file.rs).
const SUM: usize = 32;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, file)) = data.split_first() else {
        return;
    };
    let path = Path::new("f.ivf");
    if mode & 1 == 0 || file.len() < SUM {
        let _ = index_from_bytes(path, file);
        return;
    }
    let mut fixed = file.to_vec();
    let body = fixed.len() - SUM;
    let sum = *blake3::hash(&fixed[..body]).as_bytes();
    fixed[body..].copy_from_slice(&sum);
    if let Ok(index) = index_from_bytes(path, &fixed) {
        // What it accepted, it holds: every row once.
        assert_eq!(index.reconstruct().rows(), index.rows());
    }
});
