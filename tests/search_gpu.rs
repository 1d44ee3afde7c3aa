//! The GPU search path. Without a GPU: every configuration has a plan whose
//! fragments link, and the routed index searches the host rows in place.
//! With one (`cargo test -- --ignored`): the GPU results equal the CPU path's
//! bit for bit on every metric × dtype × filter, one-shot and from a
//! device-resident index across query batches, and the index's base crosses
//! the bus once.

use std::time::{Duration, Instant};

use fraglink::build::Arch;
use fraglink::cost::Target;
use fraglink::gpu::GpuContext;
use fraglink::link::metadata::check_cubin;
use fraglink::link::LinkRuntime;
use fraglink::search::cpu::search_cpu;
use fraglink::search::data::synthetic;
use fraglink::search::gpu::{GpuSearchError, GpuSearcher};
use fraglink::search::knn;
use fraglink::search::plan::plan;
use fraglink::search::route::{Device, RouteError, Searcher};
use fraglink::search::{
    Bitset, DType, Filter, IndexShape, Matrix, Metric, Neighbors, SearchError, SearchParams,
    Vectors,
};

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::I8, DType::U8];
const METRICS: [Metric; 3] = [Metric::L2, Metric::InnerProduct, Metric::Cosine];

#[test]
fn every_configuration_has_a_plan_that_links() {
    for dtype in DTYPES {
        for metric in METRICS {
            for filter in ["none", "bitset"] {
                for (dim, k) in [(128, 10), (33, 1), (96, 256)] {
                    let p = plan(dtype, metric, filter, 5000, dim, k).unwrap();
                    assert!(p.capacity as usize >= k);
                    assert_eq!(dim % p.veclen as usize, 0);
                    if k == 10 {
                        let l = p.planner().link_for(Arch::sm(80)).unwrap();
                        check_cubin(&l.kernel.cubin, p.scan.name).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn every_plan_satisfies_its_launch_contract() {
    // What the GPU path checks before launching (and the kernel checks again):
    // the planner's choice passes for every dtype and dimension, and its
    // vector loads stay aligned for every query row.
    for dtype in DTYPES {
        for dim in (1..=40).chain([127, 128, 768]) {
            for (n_rows, k) in [(5000usize, 10usize), (u32::MAX as usize, 256)] {
                let p = plan(dtype, Metric::L2, "none", n_rows, dim, k).unwrap();
                let c = p.contract();
                let s = c
                    .scalars(n_rows as u64, dim as u64, 1000, k as u64)
                    .unwrap_or_else(|e| panic!("{dtype} dim {dim}: {e}"));
                assert_eq!((s.dim as usize, s.k as usize), (dim, k));
                for row in [0u64, 1, 2, 999] {
                    let offset = row * dim as u64 * dtype.size() as u64;
                    c.check_offset("queries", offset)
                        .unwrap_or_else(|e| panic!("{dtype} dim {dim}: {e}"));
                }
            }
        }
    }
}

#[test]
fn asking_for_the_gpu_without_one_is_a_clear_error() {
    if GpuContext::available().is_ok() {
        return; // a GPU machine: the ignored tests below cover it
    }
    let e = Searcher::new(Device::Gpu)
        .err()
        .expect("no GPU here")
        .to_string();
    assert!(e.contains("--device gpu") && e.contains("no GPU"), "{e}");
    // auto routes to the CPU and says why.
    let s = Searcher::new(Device::Auto).unwrap();
    let (base, queries) = synthetic(500, 16, 3, DType::F32, 1);
    let r = s
        .search(&base, &queries, &SearchParams::new(5, Metric::L2))
        .unwrap();
    assert_eq!(r.target.to_string(), "cpu");
    assert!(r.reason.contains("no GPU"), "{}", r.reason);
}

#[test]
fn a_cpu_routed_index_searches_in_place_and_uploads_nothing() {
    let s = Searcher::new(Device::Cpu).unwrap().with_max_batch(3);
    for dtype in DTYPES {
        let (base, queries) = synthetic(700, 24, 9, dtype, 4);
        let index = s.index(&base);
        for metric in METRICS {
            let params = SearchParams::new(7, metric)
                .with_filter(Filter::Bitset(Bitset::random(700, 0.3, 2)));
            let want = search_cpu(&base, &queries, &params).unwrap();
            for _ in 0..2 {
                let r = index.search(&queries, &params).unwrap();
                assert_eq!(r.target.to_string(), "cpu");
                assert!(r.neighbors.bitwise_eq(&want), "{dtype} {metric}");
                assert_eq!(r.upload_seconds, 0.0);
                assert!(!r.fell_back);
            }
        }
        assert!(index.resident().is_none() && index.upload_time().is_none());
        assert!(std::ptr::eq(index.base(), &base));
    }
}

#[test]
fn a_routed_index_refuses_bad_input_with_typed_errors_naming_the_values() {
    let s = Searcher::new(Device::Cpu).unwrap();
    let (base, queries) = synthetic(100, 16, 2, DType::F32, 1);
    let index = s.index(&base);
    let p = SearchParams::new(5, Metric::L2);
    let expect = |r: Result<_, RouteError>| match r {
        Err(RouteError::Search(e)) => e,
        Err(other) => panic!("expected a SearchError, got {other:?}"),
        Ok(_) => panic!("expected an error"),
    };
    let (_, q8) = synthetic(1, 16, 2, DType::I8, 1);
    let e = expect(index.search(&q8, &p));
    assert_eq!(
        e,
        SearchError::DTypeMismatch {
            base: DType::F32,
            queries: DType::I8
        }
    );
    assert!(
        e.to_string().contains("f32") && e.to_string().contains("i8"),
        "{e}"
    );
    let (_, q12) = synthetic(1, 12, 2, DType::F32, 1);
    let e = expect(index.search(&q12, &p));
    assert_eq!(
        e,
        SearchError::DimensionMismatch {
            base: 16,
            queries: 12
        }
    );
    assert!(
        e.to_string().contains("16") && e.to_string().contains("12"),
        "{e}"
    );
    let e = expect(index.search(&queries, &SearchParams::new(0, Metric::L2)));
    assert_eq!(e, SearchError::InvalidK { k: 0 });
    let e = expect(index.search(
        &queries,
        &p.clone().with_filter(Filter::Bitset(Bitset::all(64))),
    ));
    assert!(
        matches!(
            e,
            SearchError::FilterLength {
                dataset_rows: 100,
                filter_rows: 64,
                ..
            }
        ),
        "{e:?}"
    );
    // The index still answers good input afterwards.
    let r = index.search(&queries, &p).unwrap();
    assert!(r
        .neighbors
        .bitwise_eq(&search_cpu(&base, &queries, &p).unwrap()));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_equals_cpu_on_every_metric_dtype_filter() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    for dtype in DTYPES {
        for metric in METRICS {
            for filter in [0.0, 0.5, 0.002] {
                let (base, queries) = synthetic(3000, 64, 17, dtype, 7);
                let f = if filter == 0.0 {
                    Filter::None
                } else {
                    Filter::Bitset(Bitset::random(3000, filter, 3))
                };
                for k in [1, 10, 100] {
                    let params = SearchParams::new(k, metric).with_filter(f.clone());
                    let want = search_cpu(&base, &queries, &params).unwrap();
                    let got = gpu.search(&base, &queries, &params).unwrap().neighbors;
                    assert!(
                        got.bitwise_eq(&want),
                        "{dtype} {metric} filter {filter} k {k}: first difference at {:?}",
                        got.first_difference(&want)
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn routing_uses_the_gpu_when_forced_and_agrees() {
    let s = Searcher::new(Device::Gpu).unwrap();
    let (base, queries) = synthetic(20_000, 128, 64, DType::F32, 9);
    let params = SearchParams::new(10, Metric::InnerProduct);
    let r = s.search(&base, &queries, &params).unwrap();
    assert_eq!(r.target.to_string(), "gpu");
    assert!(r
        .neighbors
        .bitwise_eq(&search_cpu(&base, &queries, &params).unwrap()));
    // The one-shot form uploaded the base for this call, timed apart.
    assert!(r.upload_seconds > 0.0 && r.seconds > 0.0, "{r:?}");
}

/// A configuration's first search: where only its link would send a search
/// to the CPU, the search runs there (saying so) while the kernels link in
/// the background; else the router links them first, timed apart
/// (`link_seconds`): quickly (no LTO, `FRAGLINK_QUICK_LINK`), the
/// optimised kernels then linking in the background, or in full. Either
/// way a later search finds them linked and runs on the GPU, and every
/// result is the CPU path's. (The kernels may be on disk from an earlier
/// run: then the first search is on the GPU already.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_configurations_first_search_pays_its_link_once_and_apart() {
    // 102 Gflop: the model's GPU wins it linked (100 MB up, 2 Tflop/s)
    // wherever the CPU calibrates below about 1.7 Tflop/s, and not with
    // half a second of link.
    let (base, queries) = synthetic(400_000, 128, 1000, DType::F16, 21);
    let params = SearchParams::new(20, Metric::Cosine);
    let want = search_cpu(&base, &queries, &params).unwrap();
    let s = Searcher::new(Device::Auto).unwrap();
    let gpu = s.gpu().expect("a GPU");
    let kernels = gpu
        .kernels_for(&IndexShape::of(&base), &queries, &params)
        .unwrap();
    let index = s.index(&base);
    let first = index.search(&queries, &params).unwrap();
    assert!(first.neighbors.bitwise_eq(&want), "{}", first.reason);
    if first.reason.starts_with("CPU estimated faster:") {
        // This host's CPU wins the search linked or not: nothing to link.
        assert!(s.linking().is_empty());
        eprintln!("the CPU wins this search here: {}", first.reason);
    } else if first.target == Target::Cpu {
        assert!(
            first.reason.contains("until the GPU kernels are linked"),
            "{}",
            first.reason
        );
        assert_eq!(first.link_seconds, 0.0);
        let started = Instant::now();
        while !s.linking().is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "still linking: {:?}",
                s.linking()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    } else {
        assert!(first.link_seconds > 0.0, "{first:?}");
    }
    if !first.reason.starts_with("CPU estimated faster:") {
        // Quick links, if the search took them, are replaced by now.
        assert_eq!(LinkRuntime::global().unwrap().wait_for_upgrades(), 0);
        assert!(gpu.is_linked(&kernels), "{:?}", kernels.fragment_names());
        // Linked now: never the link's reason again. (What the model
        // learned from the first search may still favour this host's CPU.)
        let next = index.search(&queries, &params).unwrap();
        assert!(
            next.target == Target::Gpu || next.reason.starts_with("CPU estimated faster:"),
            "{}",
            next.reason
        );
        assert!(next.neighbors.bitwise_eq(&want));
        assert!(s.linking().is_empty());
        if next.target == Target::Gpu {
            // Made ready by the search before: nothing asked or prepared.
            let again = index.search(&queries, &params).unwrap();
            assert!(again.neighbors.bitwise_eq(&want));
            if again.target == Target::Gpu {
                assert_eq!(again.link_seconds, 0.0, "{again:?}");
            }
        }
    }

    // Forced to the GPU: linked and loaded before the search, timed apart.
    let (base, queries) = synthetic(3000, 40, 5, DType::I8, 22);
    let params = SearchParams::new(300, Metric::L2);
    let s = Searcher::new(Device::Gpu).unwrap();
    let kernels = s
        .gpu()
        .unwrap()
        .kernels_for(&IndexShape::of(&base), &queries, &params)
        .unwrap();
    // Cold for the router: neither linked nor quickly linkable (quick links
    // take about a millisecond; the model does not learn them as links).
    let gpu = s.gpu().unwrap();
    let cold = !gpu.links_quickly(&kernels);
    let r = s.search(&base, &queries, &params).unwrap();
    assert_eq!(r.target, Target::Gpu, "{}", r.reason);
    assert!(r.link_seconds > 0.0 && r.seconds > 0.0, "{r:?}");
    assert!(r
        .neighbors
        .bitwise_eq(&search_cpu(&base, &queries, &params).unwrap()));
    // A link it made is what the model now adds for the next cold one.
    let (mean, links) = s.model().link_estimate().expect("a GPU");
    assert_eq!(links, u64::from(cold));
    if cold {
        assert!((mean - r.link_seconds).abs() < 1e-9, "{mean} {r:?}");
    }
}

/// Query batches of `nq` queries: all, then the first alone and two uneven
/// parts (together all of them again), and an empty one.
fn batches(nq: usize) -> [std::ops::Range<usize>; 5] {
    [0..nq, 0..1, 1..nq / 2, nq / 2..nq, nq..nq]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_index_uploaded_once_answers_every_batch_like_the_cpu() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    for dtype in DTYPES {
        // dim 64 takes the vector-load variants, dim 33 the veclen-1 ones.
        for (n, dim) in [(3000, 64), (1000, 33)] {
            let (base, queries) = synthetic(n, dim, 40, dtype, 11);
            let index = gpu.upload(&base).unwrap();
            assert_eq!((index.dtype(), index.rows(), index.dim()), (dtype, n, dim));
            // The rows, and the row norms of the tensor-core path where the
            // device has a variant for the dtype (12 bytes a float row, 4 an
            // integer one), for f32 with the rows' f16 copies (f16copy, f32's
            // default: 2 bytes an element), made by the upload.
            let extra = index.device_bytes() - base.size_bytes() as u64;
            let per_row = match dtype {
                DType::F32 => 12 + 2 * dim as u64,
                DType::F16 => 12,
                _ => 4,
            };
            assert!(
                extra == 0 || extra == per_row * n as u64,
                "{dtype}: {extra}"
            );
            let uploads = gpu.transfer().stats().bytes_to_device;
            let mut moved = 0u64;
            let mut last_bits: Option<Vec<u32>> = None;
            for metric in METRICS {
                for fraction in [0.0, 0.5, 0.002] {
                    let filter = if fraction == 0.0 {
                        Filter::None
                    } else {
                        Filter::Bitset(Bitset::random(n, fraction, 3))
                    };
                    for k in [1, 10, 100] {
                        let params = SearchParams::new(k, metric).with_filter(filter.clone());
                        let mut joined = Neighbors {
                            nq: 0,
                            k,
                            ids: Vec::new(),
                            distances: Vec::new(),
                        };
                        for (i, b) in batches(40).into_iter().enumerate() {
                            let part = queries.slice_rows(b.start, b.end);
                            let want = search_cpu(&base, &part, &params).unwrap();
                            let found = index.search(&part, &params).unwrap();
                            if let Some(kp) = &found.knn {
                                // The queries' norms (aux0, aux1), and for
                                // f16copy (f32's default) their f16 bits.
                                moved += 8 * part.rows() as u64;
                                if kp.precision == knn::Precision::F16Copy {
                                    moved += 2 * (part.rows() * dim) as u64;
                                }
                            }
                            let got = found.neighbors;
                            let what = format!(
                                "{dtype} n {n} dim {dim} {metric} filter {fraction} k {k} batch {b:?}"
                            );
                            assert!(
                                got.bitwise_eq(&want),
                                "{what}: first difference at {:?}",
                                got.first_difference(&want)
                            );
                            if (1..=3).contains(&i) {
                                joined.nq += got.nq;
                                joined.ids.extend(&got.ids);
                                joined.distances.extend(&got.distances);
                            }
                            if !part.as_bytes().is_empty() {
                                moved += part.size_bytes() as u64;
                                if let Filter::Bitset(bits) = &filter {
                                    if last_bits.as_ref() != Some(&bits.words) {
                                        moved += 4 * bits.words.len() as u64;
                                        last_bits = Some(bits.words.clone());
                                    }
                                }
                            }
                        }
                        // The batches 0..1, 1..20, 20..40 together are the
                        // whole search.
                        let whole = search_cpu(&base, &queries, &params).unwrap();
                        assert!(
                            joined.bitwise_eq(&whole),
                            "{dtype} {metric} {fraction} k {k}: joined batches differ at {:?}",
                            joined.first_difference(&whole)
                        );
                    }
                }
            }
            // Every byte sent after the upload was a query or a changed
            // filter: the rows never crossed again, nor their copies.
            assert_eq!(
                index.device_bytes() - base.size_bytes() as u64,
                extra,
                "{dtype}: no search made copies"
            );
            assert_eq!(
                gpu.transfer().stats().bytes_to_device - uploads,
                moved,
                "{dtype} n {n} dim {dim}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_base_is_uploaded_once_not_per_search() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (base, queries) = synthetic(20_000, 128, 64, DType::F32, 5);
    let base_bytes = base.size_bytes() as u64;
    let (t0, p0) = (gpu.transfer().stats(), gpu.pool().stats());
    let index = gpu.upload(&base).unwrap();
    let (t1, p1) = (gpu.transfer().stats(), gpu.pool().stats());
    // The rows and, where the device has the tensor-core path for f32 (its
    // f16copy variants), their norms (squared norm, norm and inverse norm,
    // three f32 allocations) and their f16 copies, made at upload from these
    // host rows: 12 + 2 x 128 bytes a row.
    let extra = index.device_bytes() - base_bytes;
    assert!(extra == 0 || extra == (12 + 2 * 128) * 20_000, "{extra}");
    let resident = base_bytes + extra;
    assert_eq!(index.upload_bytes(), resident);
    assert_eq!(t1.bytes_to_device - t0.bytes_to_device, resident);
    assert_eq!(
        t1.bytes_to_host, t0.bytes_to_host,
        "the copies are made from the host rows, none read back"
    );
    assert_eq!(
        p1.allocations - p0.allocations,
        if extra == 0 { 1 } else { 5 },
        "the dataset, its norms and its f16 copies"
    );
    assert_eq!(
        p1.current_bytes, resident,
        "only the rows, norms and copies are resident"
    );
    assert!(index.upload_time() > std::time::Duration::ZERO);

    let k = 10;
    let bits_a = Bitset::random(20_000, 0.5, 1);
    let bits_b = Bitset::random(20_000, 0.5, 2);
    let filter_bytes = 4 * bits_a.words.len() as u64;
    // (filter, expected bytes besides the queries): the bits cross when
    // they change, not per search.
    let plan = [
        (Filter::None, 0),
        (Filter::None, 0),
        (Filter::Bitset(bits_a.clone()), filter_bytes),
        (Filter::Bitset(bits_a.clone()), 0),
        (Filter::Bitset(bits_b.clone()), filter_bytes),
        (Filter::None, 0),
        (Filter::Bitset(bits_b), 0),
    ];
    for (i, (filter, extra)) in plan.into_iter().enumerate() {
        let part = queries.slice_rows(i * 8, i * 8 + 8);
        let params = SearchParams::new(k, Metric::Cosine).with_filter(filter);
        let before = gpu.transfer().stats();
        let got = index.search(&part, &params).unwrap();
        let after = gpu.transfer().stats();
        // The tensor-core path also sends the queries' two norms, and
        // f16copy (f32's default) their f16 bits.
        let qnorms = if got.knn.is_some() { 8 * 8 } else { 0 };
        let q16 = match &got.knn {
            Some(p) if p.precision == knn::Precision::F16Copy => 2 * 8 * 128,
            _ => 0,
        };
        assert_eq!(
            after.bytes_to_device - before.bytes_to_device,
            part.size_bytes() as u64 + extra + qnorms + q16,
            "search {i}: only the queries (and a changed filter) go up"
        );
        // The results (u32 ids, f32 distances), or where the host merges the
        // re-rank's groups their short lists: never the rows (10.24 MB).
        let down = after.bytes_to_host - before.bytes_to_host;
        assert!(
            down >= (8 * k * (4 + 4)) as u64 && down < base_bytes / 50,
            "search {i}: {down} bytes came back"
        );
        let want = search_cpu(&base, &part, &params).unwrap();
        assert!(got.neighbors.bitwise_eq(&want), "search {i}");
        // The queries and results went back to the pool; the rows (and the
        // kept filter bits) stay.
        let live = gpu.pool().stats().current_bytes;
        assert!(
            live == resident || live == resident + filter_bytes,
            "search {i}: {live} bytes live"
        );
    }
    drop(index);
    assert_eq!(
        gpu.pool().stats().current_bytes,
        0,
        "dropping the index frees the rows"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_router_uploads_once_for_all_batches_and_searches() {
    // Batches of 7: the 64 queries run as 10 GPU batches against one upload.
    let s = Searcher::new(Device::Gpu).unwrap().with_max_batch(7);
    let gpu = s.gpu().expect("a GPU").clone();
    for dtype in DTYPES {
        let (base, queries) = synthetic(20_000, 128, 64, dtype, 9);
        let index = s.index(&base);
        assert!(index.resident().is_none(), "nothing moves before a search");
        for metric in METRICS {
            for filter in [Filter::None, Filter::Bitset(Bitset::random(20_000, 0.1, 4))] {
                let params = SearchParams::new(10, metric).with_filter(filter.clone());
                let before = gpu.transfer().stats().bytes_to_device;
                let first = index.resident().is_none();
                let r = index.search(&queries, &params).unwrap();
                let sent = gpu.transfer().stats().bytes_to_device - before;
                let what = format!("{dtype} {metric} {}", filter.fragment_name());
                assert_eq!(r.target.to_string(), "gpu", "{what}: {}", r.reason);
                assert!(!r.fell_back, "{what}: {}", r.reason);
                let want = search_cpu(&base, &queries, &params).unwrap();
                assert!(
                    r.neighbors.bitwise_eq(&want),
                    "{what}: first difference at {:?}",
                    r.neighbors.first_difference(&want)
                );
                let bits = match &filter {
                    Filter::Bitset(b) => 4 * b.words.len() as u64,
                    Filter::None => 0,
                };
                // The tensor-core path also sends the queries' two norms,
                // and f16copy (f32's default) their f16 bits.
                let q16 = match r.gpu_kernel {
                    Some(name) if name.contains("_f16copy_") => 2 * 64 * 128,
                    _ => 0,
                };
                let qn = [0, 8 * 64 + q16];
                let queries_bytes = queries.size_bytes() as u64;
                if first {
                    assert!(r.upload_seconds > 0.0, "{what}");
                    // The rows and, where the device takes the tensor-core
                    // path, their norms.
                    let resident = index.resident().unwrap().device_bytes();
                    assert!(
                        qn.iter()
                            .any(|q| sent == resident + queries_bytes + bits + q),
                        "{what}: {sent}"
                    );
                } else {
                    assert_eq!(r.upload_seconds, 0.0, "{what}");
                    // At most one filter upload across the 10 batches.
                    assert!(
                        qn.iter()
                            .any(|q| sent == queries_bytes + q || sent == queries_bytes + bits + q),
                        "{what}: {sent} bytes sent for {queries_bytes} bytes of queries"
                    );
                }
            }
        }
        let up = index.upload_time().expect("uploaded");
        assert_eq!(index.resident().unwrap().upload_time(), up);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_index_refuses_bad_input_before_moving_a_byte() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (base, queries) = synthetic(1000, 32, 4, DType::F16, 2);
    let index = gpu.upload(&base).unwrap();
    let before = gpu.transfer().stats();
    let p = SearchParams::new(10, Metric::L2);
    let (_, qf32) = synthetic(1, 32, 4, DType::F32, 2);
    match index.search(&qf32, &p).unwrap_err() {
        GpuSearchError::Search(SearchError::DTypeMismatch { base, queries }) => {
            assert_eq!((base, queries), (DType::F16, DType::F32))
        }
        other => panic!("{other:?}"),
    }
    let (_, q16) = synthetic(1, 16, 4, DType::F16, 2);
    match index.search(&q16, &p).unwrap_err() {
        GpuSearchError::Search(SearchError::DimensionMismatch { base, queries }) => {
            assert_eq!((base, queries), (32, 16))
        }
        other => panic!("{other:?}"),
    }
    match index
        .search(&queries, &SearchParams::new(0, Metric::L2))
        .unwrap_err()
    {
        GpuSearchError::Search(SearchError::InvalidK { k: 0 }) => {}
        other => panic!("{other:?}"),
    }
    let bad = p.clone().with_filter(Filter::Bitset(Bitset::all(999)));
    match index.search(&queries, &bad).unwrap_err() {
        GpuSearchError::Search(SearchError::FilterLength {
            dataset_rows: 1000,
            filter_rows: 999,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(gpu.transfer().stats(), before, "nothing moved");
    // Still usable, and k larger than the rows pads like the CPU.
    let (small, q) = synthetic(5, 32, 3, DType::F16, 8);
    let small_index = gpu.upload(&small).unwrap();
    let params = SearchParams::new(8, Metric::InnerProduct);
    let got = small_index.search(&q, &params).unwrap().neighbors;
    assert!(got.bitwise_eq(&search_cpu(&small, &q, &params).unwrap()));
    assert_eq!(got.ids_of(0)[5..], [Neighbors::PAD_ID; 3]);
    let got = index.search(&queries, &p).unwrap().neighbors;
    assert!(got.bitwise_eq(&search_cpu(&base, &queries, &p).unwrap()));
    // k beyond the scan's capacities is not bad input: the tensor-core path
    // or the two-pass select serves it, beyond the rows too.
    for k in [257, 5000] {
        let p = SearchParams::new(k, Metric::L2);
        let got = index.search(&queries, &p).unwrap().neighbors;
        assert!(
            got.bitwise_eq(&search_cpu(&base, &queries, &p).unwrap()),
            "k {k}"
        );
    }
}

/// Deterministic f32 data in [-1, 1) without the f64 staging of
/// `synthetic` (which would need 8 bytes per element of a 4 GiB dataset).
fn lcg_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn datasets_over_4_gib_stay_on_the_gpu() {
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (free, _) = gpu.context().memory_info().unwrap();
    let (dim, n) = (128usize, 8_800_000usize); // 4.2 GiB of f32 rows
    if free < 6 << 30 {
        eprintln!("skipped: {free} bytes free");
        return;
    }
    let base = Vectors::F32(Matrix::new(lcg_f32(n * dim, 1), n, dim).unwrap());
    let queries = Vectors::F32(Matrix::new(lcg_f32(4 * dim, 2), 4, dim).unwrap());
    let params = SearchParams::new(10, Metric::L2);
    // The old pool refused anything over 4 GiB (AllocationTooLarge: the
    // CPU path); the device-sized pool takes it.
    let got = gpu.search(&base, &queries, &params).unwrap();
    assert_eq!(got.plan.as_ref().unwrap().idx, "u32");
    let want = search_cpu(&base, &queries, &params).unwrap();
    assert!(
        got.neighbors.bitwise_eq(&want),
        "first difference at {:?}",
        got.neighbors.first_difference(&want)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn i64_ids_are_reachable_beyond_u32_rows() {
    // 2^32 + 1000 one-byte rows (4 GiB): the plan takes the i64-id scan.
    let gpu = GpuSearcher::new(GpuContext::default().unwrap()).unwrap();
    let (free, _) = gpu.context().memory_info().unwrap();
    let n = u32::MAX as usize + 1001;
    if free < 6 << 30 {
        eprintln!("skipped: {free} bytes free");
        return;
    }
    // Values 1..=251, and zeros only at the rows around 2^32 - 1.
    let zeros = u32::MAX as usize - 2..u32::MAX as usize + 3;
    let data: Vec<u8> = (0..n)
        .map(|i| {
            if zeros.contains(&i) {
                0
            } else {
                1 + (i % 251) as u8
            }
        })
        .collect();
    let base = Vectors::U8(Matrix::new(data, n, 1).unwrap());
    let queries = Vectors::U8(Matrix::new(vec![0u8, 251, 255], 3, 1).unwrap());
    let params = SearchParams::new(5, Metric::L2);
    let got = gpu.search(&base, &queries, &params).unwrap();
    assert_eq!(got.plan.as_ref().unwrap().idx, "i64");
    assert_eq!(got.plan.as_ref().unwrap().scan.name, "scan_u8_i64_v1_k32");
    let ids: Vec<i64> = zeros.clone().map(|i| i as i64).collect();
    assert_eq!(
        got.neighbors.ids_of(0),
        &ids[..],
        "ids beyond u32 must survive"
    );
    assert_eq!(got.neighbors.distances_of(0), &[0.0; 5]);
    // The reference streams the rows once: search_cpu's working arrays for
    // 2^32 rows (row order, per-row norms) would need over 128 GiB of host
    // memory. Dim 1, so the L2 distance is (q - v)^2, exact in f32; ties
    // go to the smaller id, as everywhere.
    let Vectors::U8(m) = &base else {
        unreachable!()
    };
    let qs = [0i64, 251, 255];
    let mut best: Vec<Vec<(i64, i64)>> = vec![Vec::new(); qs.len()];
    for (row, &v) in m.data().iter().enumerate() {
        for (b, &q) in best.iter_mut().zip(&qs) {
            let d = (q - i64::from(v)).pow(2);
            if b.len() < 5 || (d, row as i64) < b[4] {
                let at = b.partition_point(|&x| x < (d, row as i64));
                b.insert(at, (d, row as i64));
                b.truncate(5);
            }
        }
    }
    for (qi, b) in best.iter().enumerate() {
        let ids: Vec<i64> = b.iter().map(|&(_, id)| id).collect();
        let dists: Vec<f32> = b.iter().map(|&(d, _)| d as f32).collect();
        assert_eq!(got.neighbors.ids_of(qi), &ids[..], "query {qi}");
        assert_eq!(got.neighbors.distances_of(qi), &dists[..], "query {qi}");
    }
}
