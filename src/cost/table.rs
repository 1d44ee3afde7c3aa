//! The learned statistics, readable without a lock.
//!
//! A decision reads two statistics (CPU and GPU) of one (operation, size
//! bucket). With a `RwLock<HashMap>` that cost two atomic read-modify-writes
//! (lock, unlock) per decision, and a byte-at-a-time hash of the name: about a
//! third of a ~100 ns decision. Here:
//!
//! - operations live in a fixed open-addressing table of [`CAPACITY`] slots
//!   that is never rehashed: a slot, once set, keeps its operation for the
//!   table's life, so a lookup is plain loads (`OnceLock::get`). When the
//!   table is full, further operations are not learned (their estimates stay
//!   analytical): memory stays bounded whatever names callers invent;
//! - each statistic is a sequence lock over atomic fields: a reader loads the
//!   sequence, the fields and the sequence again, and retries if a writer was
//!   inside; writers (learning) serialise on their operation's mutex. No
//!   read-modify-write on the read path.

use std::hash::Hasher;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Size buckets per operation (⌊log2 work⌋, clamped).
pub(super) const BUCKETS: usize = 64;

/// Operations one model learns at most.
pub(super) const CAPACITY: usize = 256;

/// Observations of one (operation, bucket, target).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stat {
    pub n: u64,
    /// Welford mean and M2 of observed / analytical.
    pub mean: f64,
    pub m2: f64,
    /// 1 − w + w · mean once n ≥ min_samples, else 1.
    pub factor: f64,
    /// Weight w (0 before min_samples).
    pub weight: f64,
}

/// A [`Stat`] behind a sequence lock (fields as f64/u64 bits).
#[derive(Default)]
struct SharedStat {
    seq: AtomicU64,
    fields: [AtomicU64; 5],
}

impl SharedStat {
    /// A consistent snapshot (retries while a writer is inside).
    #[inline]
    fn read(&self) -> Stat {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            let f: [u64; 5] = std::array::from_fn(|i| self.fields[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            let s2 = self.seq.load(Ordering::Relaxed);
            if s1 == s2 && s1.is_multiple_of(2) {
                return Stat {
                    n: f[0],
                    mean: f64::from_bits(f[1]),
                    m2: f64::from_bits(f[2]),
                    factor: f64::from_bits(f[3]),
                    weight: f64::from_bits(f[4]),
                };
            }
            std::hint::spin_loop();
        }
    }

    /// Publishes `s`; the caller holds the operation's write mutex.
    fn write(&self, s: Stat) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let bits = [
            s.n,
            s.mean.to_bits(),
            s.m2.to_bits(),
            s.factor.to_bits(),
            s.weight.to_bits(),
        ];
        for (f, b) in self.fields.iter().zip(bits) {
            f.store(b, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

/// One operation's statistics: per bucket, CPU then GPU.
struct OpEntry {
    name: Box<str>,
    stats: Box<[[SharedStat; 2]]>,
    /// Serialises the writers of this operation.
    write: Mutex<()>,
}

/// The table of learned operations (module docs).
pub(super) struct StatTable {
    slots: Box<[OnceLock<OpEntry>]>,
}

impl Default for StatTable {
    fn default() -> Self {
        StatTable {
            slots: (0..CAPACITY).map(|_| OnceLock::new()).collect(),
        }
    }
}

fn hash(name: &str) -> usize {
    let mut h = FxHasher::default();
    h.write(name.as_bytes());
    h.finish() as usize
}

impl StatTable {
    /// The operation's entry, if it was ever learned.
    #[inline]
    fn find(&self, name: &str) -> Option<&OpEntry> {
        let h = hash(name);
        for i in 0..CAPACITY {
            match self.slots[(h + i) % CAPACITY].get() {
                None => return None,
                Some(e) if *e.name == *name => return Some(e),
                Some(_) => {}
            }
        }
        None
    }

    /// The operation's entry, created if there is room.
    fn find_or_insert(&self, name: &str) -> Option<&OpEntry> {
        let h = hash(name);
        for i in 0..CAPACITY {
            let slot = &self.slots[(h + i) % CAPACITY];
            // An empty slot takes this name unless another thread filled it
            // first (then that thread's name is compared like any other).
            let e = slot.get_or_init(|| OpEntry {
                name: name.into(),
                stats: (0..BUCKETS).map(|_| Default::default()).collect(),
                write: Mutex::new(()),
            });
            if *e.name == *name {
                return Some(e);
            }
        }
        None
    }

    /// The (CPU, GPU) statistics of `name` in `bucket` (zero if never learned).
    #[inline]
    pub(super) fn get(&self, name: &str, bucket: usize) -> [Stat; 2] {
        match self.find(name) {
            Some(e) => {
                let s = &e.stats[bucket];
                [s[0].read(), s[1].read()]
            }
            None => [Stat::default(); 2],
        }
    }

    /// Applies `f` to the statistic of (`name`, `bucket`, `target`), where
    /// there is room for the operation; returns whether it was applied.
    pub(super) fn update(
        &self,
        name: &str,
        bucket: usize,
        target: usize,
        f: impl FnOnce(&mut Stat),
    ) -> bool {
        let Some(e) = self.find_or_insert(name) else {
            return false;
        };
        let _w = e.write.lock().unwrap_or_else(|p| p.into_inner());
        let shared = &e.stats[bucket][target];
        let mut s = shared.read();
        f(&mut s);
        shared.write(s);
        true
    }

    /// Forgets every observation (the operations keep their slots).
    pub(super) fn clear(&self) {
        for e in self.slots.iter().filter_map(OnceLock::get) {
            let _w = e.write.lock().unwrap_or_else(|p| p.into_inner());
            for s in e.stats.iter().flatten() {
                s.write(Stat::default());
            }
        }
    }
}

/// FxHash: a fast non-cryptographic hasher for the short operation names.
#[derive(Default)]
struct FxHasher(u64);
impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes(c.try_into().unwrap());
            self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
        }
        // The tail (operation names are short: "knn.f32" is all tail) as one
        // word, not one multiply per byte: a decision hashes a name every time.
        let tail = chunks.remainder();
        if !tail.is_empty() {
            // Shifts, not a copy into a buffer (a memcpy call for ≤ 7 bytes).
            let word = tail
                .iter()
                .enumerate()
                .fold(0u64, |w, (i, &b)| w | (b as u64) << (8 * i));
            let v = word ^ ((tail.len() as u64) << 59);
            self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
        }
        // Spread the high bits into the low ones the table indexes by.
        self.0 ^= self.0 >> 29;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_are_seen_and_cleared() {
        let t = StatTable::default();
        assert_eq!(t.get("a", 3)[0].n, 0);
        assert!(t.update("a", 3, 1, |s| {
            s.n = 2;
            s.mean = 1.5;
        }));
        let [cpu, gpu] = t.get("a", 3);
        assert_eq!((cpu.n, gpu.n, gpu.mean), (0, 2, 1.5));
        assert_eq!(t.get("a", 4)[1].n, 0);
        assert_eq!(t.get("b", 3)[1].n, 0);
        t.clear();
        assert_eq!(t.get("a", 3)[1].n, 0);
    }

    #[test]
    fn a_full_table_stops_learning_new_operations() {
        let t = StatTable::default();
        for i in 0..CAPACITY {
            assert!(t.update(&format!("op{i}"), 0, 0, |s| s.n = i as u64 + 1));
        }
        assert!(!t.update("one too many", 0, 0, |s| s.n = 1));
        assert_eq!(t.get("one too many", 0)[0].n, 0);
        for i in 0..CAPACITY {
            assert_eq!(t.get(&format!("op{i}"), 0)[0].n, i as u64 + 1);
        }
    }

    #[test]
    fn readers_never_see_a_torn_statistic() {
        // Writers keep mean = n and m2 = 2n; readers check every snapshot.
        let t = StatTable::default();
        std::thread::scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    for _ in 0..20_000 {
                        t.update("x", 7, 0, |s| {
                            s.n += 1;
                            s.mean = s.n as f64;
                            s.m2 = 2.0 * s.n as f64;
                        });
                    }
                });
            }
            sc.spawn(|| {
                for _ in 0..50_000 {
                    let s = t.get("x", 7)[0];
                    assert_eq!(s.mean, s.n as f64);
                    assert_eq!(s.m2, 2.0 * s.n as f64);
                }
            });
        });
        assert_eq!(t.get("x", 7)[0].n, 40_000);
    }
}
