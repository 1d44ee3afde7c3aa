//! The CPU search's float kernels (GEMM, fused AVX2, fused AVX-512; run-time
//! detection) against the scalar reference, bit for bit, on inputs that
//! stress the fast paths: many row blocks per task, several tasks, and data
//! whose error margins are wide compared with the gaps between distances.

use fraglink::search::cpu::{search_cpu_with, CpuKernel};
use fraglink::search::data::synthetic;
use fraglink::search::{search_reference, DType, Metric, SearchParams, Vectors};

/// The kernels this CPU runs (the GEMM one always; the fused ones where the
/// CPU has the instructions).
fn kernels() -> Vec<CpuKernel> {
    let k: Vec<CpuKernel> = CpuKernel::ALL
        .into_iter()
        .filter(|k| k.available())
        .collect();
    eprintln!("kernels on this CPU: {k:?}");
    k
}

fn assert_all_kernels(base: &Vectors, queries: &Vectors, p: &SearchParams) {
    let want = search_reference(base, queries, p).unwrap();
    for kernel in kernels() {
        let got = search_cpu_with(base, queries, p, kernel).unwrap();
        assert!(
            got.bitwise_eq(&want),
            "{kernel} {} {} k={}: differs from the reference at {:?}",
            base.dtype(),
            p.metric,
            p.k,
            got.first_difference(&want)
        );
    }
}

#[test]
fn many_blocks_per_task_match_the_reference() {
    // dim 128: blocks of 510 rows, so the tasks' row shards (4 of ~525 rows
    // with 2 threads) span several blocks and end with a partial tile; 130
    // queries leave a partial panel with 16 and with 64 lanes.
    let ten = &[10][..];
    for (dtype, ks) in [
        (DType::F32, &[1, 100][..]),
        (DType::F16, ten),
        (DType::I8, ten),
        (DType::U8, ten),
    ] {
        let (base, queries) = synthetic(2101, 128, 130, dtype, 5);
        for metric in Metric::ALL {
            for &k in ks {
                assert_all_kernels(&base, &queries, &SearchParams::new(k, metric));
            }
        }
    }
}

#[test]
fn wide_margins_and_near_ties_match_the_reference() {
    // Every vector is a large common offset plus tiny noise: |q||x| is about
    // 10⁴ times the distances, so the error margins cover many rows and the
    // candidate lists overflow and are compacted with exact distances.
    let (dim, n, nq) = (24, 3000, 37);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-2
    };
    let mut gen = |rows: usize| -> Vec<f32> {
        (0..rows * dim)
            .map(|i| 100.0 + (i % dim) as f32 + noise())
            .collect()
    };
    let base = Vectors::f32(gen(n), dim).unwrap();
    let queries = Vectors::f32(gen(nq), dim).unwrap();
    for metric in Metric::ALL {
        for k in [1, 16] {
            assert_all_kernels(&base, &queries, &SearchParams::new(k, metric));
        }
    }
}

#[test]
fn integer_extremes_and_offsets_match_the_reference() {
    // u8 rows near 255 and i8 rows at ±127/−128 with small variations: the
    // largest squared norms the types allow, and (u8) a large common offset,
    // through the fused kernels' float path and the exact GEMM path alike.
    let (dim, n, nq) = (40, 1500, 21);
    let pick = |i: usize| (i * 2_654_435_761usize) >> 7;
    let u8s = |rows: usize, salt: usize| -> Vec<u8> {
        (0..rows * dim)
            .map(|i| 250 + (pick(i + salt) % 6) as u8)
            .collect()
    };
    let i8s = |rows: usize, salt: usize| -> Vec<i8> {
        (0..rows * dim)
            .map(|i| match pick(i + salt) % 3 {
                0 => -128,
                1 => 127,
                _ => (pick(i + salt) % 7) as i8 - 3,
            })
            .collect()
    };
    let sets = [
        (
            Vectors::u8(u8s(n, 0), dim).unwrap(),
            Vectors::u8(u8s(nq, 99), dim).unwrap(),
        ),
        (
            Vectors::i8(i8s(n, 0), dim).unwrap(),
            Vectors::i8(i8s(nq, 99), dim).unwrap(),
        ),
    ];
    for (base, queries) in &sets {
        for metric in Metric::ALL {
            for k in [1, 12] {
                assert_all_kernels(base, queries, &SearchParams::new(k, metric));
            }
        }
    }
}

#[test]
fn byte_kernels_match_the_reference_at_their_dim_limits() {
    // The exact VNNI kernel (i8/u8, dims a multiple of 4 up to 33024) keeps
    // every sum in 32 bits: at 33024 the extreme values put u8 dot products
    // and squared distances near 2³¹ (their qq + xx near 2³²), i8 ones near 2²⁹. 33028 is past
    // the limit (the float path then), 4 the smallest dim it takes, 6 one it
    // does not; zero vectors are special for cosine. Filters leave rows out.
    let pick = |i: usize| (i * 2_654_435_761usize) >> 9;
    for dim in [4, 6, 36, 33_024, 33_028] {
        let (n, nq) = if dim > 1000 { (23, 5) } else { (997, 70) };
        let u8s = |rows: usize, salt: usize| -> Vec<u8> {
            (0..rows * dim)
                .map(|i| match (i / dim + salt) % 5 {
                    0 => 255,
                    1 => 0,
                    2 if (i / dim) % 7 == 3 => 0, // some zero vectors
                    _ => [0, 1, 254, 255][pick(i + salt) % 4],
                })
                .collect()
        };
        let i8s = |rows: usize, salt: usize| -> Vec<i8> {
            (0..rows * dim)
                .map(|i| match (i / dim + salt) % 5 {
                    0 => -128,
                    1 => 127,
                    2 if (i / dim) % 7 == 3 => 0,
                    _ => [-128, -1, 0, 127][pick(i + salt) % 4],
                })
                .collect()
        };
        // Also one query alone (the VNNI kernel's single-query path); the
        // salts pick one with extreme values.
        let sets = [
            (
                Vectors::u8(u8s(n, 0), dim).unwrap(),
                Vectors::u8(u8s(nq, 2), dim).unwrap(),
            ),
            (
                Vectors::i8(i8s(n, 0), dim).unwrap(),
                Vectors::i8(i8s(nq, 2), dim).unwrap(),
            ),
            (
                Vectors::u8(u8s(n, 0), dim).unwrap(),
                Vectors::u8(u8s(1, 3), dim).unwrap(),
            ),
            (
                Vectors::i8(i8s(n, 0), dim).unwrap(),
                Vectors::i8(i8s(1, 4), dim).unwrap(),
            ),
        ];
        // i8 takes dims up to 33025 (its exact range), u8 up to 66051.
        for (base, queries) in sets
            .iter()
            .filter(|(b, _)| b.dtype() == DType::U8 || dim <= 33_025)
        {
            for metric in Metric::ALL {
                for k in [1, 10] {
                    let p = SearchParams::new(k, metric);
                    assert_all_kernels(base, queries, &p);
                    let bits = fraglink::search::Bitset::random(n, 0.4, 3);
                    assert_all_kernels(
                        base,
                        queries,
                        &p.with_filter(fraglink::search::Filter::Bitset(bits)),
                    );
                }
            }
        }
    }
}

#[test]
fn narrow_byte_panels_over_many_blocks_match_the_reference() {
    // Fewer than 48 queries per task (the VNNI kernel's 16-query panels) over
    // 5000 rows of dim 128: blocks of 2040 rows and, with several threads,
    // several shards. Zero rows and a zero query are special for cosine.
    let (n, nq, dim) = (5000, 20, 128);
    let mut rng = fraglink::search::data::Rng::new(0x2545_f491_4f6c_dd1d);
    let mut next = move || rng.next_u32();
    let mut bytes = |rows: usize, zero: &[usize]| -> Vec<u8> {
        (0..rows * dim)
            .map(|i| {
                if zero.contains(&(i / dim)) {
                    0
                } else {
                    next() as u8
                }
            })
            .collect()
    };
    let (rows, qs) = (bytes(n, &[17, 2040, 4999]), bytes(nq, &[3]));
    let as_i8 = |v: &[u8]| v.iter().map(|&b| b as i8).collect::<Vec<i8>>();
    // u8 zero is 0; i8 zero vectors need 0 too, which the byte 0 is.
    let sets = [
        (
            Vectors::u8(rows.clone(), dim).unwrap(),
            Vectors::u8(qs.clone(), dim).unwrap(),
        ),
        (
            Vectors::i8(as_i8(&rows), dim).unwrap(),
            Vectors::i8(as_i8(&qs), dim).unwrap(),
        ),
    ];
    for (base, queries) in &sets {
        for metric in Metric::ALL {
            for k in [1, 10, 3000] {
                assert_all_kernels(base, queries, &SearchParams::new(k, metric));
            }
        }
    }
}
