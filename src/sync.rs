//! Locks whose data stays usable after a holder panicked: the state they
//! guard (counters, sets of names, job slots) is whole between statements,
//! so a panic elsewhere must not make every later call panic too.

use std::sync::{Mutex, MutexGuard};

/// `m`'s guard, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
