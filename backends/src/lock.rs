//! The one way the backends take a mutex: a thread that panicked while holding one leaves state that is
//! still consistent for these short critical sections, so its poison is ignored.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poison.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
