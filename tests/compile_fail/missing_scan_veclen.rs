// f32 scans exist for veclen 1 and 4 only: veclen 8 was never compiled.

use fraglink::fragments::{ScanFragment, F32, U32};

fn main() {
    let _ = fraglink::fragment::info_of::<ScanFragment<F32, U32, 8, 128>>();
}
