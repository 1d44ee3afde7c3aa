//! Rows the tensor-core bounds do not cover ("special": a non-finite
//! element, a squared norm above 2¹⁰⁰, and for cosine one below 2⁻⁶⁰; the
//! CPU path's rule, [`super::norms`]) no longer send every search of their
//! index to the scan. The CPU path already treats them apart (it evaluates
//! them exactly for every query); the GPU path now does the same:
//!
//! - the candidate kernel skips them through a bitset filter (its
//!   `filter_bitset` variant; `SpecialRows::tensor_filter`: the search's
//!   filter less the rows special for its metric), checked before a row's
//!   bounds are computed, so no bound it cannot trust enters a candidate
//!   list or lowers a threshold;
//! - the exact scan covers them alone, over a device copy of just those rows
//!   the index makes at upload, with a filter over that copy
//!   (`SpecialRows::local_filter`) and `k` no larger than the rows it
//!   allows;
//! - each query's two lists merge in the kernels' key order (`merge`).
//!
//! Queries the bounds do not cover (the same rules) go apart the same way:
//! the scan (or the select) answers them over every row, the tensor-core
//! path the others (`split_queries`, `join_queries`), where before one
//! such query sent the whole batch to the scan.
//!
//! Exact, because every row is in exactly one of the two searches and each
//! returns its exact best (distance, id) keys: the best `k` of all rows are
//! the best `k` of the union. A handful of NaN rows or (for cosine) zero
//! vectors in a million thus cost one small scan beside the tensor-core
//! path, where before they sent every search to the scan.
//! Rows beyond what the index copies aside ([`MAX_SPECIAL_BYTES`]) keep the
//! old rule: the scan (or beyond its k the select) serves the searches they
//! are special for.

use rayon::prelude::*;

use crate::search::splits::key_order;
use crate::search::{Bitset, Filter, Metric, Neighbors};

use super::norms::Norms;

/// The most bytes of special rows an index copies aside for the scan (64
/// MiB: 131 072 rows of 128 f32). Where the rows special for a metric take
/// more, searches by that metric leave the tensor-core path for the scan or
/// the select.
pub const MAX_SPECIAL_BYTES: usize = 64 << 20;

/// Rows of an index that are special for some metric, ascending: all of
/// them, or ([`Self::copyable`]) those an index copies aside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SpecialRows {
    ids: Vec<u32>,
    /// Per entry of `ids`: special for every metric (non-finite, huge), else
    /// for cosine only (a norm below 2⁻³⁰).
    every: Vec<bool>,
    /// How many entries are special for every metric.
    n_every: usize,
}

impl SpecialRows {
    /// The special rows of vectors whose norms are `norms` (integer vectors
    /// have none). Row indices fit u32: the tensor-core path takes no more
    /// rows than that, and the index computes these only for such bases.
    pub(crate) fn of(norms: &Norms) -> Self {
        let mut s = SpecialRows::default();
        for i in 0..norms.len() {
            if norms.is_special(i, Metric::Cosine) {
                let every = norms.is_special(i, Metric::L2);
                s.ids.push(i as u32);
                s.every.push(every);
                s.n_every += usize::from(every);
            }
        }
        s
    }

    /// Every row here, ascending.
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Rows special for every metric (their f16 copies are never read).
    pub(crate) fn every_metric(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids
            .iter()
            .zip(&self.every)
            .filter(|(_, &e)| e)
            .map(|(&r, _)| r)
    }

    fn special_for(&self, i: usize, metric: Metric) -> bool {
        self.every[i] || metric == Metric::Cosine
    }

    /// How many rows here are special for `metric`.
    pub(crate) fn count(&self, metric: Metric) -> usize {
        match metric {
            Metric::Cosine => self.ids.len(),
            _ => self.n_every,
        }
    }

    /// The rows an index copies aside for rows of `row_bytes`: all of them
    /// where they fit [`MAX_SPECIAL_BYTES`], else those special for every
    /// metric where those fit (cosine searches then leave the path), else
    /// none. Either keeps the ascending order, so the scan over the copy
    /// breaks ties as the CPU path does.
    pub(crate) fn copyable(&self, row_bytes: usize) -> Self {
        let fits = |rows: usize| rows.saturating_mul(row_bytes) <= MAX_SPECIAL_BYTES;
        if fits(self.ids.len()) {
            return self.clone();
        }
        if !fits(self.n_every) {
            return SpecialRows::default();
        }
        SpecialRows {
            ids: self.every_metric().collect(),
            every: vec![true; self.n_every],
            n_every: self.n_every,
        }
    }

    /// The candidate kernel's filter over `n_rows` rows for a search by
    /// `metric` under `filter`: what `filter` allows, less the rows here
    /// special for `metric`.
    pub(crate) fn tensor_filter(&self, n_rows: usize, metric: Metric, filter: &Filter) -> Bitset {
        let mut bits = match filter {
            Filter::Bitset(b) if b.n_rows == n_rows => b.clone(),
            Filter::None => Bitset::all(n_rows),
            // Another length (the index checks it first): bit by bit.
            Filter::Bitset(_) => Bitset::from_fn(n_rows, |r| filter.allows(r)),
        };
        for (i, &r) in self.ids.iter().enumerate() {
            if self.special_for(i, metric) && (r as usize) < n_rows {
                bits.set(r as usize, false);
            }
        }
        bits
    }

    /// The scan's filter over a copy of these rows (bit `i` for row
    /// `ids()[i]`): special for `metric` and allowed by `filter`; with how
    /// many it allows.
    pub(crate) fn local_filter(&self, metric: Metric, filter: &Filter) -> (Bitset, usize) {
        let bits = Bitset::from_fn(self.ids.len(), |i| {
            self.special_for(i, metric) && filter.allows(self.ids[i] as usize)
        });
        let allowed = bits.count();
        (bits, allowed)
    }
}

/// Each query's best `main.k` of `main` (ids of the index) and `special`
/// (`special.k ≤ main.k` per query, ids indexing `ids`, padding -1), in the
/// kernels' key order: distance, then id as unsigned, padding last. Both
/// lists are sorted in that order (the special one too: `ids` ascend), so
/// a merge of the two heads serves, in parallel over the queries.
pub(crate) fn merge(main: &Neighbors, special: &Neighbors, ids: &[u32]) -> Neighbors {
    let (nq, k) = (main.nq, main.k);
    let order = key_order(true);
    let global = |l: i64| match usize::try_from(l).ok().and_then(|l| ids.get(l)) {
        Some(&r) => i64::from(r),
        None => Neighbors::PAD_ID,
    };
    let mut out_ids = vec![Neighbors::PAD_ID; nq * k];
    let mut out_dists = vec![f32::INFINITY; nq * k];
    out_ids
        .par_chunks_mut(k.max(1))
        .zip(out_dists.par_chunks_mut(k.max(1)))
        .enumerate()
        .for_each(|(q, (o_ids, o_dists))| {
            let a: Vec<(f32, i64)> = main
                .distances_of(q)
                .iter()
                .copied()
                .zip(main.ids_of(q).iter().copied())
                .collect();
            let b: Vec<(f32, i64)> = if q < special.nq {
                special
                    .distances_of(q)
                    .iter()
                    .copied()
                    .zip(special.ids_of(q).iter().map(|&l| global(l)))
                    .collect()
            } else {
                Vec::new()
            };
            let (mut i, mut j) = (0, 0);
            for slot in 0..o_ids.len() {
                let take_a = match (a.get(i), b.get(j)) {
                    (Some(x), Some(y)) => order(x, y).is_le(),
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let (d, id) = if take_a {
                    i += 1;
                    a[i - 1]
                } else {
                    j += 1;
                    b[j - 1]
                };
                o_dists[slot] = d;
                o_ids[slot] = id;
            }
        });
    Neighbors {
        nq,
        k,
        ids: out_ids,
        distances: out_dists,
    }
}

/// The queries `norms` are of, split in (those the bounds cover, those
/// they do not: special for `metric`), each ascending.
pub(crate) fn split_queries(norms: &Norms, metric: Metric) -> (Vec<usize>, Vec<usize>) {
    (0..norms.len()).partition(|&i| !norms.is_special(i, metric))
}

/// The results of queries searched in two parts, back in query order: each
/// part is (the queries it holds, ascending, its results in that order),
/// and together the parts hold queries `0..nq` once each, all with the same
/// `k`. A slot no part fills stays padding.
pub(crate) fn join_queries(parts: [(&[usize], &Neighbors); 2]) -> Neighbors {
    let nq = parts.iter().map(|(q, _)| q.len()).sum::<usize>();
    let k = parts[0].1.k;
    debug_assert!(parts.iter().all(|(q, n)| n.k == k && n.nq == q.len()));
    let mut ids = vec![Neighbors::PAD_ID; nq * k];
    let mut distances = vec![f32::INFINITY; nq * k];
    for (queries, found) in parts {
        for (i, &q) in queries.iter().enumerate().take(found.nq) {
            if q < nq && found.k == k {
                ids[q * k..(q + 1) * k].copy_from_slice(found.ids_of(i));
                distances[q * k..(q + 1) * k].copy_from_slice(found.distances_of(i));
            }
        }
    }
    Neighbors {
        nq,
        k,
        ids,
        distances,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::cpu::search_cpu;
    use crate::search::data::synthetic;
    use crate::search::{DType, SearchParams, Vectors};

    /// f32 rows with a NaN row (3), an infinite one (10), a huge one (20)
    /// and two zero vectors (7, 31): special for every metric, and for
    /// cosine only.
    fn base() -> Vectors {
        let (base, _) = synthetic(40, 8, 1, DType::F32, 5);
        let Vectors::F32(m) = base else {
            unreachable!()
        };
        let mut d = m.data().to_vec();
        d[3 * 8 + 2] = f32::NAN;
        d[10 * 8] = f32::NEG_INFINITY;
        d[20 * 8 + 7] = 3e30;
        d[7 * 8..8 * 8].fill(0.0);
        d[31 * 8..32 * 8].fill(0.0);
        Vectors::f32(d, 8).unwrap()
    }

    fn rows(ids: &[u32]) -> Vec<usize> {
        ids.iter().map(|&r| r as usize).collect()
    }

    #[test]
    fn special_rows_follow_the_bounds_rules_per_metric() {
        let s = SpecialRows::of(&Norms::of(&base()));
        assert_eq!(s.ids(), [3, 7, 10, 20, 31]);
        assert_eq!(s.every_metric().collect::<Vec<_>>(), [3, 10, 20]);
        assert_eq!(s.count(Metric::L2), 3);
        assert_eq!(s.count(Metric::InnerProduct), 3);
        assert_eq!(s.count(Metric::Cosine), 5);
        let (ints, _) = synthetic(40, 8, 1, DType::I8, 5);
        let none = SpecialRows::of(&Norms::of(&ints));
        assert!(none.ids().is_empty());
        assert_eq!(
            none.tensor_filter(40, Metric::Cosine, &Filter::None),
            Bitset::all(40)
        );
    }

    #[test]
    fn the_filters_split_the_rows_between_the_two_searches() {
        let s = SpecialRows::of(&Norms::of(&base()));
        let user = Filter::Bitset(Bitset::from_fn(40, |i| i != 10 && i != 5));
        let t = s.tensor_filter(40, Metric::L2, &user);
        let (local, allowed) = s.local_filter(Metric::L2, &user);
        // L2: 7 and 31 are ordinary rows for the candidate kernel.
        assert_eq!(allowed, 2);
        for (i, &r) in s.ids().iter().enumerate() {
            let r = r as usize;
            assert!(!(t.get(r) && local.get(i)), "row {r} in both searches");
        }
        for r in 0..40 {
            let in_local = s
                .ids()
                .iter()
                .position(|&x| x as usize == r)
                .is_some_and(|i| local.get(i));
            assert_eq!(t.get(r) || in_local, user.allows(r), "row {r}");
        }
        let (_, cosine) = s.local_filter(Metric::Cosine, &Filter::None);
        assert_eq!(cosine, 5);
    }

    /// The composition the GPU index runs, with the CPU path standing in
    /// for both kernels: the best k of the ordinary rows (under the
    /// candidate kernel's filter) merged with the best of the special rows
    /// (over their copy) is the CPU path's answer over all rows, bit for
    /// bit; k beyond the rows allowed included.
    #[test]
    fn merging_the_two_searches_gives_the_whole_answer() {
        let base = base();
        let (_, queries) = synthetic(40, 8, 6, DType::F32, 9);
        let s = SpecialRows::of(&Norms::of(&base));
        let copy = base.gather_rows(&rows(s.ids()));
        let user = Filter::Bitset(Bitset::from_fn(40, |i| i % 9 != 4));
        for metric in Metric::ALL {
            for filter in [Filter::None, user.clone()] {
                for k in [1, 3, 10, 39, 45] {
                    let params = SearchParams::new(k, metric).with_filter(filter.clone());
                    let want = search_cpu(&base, &queries, &params).unwrap();
                    let t = s.tensor_filter(40, metric, &filter);
                    let main = search_cpu(
                        &base,
                        &queries,
                        &SearchParams::new(k, metric).with_filter(Filter::Bitset(t)),
                    )
                    .unwrap();
                    let (local, allowed) = s.local_filter(metric, &filter);
                    let got = if allowed == 0 {
                        main
                    } else {
                        let p = SearchParams::new(k.min(allowed), metric)
                            .with_filter(Filter::Bitset(local));
                        merge(&main, &search_cpu(&copy, &queries, &p).unwrap(), s.ids())
                    };
                    assert!(
                        got.bitwise_eq(&want),
                        "{metric:?} k {k} {filter:?}: first difference at {:?}",
                        got.first_difference(&want)
                    );
                }
            }
        }
    }

    /// Queries split by the bounds' rules, searched apart (the CPU path
    /// standing in for both) and joined: the whole batch's answer.
    #[test]
    fn queries_searched_apart_join_in_order() {
        let base = base();
        let queries = base.gather_rows(&[0, 3, 7, 1, 31, 2]);
        let norms = Norms::of(&queries);
        let (normal, special) = split_queries(&norms, Metric::Cosine);
        assert_eq!(
            (&normal[..], &special[..]),
            (&[0, 3, 5][..], &[1, 2, 4][..])
        );
        let (normal_l2, special_l2) = split_queries(&norms, Metric::L2);
        assert_eq!((normal_l2.len(), special_l2), (5, vec![1]));
        for metric in Metric::ALL {
            let params = SearchParams::new(4, metric);
            let (a, b) = split_queries(&norms, metric);
            let search =
                |qs: &[usize]| search_cpu(&base, &queries.gather_rows(qs), &params).unwrap();
            let got = join_queries([(&a, &search(&a)), (&b, &search(&b))]);
            let want = search_cpu(&base, &queries, &params).unwrap();
            assert!(got.bitwise_eq(&want), "{metric:?}");
        }
    }

    /// The copy: every special row where they fit the byte cap, else the
    /// rows special for every metric, else none; ascending either way.
    #[test]
    fn the_copy_keeps_what_fits_the_cap() {
        let s = SpecialRows::of(&Norms::of(&base()));
        assert_eq!(s.copyable(32), s);
        let every = s.copyable(MAX_SPECIAL_BYTES / 4);
        assert_eq!(every.ids(), [3, 10, 20]);
        assert_eq!(
            (every.count(Metric::L2), every.count(Metric::Cosine)),
            (3, 3)
        );
        assert_eq!(s.copyable(MAX_SPECIAL_BYTES / 2), SpecialRows::default());
        assert_eq!(s.copyable(usize::MAX), SpecialRows::default());
    }

    /// The merge of two sorted lists keeps the key order: ties to the
    /// smaller id across the lists, padding last, a shorter special list.
    #[test]
    fn the_merge_interleaves_sorted_lists_by_key() {
        let pad = Neighbors::PAD_ID;
        let main = Neighbors {
            nq: 2,
            k: 4,
            ids: vec![8, 2, 9, pad, 1, 4, 6, 7],
            distances: vec![0.5, 1.0, 1.0, f32::INFINITY, 0.0, 0.0, 2.0, 3.0],
        };
        let special = Neighbors {
            nq: 2,
            k: 2,
            ids: vec![0, 1, 1, pad],
            distances: vec![1.0, f32::INFINITY, -0.0, f32::INFINITY],
        };
        let got = merge(&main, &special, &[5, 30]);
        assert_eq!(got.ids, [8, 2, 5, 9, 1, 4, 30, 6]);
        assert_eq!(got.distances[..3], [0.5, 1.0, 1.0]);
    }
}
