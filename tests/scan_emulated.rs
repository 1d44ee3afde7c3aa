//! The brute-force scan (fragments/scan.cuh) and the IVF-Flat list scan
//! (fragments/ivf_scan.cuh) run on the host under the SIMT emulator
//! (tests/support/simt), from the rendered fragment sources of this build,
//! and compared bit for bit with the CPU paths (`search_cpu`, `search_ivf`).
//!
//! What it checks and what it cannot is said in tests/knn_emulated.rs; the
//! GPU tests (tests/search_gpu.rs, tests/ivf_gpu.rs) still have to pass on a
//! GPU. Every scan variant (dtype × id type × vector width × capacity) runs
//! with l2, one per dtype also with cosine; every ascending IVF variant of each
//! dtype runs on an index of both list layouts (vector width 1 and the
//! dtype's default), with inner product for f32 too.

mod support;

use std::path::{Path, PathBuf};

use fraglink::search::cpu::search_cpu;
use fraglink::search::data::synthetic;
use fraglink::search::ivf::gpu::{ivf_plan, KernelLists};
use fraglink::search::ivf::{build_index, search_ivf, IvfBuildParams, IvfSearchParams, MetricSpec};
use fraglink::search::splits::merge_splits;
use fraglink::search::{Bitset, DType, Filter, Metric, Neighbors, SearchParams, Vectors};
use support::emulated;

fn param(f: &fraglink::fragment::FragmentInfo, key: &str) -> String {
    f.param(key).unwrap_or_default().to_string()
}

/// The program of the scan variants of (dtype, idx) with `metric`: all of
/// them, or only the vector width 1, capacity 32 one.
fn scan_program(dir: &Path, dtype: DType, idx: &str, metric: Metric, all: bool) -> PathBuf {
    let kernels = emulated::kernels("scan", |f| {
        param(f, "dtype") == dtype.name()
            && param(f, "idx") == idx
            && (all || (param(f, "veclen") == "1" && param(f, "capacity") == "32"))
    });
    assert!(!kernels.is_empty(), "no scan kernels for {dtype} {idx}");
    let mut fragments = vec![
        format!("metric_{}_{}", metric.fragment_name(), dtype.name()),
        format!("filter_bitset_{idx}"),
    ];
    fragments.extend(kernels.iter().map(|(n, _)| n.clone()));
    let (t, i) = (
        emulated::c_type(dtype),
        if idx == "u32" { "uint32_t" } else { "int64_t" },
    );
    let rest = format!(
        "{}int main(int argc, char** argv) {{ return simt_scan::scan_main<{t}, {i}>(argc, argv, SCAN, {}); }}\n",
        emulated::table(&format!("simt_scan::scan_fn<{t}, {i}>"), "SCAN", &kernels),
        kernels.len()
    );
    let name = format!("scan_{}_{idx}_{}", dtype.name(), metric.fragment_name());
    emulated::build(dir, &name, &fragments, "scan_driver.h", &rest)
}

/// Runs scan `kernel` over 9 queries with grid.x = 4 (grid-stride) and
/// grid.y = `splits` (row splits, merged as the GPU path merges them) and
/// compares with the CPU path.
#[allow(clippy::too_many_arguments)]
fn check_scan(
    exe: &Path,
    kernel: &str,
    metric: Metric,
    base: &Vectors,
    queries: &Vectors,
    k: usize,
    filter: Option<Bitset>,
    splits: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let params = emulated::write_search(d, base, queries, k, metric, filter);
    let (n, dim, nq) = (base.rows(), base.dim(), queries.rows());
    let args: Vec<String> = [
        kernel.to_string(),
        n.to_string(),
        dim.to_string(),
        nq.to_string(),
        k.to_string(),
    ]
    .into_iter()
    .chain(["4".to_string(), splits.to_string(), "3".to_string()])
    .chain([d.display().to_string()])
    .collect();
    let what = format!(
        "{kernel} {metric:?} k {k} filter {} splits {splits}",
        params.filter.fragment_name()
    );
    emulated::run(exe, &args, &what);
    let mut found = emulated::read_results(d, nq * splits, k, !kernel.contains("_u32_"));
    // One block per query is taken as the kernel wrote it (its own order);
    // splits are merged as the GPU path merges them.
    if splits > 1 {
        let (ids, distances) = merge_splits(&found.ids, &found.distances, nq, splits, k, true);
        found = Neighbors {
            nq,
            k,
            ids,
            distances,
        };
    }
    emulated::assert_equals_cpu(&found, base, queries, &params, &what);
}

#[test]
fn scan_kernels_match_the_cpu_path_under_emulation() {
    let dir = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    for dtype in DType::ALL {
        for idx in ["u32", "i64"] {
            jobs.push((dtype, idx, Metric::L2, true));
        }
        jobs.push((dtype, "u32", Metric::Cosine, false));
    }
    emulated::in_parallel(&jobs, |&(dtype, idx, metric, all)| {
        let exe = scan_program(dir.path(), dtype, idx, metric, all);
        // 300 rows: more than two 128-row tiles and a partial one; dim 48 is
        // a whole number of every vector width.
        let (base, queries) = synthetic(300, 48, 9, dtype, 21);
        // dim 144: the staged variants' rows in several 128-byte chunks and a
        // partial one (f32 4 x 32 + 16 elements, f16 2 x 64 + 16, i8/u8
        // 128 + 16); dim 48 is one chunk or less but for f32.
        let (wide, wide_queries) = synthetic(200, 144, 3, dtype, 24);
        let kernels = emulated::kernels("scan", |f| {
            param(f, "dtype") == dtype.name()
                && param(f, "idx") == idx
                && (all || (param(f, "veclen") == "1" && param(f, "capacity") == "32"))
        });
        for (kernel, cap) in &kernels {
            let (kernel, cap) = (kernel.as_str(), *cap as usize);
            let k = 10.min(cap);
            // One block per query, then 3 row splits (one 128-row tile
            // each, the last partial).
            check_scan(&exe, kernel, metric, &base, &queries, k, None, 1);
            check_scan(&exe, kernel, metric, &base, &queries, k, None, 3);
            // Full capacity, a filter leaving fewer rows than k for some
            // queries' padding, whole and in 2 splits (split 0 takes tiles
            // 0 and 2: the next tile in flight is a stride away, and
            // partial).
            let filter = Bitset::random(300, 0.5, 3);
            for splits in [1, 2] {
                let f = Some(filter.clone());
                check_scan(&exe, kernel, metric, &base, &queries, cap, f, splits);
            }
            check_scan(&exe, kernel, metric, &wide, &wide_queries, k, None, 2);
        }
        // More splits than tiles (5 of 60 rows), and a split count that
        // leaves some splits without a row (7 of 5 rows): all padding there;
        // through the program's first kernel.
        let (few, few_queries) = synthetic(60, 48, 3, dtype, 22);
        let (tiny, tiny_queries) = synthetic(5, 48, 2, dtype, 23);
        let kernel = &kernels[0].0;
        check_scan(&exe, kernel, metric, &few, &few_queries, 10, None, 5);
        check_scan(&exe, kernel, metric, &tiny, &tiny_queries, 10, None, 7);
    });
}

/// The program of every ascending IVF scan variant of `dtype` with `metric`.
fn ivf_program(dir: &Path, dtype: DType, metric: Metric) -> PathBuf {
    let kernels = emulated::kernels("ivf_scan", |f| {
        param(f, "dtype") == dtype.name() && param(f, "order") == "asc"
    });
    let mut fragments = vec![
        format!("metric_{}_{}", metric.fragment_name(), dtype.name()),
        "filter_bitset_i64".to_string(),
    ];
    fragments.extend(kernels.iter().map(|(n, _)| n.clone()));
    let t = emulated::c_type(dtype);
    let rest = format!(
        "{}int main(int argc, char** argv) {{ return simt_ivf::ivf_main<{t}>(argc, argv, IVF, {}); }}\n",
        emulated::table(&format!("simt_ivf::ivf_fn<{t}>"), "IVF", &kernels),
        kernels.len()
    );
    let name = format!("ivf_{}_{}", dtype.name(), metric.fragment_name());
    emulated::build(dir, &name, &fragments, "ivf_driver.h", &rest)
}

fn f32_rows(v: &Vectors) -> Vectors {
    let rows: Vec<f32> = (0..v.rows()).flat_map(|i| v.row_f32(i)).collect();
    Vectors::f32(rows, v.dim()).unwrap()
}

/// One IVF search through the emulated scan, with the GPU path's probes
/// (the brute-force top-nprobe centroids, which the GPU computes bit for bit
/// like `search_cpu`) split `splits` ways over grid.y and merged as the GPU
/// path merges them, compared with `search_ivf`.
fn check_ivf(
    exe: &Path,
    index: &fraglink::search::ivf::IvfIndex,
    queries: &Vectors,
    p: &IvfSearchParams,
    splits: usize,
) {
    let spec: MetricSpec = index.metric();
    let plan = ivf_plan(
        index.dtype(),
        spec.metric,
        p.filter.fragment_name(),
        index.veclen(),
        p.k,
    )
    .unwrap();
    let lists = KernelLists::of(index).unwrap();
    let nprobe = p.nprobe.min(index.nlist());
    let cents = Vectors::F32(index.centroids().clone());
    let coarse = search_cpu(
        &cents,
        &f32_rows(queries),
        &SearchParams::new(nprobe, spec.metric),
    )
    .unwrap();
    let probes: Vec<u32> = coarse.ids.iter().map(|&l| l as u32).collect();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, bytes: &[u8]| emulated::write(&d.join(name), bytes);
    write("data.bin", lists.data.as_bytes());
    write("ids.bin", &emulated::bytes_of(&lists.ids, i64::to_le_bytes));
    write(
        "offsets.bin",
        &emulated::bytes_of(&lists.offsets, u64::to_le_bytes),
    );
    write(
        "sizes.bin",
        &emulated::bytes_of(&lists.sizes, u32::to_le_bytes),
    );
    write("probes.bin", &emulated::bytes_of(&probes, u32::to_le_bytes));
    write("queries.bin", queries.as_bytes());
    if let Filter::Bitset(b) = &p.filter {
        write("filter.bin", &emulated::filter_words(b, index.rows()));
    }
    let (nq, k) = (queries.rows(), p.k);
    let args: Vec<String> = [
        plan.scan.name.to_string(),
        lists.ids.len().to_string(),
        index.rows().to_string(),
        index.dim().to_string(),
        index.nlist().to_string(),
        nprobe.to_string(),
        nq.to_string(),
        k.to_string(),
        "5".into(),
        splits.to_string(),
        "11".into(),
        d.display().to_string(),
    ]
    .to_vec();
    let what = format!(
        "{} k {k} nprobe {nprobe} filter {} splits {splits}",
        plan.scan.name,
        p.filter.fragment_name()
    );
    emulated::run(exe, &args, &what);
    let ids = emulated::read_of(&d.join("ids_out.bin"), i64::from_le_bytes);
    let dists = emulated::read_of(&d.join("dists.bin"), f32::from_le_bytes);
    assert_eq!(ids.len(), nq * splits * k, "{what}");
    let (ids, mut distances) = merge_splits(&ids, &dists, nq, splits, k, true);
    distances.iter_mut().for_each(|x| *x = spec.post.apply(*x));
    let found = Neighbors {
        nq,
        k,
        ids,
        distances,
    };
    let want = search_ivf(index, queries, p).unwrap();
    assert!(
        found.bitwise_eq(&want),
        "{what}: first difference at {:?}",
        found.first_difference(&want)
    );
}

#[test]
fn ivf_scan_kernels_match_the_cpu_path_under_emulation() {
    let dir = tempfile::tempdir().unwrap();
    let mut jobs: Vec<(DType, Metric)> = DType::ALL.iter().map(|&d| (d, Metric::L2)).collect();
    jobs.push((DType::F32, Metric::InnerProduct));
    emulated::in_parallel(&jobs, |&(dtype, metric)| {
        let exe = ivf_program(dir.path(), dtype, metric);
        let (base, queries) = synthetic(1500, 32, 7, dtype, 9);
        for veclen in [Some(1), None] {
            let mut bp = IvfBuildParams::new(12, MetricSpec::plain(metric)).with_seed(2);
            bp.iterations = 3;
            bp.veclen = veclen;
            let index = build_index(&base, &bp).unwrap();
            // Probe splits: none, 3 (uneven: 12 / 3 but 5 / 3), and more
            // splits than probes (empty splits, all padding).
            for (k, nprobe, filter, splits) in [
                (10, 3, Filter::None, 1),
                (10, 3, Filter::None, 5),
                (33, 12, Filter::Bitset(Bitset::random(1500, 0.3, 4)), 1),
                (33, 12, Filter::Bitset(Bitset::random(1500, 0.3, 4)), 3),
                (100, 5, Filter::None, 1),
                (100, 5, Filter::None, 3),
                (256, 2, Filter::None, 1),
                // The large capacities: 512 (2 tiles of offers per sort), 1024
                // (8, fewer rows allowed than k), 2048 (16, more k than rows).
                (300, 4, Filter::None, 1),
                (300, 4, Filter::None, 2),
                (1000, 12, Filter::Bitset(Bitset::random(1500, 0.5, 5)), 1),
                (2048, 12, Filter::None, 1),
            ] {
                let p = IvfSearchParams::new(k, nprobe).with_filter(filter);
                check_ivf(&exe, &index, &queries, &p, splits);
            }
        }
    });
}
