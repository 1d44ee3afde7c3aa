//! In-memory cache of linked kernels: single flight per key, no lock held
//! across a link, bounded with least-recently-used eviction (DESIGN.md 7).
//!
//! cuVS's planner holds one exclusive lock for the whole link and load, so
//! two threads wanting two different kernels link one after the other. Here
//! the map's mutex is held only to look up or insert a slot; the link runs
//! outside it, and threads asking for a key being linked wait on that key's
//! own condition variable.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The hasher of keys that are already uniformly distributed digests and
/// hash themselves as one `u64` (as [`LinkKey`](super::LinkKey) does): one
/// rotate, xor and multiply per `u64` (FxHash's step) instead of SipHash.
/// Not DoS-resistant, which a digest key does not need.
#[derive(Default, Clone, Copy)]
pub struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// [`BuildHasher`] of [`DigestHasher`].
pub type DigestState = BuildHasherDefault<DigestHasher>;

/// How a value was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Produced by this call.
    Linked,
    /// Already in memory (or produced by a concurrent call this one waited on).
    Memory,
    /// Read from the disk cache by this call.
    Disk,
}

/// Counters since creation (or the last `clear`, which keeps them).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Values produced (by linking or from disk).
    pub links: u64,
    /// Requests that waited for another thread's in-flight link.
    pub waits: u64,
    pub evictions: u64,
    pub failures: u64,
    pub total_link_time: Duration,
    pub entries: usize,
    pub capacity: usize,
    pub bytes_retained: u64,
}

/// What the cache needs to know about a value.
pub trait Weighed {
    fn bytes(&self) -> u64;
}

enum FlightState<V, E> {
    Pending,
    Done(Result<Arc<V>, Arc<E>>),
    /// The producer panicked; waiters retry.
    Abandoned,
}

struct Flight<V, E> {
    state: Mutex<FlightState<V, E>>,
    done: Condvar,
}

impl<V, E> Flight<V, E> {
    fn finish(&self, state: FlightState<V, E>) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
        self.done.notify_all();
    }

    /// `None` when the producer panicked.
    fn wait(&self) -> Option<Result<Arc<V>, Arc<E>>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*st {
                FlightState::Pending => st = self.done.wait(st).unwrap_or_else(|p| p.into_inner()),
                FlightState::Done(r) => return Some(r.clone()),
                FlightState::Abandoned => return None,
            }
        }
    }
}

enum Slot<V, E> {
    Ready { value: Arc<V>, last_used: u64 },
    InFlight(Arc<Flight<V, E>>),
}

struct State<K, V, E, S> {
    slots: HashMap<K, Slot<V, E>, S>,
    tick: u64,
    capacity: usize,
    bytes: u64,
}

/// A single-flight LRU cache. `E` is shared by every waiter of a failed
/// flight, hence `Arc<E>`. `S` hashes the keys (a key that is already a
/// digest, like [`LinkKey`](super::LinkKey), needs no SipHash:
/// [`DigestHasher`]).
pub struct SingleFlightCache<K, V, E, S = RandomState> {
    state: Mutex<State<K, V, E, S>>,
    hits: AtomicU64,
    misses: AtomicU64,
    links: AtomicU64,
    waits: AtomicU64,
    evictions: AtomicU64,
    failures: AtomicU64,
    link_nanos: AtomicU64,
}

impl<K: Eq + Hash + Clone, V: Weighed, E, S: BuildHasher + Default> SingleFlightCache<K, V, E, S> {
    /// `capacity` ready entries at most (at least 1).
    pub fn new(capacity: usize) -> Self {
        SingleFlightCache {
            state: Mutex::new(State {
                slots: HashMap::default(),
                tick: 0,
                capacity: capacity.max(1),
                bytes: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            links: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            link_nanos: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K, V, E, S>> {
        // A panic while holding the map lock cannot leave it inconsistent
        // (every update is a single insert/remove), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value for `key`, produced by `produce` at most once however many
    /// threads ask at the same time. `produce` runs without any lock held and
    /// returns the value with its [`Source`] (`Linked` or `Disk`). A failure is
    /// returned to every waiter and not cached.
    pub fn get_or_try_insert<F>(&self, key: &K, produce: F) -> Result<(Arc<V>, Source), Arc<E>>
    where
        F: FnOnce() -> Result<(V, Source), E>,
    {
        let flight = loop {
            let mut st = self.lock();
            st.tick += 1;
            let tick = st.tick;
            match st.slots.get_mut(key) {
                Some(Slot::Ready { value, last_used }) => {
                    *last_used = tick;
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok((value.clone(), Source::Memory));
                }
                Some(Slot::InFlight(f)) => {
                    let f = f.clone();
                    drop(st);
                    self.waits.fetch_add(1, Ordering::Relaxed);
                    match f.wait() {
                        Some(r) => return r.map(|v| (v, Source::Memory)),
                        None => continue, // the producer panicked: try again
                    }
                }
                None => {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    let f = Arc::new(Flight {
                        state: Mutex::new(FlightState::Pending),
                        done: Condvar::new(),
                    });
                    st.slots.insert(key.clone(), Slot::InFlight(f.clone()));
                    break f;
                }
            }
        };

        // Runs without the map lock. If `produce` panics, the guard removes
        // the in-flight slot and wakes the waiters, who retry.
        let guard = FlightGuard {
            cache: self,
            key,
            flight: &flight,
            armed: true,
        };
        let started = Instant::now();
        let outcome = produce();
        self.link_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut guard = guard;
        guard.armed = false;

        let mut st = self.lock();
        let result = match outcome {
            Ok((value, source)) => {
                self.links.fetch_add(1, Ordering::Relaxed);
                let value = Arc::new(value);
                st.tick += 1;
                let tick = st.tick;
                st.bytes += value.bytes();
                st.slots.insert(
                    key.clone(),
                    Slot::Ready {
                        value: value.clone(),
                        last_used: tick,
                    },
                );
                self.evict(&mut st);
                Ok((value, source))
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                st.slots.remove(key);
                Err(Arc::new(e))
            }
        };
        drop(st);
        flight.finish(FlightState::Done(
            result.as_ref().map(|(v, _)| v.clone()).map_err(Arc::clone),
        ));
        result
    }

    fn evict(&self, st: &mut State<K, V, E, S>) {
        loop {
            let ready = st
                .slots
                .values()
                .filter(|s| matches!(s, Slot::Ready { .. }))
                .count();
            if ready <= st.capacity {
                return;
            }
            let victim = st
                .slots
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready { last_used, .. } => Some((*last_used, k.clone())),
                    Slot::InFlight(_) => None,
                })
                .min_by_key(|(t, _)| *t)
                .map(|(_, k)| k);
            let Some(k) = victim else { return };
            if let Some(Slot::Ready { value, .. }) = st.slots.remove(&k) {
                st.bytes -= value.bytes();
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops every ready entry (in-flight links complete and are kept).
    pub fn clear(&self) {
        let mut st = self.lock();
        st.slots.retain(|_, s| matches!(s, Slot::InFlight(_)));
        st.bytes = 0;
    }

    pub fn set_capacity(&self, capacity: usize) {
        let mut st = self.lock();
        st.capacity = capacity.max(1);
        self.evict(&mut st);
    }

    /// A ready value, counted as a hit; `None` (counting nothing) when the
    /// key is absent or still in flight, for [`get_or_try_insert`] to
    /// handle. The fast path of a repeated link.
    ///
    /// [`get_or_try_insert`]: Self::get_or_try_insert
    pub fn hit(&self, key: &K) -> Option<Arc<V>> {
        let value = self.peek(key)?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(value)
    }

    /// A ready value, without producing it or counting anything (it does
    /// count as a use for the eviction order).
    pub fn peek(&self, key: &K) -> Option<Arc<V>> {
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        match st.slots.get_mut(key) {
            Some(Slot::Ready { value, last_used }) => {
                *last_used = tick;
                Some(value.clone())
            }
            _ => None,
        }
    }

    pub fn stats(&self) -> CacheStats {
        let st = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            links: self.links.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            total_link_time: Duration::from_nanos(self.link_nanos.load(Ordering::Relaxed)),
            entries: st
                .slots
                .values()
                .filter(|s| matches!(s, Slot::Ready { .. }))
                .count(),
            capacity: st.capacity,
            bytes_retained: st.bytes,
        }
    }
}

struct FlightGuard<'a, K: Eq + Hash + Clone, V: Weighed, E, S: BuildHasher + Default> {
    cache: &'a SingleFlightCache<K, V, E, S>,
    key: &'a K,
    flight: &'a Arc<Flight<V, E>>,
    armed: bool,
}

impl<K: Eq + Hash + Clone, V: Weighed, E, S: BuildHasher + Default> Drop
    for FlightGuard<'_, K, V, E, S>
{
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The producer panicked: forget the flight so later calls retry,
        // and wake its waiters so they retry too.
        self.cache.lock().slots.remove(self.key);
        self.flight.finish(FlightState::Abandoned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;

    struct Val(u64);
    impl Weighed for Val {
        fn bytes(&self) -> u64 {
            self.0
        }
    }
    type Cache = SingleFlightCache<u32, Val, String>;

    #[test]
    fn hit_after_miss() {
        let c = Cache::new(4);
        let (v, s) = c
            .get_or_try_insert(&1, || Ok((Val(10), Source::Linked)))
            .unwrap();
        assert_eq!((v.0, s), (10, Source::Linked));
        let (v, s) = c.get_or_try_insert(&1, || panic!("must not run")).unwrap();
        assert_eq!((v.0, s), (10, Source::Memory));
        let st = c.stats();
        assert_eq!(
            (st.hits, st.misses, st.links, st.bytes_retained),
            (1, 1, 1, 10)
        );
    }

    #[test]
    fn failures_are_not_cached() {
        let c = Cache::new(4);
        let e = c
            .get_or_try_insert(&1, || Err("boom".to_string()))
            .err()
            .unwrap();
        assert_eq!(*e, "boom");
        let (v, s) = c
            .get_or_try_insert(&1, || Ok((Val(1), Source::Linked)))
            .unwrap();
        assert_eq!((v.0, s), (1, Source::Linked));
        assert_eq!(c.stats().failures, 1);
    }

    #[test]
    fn lru_eviction() {
        let c = Cache::new(2);
        for k in [1, 2] {
            c.get_or_try_insert(&k, || Ok((Val(k as u64), Source::Linked)))
                .unwrap();
        }
        c.get_or_try_insert(&1, || unreachable!()).unwrap(); // 1 is now recent
        c.get_or_try_insert(&3, || Ok((Val(3), Source::Linked)))
            .unwrap();
        assert!(c.peek(&2).is_none(), "least recently used is evicted");
        assert!(c.peek(&1).is_some() && c.peek(&3).is_some());
        let st = c.stats();
        assert_eq!((st.evictions, st.entries, st.bytes_retained), (1, 2, 4));
        c.clear();
        assert_eq!(c.stats().entries, 0);
        assert_eq!(c.stats().bytes_retained, 0);
    }

    #[test]
    fn one_production_per_key_under_contention() {
        let c = Arc::new(Cache::new(64));
        let produced = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(32));
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let (c, produced, barrier) = (c.clone(), produced.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let key = (i % 4) as u32;
                    let (v, _) = c
                        .get_or_try_insert(&key, || {
                            produced.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            Ok((Val(key as u64 + 100), Source::Linked))
                        })
                        .unwrap();
                    assert_eq!(v.0, key as u64 + 100);
                    v
                })
            })
            .collect();
        let vals: Vec<Arc<Val>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(produced.load(Ordering::SeqCst), 4);
        for (i, v) in vals.iter().enumerate() {
            assert!(
                Arc::ptr_eq(v, &vals[i % 4]),
                "every thread gets the same Arc"
            );
        }
        let st = c.stats();
        assert_eq!(st.links, 4);
        assert_eq!(st.misses, 4);
        assert_eq!(st.hits + st.waits, 28);
    }

    #[test]
    fn a_panicking_producer_lets_the_next_caller_retry() {
        let c = Arc::new(Cache::new(4));
        let c2 = c.clone();
        let r = std::thread::spawn(move || {
            c2.get_or_try_insert(&7, || -> Result<(Val, Source), String> {
                panic!("link blew up")
            })
        })
        .join();
        assert!(r.is_err());
        let (v, s) = c
            .get_or_try_insert(&7, || Ok((Val(7), Source::Linked)))
            .unwrap();
        assert_eq!((v.0, s), (7, Source::Linked));
    }

    #[test]
    fn different_keys_produce_in_parallel() {
        // Two producers that each wait for the other to start can only
        // finish if no lock is held across production.
        let c = Arc::new(Cache::new(8));
        let barrier = Arc::new(Barrier::new(2));
        let hs: Vec<_> = (0..2u32)
            .map(|k| {
                let (c, b) = (c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    c.get_or_try_insert(&k, || {
                        b.wait();
                        Ok((Val(1), Source::Linked))
                    })
                    .unwrap();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(c.stats().links, 2);
    }
}
