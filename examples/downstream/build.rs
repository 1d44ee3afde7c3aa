use fraglink::build::{Builder, Family};

fn main() {
    let report = Builder::new()
        .include_dir("include")
        .archs(&["compute_75"])
        .family(
            Family::new("axpy", "AxpyFragment")
                .matrix("matrices/axpy.json")
                .template("templates/axpy.cu.j2")
                .name_format("axpy_{{ dtype }}")
                .tag("dtype", "Precision"),
        )
        .compile()
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "cargo:rustc-env=AXPY_SUMMARY={} fragments, {} bytes",
        report.fragments.len(),
        report.total_bytes()
    );
}
