//! The disk cache's entry decoder: any bytes under any key.
#![no_main]

use fraglink::link::disk::decode_entry;
use libfuzzer_sys::fuzz_target;

/// The key of the seed entry in `fuzz/corpus/disk_entry`, so mutations of it
/// reach past the key check.
const SEED_KEY: &str = "37ba82659ab825c4e742e8ee47d479eb1c91477cfec299df013be7e0955cf904";

fuzz_target!(|data: &[u8]| {
    // The seed's key and one taken from the input, so both match and mismatch
    // paths are reached.
    let _ = decode_entry(SEED_KEY, data);
    if let Some((&n, rest)) = data.split_first() {
        let n = usize::from(n).min(rest.len());
        if let Ok(key) = std::str::from_utf8(&rest[..n]) {
            let _ = decode_entry(key, &rest[n..]);
        }
    }
});
