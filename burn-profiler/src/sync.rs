//! The crate's mutex helper.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, taking over a poisoned lock: every state behind this crate's mutexes is
/// updated by plain assignments, so a panic elsewhere cannot leave it half-written.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
