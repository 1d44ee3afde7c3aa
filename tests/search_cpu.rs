//! The CPU search against the scalar reference (bit for bit), the GPU
//! semantics of fragments/README.md (ties, NaN, padding), and the data loaders.

use std::fs;
use std::path::Path;

use fraglink::search::data::{
    read_bvecs, read_dataset, read_fvecs, read_ground_truth, read_ivecs, read_npy, read_vectors,
    recall_at_k, synthetic, write_ivecs, write_npy, write_npy_ids, write_vectors, DataError,
};
use fraglink::search::{
    search_cpu, search_reference, Bitset, DType, Filter, Matrix, Metric, Neighbors, SearchParams,
    Vectors,
};
use half::f16;

fn assert_same(base: &Vectors, queries: &Vectors, p: &SearchParams) -> Neighbors {
    let fast = search_cpu(base, queries, p).unwrap();
    let slow = search_reference(base, queries, p).unwrap();
    assert!(
        fast.bitwise_eq(&slow),
        "{} {} k={} filter={}: search_cpu differs from search_reference at (query, slot) {:?}: \
         cpu {:?} vs reference {:?}",
        base.dtype(),
        p.metric,
        p.k,
        p.filter.fragment_name(),
        fast.first_difference(&slow),
        fast.first_difference(&slow)
            .map(|(q, _)| (fast.ids_of(q), fast.distances_of(q))),
        fast.first_difference(&slow)
            .map(|(q, _)| (slow.ids_of(q), slow.distances_of(q))),
    );
    assert_eq!(recall_at_k(&fast, &slow, p.k), 1.0);
    fast
}

/// Results are sorted by (distance, id), only allowed ids, padding only at the tail.
fn assert_well_formed(r: &Neighbors, filter: &Filter, n_allowed: usize) {
    for q in 0..r.nq {
        let (ids, ds) = (r.ids_of(q), r.distances_of(q));
        let real = n_allowed.min(r.k);
        for j in 0..r.k {
            if j < real {
                assert!(
                    ids[j] >= 0 && filter.allows(ids[j] as usize),
                    "query {q} slot {j}: id {}",
                    ids[j]
                );
                assert!(!ds[j].is_nan());
            } else {
                assert_eq!(
                    (ids[j], ds[j]),
                    (Neighbors::PAD_ID, f32::INFINITY),
                    "query {q} slot {j}"
                );
            }
            if j > 0 && j < real {
                let ok = ds[j - 1] < ds[j] || (ds[j - 1] == ds[j] && ids[j - 1] < ids[j]);
                assert!(ok, "query {q}: slots {} and {j} out of order", j - 1);
            }
        }
    }
}

#[test]
fn every_metric_dtype_and_filter_matches_the_reference() {
    let (n, dim, nq, k) = (2000, 40, 24, 32);
    for dtype in DType::ALL {
        let (base, queries) = synthetic(n, dim, nq, dtype, 42);
        for metric in Metric::ALL {
            for (fi, filter) in [
                Filter::None,
                Filter::Bitset(Bitset::random(n, 0.5, 1)),
                Filter::Bitset(Bitset::random(n, 0.01, 2)),
            ]
            .into_iter()
            .enumerate()
            {
                let allowed = match &filter {
                    Filter::None => n,
                    Filter::Bitset(b) => b.count(),
                };
                if fi == 2 {
                    assert!(
                        allowed < k,
                        "the 1% filter must leave fewer than k rows ({allowed})"
                    );
                }
                let p = SearchParams::new(k, metric).with_filter(filter.clone());
                let r = assert_same(&base, &queries, &p);
                assert_well_formed(&r, &filter, allowed);
            }
        }
    }
}

#[test]
fn k_one_and_k_256() {
    for dtype in DType::ALL {
        let (base, queries) = synthetic(3000, 33, 10, dtype, 9);
        for metric in Metric::ALL {
            for k in [1, 256] {
                let r = assert_same(&base, &queries, &SearchParams::new(k, metric));
                assert_well_formed(&r, &Filter::None, 3000);
            }
        }
        // k larger than the dataset: padding like the GPU.
        let (small, q) = synthetic(100, 8, 3, dtype, 1);
        let r = assert_same(&small, &q, &SearchParams::new(256, Metric::L2));
        assert_well_formed(&r, &Filter::None, 100);
    }
}

/// The given query rows of `v`.
fn select_rows(v: &Vectors, rows: &[usize]) -> Vectors {
    fn pick<T: Copy>(m: &Matrix<T>, rows: &[usize]) -> Matrix<T> {
        let data = rows.iter().flat_map(|&r| m.row(r).to_vec()).collect();
        Matrix::new(data, rows.len(), m.dim()).unwrap()
    }
    match v {
        Vectors::F32(m) => Vectors::F32(pick(m, rows)),
        Vectors::F16(m) => Vectors::F16(pick(m, rows)),
        Vectors::I8(m) => Vectors::I8(pick(m, rows)),
        Vectors::U8(m) => Vectors::U8(pick(m, rows)),
    }
}

#[test]
fn many_blocks_and_shards() {
    // 300 queries = two query blocks of the GEMM tasks (at most 256 each); 6000
    // rows of dim 32 = two row shards of two GEMM blocks (2048 rows) each. The
    // reference (slow in debug builds) checks a sample of queries from both blocks.
    let sample: Vec<usize> = (0..300).step_by(13).chain([149, 150, 299]).collect();
    for dtype in DType::ALL {
        let (base, queries) = synthetic(6000, 32, 300, dtype, 3);
        let sub = select_rows(&queries, &sample);
        let filter = Filter::Bitset(Bitset::random(6000, 0.7, 4));
        for p in Metric::ALL
            .map(|m| SearchParams::new(10, m))
            .into_iter()
            .chain([SearchParams::new(10, Metric::L2).with_filter(filter)])
        {
            let fast = search_cpu(&base, &queries, &p).unwrap();
            let slow = search_reference(&base, &sub, &p).unwrap();
            for (i, &q) in sample.iter().enumerate() {
                assert_eq!(
                    fast.ids_of(q),
                    slow.ids_of(i),
                    "{dtype} {} query {q}",
                    p.metric
                );
                let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(fast.distances_of(q)), bits(slow.distances_of(i)));
            }
            assert_well_formed(&fast, &p.filter, 6000);
        }
    }
}

/// Dataset where rows `dups` are all copies of row `src`.
fn with_duplicates(v: &Vectors, src: usize, dups: &[usize]) -> Vectors {
    fn copy<T: Copy>(m: &Matrix<T>, src: usize, dups: &[usize]) -> Matrix<T> {
        let dim = m.dim();
        let mut d = m.data().to_vec();
        for &r in dups {
            let row: Vec<T> = m.row(src).to_vec();
            d[r * dim..(r + 1) * dim].copy_from_slice(&row);
        }
        Matrix::new(d, m.rows(), dim).unwrap()
    }
    match v {
        Vectors::F32(m) => Vectors::F32(copy(m, src, dups)),
        Vectors::F16(m) => Vectors::F16(copy(m, src, dups)),
        Vectors::I8(m) => Vectors::I8(copy(m, src, dups)),
        Vectors::U8(m) => Vectors::U8(copy(m, src, dups)),
    }
}

#[test]
fn ties_are_broken_by_the_smaller_id() {
    for dtype in DType::ALL {
        let (base, _) = synthetic(1500, 24, 1, dtype, 5);
        let dups = [3usize, 700, 701, 1200, 1499];
        let base = with_duplicates(&base, 900, &dups);
        // The queries are the duplicated row itself: all six copies tie.
        let q = match &base {
            Vectors::F32(m) => Vectors::f32(m.row(900).repeat(2), 24).unwrap(),
            Vectors::F16(m) => Vectors::f16(m.row(900).repeat(2), 24).unwrap(),
            Vectors::I8(m) => Vectors::i8(m.row(900).repeat(2), 24).unwrap(),
            Vectors::U8(m) => Vectors::u8(m.row(900).repeat(2), 24).unwrap(),
        };
        for metric in Metric::ALL {
            let r = assert_same(&base, &q, &SearchParams::new(8, metric));
            let ds = r.distances_of(0);
            if metric == Metric::L2 {
                assert_eq!(
                    &r.ids_of(0)[..6],
                    &[3, 700, 701, 900, 1200, 1499],
                    "{dtype}"
                );
                assert!(ds[..6].iter().all(|&d| d == 0.0));
            }
            // Whatever the metric, the six copies are adjacent and id-ordered.
            let pos: Vec<usize> = [3i64, 700, 701, 900, 1200, 1499]
                .iter()
                .filter_map(|id| r.ids_of(0).iter().position(|x| x == id))
                .collect();
            assert!(
                pos.windows(2).all(|w| w[1] == w[0] + 1),
                "{dtype} {metric}: {:?}",
                r.ids_of(0)
            );
        }
        // A filter removing some copies.
        let f = Bitset::from_fn(1500, |i| i != 700 && i != 3);
        let p = SearchParams::new(4, Metric::L2).with_filter(Filter::Bitset(f));
        let r = assert_same(&base, &q, &p);
        assert_eq!(r.ids_of(0), &[701, 900, 1200, 1499]);
    }
}

#[test]
fn many_exact_ties_stay_exact() {
    // 3000 identical rows (all keys tie) plus a few distinct ones.
    let dim = 16;
    let mut d = vec![0.5f32; 3000 * dim];
    for j in 0..dim {
        d[2999 * dim + j] = 0.25;
        d[1234 * dim + j] = 0.75;
    }
    let base = Vectors::f32(d, dim).unwrap();
    let q = Vectors::f32(vec![0.3; 2 * dim], dim).unwrap();
    for metric in Metric::ALL {
        assert_same(&base, &q, &SearchParams::new(20, metric));
    }
    let r = search_cpu(&base, &q, &SearchParams::new(3, Metric::L2)).unwrap();
    assert_eq!(r.ids_of(0), &[2999, 0, 1]);
}

#[test]
fn nan_counts_as_infinity() {
    let dim = 8;
    let (base, _) = synthetic(400, dim, 1, DType::F32, 8);
    let Vectors::F32(m) = base else {
        unreachable!()
    };
    let mut d = m.into_data();
    d[10 * dim + 3] = f32::NAN; // row 10: NaN distance for every metric
    d[20 * dim] = f32::INFINITY; // row 20: inf or NaN
    d[30 * dim + 1] = f32::NEG_INFINITY;
    d[40 * dim + 2] = 1e30; // finite but overflows the fold
    let base32 = Vectors::f32(d.clone(), dim).unwrap();
    let base16 = Vectors::f16(d.iter().map(|&v| f16::from_f32(v)).collect(), dim).unwrap();
    let mut qd: Vec<f32> = (0..3 * dim).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
    qd[dim + 4] = f32::NAN; // query 1: every distance NaN → +inf
    let q32 = Vectors::f32(qd.clone(), dim).unwrap();
    let q16 = Vectors::f16(qd.iter().map(|&v| f16::from_f32(v)).collect(), dim).unwrap();
    for (base, q) in [(&base32, &q32), (&base16, &q16)] {
        for metric in Metric::ALL {
            let k = 400;
            let r = assert_same(base, q, &SearchParams::new(k, metric));
            // Row 10 is last-ranked: +inf, valid id, before no padding.
            let pos = r.ids_of(0).iter().position(|&i| i == 10).unwrap();
            assert_eq!(r.distances_of(0)[pos], f32::INFINITY);
            assert!(r.distances_of(0)[pos..].iter().all(|&d| d == f32::INFINITY));
            // Query 1: all +inf, so ids in order.
            assert!(
                r.distances_of(1).iter().all(|&d| d == f32::INFINITY),
                "{metric}"
            );
            assert_eq!(r.ids_of(1), (0..k as i64).collect::<Vec<_>>().as_slice());
            assert!(r.distances.iter().all(|d| !d.is_nan()));
        }
    }
}

#[test]
fn special_magnitudes_zero_vectors_and_signed_zeros() {
    let dim = 4;
    let rows: Vec<[f32; 4]> = vec![
        [0.0, 0.0, 0.0, 0.0],       // zero vector: cosine 1
        [1e-30, 0.0, 0.0, 0.0],     // tiny: squares underflow (cosine: qq = 0 → 1)
        [-1e-30, -0.0, -0.0, -0.0], // ip with a tiny query: −0.0 vs +0.0 ties
        [1e20, 1e20, 0.0, 0.0],     // huge: l2 overflows to inf
        [3e18, -2e18, 1.0, 0.0],    // large but finite
        [1e-40, 1e-41, 0.0, 0.0],   // subnormal
        [1.0, 2.0, 3.0, 4.0],
        [1.0, 2.0, 3.0, 4.0], // duplicate of the previous
        [-1.0, -2.0, -3.0, -4.0],
        [0.5, 0.25, 0.125, 0.0625],
    ];
    let data: Vec<f32> = rows.iter().flatten().copied().collect();
    let base = Vectors::f32(data.clone(), dim).unwrap();
    let queries: Vec<f32> = [
        [0.0f32, 0.0, 0.0, 0.0],
        [1e-30, 0.0, 0.0, 0.0],
        [1.0, 2.0, 3.0, 4.0],
        [1e19, 0.0, 0.0, 0.0],
        [1e-40, 0.0, 0.0, 0.0],
    ]
    .iter()
    .flatten()
    .copied()
    .collect();
    let q = Vectors::f32(queries.clone(), dim).unwrap();
    for metric in Metric::ALL {
        for k in [1, 3, 10, 12] {
            assert_same(&base, &q, &SearchParams::new(k, metric));
        }
    }
    // Cosine with a zero query: every distance is exactly 1, ids in order.
    let r = search_cpu(&base, &q, &SearchParams::new(10, Metric::Cosine)).unwrap();
    assert!(r.distances_of(0).iter().all(|&d| d == 1.0));
    assert_eq!(r.ids_of(0), (0..10).collect::<Vec<i64>>().as_slice());
    // Inner product with the tiny query: rows 1 and 2 give −0.0 and +0.0, which
    // compare equal, so id order decides and each keeps its own sign.
    let r = search_cpu(&base, &q, &SearchParams::new(10, Metric::InnerProduct)).unwrap();
    let p1 = r.ids_of(1).iter().position(|&i| i == 1).unwrap();
    let p2 = r.ids_of(1).iter().position(|&i| i == 2).unwrap();
    assert!(p1 < p2);
    assert_eq!(r.distances_of(1)[p1].to_bits(), (-0.0f32).to_bits());
    assert_eq!(r.distances_of(1)[p2].to_bits(), 0.0f32.to_bits());
    // f16 versions of the same (values saturate / flush as f16 does).
    let b16 = Vectors::f16(data.iter().map(|&v| f16::from_f32(v)).collect(), dim).unwrap();
    let q16 = Vectors::f16(queries.iter().map(|&v| f16::from_f32(v)).collect(), dim).unwrap();
    for metric in Metric::ALL {
        assert_same(&b16, &q16, &SearchParams::new(10, metric));
    }
}

#[test]
fn integer_extremes() {
    let dim = 300; // > 258: the u8 GEMM runs in two exact chunks
    let mut rows_i8 = Vec::new();
    let mut rows_u8 = Vec::new();
    for r in 0..64usize {
        for j in 0..dim {
            let v = match r % 4 {
                0 => -128i32,
                1 => 127,
                2 => 0,
                _ => ((r * 31 + j * 7) % 256) as i32 - 128,
            };
            rows_i8.push(v as i8);
            rows_u8.push((v + 128) as u8);
        }
    }
    let bi = Vectors::i8(rows_i8.clone(), dim).unwrap();
    let bu = Vectors::u8(rows_u8.clone(), dim).unwrap();
    let qi = Vectors::i8(rows_i8[..8 * dim].to_vec(), dim).unwrap();
    let qu = Vectors::u8(rows_u8[..8 * dim].to_vec(), dim).unwrap();
    for metric in Metric::ALL {
        for k in [1, 17, 64, 100] {
            assert_same(&bi, &qi, &SearchParams::new(k, metric));
            assert_same(&bu, &qu, &SearchParams::new(k, metric));
        }
    }
    // i8 above one exact chunk (1024) as well.
    let (b, q) = synthetic(300, 1500, 5, DType::I8, 4);
    for metric in Metric::ALL {
        assert_same(&b, &q, &SearchParams::new(7, metric));
    }
}

#[test]
fn empty_inputs() {
    let b = Vectors::F32(Matrix::new(vec![], 0, 8).unwrap());
    let q = Vectors::f32(vec![1.0; 16], 8).unwrap();
    let r = assert_same(&b, &q, &SearchParams::new(3, Metric::L2));
    assert!(r.ids.iter().all(|&i| i == -1));
    let none = Vectors::F32(Matrix::new(vec![], 0, 8).unwrap());
    let r = search_cpu(&q, &none, &SearchParams::new(3, Metric::L2)).unwrap();
    assert_eq!((r.nq, r.ids.len()), (0, 0));
    // dim = 0: l2 0, inner product −0, cosine 1 for every row.
    let b0 = Vectors::U8(Matrix::new(vec![], 5, 0).unwrap());
    let q0 = Vectors::U8(Matrix::new(vec![], 2, 0).unwrap());
    for (metric, d) in [
        (Metric::L2, 0.0f32),
        (Metric::InnerProduct, -0.0),
        (Metric::Cosine, 1.0),
    ] {
        let r = assert_same(&b0, &q0, &SearchParams::new(3, metric));
        assert_eq!(r.ids_of(1), &[0, 1, 2]);
        assert_eq!(r.distances_of(1)[0].to_bits(), d.to_bits());
    }
    // Nothing allowed.
    let (b, q) = synthetic(50, 8, 2, DType::F16, 1);
    let p = SearchParams::new(4, Metric::Cosine).with_filter(Filter::Bitset(Bitset::none(50)));
    let r = assert_same(&b, &q, &p);
    assert!(r.ids.iter().all(|&i| i == -1));
}

// ---------------------------------------------------------------------------------
// Loaders
// ---------------------------------------------------------------------------------

#[test]
fn loaders_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    for dtype in DType::ALL {
        let (b, _) = synthetic(37, 12, 0, dtype, 77);
        let f = p(&format!("v_{dtype}.npy"));
        write_npy(&f, &b).unwrap();
        assert_eq!(read_npy(&f).unwrap(), b);
        assert_eq!(read_vectors(&f).unwrap(), b);
    }
    let (b, q) = synthetic(50, 9, 4, DType::F32, 1);
    write_vectors(p("b.fvecs"), &b).unwrap();
    write_vectors(p("q.fvecs"), &q).unwrap();
    assert_eq!(read_fvecs(p("b.fvecs")).unwrap(), b);
    let (b2, q2) = read_dataset(p("b.fvecs"), p("q.fvecs")).unwrap();
    assert_eq!((b2, q2), (b.clone(), q.clone()));
    assert!(fs::metadata(p("b.fvecs")).unwrap().len() == 50 * (4 + 9 * 4));
    let (bu, _) = synthetic(20, 5, 0, DType::U8, 2);
    write_vectors(p("b.bvecs"), &bu).unwrap();
    assert_eq!(read_bvecs(p("b.bvecs")).unwrap(), bu);
    // Writing a dtype the format cannot hold.
    assert!(matches!(
        write_vectors(p("x.bvecs"), &b),
        Err(DataError::CannotWrite { .. })
    ));

    // Ground truth: compute it, save it three ways, compare recall.
    let res = search_cpu(&b, &q, &SearchParams::new(5, Metric::L2)).unwrap();
    let ids32: Vec<i32> = res.ids.iter().map(|&i| i as i32).collect();
    write_ivecs(p("gt.ivecs"), &Matrix::new(ids32.clone(), 4, 5).unwrap()).unwrap();
    assert_eq!(read_ivecs(p("gt.ivecs")).unwrap().data(), ids32.as_slice());
    write_npy_ids(p("gt.npy"), &Matrix::new(res.ids.clone(), 4, 5).unwrap()).unwrap();
    for f in ["gt.ivecs", "gt.npy"] {
        let gt = read_ground_truth(p(f)).unwrap();
        assert_eq!(gt.len(), 4);
        assert_eq!(recall_at_k(&res, &gt, 5), 1.0);
    }
    // <i4 ground truth written by hand (numpy's own header layout).
    let mut npy = npy_header("<i4", "(2, 3)", false);
    for v in [1i32, 2, 3, 4, 5, 6] {
        npy.extend_from_slice(&v.to_le_bytes());
    }
    fs::write(p("gt4.npy"), &npy).unwrap();
    assert_eq!(
        read_ground_truth(p("gt4.npy")).unwrap(),
        vec![vec![1, 2, 3], vec![4, 5, 6]]
    );
    // Version 2 header.
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }\n";
    v2.extend_from_slice(&(h.len() as u32).to_le_bytes());
    v2.extend_from_slice(h.as_bytes());
    v2.extend_from_slice(&1.5f32.to_le_bytes());
    v2.extend_from_slice(&(-2.0f32).to_le_bytes());
    fs::write(p("v2.npy"), &v2).unwrap();
    assert_eq!(
        read_npy(p("v2.npy")).unwrap(),
        Vectors::f32(vec![1.5, -2.0], 2).unwrap()
    );
}

fn npy_header(descr: &str, shape: &str, fortran: bool) -> Vec<u8> {
    let mut h = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out
}

fn err_text(e: DataError, path: &Path) -> String {
    let s = e.to_string();
    assert!(
        s.contains(&path.display().to_string()),
        "error does not name the file: {s}"
    );
    s
}

#[test]
fn malformed_files_are_named_and_explained() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);

    // .fvecs: two good records, then a truncated one.
    let mut rec = Vec::new();
    for _ in 0..2 {
        rec.extend_from_slice(&3i32.to_le_bytes());
        for v in [1.0f32, 2.0, 3.0] {
            rec.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut trunc = rec.clone();
    trunc.extend_from_slice(&3i32.to_le_bytes());
    trunc.extend_from_slice(&1.0f32.to_le_bytes());
    fs::write(p("t.fvecs"), &trunc).unwrap();
    let e = read_fvecs(p("t.fvecs")).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::Truncated {
                record: 2,
                offset: 32,
                needed: 16,
                available: 8,
                ..
            }
        ),
        "{e}"
    );
    assert!(err_text(e, &p("t.fvecs")).contains("record 2"));
    // A partial dimension field.
    let mut t2 = rec.clone();
    t2.extend_from_slice(&[3, 0]);
    fs::write(p("t2.fvecs"), &t2).unwrap();
    assert!(matches!(
        read_fvecs(p("t2.fvecs")),
        Err(DataError::Truncated { needed: 4, .. })
    ));

    // Inconsistent dims.
    let mut inc = rec.clone();
    inc.extend_from_slice(&2i32.to_le_bytes());
    inc.extend_from_slice(&[0u8; 8]);
    fs::write(p("i.fvecs"), &inc).unwrap();
    let e = read_fvecs(p("i.fvecs")).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::InconsistentDim {
                record: 2,
                expected: 3,
                found: 2,
                ..
            }
        ),
        "{e}"
    );
    err_text(e, &p("i.fvecs"));

    // Bad / negative dim, empty file, missing file, unknown extension.
    fs::write(p("n.bvecs"), (-5i32).to_le_bytes()).unwrap();
    assert!(matches!(
        read_bvecs(p("n.bvecs")),
        Err(DataError::BadDim { dim: -5, .. })
    ));
    fs::write(p("e.ivecs"), b"").unwrap();
    assert!(matches!(
        read_ivecs(p("e.ivecs")),
        Err(DataError::Empty { .. })
    ));
    let e = read_fvecs(p("missing.fvecs")).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }));
    err_text(e, &p("missing.fvecs"));
    assert!(matches!(
        read_vectors(p("x.csv")),
        Err(DataError::UnknownFormat { .. })
    ));

    // .npy problems.
    fs::write(p("magic.npy"), b"NUMPY\x01\x00garbage").unwrap();
    assert!(matches!(
        read_npy(p("magic.npy")),
        Err(DataError::NotNpy { .. })
    ));
    let mut fo = npy_header("<f4", "(2, 2)", true);
    fo.extend_from_slice(&[0u8; 16]);
    fs::write(p("fortran.npy"), &fo).unwrap();
    let e = read_npy(p("fortran.npy")).unwrap_err();
    assert!(matches!(e, DataError::FortranOrder { .. }));
    assert!(err_text(e, &p("fortran.npy")).contains("Fortran"));
    for (descr, name) in [("<f8", "f8.npy"), (">f4", "be.npy"), ("<i4", "i4.npy")] {
        let mut d = npy_header(descr, "(1, 1)", false);
        d.extend_from_slice(&[0u8; 8]);
        fs::write(p(name), &d).unwrap();
        let e = read_npy(p(name)).unwrap_err();
        assert!(
            matches!(&e, DataError::UnsupportedDType { descr: got, .. } if got == descr),
            "{e}"
        );
        assert!(err_text(e, &p(name)).contains(descr));
    }
    let mut f4 = npy_header("<f4", "(1, 1)", false);
    f4.extend_from_slice(&[0u8; 4]);
    fs::write(p("gtf.npy"), &f4).unwrap();
    assert!(matches!(
        read_ground_truth(p("gtf.npy")),
        Err(DataError::UnsupportedDType { .. })
    ));
    let mut one_d = npy_header("<f4", "(4,)", false);
    one_d.extend_from_slice(&[0u8; 16]);
    fs::write(p("1d.npy"), &one_d).unwrap();
    assert!(matches!(
        read_npy(p("1d.npy")),
        Err(DataError::NotTwoD { .. })
    ));
    let mut short = npy_header("<f2", "(3, 4)", false);
    short.extend_from_slice(&[0u8; 20]);
    fs::write(p("short.npy"), &short).unwrap();
    let e = read_npy(p("short.npy")).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::SizeMismatch {
                expected: 24,
                found: 20,
                ..
            }
        ),
        "{e}"
    );
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    h.extend_from_slice(&200u16.to_le_bytes());
    h.extend_from_slice(b"{'descr': '<f4'");
    fs::write(p("hdr.npy"), &h).unwrap();
    assert!(matches!(
        read_npy(p("hdr.npy")),
        Err(DataError::NpyHeader { .. })
    ));
    // Rows of no elements cost nothing to claim: (10^12, 0) had readers
    // allocate per claimed row (vectors: a later search's 8 TB of row
    // ids, an abort; ground truth: 24 bytes a row).
    fs::write(
        p("dim0.npy"),
        npy_header("|u1", "(1000000000000, 0)", false),
    )
    .unwrap();
    fs::write(p("gt0.npy"), npy_header("<i8", "(150000000, 0)", false)).unwrap();
    for e in [
        read_npy(p("dim0.npy")).unwrap_err(),
        read_ground_truth(p("gt0.npy")).unwrap_err(),
    ] {
        assert!(matches!(e, DataError::ZeroDim { .. }), "{e}");
        assert!(e.to_string().contains("dim 0"), "{e}");
    }
    let mut nos = npy_header("<f4", "(1, 1)", false);
    let at = nos.windows(5).position(|w| w == b"shape").unwrap();
    nos[at..at + 5].copy_from_slice(b"sHApE");
    fs::write(p("noshape.npy"), &nos).unwrap();
    assert!(matches!(
        read_npy(p("noshape.npy")),
        Err(DataError::NpyHeader { .. })
    ));

    // Base and queries that disagree.
    let (b, _) = synthetic(5, 4, 0, DType::F32, 1);
    let (q, _) = synthetic(5, 6, 0, DType::F32, 1);
    write_vectors(p("b.fvecs"), &b).unwrap();
    write_vectors(p("q.fvecs"), &q).unwrap();
    let e = read_dataset(p("b.fvecs"), p("q.fvecs")).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::DimMismatch {
                base_dim: 4,
                query_dim: 6,
                ..
            }
        ),
        "{e}"
    );
    let s = e.to_string();
    assert!(s.contains("b.fvecs") && s.contains("q.fvecs"), "{s}");
    let (qu, _) = synthetic(5, 4, 0, DType::U8, 1);
    write_vectors(p("q.bvecs"), &qu).unwrap();
    assert!(matches!(
        read_dataset(p("b.fvecs"), p("q.bvecs")),
        Err(DataError::DTypeMismatch { .. })
    ));
}
