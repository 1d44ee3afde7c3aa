//! The tensor-core k-NN path on a GPU (`cargo test -- --ignored`, run by
//! scripts/gpu-run.sh from the nextest archive): a device-resident index
//! serves searches through knn_tile + knn_rerank where the planner allows,
//! and every result equals the CPU path's bit for bit — every dtype ×
//! metric, k ∈ {1, 10, 100, 200, 300, 1000}, nq ∈ {1, 100, 1000}, filters, duplicate rows
//! and ties, and the row split of small batches; rows the bounds do not
//! cover (searched by the scan beside the candidate kernel); beyond the
//! candidate kernels' capacities the two-pass select (knn_dist +
//! knn_select). Without a GPU these tests only compile.

mod support;

use fraglink::gpu::GpuContext;
use fraglink::search::cpu::search_cpu;
use fraglink::search::data::synthetic;
use fraglink::search::gpu::GpuSearcher;
use fraglink::search::knn;
use fraglink::search::{Bitset, DType, Filter, Metric, SearchParams, Vectors};
use support::emulated::assert_equals_cpu;

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::I8, DType::U8];

fn searcher() -> GpuSearcher {
    GpuSearcher::new(GpuContext::default().expect("a CUDA GPU")).unwrap()
}

/// Whether the planner gives this search to the tensor-core path on the
/// searcher's device.
fn expects_knn(
    gpu: &GpuSearcher,
    dtype: DType,
    metric: Metric,
    n: usize,
    dim: usize,
    nq: usize,
    k: usize,
) -> bool {
    expects_knn_with(gpu, "none", dtype, metric, n, dim, nq, k)
}

/// [`expects_knn`] for a search whose candidate kernel links `filter`.
#[allow(clippy::too_many_arguments)]
fn expects_knn_with(
    gpu: &GpuSearcher,
    filter: &str,
    dtype: DType,
    metric: Metric,
    n: usize,
    dim: usize,
    nq: usize,
    k: usize,
) -> bool {
    let ctx = gpu.context();
    knn::choose(&knn::KnnRequest {
        device: ctx.arch(),
        shared: knn::plan::SharedMemory::of(ctx.limits()),
        dtype,
        metric,
        filter,
        n_rows: n,
        dim,
        nq,
        k,
    })
    .is_some()
}

/// Whether the two-pass select can serve a search of `k` over `n` rows of
/// `dtype` on the searcher's device.
fn expects_select(gpu: &GpuSearcher, dtype: DType, metric: Metric, n: usize, k: usize) -> bool {
    let ctx = gpu.context();
    knn::choose_select(&knn::KnnRequest {
        device: ctx.arch(),
        shared: knn::plan::SharedMemory::of(ctx.limits()),
        dtype,
        metric,
        filter: "none",
        n_rows: n,
        dim: 8,
        nq: 1,
        k,
    })
    .is_some()
}

/// One search through a fresh index, on the path the planners pick:
/// the tensor-core path where `want_knn`, else the scan up to k = 256 and
/// the two-pass select beyond; equal to the CPU path bit for bit.
fn check(
    gpu: &GpuSearcher,
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
    want_knn: bool,
    what: &str,
) {
    let index = gpu.upload(base).unwrap();
    let want_select = !want_knn && params.k > 256;
    let found = match index.search(queries, params) {
        Ok(found) => found,
        Err(e) => {
            // Beyond the scan's capacities (256) a device that can neither
            // take the tensor-core path nor serve the shape with the select
            // (it links for none of its archs, say) sends the search to the
            // CPU with this error.
            let (dtype, metric) = (base.dtype(), params.metric);
            assert!(
                want_select && !expects_select(gpu, dtype, metric, base.rows(), params.k),
                "{what}: {e}"
            );
            assert!(e.to_string().contains("the CPU path"), "{e}");
            return;
        }
    };
    assert_eq!(found.knn.is_some(), want_knn, "{what}: tensor-core path");
    assert_eq!(found.select.is_some(), want_select, "{what}: select path");
    assert_equals_cpu(&found.neighbors, base, queries, params, what);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tensor_core_path_equals_cpu_on_every_dtype_metric_k_and_batch() {
    let gpu = searcher();
    let (n, dim) = (20_000, 96);
    for dtype in DTYPES {
        let (base, queries) = synthetic(n, dim, 1000, dtype, 21);
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            for nq in [1, 100, 1000] {
                let part = queries.slice_rows(0, nq);
                for k in [1, 10, 100, 200, 300, 1000] {
                    let params = SearchParams::new(k, metric);
                    let want_knn = expects_knn(&gpu, dtype, metric, n, dim, nq, k);
                    check(
                        &gpu,
                        &base,
                        &part,
                        &params,
                        want_knn,
                        &format!("{dtype} {metric} nq {nq} k {k}"),
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn filters_odd_dims_and_tiny_bases_equal_cpu() {
    let gpu = searcher();
    for dtype in DTYPES {
        for (n, dim) in [(5000, 33), (37, 7), (3000, 128)] {
            let (base, queries) = synthetic(n, dim, 70, dtype, 5);
            for fraction in [0.5, 0.01] {
                let filter = Filter::Bitset(Bitset::random(n, fraction, 9));
                for metric in [Metric::L2, Metric::Cosine] {
                    let params = SearchParams::new(10, metric).with_filter(filter.clone());
                    let want_knn = expects_knn(&gpu, dtype, metric, n, dim, 70, 10);
                    check(
                        &gpu,
                        &base,
                        &queries,
                        &params,
                        want_knn,
                        &format!("{dtype} n {n} dim {dim} filter {fraction}"),
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn duplicate_rows_and_ties_go_through_the_exact_reduction() {
    // 3 distinct rows repeated 4000 times: every bound ties, every chunk's
    // buffer overflows its capacity, and ties must resolve by smaller id.
    let gpu = searcher();
    let dim = 16;
    let protos: [Vec<f32>; 3] = [
        vec![1.0; 16],
        vec![0.5; 16],
        (0..16).map(|j| j as f32 / 8.0).collect(),
    ];
    let base: Vec<f32> = (0..12_000).flat_map(|i| protos[i % 3].clone()).collect();
    let queries: Vec<f32> = (0..8)
        .flat_map(|i| {
            protos[i % 3]
                .iter()
                .map(move |v| v + i as f32 * 0.01)
                .collect::<Vec<_>>()
        })
        .collect();
    let as_dtype = |v: &[f32], dtype: DType| -> Vectors {
        match dtype {
            DType::F32 => Vectors::f32(v.to_vec(), dim).unwrap(),
            DType::F16 => {
                Vectors::f16(v.iter().map(|&x| half::f16::from_f32(x)).collect(), dim).unwrap()
            }
            DType::I8 => Vectors::i8(v.iter().map(|&x| (x * 50.0) as i8).collect(), dim).unwrap(),
            DType::U8 => Vectors::u8(v.iter().map(|&x| (x * 100.0) as u8).collect(), dim).unwrap(),
        }
    };
    for dtype in DTYPES {
        let (b, q) = (as_dtype(&base, dtype), as_dtype(&queries, dtype));
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            for k in [1, 32, 100, 300, 1000] {
                let params = SearchParams::new(k, metric);
                let want_knn = expects_knn(&gpu, dtype, metric, 12_000, dim, 8, k);
                check(
                    &gpu,
                    &b,
                    &q,
                    &params,
                    want_knn,
                    &format!("duplicates {dtype} {metric} k {k}"),
                );
            }
        }
    }
}

/// `base` (f32 or f16, dim 32) with rows the tensor-core bounds do not
/// cover: a NaN (row 5), an infinity (row 77), for f32 a huge norm (row
/// 300), and zero vectors (rows 0 and 1999, special for cosine only).
fn with_special_rows(base: &Vectors) -> Vectors {
    match base {
        Vectors::F32(m) => {
            let mut d = m.data().to_vec();
            d[5 * 32 + 4] = f32::NAN;
            d[77 * 32] = f32::NEG_INFINITY;
            d[300 * 32 + 31] = 2e30;
            d[..32].fill(0.0);
            d[1999 * 32..2000 * 32].fill(0.0);
            Vectors::f32(d, 32).unwrap()
        }
        Vectors::F16(m) => {
            let mut d = m.data().to_vec();
            d[5 * 32 + 4] = half::f16::NAN;
            d[77 * 32] = half::f16::NEG_INFINITY;
            d[..32].fill(half::f16::ZERO);
            d[1999 * 32..2000 * 32].fill(half::f16::ZERO);
            Vectors::f16(d, 32).unwrap()
        }
        _ => unreachable!("only float rows are special"),
    }
}

/// The 100 queries `q` (f32 or f16, dim 32) with a NaN in query 3 and
/// query 50 all zeros.
fn with_special_queries(q: &Vectors) -> Vectors {
    match q {
        Vectors::F32(m) => {
            let mut d = m.data().to_vec();
            d[3 * 32 + 9] = f32::NAN;
            d[50 * 32..51 * 32].fill(0.0);
            Vectors::f32(d, 32).unwrap()
        }
        Vectors::F16(m) => {
            let mut d = m.data().to_vec();
            d[3 * 32 + 9] = half::f16::NAN;
            d[50 * 32..51 * 32].fill(half::f16::ZERO);
            Vectors::f16(d, 32).unwrap()
        }
        _ => unreachable!("only float queries are special"),
    }
}

/// Rows the bounds do not cover stay on the tensor-core path: the
/// candidate kernel skips them and the scan searches them beside it
/// (`knn::special`), as many as the filter allows; beyond the candidate
/// kernels' capacities the two-pass select takes them as before. Queries
/// the bounds do not cover among others are answered apart (the scan, or
/// the select). Equal to the CPU path bit for bit, NaN ranking as +inf.
#[test]
#[ignore = "needs a CUDA GPU"]
fn special_rows_join_the_tensor_core_path_through_a_scan_of_their_own() {
    let gpu = searcher();
    for dtype in [DType::F32, DType::F16] {
        let (base, queries) = synthetic(2000, 32, 100, dtype, 3);
        let special = with_special_rows(&base);
        let index = gpu.upload(&special).unwrap();
        let sparse = Bitset::from_fn(2000, |r| r % 7 == 0 || r == 5 || r == 1999);
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            for filter in [
                Filter::None,
                Filter::Bitset(sparse.clone()),
                Filter::Bitset(Bitset::from_fn(2000, |r| r != 5 && r != 77 && r % 3 != 0)),
            ] {
                let rows = fraglink::search::knn::norms::Norms::of(&special);
                let allowed_special = (0..2000)
                    .filter(|&r| rows.is_special(r, metric) && filter.allows(r))
                    .count();
                for nq in [1, 7, 100] {
                    // At nq 100 special queries too: a NaN (3), a zero
                    // vector (50, special for cosine only).
                    let q = if nq == 100 {
                        with_special_queries(&queries)
                    } else {
                        queries.slice_rows(0, nq)
                    };
                    let special_q = fraglink::search::knn::norms::Norms::of(&q);
                    let special_q = (0..nq).filter(|&i| special_q.is_special(i, metric)).count();
                    for k in [1, 10, 100, 300, 1500] {
                        let params = SearchParams::new(k, metric).with_filter(filter.clone());
                        let what = format!(
                            "{dtype} {metric} nq {nq} k {k} filter {:?}",
                            filter.fragment_name()
                        );
                        let found = index
                            .search(&q, &params)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        let want_knn =
                            expects_knn_with(&gpu, "bitset", dtype, metric, 2000, 32, nq, k);
                        assert_eq!(found.knn.is_some(), want_knn, "{what}: tensor-core path");
                        if want_knn {
                            assert_eq!(found.special_rows, allowed_special, "{what}");
                            assert_eq!(found.special_queries, special_q, "{what}");
                        }
                        assert_equals_cpu(&found.neighbors, &special, &q, &params, &what);
                    }
                }
            }
        }
    }
}

/// Where the scan cannot take the special rows (more of them allowed than
/// its 256, k beyond that too), or every query is special, the whole search
/// leaves the tensor-core path for the two-pass select, still exact.
#[test]
#[ignore = "needs a CUDA GPU"]
fn special_rows_or_queries_beyond_the_scan_take_the_select() {
    let gpu = searcher();
    let (base, queries) = synthetic(3000, 32, 20, DType::F32, 4);
    let Vectors::F32(m) = &base else {
        unreachable!()
    };
    // 400 zero vectors: special for cosine only.
    let mut d = m.data().to_vec();
    d[..400 * 32].fill(0.0);
    let zeros = Vectors::f32(d, 32).unwrap();
    let index = gpu.upload(&zeros).unwrap();
    let Vectors::F32(q) = &queries else {
        unreachable!()
    };
    let nan_queries = Vectors::f32(q.data().iter().map(|_| f32::NAN).collect(), 32).unwrap();
    for (what, metric, qs, want_knn) in [
        ("400 zero rows, cosine", Metric::Cosine, &queries, false),
        (
            "400 zero rows, l2 (not special)",
            Metric::L2,
            &queries,
            true,
        ),
        ("only NaN queries", Metric::L2, &nan_queries, false),
    ] {
        let params = SearchParams::new(300, metric);
        let found = index.search(qs, &params).unwrap();
        let select = expects_select(&gpu, DType::F32, metric, 3000, 300);
        let knn = want_knn && expects_knn(&gpu, DType::F32, metric, 3000, 32, 20, 300);
        assert_eq!(found.knn.is_some(), knn, "{what}");
        assert_eq!(found.select.is_some(), !knn && select, "{what}");
        assert_equals_cpu(&found.neighbors, &zeros, qs, &params, what);
    }
}

/// More special rows than an index copies aside (64 MiB): 600 000 zero
/// vectors of 32 f32 (77 MB, special for cosine only) and 3 NaN rows. The
/// copy keeps the NaN rows alone, so l2 stays on the tensor-core path
/// beside a scan of those 3, and cosine leaves it for the scan.
#[test]
#[ignore = "needs a CUDA GPU"]
fn special_rows_beyond_the_copy_cap_leave_only_the_metric_they_exceed() {
    let gpu = searcher();
    let (n, dim) = (650_000, 32);
    let (base, queries) = synthetic(n, dim, 5, DType::F32, 6);
    let Vectors::F32(m) = &base else {
        unreachable!()
    };
    let mut d = m.data().to_vec();
    d[..600_000 * dim].fill(0.0);
    for r in [3, 600_001, 649_999] {
        d[r * dim + 1] = f32::NAN;
    }
    let base = Vectors::f32(d, dim).unwrap();
    let index = gpu.upload(&base).unwrap();
    for (metric, want_knn) in [(Metric::L2, true), (Metric::Cosine, false)] {
        let params = SearchParams::new(10, metric);
        let found = index.search(&queries, &params).unwrap();
        let knn = want_knn && expects_knn_with(&gpu, "bitset", DType::F32, metric, n, dim, 5, 10);
        assert_eq!(found.knn.is_some(), knn, "{metric}");
        if knn {
            assert_eq!(found.special_rows, 3, "{metric}");
        }
        assert_equals_cpu(
            &found.neighbors,
            &base,
            &queries,
            &params,
            &format!("{metric}"),
        );
    }
}

/// The scan splits a few queries' rows over the SMs (`row_splits`) and
/// merges each query's splits on the host: the same results as one block
/// per query. `GpuIndex::search_scan` keeps these searches on the scan; a
/// sparse filter leaves most splits without a row allowed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_few_queries_split_the_scans_rows_and_merge_to_the_cpu_answer() {
    let gpu = searcher();
    for dtype in [DType::F32, DType::F16] {
        let (base, _) = synthetic(50_000, 40, 1, dtype, 12);
        let index = gpu.upload(&base).unwrap();
        for nq in [1, 7, 300] {
            let (_, q) = synthetic(1, 40, nq, dtype, 13 + nq as u64);
            for (k, density) in [(1, 0.0), (10, 0.0), (256, 0.0), (10, 0.0005)] {
                let filter = if density == 0.0 {
                    Filter::None
                } else {
                    Filter::Bitset(Bitset::random(50_000, density, 5))
                };
                let params = SearchParams::new(k, Metric::L2).with_filter(filter);
                let what = format!("{dtype} nq {nq} k {k} filter {density}");
                let found = index.search_scan(&q, &params).unwrap();
                assert!(found.knn.is_none() && found.select.is_none(), "{what}");
                assert_equals_cpu(&found.neighbors, &base, &q, &params, &what);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_two_pass_select_equals_cpu_beyond_the_candidate_capacities() {
    // k beyond 1024 (every dtype and metric, filters, k beyond the rows),
    // k beyond the sort (slices), and a base of 1.1M rows whose 300 queries take three batches of the
    // distance matrix (SelectPlan::batch: 121 queries).
    let gpu = searcher();
    for dtype in DTYPES {
        let (base, queries) = synthetic(20_000, 40, 30, dtype, 13);
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            for k in [1025, 4000] {
                let params = SearchParams::new(k, metric);
                check(
                    &gpu,
                    &base,
                    &queries,
                    &params,
                    false,
                    &format!("{dtype} {metric} k {k}"),
                );
            }
        }
        let filter = Filter::Bitset(Bitset::random(20_000, 0.05, 3));
        let params = SearchParams::new(1500, Metric::L2).with_filter(filter);
        check(
            &gpu,
            &base,
            &queries,
            &params,
            false,
            &format!("{dtype} 5% filter"),
        );
        let (small, q) = synthetic(700, 9, 5, dtype, 2);
        let params = SearchParams::new(3000, Metric::Cosine);
        check(
            &gpu,
            &small,
            &q,
            &params,
            false,
            &format!("{dtype} k beyond the rows"),
        );
    }
    // k beyond what the select sorts at once (16384 keys on an A100 or
    // H100): the winners in slices, with and without a filter.
    let (base, queries) = synthetic(60_000, 24, 12, DType::F32, 21);
    for (what, params) in [
        ("slices", SearchParams::new(40_000, Metric::L2)),
        (
            "slices over a 50% filter",
            SearchParams::new(35_000, Metric::InnerProduct)
                .with_filter(Filter::Bitset(Bitset::random(60_000, 0.5, 5))),
        ),
    ] {
        check(&gpu, &base, &queries, &params, false, what);
    }
    let n = 1_100_000;
    assert_eq!(knn::SelectPlan::batch(n, 2000), 121);
    let (base, queries) = synthetic(n, 16, 300, DType::F32, 4);
    check(
        &gpu,
        &base,
        &queries,
        &SearchParams::new(2000, Metric::L2),
        false,
        "three batches",
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_candidate_variant_by_name_equals_cpu() {
    // Each knn_tile variant the device has shared memory for, named
    // (GpuIndex::search_with_variant), on 150 queries (a partial last tile
    // for every query tile) with k at its capacity and below: the `_a16`
    // variants (staging 16) over rows of whole 16-byte groups (dim 80), the
    // others over rows that are not (their 4-byte or element copies).
    let gpu = searcher();
    let limit = gpu.context().limits().shared_bytes_per_block_optin;
    let arch = gpu.context().arch();
    let mut ran = 0;
    for (dtype, staging) in DTYPES.into_iter().flat_map(|d| [(d, "16"), (d, "0")]) {
        let dim = match (staging, dtype.size()) {
            ("16", _) => 80,
            (_, 1) => 70,
            _ => 45,
        };
        let (base, queries) = synthetic(30_000, dim, 150, dtype, 31);
        let index = gpu.upload(&base).unwrap();
        for f in fraglink::fragments::catalog().iter().filter(|f| {
            f.family == "knn_tile"
                && f.param("dtype") == Some(dtype.name())
                && f.param("staging") == Some(staging)
                && f.links_for(arch)
        }) {
            let cap: usize = f.param("capacity").unwrap().parse().unwrap();
            for (k, metric) in [(cap, Metric::L2), (7, Metric::Cosine)] {
                let params = SearchParams::new(k, metric);
                let found = match index.search_with_variant(&queries, &params, Some(f.name)) {
                    Ok(found) => found,
                    Err(e) => {
                        // Only a variant the device cannot hold may refuse.
                        let plan = knn::plan::all_plans()
                            .into_iter()
                            .find(|p| p.tile.name == f.name)
                            .unwrap();
                        assert!(plan.shared_bytes() > limit, "{}: {e}", f.name);
                        continue;
                    }
                };
                assert_eq!(found.knn.as_ref().map(|p| p.tile.name), Some(f.name));
                assert_equals_cpu(
                    &found.neighbors,
                    &base,
                    &queries,
                    &params,
                    &format!("{} k {k} {metric}", f.name),
                );
                ran += 1;
            }
        }
    }
    assert!(ran > 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f16copy_makes_its_copies_once_and_refuses_what_f16_cannot_hold() {
    // The f16copy variants read f16 copies of f32 rows: the upload makes
    // them (half the rows' bytes, once), no search makes more; rows or queries with an element beyond f16's range are
    // an error naming the variant, and the other precisions still serve them.
    let gpu = searcher();
    let arch = gpu.context().arch();
    let Some(name) = fraglink::fragments::catalog()
        .iter()
        .find(|f| {
            f.family == "knn_tile"
                && f.param("precision") == Some("f16copy")
                && f.param("capacity") == Some("32")
                && f.param("staging") == Some("16")
                && f.links_for(arch)
        })
        .map(|f| f.name)
    else {
        panic!("no f16copy variant links for {arch}");
    };
    let (base, queries) = synthetic(20_000, 64, 40, DType::F32, 41);
    let index = gpu.upload(&base).unwrap();
    let before = index.device_bytes();
    // The rows, their three norms and their f16 copies.
    assert_eq!(before, 20_000 * (64 * 4 + 12 + 64 * 2));
    assert_eq!(index.upload_bytes(), before, "the copies are the upload's");
    let params = SearchParams::new(10, Metric::L2);
    let want = search_cpu(&base, &queries, &params).unwrap();
    for round in 0..2 {
        let found = index
            .search_with_variant(&queries, &params, Some(name))
            .unwrap();
        assert!(found.neighbors.bitwise_eq(&want), "round {round}");
        assert_eq!(
            index.device_bytes(),
            before,
            "round {round}: no search makes copies"
        );
    }
    // A query element beyond 65504.
    let Vectors::F32(m) = &queries else {
        unreachable!()
    };
    let mut far = m.data().to_vec();
    far[5] = 1e6;
    let far = Vectors::f32(far, 64).unwrap();
    let e = index
        .search_with_variant(&far, &params, Some(name))
        .unwrap_err()
        .to_string();
    assert!(e.contains(name) && e.contains("queries"), "{e}");
    // Rows beyond it: refused for f16copy by name; the default (f16copy)
    // falls back to plain TF32.
    let Vectors::F32(b) = &base else {
        unreachable!()
    };
    let mut rows = b.data().to_vec();
    rows[77] = -1e5;
    let rows = Vectors::f32(rows, 64).unwrap();
    let index = gpu.upload(&rows).unwrap();
    let e = index
        .search_with_variant(&queries, &params, Some(name))
        .unwrap_err()
        .to_string();
    assert!(e.contains(name) && e.contains("rows"), "{e}");
    let found = index.search(&queries, &params).unwrap();
    let want = search_cpu(&rows, &queries, &params).unwrap();
    assert!(found.neighbors.bitwise_eq(&want));
    assert_eq!(
        found.knn.map(|p| p.precision),
        Some(knn::Precision::Tf32),
        "the fallback from f16copy"
    );
    // The same queries over rows f16 holds: f16copy by default.
    let index = gpu.upload(&base).unwrap();
    let found = index.search(&queries, &params).unwrap();
    assert!(found
        .neighbors
        .bitwise_eq(&search_cpu(&base, &queries, &params).unwrap()));
    assert_eq!(
        found.knn.map(|p| p.precision),
        Some(knn::Precision::F16Copy)
    );
}
