//! Prints this crate's own fragments, found through its generated tag types.
mod registry {
    include!(concat!(env!("OUT_DIR"), "/fraglink_registry.rs"));
}

use fraglink::fragment::StaticFragment;
use registry::{AxpyFragment, F32, F64};

fn main() {
    for info in [<AxpyFragment<F32>>::info(), <AxpyFragment<F64>>::info()] {
        println!("{} {} {} {}", info.name, info.family, info.archs.join(","), info.fatbin.len());
    }
    println!("catalog {}", registry::CATALOG.len());
    println!("{}", env!("AXPY_SUMMARY"));
}
