//! The driver's heartbeat: when it last started a step, read by the watch in `stuck.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When the driver last started a step.
#[derive(Debug)]
pub(crate) struct Beat {
    base: Instant,
    /// Nanoseconds from `base`.
    last: AtomicU64,
}

impl Default for Beat {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Beat {
    /// The driver starts a step.
    pub(crate) fn beat(&self) {
        let at = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(at, Ordering::Relaxed);
    }

    /// How long since the driver last started a step.
    pub(crate) fn quiet_for(&self) -> Duration {
        self.base
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.last.load(Ordering::Relaxed)))
    }
}
