//! IVF-Flat on the CPU: the fast search equals its scalar definition bit for
//! bit, a full probe equals brute force bit for bit, recall grows with nprobe,
//! and index files round-trip and refuse truncated, corrupted and foreign bytes.

use fraglink::search::data::{recall_at_k, synthetic};
use fraglink::search::ivf::{
    build_index, read_index, search_ivf, search_ivf_reference, veclen_for, write_index,
    IndexFileError, IvfBuildParams, IvfIndex, IvfSearchParams, MetricSpec,
};
use fraglink::search::{
    search_reference, Bitset, DType, Filter, Metric, Neighbors, SearchParams, Vectors,
};

fn build(base: &Vectors, nlist: usize, spec: MetricSpec, seed: u64) -> IvfIndex {
    let mut p = IvfBuildParams::new(nlist, spec).with_seed(seed);
    p.iterations = 6;
    build_index(base, &p).unwrap()
}

fn assert_bitwise(a: &Neighbors, b: &Neighbors, what: &str) {
    assert!(
        a.bitwise_eq(b),
        "{what}: differ at {:?}: {:?} vs {:?}",
        a.first_difference(b),
        a.first_difference(b)
            .map(|(q, _)| (a.ids_of(q), a.distances_of(q))),
        a.first_difference(b)
            .map(|(q, _)| (b.ids_of(q), b.distances_of(q))),
    );
}

const SPECS: [&str; 4] = ["l2", "l2sqrt", "ip", "cosine"];

#[test]
fn fast_search_equals_the_scalar_definition() {
    for dtype in DType::ALL {
        // Both layouts of every dtype: the default (1 for f32) and cuVS's rule
        // (f32: 4, read through the AVX2 transposes; f16: 8 at dim 32; i8/u8: 16
        // at dim 32; 1 where 20 is not a multiple).
        for (dim, cuvs) in [(20, false), (32, false), (20, true), (32, true)] {
            let (base, queries) = synthetic(1500, dim, 40, dtype, 11 + dim as u64);
            for spec in SPECS {
                let spec: MetricSpec = spec.parse().unwrap();
                let mut bp = IvfBuildParams::new(24, spec).with_seed(5);
                bp.iterations = 6;
                bp.veclen = cuvs.then(|| veclen_for(dtype, dim));
                let index = build_index(&base, &bp).unwrap();
                for (k, nprobe) in [(1, 1), (10, 3), (37, 7), (2000, 2), (5, 12)] {
                    let p = IvfSearchParams::new(k, nprobe);
                    let fast = search_ivf(&index, &queries, &p).unwrap();
                    let slow = search_ivf_reference(&index, &queries, &p).unwrap();
                    assert_bitwise(
                        &fast,
                        &slow,
                        &format!("{dtype} dim {dim} {spec} k {k} nprobe {nprobe}"),
                    );
                }
                let filter = Filter::Bitset(Bitset::random(base.rows(), 0.3, 9));
                let p = IvfSearchParams::new(10, 4).with_filter(filter.clone());
                let fast = search_ivf(&index, &queries, &p).unwrap();
                let slow = search_ivf_reference(&index, &queries, &p).unwrap();
                assert_bitwise(&fast, &slow, &format!("{dtype} {spec} bitset"));
                assert!(fast
                    .ids
                    .iter()
                    .all(|&id| id < 0 || filter.allows(id as usize)));
            }
        }
    }
}

#[test]
fn probing_every_list_is_brute_force_bit_for_bit() {
    for dtype in DType::ALL {
        let (base, queries) = synthetic(2000, 24, 30, dtype, 3);
        for spec in SPECS {
            let spec: MetricSpec = spec.parse().unwrap();
            let index = build(&base, 16, spec, 1);
            for nprobe in [16, 1000] {
                let filter = Filter::Bitset(Bitset::random(base.rows(), 0.5, 2));
                for f in [Filter::None, filter] {
                    let got = search_ivf(
                        &index,
                        &queries,
                        &IvfSearchParams::new(10, nprobe).with_filter(f.clone()),
                    )
                    .unwrap();
                    let mut want = search_reference(
                        &base,
                        &queries,
                        &SearchParams::new(10, spec.metric).with_filter(f),
                    )
                    .unwrap();
                    want.distances
                        .iter_mut()
                        .for_each(|d| *d = spec.post.apply(*d));
                    assert_bitwise(&got, &want, &format!("{dtype} {spec} nprobe {nprobe}"));
                }
            }
        }
    }
}

#[test]
fn nan_rows_and_queries_follow_the_definition() {
    let (base, queries) = synthetic(800, 8, 12, DType::F32, 4);
    let Vectors::F32(b) = base else {
        unreachable!()
    };
    let Vectors::F32(q) = queries else {
        unreachable!()
    };
    let mut bd = b.into_data();
    for r in [3usize, 100, 401] {
        bd[r * 8 + 2] = f32::NAN;
    }
    bd[7 * 8] = f32::INFINITY;
    let mut qd = q.into_data();
    qd[5 * 8 + 1] = f32::NAN;
    let base = Vectors::f32(bd, 8).unwrap();
    let queries = Vectors::f32(qd, 8).unwrap();
    for spec in SPECS {
        let spec: MetricSpec = spec.parse().unwrap();
        // k-means sees the NaN rows too; the index must still be well defined.
        let index = build(&base, 8, spec, 2);
        for nprobe in [1, 3, 8] {
            let p = IvfSearchParams::new(20, nprobe);
            let fast = search_ivf(&index, &queries, &p).unwrap();
            let slow = search_ivf_reference(&index, &queries, &p).unwrap();
            assert_bitwise(&fast, &slow, &format!("NaN {spec} nprobe {nprobe}"));
        }
        // The NaN query: every distance +inf, ties by id.
        let r = search_ivf(&index, &queries, &IvfSearchParams::new(5, 8)).unwrap();
        assert!(r.distances_of(5).iter().all(|d| *d == f32::INFINITY));
        assert_eq!(r.ids_of(5), &[0, 1, 2, 3, 4]);
    }
}

#[test]
fn recall_grows_with_nprobe_and_builds_are_reproducible() {
    let (base, queries) = synthetic(20_000, 32, 200, DType::F32, 21);
    let spec = MetricSpec::plain(Metric::L2);
    let index = build(&base, 64, spec, 7);
    assert_eq!(index, build(&base, 64, spec, 7), "same seed, same index");
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(
        index,
        one_thread.install(|| build(&base, 64, spec, 7)),
        "any thread count"
    );
    assert_eq!((0..64).map(|l| index.list_len(l)).sum::<usize>(), 20_000);
    let truth = search_reference(&base, &queries, &SearchParams::new(10, Metric::L2)).unwrap();
    let mut last = 0.0;
    for nprobe in [1, 2, 4, 8, 16, 64] {
        let r = search_ivf(&index, &queries, &IvfSearchParams::new(10, nprobe)).unwrap();
        let recall = recall_at_k(&r, &truth, 10);
        assert!(recall >= last, "nprobe {nprobe}: recall {recall} < {last}");
        last = recall;
    }
    assert_eq!(last, 1.0);
}

#[test]
fn index_files_round_trip_and_refuse_bad_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in DType::ALL {
        let (base, queries) = synthetic(700, 16, 5, dtype, 8);
        let index = build(&base, 10, "l2sqrt".parse().unwrap(), 3);
        let path = dir.path().join(format!("{dtype}.ivf"));
        write_index(&path, &index).unwrap();
        let back = read_index(&path).unwrap();
        assert_eq!(back, index);
        assert_eq!(
            back.reconstruct(),
            base,
            "the lists hold the base bit for bit"
        );
        let p = IvfSearchParams::new(4, 2);
        assert_bitwise(
            &search_ivf(&back, &queries, &p).unwrap(),
            &search_ivf(&index, &queries, &p).unwrap(),
            "reloaded",
        );
    }
    let path = dir.path().join("f32.ivf");
    let bytes = std::fs::read(&path).unwrap();
    let bad = dir.path().join("bad.ivf");
    let read_bad = |b: &[u8]| {
        std::fs::write(&bad, b).unwrap();
        read_index(&bad).unwrap_err()
    };
    for cut in [0, 5, 40, 60, 1000, bytes.len() - 1] {
        let e = read_bad(&bytes[..cut]);
        assert!(
            matches!(
                e,
                IndexFileError::Truncated { .. } | IndexFileError::Foreign { .. }
            ),
            "cut at {cut}: {e}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(read_bad(&longer), IndexFileError::Trailing { .. }));
    for at in [100, bytes.len() / 2, bytes.len() - 40, bytes.len() - 1] {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x10;
        assert!(
            matches!(read_bad(&flipped), IndexFileError::Checksum { .. }),
            "flip at {at}"
        );
    }
    assert!(matches!(
        read_bad(
            b"\x93NUMPY not an index at all......................................................"
        ),
        IndexFileError::Foreign { .. }
    ));
    let mut reserved = bytes.clone();
    reserved[21] = 1;
    let e = read_bad(&reserved);
    assert!(
        matches!(
            e,
            IndexFileError::Invalid {
                field: "reserved header bytes",
                ..
            }
        ),
        "{e}"
    );
    let mut version = bytes.clone();
    version[8] = 9;
    assert!(matches!(
        read_bad(&version),
        IndexFileError::Version { found: 9, .. }
    ));
    // A header lying about its sizes: huge nlist is refused before allocation.
    let mut huge = bytes.clone();
    huge[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = read_bad(&huge);
    assert!(
        matches!(
            e,
            IndexFileError::Invalid { .. } | IndexFileError::Truncated { .. }
        ),
        "{e}"
    );
    huge[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = read_bad(&huge);
    assert!(matches!(e, IndexFileError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("bad.ivf"), "{e}");
    // Counts whose products wrap a u64 (dim 2^62 × 4, nlist 2^61 × 8): read
    // as the sizes they are, not as wrapped small ones (was a panic: an
    // overflow in debug builds, a 2^64-byte allocation in release).
    for (dim, n, nlist) in [
        (1u64 << 62, 1u64 << 61, 1u64 << 61),
        (1 << 62, 1 << 62, 4),
        (3, 1 << 61, 1 << 61),
    ] {
        let mut crafted = bytes[..56].to_vec();
        crafted[24..32].copy_from_slice(&dim.to_le_bytes());
        crafted[32..40].copy_from_slice(&n.to_le_bytes());
        crafted[40..48].copy_from_slice(&nlist.to_le_bytes());
        crafted[19] = 1; // veclen 1 fits any dim
        crafted.extend([0u8; 32]);
        let e = read_bad(&crafted);
        assert!(
            matches!(e, IndexFileError::Truncated { .. }),
            "dim {dim}, nlist {nlist}: {e}"
        );
    }
}

/// The writer never replaces what is not a regular file (a directory, a
/// device: `--out /dev/null` replaced the device node with a file) and
/// leaves no temporary file behind when it fails or succeeds.
#[test]
fn index_files_are_written_only_over_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = synthetic(100, 8, 1, DType::F32, 3);
    let index = build(&base, 4, "l2".parse().unwrap(), 1);
    let sub = dir.path().join("sub.ivf");
    std::fs::create_dir(&sub).unwrap();
    let e = write_index(&sub, &index).unwrap_err();
    assert!(matches!(e, IndexFileError::NotAFile { .. }), "{e}");
    assert!(e.to_string().contains("sub.ivf"), "{e}");
    #[cfg(unix)]
    {
        let e = write_index("/dev/null", &index).unwrap_err();
        assert!(matches!(e, IndexFileError::NotAFile { .. }), "{e}");
        use std::os::unix::fs::FileTypeExt;
        let null = std::fs::metadata("/dev/null").unwrap().file_type();
        assert!(null.is_char_device(), "/dev/null is still the device");
    }
    // Over a regular file, twice: the second replaces the first.
    let out = dir.path().join("a.ivf");
    std::fs::write(&out, b"old").unwrap();
    write_index(&out, &index).unwrap();
    write_index(&out, &index).unwrap();
    assert_eq!(read_index(&out).unwrap(), index);
    // A write that fails (no such directory) leaves nothing either.
    assert!(write_index(dir.path().join("none/x.ivf"), &index).is_err());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        {
            let mut n = names.clone();
            n.sort();
            n
        },
        ["a.ivf", "sub.ivf"],
        "no temporary file is left: {names:?}"
    );
}

#[test]
fn bad_parameters_are_typed_errors() {
    let (base, queries) = synthetic(300, 8, 3, DType::F32, 1);
    let spec = MetricSpec::plain(Metric::L2);
    assert!(build_index(&base, &IvfBuildParams::new(0, spec)).is_err());
    assert!(build_index(&base, &IvfBuildParams::new(301, spec)).is_err());
    let mut p = IvfBuildParams::new(4, spec);
    p.veclen = Some(3);
    assert!(build_index(&base, &p).is_err());
    let index = build(&base, 4, spec, 0);
    assert!(search_ivf(&index, &queries, &IvfSearchParams::new(0, 1)).is_err());
    assert!(search_ivf(&index, &queries, &IvfSearchParams::new(1, 0)).is_err());
    let (_, q16) = synthetic(10, 8, 3, DType::F16, 1);
    assert!(search_ivf(&index, &q16, &IvfSearchParams::new(1, 1)).is_err());
    let (_, q9) = synthetic(10, 9, 3, DType::F32, 1);
    assert!(search_ivf(&index, &q9, &IvfSearchParams::new(1, 1)).is_err());
    let f = Filter::Bitset(Bitset::all(10));
    assert!(search_ivf(&index, &queries, &IvfSearchParams::new(1, 1).with_filter(f)).is_err());
}
