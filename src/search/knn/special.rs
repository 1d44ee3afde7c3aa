//! Rows the tensor-core bounds do not cover ("special": a non-finite
//! element, a squared norm above 2¹⁰⁰, and for cosine one below 2⁻⁶⁰; the
//! CPU path's rule, [`super::norms`]) no longer send every search of their
//! index to the scan. The CPU path already treats them apart (it evaluates
//! them exactly for every query); the GPU path now does the same:
//!
//! - the candidate kernel skips them, through the bitset filter it already
//!   links ([`SpecialRows::tensor_filter`]: the search's filter less the
//!   rows special for its metric), so no bound it cannot trust enters a
//!   candidate list or lowers a threshold;
//! - the exact scan covers them alone, over a device copy of just those rows
//!   the index makes at upload, with a filter over that copy
//!   ([`SpecialRows::local_filter`]) and `k` no larger than the rows it
//!   allows;
//! - each query's two lists merge in the kernels' key order ([`merge`]).
//!
//! Queries the bounds do not cover (the same rules) go apart the same way:
//! the scan (or the select) answers them over every row, the tensor-core
//! path the others ([`split_queries`], [`join_queries`]), where before one
//! such query sent the whole batch to the scan.
//!
//! Exact, because every row is in exactly one of the two searches and each
//! returns its exact best (distance, id) keys: the best `k` of all rows are
//! the best `k` of the union. A handful of NaN rows or (for cosine) zero
//! vectors in a million thus costs one small scan, not the tensor-core path.
//! More than [`MAX_SPECIAL_ROWS`] such rows keep the old rule: the scan
//! serves the search.

use crate::search::splits::merge_splits;
use crate::search::{Bitset, Filter, Metric, Neighbors};

use super::norms::Norms;

/// The most special rows an index copies aside for the scan (64 Ki rows; at
/// dim 128 in f32, 32 MiB of device memory). Beyond it, searches the rows
/// are special for leave the tensor-core path for the scan.
pub const MAX_SPECIAL_ROWS: usize = 1 << 16;

/// The rows of an index that are special for some metric, ascending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialRows {
    ids: Vec<u32>,
    /// Per entry of `ids`: special for every metric (non-finite, huge), else
    /// for cosine only (a norm below 2⁻³⁰).
    every: Vec<bool>,
}

impl SpecialRows {
    /// The special rows of vectors whose norms are `norms` (integer vectors
    /// have none). Row indices must fit u32: the tensor-core path takes no
    /// more rows than that.
    pub fn of(norms: &Norms) -> Self {
        let mut s = SpecialRows::default();
        if let Norms::Float(sq) = norms {
            for (i, v) in sq.iter().enumerate() {
                let every = v.is_none();
                if every || norms.is_special(i, Metric::Cosine) {
                    s.ids.push(i as u32);
                    s.every.push(every);
                }
            }
        }
        s
    }

    /// Every row special for some metric, ascending.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Rows special for every metric (their f16 copies are never read).
    pub fn every_metric(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids
            .iter()
            .zip(&self.every)
            .filter(|(_, &e)| e)
            .map(|(&r, _)| r)
    }

    fn special_for(&self, i: usize, metric: Metric) -> bool {
        self.every[i] || metric == Metric::Cosine
    }

    /// How many rows are special for `metric`.
    pub fn count(&self, metric: Metric) -> usize {
        (0..self.ids.len())
            .filter(|&i| self.special_for(i, metric))
            .count()
    }

    /// The candidate kernel's filter over `n_rows` rows for a search by
    /// `metric` under `filter`: what `filter` allows, less the rows special
    /// for `metric`. `None` when no row is special for it (the search keeps
    /// its own filter).
    pub fn tensor_filter(&self, n_rows: usize, metric: Metric, filter: &Filter) -> Option<Bitset> {
        if self.count(metric) == 0 {
            return None;
        }
        let mut bits = match filter {
            Filter::Bitset(b) => b.clone(),
            Filter::None => Bitset::all(n_rows),
        };
        for (i, &r) in self.ids.iter().enumerate() {
            if self.special_for(i, metric) {
                bits.set(r as usize, false);
            }
        }
        Some(bits)
    }

    /// The scan's filter over the copied rows (bit `i` for row `ids()[i]`):
    /// special for `metric` and allowed by `filter`; with how many it allows.
    pub fn local_filter(&self, metric: Metric, filter: &Filter) -> (Bitset, usize) {
        let bits = Bitset::from_fn(self.ids.len(), |i| {
            self.special_for(i, metric) && filter.allows(self.ids[i] as usize)
        });
        let allowed = bits.count();
        (bits, allowed)
    }
}

/// Each query's best `main.k` of `main` (ids of the index) and `special`
/// (`special.k ≤ main.k` per query, ids indexing `ids`, padding -1), in the
/// kernels' key order: distance, then id as unsigned, padding last.
pub fn merge(main: &Neighbors, special: &Neighbors, ids: &[u32]) -> Neighbors {
    let (nq, k) = (main.nq, main.k);
    debug_assert_eq!(special.nq, nq);
    debug_assert!(special.k <= k);
    // Both lists of a query side by side, the special one padded to k.
    let mut all_ids = Vec::with_capacity(nq * 2 * k);
    let mut all_dists = Vec::with_capacity(nq * 2 * k);
    for q in 0..nq {
        all_ids.extend_from_slice(main.ids_of(q));
        all_dists.extend_from_slice(main.distances_of(q));
        all_ids.extend(special.ids_of(q).iter().map(|&l| match usize::try_from(l) {
            Ok(l) => i64::from(ids[l]),
            Err(_) => Neighbors::PAD_ID,
        }));
        all_dists.extend_from_slice(special.distances_of(q));
        for _ in special.k..k {
            all_ids.push(Neighbors::PAD_ID);
            all_dists.push(f32::INFINITY);
        }
    }
    let (ids, distances) = merge_splits(&all_ids, &all_dists, nq, 2, k, true);
    Neighbors {
        nq,
        k,
        ids,
        distances,
    }
}

/// The queries `norms` are of, split in (those the bounds cover, those
/// they do not: special for `metric`), each ascending.
pub fn split_queries(norms: &Norms, metric: Metric) -> (Vec<u32>, Vec<u32>) {
    (0..norms.len() as u32).partition(|&i| !norms.is_special(i as usize, metric))
}

/// The results of queries searched in parts, back in query order: each
/// part is (the queries it holds, ascending, its results in that order),
/// and together the parts hold queries `0..nq` once each. Every part has
/// the same `k`.
pub fn join_queries(parts: [(&[u32], &Neighbors); 2]) -> Neighbors {
    let nq = parts.iter().map(|(q, _)| q.len()).sum::<usize>();
    let k = parts[0].1.k;
    debug_assert!(parts.iter().all(|(q, n)| n.k == k && n.nq == q.len()));
    let mut ids = vec![Neighbors::PAD_ID; nq * k];
    let mut distances = vec![f32::INFINITY; nq * k];
    for (queries, found) in parts {
        for (i, &q) in queries.iter().enumerate() {
            let to = q as usize * k..(q as usize + 1) * k;
            ids[to.clone()].copy_from_slice(found.ids_of(i));
            distances[to].copy_from_slice(found.distances_of(i));
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
        assert_eq!(none.tensor_filter(40, Metric::Cosine, &Filter::None), None);
    }

    #[test]
    fn the_filters_split_the_rows_between_the_two_searches() {
        let s = SpecialRows::of(&Norms::of(&base()));
        let user = Filter::Bitset(Bitset::from_fn(40, |i| i != 10 && i != 5));
        let t = s.tensor_filter(40, Metric::L2, &user).unwrap();
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
        let copy = base.gather_rows(s.ids());
        let user = Filter::Bitset(Bitset::from_fn(40, |i| i % 9 != 4));
        for metric in Metric::ALL {
            for filter in [Filter::None, user.clone()] {
                for k in [1, 3, 10, 39, 45] {
                    let params = SearchParams::new(k, metric).with_filter(filter.clone());
                    let want = search_cpu(&base, &queries, &params).unwrap();
                    let t = s.tensor_filter(40, metric, &filter).unwrap();
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
            let search = |qs: &[u32]| search_cpu(&base, &queries.gather_rows(qs), &params).unwrap();
            let got = join_queries([(&a, &search(&a)), (&b, &search(&b))]);
            let want = search_cpu(&base, &queries, &params).unwrap();
            assert!(got.bitwise_eq(&want), "{metric:?}");
        }
    }
}
