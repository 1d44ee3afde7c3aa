//! The cubin ELF checker and resource reader on arbitrary bytes.
#![no_main]

use fraglink::link::metadata::{check_cubin, cubin_resources};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = check_cubin(data, "scan_f32_u32_v4_k128");
    let _ = cubin_resources(data, "scan_f32_u32_v4_k128");
});
