//! The nvJitLink info-log parser on arbitrary text.
#![no_main]

use fraglink::link::metadata::{entry_resources, parse_info_log};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let log = String::from_utf8_lossy(data);
    for r in parse_info_log(&log) {
        assert!(r.ptxas_ms.is_none_or(f64::is_finite));
    }
    let _ = entry_resources(&log, "scan_f32_u32_v4_k128");
});
