//! The k smallest `(distance, id)` keys of one query, offered in any order.
//!
//! Unlike the brute-force scan, IVF visits rows list by list, so ids do not
//! arrive in ascending order and the tie rule needs the whole key: a max-heap
//! on `(distance, id)` whose root is the worst kept key. Distances are never
//! NaN here (the scan maps NaN to `+inf` first).

use crate::search::cpu::key_cmp;
use std::cmp::Ordering;

/// Most keys reserved up front (see [`TopK::offer`]).
const RESERVE_MAX: usize = 64;

/// Largest `k` kept as a sorted array rather than a heap: a key that gets in
/// is placed by a binary search and a short move of at most this many keys,
/// cheaper than a heap's sift with its unpredictable branches at the small k
/// of most searches (the heap was a fifth of an nprobe-4 search's profile).
const SORTED_MAX: usize = 32;

pub(crate) struct TopK {
    k: usize,
    /// Ascending when `k ≤ SORTED_MAX`, else a max-heap (root: worst kept key).
    heap: Vec<(f32, i64)>,
}

#[inline(always)]
fn less(a: (f32, i64), b: (f32, i64)) -> bool {
    key_cmp(a.0, a.1 as usize, b.0, b.1 as usize) == Ordering::Less
}

impl TopK {
    /// Allocates nothing until the first key (a scan task holds one per query
    /// of its pass, most of them never offered a key).
    pub(crate) fn new(k: usize) -> Self {
        TopK {
            k,
            heap: Vec::new(),
        }
    }

    fn sorted(&self) -> bool {
        self.k <= SORTED_MAX
    }

    /// The kept keys, in no particular order.
    pub(crate) fn keys(&self) -> &[(f32, i64)] {
        &self.heap
    }

    /// The distance a row must not exceed to have a chance (`+inf` until full):
    /// a row with a larger distance is rejected without looking at its id.
    #[inline(always)]
    pub(crate) fn bound(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::INFINITY
        } else if self.sorted() {
            self.heap[self.k - 1].0
        } else {
            self.heap[0].0
        }
    }

    #[inline]
    pub(crate) fn offer(&mut self, d: f32, id: i64) {
        let key = (d, id);
        if self.sorted() {
            let full = self.heap.len() == self.k;
            if full && !less(key, self.heap[self.k - 1]) {
                return;
            }
            if self.heap.capacity() == 0 {
                self.heap.reserve_exact(self.k);
            }
            if full {
                self.heap.pop();
            }
            let at = self.heap.partition_point(|&e| less(e, key));
            self.heap.insert(at, key);
            return;
        }
        if self.heap.len() < self.k {
            if self.heap.capacity() == 0 {
                // One allocation for the usual k rather than the 4 → 8 → 16
                // growth of pushes (at small nprobe a scan task touches each
                // query's heap for a single list, so these allocations showed
                // in profiles); capped so a huge k grows as needed instead.
                self.heap.reserve_exact(self.k.min(RESERVE_MAX));
            }
            self.heap.push(key);
            self.sift_up(self.heap.len() - 1);
        } else if less(key, self.heap[0]) {
            self.heap[0] = key;
            self.sift_down(0);
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if less(self.heap[p], self.heap[i]) {
                self.heap.swap(p, i);
                i = p;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && less(self.heap[m], self.heap[l]) {
                m = l;
            }
            if r < n && less(self.heap[m], self.heap[r]) {
                m = r;
            }
            if m == i {
                break;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }

    /// Writes the kept keys ascending into pre-padded slots.
    pub(crate) fn write(mut self, ids: &mut [i64], dists: &mut [f32]) {
        self.heap
            .sort_unstable_by(|a, b| key_cmp(a.0, a.1 as usize, b.0, b.1 as usize));
        for (j, (d, id)) in self.heap.into_iter().enumerate() {
            ids[j] = id;
            dists[j] = d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_heap_forms_keep_the_same_keys() {
        let mut rng = crate::search::data::Rng::new(9);
        for k in [1, 2, 10, SORTED_MAX, SORTED_MAX + 1, 100] {
            let keys: Vec<(f32, i64)> = (0..3000)
                .map(|i| ((rng.below(50) as f32) * 0.5, (i * 7919 % 3000) as i64))
                .collect();
            let mut t = TopK::new(k);
            for &(d, id) in &keys {
                if d <= t.bound() {
                    t.offer(d, id);
                }
            }
            let mut want = keys.clone();
            want.sort_by(|a, b| key_cmp(a.0, a.1 as usize, b.0, b.1 as usize));
            want.truncate(k);
            assert_eq!(t.bound(), want[k - 1].0, "k {k}");
            let (mut ids, mut dists) = (vec![-1; k], vec![0.0; k]);
            t.write(&mut ids, &mut dists);
            let got: Vec<(f32, i64)> = dists.into_iter().zip(ids).collect();
            assert_eq!(got, want, "k {k}");
        }
    }

    #[test]
    fn keeps_the_k_smallest_keys_with_ties_to_smaller_ids() {
        let mut t = TopK::new(3);
        for (d, id) in [(5.0, 9), (1.0, 7), (1.0, 3), (2.0, 1), (1.0, 5), (0.0, 8)] {
            t.offer(d, id);
        }
        assert_eq!(t.bound(), 1.0);
        let (mut ids, mut dists) = (vec![-1; 4], vec![f32::INFINITY; 4]);
        t.write(&mut ids, &mut dists);
        assert_eq!(ids, vec![8, 3, 5, -1]);
        assert_eq!(dists[..3], [0.0, 1.0, 1.0]);
        // -0.0 and 0.0 tie: the id decides.
        let mut t = TopK::new(1);
        t.offer(0.0, 4);
        t.offer(-0.0, 2);
        let (mut ids, mut dists) = (vec![-1], vec![0.0]);
        t.write(&mut ids, &mut dists);
        assert_eq!(ids, vec![2]);
    }
}
