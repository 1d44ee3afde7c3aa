//! The two-pass select (fragments/knn_select.cuh: knn_dist, then
//! knn_select) runs on the host under the SIMT emulator
//! (tests/support/simt), from the rendered fragment sources of this build,
//! with the arguments the GPU path passes (`knn::select::sort_slots`), and
//! is compared bit for bit with the CPU path.
//!
//! What emulation checks and what it cannot is said in
//! tests/knn_emulated.rs; the ignored GPU test tests/knn_gpu.rs still has
//! to pass on a GPU. Cases: k beyond 1024 over partial row and query
//! tiles (two of queries) and a dim that is not a whole number of staging
//! steps, k beyond the rows, a filter leaving fewer rows than k, many
//! equal distances (the ties at the threshold go by id: kept whole where
//! they fit the sort, else cut by a radix select over their ids), NaN and infinite
//! rows, a zero query (inner product's -0), a grid smaller than the batch
//! (grid-stride), and a sort smaller than k (the winners in slices: an H100
//! sorts 16384 keys at a time, here 64 or 256, so that a few thousand rows
//! make many slices), ties and excluded rows across slice boundaries
//! included.

mod support;

use std::path::{Path, PathBuf};

use fraglink::search::data::synthetic;
use fraglink::search::knn::plan::SharedMemory;
use fraglink::search::knn::select::{sort_slots, SELECT_BLOCK};
use fraglink::search::{Bitset, DType, Metric, Vectors};
use half::f16;
use support::emulated;

/// The program of one (dtype, metric): knn_dist of the dtype with the
/// metric and `filter_bitset_u32` (null bits allow every row), and the
/// select kernel.
fn program(dir: &Path, dtype: DType, metric: Metric) -> PathBuf {
    let dist = format!("knn_dist_{}", dtype.name());
    let select = format!("knn_select_b{SELECT_BLOCK}");
    let fragments = vec![
        format!("metric_{}_{}", metric.fragment_name(), dtype.name()),
        "filter_bitset_u32".to_string(),
        dist.clone(),
        select.clone(),
    ];
    let t = emulated::c_type(dtype);
    let rest = format!(
        "int main(int argc, char** argv) {{ return simt_select::select_main<{t}>(argc, argv, {dist}, {select}); }}\n"
    );
    let name = format!("select_{}_{}", dtype.name(), metric.fragment_name());
    emulated::build(dir, &name, &fragments, "select_driver.h", &rest)
}

/// `values` (row-major, `dim` wide) as vectors of `dtype`.
fn of_dtype(values: &[f32], dim: usize, dtype: DType) -> Vectors {
    match dtype {
        DType::F32 => Vectors::f32(values.to_vec(), dim),
        DType::F16 => Vectors::f16(values.iter().map(|&x| f16::from_f32(x)).collect(), dim),
        DType::I8 => Vectors::i8(values.iter().map(|&x| x as i8).collect(), dim),
        DType::U8 => Vectors::u8(values.iter().map(|&x| x.abs() as u8).collect(), dim),
    }
    .unwrap()
}

/// One search through the emulated kernels, compared with the CPU path:
/// the select sorts `slots` keys at a time, or as on an H100 (`None`).
#[allow(clippy::too_many_arguments)]
fn check(
    exe: &Path,
    what: &str,
    metric: Metric,
    base: &Vectors,
    queries: &Vectors,
    k: usize,
    filter: Option<Bitset>,
    select_grid: u32,
    slots: Option<u32>,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let params = emulated::write_search(d, base, queries, k, metric, filter);
    let (n, dim, nq) = (base.rows(), base.dim(), queries.rows());
    let slots = slots.unwrap_or_else(|| sort_slots(k, n, SharedMemory::H100).unwrap());
    let args: Vec<String> = [n, dim, nq, k, slots as usize, select_grid as usize, 7]
        .iter()
        .map(|v| v.to_string())
        .chain([d.display().to_string()])
        .collect();
    let what = format!("{} {metric:?} {what} k {k} slots {slots}", base.dtype());
    emulated::run(exe, &args, &what);
    let found = emulated::read_results(d, nq, k, false);
    emulated::assert_equals_cpu(&found, base, queries, &params, &what);
}

/// knn_dist launched over more row tiles than the rows need: the extra
/// blocks count nothing, and results are the CPU path's. Over one fewer:
/// every query's matrix row misses its last tile, so the select skips every
/// query and writes nothing (the GPU path reports the NaN it set there,
/// `GpuSearchError::Unwritten`); the driver checks that.
fn the_select_reads_only_whole_matrix_rows(
    exe: &Path,
    metric: Metric,
    base: &Vectors,
    queries: &Vectors,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = 50;
    let params = emulated::write_search(d, base, queries, k, metric, None);
    let (n, dim, nq) = (base.rows(), base.dim(), queries.rows());
    let slots = sort_slots(k, n, SharedMemory::H100).unwrap();
    let args: Vec<String> = [n, dim, nq, k, slots as usize, 3, 7]
        .iter()
        .map(|v| v.to_string())
        .chain([d.display().to_string()])
        .collect();
    let row_tiles = n.div_ceil(64);
    for grid_x in [row_tiles + 2, row_tiles - 1] {
        let what = format!(
            "{} {metric:?} knn_dist over {grid_x} of {row_tiles} row tiles",
            base.dtype()
        );
        emulated::run_with(
            exe,
            &args,
            &[("FRAGLINK_SIMT_DIST_GRID_X", grid_x.to_string())],
            &what,
        );
        if grid_x > row_tiles {
            let found = emulated::read_results(d, nq, k, false);
            emulated::assert_equals_cpu(&found, base, queries, &params, &what);
        }
    }
}

/// 3 distinct rows (values in every dtype's range), repeated to `n` rows.
fn duplicates(n: usize, dim: usize, dtype: DType) -> Vectors {
    let protos: [Vec<f32>; 3] = [
        vec![3.0; dim],
        (0..dim).map(|j| (j % 7) as f32).collect(),
        (0..dim).map(|j| (j % 5) as f32 * 2.0).collect(),
    ];
    let values: Vec<f32> = (0..n).flat_map(|i| protos[i % 3].clone()).collect();
    of_dtype(&values, dim, dtype)
}

#[test]
fn the_two_pass_select_matches_the_cpu_path_under_emulation() {
    let dir = tempfile::tempdir().unwrap();
    let mut jobs: Vec<(DType, Metric)> = Vec::new();
    for dtype in DType::ALL {
        jobs.push((dtype, Metric::L2));
        jobs.push((dtype, Metric::Cosine));
    }
    jobs.push((DType::F32, Metric::InnerProduct));
    jobs.push((DType::F16, Metric::InnerProduct));
    emulated::in_parallel(&jobs, |&(dtype, metric)| {
        let exe = program(dir.path(), dtype, metric);
        // 3000 rows: 47 row tiles, the last partial; dim 37 = one whole
        // staging step of 32 and 5; 9 queries of a 32-query tile.
        let (base, queries) = synthetic(3000, 37, 9, dtype, 5);
        let run = |what: &str, b: &Vectors, q: &Vectors, k, f, grid| {
            check(&exe, what, metric, b, q, k, f, grid, None)
        };
        let sliced = |what: &str, b: &Vectors, q: &Vectors, k, f, grid, slots| {
            check(&exe, what, metric, b, q, k, f, grid, Some(slots))
        };
        run("k 1100", &base, &queries, 1100, None, 4);
        the_select_reads_only_whole_matrix_rows(&exe, metric, &base, &queries);
        run("k beyond the rows", &base, &queries, 5000, None, 9);
        let sparse = Some(Bitset::random(3000, 0.1, 3));
        run("10% filter", &base, &queries, 1100, sparse, 2);
        run("k 1", &base, &queries, 1, None, 9);
        // 40 queries: a second query tile of the distance kernel (grid.y 2).
        let (_, q40) = synthetic(3000, 37, 40, dtype, 6);
        run("two query tiles", &base, &q40, 1030, None, 40);
        // Ties: 1000 copies of each of 3 rows, the cut inside a group.
        let dup = duplicates(3000, 16, dtype);
        let (_, q16) = synthetic(10, 16, 5, dtype, 8);
        run("ties", &dup, &q16, 1500, None, 5);
        run(
            "ties at the cut of the first group",
            &dup,
            &q16,
            700,
            None,
            5,
        );
        // 1000 ties at the cut, more than the sort's 512 slots: the cut goes
        // by a radix select over the ties' ids.
        run("ties beyond the sort", &dup, &q16, 300, None, 5);
        // A sort smaller than k: 18 slices of 64 ranks (the last of 12), and
        // k beyond the rows in 12 slices of 256 (the last partial).
        sliced("slices", &base, &queries, 1100, None, 4, 64);
        sliced(
            "slices beyond the rows",
            &base,
            &queries,
            5000,
            None,
            9,
            256,
        );
        // Excluded rows make up the cut of a slice: 300 allowed rows, k
        // 1100, slices of 64: the fifth slice takes the allowed rows left and
        // ends the query, the rest is padding. Also no allowed row at all,
        // and ties over a filter in slices of one.
        let sparse = Some(Bitset::random(3000, 0.1, 3));
        sliced(
            "slices over a 10% filter",
            &base,
            &queries,
            1100,
            sparse,
            2,
            64,
        );
        let none = Some(Bitset::none(3000));
        sliced("slices, no allowed row", &base, &queries, 200, none, 3, 64);
        let every_third = Some(Bitset::from_fn(3000, |i| i % 3 == 0));
        sliced(
            "ties over a filter in slices of one",
            &dup,
            &q16,
            40,
            every_third,
            5,
            1,
        );
        // Ties across slice boundaries: 1000 copies of each of 3 rows in
        // slices of 64 (every cut inside a group: the ties' ids decide), and
        // k 2100 in slices of 1024: the last slice, ranks 2048..2100, starts
        // inside the third group and its 900 ties beyond it fit the sort.
        sliced("ties in slices", &dup, &q16, 1500, None, 5, 64);
        sliced("ties in slices of 1024", &dup, &q16, 2100, None, 3, 1024);
        // One key per slice.
        sliced("slices of one", &base, &queries, 40, None, 9, 1);
        // A one-row, one-element base.
        let (tiny, tq) = synthetic(1, 1, 3, dtype, 4);
        run("one row", &tiny, &tq, 2000, None, 3);
        if matches!(dtype, DType::F32 | DType::F16) {
            // NaN and infinite rows rank as +inf, after every finite row and
            // among themselves by id.
            let mut values: Vec<f32> = (0..2000 * 8).map(|i| (i % 13) as f32 - 6.0).collect();
            for (row, v) in [
                (3, f32::NAN),
                (700, f32::INFINITY),
                (1999, f32::NEG_INFINITY),
            ] {
                values[row * 8 + 2] = v;
            }
            let special = of_dtype(&values, 8, dtype);
            let (_, q8) = synthetic(10, 8, 4, dtype, 9);
            run("NaN and inf rows", &special, &q8, 1999, None, 4);
            sliced(
                "NaN and inf rows in slices",
                &special,
                &q8,
                1999,
                None,
                4,
                128,
            );
            // A zero query: every inner product is -0, every cosine 1.
            let zero = of_dtype(&[0.0; 16], 8, dtype);
            run("zero query", &special, &zero, 1200, None, 1);
        }
    });
}
