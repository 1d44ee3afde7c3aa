//! A bounded pool of scoped worker threads, one way for every parallel
//! loop over a caller's jobs (prelinking, [`crate::link::LinkRuntime::link_all`]).
//!
//! A thread count taken from the caller as given lets user input start
//! unbounded work: `fraglink prelink --jobs 100000` started one thread per
//! plan, each running an nvJitLink link (hundreds of MB of LLVM at peak),
//! and `std::thread::Scope::spawn` panics when the system refuses a thread.
//! Here the count is capped at [`max_threads`], and a thread that cannot be
//! started is not an error: the threads that did start, the calling thread
//! always among them, take its share of the jobs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::sync::lock;

/// Threads per core a pool may start at most. The jobs are CPU-bound
/// (nvJitLink, NVRTC) with some file I/O: beyond a couple of threads per
/// core they only add memory, never speed.
pub(crate) const THREADS_PER_CORE: usize = 2;

/// The cores this process may use (1 where the system does not say).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most threads a pool runs: [`THREADS_PER_CORE`] per core.
pub(crate) fn max_threads() -> usize {
    cores().saturating_mul(THREADS_PER_CORE)
}

/// Threads for `jobs` jobs where `requested` were asked (0: one per
/// core): at least 1, at most one per job and at most [`max_threads`].
pub(crate) fn thread_count(requested: usize, jobs: usize) -> usize {
    let asked = if requested == 0 { cores() } else { requested };
    asked.min(max_threads()).min(jobs).max(1)
}

/// `f` of every input, in input order, run on up to `threads` threads, the
/// calling thread among them; each thread takes the next input until none
/// is left. A panic in `f` reaches the caller once every thread has
/// stopped.
pub(crate) fn map_bounded<I: Send, O: Send>(
    inputs: Vec<I>,
    threads: usize,
    f: &(dyn Fn(I) -> O + Sync),
) -> Vec<O> {
    map_bounded_with(inputs, threads, std::thread::Builder::new, f)
}

/// [`map_bounded`] with the threads built by `builder` (a test makes them
/// impossible to start).
fn map_bounded_with<I: Send, O: Send>(
    inputs: Vec<I>,
    threads: usize,
    builder: impl Fn() -> std::thread::Builder,
    f: &(dyn Fn(I) -> O + Sync),
) -> Vec<O> {
    let n = inputs.len();
    // One slot per input and per output: each index is taken by exactly
    // one thread, so no lock is ever contended.
    let inputs: Vec<Mutex<Option<I>>> = inputs.into_iter().map(|i| Mutex::new(Some(i))).collect();
    let outputs: Vec<Mutex<Option<O>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let take = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = inputs.get(i) else {
            return;
        };
        if let Some(input) = lock(slot).take() {
            *lock(&outputs[i]) = Some(f(input));
        }
    };
    std::thread::scope(|s| {
        // The calling thread is one of `threads`: it works rather than
        // waits, and guarantees progress when no thread can be started.
        for _ in 1..threads.min(n) {
            // Out of threads (or memory for a stack): more attempts would
            // fail alike; those started share the rest.
            if builder().spawn_scoped(s, take).is_err() {
                break;
            }
        }
        take();
    });
    // Every slot is filled: a panic in `f` would have unwound above.
    outputs
        .into_iter()
        .filter_map(|o| o.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn thread_count_is_bounded_by_jobs_and_cores() {
        assert_eq!(thread_count(0, 1000), cores().min(1000));
        assert_eq!(thread_count(100_000, 1285), max_threads().min(1285));
        assert_eq!(thread_count(3, 2), 2);
        assert_eq!(thread_count(5, 0), 1);
        assert_eq!(thread_count(1, 10), 1);
    }

    #[test]
    fn every_input_maps_once_in_order_on_at_most_the_threads_asked() {
        let ids = Mutex::new(HashSet::new());
        let out = map_bounded((0..50).collect(), 3, &|i: usize| {
            ids.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_millis(1));
            i * 2
        });
        assert_eq!(out, (0..50).map(|i| i * 2).collect::<Vec<_>>());
        assert!(ids.into_inner().unwrap().len() <= 3);
        assert!(map_bounded(Vec::<u8>::new(), 4, &|x| x).is_empty());
    }

    /// A stack no address space holds: every spawn fails, and the calling
    /// thread maps every input instead of a panic.
    #[test]
    fn threads_that_cannot_start_leave_their_inputs_to_the_caller() {
        let me = std::thread::current().id();
        let out = map_bounded_with(
            (0..20).collect(),
            8,
            || std::thread::Builder::new().stack_size(1 << 62),
            &|i: u32| {
                assert_eq!(std::thread::current().id(), me);
                i + 1
            },
        );
        assert_eq!(out, (1..21).collect::<Vec<_>>());
    }
}
