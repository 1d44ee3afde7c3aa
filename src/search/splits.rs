//! Block splits: a search of few queries still fills the GPU.
//!
//! The brute-force scan (fragments/scan.cuh) and the IVF list scan
//! (fragments/ivf_scan.cuh) run one block per query, so a batch of fewer
//! queries than the GPU has SMs leaves most of it idle: one query over a
//! million rows, or at `nprobe` 16, would use 1 of an H100's 132 SMs. With a
//! grid `splits` high, block `(x, y)` takes only the `y`-th of `splits`
//! interleaved parts of its query's work (every `splits`-th 128-row tile
//! for the scan, every `splits`-th probe for IVF, from the `y`-th) and
//! writes that part's best `k`; the host then merges each query's `splits`
//! sorted lists ([`merge_splits`]). A row of the query's best `k` is among
//! the best `k` of its part, so the merge of the parts' best is the best
//! over all of them, in the kernel's key order: the results are those of
//! one block per query, bit for bit.

use std::cmp::{Ordering, Reverse};
use std::collections::binary_heap::{BinaryHeap, PeekMut};

use rayon::prelude::*;

/// The variable that fixes the IVF scan's probe splits.
pub const IVF_SPLITS_VAR: &str = "FRAGLINK_IVF_SPLITS";
/// The variable that fixes the brute-force scan's row splits.
pub const SCAN_SPLITS_VAR: &str = "FRAGLINK_SCAN_SPLITS";

/// The most splits (grid.y's limit).
pub const MAX_SPLITS: usize = 65_535;

/// What a splits variable takes.
pub const SPLITS_EXPECTED: &str = "`auto` or a whole number from 1 to 65535";

/// A splits variable's value (a benchmark comparing splits with one block
/// per query sets one): unset, empty or `auto`: `Ok(None)`, [`splits`]
/// decides; a whole number from 1 to [`MAX_SPLITS`]: `Ok(Some(n))`, that
/// many whatever the batch (1: one block per query), within
/// [`fixed_splits`]' bounds; anything else: `Err(`[`SPLITS_EXPECTED`]`)`.
pub fn parse_splits(value: &str) -> Result<Option<usize>, &'static str> {
    match value.trim() {
        "" | "auto" => Ok(None),
        v => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_SPLITS).contains(&n) => Ok(Some(n)),
            _ => Err(SPLITS_EXPECTED),
        },
    }
}

/// The splits `variable` fixes: `Ok(None)` where it is unset or automatic,
/// `Err(value)` where it holds something [`parse_splits`] refuses.
/// A value that is not Unicode is refused too (lossily shown), not taken
/// for unset.
pub fn splits_from_env(variable: &str) -> Result<Option<usize>, String> {
    match crate::switch::env_value(variable) {
        None => Ok(None),
        Some(value) => parse_splits(&value).map_err(|_| value),
    }
}

/// Entries one query's merge may sort at most ([`splits`]): with a large
/// k, more splits would move the work from the GPU to the host.
pub const MAX_MERGE_ENTRIES: usize = 1 << 15;

/// A fixed count `n` as launched: at most one split per part (`parts`:
/// probes; rows) and at most `MAX_MERGE_ENTRIES / k`, as [`splits`] keeps
/// them, so a host merge stays bounded whatever the variable says.
pub fn fixed_splits(n: usize, parts: usize, k: usize) -> usize {
    n.min(parts).min(MAX_MERGE_ENTRIES / k.max(1)).max(1)
}

/// Blocks [`splits`] aims at on a GPU of `sm_count` SMs where the kernel's
/// residency is not asked: two per SM.
pub fn two_per_sm(sm_count: u32) -> usize {
    2 * sm_count.max(1) as usize
}

/// Splits for `nq` queries whose work divides into at most `parts` parts
/// (probes; row groups), with `k` results, for a grid of about `wave`
/// blocks (what the device holds at once, or [`two_per_sm`]):
/// `⌈wave / nq⌉`, at most `parts`, and at most `MAX_MERGE_ENTRIES / k`
/// (the host merges `splits · k` entries per query); 1 (one block per
/// query) once the queries alone make the wave. Never more than
/// [`MAX_SPLITS`].
pub fn splits(nq: usize, parts: usize, k: usize, wave: usize) -> usize {
    let wave = wave.max(1);
    if nq == 0 || nq >= wave {
        return 1;
    }
    wave.div_ceil(nq)
        .min(parts)
        .min(MAX_MERGE_ENTRIES / k.max(1))
        .clamp(1, MAX_SPLITS)
}

/// The kernel's key order (scan.cuh's `key_less`): by distance — ascending,
/// or descending for a similarity (`order = desc`) — then by id as unsigned,
/// so padding (id -1) goes after every row; -0 and +0 are one distance. The
/// kernel writes no NaN; should one come (a buffer a refused launch left
/// unwritten), it sorts after every number, so the order stays total.
pub(crate) fn key_order(ascending: bool) -> impl Fn(&(f32, i64), &(f32, i64)) -> Ordering {
    move |a, b| order_key(a.0, a.1, ascending).cmp(&order_key(b.0, b.1, ascending))
}

/// [`key_order`]'s key as one integer: the distance's rank (its
/// bits made to order as the numbers do, -0 as +0, reversed for a
/// descending order, NaN after every number either way) above the id as
/// unsigned.
fn order_key(distance: f32, id: i64, ascending: bool) -> u128 {
    // The sign bit set, the other bits flipped for a negative number, so
    // the bits order as the numbers.
    let bits = distance.to_bits();
    let bits = if bits << 1 == 0 { 0 } else { bits };
    let up = bits ^ ((((bits as i32) >> 31) as u32) | 1 << 31);
    let rank = if ascending { up } else { !up };
    // No number reaches u32::MAX (that would be a NaN's bits).
    let rank = if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        u32::MAX
    } else {
        rank
    };
    (u128::from(rank) << 64) | u128::from(id as u64)
}

/// Each query's best `k` of its `splits` lists of `k` (ids and distances
/// `nq × splits × k`, query-major, as the kernel writes them): `nq × k`
/// each, in the kernel's key order (distance, then id as unsigned).
///
/// The kernels write each list sorted in that order, so the lists' heads
/// are merged (`merge_query`); batches of many entries spread their
/// queries over the cores. Sorting all `splits · k` entries of a query
/// instead took 270 µs for one query of 264 splits at k 10, 3.1 ms at
/// k 100, and 1.5 ms for 100 queries of 3 splits at k 100 (2-core VM,
/// release): as long as the scan kernel itself, or longer.
pub fn merge_splits(
    ids: &[i64],
    dists: &[f32],
    nq: usize,
    splits: usize,
    k: usize,
    ascending: bool,
) -> (Vec<i64>, Vec<f32>) {
    debug_assert_eq!(ids.len(), nq * splits * k);
    debug_assert_eq!(dists.len(), ids.len());
    // Padding, as a kernel pads: what a query without lists gets.
    let pad = if ascending {
        f32::INFINITY
    } else {
        f32::NEG_INFINITY
    };
    let mut out_ids = vec![-1; nq * k];
    let mut out_dists = vec![pad; nq * k];
    if splits == 0 || k == 0 {
        return (out_ids, out_dists);
    }
    let per_query = splits * k;
    let one = |(q, (o_ids, o_dists)): (usize, (&mut [i64], &mut [f32]))| {
        let span = q * per_query..(q + 1) * per_query;
        merge_query(
            &ids[span.clone()],
            &dists[span],
            k,
            ascending,
            o_ids,
            o_dists,
        );
    };
    if nq > 1 && ids.len() >= PARALLEL_ENTRIES {
        out_ids
            .par_chunks_mut(k)
            .zip(out_dists.par_chunks_mut(k))
            .enumerate()
            .for_each(one);
    } else {
        out_ids
            .chunks_mut(k)
            .zip(out_dists.chunks_mut(k))
            .enumerate()
            .for_each(one);
    }
    (out_ids, out_dists)
}

/// Entries from which [`merge_splits`] spreads its queries over the cores.
const PARALLEL_ENTRIES: usize = 1 << 14;

/// Lists up to this many are merged by a look at every head, more through
/// a heap.
const LINEAR_HEADS: usize = 8;

/// One query's best `k` of its lists of `k` (`ids` and `dists`
/// hold them one after the other) into `out_ids` and `out_dists`. A query
/// whose lists are not all sorted (checked first, one comparison of
/// neighbours an entry) is selected in full instead, so any input gets the
/// best `k`.
fn merge_query(
    ids: &[i64],
    dists: &[f32],
    k: usize,
    ascending: bool,
    out_ids: &mut [i64],
    out_dists: &mut [f32],
) {
    let key = |at: usize| order_key(dists[at], ids[at], ascending);
    let in_order = |at: usize| {
        let (x, y) = if ascending {
            (dists[at], dists[at + 1])
        } else {
            (dists[at + 1], dists[at])
        };
        if x < y {
            true
        } else if x == y {
            ids[at] as u64 <= ids[at + 1] as u64
        } else if x > y {
            false
        } else {
            key(at) <= key(at + 1) // a NaN
        }
    };
    let lists = ids.len() / k;
    let sorted = (0..lists).all(|l| (l * k..(l + 1) * k - 1).all(in_order));
    let mut emit = {
        let mut n = 0;
        move |at: usize| {
            out_ids[n] = ids[at];
            out_dists[n] = dists[at];
            n += 1;
        }
    };
    if !sorted {
        let mut all: Vec<usize> = (0..ids.len()).collect();
        all.select_nth_unstable_by_key(k - 1, |&at| key(at));
        all.truncate(k);
        all.sort_unstable_by_key(|&at| key(at));
        all.into_iter().for_each(emit);
    } else if lists <= LINEAR_HEADS {
        // Few lists: the least head by a look at each.
        let mut heads: Vec<(u128, usize)> = (0..lists).map(|l| (key(l * k), l * k)).collect();
        for _ in 0..k {
            let Some((slot, &(_, at))) = heads.iter().enumerate().min_by_key(|(_, h)| h.0) else {
                break;
            };
            emit(at);
            if (at + 1) % k != 0 {
                heads[slot] = (key(at + 1), at + 1);
            } else {
                heads.swap_remove(slot);
            }
        }
    } else {
        let mut heads: BinaryHeap<Reverse<(u128, usize)>> =
            (0..lists).map(|l| Reverse((key(l * k), l * k))).collect();
        for _ in 0..k {
            let Some(mut top) = heads.peek_mut() else {
                break;
            };
            let at = top.0 .1;
            emit(at);
            if (at + 1) % k != 0 {
                // The list's next entry takes its head's place: one sift
                // where a pop and a push would take two.
                *top = Reverse((key(at + 1), at + 1));
            } else {
                PeekMut::pop(top);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run by [`splits_variables_that_are_not_unicode_are_refused`] with
    /// the variables set: prints what [`splits_from_env`] makes of them.
    #[test]
    #[ignore = "a child of splits_variables_that_are_not_unicode_are_refused"]
    fn splits_env_child() {
        println!(
            "outcome: {:?} {:?}",
            splits_from_env(SCAN_SPLITS_VAR),
            splits_from_env(IVF_SPLITS_VAR)
        );
    }

    /// A value that is not Unicode was taken for unset (automatic splits);
    /// it is refused like any other value the variable does not take. The
    /// test binary runs [`splits_env_child`] with both variables set, not
    /// this process's environment (other tests read it).
    #[cfg(unix)]
    #[test]
    fn splits_variables_that_are_not_unicode_are_refused() {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"4\xff");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["search::splits::tests::splits_env_child", "--exact"])
            .args(["--ignored", "--nocapture", "--test-threads=1"])
            .env(SCAN_SPLITS_VAR, bad)
            .env(IVF_SPLITS_VAR, bad)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let refused = format!("{:?}", Err::<Option<usize>, _>("4\u{fffd}".to_string()));
        assert!(
            stdout.contains(&format!("outcome: {refused} {refused}")),
            "{stdout}"
        );
    }

    /// The key order spelled out comparison by comparison, independent of
    /// `order_key`: the oracle the merge and `key_order` are checked against.
    fn reference_order(ascending: bool) -> impl Fn(&(f32, i64), &(f32, i64)) -> Ordering {
        move |a, b| {
            let by_id = (a.1 as u64).cmp(&(b.1 as u64));
            let (a_nan, b_nan) = (a.0.is_nan(), b.0.is_nan());
            if a_nan || b_nan {
                return a_nan.cmp(&b_nan).then(by_id);
            }
            let by_distance = if ascending {
                a.0.partial_cmp(&b.0)
            } else {
                b.0.partial_cmp(&a.0)
            };
            by_distance.unwrap_or(Ordering::Equal).then(by_id)
        }
    }

    /// `key_order` (through `order_key`) is the reference order over every
    /// pair of distances that matter (±0, ±inf, NaN, ties) and ids (padding).
    #[test]
    fn key_order_is_the_reference_order() {
        let d = [
            -0.0f32,
            0.0,
            1.0,
            -1.0,
            2.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MAX,
        ];
        let ids = [-1i64, 0, 1, 7, i64::MAX];
        let all: Vec<(f32, i64)> = d
            .iter()
            .flat_map(|&x| ids.iter().map(move |&i| (x, i)))
            .collect();
        for up in [true, false] {
            let (got, want) = (key_order(up), reference_order(up));
            for a in &all {
                for b in &all {
                    assert_eq!(got(a, b), want(a, b), "{a:?} {b:?} ascending {up}");
                }
            }
        }
    }

    #[test]
    fn the_variable_takes_auto_or_a_count() {
        assert_eq!(parse_splits(""), Ok(None));
        assert_eq!(parse_splits(" auto "), Ok(None));
        assert_eq!(parse_splits("1"), Ok(Some(1)));
        assert_eq!(parse_splits("65535"), Ok(Some(65_535)));
        for bad in ["0", "65536", "-1", "two", "1.5", "AUTO"] {
            let e = parse_splits(bad).unwrap_err();
            assert!(e.contains("65535"), "{bad}: {e}");
        }
    }

    #[test]
    fn splits_fill_the_gpu_and_stop_at_the_probes() {
        // H100: 132 SMs, 264 blocks wanted.
        let h100 = two_per_sm(132);
        assert_eq!(h100, 264);
        assert_eq!(splits(1, 16, 10, h100), 16);
        assert_eq!(splits(1, 1000, 10, h100), 264);
        assert_eq!(splits(100, 16, 10, h100), 3);
        assert_eq!(splits(263, 16, 10, h100), 2);
        assert_eq!(splits(264, 16, 10, h100), 1);
        assert_eq!(splits(10_000, 16, 10, h100), 1);
        assert_eq!(splits(1, 1, 10, h100), 1);
        assert_eq!(splits(0, 16, 10, h100), 1);
        assert_eq!(splits(1, 16, 10, two_per_sm(0)), 2);
        assert_eq!(splits(1, 16, 10, 0), 1);
        // A wave of 5 blocks per SM.
        assert_eq!(splits(1, 1953, 10, 660), 660);
        assert_eq!(splits(300, 1953, 10, 660), 3);
        assert_eq!(splits(660, 1953, 10, 660), 1);
        // A large k keeps the host's merge to 32768 entries per query.
        assert_eq!(splits(1, 1000, 2048, h100), 16);
        assert_eq!(splits(1, 1000, 1000, h100), 32);
        assert_eq!(splits(1, 1000, 40_000, h100), 1);
        // A fixed count: within the parts and the merge bound, at least 1.
        assert_eq!(fixed_splits(7, 16, 10), 7);
        assert_eq!(fixed_splits(65_535, 16, 10), 16);
        assert_eq!(fixed_splits(65_535, 1_000_000, 256), 128);
        assert_eq!(fixed_splits(7, 0, 10), 1);
        assert_eq!(fixed_splits(7, 16, 40_000), 1);
    }

    #[test]
    fn a_nan_sorts_last_and_the_order_stays_total() {
        let ids = [1, 2, 3, 4];
        let dists = [f32::NAN, 1.0, f32::NAN, f32::INFINITY];
        for ascending in [true, false] {
            let (got, _) = merge_splits(&ids, &dists, 1, 1, 4, ascending);
            let want = if ascending {
                [2, 4, 1, 3]
            } else {
                [4, 2, 1, 3]
            };
            assert_eq!(got, want);
        }
    }

    /// Two queries, 3 splits of k = 3 each, against the best 3 of all rows.
    #[test]
    fn the_merge_is_the_best_k_in_key_order() {
        let pad = (f32::INFINITY, -1i64);
        #[rustfmt::skip]
        let lists: [[(f32, i64); 3]; 6] = [
            // query 0: a tie at 1.0 goes to the smaller id; -0 equals +0.
            [(0.0, 9), (1.0, 7), (5.0, 1)],
            [(-0.0, 4), (1.0, 2), pad],
            [pad, pad, pad],
            // query 1: fewer rows than k, one of them +inf (a NaN row).
            [(f32::INFINITY, 3), pad, pad],
            [(2.0, 8), pad, pad],
            [pad, pad, pad],
        ];
        let (ids, dists): (Vec<i64>, Vec<f32>) =
            lists.iter().flatten().map(|&(d, i)| (i, d)).unzip();
        let (got_ids, got_d) = merge_splits(&ids, &dists, 2, 3, 3, true);
        assert_eq!(got_ids, [4, 9, 2, 8, 3, -1]);
        let bits: Vec<u32> = got_d.iter().map(|d| d.to_bits()).collect();
        let want: Vec<u32> = [-0.0f32, 0.0, 1.0, 2.0, f32::INFINITY, f32::INFINITY]
            .iter()
            .map(|d| d.to_bits())
            .collect();
        assert_eq!(bits, want);
    }

    /// The merge of the heads against a sort of every entry, over sorted
    /// lists with ties, -0 and +0, infinities, NaN and padding, both orders,
    /// and over lists left unsorted.
    #[test]
    fn the_merge_equals_a_full_sort() {
        fn by_sort(
            ids: &[i64],
            d: &[f32],
            nq: usize,
            s: usize,
            k: usize,
            up: bool,
        ) -> Vec<(u32, i64)> {
            let order = reference_order(up);
            let mut out = Vec::new();
            for q in 0..nq {
                let span = q * s * k..(q + 1) * s * k;
                let mut keys: Vec<(f32, i64)> = d[span.clone()]
                    .iter()
                    .copied()
                    .zip(ids[span].iter().copied())
                    .collect();
                keys.sort_by(&order);
                out.extend(keys[..k].iter().map(|&(d, i)| (d.to_bits(), i)));
            }
            out
        }
        let values = [
            -0.0f32,
            0.0,
            1.0,
            1.0,
            -2.5,
            3.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            7.0,
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for round in 0..400 {
            let (nq, splits, k) = (
                1 + next(3) as usize,
                1 + next(9) as usize,
                1 + next(6) as usize,
            );
            let up = round % 2 == 0;
            let mut ids = Vec::new();
            let mut d = Vec::new();
            for _ in 0..nq * splits {
                let mut list: Vec<(f32, i64)> = (0..k)
                    .map(|_| match next(5) {
                        0 => (if up { f32::INFINITY } else { f32::NEG_INFINITY }, -1),
                        _ => (values[next(values.len() as u64) as usize], next(40) as i64),
                    })
                    .collect();
                if round % 7 != 3 {
                    list.sort_by(reference_order(up));
                }
                for (dist, id) in list {
                    d.push(dist);
                    ids.push(id);
                }
            }
            let (got_ids, got_d) = merge_splits(&ids, &d, nq, splits, k, up);
            let got: Vec<(u32, i64)> = got_d.iter().map(|d| d.to_bits()).zip(got_ids).collect();
            let want = by_sort(&ids, &d, nq, splits, k, up);
            // Equal keys (ties in distance and id, NaN payloads aside) may
            // come in either order; compare the keys' ranks.
            let rank = |v: &[(u32, i64)]| -> Vec<u128> {
                v.iter()
                    .map(|&(b, i)| order_key(f32::from_bits(b), i, up))
                    .collect()
            };
            assert_eq!(
                rank(&got),
                rank(&want),
                "round {round}: nq {nq} splits {splits} k {k}"
            );
        }
    }

    #[test]
    fn no_split_is_all_padding() {
        assert_eq!(
            merge_splits(&[], &[], 2, 0, 1, true),
            (vec![-1, -1], vec![f32::INFINITY; 2])
        );
        assert_eq!(
            merge_splits(&[], &[], 1, 0, 1, false).1,
            [f32::NEG_INFINITY]
        );
        assert_eq!(merge_splits(&[], &[], 1, 1, 0, true).0, Vec::<i64>::new());
    }

    /// Descending (a similarity): larger first, ties to the smaller id,
    /// padding (-inf, -1) last.
    #[test]
    fn a_descending_merge_puts_the_largest_first() {
        let ids = [5, 1, -1, 3, 2, 0];
        let dists = [4.0, 1.0, f32::NEG_INFINITY, 4.0, 2.0, -1.0];
        let (got_ids, got_d) = merge_splits(&ids, &dists, 1, 2, 3, false);
        assert_eq!(got_ids, [3, 5, 2]);
        assert_eq!(got_d, [4.0, 4.0, 2.0]);
        let (got_ids, _) = merge_splits(&ids, &dists, 1, 2, 3, true);
        assert_eq!(got_ids, [-1, 0, 1]);
    }
}
