//! Builds this crate's kernels with fraglink's public builder: a templated
//! family, a plain-source file with many kernels, a templated kernel named
//! by a C++ name expression, and WMMA. The default archs are used
//! (compute_75, compute_80, sm_90) unless FRAGLINK_ARCHS says otherwise.
use fraglink::build::{Builder, Family};

fn main() {
    let report = Builder::new()
        .include_dir("include")
        .nvrtc_option("-DNDEBUG")
        .family(
            Family::new("axpy", "AxpyFragment")
                .matrix("matrices/axpy.json")
                .template("templates/axpy.cu.j2")
                .name_format("axpy_{{ dtype }}")
                .tag("dtype", "Precision"),
        )
        .family(
            // Plain CUDA: the matrix entry arrives as -DBLOCK=<n>.
            Family::new("elementwise", "ElementwiseFragment")
                .matrix("matrices/elementwise.json")
                .source("kernels/elementwise.cu")
                .name_format("elementwise_b{{ block }}")
                .constant("block", "u32"),
        )
        .family(
            Family::new("quantize", "QuantizeFragment")
                .matrix("matrices/quantize.json")
                .template("templates/quantize.cu.j2")
                .name_format("quantize_{{ ctype }}")
                .name_expression("quantize<{{ ctype }}>")
                .tag("ctype", "Scalar"),
        )
        .family(
            Family::new("wmma", "WmmaFragment")
                .matrix("matrices/wmma.json")
                .source("kernels/wmma.cu")
                .name_format("wmma_t{{ tile }}")
                .constant("tile", "u32"),
        )
        .compile()
        .unwrap_or_else(|e| panic!("{e}"));
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "cargo:rustc-env=DOWNSTREAM_BUILD={} fragments, {} bytes, {} from cache, {:.2}s",
        report.fragments.len(),
        report.total_bytes(),
        report.cached(),
        report.elapsed.as_secs_f64()
    );
}
