//! fraglink's own fragment families (the vector-search set), declared once:
//! used by build.rs and by anything that rebuilds the set (benches/run.sh).

use super::Family;

/// The metric, filter, scan, IVF-Flat scan, tensor-core k-NN (candidates,
/// re-rank) and large-k select (distances, select) families, with paths relative to the crate root.
pub fn vector_search() -> Vec<Family> {
    vec![
        Family::new("metric", "MetricFragment")
            .matrix("matrices/metric.json")
            .template("templates/metric.cu.j2")
            .name_format("metric_{{ metric }}_{{ dtype }}")
            .tag("metric", "Metric")
            .tag("dtype", "DataType"),
        Family::new("filter", "FilterFragment")
            .matrix("matrices/filter.json")
            .template("templates/filter.cu.j2")
            .name_format("filter_{{ filter }}_{{ idx }}")
            .tag("filter", "Filter")
            .tag("idx", "IndexType"),
        Family::new("scan", "ScanFragment")
            .matrix("matrices/scan.json")
            .template("templates/scan.cu.j2")
            .name_format("scan_{{ dtype }}_{{ idx }}_v{{ veclen }}_k{{ capacity }}")
            .tag("dtype", "DataType")
            .tag("idx", "IndexType")
            .constant("veclen", "u32")
            .constant("capacity", "u32"),
        Family::new("ivf_scan", "IvfScanFragment")
            .matrix("matrices/ivf_scan.json")
            .template("templates/ivf_scan.cu.j2")
            .name_format("ivf_scan_{{ dtype }}_v{{ veclen }}_k{{ capacity }}_{{ order }}")
            .tag("dtype", "DataType")
            .tag("order", "SortOrder")
            .constant("veclen", "u32")
            .constant("capacity", "u32"),
        // Tensor-core candidates (fragments/knn_tile.cuh): TF32 needs sm_80,
        // so each entry's `min_arch` decides which archs it is built for.
        Family::new("knn_tile", "KnnTileFragment")
            .matrix("matrices/knn_tile.json")
            .template("templates/knn_tile.cu.j2")
            .name_format(
                "knn_tile_{{ dtype }}_{{ precision }}_q{{ qtile }}_r{{ rtile }}_k{{ capacity }}{{ staging_suffix }}",
            )
            .min_arch_key("min_arch")
            .tag("dtype", "DataType")
            .tag("precision", "Precision")
            .constant("qtile", "u32")
            .constant("rtile", "u32")
            .constant("capacity", "u32")
            .constant("min_arch", "u32")
            // knn_tile.cuh's staging_kind: 0 any copies, 16 only 16-byte ones.
            .constant("staging", "u32"),
        Family::new("knn_rerank", "KnnRerankFragment")
            .matrix("matrices/knn_rerank.json")
            .template("templates/knn_rerank.cu.j2")
            .name_format("knn_rerank_{{ dtype }}_k{{ capacity }}")
            .tag("dtype", "DataType")
            .constant("capacity", "u32"),
        // The two-pass select of k beyond the candidate kernels' capacities
        // (fragments/knn_select.cuh): exact distances, then a radix select.
        Family::new("knn_dist", "KnnDistFragment")
            .matrix("matrices/knn_dist.json")
            .template("templates/knn_dist.cu.j2")
            .name_format("knn_dist_{{ dtype }}")
            .tag("dtype", "DataType"),
        // Built without --gen-opt-lto: its cold link (sm_90, nvJitLink 12.9,
        // a 2-core VM, interleaved medians of 9) took 347 ms built plain and
        // 362 ms pre-optimized, where every other family's link got shorter
        // or stayed (scan 0.71-0.86x, IVF scan 0.76-0.79x, knn_tile
        // 0.91-0.94x, knn_rerank 0.91x, knn_dist 0.95x).
        Family::new("knn_select", "KnnSelectFragment")
            .matrix("matrices/knn_select.json")
            .template("templates/knn_select.cu.j2")
            .name_format("knn_select_b{{ block }}")
            .constant("block", "u32")
            .pre_optimize(false),
    ]
}
