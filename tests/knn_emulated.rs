//! The tensor-core k-NN kernels (fragments/knn_tile.cuh: knn_tile + knn_rerank)
//! run on the host under the SIMT emulator (tests/support/simt), from the
//! rendered fragment sources of this build, with the arguments the GPU path
//! passes (`knn::choose`'s variant, `KnnPlan::chunks`, the norms of
//! `knn::norms`), and compared bit for bit with the CPU path.
//!
//! This checks the kernels' logic without a GPU: indexing, staging and zero
//! padding, barriers (fibers run in a seeded random order between barriers),
//! warp collectives, the fused select and its compaction (ties included), the
//! re-rank, grid-stride loops, and that every output slot is written. It does
//! not check speed, the memory model beyond barriers or the tensor cores' own
//! rounding (tests/knn_margin.rs covers the arithmetic); the ignored GPU test
//! tests/knn_gpu.rs still has to pass on a GPU.
//!
//! One program per (dtype, precision, metric) (tests/support/emulated.rs);
//! each links `filter_bitset_u32`, which also serves searches
//! without a filter (null bits allow every row, as for the scan).

mod support;

use std::path::{Path, PathBuf};

use fraglink::build::Arch;
use fraglink::search::data::{synthetic, Rng};
use fraglink::search::knn::f16copy;
use fraglink::search::knn::gpu::merge_on_host;
use fraglink::search::knn::norms::Norms;
use fraglink::search::knn::plan::{merge_groups, SharedMemory};
use fraglink::search::knn::{choose, choose_variant, KnnPlan, KnnRequest, Precision, Staging};
use fraglink::search::{Bitset, DType, Filter, Metric, Neighbors, SearchParams, Vectors};
use half::f16;
use support::emulated;

/// (dtype, precision) pairs with a candidate kernel.
const KINDS: [(DType, Precision); 6] = [
    (DType::F32, Precision::Tf32x3),
    (DType::F32, Precision::Tf32),
    (DType::F32, Precision::F16Copy),
    (DType::F16, Precision::F16),
    (DType::I8, Precision::Int),
    (DType::U8, Precision::Int),
];

/// The program of one (dtype, precision, metric): every knn_tile variant of
/// that dtype and precision, every knn_rerank of the dtype.
fn program(dir: &Path, dtype: DType, precision: Precision, metric: Metric) -> PathBuf {
    let tiles = emulated::kernels("knn_tile", |f| {
        f.param("dtype") == Some(dtype.name()) && f.param("precision") == Some(precision.name())
    });
    let reranks = emulated::kernels("knn_rerank", |f| f.param("dtype") == Some(dtype.name()));
    assert!(
        !tiles.is_empty() && !reranks.is_empty(),
        "{dtype:?} {precision:?}: no kernels in the catalog"
    );
    let mut fragments = vec![
        format!("metric_{}_{}", metric.fragment_name(), dtype.name()),
        "filter_bitset_u32".to_string(),
    ];
    fragments.extend(tiles.iter().chain(&reranks).map(|(n, _)| n.clone()));
    let t = emulated::c_type(dtype);
    let rest = format!(
        "{}{}int main(int argc, char** argv) {{ return simt_knn::knn_main<{t}>(argc, argv, TILE, {}, RERANK, {}); }}\n",
        emulated::table(&format!("simt_knn::tile_fn<{t}>"), "TILE", &tiles),
        emulated::table(&format!("simt_knn::rerank_fn<{t}>"), "RERANK", &reranks),
        tiles.len(),
        reranks.len()
    );
    let name = format!(
        "knn_{}_{}_{}",
        dtype.name(),
        precision.name(),
        metric.fragment_name()
    );
    emulated::build(dir, &name, &fragments, "knn_driver.h", &rest)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    emulated::bytes_of(v, f32::to_le_bytes)
}

/// One search through the emulated kernels.
struct Case<'a> {
    what: String,
    base: &'a Vectors,
    queries: Vectors,
    k: usize,
    filter: Option<Bitset>,
    /// The resident blocks `KnnPlan::chunks` sizes the row split for.
    resident: u32,
    /// Caps on grid.x of each kernel (grid-stride loops when below the need).
    tile_grid: u32,
    rerank_grid: u32,
    /// The candidate kernel's staging, where not the planner's pick (an
    /// `Any` variant over rows of 16-byte groups: its 16-byte copies).
    staging: Option<Staging>,
    /// The query tile, where not the planner's pick: the cases written for
    /// the 32- and 64-query tiles name them, since the planner gives kernels
    /// staging f16 (f16, f16copy) at most 32, filled four times.
    qtile: Option<u32>,
}

impl<'a> Case<'a> {
    /// A case without a filter, both grids as large as the search needs.
    fn new(what: String, base: &'a Vectors, queries: Vectors, k: usize, resident: u32) -> Self {
        Case {
            what,
            base,
            queries,
            k,
            filter: None,
            resident,
            tile_grid: u32::MAX,
            rerank_grid: u32::MAX,
            staging: None,
            qtile: None,
        }
    }
}

/// The plan of case `c`: the planner's pick (tile shape, capacity and
/// staging, unless the case names a query tile or staging) at the dtype's
/// default precision, as the variant of `precision`.
fn plan_of(c: &Case<'_>, metric: Metric, precision: Precision) -> KnnPlan {
    let r = KnnRequest {
        device: Arch::sm(90),
        shared: SharedMemory::H100,
        dtype: c.base.dtype(),
        metric,
        filter: if c.filter.is_some() { "bitset" } else { "none" },
        n_rows: c.base.rows(),
        dim: c.base.dim(),
        nq: c.queries.rows(),
        k: c.k,
    };
    let pick = choose(&r).unwrap_or_else(|| panic!("{}: the planner refuses the search", c.what));
    let name = format!(
        "knn_tile_{}_{}_q{}_r{}_k{}{}",
        pick.dtype.name(),
        precision.name(),
        c.qtile.unwrap_or(pick.qtile),
        pick.rtile,
        pick.capacity,
        c.staging.unwrap_or(pick.staging).suffix()
    );
    choose_variant(&r, &name).unwrap_or_else(|e| panic!("{}: {e}", c.what))
}

fn run_case(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
) -> (KnnPlan, Neighbors) {
    let (plan, dir, args) = prepare(metric, precision, c);
    emulated::run(exe, &args, &c.what);
    let found = emulated::read_results(dir.path(), c.queries.rows(), c.k, false);
    assert_host_merge_equals_final_launch(&plan, dir.path(), c, &found);
    (plan, found)
}

/// Where the case took the merge level, the host merge of its lists
/// (`knn::gpu::merge_on_host`, what a search uses for short lists) equals
/// the final re-rank launch's output (`found`) bit for bit.
fn assert_host_merge_equals_final_launch(
    plan: &KnnPlan,
    dir: &Path,
    c: &Case<'_>,
    found: &Neighbors,
) {
    let (nq, k, cap) = (c.queries.rows(), c.k, plan.capacity as usize);
    let groups = merge_groups(plan.chunks(c.base.rows(), nq, c.resident).0).0 as usize;
    let lo_path = dir.join("merged_lo.bin");
    assert_eq!(lo_path.exists(), groups > 1, "{}: merged lists", c.what);
    if groups == 1 {
        return;
    }
    let lo = emulated::read_of(&lo_path, f32::from_le_bytes);
    let ids = emulated::read_of(&dir.join("merged_ids.bin"), u32::from_le_bytes);
    assert_eq!(lo.len(), nq * groups * cap, "{}", c.what);
    let (m_ids, m_dists) = merge_on_host(plan.rerank.name, &lo, &ids, nq, groups, cap, k)
        .unwrap_or_else(|e| {
            panic!("{}: host merge: {e}", c.what);
        });
    let merged = Neighbors {
        nq,
        k,
        ids: m_ids,
        distances: m_dists,
    };
    assert!(
        merged.bitwise_eq(found),
        "{}: the host merge of {groups} lists differs from the final launch",
        c.what
    );
}

/// Case `c`'s plan, its inputs written to a new directory, and the driver's
/// arguments.
fn prepare(
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
) -> (KnnPlan, tempfile::TempDir, Vec<String>) {
    let (n, dim, nq) = (c.base.rows(), c.base.dim(), c.queries.rows());
    let plan = plan_of(c, metric, precision);
    let (rows, queries) = (Norms::of(c.base), Norms::of(&c.queries));
    // Special rows reach these kernels only excluded by the filter (the
    // scan searches them: knn::special); special queries never.
    let allowed = |r: usize| c.filter.as_ref().is_none_or(|b| b.get(r));
    assert!(
        (0..n).all(|r| !rows.is_special(r, metric) || !allowed(r)) && !queries.any_special(metric),
        "{}: special vectors go to the scan, not these kernels",
        c.what
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, bytes: &[u8]| emulated::write(&d.join(name), bytes);
    write("dataset.bin", c.base.as_bytes());
    write("queries.bin", c.queries.as_bytes());
    if precision == Precision::F16Copy {
        // The f16 copies the index makes (KnnRows::f16_copy: rows special
        // for every metric as zeros) and the search uploads with the queries.
        let copy = |v: &Vectors, norms: &Norms| {
            let Vectors::F32(m) = v else {
                panic!("{}: f16copy takes f32 rows", c.what)
            };
            let mut data = m.data().to_vec();
            for (r, row) in data.chunks_mut(dim).enumerate() {
                if norms.is_special(r, Metric::L2) {
                    row.fill(0.0);
                }
            }
            let bits =
                f16copy::to_f16_bits(&data).unwrap_or_else(|| panic!("{}: no f16 copy", c.what));
            emulated::bytes_of(&bits, u16::to_le_bytes)
        };
        write("stage_dataset.bin", &copy(c.base, &rows));
        write("stage_queries.bin", &copy(&c.queries, &queries));
    }
    let (ra0, ra1) = rows.aux(metric);
    let (qa0, qa1) = queries.aux(metric);
    write("row_aux0.bin", &f32_bytes(&ra0));
    write("row_aux1.bin", &f32_bytes(&ra1));
    write("query_aux0.bin", &f32_bytes(&qa0));
    write("query_aux1.bin", &f32_bytes(&qa1));
    if let Some(b) = &c.filter {
        write("filter.bin", &emulated::filter_words(b, n));
    }
    let (n_chunks, chunk_rows) = plan.chunks(n, nq, c.resident);
    let (groups, group_chunks) = merge_groups(n_chunks);
    let tiles = nq.div_ceil(plan.qtile as usize) as u32;
    let args: Vec<String> = vec![
        plan.tile.name.into(),
        plan.rerank.name.into(),
        n.to_string(),
        dim.to_string(),
        nq.to_string(),
        c.k.to_string(),
        chunk_rows.to_string(),
        n_chunks.to_string(),
        groups.to_string(),
        group_chunks.to_string(),
        tiles.min(c.tile_grid).to_string(),
        (nq as u32).min(c.rerank_grid).to_string(),
        plan.dynamic_shared_bytes_for(nq).to_string(),
        "7".into(),
        d.display().to_string(),
    ];
    (plan, dir, args)
}

/// An `_a16` variant refuses a launch (tile_launch_ok) and writes nothing,
/// so the driver finds its candidate counts unwritten: over `other`'s rows,
/// which are not whole 16-byte groups, and over `aligned`'s rows with the
/// queries one element past a 16-byte boundary.
fn a16_refuses_what_it_cannot_copy(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    other: &Case<'_>,
    aligned: &Case<'_>,
) {
    let (plan, _dir, mut args) = prepare(metric, precision, other);
    assert_eq!(plan.staging, Staging::Any, "{}", other.what);
    args[0] = format!("{}_a16", plan.tile.name);
    let (plan, _aligned_dir, aligned_args) = prepare(metric, precision, aligned);
    assert_eq!(plan.staging, Staging::A16, "{}", aligned.what);
    for (what, args, offset) in [
        (&other.what, &args, "0"),
        (&aligned.what, &aligned_args, "1"),
    ] {
        assert_refused(
            exe,
            args,
            offset,
            &format!("{what}: {} with queries offset by {offset}", args[0]),
        );
    }
}

/// Runs the driver with the queries `offset` elements into their buffer and
/// asserts that the candidate kernel refused the launch: it wrote nothing,
/// so the driver finds the candidate counts unwritten.
fn assert_refused(exe: &Path, args: &[String], offset: &str, what: &str) {
    let out = std::process::Command::new(exe)
        .args(args)
        .env("FRAGLINK_SIMT_QUERY_OFFSET", offset)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("count not written"),
        "{what} ran ({}): {stderr}",
        out.status
    );
}

fn check(exe: &Path, metric: Metric, precision: Precision, c: &Case<'_>) {
    let (plan, found) = run_case(exe, metric, precision, c);
    let mut params = SearchParams::new(c.k, metric);
    if let Some(b) = &c.filter {
        params = params.with_filter(Filter::Bitset(b.clone()));
    }
    let what = format!(
        "{} ({} + {}, {:?})",
        c.what, plan.tile.name, plan.rerank.name, metric
    );
    emulated::assert_equals_cpu(&found, c.base, &c.queries, &params, &what);
}

/// `v` with rows the tensor-core bounds do not cover (knn::special): a
/// NaN (row 5), an infinity (row 17), for f32 a norm above 2^50 (row 100),
/// a zero vector (row 333, special for cosine only); `None` for integer
/// rows, which are never special.
fn with_special_rows(v: &Vectors) -> Option<Vectors> {
    let dim = v.dim();
    match v {
        Vectors::F32(m) => {
            let mut d = m.data().to_vec();
            d[5 * dim + 3] = f32::NAN;
            d[17 * dim] = f32::INFINITY;
            d[100 * dim + 7] = 1e30;
            d[333 * dim..334 * dim].fill(0.0);
            Some(Vectors::f32(d, dim).unwrap())
        }
        Vectors::F16(m) => {
            let mut d = m.data().to_vec();
            d[5 * dim + 3] = f16::NAN;
            d[17 * dim] = f16::INFINITY;
            d[333 * dim..334 * dim].fill(f16::ZERO);
            Some(Vectors::f16(d, dim).unwrap())
        }
        _ => None,
    }
}

/// Rows of small integers (many equal distances, duplicate rows), never all
/// zero (a zero vector is special for cosine).
fn ties(dtype: DType, n: usize, dim: usize, seed: u64) -> Vectors {
    let mut rng = Rng::new(seed);
    let vals: Vec<i8> = (0..n * dim)
        .map(|i| {
            if i % dim == 0 {
                1
            } else {
                rng.below(3) as i8 - 1
            }
        })
        .collect();
    match dtype {
        DType::F32 => Vectors::f32(vals.iter().map(|&v| f32::from(v)).collect(), dim),
        DType::F16 => Vectors::f16(
            vals.iter().map(|&v| f16::from_f32(f32::from(v))).collect(),
            dim,
        ),
        DType::I8 => Vectors::i8(vals, dim),
        DType::U8 => Vectors::u8(vals.iter().map(|&v| (v + 1) as u8).collect(), dim),
    }
    .unwrap()
}

/// Rows and queries that all sit near one vector: floats within 2⁻⁵ of
/// integers up to ±16 (exact in f16), integers within 1 of a common value.
/// Distances are tiny against the norms, so the float margins flood the
/// candidate buffers (the exact reduction decides) and near-equal keys meet
/// every threshold.
fn near_ties(dtype: DType, n: usize, dim: usize, seed: u64) -> Vectors {
    let mut centre = Rng::new(99);
    let c: Vec<i32> = (0..dim).map(|_| centre.below(33) as i32 - 16).collect();
    let mut rng = Rng::new(seed);
    let delta: Vec<i32> = (0..n * dim).map(|_| rng.below(3) as i32 - 1).collect();
    let float = |i: usize| c[i % dim] as f32 + delta[i] as f32 / 32.0;
    match dtype {
        DType::F32 => Vectors::f32((0..n * dim).map(float).collect(), dim),
        DType::F16 => Vectors::f16((0..n * dim).map(|i| f16::from_f32(float(i))).collect(), dim),
        DType::I8 => Vectors::i8(
            (0..n * dim)
                .map(|i| (c[i % dim] * 6 + delta[i]) as i8)
                .collect(),
            dim,
        ),
        DType::U8 => Vectors::u8(
            (0..n * dim)
                .map(|i| (c[i % dim] + 200 + delta[i]) as u8)
                .collect(),
            dim,
        ),
    }
    .unwrap()
}

#[test]
fn knn_kernels_match_the_cpu_path_under_emulation() {
    let dir = tempfile::tempdir().unwrap();
    let jobs: Vec<(DType, Precision, Metric)> = KINDS
        .iter()
        .flat_map(|&(d, p)| Metric::ALL.map(move |m| (d, p, m)))
        .collect();
    emulated::in_parallel(&jobs, |&(dtype, precision, metric)| {
        let exe = program(dir.path(), dtype, precision, metric);
        run_program(&exe, dtype, precision, metric);
    });
}

/// A user metric linked with the candidate kernel: L1 (`a += |q - x|`,
/// finalize `a`) finalizes as l2 does, so the kernel takes it for l2 at
/// link time (`linked_metric`), but it accumulates otherwise, so the
/// run-time check (`metric_confirmed`) refuses the launch and nothing is
/// written: l2's bounds do not hold for it. (The kernel's earlier probe,
/// one accumulate of q = 1, x = 2, could not tell L1 from l2.)
#[test]
fn a_metric_that_only_finalizes_like_l2_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (base, queries) = synthetic(300, 32, 4, DType::F32, 21);
    let c = Case::new("L1 linked as a metric".into(), &base, queries, 10, 4);
    let (plan, data, args) = prepare(Metric::L2, Precision::Tf32x3, &c);
    let tiles = [(plan.tile.name.to_string(), plan.capacity)];
    let reranks = [(plan.rerank.name.to_string(), plan.capacity)];
    let l1 = "extern \"C\" void fraglink_metric_init_f32(fraglink_metric_state_f32* s) { s->a = 0.0f; s->qq = 0.0f; s->xx = 0.0f; }\n\
              extern \"C\" void fraglink_metric_accumulate_f32(fraglink_metric_state_f32* s, float q, float x) { s->a += std::fabs(q - x); }\n\
              extern \"C\" float fraglink_metric_finalize_f32(const fraglink_metric_state_f32* s) { return s->a; }\n";
    let rest = format!(
        "{l1}{}{}int main(int argc, char** argv) {{ return simt_knn::knn_main<float>(argc, argv, TILE, 1, RERANK, 1); }}\n",
        emulated::table("simt_knn::tile_fn<float>", "TILE", &tiles),
        emulated::table("simt_knn::rerank_fn<float>", "RERANK", &reranks),
    );
    let fragments = vec![
        "filter_bitset_u32".to_string(),
        tiles[0].0.clone(),
        reranks[0].0.clone(),
    ];
    let exe = emulated::build(dir.path(), "knn_l1", &fragments, "knn_driver.h", &rest);
    let what = format!("{} with an L1 metric", plan.tile.name);
    assert_refused(&exe, &args, "0", &what);
    drop(data);
}

fn run_program(exe: &Path, dtype: DType, precision: Precision, metric: Metric) {
    // An odd dim (element copies, except f32: 4-byte copies; zero padding of
    // the last chunk; bytes take 64 elements per chunk, so 70 crosses a chunk
    // boundary too) and a dim of whole 16-byte groups (16-byte copies; 80 is
    // a partial chunk for f16 and bytes).
    let odd = if dtype.size() == 1 { 70 } else { 45 };
    let dim = 80;
    let n = 900;
    let (base, queries) = synthetic(n, dim, 140, dtype, 11);
    let (odd_base, odd_queries) = synthetic(n, odd, 20, dtype, 16);
    // Rows of whole 4-byte groups but not 16-byte ones: 4-byte copies (of
    // what the MMAs read: f16copy stages f16).
    let dim4 = match precision.staged(dtype).size() {
        1 => 36,
        2 => 46,
        _ => 45,
    };
    let (base4, queries4) = synthetic(300, dim4, 5, dtype, 18);
    let tie_base = ties(dtype, n, dim, 12);
    let tie_queries = ties(dtype, 70, dim, 13);
    // Enough row tiles for more than MERGE_CHUNKS chunks: the merge level.
    let (big_base, big_queries) = synthetic(2500, odd, 3, dtype, 17);
    // Ties over more than knn_tile.cuh's UNION_MIN_CHUNKS chunks: the union
    // bound's certificates (the j-th smallest hi of a chunk) among equal
    // distances.
    let big_ties = ties(dtype, 2500, odd, 19);
    // More than 128 chunks of one row tile: a re-rank launch over all of them
    // packs them in two windows (knn_tile.cuh pack_counts).
    let (many_base, many_queries) = synthetic(8400, 16, 1, dtype, 22);
    let near_base = near_ties(dtype, n, odd, 14);
    // Rows the bounds do not cover, and the candidate kernel's filter that
    // skips them (the index's, knn::special): alone and over a user filter.
    let special = with_special_rows(&base);
    let skip = |user: &Filter| {
        special.as_ref().map(|b| {
            let norms = Norms::of(b);
            Bitset::from_fn(n, |r| user.allows(r) && !norms.is_special(r, metric))
        })
    };
    let skip_alone = skip(&Filter::None);
    let skip_half = skip(&Filter::Bitset(Bitset::random(n, 0.5, 9)));
    let near_queries = near_ties(dtype, 12, odd, 15);
    let label = |s: &str| format!("{dtype:?}/{precision:?}/{metric:?}: {s}");
    let all = [
        Case::new(
            label("20 queries, k 10, rows split in chunks"),
            &base,
            queries.slice_rows(0, 20),
            10,
            12,
        ),
        Case::new(
            label("k 100 (capacity 128)"),
            &base,
            queries.slice_rows(0, 5),
            100,
            8,
        ),
        Case {
            qtile: Some(64),
            ..Case::new(
                label("140 queries, k 10 (query tile 64, a partial last tile)"),
                &base,
                queries.clone(),
                10,
                12,
            )
        },
        Case {
            qtile: Some(32),
            ..Case::new(
                label("70 queries, k 100 (query tile 32, capacity 128)"),
                &base,
                queries.slice_rows(0, 70),
                100,
                8,
            )
        },
        Case::new(
            label("k 200 (capacity 256)"),
            &base,
            queries.slice_rows(10, 14),
            200,
            8,
        ),
        Case::new(
            label("odd dim, k 200 (capacity 256)"),
            &odd_base,
            odd_queries.slice_rows(0, 2),
            200,
            8,
        ),
        Case {
            staging: Some(Staging::Any),
            qtile: Some(64),
            ..Case::new(
                label("140 queries, k 10 (query tile 64), any staging"),
                &base,
                queries.clone(),
                10,
                12,
            )
        },
        Case {
            staging: Some(Staging::Any),
            qtile: Some(32),
            ..Case::new(
                label("70 queries, k 100 (query tile 32, capacity 128), any staging"),
                &base,
                queries.slice_rows(0, 70),
                100,
                8,
            )
        },
        Case::new(
            label("k 700 over 900 rows in one chunk (capacity 1024)"),
            &base,
            queries.slice_rows(0, 1),
            700,
            1,
        ),
        Case {
            tile_grid: 1,
            rerank_grid: 3,
            qtile: Some(32),
            ..Case::new(
                label("70 queries, k 7 (query tile 32), grid-stride loops"),
                &base,
                queries.slice_rows(0, 70),
                7,
                4,
            )
        },
        Case {
            filter: Some(Bitset::random(n, 0.25, 5)),
            qtile: Some(32),
            ..Case::new(
                label("odd dim, bitset filter, a quarter of the rows (query tile 32)"),
                &odd_base,
                odd_queries.slice_rows(0, 17),
                10,
                12,
            )
        },
        Case::new(
            label("rows of 4-byte groups (4-byte copies)"),
            &base4,
            queries4,
            10,
            4,
        ),
        Case::new(
            label("odd dim, one query, k 1, split over many chunks"),
            &odd_base,
            odd_queries.slice_rows(3, 4),
            1,
            32,
        ),
        Case {
            staging: Some(Staging::Any),
            ..Case::new(
                label("ties and duplicate rows (exact reduction), any staging"),
                &tie_base,
                tie_queries.clone(),
                10,
                8,
            )
        },
        Case::new(
            label("odd dim, near ties: every row close to one vector"),
            &near_base,
            near_queries.clone(),
            10,
            8,
        ),
        Case {
            rerank_grid: 2,
            ..Case::new(
                label("3 queries over 40 chunks: merge level, then final"),
                &big_base,
                big_queries.clone(),
                10,
                160,
            )
        },
        Case::new(
            label("k 300 (capacity 512), rows split in chunks"),
            &base,
            queries.slice_rows(0, 3),
            300,
            8,
        ),
        Case::new(
            label("k 700 over 2500 rows in one chunk (capacity 1024: compactions)"),
            &big_base,
            big_queries.clone(),
            700,
            1,
        ),
        Case::new(
            label("ties at k 300 in one chunk (exact reduction at capacity 512)"),
            &tie_base,
            tie_queries.slice_rows(0, 4),
            300,
            1,
        ),
        Case::new(
            label("odd dim, near ties at k 300 in one chunk (capacity 512)"),
            &near_base,
            near_queries.slice_rows(0, 2),
            300,
            1,
        ),
        Case::new(
            label("ties over 40 chunks, k 10: the union bound (1 row a chunk)"),
            &big_ties,
            ties(dtype, 3, odd, 20),
            10,
            160,
        ),
        Case::new(
            label("ties over 40 chunks, k 40: the union bound (2 rows a chunk)"),
            &big_ties,
            ties(dtype, 2, odd, 21),
            40,
            160,
        ),
        Case::new(
            label("k 600 over 40 chunks: merge level at capacity 1024"),
            &big_base,
            big_queries.slice_rows(1, 2),
            600,
            160,
        ),
        Case {
            filter: Some(Bitset::random(2500, 0.5, 8)),
            ..Case::new(
                label("merge level at capacity 128 with a filter"),
                &big_base,
                big_queries.slice_rows(0, 2),
                100,
                160,
            )
        },
    ];
    let mut all = Vec::from(all);
    if let Some(special) = &special {
        for (filter, nq, k, resident, what) in [
            (&skip_alone, 20, 10, 12, "special rows skipped, k 10"),
            (
                &skip_half,
                5,
                100,
                8,
                "special rows skipped under a filter, k 100",
            ),
        ] {
            all.push(Case {
                filter: filter.clone(),
                ..Case::new(label(what), special, queries.slice_rows(0, nq), k, resident)
            });
        }
    }
    assert!(
        all.iter().any(|c| {
            let p = plan_of(c, metric, precision);
            merge_groups(p.chunks(c.base.rows(), c.queries.rows(), c.resident).0).0 > 1
        }),
        "some case must take the merge level"
    );
    // Every candidate kernel of this dtype and precision runs.
    let used: std::collections::BTreeSet<&str> = all
        .iter()
        .map(|c| plan_of(c, metric, precision).tile.name)
        .collect();
    let built: std::collections::BTreeSet<&str> = fraglink::fragments::catalog()
        .iter()
        .filter(|f| {
            f.family == "knn_tile"
                && f.param("dtype") == Some(dtype.name())
                && f.param("precision") == Some(precision.name())
        })
        .map(|f| f.name)
        .collect();
    assert_eq!(used, built, "the cases must cover every variant");
    for c in &all {
        check(exe, metric, precision, c);
    }
    let four = all
        .iter()
        .find(|c| c.what.contains("rows of 4-byte groups"))
        .expect("a case over rows of 4-byte groups");
    a16_refuses_what_it_cannot_copy(exe, metric, precision, four, &all[0]);
    let one = all
        .iter()
        .find(|c| c.queries.rows() == 1)
        .expect("a case with one query");
    too_little_shared_memory_is_refused(exe, metric, precision, one);
    let merging = all
        .iter()
        .find(|c| c.what.contains("merge level, then final"))
        .expect("a case with the merge level");
    for c in [&all[0], merging] {
        an_unwritten_count_skips_its_query(exe, metric, precision, c);
    }
    let ties = all
        .iter()
        .find(|c| c.what.contains("ties and duplicate rows"))
        .expect("a case with ties");
    the_shared_bound_drops_only_far_rows(exe, metric, precision, merging, true);
    the_shared_bound_drops_only_far_rows(exe, metric, precision, ties, false);
    let union_ties = all
        .iter()
        .find(|c| c.what.contains("ties over 40 chunks, k 40"))
        .expect("a case with ties under the union bound");
    the_shared_bound_drops_only_far_rows(exe, metric, precision, union_ties, false);
    let many = Case::new(
        label("one query over 132 chunks"),
        &many_base,
        many_queries,
        10,
        1000,
    );
    one_launch_packs_windows_of_chunks(exe, metric, precision, &many);
    for what in ["grid-stride loops", "k 700 over 900 rows in one chunk"] {
        let c = all
            .iter()
            .find(|c| c.what.contains(what))
            .expect("a case over several row iterations per chunk");
        prefetch_names_only_staged_rows_and_changes_nothing(exe, metric, precision, c);
    }
}

/// knn_rerank packs each window of 128 chunks (their written slots, by a
/// prefix sum of the counts): one launch over more than 128 chunks (no merge
/// level: groups 1, as the final launch over a merge level's many groups)
/// takes several windows, nearly empty under the bounds, full without them
/// (every chunk keeps k rows); both equal the CPU path bit for bit.
fn one_launch_packs_windows_of_chunks(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
) {
    let (_plan, dir, mut args) = prepare(metric, precision, c);
    let n_chunks: u32 = args[7].parse().unwrap();
    assert!(n_chunks > 128, "{}: {n_chunks} chunks", c.what);
    args[8] = "1".into();
    args[9] = n_chunks.to_string();
    let params = SearchParams::new(c.k, metric);
    for (env, how) in [
        (vec![], "bounds"),
        (
            vec![("FRAGLINK_SIMT_NO_BOUND", "1".to_string())],
            "no bound",
        ),
    ] {
        let what = format!(
            "{}: one re-rank launch over {n_chunks} chunks, {how}",
            c.what
        );
        emulated::run_with(exe, &args, &env, &what);
        let found = emulated::read_results(dir.path(), c.queries.rows(), c.k, false);
        emulated::assert_equals_cpu(&found, c.base, &c.queries, &params, &what);
    }
}

/// knn_tile's L2 prefetch (`prefetch` chunks ahead of its copies) is a hint:
/// the results with the host's default lead, a lead beyond every chunk's
/// rows, and none are the same, bit for bit; every byte a block names lies in
/// its chunk's rows as it stages them or their norms (the emulator fails any
/// other; every case runs with the default lead), it names
/// some (the cases run several row iterations per chunk: the first steps'
/// chunks are copied, not prefetched), and no chunk's bytes twice per query
/// tile: at most the staged rows' and norms' bytes (the grid-stride case
/// walks each chunk once per tile).
fn prefetch_names_only_staged_rows_and_changes_nothing(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
) {
    let (plan, dir, args) = prepare(metric, precision, c);
    let run = |lead: u32| {
        let how = format!("prefetch {lead}");
        emulated::run_with(
            exe,
            &args,
            &[("FRAGLINK_SIMT_PREFETCH", lead.to_string())],
            &format!("{}: {how}", c.what),
        );
        let bytes = std::fs::read(dir.path().join("prefetched.bin")).unwrap();
        let named = u64::from_le_bytes(bytes.try_into().expect("one u64"));
        let found = emulated::read_results(dir.path(), c.queries.rows(), c.k, false);
        let bits: Vec<u32> = found.distances.iter().map(|d| d.to_bits()).collect();
        (named, found.ids, bits)
    };
    let (n, dim) = (c.base.rows() as u64, c.base.dim() as u64);
    let tiles = c.queries.rows().div_ceil(plan.qtile as usize) as u64;
    let staged = plan.staged_dtype().size() as u64;
    let norms = if precision == Precision::Int { 1 } else { 2 };
    let most = tiles * n * (dim * staged + 4 * norms);
    assert_eq!(
        fraglink::search::knn::gpu::DEFAULT_PREFETCH,
        4,
        "tests/support/simt/knn_driver.h's default lead"
    );
    let off = run(0);
    assert_eq!(off.0, 0, "{}: prefetch 0 named bytes", c.what);
    for lead in [fraglink::search::knn::gpu::DEFAULT_PREFETCH, 1, 64] {
        let on = run(lead);
        assert!(
            on.0 > 0 && on.0 <= most,
            "{}: prefetch {lead} named {} bytes (at most {most})",
            c.what,
            on.0
        );
        assert_eq!(
            (&on.1, &on.2),
            (&off.1, &off.2),
            "{}: results with prefetch {lead} and without",
            c.what
        );
    }
}

/// The bound a query's chunks share (knn_tile.cuh `shared_bound`) drops
/// only rows that cannot be neighbours: with it (as `check` ran every case)
/// and without it (a null pointer: every chunk on its own) the results are
/// the same, bit for bit, and the tile kernel writes no more candidates with
/// it; over 40 chunks of random rows (`fewer`: the union bound of the chunks'
/// certificates is on from 32), at most a third (a case of 3 queries, k 10:
/// 235-326 against 1182-1385 with every dtype, precision and metric). The
/// emulator runs blocks one after another, so later chunks meet the bound and
/// the certificates the earlier ones left.
fn the_shared_bound_drops_only_far_rows(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
    fewer: bool,
) {
    let (_plan, dir, args) = prepare(metric, precision, c);
    let run = |env: &[(&str, String)], how: &str| {
        emulated::run_with(exe, &args, env, &format!("{}: {how}", c.what));
        let bytes = std::fs::read(dir.path().join("candidates.bin")).unwrap();
        let written = u64::from_le_bytes(bytes.try_into().expect("one u64"));
        let found = emulated::read_results(dir.path(), c.queries.rows(), c.k, false);
        let bits: Vec<u32> = found.distances.iter().map(|d| d.to_bits()).collect();
        (written, found.ids, bits)
    };
    let (shared, ids, dists) = run(&[], "shared bound");
    let (alone, alone_ids, alone_dists) =
        run(&[("FRAGLINK_SIMT_NO_BOUND", "1".into())], "no shared bound");
    assert_eq!(
        (ids, dists),
        (alone_ids, alone_dists),
        "{}: results with and without the shared bound",
        c.what
    );
    assert!(
        shared <= alone && (!fewer || 3 * shared <= alone),
        "{}: {shared} candidates written with the shared bound, {alone} without",
        c.what
    );
}

/// A batch smaller than a query tile launches with its queries' candidate
/// buffers only (`KnnPlan::dynamic_shared_bytes_for`), which every case of
/// fewer queries than its tile runs on; a byte less is refused: the kernel
/// writes nothing (as every launch that breaks its contract).
fn too_little_shared_memory_is_refused(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
) {
    let (plan, _dir, mut args) = prepare(metric, precision, c);
    let nq = c.queries.rows();
    assert!(nq < plan.qtile as usize, "{}", c.what);
    let need = plan.dynamic_shared_bytes_for(nq);
    assert!(need < plan.dynamic_shared_bytes(), "{}", c.what);
    assert_eq!(args[12], need.to_string(), "{}: the launch's bytes", c.what);
    args[12] = (need - 1).to_string();
    assert_refused(
        exe,
        &args,
        "0",
        &format!(
            "{}: {} with {} bytes of candidate buffers",
            c.what,
            args[0],
            need - 1
        ),
    );
}

/// A candidate count the tile kernel left as the host set it (all ones,
/// `Transfer::fill_ones`, as a refused launch leaves every count) makes the
/// re-rank blocks whose first query is that slot's write nothing, through
/// the merge level too: with the query alone in its blocks (query 1 of `c`, whose
/// re-rank grid has at least 2 blocks), its outputs stay NaN, which the GPU
/// path reports (`GpuSearchError::Unwritten`), and every other query's
/// results are unchanged, bit for bit.
fn an_unwritten_count_skips_its_query(
    exe: &Path,
    metric: Metric,
    precision: Precision,
    c: &Case<'_>,
) {
    let (nq, k) = (c.queries.rows(), c.k);
    // Block 1 takes queries 1, 1 + G, ... (G = min(nq, rerank_grid)).
    assert!(
        nq >= 2 && (c.rerank_grid as usize).min(nq) + 1 >= nq,
        "{}: query 1 alone in its re-rank blocks",
        c.what
    );
    let (_plan, dir, args) = prepare(metric, precision, c);
    emulated::run(exe, &args, &c.what);
    let whole = emulated::read_results(dir.path(), nq, k, false);
    let n_chunks: usize = args[7].parse().unwrap();
    let skipped = 1;
    let slot = skipped * n_chunks + n_chunks - 1;
    emulated::run_with(
        exe,
        &args,
        &[("FRAGLINK_SIMT_UNWRITE_SLOT", slot.to_string())],
        &format!("{}: slot {slot} of {n_chunks} chunks unwritten", c.what),
    );
    let part = emulated::read_results(dir.path(), nq, k, false);
    for q in 0..nq {
        let r = q * k..(q + 1) * k;
        let bits = |n: &Neighbors| {
            n.distances[r.clone()]
                .iter()
                .map(|d| d.to_bits())
                .collect::<Vec<_>>()
        };
        if q == skipped {
            assert!(
                part.distances[r.clone()].iter().all(|d| d.is_nan()),
                "{}: query {q} written from an unwritten count",
                c.what
            );
        } else {
            assert_eq!(
                (&part.ids[r.clone()], bits(&part)),
                (&whole.ids[r.clone()], bits(&whole)),
                "{}: query {q} changed by query {skipped}'s unwritten count",
                c.what
            );
        }
    }
}
