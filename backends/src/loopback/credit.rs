//! A byte budget between the producer and consumer threads: the producer takes credit for a data frame's
//! payload before sending it, the consumer returns it once the bytes are placed.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Payload bytes allowed in flight.
#[derive(Debug)]
pub(super) struct Credit {
    limit: u64,
    in_flight: Mutex<u64>,
    freed: Condvar,
}

impl Credit {
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Takes `bytes` of credit, waiting up to `wait` for the consumer to return some. Always succeeds when
    /// nothing is in flight (one frame larger than the budget still goes). Returns whether it was taken.
    pub(super) fn take(&self, bytes: u64, wait: Duration) -> bool {
        let guard = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let fits = |n: &mut u64| *n > 0 && *n + bytes > self.limit;
        let (mut n, timeout) = self
            .freed
            .wait_timeout_while(guard, wait, fits)
            .unwrap_or_else(PoisonError::into_inner);
        if timeout.timed_out() && fits(&mut n) {
            return false;
        }
        *n += bytes;
        true
    }

    /// Returns `bytes` of credit.
    pub(super) fn give(&self, bytes: u64) {
        let mut n = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(bytes);
        drop(n);
        self.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_bounds_bytes_in_flight_but_never_blocks_an_empty_pipe() {
        let c = Credit::new(100);
        assert!(c.take(500, Duration::ZERO), "one frame always goes");
        assert!(!c.take(1, Duration::from_millis(1)));
        c.give(500);
        assert!(c.take(60, Duration::ZERO));
        assert!(c.take(40, Duration::ZERO));
        assert!(!c.take(1, Duration::ZERO));
    }
}
